//! Option groups that several modes read, each declared once here and listed by the modes that use
//! it (in their declarations' `uses`), so that no mode reads another mode's options struct:
//! - [`GraphOptions`] (`--graph`, `--transport`): the gossip graph of `--sync asap`, and of each
//!   data centre under `--sync gaia --gaia-inner asap`, and how its messages travel;
//! - [`StalenessOptions`] (`--staleness`): ssp's and bosen's clock bound, asap's bounded NOTIFY-ACK;
//! - [`BudgetOptions`] (`--bandwidth-mbps`, `--priority`): bosen's per-rank budget, asap's per-edge
//!   one;
//! - [`OuterOptions`] (`--outer-optimizer`, `--outer-lr`, `--outer-momentum`): the outer step of
//!   every mode that averages replicas (allreduce, asap, gaia), applied by sync/outer.rs;
//! - [`CompressOptions`] (`--compress`): what allreduce's syncs send, int8, fp16 or top-k with
//!   error feedback ([`super::codec::mean`]); asap's messages (CHOCO's public copies,
//!   sync/gossip/choco.rs), with [`ConsensusOptions`] (`--consensus-step`) beside it for asap;
//!   bosen's pushes, fp16 (its rules: sync/bosen.rs).
//!
//! Each group is a flattened field of [`super::ModeOptions`] (the registry's `shared` line), with
//! the same config-file keys as before they moved here (the checkpoints' run identity hashes the
//! options by key, so moving an option between groups changes no identity). A group's clap id
//! (`graph_group`, ...) is what a declaration lists; a run that does not use it refuses its
//! options, naming the runs they apply to. Each mode resolves its own default of a shared option
//! (`--staleness`: 3 for ssp and bosen, 0 for asap) in its declaration's `resolve`.

use super::codec::int8::DEFAULT_BLOCK;
use super::codec::mean::Compression;
use super::gossip::Transport;
use super::ps::managed::Priority;

/// The gossip graph.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[group(id = "graph_group")]
#[command(next_help_heading = "Gossip graph and transport (--sync asap; --sync gaia --gaia-inner asap)")]
pub struct GraphOptions {
    /// Communication graph: auto (root-expander while it mixes within 32 rounds, about 16 ranks
    /// or fewer; a seeded random 4-regular graph above; the choice and reason are logged),
    /// root-expander, exponential, ring, complete, chain, line, star, hypercube, torus, random:D
    /// (D-regular, seeded), one-peer-exponential (time-varying: one send per round; notify-ack only) or file:PATH (see graphs/).
    #[arg(long, value_name = "GRAPH", default_value = "auto")]
    pub graph: String,
    /// How the gossip messages travel: rma (one-sided puts into the receivers' windows, one
    /// round trip on RDMA hardware), p2p (two-sided non-blocking messages: the model with its
    /// NOTIFY one way, the ACK back; every --notify variant, --staleness, --overlap, the
    /// one-peer graph, --bandwidth-mbps and --compress, with the same semantics) or auto: p2p
    /// when the ranks span hosts without an RDMA device (TCP, where each one-sided put, flush,
    /// NOTIFY and ACK costs software round trips), rma otherwise (gaia: per group, over the
    /// group's ranks). The start line says which and why.
    #[arg(long, value_enum, default_value_t = Transport::Auto)]
    pub transport: Transport,
}

impl Default for GraphOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// The staleness bound.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[group(id = "staleness_group")]
#[command(next_help_heading = "Staleness (--sync ssp, bosen, asap)")]
pub struct StalenessOptions {
    /// Staleness bound S. ssp/bosen: a worker at clock c reads only rows holding every update of
    /// clocks <= c-S-1 (waiting otherwise); 0 is BSP [default: 3, at most the rounds of an epoch
    /// less one]. asap (notify-ack): a rank
    /// reduces each in-neighbour's newest message no older than S rounds and runs at most S
    /// messages ahead of what its receivers have read (S + 1 slots per edge); 0 is ASAP's
    /// NOTIFY-ACK [default: 0].
    #[arg(long, value_name = "S", value_parser = staleness_bound)]
    pub staleness: Option<u64>,
}

