//! `--sync ssp`: stale synchronous parallel on a parameter server whose shards live on the ranks
//! themselves (Bosen §3.1-3.2: every process is client and server), with the server-side rules of
//! the heterogeneity-aware parameter server (ConSGD, DynSGD: its §4-5).
//!
//! This file holds the mode's options ([`SspOptions`]: `--apply`; `--staleness` is a shared group),
//! their rules and defaults, and its declaration ([`MODE`]). The engine is [`super::ps`]: the clock protocol and
//! lazy reads ([`super::ps::client`]), the shard server with its apply rules
//! ([`super::ps::server`]), given the plain send policy ([`super::ps::policy`]).

use super::ps::build::{build, build_counts};
use super::ps::server::ApplyRule;
use super::ps::settings::{PolicySettings, PsSettings, DEFAULT_STALENESS};
use super::{ModeOptions, RunSpec, SyncContext, SyncMode};

/// Options of `--sync ssp` and `--sync bosen` (their staleness bound is `--staleness`, a shared
/// group: [`super::groups::StalenessOptions`]).
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "SSP (--sync ssp)")]
pub struct SspOptions {
    /// Server-side rule: plain (add updates), consgd (scale by 1/M), dynsgd (scale by
    /// 1/staleness per model version; not with bosen, whose early partial pushes DynSGD's
    /// per-version bookkeeping does not define). [default: dynsgd for ssp, consgd for bosen]
    #[arg(long, value_enum)]
    pub apply: Option<ApplyRule>,
}

impl SspOptions {
    /// The apply rule in force for `--sync ssp` (`bosen` false) or `--sync bosen`.
    pub fn apply_rule(&self, bosen: bool) -> ApplyRule {
        self.apply.unwrap_or(if bosen { ApplyRule::Consgd } else { ApplyRule::Dynsgd })
    }

    /// Fills in the apply rule in force (the declarations' `resolve` for ssp and bosen, with
    /// `--staleness`'s), so that a default and the same rule given explicitly are the same run.
    pub fn fill_apply(&mut self, bosen: bool) {
        self.apply = Some(self.apply_rule(bosen));
    }
}

impl Default for SspOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// `--sync ssp`'s declaration (see [`super::ModeSpec`]); `--sync bosen` (bosen.rs) runs the same
/// parameter-server engine with Bosen's managed send policy.
pub const MODE: super::ModeSpec = super::ModeSpec {
    uses: &[(&[], &["SspOptions", "staleness_group"])],
    elastic: true,
    resize_model: Some(super::ps::client::SHARD_ROWS),
    resolve: |o| {
        o.staleness.fill(DEFAULT_STALENESS);
        o.ssp.fill_apply(false)
    },
    fit_to_epoch: |o, rounds| o.staleness.fit_to_epoch(DEFAULT_STALENESS, rounds),
    build_counts: Some(ssp_counts),
    ..super::ModeSpec::new(
        "ssp",
        "Stale synchronous parallel on parameter-server row shards hosted by the ranks themselves",
        |ctx, run, init| build(ctx, &settings(run.opts), init),
    )
};

/// The engine's settings for `--sync ssp`: the staleness bound and apply rule in force, plain
/// sends.
fn settings(o: &ModeOptions) -> PsSettings {
    PsSettings { staleness: o.staleness.or(DEFAULT_STALENESS), apply: o.ssp.apply_rule(false), policy: PolicySettings::Plain }
}

fn ssp_counts(ctx: &SyncContext, run: &RunSpec, init: &[f32]) -> anyhow::Result<Box<dyn SyncMode>> {
    build_counts(ctx, settings(run.opts), run.opts.ssp.apply, init)
}
