//! HDF5 data files, read by hyperslab so a rank reads only its rows. Layouts (one per file):
//! - dense: `X` (n x d, any numeric type) and `y` (n);
//! - sparse CSR: `indptr` (n+1), `indices` (0-based), `data`, `y`, and an attribute `shape` = [n, d];
//! - ratings: `user`, `item` (0-based ids), `rating`.

use hdf5::types::TypeDescriptor;
use hdf5::File;
use ndarray::s;

use super::{text, Csr, DataError, Dataset, Features};

fn err(path: &str, what: &str, e: impl std::fmt::Display) -> DataError {
    DataError::at(path, &format!("{what}: {e}"))
}

fn dataset(path: &str, f: &File, name: &str) -> Result<hdf5::Dataset, DataError> {
    f.dataset(name).map_err(|_| {
        DataError::at(
            path,
            &format!(
                "has no dataset `{name}` (expected `X` and `y`; or CSR `indptr`, `indices`, `data`, `y`; or `user`, `item`, `rating`)"
            ),
        )
    })
}

fn one_d(path: &str, d: &hdf5::Dataset, name: &str, n: Option<usize>) -> Result<usize, DataError> {
    let shape = d.shape();
    if shape.len() != 1 || n.is_some_and(|n| shape[0] != n) {
        return Err(DataError::at(
            path,
            &format!("dataset `{name}` has shape {shape:?}, expected a vector{}", n.map(|n| format!(" of length {n}")).unwrap_or_default()),
        ));
    }
    Ok(shape[0])
}

/// Values per block when reading: every dataset is read through an f64 block of at most this
/// many values, so conversion never clamps or truncates silently (HDF5's own conversion
/// saturates -1 to 0 for unsigned targets, 1.5 to 1 for integers and 1e300 to FLT_MAX) and the
/// temporary memory stays small.
const BLOCK: usize = 1 << 20;

/// Elements [lo, hi) of a 1-D dataset, read as `T` block by block: `f(i, v)` for global index i.
fn scan_1d<T: hdf5::H5Type + Copy>(
    path: &str,
    d: &hdf5::Dataset,
    name: &str,
    lo: usize,
    hi: usize,
    mut f: impl FnMut(usize, T) -> Result<(), String>,
) -> Result<(), DataError> {
    let mut a = lo;
    while a < hi {
        let b = (a + BLOCK).min(hi);
        let v = d.read_slice_1d::<T, _>(s![a..b]).map_err(|e| err(path, &format!("cannot read `{name}` as numbers"), e))?;
        for (k, &x) in v.iter().enumerate() {
            f(a + k, x).map_err(|m| DataError::at(path, &format!("`{name}`[{}] {m}", a + k)))?;
        }
        a = b;
    }
    Ok(())
}

/// The stored element type (None when HDF5 cannot describe it; then the f64 path reports).
fn stored(d: &hdf5::Dataset) -> Option<TypeDescriptor> {
    d.dtype().ok()?.to_descriptor().ok()
}

/// Which exact type to read integers and ids through: stored types that convert to it without
/// clamping or rounding are read as is (fast); everything else goes through f64 and is checked.
enum Via {
    U32,
    I64,
    F32,
    F64,
}

fn via(d: &hdf5::Dataset) -> Via {
    use hdf5::types::{FloatSize, IntSize};
    match stored(d) {
        Some(TypeDescriptor::Unsigned(IntSize::U1 | IntSize::U2 | IntSize::U4)) => Via::U32,
        Some(TypeDescriptor::Integer(_)) => Via::I64,
        Some(TypeDescriptor::Float(FloatSize::U4)) => Via::F32,
        _ => Via::F64,
    }
}

/// A value that is stored in f32 as is, or why not.
fn finite_f32(v: f64) -> Result<f32, String> {
    if v.is_nan() {
        Err("is NaN (not a number)".into())
    } else if v.is_infinite() {
        Err(format!("is {v}"))
    } else if v.abs() > f32::MAX as f64 {
        Err(format!("= {v} is too large for a 32-bit float"))
    } else {
        Ok(v as f32)
    }
}