impl StalenessOptions {
    /// The bound in force, `default` where `--staleness` was not given (each mode has its own).
    pub fn or(&self, default: u64) -> u64 {
        self.staleness.unwrap_or(default)
    }

    /// Fills in the bound in force (a declaration's `resolve`), so that a default and the same
    /// value given explicitly are the same run.
    pub fn fill(&mut self, default: u64) {
        self.staleness = Some(self.or(default));
    }

    /// ssp and bosen with `--staleness` not given: their `default` bounded by the rounds of an
    /// epoch less one, so that by the last clock of every epoch each worker reads rows holding
    /// every update of the epoch before (a read at clock c holds every update of clocks
    /// <= c - S - 1). With S at or above an epoch's R rounds, a whole epoch's steps may be
    /// computed from rows that lack the other workers' updates of the epoch before, and the stale
    /// updates summed on the servers overshoot: heart_scale at 8 ranks (33 examples per rank,
    /// R = 2) rose in the third epoch in 3 of 3 runs at S = 3 and 1 of 3 at S = 2, and fell every
    /// epoch in 8 of 8 at S = 1 (benches/defaults-sweep.md). Only data sets of under 4 rounds per
    /// epoch are affected. Returns what it chose, for the start line; None when the default
    /// stands.
    pub fn fit_to_epoch(&mut self, default: u64, rounds_per_epoch: u64) -> Option<String> {
        if self.staleness.is_some() {
            return None;
        }
        let bounded = default.min(rounds_per_epoch.saturating_sub(1));
        if bounded == default {
            return None;
        }
        self.staleness = Some(bounded);
        Some(format!(
            "--staleness not given: {bounded} (the default {default} bounded by the {rounds_per_epoch} round(s) of an epoch less one, so that each epoch ends reading every update of the epoch before; --staleness sets it)"
        ))
    }
}

/// `--staleness`: at most 1000 (asap, ssp and bosen alike: the group's rule, checked where the
/// value is parsed).
fn staleness_bound(s: &str) -> Result<u64, String> {
    let v: u64 = s.trim().parse().map_err(|_| format!("expected a number of clocks >= 0, got {s:?}"))?;
    if v <= 1000 {
        Ok(v)
    } else {
        Err(format!("{v} is too large (at most 1000: each step of it costs a model-sized slot per edge under asap)"))
    }
}

/// A bandwidth budget and which rows spend it first.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[group(id = "budget_group")]
#[command(next_help_heading = "Bandwidth budget (--sync bosen, asap)")]
pub struct BudgetOptions {
    /// Per-rank bandwidth budget in Mbit/s (10^6 bits) for everything the rank sends. bosen:
    /// client and server together; spare budget between clocks sends the most significant
    /// updates early [default: --emulate-bandwidth when given; required otherwise]. asap: each
    /// round's message on an edge carries only the rows that fit, most significant first (per
    /// edge residuals keep the rest for later; needs --notify notify-ack) [default: no budget].
    #[arg(long, value_name = "MBPS", value_parser = budget_mbps)]
    pub bandwidth_mbps: Option<f64>,
    /// Which buffered rows go first: random, round-robin, absolute (|delta|) or relative
    /// (|delta/a|).
    #[arg(long, value_enum, default_value_t = Priority::Relative)]
    pub priority: Priority,
}

impl Default for BudgetOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// `--bandwidth-mbps`: a finite, positive number of Mbit/s, at most 1e7 (asap's edges and bosen
/// alike: the group's rule, checked where the value is parsed).
fn budget_mbps(s: &str) -> Result<f64, String> {
    let v = crate::values::finite_f64(s)?;
    if v > 0.0 && v <= 1e7 {
        Ok(v)
    } else {
        Err(format!("must be a positive number of Mbit/s (at most 1e7), got {s}"))
    }
}

