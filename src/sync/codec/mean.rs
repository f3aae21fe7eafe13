//! The mean over all ranks of a vector, exchanged compressed with two-level error feedback (issue
//! 40, "compressed exchange with error feedback"; the compressed allreduce of 1-bit Adam, Tang et
//! al. 2021, §4): the vector is cut into N contiguous chunks, chunk j (`j n / N .. (j+1) n / N`)
//! owned by rank j. A vector shorter than N is refused: a rank with an empty chunk would receive
//! nothing in step 1, and Open MPI 4.1 takes the empty buffer's pointer (Rust's dangling 0x1) for
//! `MPI_IN_PLACE` (`(void *) 1`) and fails the all-to-all with MPI_ERR_ARG (measured under
//! mpirun, 2 ranks, 1 value).
//!
//! 1. All-to-all: rank i encodes its chunk j plus its worker residual's chunk j, keeps what that
//!    lost in the worker residual, and sends it to rank j (its own chunk to itself).
//! 2. Rank j decodes the N contributions to its chunk, sums them in rank order and divides by N
//!    (so every run and every rank computes the same floats), adds its server residual, encodes
//!    that and keeps what it lost in the server residual.
//! 3. All-gather of the encoded chunks: every rank decodes every chunk from the same bytes with
//!    the same code, so every rank ends with the same vector, bit for bit (replicas that
//!    average must agree).
//!
//! [`Compression`] is [`Int8`] (every value, 8 bits and a scale per block), [`Fp16`] (every
//! value as binary16, the codec of Bösen's pushes) or [`TopK`] (the `fraction` of each chunk's
//! entries of largest magnitude, in both steps, so the chunk's k = ceil(fraction * n / N) entries
//! go out instead of the k of the whole vector).
//!
//! **Bytes per rank**, counted as encoded, to and from other ranks only: rank i sends its N - 1
//! other chunks' contributions and its own encoded chunk to N - 1 ranks, about 2 (N-1) x the
//! encoding of n / N values; a ring allreduce of f32 sends 2 (N-1)/N x 4n. So int8 sends
//! 4 / (1 + 4 / block) fewer, 3.94x at block 256; fp16 exactly 2x fewer; top-k sends 8 ceil(fraction n / N) bytes a
//! chunk, 1 / (2 fraction) fewer for large chunks: 50x at top-1 % (not 1 / (4 fraction): the
//! ring too sends the model's size twice, in its reduce-scatter and its all-gather). On the default model (MLR, 7,850 values; checked by
//! `bytes_against_a_ring_allreduce`):
//!
//! | ranks | int8 (block 256) | fp16 | top-1 % |
//! |---|---|---|---|
//! | 8 | 3.94x (13,960 bytes against 54,950) | 2.0x (27,472 bytes) | 49.1x (10 entries a chunk, 1,120 bytes) |
//! | 32 | 3.94x (15,448 bytes against 60,837) | 2.0x (30,400 bytes) | 40.9x (3 entries a chunk, 1,488 bytes: the ceiling costs) |
//!
//! **What the residuals conserve**, every call, where v_i is rank i's input, w_i its worker
//! residual, s the server residuals of all chunks side by side and m the mean returned:
//! sum_i (v_i + w_i) + N s before == N m + sum_i w_i + N s after, in real numbers. The codecs
//! keep each step's loss exactly (int8.rs, topk.rs); what is not exact is the f32 arithmetic
//! around them: v + w, the sum of the N decoded contributions, its division by N, and the mean
//! plus the server residual, each rounding by at most u = 2^-24 of its size (the sum N - 1
//! times), so the two sides differ by at most (N + 2) u M per value, M the sum of the
//! magnitudes on both sides (the tests allow (N + 3) u M).
//!
//! **Non-finite input is refused**: a NaN or infinity on any rank reaches the mean on every rank
//! (int8 sends its block as NaN, top-k sends it first, fp16 sends it as NaN: binary16 saturates
//! an infinity at 65504, which Bösen's pushes want and a mean must not hide), and every rank,
//! holding the same vector, returns the same error, so none is left waiting in a collective.

use mpi::topology::{Communicator, SimpleCommunicator};