/// A 0-based id or index in 0..=max, or why not (the same rule as the text readers).
fn id(v: f64, max: u64) -> Result<u64, String> {
    if !v.is_finite() || v.fract() != 0.0 {
        Err(format!("= {v} is not an integer"))
    } else if v < 0.0 {
        Err(format!("= {v} is negative (ids and indices are 0-based)"))
    } else if v > max as f64 {
        Err(format!("= {v} is above the largest allowed {max}"))
    } else {
        Ok(v as u64)
    }
}

fn read_values(path: &str, d: &hdf5::Dataset, name: &str, lo: usize, hi: usize) -> Result<Vec<f32>, DataError> {
    if let Via::F32 = via(d) {
        // Read as stored in one piece (no conversion can clamp), then checked.
        let out = read_whole::<f32>(path, d, name, lo, hi)?;
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            let m = finite_f32(out[i] as f64).unwrap_err();
            return Err(DataError::at(path, &format!("`{name}`[{}] {m}", lo + i)));
        }
        return Ok(out);
    }
    let mut out = Vec::with_capacity(hi - lo);
    scan_1d::<f64>(path, d, name, lo, hi, |_, v| {
        out.push(finite_f32(v)?);
        Ok(())
    })?;
    Ok(out)
}

/// Ids or indices in 0..=max, as u64, calling `f(i, v)` for each.
fn scan_ids(
    path: &str,
    d: &hdf5::Dataset,
    name: &str,
    lo: usize,
    hi: usize,
    max: u64,
    mut f: impl FnMut(usize, u64) -> Result<(), String>,
) -> Result<(), DataError> {
    match via(d) {
        Via::U32 => scan_1d::<u32>(path, d, name, lo, hi, |i, v| {
            if v as u64 > max {
                return Err(format!("= {v} is above the largest allowed {max}"));
            }
            f(i, v as u64)
        }),
        Via::I64 => scan_1d::<i64>(path, d, name, lo, hi, |i, v| {
            if v < 0 {
                return Err(format!("= {v} is negative (ids and indices are 0-based)"));
            }
            if v as u64 > max {
                return Err(format!("= {v} is above the largest allowed {max}"));
            }
            f(i, v as u64)
        }),
        _ => scan_1d::<f64>(path, d, name, lo, hi, |i, v| f(i, id(v, max)?)),
    }
}

fn read_whole<T: hdf5::H5Type>(path: &str, d: &hdf5::Dataset, name: &str, lo: usize, hi: usize) -> Result<Vec<T>, DataError> {
    d.read_slice_1d::<T, _>(s![lo..hi])
        .map(|a| a.into_raw_vec_and_offset().0)
        .map_err(|e| err(path, &format!("cannot read `{name}` as numbers"), e))
}

fn read_ids(path: &str, d: &hdf5::Dataset, name: &str, lo: usize, hi: usize, max: u64) -> Result<Vec<u32>, DataError> {
    if let Via::U32 = via(d) {
        let out = read_whole::<u32>(path, d, name, lo, hi)?;
        if let Some(i) = out.iter().position(|&v| v as u64 > max) {
            return Err(DataError::at(path, &format!("`{name}`[{}] = {} is above the largest allowed {max}", lo + i, out[i])));
        }
        return Ok(out);
    }
    let mut out = Vec::with_capacity(hi - lo);
    scan_ids(path, d, name, lo, hi, max, |_, v| {
        out.push(v as u32);
        Ok(())
    })?;
    Ok(out)
}

/// Rows [lo, hi) of the 2-D `X`, checked value by value, in blocks of rows (f32 data read as
/// is, every other type through f64).
fn read_x(path: &str, x: &hdf5::Dataset, lo: usize, hi: usize, dim: usize) -> Result<Vec<f32>, DataError> {
    match via(x) {
        Via::F32 => read_x_as::<f32>(path, x, lo, hi, dim),
        _ => read_x_as::<f64>(path, x, lo, hi, dim),
    }
}

