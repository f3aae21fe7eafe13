//! The effective training configuration: built-in defaults, then a TOML/JSON `--config` file,
//! then command-line flags (each later source overrides the earlier). It is printed at start and
//! stored with the metrics and every checkpoint.
//!
//! Every option is declared once, as a field of [`TrainConfig`] or of a mode's option group
//! (flattened into it): the field's doc comment is its `--help`, its `#[arg]` attribute its flag
//! and default, and its name its key in config files. Defaults, file keys and flags are derived
//! from that one declaration (see [`TrainConfig::merge`]), so adding an option touches one place.

use std::path::Path;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use serde::{Deserialize, Serialize};

use crate::comm::pace::LinkSpec;
use crate::data::Format;
use crate::model::ModelKind;
pub use crate::values::{finite_f32, finite_f64};

/// Where Debian's `dataset-fashion-mnist` installs the data set.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// `--sync`: generated from the modes' registry (`sync/mod.rs`), each value declared by its mode.
pub use crate::sync::SyncKind;

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
    /// Cosine decay from lr (after --warmup-epochs) to 0 at the run's last mini-batch:
    /// eta = lr (1 + cos(pi p)) / 2, p the fraction of the decay's mini-batches done.
    Cosine,
    /// AdaRevision (Bosen §3.4; --sync bosen only): per-coordinate adaptive steps computed by the
    /// shard servers when they apply an update, smaller the more updates it missed (alpha = lr).
    Adarevision,
}

/// The optimizer of every rank's local steps (`--inner-optimizer`; DiLoCo's inner optimizer,
/// beside `--outer-optimizer`'s step on the averaged models).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum InnerOptimizer {
    /// w -= eta g (each model's own step, sparse where its batch is).
    Sgd,
    /// Heavy-ball momentum in PyTorch's form: v = mu v + g, w -= eta v (--momentum mu).
    Momentum,
    /// Adam with decoupled weight decay (Loshchilov & Hutter; PyTorch's AdamW).
    Adamw,
}

/// What each rank's optimizer state (momentum buffer, Adam's moments and step count) does at a
/// sync (`--inner-state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum InnerState {
    /// Kept on the rank across syncs (DiLoCo's inner AdamW, DDP with a local optimizer).
    Local,
    /// Zeroed at every sync (Adam's step count too): each round starts the optimizer afresh.
    Reset,
}

/// Adam's settings (`--inner-optimizer adamw`).
#[derive(Args, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[group(id = "adamw_group")]
pub struct AdamOptions {
    /// Adam's first-moment decay beta1 (--inner-optimizer adamw).
    #[arg(long, value_name = "B1", default_value_t = 0.9, value_parser = finite_f32, help_heading = "Optimisation")]
    pub beta1: f32,
    /// Adam's second-moment decay beta2 (--inner-optimizer adamw).
    #[arg(long, value_name = "B2", default_value_t = 0.999, value_parser = finite_f32, help_heading = "Optimisation")]
    pub beta2: f32,
    /// Adam's epsilon, added to the root of the second moment (--inner-optimizer adamw).
    #[arg(long, value_name = "EPS", default_value_t = 1e-8, value_parser = finite_f32, help_heading = "Optimisation")]
    pub adam_eps: f32,
    /// AdamW's decoupled weight decay: every step multiplies every parameter by 1 - eta * WD
    /// (PyTorch's AdamW without parameter groups). --lambda stays the objective's L2 term, in the
    /// gradient as for every optimizer: for Loshchilov & Hutter's AdamW give --lambda 0
    /// --weight-decay 0.01.
    #[arg(long, value_name = "WD", default_value_t = 0.0, value_parser = finite_f32, help_heading = "Optimisation")]
    pub weight_decay: f32,
}

impl Default for AdamOptions {
    fn default() -> Self {
        crate::values::option_defaults()
    }
}

/// Which model a `--target` is judged on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TargetOn {
    /// The run's model (averaged replicas, or the parameter servers' model).
    Averaged,
    /// The worst rank's own replica (what decentralised training must bring up).
    WorstRank,
    /// The mean over ranks of each rank's own replica's metric.
    MeanRank,
}

/// What a lost rank (a process that died) does to the run (`--on-rank-loss`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OnRankLoss {
    /// The job ends, naming the rank.
    Abort,
    /// The survivors shrink the job to themselves and go on (ULFM build only).
    Continue,
}

/// How an emulated straggler spends its extra time (`--straggler-wait`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StragglerWait {
    /// Sleep: the core is free for other ranks (an oversubscribed rank behaves so).
    Sleep,
    /// Spin: the core stays busy (a slow machine or a shared node does not give it away).
    Busy,
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

