//! Top-k sparsification (issue 40, "compressed exchange with error feedback"; Stich et al. 2018,
//! Tang et al. 2021): of an accumulated update of n values, the k = max(1, ceil(fraction * n))
//! entries of largest magnitude go out, the rest stays as the residual for a later send, so
//! nothing is lost. Ties are broken by the lower index, so every run chooses the same entries.
//!
//! - **Choice in O(n)**: `select_nth_unstable_by` over the indexes by (|value| descending, index
//!   ascending), a total order, then a sort of the k chosen indexes; no sort of all n.
//! - **Wire format**: k x (`index u32`, `value f32`), little-endian, indexes ascending; or, when
//!   that is longer than the vector (2k > n), the n values as f32 with zeros where nothing is
//!   sent. No header: sender and receiver both know n, hence k and the form. Not
//!   [`super::sparse`]'s message, whose 16-byte header (a stamp and the count) is as long as two
//!   entries: on the default model (MLR, 7,850 values) averaged by 32 ranks at top-1 %, each
//!   chunk's message is 3 entries, 24 bytes without it and 40 with it (40.9x against 24.5x fewer
//!   bytes than a ring allreduce; mean.rs).
//! - **Non-finite entries go first**: |NaN| and infinities order above every number, so a
//!   diverged value is sent (and seen) at once rather than kept in the residual.

use super::Sparsifier;

/// The `fraction` of the entries of largest magnitude.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopK {
    /// The share of the entries sent, in (0, 1].
    pub fraction: f64,
}

impl TopK {
    /// How many entries of a vector of `n` go out: max(1, ceil(fraction * n)), at most n (0 of
    /// an empty vector).
    pub fn count(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        ((self.fraction * n as f64).ceil() as usize).clamp(1, n)
    }

    /// Whether the chosen entries of a vector of `n` travel as the whole vector (shorter than
    /// the pairs).
    fn dense(&self, n: usize) -> bool {
        2 * self.count(n) > n
    }

    /// The bytes [`TopK::encode`] appends for the entries chosen of a vector of `n`.
    pub fn encoded_len(&self, n: usize) -> usize {
        if self.dense(n) {
            4 * n
        } else {
            8 * self.count(n)
        }
    }

