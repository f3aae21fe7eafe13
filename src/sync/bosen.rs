//! `--sync bosen`: SSP plus Bosen's managed communication (Bosen §3.3) and AdaRevision (§3.4).
//!
//! The engine is SSP's ([`super::ps`]), given Bösen's managed send policy
//! ([`super::ps::managed`]); this file holds the mode's options ([`BosenOptions`]), their rules
//! and its declaration ([`MODE`]):
//! - the options: the budget, which buffered rows go first when spare bandwidth allows a send
//!   ([`super::ps::managed::Priority`], [`super::ps::managed::pick`]), the rows of a message,
//!   half-precision pushes of updates (`--compress fp16`, the shared codec option of
//!   [`super::groups`]: encoded by the row codec, [`super::codec::fp16::f16_bits`]), whose
//!   rounding error stays in the client's buffer, and AdaRevision's snapshots
//!   ([`super::ps::adarevision`], run by the shard servers);
//! - the rules: a budget is needed, DynSGD does not fit early partial pushes, and of the codecs
//!   only fp16 is built into the row pushes: int8 and top-k are allreduce's, over a dense change,
//!   and are refused here (on rows int8 would need a scale per pushed row and top-k would redo
//!   the choice the budget's priorities make; neither has been built or measured).
//!
//! The budget itself is a [`crate::comm::pace::Pacer`] on the rank's postbox: every message (the
//! mandatory end-of-clock ones too) leaves at no more than `--bandwidth-mbps`, and between clocks
//! a client or server sends its most significant buffered rows whenever the bucket is empty.

use super::codec::mean::Compression;
use super::ps::build::{build, build_counts};
use super::ps::managed::ManagedSettings;
use super::ps::server::ApplyRule;
use super::ps::settings::{PolicySettings, PsSettings, DEFAULT_STALENESS};
use super::{RunSpec, SyncContext, SyncMode};

/// Options of `--sync bosen` (besides ssp's `--apply` and the shared groups `--staleness`,
/// `--bandwidth-mbps`/`--priority` and `--compress`, [`super::groups`]).
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "Bosen managed communication (--sync bosen)")]
pub struct BosenOptions {
    /// Most rows in one bosen message (caps the burst of a send; end-of-clock pushes are split
    /// into messages of at most this many rows too). Bosen's Table 3 uses 100-5000. (asap's
    /// one message per edge and round takes every row that fits the budget.)
    #[arg(long, value_name = "ROWS", default_value_t = 100)]
    pub queue_size: usize,
    /// Most AdaRevision snapshots a shard server keeps (--lr-schedule adarevision); above it the
    /// server stops pushing rows between clocks until clients' reads free some.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_snapshots: usize,
}

impl Default for BosenOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// `--sync bosen`'s declaration (see [`super::ModeSpec`]): the parameter-server engine with
/// ssp's options, given this file's managed communication as its send policy.
pub const MODE: super::ModeSpec = super::ModeSpec {
    uses: &[(&[], &["SspOptions", "BosenOptions", "staleness_group", "budget_group", "compress_group"])],
    server_steps: true,
    elastic: true,
    resize_model: Some(super::ps::client::SHARD_ROWS),
    paces_sends: |_| true,
    validate: validate_bosen,
    resolve: |o| {
        o.staleness.fill(DEFAULT_STALENESS);
        o.ssp.fill_apply(true)
    },
    fit_to_epoch: |o, rounds| o.staleness.fit_to_epoch(DEFAULT_STALENESS, rounds),
    build_counts: Some(bosen_counts),
    ..super::ModeSpec::new(
        "bosen",
        "SSP plus Bosen's managed communication: a per-rank bandwidth budget spent between clocks on the most significant updates first (--bandwidth-mbps, --priority, --compress fp16)",
        build_bosen,
    )
};

fn validate_bosen(run: &RunSpec) -> anyhow::Result<()> {
    let o = run.opts;
    anyhow::ensure!(o.bosen.queue_size >= 1, "--queue-size must be at least 1 row");
    anyhow::ensure!(o.bosen.max_snapshots >= 1, "--max-snapshots must be at least 1");
    anyhow::ensure!(
        o.budget.bandwidth_mbps.is_some() || run.emulated_link,
        "--sync bosen needs a per-rank budget: --bandwidth-mbps MBPS (or --emulate-bandwidth, which it then defaults to)"
    );
    anyhow::ensure!(
        o.ssp.apply != Some(ApplyRule::Dynsgd),
        "--sync bosen pushes parts of a clock's update early, which DynSGD's per-version bookkeeping does not define: use --apply consgd (the default for bosen) or plain"
    );
    anyhow::ensure!(
        matches!(o.compress.compression(), None | Some(Compression::Fp16)),
        "--compress {} with --sync bosen: its row pushes take --compress fp16 (half-precision values) or none; int8 and top-k compress the syncs of --sync allreduce and asap",
        o.compress.compress
    );
    Ok(())
}

/// The engine's settings for `--sync bosen`: ssp's staleness bound and bosen's apply rule, the
/// managed send policy with this run's options (AdaRevision's alpha is `--lr`).
fn settings(run: &RunSpec) -> PsSettings {
    let (o, b) = (run.opts, &run.opts.bosen);
    let managed = ManagedSettings {
        bandwidth_mbps: o.budget.bandwidth_mbps,
        queue_size: b.queue_size,
        priority: o.budget.priority,
        fp16: pushes_fp16(run),
        max_snapshots: b.max_snapshots,
        adarevision: run.adarevision.then_some(run.lr),
    };
    PsSettings { staleness: o.staleness.or(DEFAULT_STALENESS), apply: o.ssp.apply_rule(true), policy: PolicySettings::Managed(managed) }
}

/// `--compress fp16`: updates pushed as binary16 (validate_bosen refuses the other codecs).
fn pushes_fp16(run: &RunSpec) -> bool {
    run.opts.compress.compression() == Some(Compression::Fp16)
}

fn build_bosen(ctx: &SyncContext, run: &RunSpec, init: &[f32]) -> super::Built {
    let (mode, mut info) = build(ctx, &settings(run), init)?;
    // The start line's record of bosen's options, with the budget it spends and its fp16 (one
    // object with the same keys as before the budget became a shared group and --fp16 became
    // --compress fp16).
    let mut record = serde_json::json!(run.opts.bosen);
    record["bandwidth_mbps"] = serde_json::json!(run.opts.budget.bandwidth_mbps);
    record["priority"] = serde_json::json!(run.opts.budget.priority);
    record["fp16"] = serde_json::json!(pushes_fp16(run));
    info["bosen"] = record;
    Ok((mode, info))
}

fn bosen_counts(ctx: &SyncContext, run: &RunSpec, init: &[f32]) -> anyhow::Result<Box<dyn SyncMode>> {
    build_counts(ctx, settings(run), run.opts.ssp.apply, init)
}
