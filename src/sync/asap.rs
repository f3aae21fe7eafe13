//! `--sync asap`: ASAP stochastic reduce (ASAP §3-4) over one-sided MPI mailboxes: each round a
//! rank sends its model to its out-neighbours on `--graph` and averages it with the consistent
//! in-neighbour models it reduced.
//!
//! This file holds the mode's options ([`AsapOptions`]: `--notify`, `--overlap`, `--deadline`),
//! its rules and its declaration ([`MODE`]). The engine, every NOTIFY-ACK variant and the
//! budgeted edges, is [`super::gossip`]; the shared groups it reads (`--graph`, `--staleness`,
//! `--bandwidth-mbps`/`--priority`, `--compress`/`--consensus-step`) are declared in
//! [`super::groups`].
//!
//! `--compress` runs CHOCO-GOSSIP (sync/gossip/choco.rs), whose public copies agree only while
//! every message is delivered exactly once and in order: the rules below refuse it with every
//! variant where that does not hold (barrier, none, push-sum and deadline drop or overwrite
//! messages, bounded staleness skips older ones, a budgeted edge sends rows of its own, overlap
//! reduces a round after the next local steps). The one-peer graph delivers every message once,
//! in order, too: there CHOCO keeps a copy per edge (see choco.rs).

use super::groups::{OuterKind, OuterPseudoGradient, OUTER_GOSSIP_USES, OUTER_USES};
use super::gossip::choco::{default_step, ChocoOptions};
use super::gossip::edge_budget::EdgeBudgetOptions;
use super::gossip::{GossipSettings, NotifyMode, StochasticReduce};
use super::SyncContext;

/// Options of `--sync asap` (its graph is `--graph`, a shared group).
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "ASAP (--sync asap)")]
pub struct AsapOptions {
    /// Synchronisation: notify-ack (one-sided NOTIFY-ACK), barrier (put, MPI_Barrier, reduce
    /// what is consistent), none (fully asynchronous: average whatever intact models are there)
    /// or push-sum (asynchronous push-sum: shares of the model and a weight, nothing waits,
    /// nothing is double-counted; the model is x / weight).
    #[arg(long, value_enum, default_value_t = NotifyMode::NotifyAck)]
    pub notify: NotifyMode,
    /// Overlap communication with computation (notify-ack): a round's models are sent, the next
    /// local steps run while they travel, and the round is reduced at the next sync, keeping the
    /// local progress made meanwhile (w <- average + (w - w_sent)).
    #[arg(long)]
    pub overlap: bool,
    /// --notify deadline: milliseconds a rank waits, after its sends, for in-neighbours' new
    /// messages before it reduces what has arrived (a late one is reduced in a later round).
    #[arg(long, value_name = "MS", default_value_t = 1.0, value_parser = non_negative_ms)]
    pub deadline: f64,
}

/// `--deadline`: finite milliseconds >= 0.
fn non_negative_ms(s: &str) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|_| format!("expected milliseconds, got {s:?}"))?;
    if !(x.is_finite() && (0.0..=1e6).contains(&x)) {
        return Err(format!("must be a finite number of milliseconds in 0..1e6, got {s}"));
    }
    Ok(x)
}

impl Default for AsapOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}


/// `--sync asap`'s declaration (see [`super::ModeSpec`]). Besides its own options it reads the
/// shared groups ([`super::groups`]) `--graph`, `--staleness` (bounds NOTIFY-ACK),
/// `--bandwidth-mbps`/`--priority` (budget each edge) and `--compress`/`--consensus-step`
/// (CHOCO's compressed messages).
pub const MODE: super::ModeSpec = super::ModeSpec {
    elastic: true,
    survives_rank_loss: true,
    uses: &[
        (&[], &["AsapOptions", "graph_group", "staleness_group", "budget_group", "compress_group", "consensus_group"]),
        OUTER_USES[0],
        OUTER_USES[1],
        OUTER_USES[2],
        OUTER_GOSSIP_USES[0],
        OUTER_GOSSIP_USES[1],
    ],
    paces_sends: |o| o.budget.bandwidth_mbps.is_some(),
    validate: validate_asap,
    resolve: resolve_asap,
    ..super::ModeSpec::new(
        "asap",
        "ASAP stochastic reduce: average with in-neighbours on --graph, one-sided NOTIFY-ACK",
        build_asap,
    )
};

