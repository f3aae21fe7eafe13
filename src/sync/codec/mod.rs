//! What crosses the wire between ranks, and how it is encoded: one file per encoding, used by the
//! modes instead of each writing its own bytes.
//!
//! - [`rows`]: sparse rows of a flat model (`[count][row indexes][versions][values]`), as the
//!   parameter servers (ssp, bosen, async) push updates and answer reads; its values go through a
//!   value codec.
//! - Value codecs ([`ValueCodec`]: every value of a run carried): [`single`] (IEEE binary32,
//!   exact), [`fp16`] (binary16, nearest with ties to even, saturating; `--compress fp16`: Bösen's
//!   pushes and allreduce's mean) and
//!   [`int8`] (8 bits a value and an f32 scale per block, 3.94x fewer bytes than single).
//! - Sparsifiers ([`Sparsifier`]: which entries of an accumulated update go out, the rest kept as
//!   the residual): [`significance`], Gaia's filter, and [`topk`], the entries of largest
//!   magnitude (with its own headerless wire format).
//! - [`mean`]: the mean over all ranks of a vector, exchanged as int8, fp16 or top-k chunks with a
//!   worker and a server residual (compressed allreduce), the same on every rank.
//! - [`sparse`]: (index, value) entries of a vector, or the vector dense when that is shorter,
//!   after a stamp word (gaia's mirror data, forwards and selective barriers).
//!
//! Every codec says how many bytes it produces (`encoded_len`), and its tests check that against
//! the bytes it wrote and that a round trip gives back the input: exactly for [`single`], and for
//! the lossy ones input = decoded + residual, exactly (no mass lost).
//!
//! asap's budgeted rows (`edge_budget`) still write their own `[count u32][row u32 ...][values
//! f32 ...]` bodies (native-endian, little on every machine we run): [`rows`] without versions
//! but with a 4-byte count. Moving them here needs that count width as an option of [`rows`]
//! (its 8-byte count would spend 4 more bytes of each budgeted message, changing which rows fit).
//!
//! A new codec plugs in as one more file here:
//! - a lossy encoding of every value (as [`int8`]) implements [`ValueCodec`]:
//!   `encoded_len(n)`, `encode` with an optional residual for error feedback (the error left by
//!   the previous send is added in, and what this send loses is left in it for the next), and
//!   `decode`; [`rows`] or a mode's dense exchange then takes it where it now takes [`fp16`];
//! - a choice of entries (as [`topk`]) implements [`Sparsifier`] over the accumulated update,
//!   whose unsent entries are the residual, and sends what it chose as a [`sparse`] message (or
//!   in a format of its own where, as in [`topk`], the header would cost more than it says).

pub mod fp16;
pub mod int8;
pub mod mean;
pub mod rows;
pub mod significance;
pub mod single;
pub mod sparse;
pub mod topk;

/// An encoding of a run of f32 values that carries every value, exactly or rounded.
pub trait ValueCodec {
    /// The bytes [`ValueCodec::encode`] appends for `n` values.
    fn encoded_len(&self, n: usize) -> usize;
    /// Appends the encoding of `values` to `out`. With `residual` (error feedback; as long as
    /// `values`), encodes `values + residual` instead and leaves in `residual` what the encoding
    /// lost, so that `values + residual` before == decoded + `residual` after, exactly.
    fn encode(&self, values: &[f32], residual: Option<&mut [f32]>, out: &mut Vec<u8>);
    /// Appends to `into` the `n` values `bytes` encodes (which must be exactly
    /// [`ValueCodec::encoded_len`] bytes).
    fn decode(&self, bytes: &[u8], n: usize, into: &mut Vec<f32>) -> anyhow::Result<()>;
}

/// A choice of the entries of an accumulated update that go out now.
pub trait Sparsifier {
    /// Moves the chosen entries of `acc` into `out` as (index, value) and zeroes them in `acc`;
    /// what stays in `acc` is the residual, sent by a later choice, so that `acc` before ==
    /// the entries + `acc` after, exactly.
    fn select(&self, acc: &mut [f32], out: &mut Vec<(u32, f32)>);
}

/// Checks that `bytes` has the `want` bytes of `n` values in the `what` encoding.
fn ensure_len(bytes: &[u8], want: usize, what: &str, n: usize) -> anyhow::Result<()> {
    anyhow::ensure!(bytes.len() == want, "a run of {n} {what} values takes {want} bytes, got {}", bytes.len());
    Ok(())
}