use super::fp16::Fp16;
use super::int8::Int8;
use super::topk::TopK;
use super::{Sparsifier, ValueCodec};
use crate::comm::collectives;

/// How the chunks travel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compression {
    /// Every value as [`Int8`], a scale per `block` values.
    Int8 {
        /// Values per scale.
        block: usize,
    },
    /// Every value as binary16, [`Fp16`].
    Fp16,
    /// The `fraction` of each chunk's entries of largest magnitude, as [`TopK`].
    TopK {
        /// The share of the entries sent, in (0, 1].
        fraction: f64,
    },
}

impl Compression {
    /// Refuses a block of 0 and a fraction outside (0, 1].
    pub fn check(&self) -> anyhow::Result<()> {
        match *self {
            Compression::Int8 { block } => {
                anyhow::ensure!(block >= 1, "int8 compression needs at least 1 value per scale, got a block of 0")
            }
            Compression::TopK { fraction } => anyhow::ensure!(
                fraction > 0.0 && fraction <= 1.0,
                "top-k compression sends a fraction of the entries in (0, 1], got {fraction}"
            ),
            Compression::Fp16 => {}
        }
        Ok(())
    }

    /// The bytes of one encoded chunk of `len` values.
    pub fn encoded_len(&self, len: usize) -> usize {
        match *self {
            Compression::Int8 { block } => Int8 { block }.encoded_len(len),
            Compression::Fp16 => Fp16.encoded_len(len),
            Compression::TopK { fraction } => TopK { fraction }.encoded_len(len),
        }
    }

    /// Appends the encoding of `values + residual` and leaves what it lost in `residual`.
    pub fn encode(&self, values: &[f32], residual: &mut [f32], out: &mut Vec<u8>) {
        match *self {
            Compression::Int8 { block } => Int8 { block }.encode(values, Some(residual), out),
            Compression::Fp16 => {
                let start = out.len();
                Fp16.encode(values, Some(residual), out);
                // A non-finite value leaves a non-finite residual (binary16 saturated it): it goes
                // as NaN, so that the mean refuses it (the file's doc).
                for (i, _) in residual.iter().enumerate().filter(|(_, r)| !r.is_finite()) {
                    out[start + 2 * i..start + 2 * i + 2].copy_from_slice(&F16_NAN.to_le_bytes());
                }
            }
            Compression::TopK { fraction } => {
                let topk = TopK { fraction };
                residual.iter_mut().zip(values).for_each(|(r, &v)| *r += v);
                let mut entries = Vec::with_capacity(topk.count(values.len()));
                topk.select(residual, &mut entries);
                topk.encode(&entries, values.len(), out);
            }
        }
    }

    /// Adds the values `bytes` encodes into `into` (one chunk).
    pub fn add_decoded(&self, bytes: &[u8], into: &mut [f32]) -> anyhow::Result<()> {
        match *self {
            Compression::Int8 { block } => add_dense(&Int8 { block }, bytes, into),
            Compression::Fp16 => add_dense(&Fp16, bytes, into),
            Compression::TopK { fraction } => TopK { fraction }.add_decoded(bytes, into),
        }
    }
}

/// Binary16's quiet NaN.
const F16_NAN: u16 = 0x7e00;

/// Adds the values `bytes` encodes with a codec of every value into `into` (one chunk).
fn add_dense(codec: &dyn ValueCodec, bytes: &[u8], into: &mut [f32]) -> anyhow::Result<()> {
    let mut decoded = Vec::with_capacity(into.len());
    codec.decode(bytes, into.len(), &mut decoded)?;
    into.iter_mut().zip(decoded).for_each(|(x, d)| *x += d);
    Ok(())
}

/// The bytes one call of [`CompressedMean::mean`] moved to and from other ranks, as encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExchangeBytes {
    /// Bytes this rank sent to other ranks.
    pub sent: u64,
    /// Bytes this rank received from other ranks.
    pub received: u64,
}

/// One rank's side of the compressed mean: its place, and its worker and server residuals.
#[derive(Clone, Debug)]
pub struct CompressedMean {
    compression: Compression,
    /// Chunk j is `bounds[j]..bounds[j + 1]`, owned by rank j.
    bounds: Vec<usize>,
    rank: usize,
    /// What this rank's contributions lost so far, over the whole vector.
    worker: Vec<f32>,
    /// What this rank's encodings of its chunk's mean lost so far.
    server: Vec<f32>,
}