/// Fills `--staleness` (0) and, under `--compress`, the codec's `--consensus-step`.
fn resolve_asap(o: &mut super::ModeOptions) {
    o.staleness.fill(0);
    if o.outer.outer_optimizer != OuterKind::None {
        o.outer.outer_pseudo_gradient.get_or_insert(OuterPseudoGradient::Own);
    }
    if let Some(c) = o.compress.compression() {
        o.consensus.consensus_step.get_or_insert(default_step(&c));
    }
}

/// `--compress` (CHOCO) needs every message delivered once and in order: refused with the
/// variants that do not deliver so (see the file's doc), each error naming the option to drop.
fn validate_compressed(run: &super::RunSpec) -> anyhow::Result<()> {
    let o = run.opts;
    let Some(_) = o.compress.compression() else {
        anyhow::ensure!(
            o.consensus.consensus_step.is_none(),
            "--consensus-step is CHOCO's step on compressed public copies: it applies to --sync asap with --compress int8|topk:F; add --compress or remove --consensus-step"
        );
        return Ok(());
    };
    let why = "CHOCO's public copies (sync/gossip/choco.rs) agree only while every message is delivered once, in order";
    let mut conflicts = Vec::new();
    if o.asap.notify != NotifyMode::NotifyAck {
        conflicts.push(format!("--notify {}", serde_json::to_value(o.asap.notify).unwrap_or_default().as_str().unwrap_or_default()));
    }
    if o.staleness.staleness.is_some_and(|s| s > 0) {
        conflicts.push("--staleness > 0".to_owned());
    }
    if o.budget.bandwidth_mbps.is_some() {
        conflicts.push("--bandwidth-mbps".to_owned());
    }
    if o.asap.overlap {
        conflicts.push("--overlap".to_owned());
    }
    anyhow::ensure!(
        conflicts.is_empty(),
        "--compress on --sync asap cannot be combined with {}: {why}, which needs --notify notify-ack at --staleness 0, without --overlap and --bandwidth-mbps; remove {} or --compress",
        conflicts.join(", "),
        conflicts.join(", ")
    );
    Ok(())
}

fn validate_asap(run: &super::RunSpec) -> anyhow::Result<()> {
    validate_compressed(run)?;
    let o = run.opts;
    anyhow::ensure!(
        o.asap.notify != NotifyMode::Deadline || !run.checkpoints,
        "--notify deadline keeps unread messages in the windows, which a checkpoint does not hold: run it without --checkpoint-dir"
    );
    if o.staleness.staleness.is_some_and(|s| s > 0) {
        anyhow::ensure!(o.asap.notify == NotifyMode::NotifyAck, "--staleness on --sync asap bounds NOTIFY-ACK: it needs --notify notify-ack");
        anyhow::ensure!(
            o.budget.bandwidth_mbps.is_none(),
            "--staleness and --bandwidth-mbps cannot be combined on --sync asap: a budgeted edge must deliver every message, while bounded staleness skips older ones"
        );
    }
    Ok(())
}

fn build_asap(ctx: &SyncContext, run: &super::RunSpec, init: &[f32]) -> super::Built {
    let o = run.opts;
    let budget = o.budget.bandwidth_mbps.map(|mbps| EdgeBudgetOptions { mbps, priority: o.budget.priority });
    let settings = GossipSettings {
        graph: &o.graph.graph,
        notify: o.asap.notify,
        overlap: o.asap.overlap,
        deadline_ms: o.asap.deadline,
        transport: o.graph.transport,
    };
    let choco = o.compress.compression().map(|compression| ChocoOptions {
        compression,
        step: o.consensus.consensus_step.unwrap_or_else(|| default_step(&compression)),
    });
    let (mode, mut info) = StochasticReduce::build(ctx, &settings, init, budget, choco, o.staleness.or(0))?;
    if choco.is_some() {
        info["compress"] = serde_json::json!(o.compress.compress);
    }
    Ok((Box::new(mode), info))
}
