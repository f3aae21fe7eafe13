//! Start-up of a training run: read this rank's shards, agree on global dimensions and label
//! ranges, scale features, and build the model spec. Every failure is agreed on collectively so
//! that all ranks exit with an error instead of some hanging.

use anyhow::{bail, Context};
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::comm::collectives::{self, agree};
use crate::config::{Scaling, TrainConfig};
use crate::data::{self, text, Dataset, Features, Format, LoadOptions};
use crate::model::{ModelKind, ModelSpec};

/// This rank's data after start-up.
pub struct Shards {
    pub train: Dataset,
    /// Held-out shard (None: report training accuracy).
    pub test: Option<Dataset>,
    /// Training examples over all ranks.
    pub total_train: u64,
    /// Held-out examples over all ranks (0 without a held-out set).
    pub total_test: u64,
    /// The feature scaling applied to both sets (None: none applied).
    pub scaling: Option<data::ColumnScaling>,
    /// How the LIBSVM training file was numbered (true: 0-based, `--zero-based auto` resolved);
    /// None for other formats. Saved with the model, for `predict`.
    pub zero_based: Option<bool>,
    /// The file rows `[first, end)` this rank read for training, before the held-out split
    /// (its examples are those rows less the held-out ones: `train::elastic::training_ids`); None
    /// when the shard is no contiguous range of the file (`--partition` other than iid).
    pub rows: Option<(u64, u64)>,
    /// This rank's training examples as global ids (their rows in the file), ascending, where the
    /// shard is no range of the file: the rows a label-skewed `--partition` moved here, each with
    /// its id (`data::partition::decode_rows`). None under iid (`rows` says it).
    pub ids: Option<Vec<u64>>,
}

impl Shards {
    /// This rank's training examples as global ids, ascending (from `rows` less the held-out
    /// split's, `holdout`, or the partition's `ids`, which it takes); None where unknown.
    pub fn take_ids(&mut self, holdout: Option<(f64, u64)>) -> Option<Vec<u64>> {
        let ids = match self.rows {
            Some(rows) => Some(super::elastic::training_ids(rows, holdout)),
            None => self.ids.take(),
        };
        ids.filter(|ids| ids.len() == self.train.len())
    }
}

fn load(cfg: &TrainConfig, path: &str, shown: &str, format: Format, rank: usize, n: usize) -> anyhow::Result<Dataset> {
    let opts = LoadOptions { format: Some(format), features: cfg.features, zero_based: cfg.zero_based, ..Default::default() };
    data::load_shard(path, &opts, rank, n).map_err(|e| named(e, path, shown))
}

/// A data error about `path` (a decompressed copy) as one about `shown` (the file given).
fn named(mut e: data::DataError, path: &str, shown: &str) -> anyhow::Error {
    if path != shown {
        if e.path == path {
            e.path = format!("{shown} (decompressed)");
        }
        e.message = e.message.replace(path, shown);
    }
    e.into()
}

/// Reads this rank's shard; every failure is agreed on by all ranks.
fn load_agreed(cfg: &TrainConfig, path: &str, comm: &SimpleCommunicator) -> anyhow::Result<Dataset> {
    let format = agree(comm, cfg.format.map_or_else(|| data::detect_format(path), Ok).map_err(anyhow::Error::from))?;
    if !matches!(format, Format::Libsvm | Format::Ratings) {
        return load_format(cfg, path, path, format, comm);
    }
    // A gzip-compressed text file is read from a decompressed copy; messages name the file given.
    let gz = agree(comm, text::gunzip_if_compressed(path).map_err(anyhow::Error::from))?;
    let Some(copy) = gz else { return load_format(cfg, path, path, format, comm) };
    let mut d = load_format(cfg, copy.path(), path, format, comm)?;
    d.source = path.to_owned();
    Ok(d)
}

/// [`load_agreed`] of a file in a known format; messages name `shown` for `path`.
fn load_format(cfg: &TrainConfig, path: &str, shown: &str, format: Format, comm: &SimpleCommunicator) -> anyhow::Result<Dataset> {
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    match format {
        Format::Libsvm | Format::Ratings if n > 1 => load_text_balanced(cfg, path, shown, format, comm),
        Format::Idx if n > 1 && agree(comm, data::idx::is_gzip(path).map_err(anyhow::Error::from))? => {
            match load_idx_scattered(path, comm)? {
                Some(d) => Ok(d),
                None => agree(comm, load(cfg, path, shown, format, rank, n)),
            }
        }
        _ => agree(comm, load(cfg, path, shown, format, rank, n)),
    }
}