/// Every setting of a training run. Options of one sync mode live in that mode's group.
#[derive(Args, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
// No option group of its own: its options apply to every run unless they name a group (see
// groups_used).
#[group(skip)]
pub struct TrainConfig {
    // ---- data ----
    /// Training data: LIBSVM text, IDX images (MNIST family, .gz ok; labels file found by
    /// replacing images-idx3 with labels-idx1), HDF5 (.h5) or ratings text. Every rank reads only
    /// its own shard. [default: Fashion-MNIST train set]
    #[arg(long, value_name = "PATH", help_heading = "Data", hide_default_value = true,
          default_value = concat!("/usr/share/datasets/fashion-mnist", "/train-images-idx3-ubyte.gz"))]
    pub data: String,
    /// Held-out data evaluated with the final model. Without it (and without --test-fraction)
    /// the metrics report training accuracy. [default: Fashion-MNIST t10k when --data is the
    /// default; none otherwise]
    #[arg(long, value_name = "PATH", help_heading = "Data", hide_default_value = true,
          default_value = concat!("/usr/share/datasets/fashion-mnist", "/t10k-images-idx3-ubyte.gz"))]
    pub test_data: Option<String>,
    /// Data format, when the file extension does not tell (.svm/.libsvm -> libsvm, *-ubyte[.gz]
    /// -> idx, .h5/.hdf5 -> hdf5, .ratings -> ratings).
    #[arg(long, value_enum, help_heading = "Data")]
    pub format: Option<Format>,
    /// Hold out this fraction of the training examples (chosen by a seeded hash of the row) as
    /// the test set, when there is no --test-data.
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = finite_f64, help_heading = "Data")]
    pub test_fraction: f64,
    /// How training examples are spread over the ranks: iid (contiguous shards of the file, as
    /// read), by-label:K (each rank holds K classes) or dirichlet:ALPHA (each class spread over
    /// the ranks by Dirichlet(ALPHA) shares; 0.5 is strongly skewed). Seeded; classification
    /// labels only. Each rank reads its own part of the file and the rows then move in one
    /// all-to-all (docs/training.md).
    #[arg(long, value_name = "SPEC", default_value = "iid", help_heading = "Data")]
    pub partition: String,
    /// Feature scaling (statistics of the whole training set, over all ranks): auto = standard
    /// (zero mean, unit variance) for dense data and for sparse rows at least a quarter non-zero
    /// (held dense: LIBSVM files of dense data), none for sparser rows; standard holds any sparse
    /// rows dense to standardise them.
    #[arg(long, value_enum, default_value_t = Scaling::Auto, help_heading = "Data")]
    pub scale: Scaling,
    /// How LIBSVM feature indices are numbered, as scikit-learn's load_svmlight_file: auto
    /// (0-based when any index in the training or test file is 0), true (0 is the first
    /// feature), false (LIBSVM's own convention: 1 is the first, and an index 0 is an error that
    /// names these options; the default, so a 1-based file with a stray 0 is not misread).
    #[arg(long, value_enum, default_value_t = crate::data::ZeroBased::False, help_heading = "Data")]
    pub zero_based: crate::data::ZeroBased,
    /// Number of input features, if the data does not show the largest index (sparse data).
    #[arg(long, value_name = "D", help_heading = "Data")]
    pub features: Option<usize>,
    /// Make the labels binary: labels >= T become +1, the others -1 (training and test data
    /// alike), e.g. 5 to tell Fashion-MNIST classes 5-9 from 0-4 with --model lsq.
    #[arg(long, value_name = "T", value_parser = finite_f32, help_heading = "Data")]
    pub label_threshold: Option<f32>,

    // ---- model ----
    /// Model: svm (hinge + L2), logreg (binary logistic + L2), lsq (least squares + L2, labels
    /// as read; RMSE), mlr (softmax regression), mf (matrix factorisation of ratings), mlp (ReLU
    /// hidden layers, softmax), lda (topic model of a UCI bag-of-words docword file by collapsed
    /// Gibbs sampling: --topics, --alpha, --beta; docs/lda.md).
    #[arg(long, value_enum, default_value_t = ModelKind::Mlr, help_heading = "Model")]
    pub model: ModelKind,
    /// Hidden layer widths for --model mlp, e.g. 128 or 256,64.
    #[arg(long, value_delimiter = ',', value_name = "W[,W]", default_value = "128", group = "mlp_group", help_heading = "Model")]
    pub hidden: Vec<usize>,
    /// Latent factors per user and item for --model mf (the factorisation's rank k).
    #[arg(long, alias = "rank", value_name = "K", default_value_t = 10, group = "mf_group", help_heading = "Model")]
    #[serde(alias = "rank")]
    pub factors: usize,
    /// Number of classes for mlr/mlp. [default: largest label + 1, over all ranks]
    #[arg(long, value_name = "J", group = "classes_group", help_heading = "Model")]
    pub classes: Option<usize>,
    /// L2 regularisation strength lambda.
    #[arg(long, value_name = "L", default_value_t = 1e-5, value_parser = finite_f32, help_heading = "Model")]
    pub lambda: f32,

    // ---- optimisation ----
    /// Passes over the data.
    #[arg(long, value_name = "E", default_value_t = 10, help_heading = "Optimisation")]
    pub epochs: usize,
    /// Examples per mini-batch on each rank.
    #[arg(long, value_name = "B", default_value_t = 32, help_heading = "Optimisation")]
    pub batch_size: usize,
    /// Initial step size eta0. When not given it is chosen at start-up for the model and the
    /// data (a short search on a sample of the training set, see src/train/step_search.rs; the
    /// start line and the metrics say which); 0.3 for --lr-schedule adarevision's alpha.
    #[arg(long, value_name = "ETA", default_value_t = 0.3, value_parser = finite_f32, help_heading = "Optimisation")]
    pub lr: f32,
    /// Step-size schedule: cosine (the default: eta0 (1 + cos(pi p))/2 from the warm-up's end,
    /// p = 0, to the run's last mini-batch, p = 1, so more --epochs stretch it and keep
    /// learning), constant, inv-sqrt (eta0/sqrt(1+t), t = mini-batches), bottou
    /// (eta0/(1+lambda*eta0*t), t = examples), decay (eta0*decay^epoch), adarevision (bosen's
    /// servers choose per-coordinate steps; eta0 is its alpha).
    #[arg(long, value_enum, default_value_t = LrSchedule::Cosine, help_heading = "Optimisation")]
    pub lr_schedule: LrSchedule,
    /// Per-epoch factor for --lr-schedule decay; given without --lr-schedule, it selects the
    /// decay schedule (the default before cosine). When not given and more than 8 ranks share the
    /// data, each epoch decays by 0.8^(8/ranks) instead, i.e. 0.8 per 8-rank epoch's worth of
    /// examples per rank (see `train::plan::fit_to_ranks`; the start line says which was used),
    /// unless the default step grew with the ranks' combined batch (--lr not given).
    #[arg(long, value_name = "F", default_value_t = 0.8, value_parser = finite_f32, help_heading = "Optimisation")]
    pub lr_decay: f32,
    /// Linear warm-up of the step size over the first W epochs (fractions allowed, counted in
    /// mini-batches): step t (from 0) of the warm-up takes (t+1)/steps of the schedule's step.
    /// Every schedule but adarevision; 0 = none.
    #[arg(long, value_name = "W", default_value_t = 0.0, value_parser = finite_f64, help_heading = "Optimisation")]
    pub warmup_epochs: f64,
    /// Optimizer of each rank's local steps: sgd, momentum (heavy ball, v = mu v + g, w -= eta v;
    /// --momentum) or adamw (--beta1, --beta2, --adam-eps, --weight-decay). momentum and adamw
    /// step on the dense gradient of the whole parameter vector: --model svm, logreg, lsq, mlr
    /// and mlp (not mf, whose step touches only the rated rows, nor lda). Their state stays on
    /// each rank across syncs unless --inner-state reset (docs/training.md).
    #[arg(long, value_enum, default_value_t = InnerOptimizer::Sgd, help_heading = "Optimisation")]
    pub inner_optimizer: InnerOptimizer,
    /// Momentum mu of --inner-optimizer momentum.
    #[arg(long, value_name = "MU", default_value_t = 0.9, value_parser = finite_f32, group = "momentum_group", help_heading = "Optimisation")]
    pub momentum: f32,
    /// Options of --inner-optimizer adamw.
    #[command(flatten)]
    #[serde(flatten)]
    pub adam: AdamOptions,
    /// What each rank's optimizer state does at a sync: local (kept: DiLoCo's inner AdamW; the
    /// measured choice, docs/training.md) or reset (zeroed, Adam's step count too).
    #[arg(long, value_enum, default_value_t = InnerState::Local, group = "inner_state_group", help_heading = "Optimisation")]
    pub inner_state: InnerState,
    /// Seed for initialisation, shuffling and random graphs (same seed + ranks = same run).
    #[arg(long, default_value_t = 1, help_heading = "Optimisation")]
    pub seed: u64,
    /// Training off, to measure how fast a sync mode mixes: every rank starts from its own
    /// random model (N(0,1) per parameter, from --seed and its rank) and takes no gradient
    /// steps; the sync still runs every round, and the metrics' consensus_distance shows the
    /// replicas agreeing (`make report`: mixing vs spectral gap).
    #[arg(long, help_heading = "Optimisation")]
    pub consensus_only: bool,

    // ---- synchronisation (every mode) ----
    /// How ranks exchange what they learned (one of the modes below; docs/sync-modes.md).
    #[arg(long, value_enum, default_value_t = SyncKind::Asap, help_heading = "Synchronisation")]
    pub sync: SyncKind,
    /// Local mini-batches between two exchanges (one round, or one clock for ssp).
    #[arg(long, value_name = "K", default_value_t = 1, help_heading = "Synchronisation")]
    pub sync_every: usize,
    /// Seconds a rank waits for another (a neighbour, a shard server, a collective) before the
    /// job aborts naming the ranks it waited for.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0, value_parser = finite_f64, help_heading = "Synchronisation")]
    pub wait_timeout: f64,
    /// What a lost rank (a killed process) does: `abort` ends the job naming it; `continue` goes
    /// on with the survivors, in the modes that can (asap, none, allreduce): they shrink the job,
    /// rebuild the mode over themselves and deal what is left of the epoch (docs/training.md,
    /// "Losing a rank in place"). Needs the ULFM build (`make ulfm`) launched with
    /// `.venv-ompi5/bin/mpirun --with-ft ulfm`.
    #[arg(long, value_enum, default_value_t = OnRankLoss::Abort, help_heading = "Synchronisation")]
    pub on_rank_loss: OnRankLoss,
    /// Emulate slow ranks: RANKS:FACTOR (e.g. 0,3:2 or 0-5:2) slows those ranks' compute FACTOR x;
    /// RANKS:FACTOR@A-B only from round A to round B (then they recover); transient:FACTOR:ROUNDS[:SEED]
    /// slows one random rank (never 0) FACTOR x per stretch of ROUNDS rounds; delay:P[@RANK]
    /// delays one rank (default the last) by P % (0-100) of its step time; production[:SEED] draws
    /// the production-cluster pattern: 25 % of the ranks straggle, 80 % of them 1.5-2.5x, the rest
    /// 2.5-10x (seeded, rank 0 never). With --emulate-compute the factor scales the declared step
    /// time; without it, the measured one (each step followed by a sleep).
    #[arg(long, value_name = "FORM", help_heading = "Emulated cluster")]
    pub straggler: Option<String>,
    /// How a --straggler spends its extra time: sleep (frees the core: on an oversubscribed
    /// machine the other ranks then run faster) or busy (spins, as a slow machine would; the
    /// others keep their share of the cores).
    #[arg(long, value_enum, default_value_t = StragglerWait::Sleep, help_heading = "Emulated cluster")]
    pub straggler_wait: StragglerWait,
    /// Declared compute time of every local step in milliseconds at nominal speed: the real step
    /// is computed (real data, real gradients) and the rest of the time slept, so N ranks on a
    /// few cores behave like N machines of that speed. Steps that overrun are counted; a run
    /// with more than 1 % of them says so and is marked invalid (docs/emulation.md).
    #[arg(long, value_name = "MS", value_parser = positive_ms, help_heading = "Emulated cluster")]
    pub emulate_compute: Option<f64>,
    /// Step-time variance: each declared step (--emulate-compute) lasts its time times a factor
    /// drawn per step and rank from the distribution with these quantiles, P:FACTOR pairs from
    /// P = 0 to P = 1, linear between them (e.g. 0:0.97,0.5:1,0.9:1.06,0.99:1.5,1:3: the median
    /// step takes the declared time, 1 in 100 half as long again or more). `asap-train bench`
    /// measures them on this machine, and a --cluster profile's [jitter] table holds them
    /// (docs/emulation.md). Seeded by --seed and the rank.
    #[arg(long, value_name = "P:FACTOR,...", help_heading = "Emulated cluster")]
    pub emulate_jitter: Option<crate::train::jitter::Jitter>,
    /// Work in proportion to speed (Hop's lever): a rank slowed FACTOR x (--straggler) takes
    /// mini-batches of --batch-size / FACTOR examples, so its steps take the nominal time, and
    /// steps of them of --lr / FACTOR (averages then weigh each rank by the examples it saw);
    /// every mode, allreduce included.
    #[arg(long, help_heading = "Emulated cluster")]
    pub balance: bool,
    /// Emulate slow links on one machine: each rank's link carries MBPS Mbit/s both ways, and a
    /// message runs at the slower end's rate. Per rank: 1000,0-1:100 (every rank 1 GbE, ranks 0
    /// and 1 100 Mbit/s). All modes; see docs/emulation.md for what the link model covers.
    #[arg(long, value_name = "MBPS[,RANKS:MBPS]", value_parser = link_rate, help_heading = "Emulated cluster")]
    pub emulate_bandwidth: Option<LinkSpec>,
    /// One-way latency in milliseconds of --emulate-bandwidth's links, in the same per-rank form.
    #[arg(long, value_name = "MS[,RANKS:MS]", default_value = "0", value_parser = link_latency, help_heading = "Emulated cluster")]
    pub emulate_latency: LinkSpec,
    /// What carries --emulate-bandwidth's links: ideal (a message takes its bytes over the rate
    /// plus one latency; the model of every emulated table before this option) or tcp (Open MPI
    /// over TCP/Ethernet, as on netlab's real links: payload at 1448/1514 of the rate, a
    /// two-sided message over the 4 MiB eager limit waits a round trip for its rendezvous, a
    /// one-sided put moves at 0.47 of that and waits 84.3 ms and 10.5 one-way latencies more,
    /// fitted over netlab; two-sided messages and the all-reduce ring go through each sender-
    /// receiver pair's TCP slow start: a new or idle path (over an RTO, RTT + 200 ms) sends 10
    /// segments in its first round trip and doubles each one until the path is full);
    /// docs/emulation.md "Validation" and "TCP slow start".
    #[arg(long, value_enum, default_value_t = crate::comm::pace::Fabric::Ideal, help_heading = "Emulated cluster")]
    pub emulate_fabric: crate::comm::pace::Fabric,
    /// Emulate G data centres: the ranks in G equal groups of contiguous ranks (as gaia's
    /// --groups G). A pair within a group talks over the LAN (--emulate-lan-bandwidth,
    /// --emulate-lan-latency); a pair across over --emulate-bandwidth's link (the WAN: its rate,
    /// latency and TCP window per pair), and the ranks of a group share one WAN link to each
    /// other group, as a data centre's hosts share its uplink: a message across leaves when both
    /// its pair's path and that shared link have carried it. off: every pair takes the per-rank
    /// links (the model before this option). Needs --emulate-bandwidth and --emulate-latency with
    /// one value for every rank, and every rank on one machine. A --cluster profile's `groups`
    /// fills it; docs/emulation.md.
    #[arg(long, value_name = "G|off", value_parser = emulate_groups, help_heading = "Emulated cluster")]
    pub emulate_groups: Option<usize>,
    /// The LAN of --emulate-groups: Mbit/s of every rank's own link (its NIC) within its group
    /// [default: 10000, or a --cluster profile's `lan_bandwidth_mbps`].
    #[arg(long, value_name = "MBPS", value_parser = lan_rate, help_heading = "Emulated cluster")]
    pub emulate_lan_bandwidth: Option<f64>,
    /// The LAN of --emulate-groups: one-way latency in milliseconds within a group [default: 0,
    /// or a --cluster profile's `lan_latency_ms`].
    #[arg(long, value_name = "MS", value_parser = lan_latency, help_heading = "Emulated cluster")]
    pub emulate_lan_latency: Option<f64>,
    /// A cluster profile (TOML, see clusters/): declared step times per model and batch size,
    /// link bandwidth and latency, optional per-rank heterogeneity. It fills --emulate-compute,
    /// --emulate-bandwidth, --emulate-latency and --straggler where they are not given.
    #[arg(long, value_name = "FILE.toml", help_heading = "Emulated cluster")]
    pub cluster: Option<String>,
    /// Time dilation of --cluster's profile instead of its own `dilation`: the emulated cluster
    /// runs D times slower than the profile's (step times and latencies x D, rates / D). Choose
    /// the smallest D at which the run stays valid: many ranks or big models need more.
    #[arg(long, value_name = "D", value_parser = dilation_factor, help_heading = "Emulated cluster")]
    pub dilation: Option<f64>,
    /// Fault injection for tests: RANK:ROUND makes RANK stop sending after ROUND (asap, ssp).
    #[arg(long, value_name = "RANK:ROUND", hide = true)]
    pub stop_sending_after: Option<String>,
    /// Fault injection for tests: RANK:ROUND makes RANK panic at ROUND.
    #[arg(long, value_name = "RANK:ROUND", hide = true)]
    pub fault_panic: Option<String>,
    /// Fault injection for tests: RANK:ROUND makes RANK kill itself with SIGKILL at ROUND, as
    /// `kill -9` would (once: a run that goes on after it, --on-rank-loss continue, forgets it);
    /// ROUND 0: during start-up, before the first collective.
    #[arg(long, value_name = "RANK:ROUND", hide = true)]
    pub fault_kill: Option<String>,

    /// Every mode's own option group (generated from the modes' registry, `sync/mod.rs`).
    #[command(flatten)]
    #[serde(flatten)]
    pub modes: crate::sync::ModeOptions,
    /// Options of --model lda.
    #[command(flatten)]
    #[serde(flatten)]
    pub lda: crate::model::lda::LdaOptions,

    // ---- output ----
    /// Evaluate every this many rounds (0 = once per epoch). Under asynchronous modes (asap,
    /// ssp with --staleness > 0, async with a --barrier other than bsp) each rank keeps a snapshot and the evaluation runs later, so it
    /// never makes the ranks wait for each other (see docs/training.md).
    #[arg(long, value_name = "ROUNDS", default_value_t = 0, help_heading = "Output")]
    pub eval_every: usize,
    /// Target held-out metric (e.g. 0.84 accuracy, or an RMSE); the summary reports when it was
    /// first reached.
    #[arg(long, value_name = "VALUE", value_parser = finite_f64, help_heading = "Output")]
    pub target: Option<f64>,
    /// Which model --target is judged on: averaged (the run's model), worst-rank (the worst
    /// rank's own replica) or mean-rank (the mean of the ranks' own metrics). Eval lines carry
    /// all three.
    #[arg(long, value_enum, default_value_t = TargetOn::Averaged, help_heading = "Output")]
    pub target_on: TargetOn,
    /// How many ranks' own replicas each evaluation scores on the whole held-out set: K ranks
    /// spread evenly over the job, rank 0 first (0 = every rank). Each one is a full pass over
    /// the held-out set, so scoring every rank's replica at every evaluation costs N passes
    /// (at 256 ranks and 3 epochs about 5x the training itself). The summary names the ranks.
    #[arg(long, value_name = "K", default_value_t = 8, help_heading = "Output")]
    pub own_models: usize,
    /// Stop at the first evaluation that reaches --target (benchmarks of time to target). Under
    /// asynchronous modes every evaluation then runs at once, making the ranks meet at it
    /// (outside the training time) instead of later from snapshots.
    #[arg(long, help_heading = "Output")]
    pub stop_at_target: bool,
    /// Early stopping: stop when the held-out metric of the run's model has not improved for P
    /// evaluations in a row (--eval-every; once per epoch by default). Every rank stops at the
    /// same evaluation; the summary says so and where the best was. --save-model writes the
    /// last model, not the best (as Keras's EarlyStopping without restore_best_weights). Needs a
    /// held-out set; under asynchronous modes every evaluation then runs at once.
    #[arg(long, value_name = "P", help_heading = "Output")]
    pub patience: Option<usize>,
    /// Stop after this many rounds (the run can be continued with --resume).
    #[arg(long, value_name = "N", help_heading = "Output")]
    pub max_rounds: Option<u64>,
    /// Write one JSON object per evaluation (plus start and summary lines) to FILE.
    #[arg(long, value_name = "FILE.jsonl", help_heading = "Output")]
    pub metrics: Option<String>,
    /// Write every paced send of each rank (seconds since start, bytes) to PREFIX.rank<R>.csv, to
    /// check a bandwidth budget or emulation (needs --emulate-bandwidth or --sync bosen). With
    /// --emulate-groups also PREFIX.links.rank<R>.csv: every message's times on the wall clock
    /// (handed over, started, last byte out) and, across groups, on the shared group link.
    #[arg(long, value_name = "PREFIX", help_heading = "Output")]
    pub send_log: Option<String>,
    /// Write the final model to this HDF5 file.
    #[arg(long, value_name = "FILE.h5", help_heading = "Output")]
    pub save_model: Option<String>,
    /// Write this run's configuration to FILE (TOML if it ends .toml, JSON otherwise, as --config
    /// reads them) once the defaults that depend on the run are chosen (the step size searched,
    /// the decay scaled to the ranks): only the options that apply to this run, so `--config
    /// FILE` repeats the same run and also drives runs of other modes (docs/training.md).
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub save_config: Option<String>,
    /// Directory for HDF5 checkpoints (model of every rank, the sync mode's state, round, epoch,
    /// RNG state, config).
    #[arg(long, value_name = "DIR", help_heading = "Output")]
    pub checkpoint_dir: Option<String>,
    /// Create missing directories above --metrics, --save-model, --save-config, --send-log and
    /// --checkpoint-dir (like mkdir -p). Without it a missing directory is an error before
    /// training starts, so a typo in a path is found at once instead of writing the results
    /// somewhere unexpected (--checkpoint-dir itself is created when its parent exists).
    #[arg(long, help_heading = "Output")]
    pub create_dirs: bool,
    /// Write a checkpoint every N rounds (0 = only at the end).
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Output")]
    pub checkpoint_every: u64,
    /// Continue from the newest checkpoint in --checkpoint-dir, also one written at another rank
    /// count: every rank starts from the replicas' average (ssp, bosen: the parameter servers'
    /// model, re-partitioned by row), and the examples left of its epoch are each seen once, as
    /// often as the uninterrupted run planned them (docs/training.md).
    #[arg(long, help_heading = "Output")]
    pub resume: bool,
    /// Continue from this run's newest checkpoint in --checkpoint-dir when there is one (as
    /// --resume does, at another rank count too), else start from scratch: for batch jobs that
    /// are requeued after preemption.
    #[arg(long, help_heading = "Output")]
    pub auto_resume: bool,
    /// Rounds between the ranks' votes on stopping: on SIGTERM or SIGUSR1 (Slurm's --signal)
    /// all ranks stop at the next vote round after the signal, write a checkpoint (with
    /// --checkpoint-dir) and exit with status 75, which slurm/asap-train.sbatch turns into a
    /// requeue.
    #[arg(long, value_name = "ROUNDS", default_value_t = 20, help_heading = "Output")]
    pub stop_check_every: u64,

    /// The --config file these options came from (not an option itself; checked against outputs).
    #[arg(skip)]
    #[serde(skip)]
    pub config_file: Option<String>,
}

