//! The effective training configuration: built-in defaults, then a TOML/JSON `--config` file,
//! then command-line flags (each later source overrides the earlier). It is printed at start and
//! stored with the metrics and every checkpoint.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::data::Format;
use crate::model::ModelKind;

/// Where Debian's `dataset-fashion-mnist` installs the data set.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// How ranks exchange what they learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SyncKind {
    /// BSP model averaging with MPI_Allreduce every --sync-every mini-batches (the baseline).
    Allreduce,
    /// ASAP stochastic reduce: average with in-neighbours on --graph, one-sided NOTIFY-ACK.
    Asap,
    /// No exchange: independent replicas (with one rank, plain SGD).
    None,
}

/// Step-size schedule (t counts mini-batches done by this rank, e counts epochs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LrSchedule {
    /// eta = lr.
    Constant,
    /// eta = lr / sqrt(1 + t).
    InvSqrt,
    /// Bottou's SVM-SGD schedule eta = lr / (1 + lambda * lr * t), t counting examples.
    Bottou,
    /// eta = lr * decay^epoch.
    Decay,
}

/// Feature scaling applied to dense inputs before training (statistics from the training set,
/// combined over all ranks, applied to train and test alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Scaling {
    /// Standardise dense columns (zero mean, unit variance); leave sparse data alone.
    Auto,
    /// Leave features as read.
    None,
    /// Divide each column by its maximum absolute value (sparse too: keeps zeros zero).
    MaxAbs,
    /// Zero mean, unit variance per column (dense only).
    Standard,
}

/// Every setting of a training run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub data: String,
    pub test_data: Option<String>,
    pub format: Option<Format>,
    pub test_fraction: f64,
    pub scale: Scaling,
    pub model: ModelKind,
    pub hidden: Vec<usize>,
    pub rank: usize,
    pub classes: Option<usize>,
    pub features: Option<usize>,
    pub sync: SyncKind,
    pub sync_every: usize,
    pub epochs: usize,
    pub batch_size: usize,
    pub lr: f32,
    pub lr_schedule: LrSchedule,
    pub lr_decay: f32,
    pub lambda: f32,
    pub seed: u64,
    pub eval_every: usize,
    pub target: Option<f64>,
    pub max_rounds: Option<u64>,
    pub metrics: Option<String>,
    pub save_model: Option<String>,
    pub checkpoint_dir: Option<String>,
    pub checkpoint_every: u64,
    pub resume: bool,
    pub straggler: Option<String>,
    pub graph: String,
    pub notify: crate::sync::asap::NotifyMode,
    pub wait_timeout: f64,
    pub stop_sending_after: Option<String>,
    pub fault_panic: Option<String>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            data: format!("{FASHION_MNIST_DIR}/train-images-idx3-ubyte.gz"),
            test_data: Some(format!("{FASHION_MNIST_DIR}/t10k-images-idx3-ubyte.gz")),
            format: None,
            test_fraction: 0.0,
            scale: Scaling::Auto,
            model: ModelKind::Mlr,
            hidden: vec![128],
            rank: 10,
            classes: None,
            features: None,
            sync: SyncKind::Asap,
            sync_every: 1,
            epochs: 10,
            batch_size: 32,
            lr: 0.3,
            lr_schedule: LrSchedule::Decay,
            lr_decay: 0.8,
            lambda: 1e-5,
            seed: 1,
            eval_every: 0,
            target: None,
            max_rounds: None,
            metrics: None,
            save_model: None,
            checkpoint_dir: None,
            checkpoint_every: 0,
            resume: false,
            straggler: None,
            graph: "root-expander".into(),
            notify: crate::sync::asap::NotifyMode::NotifyAck,
            wait_timeout: 60.0,
            stop_sending_after: None,
            fault_panic: None,
        }
    }
}