/// Rank r's rows of a gzip-compressed IDX file can only be reached by decompressing every row
/// before them, so N ranks reading their own rows decompress ~N/2 copies of the file: at 256
/// ranks loading Fashion-MNIST took 34 s of a 128 s program (and all of the CPU). Here rank 0
/// decompresses each file once and scatters the raw rows (bytes: a quarter of the f32 rows).
/// Returns None (every rank then reads its own rows) when rank 0 cannot hold the whole file or
/// a rank's part exceeds what one MPI count can address.
fn load_idx_scattered(path: &str, comm: &SimpleCommunicator) -> anyhow::Result<Option<Dataset>> {
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    let (dims, ldims) = agree(comm, data::idx::pair_dims(path, None).map_err(anyhow::Error::from))?;
    let rows = dims[0];
    let row: u128 = dims[1..].iter().map(|&d| d as u128).product();
    let part = |r: usize| {
        let (lo, hi) = data::idx::shard_rows(rows, r, n);
        (hi - lo) as u128
    };
    let countable = (0..n).all(|r| part(r) * row <= i32::MAX as u128);
    let mut fits = [u8::from(rank != 0 || data::check_memory(path, "the whole file on rank 0", (rows as u128) * (row + 1) * 2).is_ok())];
    collectives::broadcast(comm, 0, &mut fits);
    if !countable || fits[0] == 0 {
        return Ok(None);
    }
    let all = agree(comm, if rank == 0 { data::idx::read_all_raw(path, None).map(Some).map_err(anyhow::Error::from) } else { Ok(None) })?;
    let (x_all, y_all) = all.map_or((Vec::new(), Vec::new()), |(x, _, y)| (x, y));
    let x_counts: Vec<i32> = (0..n).map(|r| (part(r) * row) as i32).collect();
    let y_counts: Vec<i32> = (0..n).map(|r| part(r) as i32).collect();
    let mut x = vec![0u8; x_counts[rank] as usize];
    let mut y = vec![0u8; y_counts[rank] as usize];
    collectives::scatter_varcount(comm, 0, &x_all, &x_counts, &mut x);
    collectives::scatter_varcount(comm, 0, &y_all, &y_counts, &mut y);
    drop((x_all, y_all));
    let first_row = data::idx::shard_rows(rows, rank, n).0;
    Ok(Some(agree(comm, data::idx::dataset_from_raw(path, None, x, &dims, y, &ldims, first_row).map_err(anyhow::Error::from))?))
}

/// Every rank gets floor or ceil(total/N) examples of a text file without any rank reading much
/// more than its own byte chunk (see `data::text`): each rank counts the example lines of its
/// chunk, remembering where every 4096th starts; all share (start, end, count); the owner of
/// the chunk where rank r's first example lies finds its offset from the nearest mark; all share
/// those starts (a shard ends where the next one starts); each rank parses its range.
fn load_text_balanced(cfg: &TrainConfig, path: &str, shown: &str, format: Format, comm: &SimpleCommunicator) -> anyhow::Result<Dataset> {
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    let t0 = std::time::Instant::now();
    let mine = agree(comm, text::count_chunk(path, rank, n).map_err(|e| named(e, path, shown)))?;
    let t_count = t0.elapsed().as_secs_f64();
    let c = mine.count;
    let all = all_gather_u64(comm, &[c.start, c.end, c.examples]);
    let chunks: Vec<text::ChunkCount> = all.chunks(3).map(|c| text::ChunkCount { start: c[0], end: c[1], examples: c[2] }).collect();
    let total: u64 = chunks.iter().map(|c| c.examples).sum();
    let plan: Vec<(usize, u64, u64)> = (0..n).map(|r| text::shard_start(&chunks, r, n)).collect();
    let answers = (|| -> Result<Vec<u64>, data::DataError> {
        let mut v = vec![0u64; n];
        for (r, &(k, skip, _)) in plan.iter().enumerate() {
            if k == rank {
                v[r] = mine.locate(path, skip)?;
            }
        }
        Ok(v)
    })();
    let answers = agree(comm, answers.map_err(|e| named(e, path, shown)))?;
    // Each start was filled in by exactly one rank, the others hold 0: a sum gathers them.
    let mut starts: Vec<f64> = answers.iter().map(|&x| x as f64).collect();
    collectives::sum_f64(comm, &mut starts);
    let (start, first) = (starts[rank] as u64, plan[rank].2);
    let (end, next) = match plan.get(rank + 1) {
        Some(p) => (starts[rank + 1] as u64, p.2),
        None => (chunks[n - 1].end, total),
    };
    let range = text::TextRange { start, end: end.max(start), first_row: first, rows: next - first };
    let t_locate = t0.elapsed().as_secs_f64();
    let read = match format {
        Format::Ratings => text::read_ratings_range(path, range),
        _ => text::read_libsvm_range(path, range, cfg.features, cfg.zero_based),
    };
    log::debug!(
        "{path}: examples {}..{} (bytes {}..{}); counted in {t_count:.2} s, located by {t_locate:.2} s, parsed by {:.2} s",
        range.first_row,
        next,
        range.start,
        range.end,
        t0.elapsed().as_secs_f64()
    );
    agree(comm, read.map_err(|e| named(e, path, shown)))
}