/// Which option groups a run uses by its model: each line is a condition (config keys and values,
/// all of which must hold) and the groups a run meeting it uses. The modes' lines come from their
/// declarations ([`crate::sync::ModeSpec::uses`]); [`groups_used`] gives both.
///
/// An option group is a clap `ArgGroup` of the `train` command. Each flattened options struct
/// is one, named after the struct (`AsapOptions`); an option shared by several modes also names
/// a further group in its declaration (`#[arg(group = "staleness_group")]`), as do
/// `TrainConfig`'s options of one model (`mlp_group`). A group's id must differ from every
/// option's (clap keeps both in one namespace of matches). An option given explicitly (flag or
/// config file, not a default) must belong to a group the run uses
/// ([`TrainConfig::check_applicable`]); `TrainConfig`'s options that name no group apply to every
/// run.
pub const MODEL_GROUPS: &[crate::sync::Uses] = &[
    (&[("model", "mlp")], &["mlp_group", "classes_group"]),
    (&[("model", "mlr")], &["classes_group"]),
    (&[("model", "mf")], &["mf_group"]),
    (&[("model", "lda")], &["LdaOptions"]),
];

/// Which option groups a run uses by its inner optimizer (as [`MODEL_GROUPS`] by its model).
pub const OPTIMIZER_GROUPS: &[crate::sync::Uses] = &[
    (&[("inner_optimizer", "momentum")], &["momentum_group", "inner_state_group"]),
    (&[("inner_optimizer", "adamw")], &["adamw_group", "inner_state_group"]),
];

/// A condition (config keys and values, all of which must hold) and the option groups a run
/// meeting it uses.
pub type GroupUse = (Vec<(&'static str, &'static str)>, &'static [&'static str]);

/// Every condition under which a run uses option groups, with the groups: the modes' (from their
/// declarations, in the registry's order, each with `sync = <mode>` first), then the models' and the
/// inner optimizers'.
pub fn groups_used() -> Vec<GroupUse> {
    let modes = SyncKind::ALL.iter().map(|k| k.spec()).flat_map(|spec| {
        spec.uses.iter().map(move |(when, groups)| ([("sync", spec.name)].into_iter().chain(when.iter().copied()).collect(), *groups))
    });
    modes.chain(MODEL_GROUPS.iter().chain(OPTIMIZER_GROUPS).map(|(when, groups)| (when.to_vec(), *groups))).collect()
}

/// Options that do not change the trajectory of a run (its models, round by round), left out of
/// the checkpoints' run identity (`train::checkpoint::RunIdentity`), which hashes every other
/// option as resolved by `train::plan::with_mode_defaults`: a new option is part of the identity unless
/// it is added here. Each entry says why the models do not depend on it.
pub const TRAJECTORY_FREE: &[(&str, &str)] = &[
    ("metrics", "where the metrics are written"),
    ("save_model", "where the final model is written"),
    ("save_config", "where the run's configuration is written"),
    ("send_log", "a log of the paced sends, which it records, not changes"),
    ("checkpoint_dir", "where checkpoints are written (the identity picks them there)"),
    (
        "checkpoint_every",
        "when checkpoints are written: a checkpoint's quiesce moves no model (resumed runs end bit-identical to runs that wrote none)",
    ),
    ("create_dirs", "whether output directories are made"),
    ("resume", "how this invocation starts, not where the run goes"),
    ("auto_resume", "how this invocation starts, not where the run goes"),
    ("max_rounds", "where this invocation stops; the run is continued without it"),
    ("stop_at_target", "where this invocation stops (at the target); the models up to there are the same"),
    ("patience", "where this invocation stops (early stopping); the models up to there are the same"),
    ("stop_check_every", "rounds between the stop votes, a collective that moves no model"),
    ("wait_timeout", "how long a rank waits before the job fails; it changes no value"),
    ("on_rank_loss", "what a lost rank does to the run; until a rank is lost the run is the one without it"),
    ("eval_every", "when the model is evaluated (evaluations read the models, and asynchronous modes evaluate snapshots later)"),
    ("own_models", "how many replicas an evaluation scores"),
    ("target", "what the summary reports"),
    ("target_on", "what the summary reports"),
    ("fault_panic", "fault injection that ends the run; up to it the run is the one without it"),
    ("fault_kill", "fault injection that kills a rank; up to it the run is the one without it"),
];

/// Options no longer declared, each with what to give instead. A flag (the command line,
/// Python's keyword arguments) or config-file key of one is refused with its replacement, where
/// clap alone would only call it unexpected.
pub const RETIRED_OPTIONS: &[(&str, &str)] = &[(
    "fp16",
    "--fp16 is now --compress fp16 (compress = \"fp16\" in a config file, compress=\"fp16\" from Python): Bösen's half-precision pushes are one case of the codec option every mode shares (issue 40)",
)];

/// The replacement of the retired option clap's error `e` names as unexpected, if it names one.
pub fn retired_option_hint(e: &clap::Error) -> Option<&'static str> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else { return None };
    let key = arg.strip_prefix("--")?.split('=').next()?.replace('-', "_");
    RETIRED_OPTIONS.iter().find(|(old, _)| *old == key).map(|(_, hint)| *hint)
}

/// Which options a source gave (the command line or the config file) rather than left at their
/// defaults, as the merge found them: the run plan (`train::plan`) fills a default that depends on
/// the run (the step size searched for the data, the decay scaled to the ranks) only where the
/// option was not given. Not an option: it is not stored, printed or hashed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Given {
    /// `--lr`.
    pub lr: bool,
    /// `--lr-decay`.
    pub lr_decay: bool,
}

/// The merge's result ([`TrainConfig::merge`]): the options, and which of them were given.
#[derive(Clone, Debug)]
pub struct Merged {
    pub options: TrainConfig,
    pub given: Given,
}

impl Default for TrainConfig {
    fn default() -> Self {
        crate::sync::option_defaults()
    }
}

