//! Training data: in-memory shards and the readers that fill them. No MPI in here: a reader is
//! told which shard (`rank` of `nranks`) to read and reads only that part of the file.

use std::fmt;

/// Compressed sparse rows. Column indices are 0-based here (LIBSVM's 1-based indices are shifted
/// by the reader).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Csr {
    /// Row `i` owns `indices[indptr[i]..indptr[i+1]]` and the same range of `data`.
    pub indptr: Vec<usize>,
    /// 0-based column indices, strictly increasing within a row.
    pub indices: Vec<u32>,
    /// Values matching `indices`.
    pub data: Vec<f32>,
    /// Number of columns this shard knows of (max index + 1, or a declared width).
    pub ncols: usize,
}

/// The feature part of a dataset.
#[derive(Clone, Debug, PartialEq)]
pub enum Features {
    /// Row-major `n x d` dense matrix.
    Dense { x: Vec<f32>, d: usize },
    /// Sparse rows.
    Sparse(Csr),
    /// Ratings triples (the rating itself is the label). 0-based ids.
    Ratings { users: Vec<u32>, items: Vec<u32>, n_users: usize, n_items: usize },
}

/// One example's features, borrowed.
#[derive(Clone, Copy, Debug)]
pub enum Row<'a> {
    Dense(&'a [f32]),
    Sparse { indices: &'a [u32], values: &'a [f32] },
    Rating { user: u32, item: u32 },
}

/// A shard of examples held by one rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub features: Features,
    /// Raw labels as read (class ids for multiclass, +-1/0-1 for binary, ratings for MF).
    pub labels: Vec<f32>,
    /// Where it came from, for messages.
    pub source: String,
    /// Index of this shard's first example in the whole file (for messages and determinism);
    /// `usize::MAX` when the rows are not a contiguous range of the file (after a split).
    pub first_row: usize,
}

impl Dataset {
    /// Number of examples in this shard.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when the shard holds no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Feature dimension as seen by this shard (for ratings: users + items).
    pub fn dim(&self) -> usize {
        match &self.features {
            Features::Dense { d, .. } => *d,
            Features::Sparse(c) => c.ncols,
            Features::Ratings { n_users, n_items, .. } => n_users + n_items,
        }
    }

    /// Example `i`'s features.
    pub fn row(&self, i: usize) -> Row<'_> {
        match &self.features {
            Features::Dense { x, d } => Row::Dense(&x[i * d..(i + 1) * d]),
            Features::Sparse(c) => {
                let r = c.indptr[i]..c.indptr[i + 1];
                Row::Sparse { indices: &c.indices[r.clone()], values: &c.data[r] }
            }
            Features::Ratings { users, items, .. } => Row::Rating { user: users[i], item: items[i] },
        }
    }

    /// Bytes held by this shard (features + labels), for memory reports.
    pub fn heap_bytes(&self) -> usize {
        let f = match &self.features {
            Features::Dense { x, .. } => x.len() * 4,
            Features::Sparse(c) => c.indptr.len() * 8 + c.indices.len() * 4 + c.data.len() * 4,
            Features::Ratings { users, items, .. } => (users.len() + items.len()) * 4,
        };
        f + self.labels.len() * 4
    }
}

/// A data error that names the file and, where it has one, the line and column.
#[derive(Debug, Clone, PartialEq)]
pub struct DataError {
    pub path: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
            if let Some(c) = self.column {
                write!(f, ":{c}")?;
            }
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for DataError {}

impl DataError {
    /// An error about a whole file.
    pub fn at(path: &str, message: &str) -> Self {
        DataError { path: path.to_string(), line: None, column: None, message: message.to_string() }
    }
    /// An I/O error, with a hint for the common "no such file" case.
    pub fn io(path: &str, e: &std::io::Error) -> Self {
        let message = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file (check the path given to --data / --test-data)".to_string(),
            _ => format!("cannot read: {e}"),
        };
        DataError::at(path, &message)
    }
}