/// Every rank's `v` (all the same length), in rank order. Exact below 2^53 (byte offsets and
/// example counts of any real file): an all-reduce of one-hot rows, so no new MPI call is needed.
fn all_gather_u64(comm: &SimpleCommunicator, v: &[u64]) -> Vec<u64> {
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    let mut all = vec![0f64; n * v.len()];
    for (i, &x) in v.iter().enumerate() {
        debug_assert!(x < 1 << 53);
        all[rank * v.len() + i] = x as f64;
    }
    collectives::sum_f64(comm, &mut all);
    all.into_iter().map(|x| x as u64).collect()
}

/// Reads the shards and applies the held-out split.
pub fn load_shards(cfg: &TrainConfig, comm: &SimpleCommunicator) -> anyhow::Result<Shards> {
    let n = comm.size() as usize;
    let mut train = load_agreed(cfg, &cfg.data, comm)?;
    let mut test = match &cfg.test_data {
        Some(p) => Some(load_agreed(cfg, p, comm)?),
        None => None,
    };
    let zero_based = resolve_zero_based(cfg, &mut train, test.as_mut(), comm);
    let read_rows = (train.first_row != usize::MAX).then(|| (train.first_row as u64, (train.first_row + train.len()) as u64));
    let holdout = (test.is_none() && cfg.test_fraction > 0.0).then_some((cfg.test_fraction, cfg.seed));
    let (train, test) = match (test, cfg.test_fraction > 0.0) {
        (None, true) => {
            let (tr, te) = data::split_holdout(train, cfg.test_fraction, cfg.seed);
            (tr, Some(te))
        }
        (t, _) => (train, t),
    };
    let (train, test) = match cfg.label_threshold {
        Some(t) => (data::threshold_labels(train, t), test.map(|d| data::threshold_labels(d, t))),
        None => (train, test),
    };
    let iid = cfg.partition.parse() == Ok(data::partition::Partition::Iid);
    // Every training example's global id, its row in the file (train::elastic::training_ids).
    let read_ids = read_rows.map(|rows| super::elastic::training_ids(rows, holdout)).filter(|ids| ids.len() == train.len());
    let (train, ids) = partition(cfg, train, read_ids, comm)?;
    let rows = read_rows.filter(|_| iid);
    let total_train = collectives::sum_u64(comm, train.len() as u64);
    let total_test = collectives::sum_u64(comm, test.as_ref().map_or(0, |t| t.len() as u64));
    let empty = collectives::sum_u64(comm, train.is_empty() as u64);
    if empty > 0 {
        bail!(
            "{}: {} training examples cannot feed {} ranks ({} ranks got none): use at most {} ranks \
             or more data",
            cfg.data,
            total_train,
            n,
            empty,
            total_train.max(1)
        );
    }
    Ok(Shards { train, test, total_train, total_test, scaling: None, zero_based, rows, ids })
}

/// `--zero-based`, and under `auto` the LIBSVM files were read with indices as written; unless some rank saw
/// an index 0 (in the training or the test file) they were 1-based and every column moves down.
/// Returns how the training file was numbered (true: 0-based), None when it is not LIBSVM.
fn resolve_zero_based(cfg: &TrainConfig, train: &mut Dataset, test: Option<&mut Dataset>, comm: &SimpleCommunicator) -> Option<bool> {
    let is_libsvm = |p: &str| cfg.format.map_or_else(|| data::detect_format(p).ok(), Some) == Some(Format::Libsvm);
    let libsvm_train = is_libsvm(&cfg.data);
    let libsvm_test = cfg.test_data.as_deref().is_some_and(is_libsvm);
    let fixed = match cfg.zero_based {
        data::ZeroBased::Auto => None,
        z => Some(z == data::ZeroBased::True),
    };
    if let Some(z) = fixed.filter(|_| libsvm_train) {
        return Some(z);
    }
    if fixed.is_some() || (!libsvm_train && !libsvm_test) {
        return None;
    }
    let mut sets: Vec<&mut Dataset> = Vec::new();
    if libsvm_train {
        sets.push(train);
    }
    if let Some(t) = test.filter(|_| libsvm_test) {
        sets.push(t);
    }
    let mine = sets.iter().any(|d| data::has_column_zero(d)) as u64;
    let saw_zero = collectives::sum_u64(comm, mine) > 0;
    let zero = data::one_based_after_all(&mut sets, saw_zero);
    if zero && comm.rank() == 0 {
        log::info!("--zero-based auto: an index 0 in the LIBSVM data: reading it as 0-based (--zero-based false refuses it)");
    }
    libsvm_train.then_some(zero)
}

