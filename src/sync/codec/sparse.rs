//! Sparse entries on the wire: the (index, value) pairs of a vector of `len` values, or the whole
//! vector when that is shorter, after a stamp word the protocol chooses. Gaia's mirror data (the
//! significant updates one group sends the others, [`super::significance`]) and its forwards
//! inside a group travel in it, stamped with the clock or the merge; its selective barriers in
//! the index-only form.
//!
//! - sparse: `[stamp u64][n u64]` + n x (`index u32`, `value f32`), indexes within the vector;
//! - dense, when the pairs would be longer than the vector itself (2n > len):
//!   `[stamp u64][len | DENSE]` + `len` x `f32` (zero where nothing is sent);
//! - indexes only: `[stamp u64][n u64]` + n x `index u32`.

/// Marks a dense message in its second word.
const DENSE: u64 = 1 << 63;

/// Whether `entries` entries of a vector of `len` values travel dense (shorter than the pairs).
fn dense(entries: usize, len: usize) -> bool {
    2 * entries > len
}

/// The bytes [`encode`] gives for `entries` entries of a vector of `len` values.
pub fn encoded_len(entries: usize, len: usize) -> usize {
    if dense(entries, len) {
        16 + 4 * len
    } else {
        16 + 8 * entries
    }
}

/// A message: the stamp, the count `n`, then `n` items written by `item`.
fn framed(stamp: u64, n: usize, width: usize, mut item: impl FnMut(usize, &mut Vec<u8>)) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + n * width);
    b.extend_from_slice(&stamp.to_le_bytes());
    b.extend_from_slice(&(n as u64).to_le_bytes());
    (0..n).for_each(|i| item(i, &mut b));
    b
}

/// A message stamped `stamp` carrying the (index, value) entries `entries` (in their order) of a
/// vector of `len` values: sparse, or dense when that is shorter.
pub fn encode(stamp: u64, entries: &[(u32, f32)], len: usize) -> Vec<u8> {
    let b = if dense(entries.len(), len) {
        let mut values = vec![0f32; len];
        entries.iter().for_each(|&(j, v)| values[j as usize] = v);
        let mut b = framed(stamp, len, 4, |i, b| b.extend_from_slice(&values[i].to_le_bytes()));
        b[8..16].copy_from_slice(&(len as u64 | DENSE).to_le_bytes());
        b
    } else {
        framed(stamp, entries.len(), 8, |i, b| {
            b.extend_from_slice(&entries[i].0.to_le_bytes());
            b.extend_from_slice(&entries[i].1.to_le_bytes());
        })
    };
    debug_assert_eq!(b.len(), encoded_len(entries.len(), len));
    b
}

/// A message stamped `stamp` carrying only the indexes of `entries`.
pub fn encode_indexes(stamp: u64, entries: &[(u32, f32)]) -> Vec<u8> {
    framed(stamp, entries.len(), 4, |i, b| b.extend_from_slice(&entries[i].0.to_le_bytes()))
}

/// Checks that a message for a vector of `len` values has the length its header says.
pub fn check(b: &[u8], len: usize) -> anyhow::Result<()> {
    let (_, n) = header(b)?;
    let want = if n as u64 & DENSE != 0 { 16 + 4 * len } else { 16 + 8 * (n as u64 & !DENSE) as usize };
    anyhow::ensure!(b.len() == want, "has {} bytes, expected {want}", b.len());
    Ok(())
}

/// Adds the entries of a message (checked by [`check`]) into `into`, the vector.
pub fn add(b: &[u8], into: &mut [f32]) -> anyhow::Result<()> {
    if header(b)?.1 as u64 & DENSE != 0 {
        for (x, e) in into.iter_mut().zip(b[16..].chunks_exact(4)) {
            *x += f32::from_le_bytes(e.try_into().expect("4 bytes"));
        }
        return Ok(());
    }
    for e in b[16..].chunks_exact(8) {
        let j = u32::from_le_bytes(e[0..4].try_into().expect("4 bytes")) as usize;
        let v = f32::from_le_bytes(e[4..8].try_into().expect("4 bytes"));
        anyhow::ensure!(j < into.len(), "names index {j} outside the shard");
        into[j] += v;
    }
    Ok(())
}

/// A message's stamp and its second word (the count, with the top bit set on a dense message).
pub fn header(b: &[u8]) -> anyhow::Result<(u64, usize)> {
    anyhow::ensure!(b.len() >= 16, "a gaia message of {} bytes is too short", b.len());
    let clock = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
    let n = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")) as usize;
    Ok((clock, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sparse and dense messages: the bytes are `encoded_len`, they pass `check` and add back
    /// exactly the entries sent; a wrong length or an index outside the vector is refused.
    #[test]
    fn entries_round_trip_sparse_and_dense() {
        let len = 6;
        for entries in [vec![], vec![(4, -1.5)], vec![(0, 1.0), (5, 2.0), (2, 3.0)], vec![(1, 1.0), (0, 2.0), (3, 3.0), (5, 0.5)]] {
            let b = encode(7, &entries, len);
            assert_eq!(b.len(), encoded_len(entries.len(), len), "{entries:?}");
            assert_eq!(header(&b).unwrap().0, 7);
            check(&b, len).unwrap();
            let mut into = vec![0f32; len];
            add(&b, &mut into).unwrap();
            let mut want = vec![0f32; len];
            entries.iter().for_each(|&(j, v)| want[j as usize] = v);
            assert_eq!(into, want);
            assert!(check(&b[..b.len() - 1], len).is_err(), "truncated");
        }
        assert_eq!(encoded_len(3, 6), 16 + 8 * 3, "3 pairs are as long as the vector: sparse");
        assert_eq!(encoded_len(4, 6), 16 + 4 * 6, "4 pairs are longer: dense");
        assert!(check(&encode(1, &[(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0)], 6), 5).is_err(), "dense for another length");
        let outside = encode(1, &[(9, 1.0)], 20);
        assert!(add(&outside, &mut [0.0; 6]).unwrap_err().to_string().contains("index 9 outside"));
        assert!(header(&[0; 15]).is_err());
        let b = encode_indexes(3, &[(4, 1.0), (1, 2.0)]);
        assert_eq!(b, [3u64.to_le_bytes().as_slice(), &2u64.to_le_bytes(), &4u32.to_le_bytes(), &1u32.to_le_bytes()].concat());
    }
}