impl CompressedMean {
    /// The mean of vectors of `n` values over the ranks of `comm`, with zero residuals.
    pub fn new(compression: Compression, n: usize, comm: &SimpleCommunicator) -> anyhow::Result<Self> {
        Self::for_rank(compression, n, comm.size() as usize, comm.rank() as usize)
    }

    /// Rank `rank`'s side of a mean over `ranks` ranks.
    fn for_rank(compression: Compression, n: usize, ranks: usize, rank: usize) -> anyhow::Result<Self> {
        compression.check()?;
        anyhow::ensure!(
            n >= ranks,
            "a compressed mean of {n} values over {ranks} ranks: every rank owns a chunk of at least one value; use fewer ranks or no compression"
        );
        let bounds: Vec<usize> = (0..=ranks).map(|j| j * n / ranks).collect();
        let all: usize = bounds.windows(2).map(|c| compression.encoded_len(c[1] - c[0])).sum();
        anyhow::ensure!(all <= i32::MAX as usize, "a compressed mean of {n} values gathers {all} bytes, more than one MPI count addresses");
        let own = bounds[rank + 1] - bounds[rank];
        Ok(CompressedMean { compression, bounds, rank, worker: vec![0.0; n], server: vec![0.0; own] })
    }

    /// Collective: replaces `v` by the decoded mean of every rank's `v`, the same on every rank,
    /// and returns the bytes this rank moved. Errors (on every rank alike) when the mean is not
    /// finite.
    pub fn mean(&mut self, comm: &SimpleCommunicator, v: &mut [f32]) -> anyhow::Result<ExchangeBytes> {
        let ranks = self.bounds.len() - 1;
        anyhow::ensure!(
            (comm.size() as usize, comm.rank() as usize) == (ranks, self.rank),
            "compressed mean: made for rank {} of {ranks}, called on rank {} of {}",
            self.rank,
            comm.rank(),
            comm.size()
        );
        anyhow::ensure!(v.len() == self.worker.len(), "compressed mean: made for {} values, given {}", self.worker.len(), v.len());
        let sends = self.contributions(v);
        let received = collectives::all_to_all_bytes(comm, &sends)?;
        let own = self.reduce(&received)?;
        let counts = self.chunk_bytes();
        let gathered = collectives::all_gather_varcount(comm, &own, &counts);
        self.assemble(&gathered, v)?;
        Ok(self.bytes(&sends, &received))
    }

    /// The values of chunk `j`.
    fn chunk(&self, j: usize) -> std::ops::Range<usize> {
        self.bounds[j]..self.bounds[j + 1]
    }

    /// Step 1: this rank's encoded contribution to every chunk, through its worker residual.
    fn contributions(&mut self, v: &[f32]) -> Vec<Vec<u8>> {
        (0..self.bounds.len() - 1)
            .map(|j| {
                let c = self.chunk(j);
                let mut out = Vec::with_capacity(self.compression.encoded_len(c.len()));
                self.compression.encode(&v[c.clone()], &mut self.worker[c], &mut out);
                out
            })
            .collect()
    }

    /// Step 2: the mean of the contributions to this rank's chunk (`received[i]` from rank i),
    /// encoded through the server residual.
    fn reduce(&mut self, received: &[Vec<u8>]) -> anyhow::Result<Vec<u8>> {
        let mut sum = vec![0f32; self.server.len()];
        for (i, bytes) in received.iter().enumerate() {
            self.compression.add_decoded(bytes, &mut sum).map_err(|e| anyhow::anyhow!("compressed mean: rank {i}'s contribution: {e}"))?;
        }
        let ranks = received.len() as f32;
        sum.iter_mut().for_each(|x| *x /= ranks);
        let mut out = Vec::with_capacity(self.compression.encoded_len(sum.len()));
        self.compression.encode(&sum, &mut self.server, &mut out);
        Ok(out)
    }