/// `--partition`: moves every training example to the rank its class and the seed choose, in
/// one all-to-all (each rank read only its contiguous part of the file before), with its global
/// id (`read_ids`: its row in the file, where the reader knows it). Returns the shard and, under
/// a label-skewed partition, its examples' ids (ascending: the senders' parts arrive in rank
/// order, each ascending, and rank r read rows before rank r + 1's).
fn partition(
    cfg: &TrainConfig,
    train: Dataset,
    read_ids: Option<Vec<u64>>,
    comm: &SimpleCommunicator,
) -> anyhow::Result<(Dataset, Option<Vec<u64>>)> {
    use crate::data::partition::{class_of, class_shares, decode_rows, destination, encode_rows, Partition};
    let p: Partition = cfg.partition.parse().map_err(anyhow::Error::msg)?;
    if p == Partition::Iid {
        return Ok((train, None));
    }
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    let classes: anyhow::Result<Vec<usize>> = train.labels.iter().map(|&l| class_of(l, &cfg.data).map_err(anyhow::Error::msg)).collect();
    let classes = agree(comm, classes)?;
    let n_classes = collectives::max_u64(comm, classes.iter().max().map_or(0, |&c| c as u64 + 1)) as usize;
    let shares = agree(comm, class_shares(p, n_classes, n, cfg.seed).map_err(anyhow::Error::msg))?;
    // A global id per example: its row in the file (the held-out split kept the rows' ids), so
    // an example goes to the same rank of an M-rank partition whoever read it. A reader that
    // does not know its rows (none of the file readers today) falls back to (rank, local row).
    let known = collectives::min_u64(comm, u64::from(read_ids.is_some())) == 1;
    let ids = match read_ids.filter(|_| known) {
        Some(ids) => ids,
        None => (0..train.len()).map(|i| ((rank as u64) << 40) + i as u64).collect(),
    };
    let dest: Vec<usize> = classes.iter().enumerate().map(|(i, &c)| destination(&shares, c, ids[i], cfg.seed)).collect();
    let out = agree(comm, encode_rows(&train, &ids, &dest, n).map_err(anyhow::Error::msg))?;
    drop(ids);
    let parts = collectives::all_to_all_bytes(comm, &out)?;
    drop(out);
    let (train, ids) = agree(comm, decode_rows(&train, &parts).map_err(anyhow::Error::msg))?;
    Ok((train, (known && ids.windows(2).all(|w| w[0] < w[1])).then_some(ids)))
}

/// Every rank's count of training examples per class, at rank 0 (empty elsewhere): what a
/// `--partition` gave each rank, for the metrics' start line.
pub fn class_counts(d: &Dataset, comm: &SimpleCommunicator) -> Vec<Vec<u64>> {
    let class = |l: f32| if l < 0.0 { 0 } else { l as usize };
    let c = collectives::max_u64(comm, d.labels.iter().map(|&l| class(l) as u64 + 1).max().unwrap_or(0)) as usize;
    let mut mine = vec![0u64; c];
    d.labels.iter().for_each(|&l| mine[class(l)] += 1);
    let all = collectives::gather(comm, 0, &mine);
    if c == 0 {
        Vec::new()
    } else {
        all.chunks(c).map(<[u64]>::to_vec).collect()
    }
}

/// What a data set holds, for the messages of [`check_kinds`].
fn kind_name(f: &Features) -> &'static str {
    match f {
        Features::Dense { .. } => "dense feature vectors",
        Features::Sparse(_) => "sparse feature vectors",
        Features::Ratings { .. } => "ratings (user item rating)",
    }
}

/// Columns a set's examples actually use: the width of dense data, the largest index + 1 of
/// sparse data (not a width declared by --features), none for ratings.
fn used_width(f: &Features) -> usize {
    match f {
        Features::Dense { d, .. } => *d,
        Features::Sparse(c) => c.indices.iter().max().map_or(0, |&j| j as usize + 1),
        Features::Ratings { .. } => 0,
    }
}