fn read_x_as<T: hdf5::H5Type + Copy + Into<f64>>(
    path: &str,
    x: &hdf5::Dataset,
    lo: usize,
    hi: usize,
    dim: usize,
) -> Result<Vec<f32>, DataError> {
    let mut out = Vec::with_capacity((hi - lo) * dim);
    let step = (BLOCK / dim.max(1)).max(1);
    let mut a = lo;
    while a < hi {
        let b = (a + step).min(hi);
        let v = x.read_slice_2d::<T, _>(s![a..b, ..]).map_err(|e| err(path, "cannot read `X` as numbers", e))?;
        for (k, &val) in v.iter().enumerate() {
            let f = finite_f32(val.into()).map_err(|m| DataError::at(path, &format!("`X`[{}, {}] {m}", a + k / dim, k % dim)))?;
            out.push(f);
        }
        a = b;
    }
    Ok(out)
}

fn memory(path: &str, what: String, bytes: u128) -> Result<(), DataError> {
    super::check_memory(path, &what, bytes)
}

/// Reads this rank's rows of an HDF5 data file.
pub fn read_h5(path: &str, rank: usize, nranks: usize) -> Result<Dataset, DataError> {
    super::check_regular(path)?;
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
        memory(
            path,
            format!("rows {lo}..{hi} of `X` ({} x {d} values)", hi - lo),
            (hi - lo) as u128 * d as u128 * 4 + (hi - lo) as u128 * 4,
        )?;
        features = Features::Dense { x: read_x(path, &x, lo, hi, d)?, d };
        labels = read_values(path, &y, "y", lo, hi)?;
        first_row = lo;
    } else if f.link_exists("indptr") {
        let ip = dataset(path, &f, "indptr")?;
        let n = one_d(path, &ip, "indptr", None)?.checked_sub(1).ok_or_else(|| DataError::at(path, "`indptr` is empty"))?;
        let y = dataset(path, &f, "y")?;
        one_d(path, &y, "y", Some(n))?;
        let ind = dataset(path, &f, "indices")?;
        let dat = dataset(path, &f, "data")?;
        let nnz = one_d(path, &ind, "indices", None)?;
        one_d(path, &dat, "data", Some(nnz))?;
        // The `shape` attribute [n, d], when present, must agree with the data.
        let declared = match f.attr("shape") {
            Ok(a) => {
                let v = a.read_raw::<f64>().map_err(|e| err(path, "cannot read the `shape` attribute as numbers", e))?;
                let v: Vec<u64> = v
                    .iter()
                    .map(|&x| id(x, text::MAX_FEATURE_INDEX))
                    .collect::<Result<_, _>>()
                    .map_err(|m| DataError::at(path, &format!("the `shape` attribute {v:?}: a value {m}")))?;
                if v.len() != 2 || v[0] != n as u64 {
                    return Err(DataError::at(
                        path,
                        &format!("the `shape` attribute is {v:?}, expected [{n}, columns] (`indptr` has {n} rows)"),
                    ));
                }
                Some(v[1] as usize)
            }
            Err(_) => None,
        };
        let (lo, hi) = part(n);
        let mut indptr = Vec::with_capacity(hi - lo + 1);
        let mut prev = 0u64;
        scan_ids(path, &ip, "indptr", lo, hi + 1, nnz as u64, |i, p| {
            if i > lo && p < prev {
                return Err(format!("= {p} is smaller than the entry before it ({prev}): `indptr` must not decrease"));
            }
            prev = p;
            indptr.push(p as usize);
            Ok(())
        })?;
        let (a, b) = (indptr[0], indptr[indptr.len() - 1]);
        memory(path, format!("rows {lo}..{hi} of the CSR data ({} non-zeros)", b - a), (b - a) as u128 * 8 + (hi - lo) as u128 * 12)?;
        let max_col = declared.map_or(text::MAX_FEATURE_INDEX - 1, |d| (d as u64).saturating_sub(1));
        let indices = read_ids(path, &ind, "indices", a, b, max_col).map_err(|e| match declared {
            Some(d) if e.message.contains("above") => {
                DataError::at(path, &format!("{} (the `shape` attribute says {d} columns)", e.message))
            }
            _ => e,
        })?;
        let data = read_values(path, &dat, "data", a, b)?;
        let indptr: Vec<usize> = indptr.iter().map(|&p| p - a).collect();
        // Within a row, columns must increase (as LIBSVM indices must within a line).
        for r in 0..hi - lo {
            if let Some(w) = indices[indptr[r]..indptr[r + 1]].windows(2).position(|w| w[0] >= w[1]) {
                let at = a + indptr[r] + w + 1;
                return Err(DataError::at(
                    path,
                    &format!(
                        "`indices`[{at}] = {} in row {} is not larger than the column before it ({}): columns must increase within a row",
                        indices[at - a],
                        lo + r,
                        indices[at - a - 1]
                    ),
                ));
            }
        }
        let seen = indices.iter().map(|&i| i as usize + 1).max().unwrap_or(0);
        let ncols = declared.unwrap_or(seen);
        features = Features::Sparse(Csr { indptr, indices, data, ncols });
        labels = read_values(path, &y, "y", lo, hi)?;
        first_row = lo;
    } else if f.link_exists("rating") {
        let r = dataset(path, &f, "rating")?;
        let n = one_d(path, &r, "rating", None)?;
        let (u, i) = (dataset(path, &f, "user")?, dataset(path, &f, "item")?);
        one_d(path, &u, "user", Some(n))?;
        one_d(path, &i, "item", Some(n))?;
        let (lo, hi) = part(n);
        memory(path, format!("ratings {lo}..{hi}"), (hi - lo) as u128 * 12)?;
        let users = read_ids(path, &u, "user", lo, hi, u32::MAX as u64)?;
        let items = read_ids(path, &i, "item", lo, hi, u32::MAX as u64)?;
        let n_users = users.iter().map(|&x| x as usize + 1).max().unwrap_or(0);
        let n_items = items.iter().map(|&x| x as usize + 1).max().unwrap_or(0);
        features = Features::Ratings { users, items, n_users, n_items };
        labels = read_values(path, &r, "rating", lo, hi)?;
        first_row = lo;
    } else {
        return Err(dataset(path, &f, "X").unwrap_err());
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
    fn values_and_ids_follow_the_text_readers_rules() {
        assert_eq!(finite_f32(1.5), Ok(1.5));
        assert!(finite_f32(f64::NAN).unwrap_err().contains("NaN"));
        assert!(finite_f32(f64::NEG_INFINITY).unwrap_err().contains("inf"));
        assert!(finite_f32(1e39).unwrap_err().contains("too large"));
        assert_eq!(id(7.0, 10), Ok(7));
        assert!(id(-1.0, 10).unwrap_err().contains("negative"));
        assert!(id(2.5, 10).unwrap_err().contains("not an integer"));
        assert!(id(11.0, 10).unwrap_err().contains("above"));
        assert!(id(f64::NAN, 10).is_err());
    }

    /// Types HDF5 would convert with clamping or truncation are refused element by element.
    #[test]
    fn negative_and_fractional_ids_are_not_clamped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.h5");
        let f = File::create(&p).unwrap();
        f.new_dataset_builder().with_data(&ndarray::Array1::from(vec![0i64, 3, -2])).create("user").unwrap();
        f.new_dataset_builder().with_data(&ndarray::Array1::from(vec![0.0f64, 1.0, 2.0])).create("item").unwrap();
        f.new_dataset_builder().with_data(&ndarray::Array1::from(vec![1.0f32, 2.0, 3.0])).create("rating").unwrap();
        drop(f);
        let e = read_h5(p.to_str().unwrap(), 0, 1).unwrap_err().to_string();
        assert!(e.contains("`user`[2]") && e.contains("negative"), "{e}");
        // Rank 0 of 2 reads rows 0..1 only: an error in another rank's rows is that rank's.
        assert!(read_h5(p.to_str().unwrap(), 0, 2).is_ok());
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