impl TrainConfig {
    /// Reads a TOML (`.toml`) or JSON (anything else) config file; missing keys keep defaults,
    /// unknown keys are an error (a typo should not be silently ignored).
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let is_toml = path.extension().is_some_and(|e| e == "toml");
        let cfg = if is_toml {
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        } else {
            serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!("{}:{}:{}: {e}", path.display(), e.line(), e.column())
            })?
        };
        Ok(cfg)
    }

    /// Checks settings that do not need the data; messages name the option to fix.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.batch_size >= 1, "--batch-size must be at least 1");
        anyhow::ensure!(self.sync_every >= 1, "--sync-every must be at least 1");
        anyhow::ensure!(self.epochs >= 1, "--epochs must be at least 1");
        anyhow::ensure!(self.lr > 0.0 && self.lr.is_finite(), "--lr must be a positive number, got {}", self.lr);
        anyhow::ensure!(self.lambda >= 0.0 && self.lambda.is_finite(), "--lambda must be >= 0, got {}", self.lambda);
        anyhow::ensure!(
            (0.0..1.0).contains(&self.test_fraction),
            "--test-fraction must be in [0, 1), got {}",
            self.test_fraction
        );
        anyhow::ensure!(self.wait_timeout > 0.0, "--wait-timeout must be positive seconds");
        anyhow::ensure!(
            !self.resume || self.checkpoint_dir.is_some(),
            "--resume needs --checkpoint-dir DIR (the directory holding the checkpoints)"
        );
        anyhow::ensure!(
            self.model != ModelKind::Mlp || (1..=2).contains(&self.hidden.len()),
            "--hidden takes one or two layer widths for --model mlp, got {:?}",
            self.hidden
        );
        Ok(())
    }
}

/// `--straggler RANKS:FACTOR`, e.g. `0,3:2` or `0-5:2.5`: the named ranks' compute is slowed by
/// FACTOR (each local step is followed by a sleep of (FACTOR-1) times its duration).
pub fn parse_straggler(s: &str, nranks: usize) -> anyhow::Result<(Vec<usize>, f64)> {
    let hint = "expected --straggler RANKS:FACTOR, e.g. 0,3:2 or 0-5:2.5";
    let (ranks, factor) = s.rsplit_once(':').ok_or_else(|| anyhow::anyhow!("{hint}, got {s:?}"))?;
    let factor: f64 = factor.parse().map_err(|_| anyhow::anyhow!("{hint}: bad factor {factor:?}"))?;
    anyhow::ensure!(factor >= 1.0 && factor.is_finite(), "{hint}: FACTOR must be >= 1, got {factor}");
    let mut out = Vec::new();
    for part in ranks.split(',').filter(|p| !p.is_empty()) {
        let parse = |x: &str| -> anyhow::Result<usize> {
            x.trim().parse().map_err(|_| anyhow::anyhow!("{hint}: bad rank {x:?}"))
        };
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => (parse(part)?, parse(part)?),
        };
        anyhow::ensure!(a <= b && b < nranks, "{hint}: rank range {part} is outside 0..{}", nranks - 1);
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok((out, factor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn straggler_parsing() {
        assert_eq!(parse_straggler("0,3:2", 8).unwrap(), (vec![0, 3], 2.0));
        assert_eq!(parse_straggler("1-3,2:1.5", 8).unwrap(), (vec![1, 2, 3], 1.5));
        assert!(parse_straggler("9:2", 8).is_err());
        assert!(parse_straggler("1:0.5", 8).is_err());
        assert!(parse_straggler("1", 8).is_err());
    }

    #[test]
    fn config_files_override_defaults_and_reject_typos() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("c.toml");
        std::fs::write(&t, "epochs = 3\nmodel = \"svm\"\nlr = 0.5\n").unwrap();
        let c = TrainConfig::from_file(&t).unwrap();
        assert_eq!((c.epochs, c.model, c.lr), (3, ModelKind::Svm, 0.5));
        assert_eq!(c.batch_size, TrainConfig::default().batch_size);
        let j = dir.path().join("c.json");
        std::fs::write(&j, "{\"epoch\": 3}").unwrap();
        let e = TrainConfig::from_file(&j).unwrap_err().to_string();
        assert!(e.contains("c.json:1:") && e.contains("epoch"), "{e}");
    }
}

/// A `RANK:ROUND` pair (fault-injection options).
pub fn parse_rank_round(opt: &str, s: &str, nranks: usize) -> anyhow::Result<(usize, u64)> {
    let bad = || anyhow::anyhow!("{opt} expects RANK:ROUND with RANK < {nranks}, got {s:?}");
    let (r, k) = s.split_once(':').ok_or_else(bad)?;
    let r: usize = r.parse().map_err(|_| bad())?;
    let k: u64 = k.parse().map_err(|_| bad())?;
    if r >= nranks {
        return Err(bad());
    }
    Ok((r, k))
}
