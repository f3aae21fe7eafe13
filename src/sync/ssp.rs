//! `--sync ssp`: stale synchronous parallel on a parameter server whose shards live on the ranks
//! themselves (Bosen §3.1-3.2: every process is client and server), with the server-side rules of
//! the heterogeneity-aware parameter server (ConSGD, DynSGD: its §4-5).
//!
//! This file holds the mode's options ([`SspOptions`]: `--staleness`, `--apply`), their rules and
//! defaults, and its declaration ([`MODE`]). The engine is [`super::ps`]: the clock protocol and
//! lazy reads ([`super::ps::client`]), the shard server with its apply rules
//! ([`super::ps::server`]), given the plain send policy ([`super::ps::policy`]).

use super::ps::build::{build, build_counts};
use super::ps::server::ApplyRule;
use super::ps::settings::{PolicySettings, PsSettings};
use super::{ModeOptions, RunSpec, SyncContext, SyncMode};

/// Options of `--sync ssp`.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "SSP (--sync ssp)")]
pub struct SspOptions {
    /// Staleness bound S. ssp/bosen: a worker at clock c reads only rows holding every update of
    /// clocks <= c-S-1 (waiting otherwise); 0 is BSP [default: 3, at most the rounds of an epoch
    /// less one]. asap (notify-ack): a rank
    /// reduces each in-neighbour's newest message no older than S rounds and runs at most S
    /// messages ahead of what its receivers have read (S + 1 slots per edge); 0 is ASAP's
    /// NOTIFY-ACK [default: 0].
    #[arg(long, value_name = "S", value_parser = staleness_bound, group = "staleness_group")]
    pub staleness: Option<u64>,
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

    /// Fills in the staleness and apply rule in force (the declarations' `resolve` for ssp and
    /// bosen), so that a default and the same value given explicitly are the same run.
    pub fn fill_defaults(&mut self, bosen: bool) {
        (self.staleness, self.apply) = (Some(self.ssp_staleness()), Some(self.apply_rule(bosen)));
    }
}

impl SspOptions {
    /// The staleness bound of ssp and bosen (`--staleness`, default 3).
    pub fn ssp_staleness(&self) -> u64 {
        self.staleness.unwrap_or(3)
    }

    /// ssp and bosen with `--staleness` not given: the default bounded by the rounds of an epoch
    /// less one, so that by the last clock of every epoch each worker reads rows holding every
    /// update of the epoch before (a read at clock c holds every update of clocks <= c - S - 1).
    /// With S at or above an epoch's R rounds, a whole epoch's steps may be computed from rows
    /// that lack the other workers' updates of the epoch before, and the stale updates summed on
    /// the servers overshoot: heart_scale at 8 ranks (33 examples per rank, R = 2) rose in the
    /// third epoch in 3 of 3 runs at S = 3 and 1 of 3 at S = 2, and fell every epoch in 8 of 8 at
    /// S = 1 (benches/defaults-sweep.md). Only data sets of under 4 rounds per epoch are
    /// affected. Returns what it chose, for the start line; None when the default stands.
    pub fn fit_to_epoch(&mut self, rounds_per_epoch: u64) -> Option<String> {
        if self.staleness.is_some() {
            return None;
        }
        let default = self.ssp_staleness();
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

/// `--staleness`: at most 1000 (asap, ssp and bosen alike: the rule of the shared staleness
/// group, checked where the value is parsed).
fn staleness_bound(s: &str) -> Result<u64, String> {
    let v: u64 = s.trim().parse().map_err(|_| format!("expected a number of clocks >= 0, got {s:?}"))?;
    if v <= 1000 {
        Ok(v)
    } else {
        Err(format!("{v} is too large (at most 1000: each step of it costs a model-sized slot per edge under asap)"))
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
    uses: &[(&[], &["SspOptions"])],
    resolve: |o| o.ssp.fill_defaults(false),
    fit_to_epoch: |o, rounds| o.ssp.fit_to_epoch(rounds),
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
    PsSettings { staleness: o.ssp.ssp_staleness(), apply: o.ssp.apply_rule(false), policy: PolicySettings::Plain }
}

fn ssp_counts(ctx: &SyncContext, run: &RunSpec, init: &[f32]) -> anyhow::Result<Box<dyn SyncMode>> {
    build_counts(ctx, settings(run.opts), run.opts.ssp.apply, init)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_staleness_is_bounded_by_an_epoch_and_a_given_one_is_kept() {
        let mut o = SspOptions::default();
        assert!(o.fit_to_epoch(4).is_none() && o.staleness.is_none(), "4 rounds an epoch: the default 3 stands");
        let why = o.fit_to_epoch(2).expect("2 rounds an epoch bound it");
        assert_eq!(o.ssp_staleness(), 1, "{why}");
        let mut o = SspOptions::default();
        o.fit_to_epoch(1);
        assert_eq!(o.ssp_staleness(), 0, "one round an epoch: BSP");
        let mut o = SspOptions { staleness: Some(3), ..SspOptions::default() };
        assert!(o.fit_to_epoch(1).is_none() && o.ssp_staleness() == 3, "given: kept");
    }
}
