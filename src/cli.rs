//! The command line: `asap-train [train] [OPTIONS]`, `asap-train graph ...`, `asap-train data ...`,
//! `asap-train bench ...`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{LrSchedule, Scaling, SyncKind, TrainConfig};
use crate::data::Format;
use crate::model::ModelKind;
use crate::sync::asap::NotifyMode;

/// Data-parallel SGD over MPI. Launch with `mpirun -n N asap-train ...` or `srun`; every rank
/// trains a replica on its shard of the data and exchanges models as --sync says. With no
/// subcommand it runs `train` on the built-in default (Fashion-MNIST, softmax regression,
/// ASAP stochastic reduce on the root expander graph).
#[derive(Parser, Debug)]
#[command(name = "asap-train", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Options of `train` (used when no subcommand is given).
    #[command(flatten)]
    pub train: TrainArgs,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a model (the main job; run it under mpirun or srun).
    Train(TrainArgs),
    /// Analyse communication graphs: spectral gap, comparisons, search (no MPI needed).
    Graph(crate::graph::command::GraphArgs),
    /// Convert and inspect data files.
    Data(crate::data::command::DataArgs),
    /// Single-rank throughput benchmark of every model on Fashion-MNIST.
    Bench(crate::bench::BenchArgs),
}

/// Options of `asap-train train`. Every option can also be set in a `--config` file (TOML or
/// JSON, keys spelled with underscores, e.g. `batch_size = 64`); flags override the file.
#[derive(Args, Debug, Default, Clone)]
pub struct TrainArgs {
    /// TOML (.toml) or JSON config file with any of the options below; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    // ---- data ----
    /// Training data: LIBSVM text, IDX images (MNIST family, .gz ok; labels file found by
    /// replacing images-idx3 with labels-idx1), HDF5 (.h5) or ratings text. Every rank reads only
    /// its own shard. [default: Fashion-MNIST train set from /usr/share/datasets/fashion-mnist]
    #[arg(long, value_name = "PATH", help_heading = "Data")]
    pub data: Option<String>,
    /// Held-out data evaluated with the averaged model. Without it (and without
    /// --test-fraction) the metrics report training accuracy. [default: Fashion-MNIST t10k when
    /// --data is the default; none otherwise]
    #[arg(long, value_name = "PATH", help_heading = "Data")]
    pub test_data: Option<String>,
    /// Data format, when the file extension does not tell (.svm/.libsvm -> libsvm, *-ubyte[.gz]
    /// -> idx, .h5/.hdf5 -> hdf5, .ratings -> ratings).
    #[arg(long, value_enum, help_heading = "Data")]
    pub format: Option<Format>,
    /// Hold out this fraction of the training examples (chosen by a seeded hash of the row) as
    /// the test set, when there is no --test-data. [default: 0]
    #[arg(long, value_name = "F", help_heading = "Data")]
    pub test_fraction: Option<f64>,
    /// Feature scaling (statistics of the whole training set, over all ranks). [default: auto =
    /// standard (zero mean, unit variance) for dense data, none for sparse]
    #[arg(long, value_enum, help_heading = "Data")]
    pub scale: Option<Scaling>,
    /// Number of input features, if the data does not show the largest index (sparse data).
    #[arg(long, value_name = "D", help_heading = "Data")]
    pub features: Option<usize>,

    // ---- model ----
    /// Model: svm (hinge + L2), logreg (binary logistic + L2), mlr (softmax regression), mf
    /// (matrix factorisation of ratings), mlp (ReLU hidden layers, softmax). [default: mlr]
    #[arg(long, value_enum, help_heading = "Model")]
    pub model: Option<ModelKind>,
    /// Hidden layer widths for --model mlp, e.g. 128 or 256,64. [default: 128]
    #[arg(long, value_delimiter = ',', value_name = "W[,W]", help_heading = "Model")]
    pub hidden: Option<Vec<usize>>,
    /// Factor rank k for --model mf. [default: 10]
    #[arg(long, value_name = "K", help_heading = "Model")]
    pub rank: Option<usize>,
    /// Number of classes for mlr/mlp. [default: largest label + 1, over all ranks]
    #[arg(long, value_name = "J", help_heading = "Model")]
    pub classes: Option<usize>,
    /// L2 regularisation strength lambda. [default: 1e-5]
    #[arg(long, value_name = "L", help_heading = "Model")]
    pub lambda: Option<f32>,

    // ---- optimisation ----
    /// Passes over the data. [default: 10]
    #[arg(long, value_name = "E", help_heading = "Optimisation")]
    pub epochs: Option<usize>,
    /// Examples per mini-batch on each rank. [default: 32]
    #[arg(long, value_name = "B", help_heading = "Optimisation")]
    pub batch_size: Option<usize>,
    /// Initial step size eta0. [default: 0.3]
    #[arg(long, value_name = "ETA", help_heading = "Optimisation")]
    pub lr: Option<f32>,
    /// Step-size schedule: constant, inv-sqrt (eta0/sqrt(1+t), t = mini-batches), bottou
    /// (eta0/(1+lambda*eta0*t), t = examples), decay (eta0*decay^epoch). [default: decay]
    #[arg(long, value_enum, help_heading = "Optimisation")]
    pub lr_schedule: Option<LrSchedule>,
    /// Per-epoch factor for --lr-schedule decay. [default: 0.8]
    #[arg(long, value_name = "F", help_heading = "Optimisation")]
    pub lr_decay: Option<f32>,
    /// Seed for initialisation, shuffling and random graphs (same seed + ranks = same run). [default: 1]
    #[arg(long, help_heading = "Optimisation")]
    pub seed: Option<u64>,

