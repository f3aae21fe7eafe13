//! HDF5 data files, read by hyperslab so a rank reads only its rows. Layouts (one per file):
//! - dense: `X` (n x d, any numeric type) and `y` (n);
//! - sparse CSR: `indptr` (n+1), `indices` (0-based), `data`, `y`, and an attribute `shape` = [n, d];
//! - ratings: `user`, `item` (0-based ids), `rating`.

use hdf5::File;
use ndarray::s;

use super::{Csr, DataError, Dataset, Features};

fn err(path: &str, what: &str, e: impl std::fmt::Display) -> DataError {
    DataError::at(path, &format!("{what}: {e}"))
}

fn dataset(path: &str, f: &File, name: &str) -> Result<hdf5::Dataset, DataError> {
    f.dataset(name).map_err(|_| DataError::at(path, &format!(
        "has no dataset `{name}` (expected `X` and `y`; or CSR `indptr`, `indices`, `data`, `y`; or `user`, `item`, `rating`)"
    )))
}

fn one_d(path: &str, d: &hdf5::Dataset, name: &str, n: Option<usize>) -> Result<usize, DataError> {
    let shape = d.shape();
    if shape.len() != 1 || n.is_some_and(|n| shape[0] != n) {
        return Err(DataError::at(path, &format!(
            "dataset `{name}` has shape {shape:?}, expected a vector{}",
            n.map(|n| format!(" of length {n}")).unwrap_or_default()
        )));
    }
    Ok(shape[0])
}

fn read_vec<T: hdf5::H5Type>(path: &str, d: &hdf5::Dataset, name: &str, lo: usize, hi: usize) -> Result<Vec<T>, DataError> {
    d.read_slice_1d::<T, _>(s![lo..hi])
        .map(|a| a.into_raw_vec_and_offset().0)
        .map_err(|e| err(path, &format!("cannot read `{name}` as numbers"), e))
}

/// Reads this rank's rows of an HDF5 data file.
pub fn read_h5(path: &str, rank: usize, nranks: usize) -> Result<Dataset, DataError> {
    if !std::path::Path::new(path).exists() {
        return Err(DataError::at(path, "no such file"));
    }
    let f = File::open(path).map_err(|e| err(path, "cannot open as HDF5", e))?;
    let part = |n: usize| (n * rank / nranks, n * (rank + 1) / nranks);
    let features;
    let labels: Vec<f32>;
    let first_row;
    if f.link_exists("X") {
        let x = dataset(path, &f, "X")?;
        let shape = x.shape();
        if shape.len() != 2 {
            return Err(DataError::at(path, &format!("dataset `X` has shape {shape:?}, expected 2-D (examples x features)")));
        }
        let (n, d) = (shape[0], shape[1]);
        let y = dataset(path, &f, "y")?;
        one_d(path, &y, "y", Some(n))?;
        let (lo, hi) = part(n);
        let xs = x
            .read_slice_2d::<f32, _>(s![lo..hi, ..])
            .map_err(|e| err(path, "cannot read `X` as numbers", e))?
            .into_raw_vec_and_offset()
            .0;
        features = Features::Dense { x: xs, d };
        labels = read_vec(path, &y, "y", lo, hi)?;
        first_row = lo;
    } else if f.link_exists("indptr") {
        let ip = dataset(path, &f, "indptr")?;
        let n = one_d(path, &ip, "indptr", None)?.checked_sub(1).ok_or_else(|| DataError::at(path, "`indptr` is empty"))?;
        let y = dataset(path, &f, "y")?;
        one_d(path, &y, "y", Some(n))?;
        let (lo, hi) = part(n);
        let indptr: Vec<u64> = read_vec(path, &ip, "indptr", lo, hi + 1)?;
        let (a, b) = (indptr[0] as usize, indptr[indptr.len() - 1] as usize);
        let ind = dataset(path, &f, "indices")?;
        let dat = dataset(path, &f, "data")?;
        let nnz = one_d(path, &ind, "indices", None)?;
        one_d(path, &dat, "data", Some(nnz))?;
        if b > nnz || indptr.windows(2).any(|w| w[0] > w[1]) {
            return Err(DataError::at(path, "`indptr` is not non-decreasing within the bounds of `indices`"));
        }
        let indices: Vec<u32> = read_vec(path, &ind, "indices", a, b)?;
        let data: Vec<f32> = read_vec(path, &dat, "data", a, b)?;
        let declared = f.attr("shape").ok().and_then(|s| s.read_raw::<u64>().ok()).and_then(|v| v.get(1).copied());
        let seen = indices.iter().map(|&i| i as usize + 1).max().unwrap_or(0);
        let ncols = declared.map_or(seen, |d| d as usize);
        if seen > ncols {
            return Err(DataError::at(path, &format!("`indices` holds column {} but the `shape` attribute says {ncols} columns", seen - 1)));
        }
        features = Features::Sparse(Csr { indptr: indptr.iter().map(|&p| p as usize - a).collect(), indices, data, ncols });
        labels = read_vec(path, &y, "y", lo, hi)?;
        first_row = lo;
    } else if f.link_exists("rating") {
        let r = dataset(path, &f, "rating")?;
        let n = one_d(path, &r, "rating", None)?;
        let (u, i) = (dataset(path, &f, "user")?, dataset(path, &f, "item")?);
        one_d(path, &u, "user", Some(n))?;
        one_d(path, &i, "item", Some(n))?;
        let (lo, hi) = part(n);
        let users: Vec<u32> = read_vec(path, &u, "user", lo, hi)?;
        let items: Vec<u32> = read_vec(path, &i, "item", lo, hi)?;
        let n_users = users.iter().map(|&x| x as usize + 1).max().unwrap_or(0);
        let n_items = items.iter().map(|&x| x as usize + 1).max().unwrap_or(0);
        features = Features::Ratings { users, items, n_users, n_items };
        labels = read_vec(path, &r, "rating", lo, hi)?;
        first_row = lo;
    } else {
        return Err(dataset(path, &f, "X").unwrap_err());
    }
    if let Some(bad) = labels.iter().position(|y| !y.is_finite()) {
        return Err(DataError::at(path, &format!("label of row {} is not a finite number", first_row + bad)));
    }
    Ok(Dataset { features, labels, source: path.to_string(), first_row })
}

