//! The parameter-server engine's settings: the staleness bound, the apply rule and the send
//! policy (Bosen §3.1-3.3). The mode declarations (ssp.rs, bosen.rs) build them from their
//! option groups; the engine reads no mode's options struct.

use super::managed::ManagedSettings;
use super::server::ApplyRule;

/// The staleness bound of the parameter-server modes (ssp, bosen) where `--staleness` is not
/// given: Bösen's Table 3 runs S = 3 (bounded by the rounds of an epoch:
/// [`crate::sync::groups::StalenessOptions::fit_to_epoch`]).
pub const DEFAULT_STALENESS: u64 = 3;

/// What the engine runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct PsSettings {
    /// The staleness bound S (0: BSP).
    pub staleness: u64,
    /// How the shard servers apply updates.
    pub apply: ApplyRule,
    pub policy: PolicySettings,
}

/// Which send policy the engine is given.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicySettings {
    /// Plain SSP: nothing sent between clocks.
    Plain,
    /// Bösen's managed communication.
    Managed(ManagedSettings),
}

impl PolicySettings {
    /// `--compress fp16`: updates pushed as binary16.
    pub fn fp16(&self) -> bool {
        matches!(self, PolicySettings::Managed(m) if m.fp16)
    }

    /// `--lr-schedule adarevision`'s alpha, when the servers apply AdaRevision steps.
    pub fn adarevision(&self) -> Option<f32> {
        match self {
            PolicySettings::Plain => None,
            PolicySettings::Managed(m) => m.adarevision,
        }
    }

    /// The per-rank budget in Mbit/s the rank's sends are paced at (the emulated link's rate
    /// `emulated`, when managed communication was given none), after the policy's rules on
    /// `apply`; None: not paced by the policy.
    pub fn budget(&self, apply: ApplyRule, emulated: Option<f64>) -> anyhow::Result<Option<f64>> {
        let PolicySettings::Managed(m) = self else { return Ok(None) };
        if apply == ApplyRule::Dynsgd {
            anyhow::bail!("--sync bosen pushes parts of a clock's update early, which DynSGD's per-version bookkeeping does not define: use --apply consgd (the default for bosen) or plain");
        }
        let rate = m.bandwidth_mbps.or(emulated).ok_or_else(|| {
            anyhow::anyhow!(
                "--sync bosen needs a per-rank budget: --bandwidth-mbps MBPS (or --emulate-bandwidth, which it then defaults to)"
            )
        })?;
        Ok(Some(rate))
    }
}

impl PsSettings {
    /// The settings for `--model lda`'s count deltas, which the servers must add as they are
    /// (`--apply plain`), exactly; `given`: the `--apply` given.
    pub fn for_counts(self, given: Option<ApplyRule>) -> anyhow::Result<Self> {
        anyhow::ensure!(
            given.is_none_or(|a| a == ApplyRule::Plain),
            "--model lda pushes count deltas that the servers must add as they are: --apply plain (the default for lda), not {:?}",
            given.expect("checked")
        );
        if let PolicySettings::Managed(m) = &self.policy {
            anyhow::ensure!(
                !m.fp16,
                "--compress fp16 with --model lda: binary16 holds integers exactly only up to 2048, and count deltas must arrive exactly"
            );
            anyhow::ensure!(m.adarevision.is_none(), "--lr-schedule adarevision with --model lda: a Gibbs sampler takes no gradient steps");
        }
        Ok(PsSettings { apply: ApplyRule::Plain, ..self })
    }
}