    // ---- synchronisation ----
    /// How ranks exchange models: allreduce (BSP averaging, the baseline), asap (stochastic
    /// reduce with in-neighbours on --graph), none (independent replicas). [default: asap]
    #[arg(long, value_enum, help_heading = "Synchronisation")]
    pub sync: Option<SyncKind>,
    /// Local mini-batches between two exchanges. [default: 1]
    #[arg(long, value_name = "K", help_heading = "Synchronisation")]
    pub sync_every: Option<usize>,
    /// Communication graph for --sync asap: root-expander, exponential, ring, complete, chain,
    /// line, star, hypercube, torus, random:D (D-regular, seeded) or file:PATH (see graphs/).
    /// [default: root-expander]
    #[arg(long, value_name = "GRAPH", help_heading = "Synchronisation")]
    pub graph: Option<String>,
    /// Synchronisation of --sync asap: notify-ack (one-sided NOTIFY-ACK, the default), barrier
    /// (put, MPI_Barrier, reduce what is consistent) or none (fully asynchronous).
    #[arg(long, value_enum, help_heading = "Synchronisation")]
    pub notify: Option<NotifyMode>,
    /// Seconds a rank waits for a neighbour before the job aborts naming it. [default: 60]
    #[arg(long, value_name = "SECONDS", help_heading = "Synchronisation")]
    pub wait_timeout: Option<f64>,
    /// Emulate slow ranks: RANKS:FACTOR (e.g. 0,3:2 or 0-5:2) slows those ranks' compute FACTOR x.
    #[arg(long, value_name = "RANKS:FACTOR", help_heading = "Synchronisation")]
    pub straggler: Option<String>,
    /// Fault injection for tests: RANK:ROUND makes RANK stop sending after ROUND (asap only).
    #[arg(long, value_name = "RANK:ROUND", hide = true)]
    pub stop_sending_after: Option<String>,
    /// Fault injection for tests: RANK:ROUND makes RANK panic at ROUND.
    #[arg(long, value_name = "RANK:ROUND", hide = true)]
    pub fault_panic: Option<String>,

    // ---- output ----
    /// Evaluate every this many rounds (0 = once per epoch). [default: 0]
    #[arg(long, value_name = "ROUNDS", help_heading = "Output")]
    pub eval_every: Option<usize>,
    /// Target held-out metric (e.g. 0.84 accuracy); the summary reports when it was first reached.
    #[arg(long, value_name = "VALUE", help_heading = "Output")]
    pub target: Option<f64>,
    /// Stop after this many rounds (the run can be continued with --resume).
    #[arg(long, value_name = "N", help_heading = "Output")]
    pub max_rounds: Option<u64>,
    /// Write one JSON object per evaluation (plus start and summary lines) to FILE.
    #[arg(long, value_name = "FILE.jsonl", help_heading = "Output")]
    pub metrics: Option<String>,
    /// Write the final (averaged) model to this HDF5 file.
    #[arg(long, value_name = "FILE.h5", help_heading = "Output")]
    pub save_model: Option<String>,
    /// Directory for HDF5 checkpoints (model of every rank, round, epoch, RNG state, config).
    #[arg(long, value_name = "DIR", help_heading = "Output")]
    pub checkpoint_dir: Option<String>,
    /// Write a checkpoint every N rounds (0 = only at the end). [default: 0]
    #[arg(long, value_name = "N", help_heading = "Output")]
    pub checkpoint_every: Option<u64>,
    /// Continue from the newest checkpoint in --checkpoint-dir.
    #[arg(long, help_heading = "Output")]
    pub resume: bool,
}

impl TrainArgs {
    /// Defaults, then the config file, then these flags.
    pub fn effective_config(&self) -> anyhow::Result<TrainConfig> {
        let mut c = match &self.config {
            Some(p) => TrainConfig::from_file(p)?,
            None => TrainConfig::default(),
        };
        let default_data = TrainConfig::default().data;
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() { c.$f = v; } )* };
        }
        macro_rules! set_opt {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() { c.$f = Some(v); } )* };
        }
        set!(data, test_fraction, scale, model, hidden, rank, lambda, epochs, batch_size, lr,
             lr_schedule, lr_decay, seed, sync, sync_every, graph, notify, wait_timeout, eval_every,
             checkpoint_every);
        set_opt!(test_data, format, features, classes, target, max_rounds, metrics, save_model,
                 checkpoint_dir, straggler, stop_sending_after, fault_panic);
        // The built-in test set belongs to the built-in training set only.
        if c.data != default_data && self.test_data.is_none() && c.test_data == TrainConfig::default().test_data {
            c.test_data = None;
        }
        c.resume |= self.resume;
        c.validate()?;
        Ok(c)
    }
}
