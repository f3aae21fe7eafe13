//! Label-skewed partitions (`--partition`): which rank each training example goes to, decided
//! from its class, its global position and a seed alone. Every rank decides for its own examples
//! and needs nothing from the others. Moving the rows there is the caller's business
//! (`train::setup`, one all-to-all); each row travels with its global id (its row in the file),
//! by which a resume at another rank count deals the examples (`train::elastic`).
//! - `iid`: examples stay where the reader put them (contiguous shards of the file).
//! - `by-label:K`: rank r holds the K classes r*K, r*K+1, ... (mod C); an example of class c goes
//!   to one of the ranks holding c, drawn per example.
//! - `dirichlet:ALPHA`: per class c, the shares of the N ranks are drawn from Dirichlet(ALPHA)
//!   (the same draw on every rank, seeded by class); an example of class c goes to rank r with
//!   probability p_c[r]. Small ALPHA concentrates each class on few ranks (ALPHA = 0.5 is the
//!   common "non-IID" setting), large ALPHA tends to IID.

use crate::rng::Rng;

/// How the training examples are spread over the ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Partition {
    Iid,
    ByLabel(usize),
    Dirichlet(f64),
}

impl std::str::FromStr for Partition {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("--partition takes iid, by-label:K (K >= 1 classes per rank) or dirichlet:ALPHA (ALPHA > 0), got {s:?}");
        match s.split_once(':') {
            None if s == "iid" => Ok(Partition::Iid),
            Some(("by-label", k)) => k.parse().ok().filter(|&k| k >= 1).map(Partition::ByLabel).ok_or_else(bad),
            Some(("dirichlet", a)) => a.parse().ok().filter(|a: &f64| *a > 0.0 && a.is_finite()).map(Partition::Dirichlet).ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

/// Per class, the cumulative share of each rank: `classes x ranks`, each row ending at 1.
pub fn class_shares(p: Partition, classes: usize, ranks: usize, seed: u64) -> Result<Vec<Vec<f64>>, String> {
    let mut shares = vec![vec![0f64; ranks]; classes];
    for (c, row) in shares.iter_mut().enumerate() {
        match p {
            Partition::Iid => row.iter_mut().for_each(|s| *s = 1.0),
            Partition::ByLabel(k) => {
                if ranks * k < classes {
                    return Err(format!(
                        "--partition by-label:{k} on {ranks} ranks covers only {} of the {classes} classes: use K >= {}",
                        ranks * k,
                        classes.div_ceil(ranks)
                    ));
                }
                for (r, s) in row.iter_mut().enumerate() {
                    // Rank r holds classes r*K .. r*K+K-1 (mod C).
                    *s = f64::from(u8::from((0..k).any(|j| (r * k + j) % classes == c)));
                }
            }
            Partition::Dirichlet(alpha) => {
                let mut rng = Rng::for_stream(seed ^ 0xd1f1_c4e7, c as u64);
                row.iter_mut().for_each(|s| *s = rng.gamma(alpha));
            }
        }
        let total: f64 = row.iter().sum();
        let mut acc = 0.0;
        for s in row.iter_mut() {
            acc += *s / total;
            *s = acc;
        }
        *row.last_mut().expect("ranks >= 1") = 1.0;
    }
    Ok(shares)
}

/// The rank example `global` (its position in the file) of class `class` goes to.
pub fn destination(shares: &[Vec<f64>], class: usize, global: u64, seed: u64) -> usize {
    let u = Rng::new(seed ^ global.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5e_ed0f_da7a).next_f64();
    let row = &shares[class];
    row.partition_point(|&s| s <= u).min(row.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(p: Partition, classes: usize, ranks: usize, n: u64) -> Vec<Vec<u64>> {
        let shares = class_shares(p, classes, ranks, 3).unwrap();
        let mut count = vec![vec![0u64; classes]; ranks];
        for g in 0..n {
            let c = (g % classes as u64) as usize;
            count[destination(&shares, c, g, 3)][c] += 1;
        }
        count
    }

    #[test]
    fn options_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!("iid".parse(), Ok(Partition::Iid));
        assert_eq!("by-label:2".parse(), Ok(Partition::ByLabel(2)));
        assert_eq!("dirichlet:0.5".parse(), Ok(Partition::Dirichlet(0.5)));
        for bad in ["by-label:0", "dirichlet:-1", "dirichlet:nan", "labels:2", "iid:3"] {
            assert!(bad.parse::<Partition>().unwrap_err().contains("by-label:K"), "{bad}");
        }
        assert!(class_shares(Partition::ByLabel(1), 10, 8, 1).unwrap_err().contains("K >= 2"));
    }

    #[test]
    fn by_label_gives_each_rank_k_classes_and_spreads_each_class_evenly() {
        let count = spread(Partition::ByLabel(2), 10, 8, 100_000);
        for (r, row) in count.iter().enumerate() {
            let held: Vec<usize> = (0..10).filter(|&c| row[c] > 0).collect();
            assert_eq!(
                held,
                {
                    let mut h = vec![(2 * r) % 10, (2 * r + 1) % 10];
                    h.sort();
                    h
                },
                "rank {r}"
            );
        }
        // Class 0 is held by ranks 0 and 5: about half each.
        assert!((count[0][0] as f64 / count[5][0] as f64 - 1.0).abs() < 0.05);
    }

    #[test]
    fn dirichlet_skews_with_small_alpha_and_tends_to_iid_with_large() {
        let skew = |alpha: f64| {
            let count = spread(Partition::Dirichlet(alpha), 10, 8, 200_000);
            // Mean over classes of the largest rank's share of that class.
            (0..10)
                .map(|c| {
                    let col: Vec<u64> = count.iter().map(|r| r[c]).collect();
                    *col.iter().max().unwrap() as f64 / col.iter().sum::<u64>() as f64
                })
                .sum::<f64>()
                / 10.0
        };
        let (low, high) = (skew(0.1), skew(1000.0));
        assert!(low > 0.6, "ALPHA 0.1: the largest share of a class averages {low}");
        assert!(high < 0.15, "ALPHA 1000: {high}, against 1/8 for IID");
    }

    #[test]
    fn gamma_draws_have_the_right_mean() {
        let mut rng = Rng::new(9);
        for shape in [0.3, 1.0, 4.0] {
            let m: f64 = (0..50_000).map(|_| rng.gamma(shape)).sum::<f64>() / 50_000.0;
            assert!((m / shape - 1.0).abs() < 0.03, "shape {shape}: mean {m}");
        }
    }
}

/// The class index of a label for partitioning: class ids as they are, and -1 (binary -1/+1)
/// as class 0. Errors for labels that are not whole numbers (regression, ratings).
pub fn class_of(label: f32, source: &str) -> Result<usize, String> {
    if label.fract() != 0.0 || !label.is_finite() || label < -1.0 {
        return Err(format!("{source}: --partition by label needs class labels, but a label is {label}"));
    }
    Ok(if label < 0.0 { 0 } else { label as usize })
}

/// Serialises the rows of `d` going to each of `ranks` ranks (`dest[i]` for row i): per row its
/// global id (`ids[i]`, its row in the file, as two 32-bit words, low first), the label, then the
/// dense values, or the sparse row's length, indices and values.
pub fn encode_rows(d: &super::Dataset, ids: &[u64], dest: &[usize], ranks: usize) -> Result<Vec<Vec<u8>>, String> {
    let mut out = vec![Vec::new(); ranks];
    for (i, &r) in dest.iter().enumerate() {
        let b = &mut out[r];
        b.extend_from_slice(&(ids[i] as u32).to_ne_bytes());
        b.extend_from_slice(&((ids[i] >> 32) as u32).to_ne_bytes());
        b.extend_from_slice(&d.labels[i].to_ne_bytes());
        match d.row(i) {
            super::Row::Dense(x) => x.iter().for_each(|v| b.extend_from_slice(&v.to_ne_bytes())),
            super::Row::Sparse { indices, values } => {
                b.extend_from_slice(&(indices.len() as u32).to_ne_bytes());
                indices.iter().for_each(|j| b.extend_from_slice(&j.to_ne_bytes()));
                values.iter().for_each(|v| b.extend_from_slice(&v.to_ne_bytes()));
            }
            super::Row::Rating { .. } => return Err(format!("{}: --partition does not apply to ratings", d.source)),
        }
    }
    Ok(out)
}

/// Rebuilds a dataset from the buffers [`encode_rows`] made on every rank, in rank order, with
/// each row's global id; `like` gives the feature kind, width and source.
pub fn decode_rows(like: &super::Dataset, parts: &[Vec<u8>]) -> Result<(super::Dataset, Vec<u64>), String> {
    use super::{Csr, Dataset, Features};
    let bad = || format!("{}: a partition message is malformed", like.source);
    let (mut labels, mut ids) = (Vec::new(), Vec::new());
    let mut features = match &like.features {
        Features::Dense { d, .. } => Features::Dense { x: Vec::new(), d: *d },
        Features::Sparse(c) => Features::Sparse(Csr { indptr: vec![0], ncols: c.ncols, ..Default::default() }),
        Features::Ratings { .. } => return Err(format!("{}: --partition does not apply to ratings", like.source)),
    };
    for part in parts {
        let mut words = part.chunks_exact(4).map(|w| <[u8; 4]>::try_from(w).expect("4 bytes"));
        if part.len() % 4 != 0 {
            return Err(bad());
        }
        while let Some(lo) = words.next() {
            let hi = words.next().ok_or_else(bad)?;
            ids.push(u64::from(u32::from_ne_bytes(lo)) | u64::from(u32::from_ne_bytes(hi)) << 32);
            labels.push(f32::from_ne_bytes(words.next().ok_or_else(bad)?));
            match &mut features {
                Features::Dense { x, d } => {
                    for _ in 0..*d {
                        x.push(f32::from_ne_bytes(words.next().ok_or_else(bad)?));
                    }
                }
                Features::Sparse(c) => {
                    let nnz = u32::from_ne_bytes(words.next().ok_or_else(bad)?) as usize;
                    for _ in 0..nnz {
                        c.indices.push(u32::from_ne_bytes(words.next().ok_or_else(bad)?));
                    }
                    for _ in 0..nnz {
                        c.data.push(f32::from_ne_bytes(words.next().ok_or_else(bad)?));
                    }
                    c.indptr.push(c.indices.len());
                }
                Features::Ratings { .. } => unreachable!("refused above"),
            }
        }
    }
    if let Features::Sparse(c) = &mut features {
        c.ncols = c.ncols.max(c.indices.iter().map(|&j| j as usize + 1).max().unwrap_or(0));
    }
    Ok((Dataset { features, labels, source: like.source.clone(), first_row: usize::MAX }, ids))
}

#[cfg(test)]
mod codec_tests {
    use super::*;
    use crate::data::{Csr, Dataset, Features};

    #[test]
    fn rows_survive_the_trip_dense_and_sparse() {
        let dense = Dataset {
            features: Features::Dense { x: (0..6).map(|v| v as f32).collect(), d: 2 },
            labels: vec![0.0, 1.0, 2.0],
            source: "d".into(),
            first_row: 0,
        };
        let parts = encode_rows(&dense, &[5, 6, 1 << 40 | 7], &[1, 0, 1], 2).unwrap();
        let (back, ids) = decode_rows(&dense, &parts).unwrap();
        assert_eq!(back.labels, [1.0, 0.0, 2.0]);
        assert_eq!(ids, [6, 5, 1 << 40 | 7], "each row keeps its global id, above 2^32 too");
        assert_eq!(back.features, Features::Dense { x: vec![2.0, 3.0, 0.0, 1.0, 4.0, 5.0], d: 2 });
        let sparse = Dataset {
            features: Features::Sparse(Csr { indptr: vec![0, 2, 2, 3], indices: vec![0, 7, 3], data: vec![1.0, 2.0, 3.0], ncols: 9 }),
            labels: vec![-1.0, 1.0, 1.0],
            source: "s".into(),
            first_row: 0,
        };
        let (back, _) = decode_rows(&sparse, &encode_rows(&sparse, &[0, 1, 2], &[0, 0, 0], 1).unwrap()).unwrap();
        assert_eq!(back.features, sparse.features);
        assert!(decode_rows(&sparse, &[vec![0, 0, 0]]).is_err());
        assert!(class_of(0.5, "f").unwrap_err().contains("class labels"));
        assert_eq!(class_of(-1.0, "f"), Ok(0));
    }
}