    /// The encoded bytes of every rank's chunk of the mean (step 3's counts).
    fn chunk_bytes(&self) -> Vec<i32> {
        (0..self.bounds.len() - 1).map(|j| self.compression.encoded_len(self.chunk(j).len()) as i32).collect()
    }

    /// Step 3: `v` becomes the mean every chunk of `gathered` (the encoded chunks in rank order)
    /// decodes to; refused when it is not finite.
    fn assemble(&self, gathered: &[u8], v: &mut [f32]) -> anyhow::Result<()> {
        let mut at = 0;
        for (j, len) in self.chunk_bytes().into_iter().enumerate() {
            let c = self.chunk(j);
            v[c.clone()].iter_mut().for_each(|x| *x = 0.0);
            let bytes = &gathered[at..at + len as usize];
            self.compression.add_decoded(bytes, &mut v[c]).map_err(|e| anyhow::anyhow!("compressed mean: rank {j}'s chunk: {e}"))?;
            at += len as usize;
        }
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            anyhow::bail!(
                "the compressed mean is {} at value {i}: a rank's input was not finite (training diverged; try a smaller --lr)",
                v[i]
            );
        }
        Ok(())
    }

    /// The bytes of one call to and from other ranks: step 1's buffers, and this rank's chunk
    /// to each other rank and theirs to it in step 3.
    fn bytes(&self, sends: &[Vec<u8>], received: &[Vec<u8>]) -> ExchangeBytes {
        let others =
            |bufs: &mut dyn Iterator<Item = usize>| bufs.enumerate().filter(|&(r, _)| r != self.rank).map(|(_, b)| b as u64).sum::<u64>();
        let chunks = self.chunk_bytes();
        let own = chunks[self.rank] as u64 * (chunks.len() as u64 - 1);
        ExchangeBytes {
            sent: others(&mut sends.iter().map(Vec::len)) + own,
            received: others(&mut received.iter().map(Vec::len)) + others(&mut chunks.iter().map(|&c| c as usize)),
        }
    }

    /// The worker residual (the whole vector) and the server residual (this rank's chunk), for
    /// a checkpoint.
    pub fn residuals(&self) -> (&[f32], &[f32]) {
        (&self.worker, &self.server)
    }

    /// Puts back residuals [`CompressedMean::residuals`] gave (a resume).
    pub fn restore(&mut self, worker: Vec<f32>, server: Vec<f32>) -> anyhow::Result<()> {
        let (w, s) = (self.worker.len(), self.server.len());
        anyhow::ensure!(
            (worker.len(), server.len()) == (w, s),
            "the checkpoint's compression residuals have {} and {} values; rank {} of this run needs {w} (the model) and {s} (its chunk): \
             was it written with another model or number of ranks?",
            worker.len(),
            server.len(),
            self.rank
        );
        (self.worker, self.server) = (worker, server);
        Ok(())
    }
}