impl TrainConfig {
    /// The effective configuration: `flags` (defaults filled in by clap), with every key of the
    /// config `file` applied where `matches` says the flag was not given on the command line.
    /// Unknown keys in the file are errors naming file:line:col (a typo must not be ignored).
    ///
    /// The merge goes through JSON, which has no NaN or infinity (serde_json writes them as
    /// null): flags cannot hold them (every float option's value parser is [`finite_f64`] or
    /// [`finite_f32`]), a file's values go through the same parsers ([`ConfigFile::read`]), and
    /// `flags` must survive the trip unchanged.
    pub fn merge(file: Option<&Path>, flags: TrainConfig, matches: Option<&ArgMatches>) -> anyhow::Result<Merged> {
        let mut merged = serde_json::to_value(&flags)?;
        anyhow::ensure!(
            serde_json::from_value::<TrainConfig>(merged.clone()).is_ok_and(|back| back == flags),
            "an option holds a value JSON cannot carry (NaN or infinity): its value parser must be config::finite_f64 or finite_f32"
        );
        let obj = merged.as_object_mut().expect("a struct serialises to an object");
        let on_command_line = |key: &str| {
            matches.is_some_and(|m| m.try_contains_id(key).unwrap_or(false) && m.value_source(key) == Some(ValueSource::CommandLine))
        };
        let mut file_keys = Vec::new();
        // Options given explicitly, and where: only they are checked against the mode. A file's
        // key at its built-in default is not among them: a file is shared by runs (one written by
        // --save-config of an asap run holds asap's options at their defaults, and drives an ssp
        // run too), while a flag is typed for this run, and is checked whatever its value. A
        // file's key that does not apply and differs from its default is still refused.
        let mut given_at: Vec<(String, String)> =
            obj.keys().filter(|k| on_command_line(k)).map(|k| (k.clone(), "given on the command line".to_owned())).collect();
        let default = TrainConfig::default();
        if let Some(path) = file {
            for (key, value, place) in ConfigFile::read(path)? {
                if !on_command_line(&key) {
                    if !default.with_value(&key, &value).is_ok_and(|c| c == default) {
                        given_at.push((key.clone(), format!("given at {place}")));
                    }
                    obj.insert(key.clone(), value);
                }
                file_keys.push(key);
            }
        }
        // The built-in test set belongs to the built-in training set only.
        let test_data_given = on_command_line("test_data") || file_keys.iter().any(|k| k == "test_data");
        if obj["data"] != serde_json::json!(default.data) && !test_data_given {
            obj.insert("test_data".into(), serde_json::Value::Null);
        }
        let mut cfg: TrainConfig = serde_json::from_value(merged)?;
        cfg.config_file = file.map(|p| p.to_string_lossy().into_owned());
        // Given by its presence, whatever its value: a configuration written by --save-config
        // holds the step chosen by the search, which must be used as given, not searched again.
        let given_by_a_source = |key: &str| on_command_line(key) || file_keys.iter().any(|k| k == key);
        let given = Given { lr: given_by_a_source("lr"), lr_decay: given_by_a_source("lr_decay") };
        // --lr-decay is the decay schedule's one parameter: given without --lr-schedule, it
        // selects that schedule. The default was decay until issue 43 made it cosine, and every
        // command, config and script written for it (the report's runs among them) keeps its
        // meaning instead of losing its decay without a word.
        if given.lr_decay && !given_by_a_source("lr_schedule") {
            cfg.lr_schedule = LrSchedule::Decay;
        }
        cfg.check_applicable(&given_at)?;
        if let Some(path) = cfg.cluster.clone() {
            crate::cluster::apply(&path, cfg.emulation())?;
        }
        cfg.validate()?;
        Ok(Merged { options: cfg, given })
    }

