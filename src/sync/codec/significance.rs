//! Gaia's significance filter (Gaia, Hsieh et al., NSDI'17, §3.3): of an accumulated update, only
//! the entries that change their parameter by a significant fraction are sent; the rest stays
//! accumulated (the residuals) and goes out once it has grown past the threshold, or at the end's
//! flush (threshold 0), so nothing is lost. The entries travel as a sparse message (sparse.rs);
//! the threshold's decay (V / sqrt(t)) is gaia's, which passes the threshold of the clock.

use super::Sparsifier;

/// The significance filter against `reference` (the parameters the accumulated update belongs
/// to, by index) with threshold `threshold` (a fraction of each parameter's magnitude).
#[derive(Clone, Copy, Debug)]
pub struct Significance<'a> {
    /// The parameters, by the same index as the accumulated update.
    pub reference: &'a [f32],
    /// An entry goes out when |update| > threshold x |parameter|.
    pub threshold: f64,
}

impl Sparsifier for Significance<'_> {
    /// Moves every entry of `acc` whose relative magnitude |acc / value| exceeds the threshold
    /// into `out` as (index, value) and zeroes it there; the rest stays accumulated. Where the
    /// value is 0 any non-zero update is significant. Threshold 0 sends every non-zero entry.
    fn select(&self, acc: &mut [f32], out: &mut Vec<(u32, f32)>) {
        for (j, (a, &w)) in acc.iter_mut().zip(self.reference).enumerate() {
            if *a != 0.0 && (*a as f64).abs() > self.threshold * (w as f64).abs() {
                out.push((j as u32, *a));
                *a = 0.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::sparse;
    use super::*;

    /// Random updates through the filter: every entry sent passed the threshold, everything
    /// left is below it, and residual + sent == the sum of the updates (nothing lost). The
    /// message of what was selected is `sparse::encoded_len` bytes and decodes to exactly it.
    #[test]
    fn the_filter_sends_only_significant_updates_and_loses_nothing() {
        let mut rng = crate::rng::Rng::new(5);
        let n = 200;
        let values: Vec<f32> = (0..n).map(|i| if i % 17 == 0 { 0.0 } else { rng.normal() as f32 }).collect();
        let mut acc = vec![0f32; n];
        let mut total = vec![0f64; n];
        let mut sent = vec![0f64; n];
        let (mut checked, mut went) = (0, 0);
        for t in 1..=50u64 {
            // Gaia's threshold at decay step t: V / sqrt(t), V = 5 %.
            let thr = 0.05 / (t as f64).sqrt();
            for j in 0..n {
                let u = (rng.normal() * 1e-3) as f32;
                acc[j] += u;
                total[j] += u as f64;
            }
            let before = acc.clone();
            let mut out = Vec::new();
            Significance { reference: &values, threshold: thr }.select(&mut acc, &mut out);
            checked += n;
            went += out.len();
            for &(j, v) in &out {
                let j = j as usize;
                assert_eq!(v, before[j]);
                assert!((v as f64).abs() > thr * (values[j] as f64).abs(), "sent an insignificant update");
                sent[j] += v as f64;
            }
            for j in 0..n {
                if !out.iter().any(|e| e.0 as usize == j) {
                    assert_eq!(acc[j], before[j]);
                    assert!((acc[j] as f64).abs() <= thr * (values[j] as f64).abs() || acc[j] == 0.0);
                }
            }
            let msg = sparse::encode(t, &out, n);
            assert_eq!(msg.len(), sparse::encoded_len(out.len(), n));
            let mut decoded = vec![0f32; n];
            sparse::add(&msg, &mut decoded).unwrap();
            for j in 0..n {
                assert_eq!(decoded[j] + acc[j], before[j], "parameter {j} at clock {t}: decoded + residual is not the input");
            }
        }
        for j in 0..n {
            let err = (acc[j] as f64 + sent[j] - total[j]).abs();
            assert!(err < 1e-5, "parameter {j}: residual + sent differs from the total by {err}");
        }
        assert!(went > 0 && went < checked, "{went} of {checked}");
        // Threshold 0 sends everything non-zero.
        let mut acc = vec![1e-9f32, 0.0, -3.0];
        let mut out = Vec::new();
        Significance { reference: &[1e9, 1.0, 1.0], threshold: 0.0 }.select(&mut acc, &mut out);
        assert_eq!(out, vec![(0, 1e-9), (2, -3.0)]);
        assert_eq!(acc, vec![0.0; 3]);
    }
}
