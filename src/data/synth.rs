//! A seeded synthetic sparse two-class data set (`asap-train data synth`), by default at the
//! shape of RCV1 (~700,000 x 47,000, ~0.16 % non-zeros), for measuring load time and memory at
//! scale without downloading anything.
//!
//! Row i depends only on (seed, i): its non-zero count is log-normal around density x features
//! (document lengths vary as in RCV1), its columns are distinct, drawn with a power-law skew
//! towards low column numbers (frequency of column j ~ j^(-2/3): a few frequent "words" and a
//! long tail, which is what lets a linear model learn from a fraction of the data, as on RCV1),
//! its values uniform in (0.1, 1] and the row has unit L2 norm (as RCV1's TF-IDF rows). The label is
//! the sign of the row's dot product with a hidden seeded weight vector (Gaussian on the 1000 most
//! frequent columns, zero elsewhere), flipped with probability
//! `noise`: linearly separable up to that noise, so a linear model can learn it (accuracy near
//! 1 - noise).

use std::io::Write;

use crate::rng::Rng;

use super::{Csr, Dataset, Features};

/// What to generate.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub rows: usize,
    pub features: usize,
    pub density: f64,
    pub seed: u64,
    /// Probability that a label is flipped.
    pub noise: f64,
    /// Write all -1 rows, then all +1 rows (the worst case for sharding by file position).
    pub sort_by_label: bool,
}

/// Columns that carry the label: the most frequent ones (low numbers), at most 1000.
fn informative(spec: &SynthSpec) -> usize {
    (spec.features / 4).clamp(1, 1000)
}

/// The hidden weight vector: Gaussian on the informative columns, zero on the rest (with weights
/// on all 47,000 columns, most of the signal sat in rarely seen columns and 40,000 examples
/// taught a linear SVM nothing: 58 % = the majority class).
fn truth(spec: &SynthSpec) -> Vec<f64> {
    let mut r = Rng::for_stream(spec.seed, u64::MAX);
    let k = informative(spec);
    (0..spec.features).map(|j| if j < k { r.normal() } else { 0.0 }).collect()
}

/// Row `i`: sorted 0-based columns, values, and its label (+1 or -1).
fn row(spec: &SynthSpec, w: &[f64], i: usize, cols: &mut Vec<u32>, vals: &mut Vec<f32>) -> f32 {
    let mut r = Rng::for_stream(spec.seed, i as u64);
    let mean = (spec.density * spec.features as f64).max(1.0);
    // Log-normal with mean `mean` (sigma 0.6).
    let k = (mean * (0.6 * r.normal() - 0.18).exp()).round().clamp(1.0, spec.features as f64) as usize;
    cols.clear();
    while cols.len() < k {
        // u^3 puts column j's frequency near j^(-2/3): a few frequent columns, a long tail.
        let c = ((spec.features as f64 * r.next_f64().powi(3)) as usize).min(spec.features - 1) as u32;
        if let Err(at) = cols.binary_search(&c) {
            cols.insert(at, c);
        }
    }
    vals.clear();
    vals.extend((0..k).map(|_| 0.1 + 0.9 * r.next_f32()));
    let norm = vals.iter().map(|v| v * v).sum::<f32>().sqrt();
    vals.iter_mut().for_each(|v| *v /= norm);
    let score: f64 = cols.iter().zip(vals.iter()).map(|(&c, &v)| w[c as usize] * v as f64).sum();
    let y = if score >= 0.0 { 1.0 } else { -1.0 };
    if r.next_f64() < spec.noise {
        -y
    } else {
        y
    }
}

/// Rows in file order: all of them, or the -1 rows then the +1 rows.
fn for_each_row(spec: &SynthSpec, mut f: impl FnMut(f32, &[u32], &[f32]) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let w = truth(spec);
    let (mut cols, mut vals) = (Vec::new(), Vec::new());
    let passes: &[Option<f32>] = if spec.sort_by_label { &[Some(-1.0), Some(1.0)] } else { &[None] };
    for want in passes {
        for i in 0..spec.rows {
            let y = row(spec, &w, i, &mut cols, &mut vals);
            if want.is_none_or(|w| w == y) {
                f(y, &cols, &vals)?;
            }
        }
    }
    Ok(())
}

/// Writes LIBSVM text (1-based indices, 4 decimals) to `out`.
pub fn write_libsvm(spec: &SynthSpec, out: &mut impl Write) -> anyhow::Result<()> {
    for_each_row(spec, |y, cols, vals| {
        write!(out, "{}", if y > 0.0 { "+1" } else { "-1" })?;
        for (c, v) in cols.iter().zip(vals) {
            write!(out, " {}:{v:.4}", c + 1)?;
        }
        writeln!(out)?;
        Ok(())
    })
}

/// The whole set in memory (for HDF5 output).
pub fn generate(spec: &SynthSpec) -> anyhow::Result<Dataset> {
    let mut csr = Csr { indptr: vec![0], ncols: spec.features, ..Default::default() };
    let mut labels = Vec::with_capacity(spec.rows);
    for_each_row(spec, |y, cols, vals| {
        csr.indices.extend_from_slice(cols);
        // Rounded as the text output is, so both formats hold the same numbers.
        csr.data.extend(vals.iter().map(|v| (v * 1e4).round() / 1e4));
        csr.indptr.push(csr.indices.len());
        labels.push(y);
        Ok(())
    })?;
    Ok(Dataset { features: Features::Sparse(csr), labels, source: "synth".into(), first_row: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SynthSpec {
        SynthSpec { rows: 400, features: 1000, density: 0.02, seed: 3, noise: 0.05, sort_by_label: false }
    }

    #[test]
    fn deterministic_sparse_balanced_and_sorted_on_request() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write_libsvm(&spec(), &mut a).unwrap();
        write_libsvm(&spec(), &mut b).unwrap();
        assert_eq!(a, b);
        let d = generate(&spec()).unwrap();
        let Features::Sparse(c) = &d.features else { panic!() };
        let density = c.indices.len() as f64 / (400.0 * 1000.0);
        assert!((0.015..0.025).contains(&density), "{density}");
        let pos = d.labels.iter().filter(|&&y| y > 0.0).count();
        assert!((120..280).contains(&pos), "{pos}");
        let mut s = Vec::new();
        write_libsvm(&SynthSpec { sort_by_label: true, ..spec() }, &mut s).unwrap();
        let labels: Vec<&str> = std::str::from_utf8(&s).unwrap().lines().map(|l| &l[..2]).collect();
        assert_eq!(labels.len(), 400);
        let first_pos = labels.iter().position(|l| *l == "+1").unwrap();
        assert!(labels[first_pos..].iter().all(|l| *l == "+1"), "not sorted");
        assert_eq!(labels.iter().filter(|l| **l == "+1").count(), pos);
    }
}