/// Writes a whole data set to HDF5 in the layout [`read_h5`] reads (not atomic: see convert).
pub fn write_h5(path: &std::path::Path, d: &Dataset) -> hdf5::Result<()> {
    use ndarray::{Array1, Array2};
    let f = File::create(path)?;
    match &d.features {
        Features::Dense { x, d: dim } => {
            let a = Array2::from_shape_vec((d.len(), *dim), x.clone()).map_err(|e| e.to_string())?;
            f.new_dataset_builder().with_data(&a).create("X")?;
        }
        Features::Sparse(c) => {
            let ip: Vec<u64> = c.indptr.iter().map(|&p| p as u64).collect();
            f.new_dataset_builder().with_data(&Array1::from(ip)).create("indptr")?;
            f.new_dataset_builder().with_data(&Array1::from(c.indices.clone())).create("indices")?;
            f.new_dataset_builder().with_data(&Array1::from(c.data.clone())).create("data")?;
            f.new_attr_builder().with_data(&[d.len() as u64, c.ncols as u64]).create("shape")?;
        }
        Features::Ratings { users, items, .. } => {
            f.new_dataset_builder().with_data(&Array1::from(users.clone())).create("user")?;
            f.new_dataset_builder().with_data(&Array1::from(items.clone())).create("item")?;
        }
    }
    let yname = if matches!(d.features, Features::Ratings { .. }) { "rating" } else { "y" };
    f.new_dataset_builder().with_data(&Array1::from(d.labels.clone())).create(yname)?;
    f.close()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(d: &Dataset) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.h5");
        write_h5(&p, d).unwrap();
        let path = p.to_str().unwrap();
        assert_eq!(read_h5(path, 0, 1).unwrap().features, d.features);
        for n in 2..=4 {
            let mut labels = Vec::new();
            for r in 0..n {
                labels.extend(read_h5(path, r, n).unwrap().labels);
            }
            assert_eq!(labels, d.labels);
        }
    }

    #[test]
    fn dense_sparse_and_ratings_round_trip() {
        let dense = Dataset {
            features: Features::Dense { x: (0..15).map(|i| i as f32).collect(), d: 3 },
            labels: vec![0.0, 1.0, 2.0, 1.0, 0.0],
            source: "t".into(),
            first_row: 0,
        };
        roundtrip(&dense);
        let sparse = Dataset {
            features: Features::Sparse(Csr { indptr: vec![0, 2, 2, 3], indices: vec![0, 4, 2], data: vec![1.0, 2.0, 3.0], ncols: 6 }),
            labels: vec![1.0, -1.0, 1.0],
            source: "t".into(),
            first_row: 0,
        };
        roundtrip(&sparse);
        let ratings = Dataset {
            features: Features::Ratings { users: vec![0, 1, 2], items: vec![1, 0, 1], n_users: 3, n_items: 2 },
            labels: vec![4.0, 3.0, 5.0],
            source: "t".into(),
            first_row: 0,
        };
        roundtrip(&ratings);
    }

    #[test]
    fn wrong_shapes_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.h5");
        let f = File::create(&p).unwrap();
        f.new_dataset_builder().with_data(&ndarray::Array1::<f32>::zeros(4)).create("X").unwrap();
        drop(f);
        let e = read_h5(p.to_str().unwrap(), 0, 1).unwrap_err().to_string();
        assert!(e.contains("bad.h5") && e.contains("`X`") && e.contains("2-D"), "{e}");
        let q = dir.path().join("none.h5");
        File::create(&q).unwrap();
        assert!(read_h5(q.to_str().unwrap(), 0, 1).unwrap_err().to_string().contains("no dataset"));
    }
}