    /// The emulation options a `--cluster` profile fills where they are unset.
    pub fn emulation(&mut self) -> crate::cluster::Emulation<'_> {
        crate::cluster::Emulation {
            model: self.model,
            hidden: &self.hidden,
            batch_size: self.batch_size,
            dilation: self.dilation,
            compute_ms: &mut self.emulate_compute,
            bandwidth: &mut self.emulate_bandwidth,
            latency: &mut self.emulate_latency,
            straggler: &mut self.straggler,
            jitter: &mut self.emulate_jitter,
            fabric: &mut self.emulate_fabric,
            groups: &mut self.emulate_groups,
            lan_bandwidth: &mut self.emulate_lan_bandwidth,
            lan_latency: &mut self.emulate_lan_latency,
        }
    }

    /// This configuration with option `key` set to `value` (a config file's entry).
    fn with_value(&self, key: &str, value: &serde_json::Value) -> anyhow::Result<TrainConfig> {
        let mut json = serde_json::to_value(self)?;
        json[key] = value.clone();
        Ok(serde_json::from_value(json)?)
    }

    /// The option groups this run uses: those of every condition of [`groups_used`] that its
    /// options (`json`, this configuration as JSON) meet.
    fn groups_in_use(json: &serde_json::Value) -> Vec<&'static str> {
        let holds = |(k, v): &(&str, &str)| json[*k] == *v;
        groups_used().into_iter().filter(|(c, _)| c.iter().all(holds)).flat_map(|(_, g)| g.iter().copied()).collect()
    }

    /// The option groups option `key` belongs to in `cmd` (the built `train` options): none for
    /// an option of every run.
    fn groups_of<'c>(cmd: &'c clap::Command, key: &str) -> Vec<&'c str> {
        cmd.get_groups().filter(|g| g.get_args().any(|a| a == key)).map(|g| g.get_id().as_str()).collect()
    }

    /// This configuration as the text of a `--config` file at `path` (TOML if it ends .toml,
    /// JSON otherwise, as [`ConfigFile::read`] reads it) that gives the same run: every option
    /// that applies to this run (an option of every run, or of a group it uses, [`groups_used`]),
    /// in the order of `--help`, and no option of another mode or model. Fed back with
    /// `--config`, the file is accepted (nothing in it is refused as another run's), and it also
    /// drives runs of other modes: its options of the groups both use are at their defaults where
    /// this run left them so, and a file's key at its default is not checked against the mode
    /// ([`TrainConfig::merge`]). `save_config` itself is left out: the file would name itself as
    /// an output, which `--config` refuses (train/outputs.rs).
    ///
    /// Values are written as serde_json writes them (an f32 in its shortest form: `lambda =
    /// 0.00001`, not the f64 widening 9.99999974737875e-6), which reads back as the same value.
    /// TOML has no null: an unset option is left out, which reads back as unset, except where its
    /// default is set (the test set of the built-in data, unset only from a JSON file): that one
    /// is an error asking for JSON, as is an integer beyond TOML's (a --seed above 2^63).
    pub fn config_file_text(&self, path: &Path) -> anyhow::Result<String> {
        let mut cmd = TrainConfig::augment_args(clap::Command::new("asap-train"));
        cmd.build();
        let json: serde_json::Value = serde_json::from_str(&serde_json::to_string(self)?)?;
        let used = Self::groups_in_use(&json);
        let default = serde_json::to_value(TrainConfig::default())?;
        let toml = ConfigFile::is_toml(path);
        let (mut lines, mut heading) = (Vec::new(), None);
        for arg in cmd.get_arguments() {
            let key = arg.get_id().as_str();
            let groups = Self::groups_of(&cmd, key);
            let applies = groups.is_empty() || groups.iter().any(|g| used.contains(g));
            let Some(value) = json.get(key).filter(|_| applies && key != "save_config") else { continue };
            if !toml {
                lines.push(format!("  {}: {}", serde_json::to_string(key)?, serde_json::to_string(value)?));
                continue;
            }
            if value.is_null() {
                // Left out, it reads back as its default; the test set's is unset for data other
                // than the built-in (the merge's rule).
                let reads_back_unset = default[key].is_null() || (key == "test_data" && json["data"] != default["data"]);
                anyhow::ensure!(
                    reads_back_unset,
                    "{}: {key} is unset, which TOML cannot say (its default is set): write the configuration as JSON (a file name not ending .toml)",
                    path.display()
                );
                continue;
            }
            if arg.get_help_heading() != heading {
                heading = arg.get_help_heading();
                lines.push(format!("{}# {}", if lines.is_empty() { "" } else { "\n" }, heading.unwrap_or("Options")));
            }
            let value = ::toml::Value::try_from(value).map_err(|e| {
                anyhow::anyhow!("{}: {key} = {value} cannot be written in TOML ({e}): write the configuration as JSON", path.display())
            })?;
            lines.push(format!("{key} = {value}"));
        }
        Ok(if toml { format!("{}\n", lines.join("\n")) } else { format!("{{\n{}\n}}\n", lines.join(",\n")) })
    }

    /// Refuses an option given explicitly (`given`: its key and where it was given) that belongs
    /// only to option groups this run does not use ([`groups_used`]), naming the runs it
    /// applies to: a mistyped mode must not turn into a silently different experiment.
    pub fn check_applicable(&self, given: &[(String, String)]) -> anyhow::Result<()> {
        let mut cmd = TrainConfig::augment_args(clap::Command::new("asap-train"));
        cmd.build();
        let json = serde_json::to_value(self)?;
        let holds = |(k, v): &(&str, &str)| json[*k] == *v;
        let table = groups_used();
        let used = Self::groups_in_use(&json);
        for (key, place) in given {
            let groups = Self::groups_of(&cmd, key);
            if groups.is_empty() || groups.iter().any(|g| used.contains(g)) {
                continue;
            }
            let flag = |k: &str| format!("--{}", k.replace('_', "-"));
            let applies: Vec<&[(&str, &str)]> =
                table.iter().filter(|(_, g)| g.iter().any(|g| groups.contains(g))).map(|(c, _)| &c[..]).collect();
            let describe = |c: &[(&str, &str)]| c.iter().map(|(k, v)| format!("{} {v}", flag(k))).collect::<Vec<_>>().join(" ");
            // This run's values of the keys that decide it: each condition up to where it fails.
            let mut keys: Vec<&str> = Vec::new();
            for c in &applies {
                for pair in c.iter() {
                    if !keys.contains(&pair.0) {
                        keys.push(pair.0);
                    }
                    if !holds(pair) {
                        break;
                    }
                }
            }
            let this: Vec<String> = keys.iter().map(|k| format!("{} {}", flag(k), json[*k].as_str().unwrap_or_default())).collect();
            anyhow::bail!(
                "{} applies to {}, not to this run ({}): remove it ({place}) or choose a run it applies to",
                flag(key),
                applies.iter().map(|c| describe(c)).collect::<Vec<_>>().join(" and to "),
                this.join(" ")
            );
        }
        Ok(())
    }

    /// What the chosen mode's declaration reads of this configuration.
    pub fn mode_run(&self) -> crate::sync::RunSpec<'_> {
        crate::sync::RunSpec {
            opts: &self.modes,
            model: self.model,
            lr: self.lr,
            adarevision: self.lr_schedule == LrSchedule::Adarevision,
            checkpoints: self.checkpoint_dir.is_some(),
            emulated_link: self.emulate_bandwidth.is_some(),
        }
    }

    /// The rules of the chosen mode (its declaration's), and the general rules that depend on what
    /// a mode declares.
    fn check_mode(&self) -> anyhow::Result<()> {
        let spec = self.sync.spec();
        anyhow::ensure!(
            self.lr_schedule != LrSchedule::Adarevision || spec.server_steps,
            "--lr-schedule adarevision needs --sync {} (its shard servers compute the steps)",
            SyncKind::names_where(|m| m.server_steps)
        );
        anyhow::ensure!(
            self.send_log.is_none() || self.emulate_bandwidth.is_some() || (spec.paces_sends)(&self.modes),
            "--send-log records paced sends: it needs --emulate-bandwidth, --bandwidth-mbps or --sync {}",
            SyncKind::names_where(|m| (m.paces_sends)(&crate::sync::ModeOptions::default()))
        );
        anyhow::ensure!(
            self.model != ModelKind::Lda || self.modes.outer.outer_optimizer == crate::sync::groups::OuterKind::None,
            "--outer-optimizer steps on averaged models; --model lda sums count deltas exactly: run it without --outer-optimizer"
        );
        anyhow::ensure!(
            self.model != ModelKind::Lda || self.modes.compress.compression().is_none(),
            "--compress rounds what is averaged; --model lda sums count deltas exactly: run it without --compress"
        );
        (spec.validate)(&self.mode_run())
    }

    /// Reads a TOML (`.toml`) or JSON (anything else) config file over the defaults.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        Self::merge(Some(path), TrainConfig::default(), None).map(|m| m.options)
    }

    /// Options that would be accepted and then do nothing (issue 27, "nothing silent").
    fn check_inert_options(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.checkpoint_every == 0 || self.checkpoint_dir.is_some(),
            "--checkpoint-every {} writes checkpoints into --checkpoint-dir DIR, which is not given",
            self.checkpoint_every
        );
        anyhow::ensure!(self.max_rounds != Some(0), "--max-rounds 0 would stop before the first round: give at least 1 (or leave it out)");
        Ok(())
    }

    /// Checks settings that do not need the data; messages name the option to fix.
    /// `--on-rank-loss continue`: a ULFM build, a mode that can live without a rank, and a model
    /// trained by steps (not `--model lda`).
    fn check_on_rank_loss(&self) -> anyhow::Result<()> {
        if self.on_rank_loss != OnRankLoss::Continue {
            return Ok(());
        }
        anyhow::ensure!(crate::comm::ulfm::AVAILABLE, "{}", crate::comm::ulfm::MISSING);
        let mode = self.sync.spec();
        anyhow::ensure!(
            mode.survives_rank_loss,
            "--on-rank-loss continue: --sync {} cannot go on without one of its ranks (it holds state the others need); --sync {} can",
            mode.name,
            crate::sync::SyncKind::names_where(|m| m.survives_rank_loss)
        );
        anyhow::ensure!(self.model != crate::model::ModelKind::Lda, "--on-rank-loss continue: --model lda cannot go on without a rank");
        Ok(())
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.check_inert_options()?;
        self.check_on_rank_loss()?;
        anyhow::ensure!(self.batch_size >= 1, "--batch-size must be at least 1");
        anyhow::ensure!(self.sync_every >= 1, "--sync-every must be at least 1");
        anyhow::ensure!(self.epochs >= 1, "--epochs must be at least 1");
        anyhow::ensure!(self.lr > 0.0, "--lr must be a positive number, got {}", self.lr);
        anyhow::ensure!(self.lambda >= 0.0, "--lambda must be >= 0, got {}", self.lambda);
        anyhow::ensure!((0.0..1.0).contains(&self.test_fraction), "--test-fraction must be in [0, 1), got {}", self.test_fraction);
        anyhow::ensure!(
            self.wait_timeout > 0.0 && self.wait_timeout <= 1e9,
            "--wait-timeout must be a positive number of seconds (at most 1e9), got {}",
            self.wait_timeout
        );
        anyhow::ensure!(self.lr_decay > 0.0, "--lr-decay must be a positive number, got {}", self.lr_decay);
        anyhow::ensure!(
            !(self.resume || self.auto_resume) || self.checkpoint_dir.is_some(),
            "--resume and --auto-resume need --checkpoint-dir DIR (the directory holding the checkpoints)"
        );
        anyhow::ensure!(self.stop_check_every >= 1, "--stop-check-every must be at least 1");
        if self.model == ModelKind::Lda {
            self.lda.validate()?;
        }
        self.partition.parse::<crate::data::partition::Partition>().map_err(anyhow::Error::msg)?;
        if let Some(l) = &self.emulate_bandwidth {
            let max = l.overrides.iter().map(|o| o.2).fold(l.default, f64::max);
            let min = l.overrides.iter().map(|o| o.2).fold(l.default, f64::min);
            anyhow::ensure!(
                min > 0.0 && max <= 1e7,
                "--emulate-bandwidth {l}: every rate must be a positive number of Mbit/s, at most 1e7"
            );
        }
        let max_latency = self.emulate_latency.overrides.iter().map(|o| o.2).fold(self.emulate_latency.default, f64::max);
        anyhow::ensure!(max_latency <= 1e6, "--emulate-latency {}: at most 1e6 ms", self.emulate_latency);
        anyhow::ensure!(
            max_latency == 0.0 || self.emulate_bandwidth.is_some(),
            "--emulate-latency needs --emulate-bandwidth (the emulated link it belongs to)"
        );
        anyhow::ensure!(
            self.emulate_fabric == crate::comm::pace::Fabric::Ideal || self.emulate_bandwidth.is_some(),
            "--emulate-fabric tcp needs --emulate-bandwidth (the emulated links it carries): give --emulate-bandwidth MBPS, or leave --emulate-fabric at ideal"
        );
        self.validate_groups()?;
        if let Some(ms) = self.emulate_compute {
            anyhow::ensure!(
                ms.is_finite() && ms > 0.0 && ms <= 1e6,
                "--emulate-compute must be a positive number of milliseconds, at most 1e6, got {ms:e}"
            );
        }
        anyhow::ensure!(
            self.emulate_jitter.is_none() || self.emulate_compute.is_some(),
            "--emulate-jitter varies the declared step time: give --emulate-compute MS (or a --cluster profile)"
        );
        anyhow::ensure!(!self.stop_at_target || self.target.is_some(), "--stop-at-target needs --target VALUE");
        anyhow::ensure!(self.dilation.is_none() || self.cluster.is_some(), "--dilation scales a --cluster profile: give --cluster FILE");
        anyhow::ensure!(
            !self.balance || self.straggler.is_some(),
            "--balance sizes each rank's mini-batches by its --straggler factor: give --straggler (or drop --balance)"
        );
        anyhow::ensure!(
            self.model != ModelKind::Mlp || ((1..=2).contains(&self.hidden.len()) && self.hidden.iter().all(|&h| h > 0)),
            "--hidden takes one or two positive layer widths for --model mlp, got {:?}",
            self.hidden
        );
        self.check_optimizer()?;
        self.check_mode()
    }

    /// The inner optimizer, the warm-up and early stopping: values and combinations.
    fn check_optimizer(&self) -> anyhow::Result<()> {
        let name = format!("{:?}", self.inner_optimizer).to_lowercase();
        if self.inner_optimizer != InnerOptimizer::Sgd {
            anyhow::ensure!(
                self.model != ModelKind::Lda,
                "--inner-optimizer {name}: --model lda is trained by Gibbs sampling, not by gradient steps: remove --inner-optimizer"
            );
            anyhow::ensure!(
                self.model != ModelKind::Mf,
                "--inner-optimizer {name} steps on the dense gradient of every parameter, while --model mf's SGD step touches only \
                 the rated users' and items' rows (a dense step would cost the whole model per mini-batch): use --inner-optimizer sgd"
            );
            anyhow::ensure!(
                self.modes.async_mode.optimizer == crate::sync::async_mode::OptimizerKind::Sgd,
                "--inner-optimizer {name} and --optimizer saga are two optimizers of the same steps: choose one (drop \
                 --inner-optimizer, or --optimizer saga)"
            );
            anyhow::ensure!(
                self.lr_schedule != LrSchedule::Adarevision,
                "--lr-schedule adarevision: bosen's servers turn the pushed steps back into gradients (dividing by --lr), which \
                 only plain steps are: use --inner-optimizer sgd, or another --lr-schedule"
            );
        }
        anyhow::ensure!((0.0..1.0).contains(&self.momentum), "--momentum must be in [0, 1), got {}", self.momentum);
        let a = &self.adam;
        anyhow::ensure!((0.0..1.0).contains(&a.beta1), "--beta1 must be in [0, 1), got {}", a.beta1);
        anyhow::ensure!((0.0..1.0).contains(&a.beta2), "--beta2 must be in [0, 1), got {}", a.beta2);
        anyhow::ensure!(a.adam_eps > 0.0, "--adam-eps must be positive, got {}", a.adam_eps);
        anyhow::ensure!(a.weight_decay >= 0.0, "--weight-decay must be >= 0, got {}", a.weight_decay);
        anyhow::ensure!(
            self.warmup_epochs >= 0.0 && self.warmup_epochs < self.epochs as f64,
            "--warmup-epochs must be in [0, --epochs) (here [0, {})), got {}: the warm-up must end before the run does",
            self.epochs,
            self.warmup_epochs
        );
        anyhow::ensure!(
            self.warmup_epochs == 0.0 || self.lr_schedule != LrSchedule::Adarevision,
            "--warmup-epochs scales the rank's own steps; under --lr-schedule adarevision bosen's servers choose them: drop --warmup-epochs"
        );
        anyhow::ensure!(self.patience != Some(0), "--patience 0 would stop at the first evaluation: give at least 1 (or leave it out)");
        anyhow::ensure!(
            self.patience.is_none() || self.model != ModelKind::Lda,
            "--patience stops on the held-out metric of SGD runs; --model lda reports perplexity once at the end: drop --patience"
        );
        Ok(())
    }
}

impl TrainConfig {
    /// `--emulate-groups` G (Some(0): off) and its LAN: they split --emulate-bandwidth's links,
    /// which must then be one WAN link for every rank. Whether G divides the ranks is checked
    /// where the rank count is known (`train::plan::emulated_links`).
    fn validate_groups(&self) -> anyhow::Result<()> {
        let on = self.emulate_groups.filter(|&g| g > 0);
        anyhow::ensure!(
            on.is_some() || (self.emulate_lan_bandwidth.is_none() && self.emulate_lan_latency.is_none()),
            "--emulate-lan-bandwidth and --emulate-lan-latency are the LAN within --emulate-groups' groups: give --emulate-groups G, or drop them"
        );
        let Some(g) = on else { return Ok(()) };
        let Some(b) = &self.emulate_bandwidth else {
            anyhow::bail!(
                "--emulate-groups {g} splits the emulated links into a LAN within each group and a WAN between them: give                  --emulate-bandwidth MBPS (the WAN link) or a --cluster profile, or drop --emulate-groups"
            )
        };
        anyhow::ensure!(
            b.is_uniform() && self.emulate_latency.is_uniform(),
            "--emulate-groups {g}: the WAN link between groups has one rate and latency, but --emulate-bandwidth {b} /              --emulate-latency {} differ per rank: give each one value, or --emulate-groups off for per-rank links",
            self.emulate_latency
        );
        Ok(())
    }
}

/// `--emulate-groups`: a number of groups >= 2, or `off` (stored as 0: a profile's `groups` no
/// longer fills it).
fn emulate_groups(s: &str) -> Result<usize, String> {
    let s = s.trim();
    if s == "off" {
        return Ok(0);
    }
    match s.parse::<usize>() {
        Ok(g) if g >= 2 => Ok(g),
        Ok(g) => Err(format!("{g} group(s) have no link between them: give 2 or more groups (data centres), or off")),
        Err(_) => Err(format!("expected a number of groups (2 or more) or off, got {s:?}")),
    }
}

/// `--emulate-lan-bandwidth`: Mbit/s, positive and at most 1e7.
fn lan_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= 1e7 => Ok(x),
        _ => Err(format!("expected a positive, finite number of Mbit/s, at most 1e7, got {s:?}")),
    }
}