pub mod bow;
pub mod command;
pub mod h5;
pub mod idx;
pub mod partition;
pub mod synth;
pub mod synth_lda;
pub mod text;

/// Checks that `path` is a regular file (following symlinks) and returns its size. A FIFO would
/// block in `open` and cannot be read by offset, a directory or device is a mistake: all are
/// refused before anything opens them.
pub fn check_regular(path: &str) -> Result<u64, DataError> {
    let m = std::fs::metadata(path).map_err(|e| DataError::io(path, &e))?;
    if m.is_file() {
        return Ok(m.len());
    }
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    let what = if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a named pipe (FIFO)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    };
    Err(DataError::at(
        path,
        &format!(
            "is {what}, not a regular file: data is read by offset, once per rank, so it must be a file (copy a stream to a file first)"
        ),
    ))
}

/// Memory the kernel says can still be allocated without swapping (`MemAvailable`), in bytes.
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let l = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes as "1.5 GB".
pub fn human_bytes(b: u128) -> String {
    let units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Refuses an allocation of `bytes` (for `what`, e.g. "rows 0..5 of `X` (5 x 10^9 values)")
/// that cannot fit in the memory available now: a clear error naming the file instead of an
/// allocation abort or the OOM killer.
pub fn check_memory(path: &str, what: &str, bytes: u128) -> Result<(), DataError> {
    check_memory_against(path, what, bytes, mem_available())
}

fn check_memory_against(path: &str, what: &str, bytes: u128, avail: Option<u64>) -> Result<(), DataError> {
    // Without /proc/meminfo, still refuse what no machine has (and what would overflow usize).
    let limit = avail.map_or(1u128 << 50, |a| a as u128).min(isize::MAX as u128);
    if bytes > limit {
        return Err(DataError::at(
            path,
            &format!(
                "{what} needs {} but only {} of memory is available: check the file (a corrupt header or \
             out-of-range value?) or use more ranks/nodes",
                human_bytes(bytes),
                human_bytes(limit)
            ),
        ));
    }
    Ok(())
}

/// Where row `row` (0-based, over the whole file) of a data file is, for messages: "line L" for
/// text formats (found by a scan, so use on error paths only), "row R" otherwise.
pub fn place_of_row(path: &str, format: Option<Format>, row: u64) -> String {
    let f = format.or_else(|| detect_format(path).ok());
    if matches!(f, Some(Format::Libsvm | Format::Ratings)) {
        if let Ok(off) = text::locate(path, 0, row) {
            return format!("{path}:{}", text::line_number(path, off));
        }
    }
    format!("{path}, row {row}")
}

/// File formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// LIBSVM / SVMlight text: `label idx:val ...`, 1-based indices.
    Libsvm,
    /// IDX (MNIST family), gzip or not; labels in the matching *labels-idx1* file.
    Idx,
    /// HDF5: dense `X`,`y`; CSR `indptr`,`indices`,`data`,`y`; or `user`,`item`,`rating`.
    Hdf5,
    /// Text `user item rating` per line, 0-based ids.
    Ratings,
}

/// How to read a data file.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Format; None = from the file name.
    pub format: Option<Format>,
    /// IDX labels file; None = derived from the images file name.
    pub labels_path: Option<String>,
    /// Declared feature count (sparse data whose shard may not show the largest index).
    pub features: Option<usize>,
    /// How LIBSVM indices are numbered.
    pub zero_based: ZeroBased,
}

/// Guesses the format from the file name: `.h5`/`.hdf5` -> hdf5; `-ubyte`, `.idx*` (optionally
/// `.gz`) -> idx; `.ratings`, `.rating` -> ratings; `.svm`, `.libsvm`, `.svmlight`, `.txt`, or no
/// extension -> libsvm.
pub fn detect_format(path: &str) -> Result<Format, DataError> {
    let name = std::path::Path::new(path).file_name().and_then(|s| s.to_str()).unwrap_or(path).to_lowercase();
    let base = name.strip_suffix(".gz").unwrap_or(&name);
    let ext = std::path::Path::new(base).extension().and_then(|s| s.to_str()).unwrap_or("");
    Ok(match ext {
        "h5" | "hdf5" => Format::Hdf5,
        "ratings" | "rating" => Format::Ratings,
        _ if base.ends_with("-ubyte") || ext.starts_with("idx") => Format::Idx,
        "svm" | "libsvm" | "svmlight" | "txt" | "" => Format::Libsvm,
        _ => {
            return Err(DataError::at(
                path,
                &format!("cannot tell the format from the extension .{ext}: pass --format libsvm|idx|hdf5|ratings"),
            ))
        }
    })
}