    /// Appends the entries [`Sparsifier::select`] chose of a vector of `n` (`count(n)` of them,
    /// indexes ascending).
    pub fn encode(&self, entries: &[(u32, f32)], n: usize, out: &mut Vec<u8>) {
        debug_assert_eq!(entries.len(), self.count(n));
        if self.dense(n) {
            let at = out.len();
            out.resize(at + 4 * n, 0);
            for &(j, v) in entries {
                let j = at + 4 * j as usize;
                out[j..j + 4].copy_from_slice(&v.to_le_bytes());
            }
        } else {
            for &(j, v) in entries {
                out.extend_from_slice(&j.to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }

    /// Adds the entries `bytes` carries (written by [`TopK::encode`] for a vector of
    /// `into.len()`) into `into`. Refuses a wrong length, an index outside the vector, and
    /// indexes not strictly ascending (one entry added twice).
    pub fn add_decoded(&self, bytes: &[u8], into: &mut [f32]) -> anyhow::Result<()> {
        let n = into.len();
        let want = self.encoded_len(n);
        anyhow::ensure!(bytes.len() == want, "top-k entries of a vector of {n} take {want} bytes, got {}", bytes.len());
        let word = |b: &[u8]| -> [u8; 4] { b.try_into().expect("4 bytes") };
        if self.dense(n) {
            into.iter_mut().zip(bytes.chunks_exact(4)).for_each(|(x, b)| *x += f32::from_le_bytes(word(b)));
            return Ok(());
        }
        let mut next = 0;
        for e in bytes.chunks_exact(8) {
            let j = u32::from_le_bytes(word(&e[..4])) as usize;
            anyhow::ensure!((next..n).contains(&j), "top-k entry {j} of a vector of {n} is out of place (entries start at {next})");
            into[j] += f32::from_le_bytes(word(&e[4..]));
            next = j + 1;
        }
        Ok(())
    }
}

impl Sparsifier for TopK {
    /// Moves the `count(acc.len())` entries of largest |value| (ties to the lower index) into
    /// `out`, indexes ascending, and zeroes them in `acc`.
    fn select(&self, acc: &mut [f32], out: &mut Vec<(u32, f32)>) {
        let k = self.count(acc.len());
        if k == 0 {
            return;
        }
        let mut order: Vec<u32> = (0..acc.len() as u32).collect();
        let larger_first = |a: &u32, b: &u32| acc[*b as usize].abs().total_cmp(&acc[*a as usize].abs()).then(a.cmp(b));
        order.select_nth_unstable_by(k - 1, larger_first);
        let chosen = &mut order[..k];
        chosen.sort_unstable();
        for &j in chosen.iter() {
            out.push((j, acc[j as usize]));
            acc[j as usize] = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The choice against a full sort (the oracle): the same k entries, ascending, with their
    /// values; the rest untouched and none larger than the smallest chosen.
    #[test]
    fn topk_chooses_the_largest_entries_with_ties_to_the_lower_index() {
        let mut rng = Rng::new(9);
        for n in [0, 1, 2, 3, 10, 99, 1000] {
            for fraction in [1e-9, 0.01, 0.1, 0.5, 0.51, 1.0] {
                // Few distinct magnitudes, both signs: many ties.
                let acc: Vec<f32> = (0..n).map(|_| (rng.below(7) as f32 - 3.0) * 0.5).collect();
                let topk = TopK { fraction };
                let k = topk.count(n);
                assert_eq!(k, if n == 0 { 0 } else { ((fraction * n as f64).ceil() as usize).clamp(1, n) });
                let mut sorted: Vec<usize> = (0..n).collect();
                sorted.sort_by(|&a, &b| acc[b].abs().partial_cmp(&acc[a].abs()).unwrap().then(a.cmp(&b)));
                let mut want: Vec<(u32, f32)> = sorted[..k].iter().map(|&j| (j as u32, acc[j])).collect();
                want.sort_by_key(|e| e.0);
                let mut after = acc.clone();
                let mut out = vec![(7, 7.0)];
                topk.select(&mut after, &mut out);
                assert_eq!(out[1..], want, "n {n}, fraction {fraction}");
                for j in 0..n {
                    let sent = want.iter().any(|e| e.0 as usize == j);
                    assert_eq!(after[j], if sent { 0.0 } else { acc[j] }, "entry {j}");
                }
            }
        }
        // Non-finite entries order first.
        let mut acc = [1.0, f32::NAN, -5.0, f32::NEG_INFINITY];
        let mut out = Vec::new();
        TopK { fraction: 0.5 }.select(&mut acc, &mut out);
        assert_eq!(out.len(), 2);
        assert!(out[0].0 == 1 && out[0].1.is_nan() && out[1] == (3, f32::NEG_INFINITY), "{out:?}");
        assert_eq!(acc, [1.0, 0.0, -5.0, 0.0]);
    }

    /// Accumulate, choose, encode, decode, send after send: the bytes are `encoded_len` in both
    /// forms, the decoded vector is exactly the chosen entries, acc before == decoded + acc
    /// after exactly, and over all sends residual + everything sent == every update (in f64,
    /// to f32 rounding of the accumulation).
    #[test]
    fn topk_error_feedback_loses_nothing() {
        let mut rng = Rng::new(4);
        for (n, fraction) in [(1, 0.01), (50, 0.01), (500, 0.05), (7, 0.6), (300, 1.0)] {
            let topk = TopK { fraction };
            let mut acc = vec![0f32; n];
            let (mut total, mut sent) = (vec![0f64; n], vec![0f64; n]);
            for _ in 0..20 {
                for j in 0..n {
                    let u = rng.normal() as f32;
                    acc[j] += u;
                    total[j] += u as f64;
                }
                let before = acc.clone();
                let mut entries = Vec::new();
                topk.select(&mut acc, &mut entries);
                let mut out = vec![1, 2, 3];
                topk.encode(&entries, n, &mut out);
                assert_eq!(out.len() - 3, topk.encoded_len(n), "n {n}, fraction {fraction}");
                let mut decoded = vec![0f32; n];
                topk.add_decoded(&out[3..], &mut decoded).unwrap();
                assert_eq!(decoded.iter().filter(|&&d| d != 0.0).count(), entries.iter().filter(|e| e.1 != 0.0).count());
                for j in 0..n {
                    assert_eq!(decoded[j] + acc[j], before[j], "entry {j}");
                    sent[j] += decoded[j] as f64;
                }
            }
            for j in 0..n {
                assert!((acc[j] as f64 + sent[j] - total[j]).abs() < 1e-4, "entry {j}");
            }
        }
        assert_eq!(TopK { fraction: 0.01 }.encoded_len(7850), 8 * 79);
        assert_eq!(TopK { fraction: 0.6 }.encoded_len(10), 4 * 10, "6 pairs are longer than 10 values: dense");
        assert_eq!(TopK { fraction: 0.5 }.encoded_len(10), 8 * 5, "5 pairs are as long: sparse");
    }

    /// Wrong lengths, indexes outside the vector and repeated or descending indexes are refused.
    #[test]
    fn topk_refuses_malformed_entries() {
        let topk = TopK { fraction: 0.2 };
        let msg = |pairs: &[(u32, f32)]| pairs.iter().flat_map(|(j, v)| [j.to_le_bytes(), v.to_le_bytes()].concat()).collect::<Vec<u8>>();
        let mut into = [0f32; 10];
        topk.add_decoded(&msg(&[(2, 1.0), (9, 2.0)]), &mut into).unwrap();
        assert_eq!(into[2], 1.0);
        for bad in [msg(&[(2, 1.0)]), msg(&[(2, 1.0), (10, 1.0)]), msg(&[(2, 1.0), (2, 1.0)]), msg(&[(3, 1.0), (2, 1.0)])] {
            let e = topk.add_decoded(&bad, &mut [0f32; 10]).unwrap_err().to_string();
            assert!(e.contains("top-k"), "{e}");
        }
    }
}