// Over MPI, through `--sync allreduce --compress`: tests/compress.rs (encoded bytes, resumes).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// One call of the mean over `states.len()` ranks in one process: the three steps of
    /// [`CompressedMean::mean`] with the all-to-all and the all-gather done by hand. Returns
    /// every rank's result and bytes.
    fn simulate(states: &mut [CompressedMean], inputs: &[Vec<f32>]) -> Vec<(Vec<f32>, ExchangeBytes)> {
        let sends: Vec<Vec<Vec<u8>>> = states.iter_mut().zip(inputs).map(|(s, v)| s.contributions(v)).collect();
        let received: Vec<Vec<Vec<u8>>> = (0..states.len()).map(|j| sends.iter().map(|out| out[j].clone()).collect()).collect();
        let gathered: Vec<u8> = states.iter_mut().zip(&received).flat_map(|(s, r)| s.reduce(r).unwrap()).collect();
        (0..states.len())
            .map(|r| {
                let mut v = inputs[r].clone();
                states[r].assemble(&gathered, &mut v).unwrap();
                (v, states[r].bytes(&sends[r], &received[r]))
            })
            .collect()
    }

    /// The residuals side by side: every rank's worker residual, and the server residuals of
    /// all chunks as one vector.
    fn residuals_of(states: &[CompressedMean]) -> (Vec<Vec<f32>>, Vec<f32>) {
        (states.iter().map(|s| s.residuals().0.to_vec()).collect(), states.iter().flat_map(|s| s.residuals().1.to_vec()).collect())
    }

    /// The bytes rank `r` must move, from the chunk lengths alone (the oracle for the counters):
    /// its contributions to the other chunks and its chunk to every other rank, and as many back.
    fn expected_bytes(c: Compression, n: usize, ranks: usize, r: usize) -> ExchangeBytes {
        let len = |j: usize| c.encoded_len((j + 1) * n / ranks - j * n / ranks) as u64;
        let others: u64 = (0..ranks).filter(|&j| j != r).map(len).sum();
        let each_way = others + (ranks as u64 - 1) * len(r);
        ExchangeBytes { sent: each_way, received: each_way }
    }

    /// Over several calls, for every compression, N from 1 to 7 (dividing n or not, up to n):
    /// every rank gets the same vector, bit for bit; the bytes are the encoded sizes;
    /// and the residuals conserve the mass (the file's doc, with its tolerance).
    #[test]
    fn every_rank_gets_the_same_mean_and_no_mass_is_lost() {
        let mut rng = Rng::new(21);
        for c in [
            Compression::Int8 { block: 4 },
            Compression::Int8 { block: 256 },
            Compression::Fp16,
            Compression::TopK { fraction: 0.1 },
            Compression::TopK { fraction: 0.7 },
        ] {
            for (n, ranks) in [(1, 1), (50, 1), (60, 3), (61, 4), (5, 5), (6, 5), (2, 2), (700, 7)] {
                let mut states: Vec<CompressedMean> = (0..ranks).map(|r| CompressedMean::for_rank(c, n, ranks, r).unwrap()).collect();
                for call in 0..5 {
                    let inputs: Vec<Vec<f32>> =
                        (0..ranks).map(|_| (0..n).map(|_| (rng.normal() * 10f64.powi(call % 3)) as f32).collect()).collect();
                    let (worker_before, server_before) = residuals_of(&states);
                    let results = simulate(&mut states, &inputs);
                    let (worker, server) = residuals_of(&states);
                    let mean = &results[0].0;
                    for (r, (v, bytes)) in results.iter().enumerate() {
                        assert_eq!(
                            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            mean.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            "rank {r}"
                        );
                        assert_eq!(*bytes, expected_bytes(c, n, ranks, r), "{c:?}, {n} values, rank {r} of {ranks}");
                    }
                    let big_n = ranks as f64;
                    for p in 0..n {
                        let ins: f64 = (0..ranks).map(|i| inputs[i][p] as f64 + worker_before[i][p] as f64).sum::<f64>()
                            + big_n * server_before[p] as f64;
                        let outs: f64 =
                            big_n * mean[p] as f64 + (0..ranks).map(|i| worker[i][p] as f64).sum::<f64>() + big_n * server[p] as f64;
                        let magnitude: f64 =
                            (0..ranks).map(|i| (inputs[i][p].abs() + worker_before[i][p].abs() + worker[i][p].abs()) as f64).sum::<f64>()
                                + big_n * (server_before[p].abs() + mean[p].abs() + server[p].abs()) as f64;
                        let tolerance = (big_n + 3.0) * 2f64.powi(-24) * magnitude;
                        assert!((ins - outs).abs() <= tolerance, "{c:?}, {n} values over {ranks}, value {p}: {ins} in, {outs} out");
                    }
                }
            }
        }
    }

    /// The table of the file's doc: bytes per rank against a ring allreduce of f32 on the
    /// default model (7,850 values) at 8 and 32 ranks.
    #[test]
    fn bytes_against_a_ring_allreduce() {
        let n = 7850;
        let mut found = Vec::new();
        for ranks in [8, 32] {
            let ring = crate::sync::ring_allreduce_bytes(ranks, n) as f64;
            for c in
                [Compression::Int8 { block: super::super::int8::DEFAULT_BLOCK }, Compression::Fp16, Compression::TopK { fraction: 0.01 }]
            {
                let sent = expected_bytes(c, n, ranks, 0).sent;
                found.push((ranks, sent, (ring / sent as f64 * 100.0).round() / 100.0));
            }
        }
        assert_eq!(
            found,
            [(8, 13960, 3.94), (8, 27472, 2.0), (8, 1120, 49.06), (32, 15448, 3.94), (32, 30400, 2.0), (32, 1488, 40.89)],
            "(ranks, bytes sent, x fewer)"
        );
        assert_eq!(crate::sync::ring_allreduce_bytes(8, n), 54950);
    }

    /// A resume: the residuals of a checkpoint put into a fresh side give the same means after;
    /// residuals of another length are refused with the reason; so are bad options and a
    /// vector shorter than the number of ranks.
    #[test]
    fn residuals_restore_bit_identically_and_are_length_checked() {
        let c = Compression::TopK { fraction: 0.05 };
        let (n, ranks) = (203, 3);
        let mut rng = Rng::new(8);
        let mut inputs = || -> Vec<Vec<f32>> { (0..ranks).map(|_| (0..n).map(|_| rng.normal() as f32).collect()).collect() };
        let mut states: Vec<CompressedMean> = (0..ranks).map(|r| CompressedMean::for_rank(c, n, ranks, r).unwrap()).collect();
        simulate(&mut states, &inputs());
        let mut resumed: Vec<CompressedMean> = (0..ranks).map(|r| CompressedMean::for_rank(c, n, ranks, r).unwrap()).collect();
        for (fresh, old) in resumed.iter_mut().zip(&states) {
            let (w, s) = old.residuals();
            fresh.restore(w.to_vec(), s.to_vec()).unwrap();
        }
        let next = inputs();
        let bits = |r: Vec<(Vec<f32>, ExchangeBytes)>| r[0].0.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(simulate(&mut states, &next)), bits(simulate(&mut resumed, &next)));
        let e = resumed[1].restore(vec![0.0; n], vec![0.0; 5]).unwrap_err().to_string();
        assert!(e.contains("rank 1 of this run needs 203 (the model) and 68 (its chunk)"), "{e}");
        assert!(CompressedMean::for_rank(Compression::Int8 { block: 0 }, n, 2, 0).unwrap_err().to_string().contains("block of 0"));
        for fraction in [0.0, 1.5, f64::NAN] {
            assert!(CompressedMean::for_rank(Compression::TopK { fraction }, n, 2, 0).is_err(), "{fraction}");
        }
        assert!(CompressedMean::for_rank(c, 0, 1, 0).is_err());
        let e = CompressedMean::for_rank(c, 3, 4, 0).unwrap_err().to_string();
        assert!(e.contains("3 values over 4 ranks: every rank owns a chunk"), "{e}");
    }

    /// A non-finite input on one rank reaches every rank's mean, and every rank refuses it (an
    /// infinity too, which binary16 alone would saturate).
    #[test]
    fn a_non_finite_input_is_refused_on_every_rank() {
        // int8 sends the whole block holding value 60 as NaN: 58..66 (rank 2's chunk is 50..75, blocks of 8 from 50).
        let int8 = Compression::Int8 { block: 8 };
        let top = Compression::TopK { fraction: 0.01 };
        for (c, bad, first) in
            [(int8, f32::NAN, 58), (top, f32::NAN, 60), (Compression::Fp16, f32::NAN, 60), (Compression::Fp16, f32::INFINITY, 60)]
        {
            let (n, ranks) = (100, 4);
            let mut states: Vec<CompressedMean> = (0..ranks).map(|r| CompressedMean::for_rank(c, n, ranks, r).unwrap()).collect();
            let mut inputs = vec![vec![0.5f32; n]; ranks];
            inputs[2][60] = bad;
            let sends: Vec<Vec<Vec<u8>>> = states.iter_mut().zip(&inputs).map(|(s, v)| s.contributions(v)).collect();
            let gathered: Vec<u8> =
                (0..ranks).flat_map(|j| states[j].reduce(&sends.iter().map(|out| out[j].clone()).collect::<Vec<_>>()).unwrap()).collect();
            for (r, s) in states.iter().enumerate() {
                let e = s.assemble(&gathered, &mut inputs[r].clone()).unwrap_err().to_string();
                assert!(e.contains(&format!("is NaN at value {first}:")) && e.contains("diverged"), "{c:?} {bad}, rank {r}: {e}");
            }
        }
    }
}