/// How LIBSVM feature indices are numbered (`--zero-based`, as scikit-learn's
/// `load_svmlight_file(zero_based=...)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ZeroBased {
    /// 0-based when any index of the file (training and test files together) is 0, else 1-based.
    Auto,
    /// Index 0 is the first feature.
    True,
    /// Index 1 is the first feature; 0 is an error (LIBSVM's own convention).
    #[default]
    False,
}

/// `--zero-based auto` after every rank read its shards with indices kept as read: when no
/// shard (`saw_zero` says whether any rank saw a 0) holds a 0 the files were 1-based, so every
/// column moves down by one. Returns whether they were 0-based.
pub fn one_based_after_all(sets: &mut [&mut Dataset], saw_zero: bool) -> bool {
    if saw_zero {
        return true;
    }
    for d in sets.iter_mut() {
        if let Features::Sparse(c) = &mut d.features {
            c.indices.iter_mut().for_each(|i| *i -= 1);
            c.ncols = c.ncols.saturating_sub(1);
        }
    }
    false
}

/// `--zero-based` of the tools that read one whole file (`predict`, `data info`, `data convert`),
/// read as `train --zero-based` reads it (issue 43: their errors named `--zero-based auto`, which
/// they then refused).
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct ZeroBasedArg {
    /// How LIBSVM feature indices are numbered: auto (0-based when any index of the file is 0),
    /// true (0 is the first feature), false (1 is the first; LIBSVM's convention). Default: false,
    /// or for `predict` the numbering the model was trained with.
    #[arg(long, value_enum)]
    pub zero_based: Option<ZeroBased>,
}

/// Reads a whole data file, resolving `--zero-based auto` on it: a LIBSVM file without an index
/// 0 was 1-based. Returns the set and, for LIBSVM, whether it was read 0-based.
pub fn load_file(path: &str, opts: &LoadOptions) -> Result<(Dataset, Option<bool>), DataError> {
    let mut d = load_shard(path, opts, 0, 1)?;
    let libsvm = opts.format.map_or_else(|| detect_format(path).ok(), Some) == Some(Format::Libsvm);
    let zero_based = libsvm.then(|| match opts.zero_based {
        ZeroBased::True => true,
        ZeroBased::False => false,
        ZeroBased::Auto => {
            let saw_zero = has_column_zero(&d);
            one_based_after_all(&mut [&mut d], saw_zero)
        }
    });
    Ok((d, zero_based))
}

/// Whether a sparse set holds column 0 (an index 0 as read, under --zero-based auto).
pub fn has_column_zero(d: &Dataset) -> bool {
    matches!(&d.features, Features::Sparse(c) if c.indices.contains(&0))
}

/// Reads shard `rank` of `nranks` of a data file. A shard may be empty (more ranks than
/// examples); the caller decides, collectively, whether that is an error.
pub fn load_shard(path: &str, opts: &LoadOptions, rank: usize, nranks: usize) -> Result<Dataset, DataError> {
    let format = match opts.format {
        Some(f) => f,
        None => detect_format(path)?,
    };
    check_regular(path)?;
    let d = match format {
        Format::Libsvm => text::read_libsvm_based(path, rank, nranks, opts.features, opts.zero_based)?,
        Format::Ratings => text::read_ratings(path, rank, nranks)?,
        Format::Idx => idx::read_idx(path, opts.labels_path.as_deref(), rank, nranks)?,
        Format::Hdf5 => h5::read_h5(path, rank, nranks)?,
    };
    Ok(d)
}

