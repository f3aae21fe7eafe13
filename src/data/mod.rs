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
    /// Index of this shard's first example in the whole file (for messages and determinism).
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