/// The outer optimizer of the averaging modes (DiLoCo, NoLoCo; applied by sync/outer.rs).
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
// Each option in a group of its own (no group of the struct's, which would hold all three and
// make each apply wherever --outer-optimizer does): see OUTER_USES.
#[group(skip)]
#[command(next_help_heading = "Outer optimizer (--sync allreduce, asap, gaia): DiLoCo and NoLoCo")]
pub struct OuterOptions {
    /// What a sync does with the average: none (take it, plain local SGD), sgd or nesterov (an
    /// outer step on the pseudo-gradient, the model at the last sync minus the average: DiLoCo
    /// under allreduce, NoLoCo under asap, whose average is the neighbourhood's). Raise
    /// --sync-every with it: the outer step pays off over many local steps (DiLoCo: 500). NoLoCo
    /// is --graph one-peer-exponential (one peer a round); see --outer-pseudo-gradient for the
    /// two forms it takes (docs/low-communication.md).
    #[arg(long, value_enum, default_value_t = OuterKind::None, group = "outer_group")]
    pub outer_optimizer: OuterKind,
    /// The outer step size (sgd, nesterov); 1 with sgd is plain averaging. DiLoCo's 0.7.
    #[arg(long, value_name = "LR", default_value_t = 0.7, value_parser = outer_lr, group = "outer_step_group")]
    pub outer_lr: f64,
    /// The outer Nesterov momentum (nesterov only). DiLoCo's 0.9.
    #[arg(long, value_name = "MU", default_value_t = 0.9, value_parser = outer_momentum, group = "outer_momentum_group")]
    pub outer_momentum: f64,
    /// NoLoCo (--sync asap): what the outer step acts on. own (the default): each rank's own
    /// pseudo-gradient, stepped before the exchange, which then averages the stepped models (the
    /// replicas' mean moves as DiLoCo's; stable at every size). neighbourhood: the model at the
    /// last sync minus the neighbourhood's average, after the exchange: 2-3 pt better on 8 ranks
    /// with by-label:2 shards, but the replicas' differences enter the momentum and it diverged
    /// at 64 ranks (docs/low-communication.md).
    #[arg(long, value_enum, value_name = "ON", group = "outer_form_group")]
    pub outer_pseudo_gradient: Option<OuterPseudoGradient>,
}

impl Default for OuterOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// `--outer-optimizer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OuterKind {
    /// No outer step: the model after a sync is the average.
    None,
    /// x <- x_last - lr * (x_last - average).
    Sgd,
    /// Nesterov momentum on the pseudo-gradient (DiLoCo's outer optimizer).
    Nesterov,
}

/// `--outer-pseudo-gradient`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OuterPseudoGradient {
    /// The rank's own (anchor minus its model), stepped before the exchange.
    Own,
    /// The anchor minus the neighbourhood's average, stepped after the exchange.
    Neighbourhood,
}

/// `--outer-pseudo-gradient` (the gossip modes only) with sgd and nesterov.
pub const OUTER_GOSSIP_USES: [super::Uses; 2] =
    [(&[("outer_optimizer", "sgd")], &["outer_form_group"]), (&[("outer_optimizer", "nesterov")], &["outer_form_group"])];

/// The uses of the outer optimizer's options by a mode that averages replicas (its declaration
/// lists these after its own): `--outer-optimizer` always, `--outer-lr` with sgd and nesterov,
/// `--outer-momentum` with nesterov.
pub const OUTER_USES: [super::Uses; 3] = [
    (&[], &["outer_group"]),
    (&[("outer_optimizer", "sgd")], &["outer_step_group"]),
    (&[("outer_optimizer", "nesterov")], &["outer_step_group", "outer_momentum_group"]),
];

/// `--outer-lr`: finite, in (0, 10].
fn outer_lr(s: &str) -> Result<f64, String> {
    let v = crate::values::finite_f64(s)?;
    if v > 0.0 && v <= 10.0 {
        Ok(v)
    } else {
        Err(format!("must be in (0, 10] (1 with sgd is plain averaging), got {s}"))
    }
}

/// `--outer-momentum`: finite, in [0, 1).
fn outer_momentum(s: &str) -> Result<f64, String> {
    let v = crate::values::finite_f64(s)?;
    if (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be in [0, 1), got {s}"))
    }
}