/// Refuses (on every rank alike) a training set without features and a held-out set of another
/// kind or shape than the training set, which used to be evaluated and reported as an accuracy
/// (issue 27: ratings against a classifier scored 0 %, 256-pixel images against a 784-pixel
/// model 9 %) or to panic (feature vectors against --model mf). A sparse held-out set may use
/// indices the training set never saw (LIBSVM files often do); a dense one must have the
/// training width, since nothing else tells which of its columns are which.
fn check_kinds(cfg: &TrainConfig, shards: &Shards, comm: &SimpleCommunicator) -> anyhow::Result<()> {
    let train = &shards.train.features;
    // [columns the training examples use, training width, held-out width]
    let mut w = [used_width(train) as f64, shards.train.dim() as f64, shards.test.as_ref().map_or(0.0, |t| t.dim() as f64)];
    collectives::max_f64(comm, &mut w);
    let (used, w_train, w_test) = (w[0] as usize, w[1] as usize, w[2] as usize);
    let data = &cfg.data;
    if !matches!(train, Features::Ratings { .. }) && used == 0 {
        bail!("{data}: no example has a feature (every example is a label alone, or the rows are 0 wide): check the file (a LIBSVM line is LABEL INDEX:VALUE ...) and --format");
    }
    let (Some(test), Some(tpath)) = (&shards.test, &cfg.test_data) else { return Ok(()) };
    let ratings = |f: &Features| matches!(f, Features::Ratings { .. });
    if ratings(train) != ratings(&test.features) {
        bail!(
            "--test-data {tpath} holds {}, but --data {data} holds {}: a held-out set must be of the training set's kind (--model {} trains on {})",
            kind_name(&test.features),
            kind_name(train),
            format!("{:?}", cfg.model).to_lowercase(),
            if ratings(train) { "ratings" } else { "feature vectors" }
        );
    }
    let width = if matches!(train, Features::Dense { .. }) { w_train } else { cfg.features.unwrap_or(w_train) };
    match &test.features {
        Features::Dense { .. } if w_test != width => bail!(
            "--test-data {tpath} has {w_test} features per example, but the training data {data} has {width}{}: a held-out set must have the training set's shape{}",
            if matches!(train, Features::Dense { .. }) { "" } else { " (its largest feature index)" },
            if matches!(train, Features::Sparse(_)) && cfg.features.is_none() && w_test > width {
                format!(" (if the training data really has {w_test} columns, say so with --features {w_test})")
            } else {
                String::new()
            }
        ),
        Features::Sparse(_) if matches!(train, Features::Dense { .. }) && w_test > w_train => bail!(
            "--test-data {tpath}: feature index {w_test} is beyond the {w_train} features per example of the training data {data}: a held-out set must have the training set's shape"
        ),
        _ => Ok(()),
    }
}

/// Largest feature dimension, label range and MF id ranges over all ranks and both sets, checked
/// against the model, into a [`ModelSpec`].
pub fn model_spec(cfg: &TrainConfig, shards: &Shards, comm: &SimpleCommunicator) -> anyhow::Result<ModelSpec> {
    check_kinds(cfg, shards, comm)?;
    let sets: Vec<&Dataset> = std::iter::once(&shards.train).chain(shards.test.as_ref()).collect();
    // [dim, max label, -min label, non-integer labels, users, items]
    let mut local = [0f64, f64::MIN, f64::MIN, 0.0, 0.0, 0.0];
    for d in &sets {
        local[0] = local[0].max(d.dim() as f64);
        for &y in &d.labels {
            local[1] = local[1].max(y as f64);
            local[2] = local[2].max(-(y as f64));
            if y.fract() != 0.0 {
                local[3] += 1.0;
            }
        }
        if let Features::Ratings { n_users, n_items, .. } = &d.features {
            local[4] = local[4].max(*n_users as f64);
            local[5] = local[5].max(*n_items as f64);
        }
    }
    let mut g = local;
    collectives::max_f64(comm, &mut g);
    let mut nonint = [local[3]];
    collectives::sum_f64(comm, &mut nonint);
    let (dim, max_label, min_label) = (g[0] as usize, g[1], -g[2]);

    let is_ratings = matches!(shards.train.features, Features::Ratings { .. });
    match (cfg.model, is_ratings) {
        (ModelKind::Mf, false) => bail!("{}: --model mf needs ratings data (user item rating)", cfg.data),
        (k, true) if k != ModelKind::Mf => {
            bail!("{}: ratings data can only train --model mf, not {k:?}", cfg.data)
        }
        _ => {}
    }
    let features = match cfg.features {
        Some(f) if f < dim && !is_ratings => {
            bail!("--features {f} is smaller than the data's dimension {dim} ({})", cfg.data)
        }
        Some(f) => f,
        None => dim,
    };
    let mut classes = 2;
    if matches!(cfg.model, ModelKind::Mlr | ModelKind::Mlp) {
        if nonint[0] > 0.0 || min_label < 0.0 {
            bail!(
                "{}: --model {:?} needs class labels 0, 1, ..., J-1; found labels from {min_label} \
                 to {max_label}{} (relabel the data, or use --model svm/logreg for +1/-1 labels)",
                cfg.data,
                cfg.model,
                if nonint[0] > 0.0 { " including non-integers" } else { "" }
            );
        }
        classes = (max_label as usize + 1).max(2);
        if let Some(c) = cfg.classes {
            if c < classes {
                bail!("--classes {c} but the data has label {max_label} (labels must be below --classes)");
            }
            classes = c;
        }
    }
    let spec = ModelSpec {
        kind: cfg.model,
        lambda: cfg.lambda,
        features,
        classes,
        hidden: cfg.hidden.clone(),
        factors: cfg.factors,
        users: g[4] as usize,
        items: g[5] as usize,
    };
    // First each rank checks what its own shard implies, so the rank holding an absurd label,
    // index or id names its place; then the agreed sizes (options included) are checked alike
    // on every rank.
    let local = ModelSpec {
        features: cfg.features.unwrap_or(0).max(local[0] as usize),
        classes: if matches!(cfg.model, ModelKind::Mlr | ModelKind::Mlp) {
            cfg.classes.unwrap_or(0).max(local[1].max(1.0) as usize + 1)
        } else {
            2
        },
        users: local[4] as usize,
        items: local[5] as usize,
        ..spec.clone()
    };
    agree(comm, check_model_memory(cfg, &local, &sets))?;
    let bytes = model_bytes(&spec);
    let avail = memory_per_rank().unwrap_or(1u128 << 50);
    if bytes > avail {
        bail!(
            "{}: --model {:?} with {} features, {} classes, hidden {:?}, {} factors, {} users and {} items needs \
             {} parameters ({} with working copies), more than the {} of memory available per rank: check \
             --features/--classes/--hidden/--factors and the data",
            cfg.data,
            spec.kind,
            spec.features,
            spec.classes,
            spec.hidden,
            spec.factors,
            spec.users,
            spec.items,
            param_count(&spec),
            data::human_bytes(bytes),
            data::human_bytes(avail)
        );
    }
    Ok(spec)
}