/// `--emulate-lan-latency`: milliseconds, >= 0 and at most 1e6.
fn lan_latency(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && (0.0..=1e6).contains(&x) => Ok(x),
        _ => Err(format!("expected a finite number of milliseconds from 0 to 1e6, got {s:?}")),
    }
}

/// `--emulate-compute`: a positive, finite number of milliseconds.
fn positive_ms(s: &str) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|_| format!("expected milliseconds, got {s:?}"))?;
    if !(x.is_finite() && x > 0.0) {
        return Err(format!("must be a positive, finite number of milliseconds, got {s}"));
    }
    Ok(x)
}

/// `--dilation`: a finite number >= 1.
fn dilation_factor(s: &str) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|_| format!("expected a number, got {s:?}"))?;
    if !(x.is_finite() && (1.0..=1e4).contains(&x)) {
        return Err(format!("must be a finite number in 1..10000, got {s}"));
    }
    Ok(x)
}

/// `--emulate-bandwidth`: Mbit/s > 0 per rank.
fn link_rate(s: &str) -> Result<LinkSpec, String> {
    LinkSpec::parse(s, "Mbit/s", 0.0, true)
}

/// `--emulate-latency`: milliseconds >= 0 per rank.
fn link_latency(s: &str) -> Result<LinkSpec, String> {
    LinkSpec::parse(s, "milliseconds", 0.0, false)
}

/// A `--config` file's entries, each checked as its flag would be.
struct ConfigFile;

impl ConfigFile {
    /// The (key, value, file:line:col) entries of a TOML (`.toml`) or JSON file. Every value is run through the
    /// value parser of its option's flag (finiteness, enums, predicates: one check for flags and
    /// files) and then through serde on its own, so a wrong value names its key and place.
    fn read(path: &Path) -> anyhow::Result<Vec<(String, serde_json::Value, String)>> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        // A byte-order mark (Windows editors write one) is not part of the text (issue 43: it
        // read "expected value at line 1 column 1").
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text).to_owned();
        let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        anyhow::ensure!(
            !["yaml", "yml"].contains(&extension),
            "{}: YAML is not read: write the config as TOML (a .toml file, `key = value` lines, keys spelled with _) or JSON (any other name); configs/ holds examples",
            path.display()
        );
        let entries = if Self::is_toml(path) { Self::toml_entries(path, &text)? } else { Self::json_entries(path, &text)? };
        let cmd = TrainConfig::augment_args(clap::Command::new("asap-train"));
        let mut out = Vec::new();
        for (key, value) in entries {
            // The old name of --factors is still accepted.
            let key = if key == "rank" { "factors".to_owned() } else { key };
            let at = |msg: String| {
                let (line, col) = locate_key(&text, &key);
                anyhow::anyhow!("{}:{line}:{col}: {msg}", path.display())
            };
            if let Some((_, hint)) = RETIRED_OPTIONS.iter().find(|(old, _)| *old == key) {
                return Err(at(format!("option {key}: {hint}")));
            }
            let Some(arg) = cmd.get_arguments().find(|a| a.get_id() == key.as_str()) else {
                return Err(at(format!("unknown option {key:?} (see asap-train train --help; keys are the long options with _)")));
            };
            let value = value.map_err(|e| at(format!("option {key}: {e}")))?;
            Self::parse_like_flag(arg, &value).map_err(|e| at(format!("option {key}: {e}")))?;
            let mut probe = serde_json::to_value(TrainConfig::default())?;
            probe[&key] = value.clone();
            if let Err(e) = serde_json::from_value::<TrainConfig>(probe) {
                return Err(at(format!("option {key}: {e}")));
            }
            let (line, col) = locate_key(&text, &key);
            out.push((key, value, format!("{}:{line}:{col}", path.display())));
        }
        Ok(out)
    }

    /// Whether a config file at `path` is TOML (its name ends .toml) rather than JSON.
    fn is_toml(path: &Path) -> bool {
        path.extension().is_some_and(|e| e == "toml")
    }

    /// A TOML file's entries; a value JSON cannot carry (NaN, infinity, a date) is an error of
    /// its entry, never a null.
    fn toml_entries(path: &Path, text: &str) -> anyhow::Result<Vec<(String, Result<serde_json::Value, String>)>> {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            // file:line:col like every other input error (toml's own text says "at line L,
            // column C" in the middle of a multi-line message).
            let (line, col) = e.span().map_or((1, 1), |s| line_col(text, s.start));
            anyhow::anyhow!("{}:{line}:{col}: {}", path.display(), e.message().trim_end())
        })?;
        Ok(table.into_iter().map(|(k, v)| (k, toml_to_json(v))).collect())
    }

    fn json_entries(path: &Path, text: &str) -> anyhow::Result<Vec<(String, Result<serde_json::Value, String>)>> {
        let parsed: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            // serde_json names a newline that ends a line too early (an unterminated string)
            // as column 0 of the next line: name the end of the line it ended instead.
            let (mut line, mut col) = (e.line(), e.column());
            if col == 0 && line > 1 {
                line -= 1;
                col = text.lines().nth(line - 1).map_or(0, |l| l.chars().count()) + 1;
            }
            // Not JSON at all (TOML or YAML under another name): say how the file's kind is told.
            let hint = if text.trim_start().starts_with(['{', '[']) {
                ""
            } else {
                " (a config file is JSON unless its name ends in .toml: this one does not start with '{'; for TOML, rename it to *.toml)"
            };
            anyhow::anyhow!("{}:{line}:{col}: {e}{hint}", path.display())
        })?;
        let serde_json::Value::Object(entries) = parsed else {
            anyhow::bail!("{}: a config file holds option = value pairs (a table or object)", path.display());
        };
        Ok(entries.into_iter().map(|(k, v)| (k, Ok(v))).collect())
    }

    /// Runs a file's value through `arg`'s value parser, as `--flag=value` (each element of an
    /// array as one occurrence). Switches (`--overlap`) take no value: serde checks their bool.
    fn parse_like_flag(arg: &clap::Arg, value: &serde_json::Value) -> Result<(), String> {
        fn texts(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::String(s) => out.push(s.clone()),
                serde_json::Value::Number(_) | serde_json::Value::Bool(_) => out.push(v.to_string()),
                serde_json::Value::Array(a) => a.iter().for_each(|x| texts(x, out)),
                serde_json::Value::Null | serde_json::Value::Object(_) => {}
            }
        }
        if !arg.get_action().takes_values() {
            return Ok(());
        }
        let long = arg.get_long().unwrap_or(arg.get_id().as_str());
        let mut args = Vec::new();
        texts(value, &mut args);
        let args = args.into_iter().map(|t| format!("--{long}={t}"));
        let probe = clap::Command::new("config").no_binary_name(true).arg(arg.clone());
        probe.try_get_matches_from(args).map(|_| ()).map_err(|e| {
            let rendered = e.render().to_string();
            rendered.lines().next().unwrap_or("").trim_start_matches("error: ").to_owned()
        })
    }
}

/// A TOML value as JSON, refusing what JSON cannot hold instead of turning it into null.
fn toml_to_json(v: toml::Value) -> Result<serde_json::Value, String> {
    Ok(match v {
        toml::Value::Float(x) if !x.is_finite() => return Err(format!("must be a finite number, got {x}")),
        toml::Value::Datetime(d) => return Err(format!("a date ({d}) is no value of any option")),
        toml::Value::Array(a) => serde_json::Value::Array(a.into_iter().map(toml_to_json).collect::<Result<_, _>>()?),
        toml::Value::Table(t) => {
            serde_json::Value::Object(t.into_iter().map(|(k, v)| Ok((k, toml_to_json(v)?))).collect::<Result<_, String>>()?)
        }
        other => serde_json::to_value(other).map_err(|e| e.to_string())?,
    })
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..text.floor_char_boundary(offset.min(text.len()))];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (before.matches('\n').count() + 1, before[line_start..].chars().count() + 1)
}

/// 1-based line and column of `key` in a TOML or JSON text (1:1 when it cannot be found).
fn locate_key(text: &str, key: &str) -> (usize, usize) {
    let quoted = format!("\"{key}\"");
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let bare = t.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('='));
        if let Some(col) = line.find(&quoted).filter(|_| !bare).or(bare.then(|| line.len() - t.len())) {
            return (i + 1, col + 1);
        }
    }
    (1, 1)
}

/// Largest `--straggler` slow-down of any form. A step of 1 ms slowed 1000x takes a second;
/// beyond that a run is not slow but stopped (`--wait-timeout` is the tool for that), and a
/// factor of 1e308 overflowed the sleep's duration into a panic (issue 27).
pub const MAX_STRAGGLER_FACTOR: f64 = 1000.0;