/// What a sync of an averaging mode sends (see [`super::codec::mean`]).
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[group(id = "compress_group")]
#[command(next_help_heading = "Compressed exchange (--sync allreduce, asap, bosen)")]
pub struct CompressOptions {
    /// What each sync exchanges: none (the model, f32), int8 or int8:BLOCK (8 bits a value and a
    /// scale per BLOCK values, default 256: 3.94x fewer bytes), fp16 (IEEE half-precision
    /// numbers: 2x fewer) or topk:FRACTION (that fraction of the largest entries, e.g.
    /// topk:0.01: about 1 / (2 FRACTION) fewer bytes). allreduce: each rank's change since the
    /// last sync; what a send leaves out stays in a per-rank residual and goes out with later
    /// syncs (error feedback); the ranks still end each sync with the same model. asap
    /// (CHOCO-SGD; notify-ack, staleness 0; on the one-peer graph a copy per edge): the change of a public copy of
    /// each rank's model that its neighbours hold, mixed in with --consensus-step. bosen: none or
    /// fp16 (its pushed updates as half-precision numbers, each value's rounding error left in
    /// the buffer for a later push).
    #[arg(long, value_name = "CODEC", default_value = "none", value_parser = compress_spec)]
    pub compress: String,
}

impl Default for CompressOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

impl CompressOptions {
    /// The compression asked for; None: the exchange is not compressed.
    pub fn compression(&self) -> Option<Compression> {
        parse_compress(&self.compress).expect("--compress is checked where it is parsed")
    }
}

/// CHOCO's consensus step (`--sync asap --compress`; sync/gossip/choco.rs).
#[derive(clap::Args, Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[group(id = "consensus_group")]
#[command(next_help_heading = "Compressed exchange (--sync allreduce, asap, bosen)")]
pub struct ConsensusOptions {
    /// asap with --compress: the consensus step γ of CHOCO-SGD, x_i += γ sum_j w_ij (x̂_j - x̂_i)
    /// over the public copies x̂, in (0, 1]; smaller is stabler under coarser compression
    /// [default: 1 for int8, 2 FRACTION for topk:FRACTION (0.02 at topk:0.01), measured:
    /// sync/gossip/choco.rs].
    #[arg(long, value_name = "GAMMA", value_parser = consensus_step)]
    pub consensus_step: Option<f64>,
}

/// `--consensus-step`: finite, in (0, 1].
fn consensus_step(s: &str) -> Result<f64, String> {
    let v = crate::values::finite_f64(s)?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("must be in (0, 1] (1 with exact messages is plain gossip), got {s}"))
    }
}

/// `--compress`: none, int8, int8:BLOCK, fp16 or topk:FRACTION.
fn parse_compress(s: &str) -> Result<Option<Compression>, String> {
    let bad = || {
        format!(
            "--compress takes none, int8, int8:BLOCK (values per scale, >= 1), fp16 or topk:FRACTION (in (0, 1], e.g. topk:0.01), got {s:?}"
        )
    };
    match s.split_once(':') {
        None if s == "none" => Ok(None),
        None if s == "int8" => Ok(Some(Compression::Int8 { block: DEFAULT_BLOCK })),
        None if s == "fp16" => Ok(Some(Compression::Fp16)),
        Some(("int8", b)) => b.parse().ok().filter(|&b: &usize| b >= 1).map(|block| Some(Compression::Int8 { block })).ok_or_else(bad),
        Some(("topk", f)) => {
            f.parse().ok().filter(|f: &f64| *f > 0.0 && *f <= 1.0).map(|fraction| Some(Compression::TopK { fraction })).ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

/// The value parser of `--compress`: checks it, keeps the text (the config key's value).
fn compress_spec(s: &str) -> Result<String, String> {
    parse_compress(s).map(|_| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_staleness_is_bounded_by_an_epoch_and_a_given_one_is_kept() {
        let mut o = StalenessOptions::default();
        assert!(o.fit_to_epoch(3, 4).is_none() && o.staleness.is_none(), "4 rounds an epoch: the default 3 stands");
        let why = o.fit_to_epoch(3, 2).expect("2 rounds an epoch bound it");
        assert_eq!(o.or(3), 1, "{why}");
        let mut o = StalenessOptions::default();
        o.fit_to_epoch(3, 1);
        assert_eq!(o.or(3), 0, "one round an epoch: BSP");
        let mut o = StalenessOptions { staleness: Some(3) };
        assert!(o.fit_to_epoch(3, 1).is_none() && o.or(3) == 3, "given: kept");
    }
}