/// Ranks on this node, from the launcher's environment (Open MPI, MPICH/Hydra, Slurm); 1 if unknown.
fn ranks_on_this_node() -> u128 {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse::<u128>().ok())
        .unwrap_or(1)
        .max(1)
}

/// This rank's share of the memory available on its node: every rank holds its own replica.
fn memory_per_rank() -> Option<u128> {
    data::mem_available().map(|a| a as u128 / ranks_on_this_node())
}

/// Parameters a model of `s` holds, saturating (options and data may imply absurd sizes).
fn param_count(s: &ModelSpec) -> u128 {
    let (f, c) = (s.features as u128, s.classes as u128);
    match s.kind {
        ModelKind::Svm | ModelKind::Logreg | ModelKind::Lsq => f + 1,
        ModelKind::Mlr => c.saturating_mul(f + 1),
        ModelKind::Mlp => {
            let (mut prev, mut p) = (f, 0u128);
            for &h in &s.hidden {
                p = p.saturating_add((prev + 1).saturating_mul(h as u128));
                prev = h as u128;
            }
            p.saturating_add((prev + 1).saturating_mul(c))
        }
        ModelKind::Mf => (s.users as u128 + s.items as u128).saturating_mul(s.factors as u128 + 1).saturating_add(1),
        // Never reached: train::run hands --model lda to train::lda before any spec is built.
        ModelKind::Lda => 0,
    }
}

/// At least four f32 copies of the parameters live at once (the model, its gradient scratch, and
/// a sync mode's send and receive buffers).
fn model_bytes(s: &ModelSpec) -> u128 {
    param_count(s).saturating_mul(16)
}

/// Refuses a model that the sizes in this rank's data imply and that cannot fit in memory,
/// naming the value and where it is (file:line for text, row for other formats).
fn check_model_memory(cfg: &TrainConfig, s: &ModelSpec, sets: &[&Dataset]) -> anyhow::Result<()> {
    let bytes = model_bytes(s);
    let Some(avail) = memory_per_rank() else { return Ok(()) };
    if bytes <= avail {
        return Ok(());
    }
    // The largest data-derived size is the culprit: find the row that holds it.
    let mut worst: Option<(u128, String)> = None;
    for d in sets {
        let mut consider = |value: u128, row: Option<usize>, what: String| {
            if worst.as_ref().is_none_or(|w| value > w.0) {
                let place = match row {
                    Some(r) if d.first_row != usize::MAX => data::place_of_row(&d.source, cfg.format, (d.first_row + r) as u64),
                    _ => d.source.clone(),
                };
                worst = Some((value, format!("{place}: {what}")));
            }
        };
        match &d.features {
            Features::Sparse(c) => {
                if let Some((i, &j)) = c.indices.iter().enumerate().max_by_key(|&(_, &j)| j) {
                    let row = c.indptr.partition_point(|&p| p <= i) - 1;
                    consider(j as u128 + 1, Some(row), format!("feature index {}", j as u64 + 1));
                }
                if c.ncols > c.indices.iter().max().map_or(0, |&j| j as usize + 1) {
                    consider(c.ncols as u128, None, format!("declared width of {} columns", c.ncols));
                }
            }
            Features::Dense { d: dim, .. } => consider(*dim as u128, None, format!("{dim} features per example")),
            Features::Ratings { users, items, .. } => {
                for (ids, what) in [(users, "user"), (items, "item")] {
                    if let Some((r, &u)) = ids.iter().enumerate().max_by_key(|&(_, &u)| u) {
                        consider(u as u128 + 1, Some(r), format!("{what} id {u}"));
                    }
                }
            }
        }
        if matches!(s.kind, ModelKind::Mlr | ModelKind::Mlp) {
            if let Some((r, &y)) = d.labels.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)) {
                consider(y.max(0.0) as u128 + 1, Some(r), format!("label {y}"));
            }
        }
    }
    let (_, what) = worst.unwrap_or((0, cfg.data.clone()));
    bail!(
        "{what} implies a --model {:?} of {} parameters ({} with working copies), more than the {} of \
         memory available per rank: check the data (or --features/--classes/--hidden/--rank)",
        s.kind,
        param_count(s),
        data::human_bytes(bytes),
        data::human_bytes(avail)
    )
}