/// Keeps rows where `keep(i)`, in order.
pub fn select_rows(d: &Dataset, keep: impl Fn(usize) -> bool) -> Dataset {
    let idx: Vec<usize> = (0..d.len()).filter(|&i| keep(i)).collect();
    let labels: Vec<f32> = idx.iter().map(|&i| d.labels[i]).collect();
    let features = match &d.features {
        Features::Dense { x, d: dim } => {
            Features::Dense { x: idx.iter().flat_map(|&i| x[i * dim..(i + 1) * dim].iter().copied()).collect(), d: *dim }
        }
        Features::Sparse(c) => {
            let mut o = Csr { indptr: vec![0], ncols: c.ncols, ..Default::default() };
            for &i in &idx {
                o.indices.extend_from_slice(&c.indices[c.indptr[i]..c.indptr[i + 1]]);
                o.data.extend_from_slice(&c.data[c.indptr[i]..c.indptr[i + 1]]);
                o.indptr.push(o.indices.len());
            }
            Features::Sparse(o)
        }
        Features::Ratings { users, items, n_users, n_items } => Features::Ratings {
            users: idx.iter().map(|&i| users[i]).collect(),
            items: idx.iter().map(|&i| items[i]).collect(),
            n_users: *n_users,
            n_items: *n_items,
        },
    };
    // The kept rows are no longer a contiguous range of the file unless all were kept.
    let first_row = if labels.len() == d.len() { d.first_row } else { usize::MAX };
    Dataset { features, labels, source: d.source.clone(), first_row }
}

/// Labels >= `t` become +1, the others -1 (`--label-threshold`).
pub fn threshold_labels(mut d: Dataset, t: f32) -> Dataset {
    d.labels.iter_mut().for_each(|y| *y = if *y >= t { 1.0 } else { -1.0 });
    d
}

/// Splits off a held-out set: row i goes to the held-out part when a seeded hash of its global
/// row number (or, for text shards whose position is unknown, of its rank-local number and
/// source) falls below `fraction`. Deterministic for a given seed.
pub fn split_holdout(d: Dataset, fraction: f64, seed: u64) -> (Dataset, Dataset) {
    let base = if d.first_row == usize::MAX { (d.len() as u64) << 32 } else { d.first_row as u64 };
    let held = |i: usize| held_out(base + i as u64, fraction, seed);
    (select_rows(&d, |i| !held(i)), select_rows(&d, held))
}

/// Whether [`split_holdout`] holds out the example of global row `row` (of a shard that is a
/// contiguous range of the file): a rule of the row alone, the same at every rank count.
pub fn held_out(row: u64, fraction: f64, seed: u64) -> bool {
    crate::rng::Rng::new(seed ^ row.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_f64() < fraction
}

/// Largest absolute value of each column (dense or sparse); empty for data 0 columns wide.
pub fn column_max_abs(d: &Dataset) -> Vec<f32> {
    let mut m = vec![0f32; d.dim()];
    match &d.features {
        Features::Dense { x, d: dim } => {
            x.chunks((*dim).max(1)).for_each(|r| r.iter().zip(m.iter_mut()).for_each(|(v, m)| *m = m.max(v.abs())))
        }
        Features::Sparse(c) => c.indices.iter().zip(&c.data).for_each(|(&j, v)| m[j as usize] = m[j as usize].max(v.abs())),
        Features::Ratings { .. } => {}
    }
    m
}

/// Per-column sum, sum of squares, and the row count (dense data; empty sums when 0 columns wide).
pub fn column_moments(d: &Dataset) -> (Vec<f64>, Vec<f64>, f64) {
    let mut s = vec![0f64; d.dim()];
    let mut q = vec![0f64; d.dim()];
    if let Features::Dense { x, d: dim } = &d.features {
        for r in x.chunks((*dim).max(1)) {
            for (j, &v) in r.iter().enumerate() {
                s[j] += v as f64;
                q[j] += (v as f64) * (v as f64);
            }
        }
    }
    (s, q, d.len() as f64)
}

/// Per-feature scaling fitted on a training set (`--scale`), kept so that a saved model can apply
/// it to new data with the same arithmetic ([`scale_columns`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnScaling {
    /// "standard" (mean and standard deviation) or "max-abs" (largest absolute value).
    pub method: String,
    pub scale: Vec<f32>,
    /// Zero for max-abs, and ignored on sparse data.
    pub shift: Vec<f32>,
}

