//! Start-up of a training run: read this rank's shards, agree on global dimensions and label
//! ranges, scale features, and build the model spec. Every failure is agreed on collectively so
//! that all ranks exit with an error instead of some hanging.

use anyhow::{bail, Context};
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::comm::collectives::{self, agree};
use crate::config::{Scaling, TrainConfig};
use crate::data::{self, Dataset, Features, LoadOptions};
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
}

fn load(cfg: &TrainConfig, path: &str, rank: usize, n: usize) -> anyhow::Result<Dataset> {
    let opts = LoadOptions { format: cfg.format, features: cfg.features, ..Default::default() };
    Ok(data::load_shard(path, &opts, rank, n)?)
}

/// Reads the shards and applies the held-out split.
pub fn load_shards(cfg: &TrainConfig, comm: &SimpleCommunicator) -> anyhow::Result<Shards> {
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    let train = agree(comm, load(cfg, &cfg.data, rank, n))?;
    let test = match &cfg.test_data {
        Some(p) => Some(agree(comm, load(cfg, p, rank, n))?),
        None => None,
    };
    let (train, test) = match (test, cfg.test_fraction > 0.0) {
        (None, true) => {
            let (tr, te) = data::split_holdout(train, cfg.test_fraction, cfg.seed);
            (tr, Some(te))
        }
        (t, _) => (train, t),
    };
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
    Ok(Shards { train, test, total_train, total_test })
}

/// Largest feature dimension, label range and MF id ranges over all ranks and both sets, checked
/// against the model, into a [`ModelSpec`].
pub fn model_spec(cfg: &TrainConfig, shards: &Shards, comm: &SimpleCommunicator) -> anyhow::Result<ModelSpec> {
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
    Ok(ModelSpec {
        kind: cfg.model,
        lambda: cfg.lambda,
        features,
        classes,
        hidden: cfg.hidden.clone(),
        factors: cfg.factors,
        users: g[4] as usize,
        items: g[5] as usize,
    })
}

/// Scales features with statistics of the whole training set (all ranks), applied to both sets.
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
    let (scale, shift) = match mode {
        Scaling::MaxAbs => {
            let mut m = data::column_max_abs(&shards.train);
            m.resize(features, 0.0);
            collectives::max_f32(comm, &mut m);
            let scale: Vec<f32> = m.iter().map(|&x| if x > 0.0 { 1.0 / x } else { 1.0 }).collect();
            (scale, vec![0.0; features])
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
            (scale, shift)
        }
        _ => unreachable!("handled above"),
    };
    data::scale_columns(&mut shards.train, &scale, &shift);
    if let Some(t) = shards.test.as_mut() {
        data::scale_columns(t, &scale, &shift);
    }
    Ok(())
}

/// All of start-up, with failures agreed on by every rank.
pub fn prepare(cfg: &TrainConfig, comm: &SimpleCommunicator) -> anyhow::Result<(Shards, ModelSpec)> {
    let mut shards = load_shards(cfg, comm)?;
    let spec = model_spec(cfg, &shards, comm).context("cannot set up the model")?;
    scale_features(cfg, &mut shards, spec.features, comm)?;
    Ok((shards, spec))
}