/// Makes sparse rows dense (both sets, `features` wide) where they should be standardised: under
/// `--scale auto` when the training set's non-zeros are at least [`data::DENSE_ENOUGH`] of its
/// cells, and always under `--scale standard` (it was refused on sparse data; a dense copy too
/// large for memory still is). Collective.
fn hold_dense(cfg: &TrainConfig, shards: &mut Shards, features: usize, comm: &SimpleCommunicator) -> anyhow::Result<()> {
    let Features::Sparse(c) = &shards.train.features else { return Ok(()) };
    let mut counts = [c.data.len() as f64, shards.train.len() as f64];
    collectives::sum_f64(comm, &mut counts);
    let density = counts[0] / (counts[1] * features.max(1) as f64).max(1.0);
    let dense = match cfg.scale {
        Scaling::Auto => data::dense_enough(counts[0], counts[1], features),
        Scaling::Standard => true,
        _ => false,
    };
    if !dense {
        return Ok(());
    }
    let rows = shards.train.len() + shards.test.as_ref().map_or(0, |t| t.len());
    let bytes = rows as u128 * features as u128 * 4;
    let fits = data::check_memory(&cfg.data, &format!("{rows} rows x {features} features held dense for --scale standard"), bytes);
    agree(comm, fits.map_err(|e| anyhow::anyhow!("{e}; use --scale max-abs for sparse data")))?;
    data::make_dense(&mut shards.train, features);
    if let Some(t) = shards.test.as_mut() {
        data::make_dense(t, features);
    }
    if comm.rank() == 0 {
        log::info!("sparse rows at {:.1} % non-zero held dense, so that they are standardised (--scale)", 100.0 * density);
    }
    Ok(())
}

/// Scales features with statistics of the whole training set (all ranks), applied to both sets
/// and kept in `shards.scaling`.
pub fn scale_features(cfg: &TrainConfig, shards: &mut Shards, features: usize, comm: &SimpleCommunicator) -> anyhow::Result<()> {
    let dense = matches!(shards.train.features, Features::Dense { .. });
    let mode = match (cfg.scale, dense) {
        (Scaling::Auto, true) => Scaling::Standard,
        (Scaling::Auto, false) => Scaling::None,
        (Scaling::Standard, false) => bail!("--scale standard needs dense data; use max-abs for sparse data"),
        (m, _) => m,
    };
    if matches!(shards.train.features, Features::Ratings { .. }) || mode == Scaling::None {
        return Ok(());
    }
    let (scale, shift, method) = match mode {
        Scaling::MaxAbs => {
            let mut m = data::column_max_abs(&shards.train);
            m.resize(features, 0.0);
            collectives::max_f32(comm, &mut m);
            let scale: Vec<f32> = m.iter().map(|&x| if x > 0.0 { 1.0 / x } else { 1.0 }).collect();
            (scale, vec![0.0; features], "max-abs")
        }
        Scaling::Standard => {
            let (mut sum, mut sq, count) = data::column_moments(&shards.train);
            sum.resize(features, 0.0);
            sq.resize(features, 0.0);
            let mut all: Vec<f64> = sum.into_iter().chain(sq).chain([count]).collect();
            collectives::sum_f64(comm, &mut all);
            let cnt = all[2 * features].max(1.0);
            let mut scale = vec![1f32; features];
            let mut shift = vec![0f32; features];
            for j in 0..features {
                let mean = all[j] / cnt;
                let var = (all[features + j] / cnt - mean * mean).max(0.0);
                scale[j] = if var > 1e-12 { (1.0 / var.sqrt()) as f32 } else { 1.0 };
                shift[j] = mean as f32;
            }
            (scale, shift, "standard")
        }
        _ => unreachable!("handled above"),
    };
    data::scale_columns(&mut shards.train, &scale, &shift);
    if let Some(t) = shards.test.as_mut() {
        data::scale_columns(t, &scale, &shift);
    }
    shards.scaling = Some(data::ColumnScaling { method: method.into(), scale, shift });
    Ok(())
}