/// Non-zero share from which sparse rows are held dense, so that `--scale auto` standardises
/// them (issue 43: LIBSVM always loaded sparse, heart_scale at 96 % too, and scikit-learn's
/// breast_cancer trained to 92.31 % under allreduce where the same rows standardised in a dense
/// HDF5 file reached 95.80 %). At this share a dense row of f32 takes at most twice the memory of
/// the sparse one (4 bytes a cell against 8 bytes, index and value, per non-zero).
pub const DENSE_ENOUGH: f64 = 0.25;

/// Whether `nnz` non-zeros in `rows` rows of `width` features are [`DENSE_ENOUGH`] to hold dense.
pub fn dense_enough(nnz: f64, rows: f64, width: usize) -> bool {
    nnz > 0.0 && nnz >= DENSE_ENOUGH * rows * width as f64
}

/// Makes sparse rows dense rows `width` wide (other features stay as they are).
pub fn make_dense(d: &mut Dataset, width: usize) {
    let Features::Sparse(c) = &d.features else { return };
    let mut x = vec![0f32; c.indptr.len().saturating_sub(1) * width];
    for (i, w) in c.indptr.windows(2).enumerate() {
        for k in w[0]..w[1] {
            x[i * width + c.indices[k] as usize] = c.data[k];
        }
    }
    d.features = Features::Dense { x, d: width };
}

/// x_ij <- (x_ij - shift_j) * scale_j for dense data; x_ij <- x_ij * scale_j for sparse data
/// (a shift would densify it, so it is ignored there).
pub fn scale_columns(d: &mut Dataset, scale: &[f32], shift: &[f32]) {
    match &mut d.features {
        Features::Dense { x, d: dim } => x.chunks_mut(*dim).for_each(|r| {
            r.iter_mut().enumerate().for_each(|(j, v)| *v = (*v - shift[j]) * scale[j]);
        }),
        Features::Sparse(c) => c.indices.iter().zip(c.data.iter_mut()).for_each(|(&j, v)| *v *= scale[j as usize]),
        Features::Ratings { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_from_names() {
        assert_eq!(detect_format("a/train-images-idx3-ubyte.gz").unwrap(), Format::Idx);
        assert_eq!(detect_format("x.h5").unwrap(), Format::Hdf5);
        assert_eq!(detect_format("heart_scale").unwrap(), Format::Libsvm);
        assert_eq!(detect_format("m.ratings").unwrap(), Format::Ratings);
        assert!(detect_format("x.parquet").unwrap_err().message.contains("--format"));
    }

    #[test]
    fn holdout_is_a_partition_and_scaling_works() {
        let d = Dataset {
            features: Features::Dense { x: (0..200).map(|i| i as f32).collect(), d: 2 },
            labels: (0..100).map(|i| i as f32).collect(),
            source: "t".into(),
            first_row: 0,
        };
        let (a, b) = split_holdout(d.clone(), 0.3, 5);
        assert_eq!(a.len() + b.len(), 100);
        assert!(b.len() > 15 && b.len() < 45, "{}", b.len());
        let mut all: Vec<f32> = a.labels.iter().chain(&b.labels).copied().collect();
        all.sort_by(f32::total_cmp);
        assert_eq!(all, d.labels);
        let mut s = d.clone();
        let m = column_max_abs(&s);
        assert_eq!(m, vec![198.0, 199.0]);
        scale_columns(&mut s, &[0.5, 1.0], &[1.0, 0.0]);
        if let Row::Dense(r) = s.row(1) {
            assert_eq!(r, &[0.5, 3.0])
        }
    }
}