/// `--straggler RANKS:FACTOR`, e.g. `0,3:2` or `0-5:2.5`: the named ranks' compute is slowed by
/// FACTOR (each local step is followed by a sleep of (FACTOR-1) times its duration).
pub fn parse_straggler(s: &str, nranks: usize) -> anyhow::Result<(Vec<usize>, f64)> {
    let hint = "expected --straggler RANKS:FACTOR, e.g. 0,3:2 or 0-5:2.5";
    let (ranks, text) = s.rsplit_once(':').ok_or_else(|| anyhow::anyhow!("{hint}, got {s:?}"))?;
    let factor: f64 = text.parse().map_err(|_| anyhow::anyhow!("{hint}: bad factor {text:?}"))?;
    anyhow::ensure!(
        factor.is_finite() && (1.0..=MAX_STRAGGLER_FACTOR).contains(&factor),
        "{hint}: FACTOR must be in 1..{MAX_STRAGGLER_FACTOR}, got {text}"
    );
    anyhow::ensure!(
        ranks.split(',').any(|p| !p.trim().is_empty()),
        "--straggler {s} names no rank to slow down: give RANKS before the colon (e.g. 1:{text} or 1-3:{text}), or leave --straggler out"
    );
    let mut out = Vec::new();
    for part in ranks.split(',').filter(|p| !p.is_empty()) {
        let parse = |x: &str| -> anyhow::Result<usize> { x.trim().parse().map_err(|_| anyhow::anyhow!("{hint}: bad rank {x:?}")) };
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
        for bad in [":2", ",:2", " :2", "1:1e308", "1:1001"] {
            assert!(parse_straggler(bad, 8).is_err(), "{bad}");
        }
        assert_eq!(parse_straggler("1:1000", 8).unwrap(), (vec![1], 1000.0));
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

    /// A byte-order mark before a TOML or JSON config is skipped, and an error's place counts
    /// from the text after it (issue 43: it read "expected value at line 1 column 1").
    #[test]
    fn a_byte_order_mark_is_not_part_of_a_config() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [("b.toml", "epochs = 3\n"), ("b.json", "{\"epochs\": 3}")] {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("\u{feff}{text}")).unwrap();
            assert_eq!(TrainConfig::from_file(&p).unwrap().epochs, 3, "{name}");
        }
        let p = dir.path().join("typo.toml");
        std::fs::write(&p, "\u{feff}epochz = 3\n").unwrap();
        let e = TrainConfig::from_file(&p).unwrap_err().to_string();
        assert!(e.contains("typo.toml:1:1") && e.contains("epochz"), "{e}");
    }

    /// A retired option, as a flag (bare or with a value) or a config-file key, is refused with
    /// what replaces it; an unknown one is not given a replacement; every retired option is
    /// undeclared (a declared one would be parsed, never refused).
    #[test]
    fn retired_options_are_refused_with_their_replacement() {
        let cmd = TrainConfig::augment_args(clap::Command::new("x"));
        for flag in ["--fp16", "--fp16=true"] {
            let e = cmd.clone().try_get_matches_from(["x", "--sync", "bosen", flag]).unwrap_err();
            assert!(retired_option_hint(&e).is_some_and(|h| h.contains("--compress fp16")), "{flag}: {e}");
        }
        let e = cmd.clone().try_get_matches_from(["x", "--fp17"]).unwrap_err();
        assert_eq!(retired_option_hint(&e), None, "{e}");
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("c.toml");
        std::fs::write(&t, "sync = \"bosen\"\nfp16 = true\n").unwrap();
        let e = TrainConfig::from_file(&t).unwrap_err().to_string();
        assert!(e.contains("c.toml:2:1") && e.contains("compress = \"fp16\""), "{e}");
        for (old, _) in RETIRED_OPTIONS {
            assert!(cmd.get_arguments().all(|a| a.get_id() != *old), "{old} is retired and declared");
        }
    }

    /// Flags given on the command line beat the file; defaults do not; mode groups and the old
    /// name of --factors work in files; a wrong type names its key and line.
    #[test]
    fn flags_beat_the_file_and_defaults_do_not() {
        use clap::{CommandFactory, FromArgMatches, Parser};
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            c: TrainConfig,
        }
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("c.toml");
        std::fs::write(&t, "epochs = 3\nbatch_size = 64\nmodel = \"mf\"\nrank = 7\nstaleness = 5\ngraph = \"ring\"\n").unwrap();
        let m = Cmd::command().get_matches_from(["x", "--epochs", "10", "--graph", "exponential"]);
        let flags = Cmd::from_arg_matches(&m).unwrap().c;
        let c = TrainConfig::merge(Some(&t), flags, Some(&m)).unwrap().options;
        assert_eq!(c.epochs, 10, "a flag equal to the default still beats the file");
        assert_eq!((c.batch_size, c.factors, c.modes.staleness.staleness), (64, 7, Some(5)));
        assert_eq!(c.modes.graph.graph, "exponential");
        std::fs::write(&t, "epochs = 3\nlr = \"fast\"\n").unwrap();
        let e = TrainConfig::from_file(&t).unwrap_err().to_string();
        assert!(e.contains("c.toml:2:1") && e.contains("lr"), "{e}");
        // Defaults come from the flags' declarations.
        assert_eq!(TrainConfig::default().modes.graph.graph, "auto");
        assert_eq!(TrainConfig::default().batch_size, 32);
    }

    /// Every float option, found from the declarations by the type its value parser makes (so a
    /// new one is covered without a list), refuses NaN and infinities from a flag and from a TOML
    /// or JSON config file, naming the option; a finite value passes.
    #[test]
    fn every_float_option_refuses_non_finite_values_from_flags_and_files() {
        use std::any::TypeId;
        let cmd = TrainConfig::augment_args(clap::Command::new("x"));
        let floats: Vec<&clap::Arg> = cmd
            .get_arguments()
            .filter(|a| [TypeId::of::<f64>(), TypeId::of::<f32>()].iter().any(|t| a.get_value_parser().type_id() == *t))
            .collect();
        let names: Vec<&str> = floats.iter().map(|a| a.get_id().as_str()).collect();
        for known in ["lr", "emulate_compute", "bandwidth_mbps", "significance", "soft_significance", "label_threshold"] {
            assert!(names.contains(&known), "{known} not found among the float options {names:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        for arg in floats {
            let (id, long) = (arg.get_id().as_str(), format!("--{}", arg.get_long().unwrap()));
            // A valid value: 1, or 0.5 for an option below 1 (--outer-momentum).
            let valid = ["1", "0.5"].iter().any(|v| cmd.clone().try_get_matches_from(["x", &format!("{long}={v}")]).is_ok());
            assert!(valid, "{long} 1 or 0.5");
            for bad in ["nan", "NaN", "inf", "-inf", "infinity"] {
                // `=`: clap reads a lone "-inf" as short flags (an error too, but naming no option).
                let e = cmd.clone().try_get_matches_from(["x", &format!("{long}={bad}")]).unwrap_err().to_string();
                assert!(e.contains(&long) && e.contains("finite"), "flag {long} {bad}: {e}");
                let j = dir.path().join("c.json");
                std::fs::write(&j, format!("{{\"epochs\": 2,\n \"{id}\": \"{bad}\"}}")).unwrap();
                let e = TrainConfig::from_file(&j).unwrap_err().to_string();
                assert!(e.contains("c.json:2:2") && e.contains(&format!("option {id}")) && e.contains("finite"), "{e}");
            }
            for bad in ["nan", "+inf", "-inf", "-nan"] {
                let t = dir.path().join("c.toml");
                std::fs::write(&t, format!("epochs = 2\n{id} = {bad}\n")).unwrap();
                let e = TrainConfig::from_file(&t).unwrap_err().to_string();
                assert!(e.contains("c.toml:2:1") && e.contains(&format!("option {id}")) && e.contains("finite"), "{e}");
            }
        }
    }

    /// A non-finite value that reached the merge by another way than a flag (a float option
    /// declared without a finite parser) is an error, never a null in the merged options.
    #[test]
    fn the_merge_refuses_values_json_cannot_carry() {
        let mut flags = TrainConfig::default();
        flags.modes.budget.bandwidth_mbps = Some(f64::NAN);
        assert!(TrainConfig::merge(None, flags, None).unwrap_err().to_string().contains("NaN"));
        let mut flags = TrainConfig::default();
        flags.modes.gaia.soft_significance = f64::INFINITY;
        assert!(TrainConfig::merge(None, flags, None).is_err());
    }

    /// Every mode (and model) against every option group: an option of the group given
    /// explicitly, as a flag (at any value) and in a config file (at a value other than its
    /// default), is refused naming the runs it applies to exactly where the run does not use the
    /// group; a config file's key at its default is accepted for every run. The expectations of the built-in groups are
    /// written out here, not taken from the declarations; a group of a mode added later is checked
    /// against its declaration (every group of the command must be in one or the other), and every
    /// mode of the registry is run against every group.
    /// The values of a selecting option (`--sync`, `--model`, `--inner-optimizer`).
    fn selector_values(selector: &str) -> Vec<String> {
        use clap::ValueEnum;
        fn names<T: ValueEnum>() -> Vec<String> {
            T::value_variants().iter().filter_map(|v| v.to_possible_value()).map(|v| v.get_name().to_owned()).collect()
        }
        match selector {
            "sync" => names::<SyncKind>(),
            "inner_optimizer" => names::<InnerOptimizer>(),
            _ => names::<ModelKind>(),
        }
    }

    /// Which option groups each selecting option's values use: (group, the selecting option, the
    /// values that use it).
    const GROUP_USERS: &[(&str, &str, &[&str])] = &[
        ("AsapOptions", "sync", &["asap"]),
        ("graph_group", "sync", &["asap"]), // and gaia with --gaia-inner asap, below
        ("AllreduceOptions", "sync", &["allreduce"]),
        ("staleness_group", "sync", &["asap", "ssp", "bosen"]),
        ("SspOptions", "sync", &["ssp", "bosen"]),
        ("budget_group", "sync", &["asap", "bosen"]),
        ("BosenOptions", "sync", &["bosen"]),
        ("AsyncOptions", "sync", &["async"]),
        ("GaiaOptions", "sync", &["gaia"]),
        ("mlp_group", "model", &["mlp"]),
        ("mf_group", "model", &["mf"]),
        ("classes_group", "model", &["mlr", "mlp"]),
        ("LdaOptions", "model", &["lda"]),
        ("momentum_group", "inner_optimizer", &["momentum"]),
        ("adamw_group", "inner_optimizer", &["adamw"]),
        ("inner_state_group", "inner_optimizer", &["momentum", "adamw"]),
        ("outer_group", "sync", &["allreduce", "asap", "gaia"]),
        ("compress_group", "sync", &["allreduce", "asap", "bosen"]),
        ("consensus_group", "sync", &["asap"]),
        // Only with --outer-optimizer sgd or nesterov (checked below): refused at its default.
        ("outer_step_group", "sync", &[]),
        ("outer_momentum_group", "sync", &[]),
        ("outer_form_group", "sync", &[]),
    ];

    #[test]
    fn options_of_groups_a_run_does_not_use_are_refused() {
        let table = GROUP_USERS;
        let mut cmd = TrainConfig::augment_args(clap::Command::new("x"));
        cmd.build();
        let mut expect: Vec<(&str, &str, Vec<&str>)> = table.iter().map(|&(g, s, u)| (g, s, u.to_vec())).collect();
        let declared = groups_used();
        for g in cmd.get_groups() {
            let id = g.get_id().as_str();
            if !table.iter().any(|e| e.0 == id) {
                let users: Vec<&str> =
                    declared.iter().filter(|(c, gs)| gs.contains(&id) && c.len() == 1 && c[0].0 == "sync").map(|(c, _)| c[0].1).collect();
                assert!(!users.is_empty(), "group {id} has no expectation here and no mode declares it");
                expect.push((id, "sync", users));
            }
            // clap keeps groups and options in one namespace of matches: a clash breaks parsing.
            assert!(cmd.get_arguments().all(|a| a.get_id() != g.get_id()), "group {} is also an option", g.get_id());
        }
        let dir = tempfile::tempdir().unwrap();
        let defaults = serde_json::to_value(TrainConfig::default()).unwrap();
        let mut checked = 0;
        for &(group, selector, _) in &expect {
            let g = cmd.get_groups().find(|g| g.get_id().as_str() == group).unwrap();
            let args: Vec<&clap::Arg> = g.get_args().map(|id| cmd.get_arguments().find(|a| a.get_id() == id).unwrap()).collect();
            assert!(!args.is_empty(), "{group}");
            for arg in args {
                // An option in several groups (asap's --graph is also in graph_group) applies where
                // any of them is used.
                let mine: Vec<&(&str, &str, Vec<&str>)> = expect
                    .iter()
                    .filter(|e| cmd.get_groups().any(|g| g.get_id().as_str() == e.0 && g.get_args().any(|a| a == arg.get_id())))
                    .collect();
                assert!(mine.iter().all(|e| e.1 == selector), "{}: groups of two selectors", arg.get_id());
                let users: Vec<&str> = mine.iter().flat_map(|e| e.2.iter().copied()).collect();
                let in_graph_group = mine.iter().any(|e| e.0 == "graph_group");
                let (flag, file) = (sample(arg), non_default(&cmd, arg));
                for choice in &selector_values(selector) {
                    for extra in [&[][..], &["--gaia-inner", "asap"]] {
                        if !extra.is_empty() && (choice != "gaia" || arg.get_id() == "gaia_inner") {
                            continue;
                        }
                        let applies = users.contains(&choice.as_str()) || (in_graph_group && !extra.is_empty());
                        let sel = format!("--{}={choice}", selector.replace('_', "-"));
                        let mut argv = vec!["x".to_owned(), sel.clone()];
                        argv.extend(extra.iter().map(|s| s.to_string()));
                        let from_flag = merged(&cmd, &[&argv[..], &flag[..]].concat(), None);
                        let (id, json, toml) = (arg.get_id().as_str(), dir.path().join("c.json"), dir.path().join("c.toml"));
                        std::fs::write(&json, format!("{{\"epochs\": 10, {id:?}: {}}}", defaults[id])).unwrap();
                        let r = merged(&cmd, &argv, Some(&json));
                        assert!(!r.as_ref().is_err_and(|e| e.contains("not to this run")), "{id} at its default, {sel} {extra:?}: {r:?}");
                        std::fs::write(&toml, format!("epochs = 10\n{file}\n")).unwrap();
                        let from_file = merged(&cmd, &argv, Some(&toml));
                        for (how, r) in [("flag", from_flag), ("file", from_file)] {
                            let refused = r.as_ref().err().filter(|e| e.contains("not to this run"));
                            let long = format!("--{}", arg.get_long().unwrap());
                            match (applies, refused) {
                                (true, Some(e)) => panic!("{how} {long} with {sel} {extra:?} refused: {e}"),
                                (false, None) => panic!("{how} {long} with {sel} {extra:?} accepted: {r:?}"),
                                (false, Some(e)) => {
                                    let selector = selector.replace('_', "-");
                                    assert!(e.starts_with(&format!("{long} applies to --{selector} ")), "{e}");
                                    assert!(users.iter().all(|u| e.contains(&format!("--{selector} {u}"))), "{e}");
                                    assert!(e.contains(&format!("--{selector} {choice}")), "{e}");
                                    assert!(e.contains(if how == "flag" { "command line" } else { "c.toml:2:1" }), "{e}");
                                }
                                (true, None) => {}
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 200, "{checked}");
        // The defaults of every group are no explicit choice: every mode and model runs without them.
        for m in &selector_values("sync") {
            let r = merged(&cmd, &["x".to_owned(), format!("--sync={m}")], None);
            assert!(r.as_ref().is_ok() || m == "bosen", "--sync {m}: {r:?}"); // bosen needs a budget
        }
        let argv = |a: &[&str]| [&["x"][..], a].concat().iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for m in ["allreduce", "asap", "gaia"] {
            let nesterov = argv(&[&format!("--sync={m}"), "--outer-optimizer=nesterov", "--outer-lr=0.5", "--outer-momentum=0.5"]);
            assert!(merged(&cmd, &nesterov, None).is_ok(), "{m} nesterov");
            assert!(merged(&cmd, &argv(&[&format!("--sync={m}"), "--outer-optimizer=sgd", "--outer-lr=1"]), None).is_ok(), "{m} sgd");
            let e = merged(&cmd, &argv(&[&format!("--sync={m}"), "--outer-optimizer=sgd", "--outer-momentum=0.5"]), None).unwrap_err();
            assert!(e.contains("--outer-momentum applies to") && e.contains("--outer-optimizer nesterov"), "{e}");
        }
        let e = merged(&cmd, &argv(&["--sync=ssp", "--outer-optimizer=nesterov"]), None).unwrap_err();
        assert!(e.contains("--outer-optimizer applies to --sync allreduce"), "{e}");
        let e = merged(&cmd, &["x".into(), "--sync=gaia".into(), "--graph=ring".into()], None).unwrap_err();
        assert!(
            e.contains(
                "--graph applies to --sync asap and to --sync gaia --gaia-inner asap, not to this run (--sync gaia --gaia-inner allreduce)"
            ),
            "{e}"
        );
    }

    /// The configuration a run writes (`config_file_text`), TOML and JSON, reads back as the same
    /// options (values the run plan chose, f32 and f64 ones, lists, unset options, other data than
    /// the built-in with no test set), holds no option of a group the run does not use, and never
    /// names the file it is written to; the same file then drives a run of another mode.
    #[test]
    fn a_written_configuration_reads_back_as_the_same_options() {
        let mut cmd = TrainConfig::augment_args(clap::Command::new("x"));
        cmd.build();
        let argv = |a: &[&str]| [&["x"][..], a].concat().iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let dir = tempfile::tempdir().unwrap();
        let runs: &[(&[&str], &[&str])] = &[
            (&[], &["hidden", "factors", "topics", "outer_lr", "save_config"]),
            (
                &["--sync=ssp", "--staleness=3", "--lr=0.0009765625", "--lambda=0.00003", "--wait-timeout=12.345678901234567"],
                &["graph", "notify", "outer_optimizer"],
            ),
            (&["--sync=allreduce", "--outer-optimizer=nesterov", "--outer-lr=0.5", "--sync-every=64"], &["graph", "staleness"]),
            (
                &["--model=mlp", "--hidden=256,64", "--data=/x.svm", "--save-config=/tmp/c.toml", "--sync=gaia", "--gaia-inner=asap"],
                &["factors", "topics", "save_config"],
            ),
            (&["--model=lda", "--sync=allreduce", "--seed=12345"], &["hidden", "classes"]),
        ];
        for (args, absent) in runs {
            let mut cfg = merged(&cmd, &argv(args), None).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            // As the run plan leaves them: a searched step, a staleness bounded by the epoch.
            cfg.lr = 0.000488281;
            for ext in ["toml", "json"] {
                let path = dir.path().join(format!("c.{ext}"));
                let text = cfg.config_file_text(&path).unwrap();
                std::fs::write(&path, &text).unwrap();
                let back = merged(&cmd, &argv(&[]), Some(&path)).unwrap_or_else(|e| panic!("{args:?} {ext}: {e}\n{text}"));
                let expected = TrainConfig { config_file: back.config_file.clone(), save_config: None, ..cfg.clone() };
                assert_eq!(back, expected, "{args:?} {ext}:\n{text}");
                let keys: Vec<String> = if ext == "json" {
                    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text).unwrap().keys().cloned().collect()
                } else {
                    text.parse::<::toml::Table>().unwrap().keys().cloned().collect()
                };
                for key in absent.iter() {
                    assert!(!keys.iter().any(|k| k == key), "{args:?} {ext}: {key} is not this run's:\n{text}");
                }
                assert!(keys.iter().any(|k| k == "lr") && keys.iter().any(|k| k == "sync"), "{text}");
                // The file drives a run of another mode given by a flag.
                let other = if cfg.sync == SyncKind::Ssp { "--sync=allreduce" } else { "--sync=ssp" };
                let r = merged(&cmd, &argv(&[other]), Some(&path));
                assert!(r.is_ok() || cfg.sync != SyncKind::Asap, "{args:?} {ext} {other}: {r:?}");
            }
        }
        // Unset where the default is set (only a JSON file can say so): TOML cannot write it.
        let cfg = TrainConfig { test_data: None, ..TrainConfig::default() };
        let e = cfg.config_file_text(Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.contains("c.toml: test_data is unset") && e.contains("as JSON"), "{e}");
        assert!(cfg.config_file_text(Path::new("c.json")).unwrap().contains("\"test_data\": null"));
    }

    /// A config file's key at its built-in default is no choice of mode: the file holding asap's
    /// options at their defaults runs under ssp. Away from its default it is refused naming the
    /// file's line, whatever the file says of `sync` (the flag chose the run); a flag is checked
    /// even at its default (it was typed for this run).
    #[test]
    fn a_file_key_at_its_default_is_no_choice_of_mode() {
        let cmd = TrainConfig::augment_args(clap::Command::new("x"));
        let argv = |a: &[&str]| [&["x"][..], a].concat().iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("c.toml");
        std::fs::write(&t, "sync = \"asap\"\ngraph = \"auto\"\nnotify = \"notify-ack\"\nhidden = [128]\ntopics = 100\n").unwrap();
        let c = merged(&cmd, &argv(&["--sync=ssp"]), Some(&t)).unwrap();
        assert_eq!((c.sync, c.modes.graph.graph.as_str()), (SyncKind::Ssp, "auto"));
        std::fs::write(&t, "sync = \"asap\"\ngraph = \"complete\"\n").unwrap();
        assert!(merged(&cmd, &argv(&[]), Some(&t)).is_ok(), "asap's own option");
        let e = merged(&cmd, &argv(&["--sync=allreduce"]), Some(&t)).unwrap_err();
        assert!(e.starts_with("--graph applies to --sync asap") && e.contains("(--sync allreduce)") && e.contains("c.toml:2:1"), "{e}");
        let e = merged(&cmd, &argv(&["--sync=allreduce", "--graph=auto"]), None).unwrap_err();
        assert!(e.contains("--graph applies to") && e.contains("command line"), "{e}");
        // `--lr` in a file is given by its presence, at any value: the step search is not run.
        std::fs::write(&t, "lr = 0.3\n").unwrap();
        let m = TrainConfig::merge(Some(&t), TrainConfig::default(), None).unwrap();
        assert!(m.given.lr && !m.given.lr_decay);
        // --lr-decay alone selects the decay schedule, from a flag or a file; a given schedule
        // stays; neither: cosine.
        assert_eq!(merged(&cmd, &argv(&[]), None).unwrap().lr_schedule, LrSchedule::Cosine);
        assert_eq!(merged(&cmd, &argv(&["--lr-decay=0.9"]), None).unwrap().lr_schedule, LrSchedule::Decay);
        let both = merged(&cmd, &argv(&["--lr-decay=0.9", "--lr-schedule=constant"]), None).unwrap();
        assert_eq!(both.lr_schedule, LrSchedule::Constant);
        std::fs::write(&t, "lr_decay = 0.9\n").unwrap();
        assert_eq!(merged(&cmd, &argv(&[]), Some(&t)).unwrap().lr_schedule, LrSchedule::Decay);
        std::fs::write(&t, "lr_decay = 0.9\nlr_schedule = \"cosine\"\n").unwrap();
        assert_eq!(merged(&cmd, &argv(&[]), Some(&t)).unwrap().lr_schedule, LrSchedule::Cosine);
    }

    /// An explicit value of `arg` as flag arguments (its default, its first possible value, or 1).
    fn sample(arg: &clap::Arg) -> Vec<String> {
        let long = format!("--{}", arg.get_long().unwrap());
        if !arg.get_action().takes_values() {
            return vec![long];
        }
        let value = arg
            .get_default_values()
            .first()
            .map(|v| v.to_string_lossy().into_owned())
            .or_else(|| arg.get_possible_values().first().map(|v| v.get_name().to_owned()))
            .unwrap_or_else(|| "1".to_owned());
        vec![format!("{long}={value}")]
    }

    /// A TOML line giving `arg` a valid value other than its default (its first such possible
    /// value, or the first of a few candidates that its flag takes and that changes the options).
    fn non_default(cmd: &clap::Command, arg: &clap::Arg) -> String {
        use clap::FromArgMatches;
        if !arg.get_action().takes_values() {
            return format!("{} = true", arg.get_id());
        }
        let long = arg.get_long().unwrap();
        let possible = arg.get_possible_values().iter().map(|v| v.get_name().to_owned()).collect::<Vec<_>>();
        for v in possible.into_iter().chain(["1", "2", "0.5", "ring", "bsp", "fp16"].map(String::from)) {
            let Ok(m) = cmd.clone().try_get_matches_from(["x".to_owned(), format!("--{long}={v}")]) else { continue };
            let Ok(c) = TrainConfig::from_arg_matches(&m) else { continue };
            if c != TrainConfig::default() {
                // Written as the options hold it (a graph "1" is a string, not a number).
                let json = serde_json::to_value(c).unwrap();
                return format!("{} = {}", arg.get_id(), ::toml::Value::try_from(&json[arg.get_id().as_str()]).unwrap());
            }
        }
        panic!("--{long}: no candidate value differs from the default");
    }

    /// [`TrainConfig::merge`] of `argv` (and a config file) as the binary does it, the error as text.
    fn merged(cmd: &clap::Command, argv: &[String], file: Option<&Path>) -> Result<TrainConfig, String> {
        use clap::FromArgMatches;
        let m = cmd.clone().try_get_matches_from(argv).map_err(|e| e.to_string())?;
        TrainConfig::merge(file, TrainConfig::from_arg_matches(&m).unwrap(), Some(&m)).map(|m| m.options).map_err(|e| e.to_string())
    }
}