/// The original label of each of the model's outputs (collective), for a saved model: the class
/// index itself for mlr/mlp (their labels are 0..J-1); for svm/logreg `[label of -1, label of
/// +1]`: the one non-positive (positive) label of the training set when there is only one, else
/// -1 (+1), which then stands for "a label <= 0" ("> 0"). None for regression (lsq, mf).
pub fn output_labels(spec: &ModelSpec, train: &Dataset, comm: &SimpleCommunicator) -> Option<Vec<f32>> {
    match spec.kind {
        ModelKind::Mlr | ModelKind::Mlp => Some((0..spec.classes).map(|c| c as f32).collect()),
        ModelKind::Svm | ModelKind::Logreg => {
            // [max, -min] of the non-positive labels, then of the positive ones.
            let mut m = [f64::MIN; 4];
            for &y in &train.labels {
                let k = if y > 0.0 { 2 } else { 0 };
                m[k] = m[k].max(y as f64);
                m[k + 1] = m[k + 1].max(-(y as f64));
            }
            collectives::max_f64(comm, &mut m);
            let one = |k: usize, default: f32| if m[k] != f64::MIN && m[k] == -m[k + 1] { m[k] as f32 } else { default };
            Some(vec![one(0, -1.0), one(2, 1.0)])
        }
        // LDA saves its own model (word_topic, vocab) through its driver.
        ModelKind::Lsq | ModelKind::Mf | ModelKind::Lda => None,
    }
}

/// All of start-up, with failures agreed on by every rank.
pub fn prepare(cfg: &TrainConfig, comm: &SimpleCommunicator) -> anyhow::Result<(Shards, ModelSpec)> {
    let mut shards = load_shards(cfg, comm)?;
    let spec = model_spec(cfg, &shards, comm).context("cannot set up the model")?;
    hold_dense(cfg, &mut shards, spec.features, comm)?;
    scale_features(cfg, &mut shards, spec.features, comm)?;
    degenerate_setup(cfg, &shards, comm)?;
    Ok((shards, spec))
}

/// Feature magnitude above which a warning suggests scaling: a sparse feature of 1.2e10 gave an
/// objective of 6e11 (issue 27); standardised or unit-norm data stays within ~1e2.
const LARGE_FEATURE: f64 = 1e4;

/// Set-ups that run but cannot train as the user expects (issue 27): a binary model whose
/// training labels all fall on one side is refused; fewer examples per rank than a mini-batch,
/// more than two label values for a binary model, and huge feature values are warned about once
/// (rank 0), with the fix.
fn degenerate_setup(cfg: &TrainConfig, shards: &Shards, comm: &SimpleCommunicator) -> anyhow::Result<()> {
    let train = &shards.train;
    let smallest = collectives::min_u64(comm, train.len() as u64);
    let binary = matches!(cfg.model, ModelKind::Svm | ModelKind::Logreg);
    let positive = collectives::sum_u64(comm, train.labels.iter().filter(|&&y| y > 0.0).count() as u64);
    let others_labels = train.labels.iter().any(|&y| y != 1.0 && y != -1.0 && y != 0.0) as u64;
    let other = collectives::sum_u64(comm, others_labels) > 0;
    let mut big = [match &train.features {
        Features::Dense { x, .. } => x.iter().fold(0f64, |m, &v| m.max((v as f64).abs())),
        Features::Sparse(c) => c.data.iter().fold(0f64, |m, &v| m.max((v as f64).abs())),
        Features::Ratings { .. } => 0.0,
    }];
    collectives::max_f64(comm, &mut big);
    if binary && (positive == 0 || positive == shards.total_train) {
        bail!(
            "{}: every training label is {} (--model {} reads labels > 0 as +1, the others as -1), so there is one class to learn: use --label-threshold T to split the labels, or --model mlr for class labels 0..J-1",
            cfg.data,
            if positive == 0 { "<= 0" } else { "> 0" },
            format!("{:?}", cfg.model).to_lowercase()
        );
    }
    if comm.rank() != 0 {
        return Ok(());
    }
    // The shard whose size sets an epoch's steps (plan::steps_per_epoch): the smallest under iid,
    // the mean under a label-skewed partition.
    let (which, epoch_shard) =
        if cfg.partition == "iid" { ("smallest", smallest) } else { ("mean", shards.total_train / comm.size() as u64) };
    if (epoch_shard as usize) < cfg.batch_size {
        log::warn!(
            "the {which} shard holds {epoch_shard} training examples, fewer than --batch-size {}: each epoch is one step per rank ({} steps in all); use --batch-size {} or fewer ranks",
            cfg.batch_size,
            cfg.epochs,
            epoch_shard.max(1)
        );
    }
    if binary && other {
        log::warn!(
            "--model {} reads labels > 0 as +1 and the others as -1, and the data has other labels than -1, 0 and 1: use --label-threshold T to say where the classes split, or --model mlr",
            format!("{:?}", cfg.model).to_lowercase()
        );
    }
    if big[0] > LARGE_FEATURE {
        log::warn!(
            "a training feature value of {:.3e} (after --scale {}): SGD steps and the objective scale with it; use --scale max-abs (sparse data) or standard (dense)",
            big[0],
            serde_json::to_value(cfg.scale).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
        );
    }
    Ok(())
}
