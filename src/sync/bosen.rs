//! `--sync bosen`: SSP plus Bosen's managed communication (Bosen §3.3) and AdaRevision (§3.4).
//!
//! The protocol is the SSP mode's ([`super::ssp`]): this file holds what management adds to it,
//! as plain data and arithmetic the SSP engine calls:
//! - the options ([`BosenOptions`]);
//! - which buffered rows go first when spare bandwidth allows a send ([`Priority`], [`pick`]);
//! - half-precision pushes of updates (encoded by the row codec, [`super::codec::fp16::f16_bits`]),
//!   whose rounding error stays in the client's buffer;
//! - AdaRevision's per-coordinate step ([`AdaRevision`]), run by the shard servers.
//!
//! The budget itself is a [`crate::comm::pace::Pacer`] on the rank's postbox: every message (the
//! mandatory end-of-clock ones too) leaves at no more than `--bandwidth-mbps`, and between clocks
//! a client or server sends its most significant buffered rows whenever the bucket is empty.

use crate::rng::Rng;

/// Which buffered rows spare bandwidth sends first (`--priority`, Bosen §3.3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    /// Rows in a random (seeded) order.
    Random,
    /// Rows in a fixed cyclic order, continuing where the last send stopped.
    RoundRobin,
    /// Largest accumulated change |delta| (L1 norm of the row's change) first.
    Absolute,
    /// Largest relative change |delta|/|a| first (a: the row's current value; |delta| where a = 0).
    Relative,
}

/// Options of `--sync bosen` (its SSP options are `--staleness` and `--apply`).
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(group = clap::ArgGroup::new("budget_group").multiple(true))]
#[command(next_help_heading = "Bosen managed communication (--sync bosen; --bandwidth-mbps and --priority also budget --sync asap)")]
pub struct BosenOptions {
    /// Per-rank bandwidth budget in Mbit/s (10^6 bits) for everything the rank sends. bosen:
    /// client and server together; spare budget between clocks sends the most significant
    /// updates early [default: --emulate-bandwidth when given; required otherwise]. asap: each
    /// round's message on an edge carries only the rows that fit, most significant first (per
    /// edge residuals keep the rest for later; needs --notify notify-ack) [default: no budget].
    #[arg(long, value_name = "MBPS", value_parser = budget_mbps, group = "budget_group")]
    pub bandwidth_mbps: Option<f64>,
    /// Most rows in one bosen message (caps the burst of a send; end-of-clock pushes are split
    /// into messages of at most this many rows too). Bosen's Table 3 uses 100-5000. (asap's
    /// one message per edge and round takes every row that fits the budget.)
    #[arg(long, value_name = "ROWS", default_value_t = 100)]
    pub queue_size: usize,
    /// Which buffered rows go first: random, round-robin, absolute (|delta|) or relative
    /// (|delta/a|).
    #[arg(long, value_enum, default_value_t = Priority::Relative, group = "budget_group")]
    pub priority: Priority,
    /// Push updates as IEEE half-precision numbers (half the bytes); each value's rounding error
    /// stays in the buffer and goes out with a later push, so nothing is lost.
    #[arg(long)]
    pub fp16: bool,
    /// Most AdaRevision snapshots a shard server keeps (--lr-schedule adarevision); above it the
    /// server stops pushing rows between clocks until clients' reads free some.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_snapshots: usize,
}

/// `--bandwidth-mbps`: a finite, positive number of Mbit/s, at most 1e7 (asap's edges and bosen
/// alike: the rule of the shared budget group, checked where the value is parsed).
fn budget_mbps(s: &str) -> Result<f64, String> {
    let v = crate::values::finite_f64(s)?;
    if v > 0.0 && v <= 1e7 {
        Ok(v)
    } else {
        Err(format!("must be a positive number of Mbit/s (at most 1e7), got {s}"))
    }
}

impl Default for BosenOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// Cyclic position of the round-robin strategy, and the random strategy's generator.
#[derive(Clone, Debug)]
pub struct Picker {
    pub priority: Priority,
    pub cursor: usize,
    pub rng: Rng,
}

impl Picker {
    pub fn new(priority: Priority, seed: u64) -> Self {
        Picker { priority, cursor: 0, rng: Rng::new(seed) }
    }
}

/// Chooses at most `k` rows to send among `candidates`: (row, |delta|, |a|) with |delta| > 0,
/// in increasing row order; `rows` is the number of rows the cursor cycles over. Returns the rows
/// in the order they go out.
pub fn pick(picker: &mut Picker, candidates: &[(u32, f32, f32)], k: usize, rows: usize) -> Vec<u32> {
    if k == 0 || candidates.is_empty() {
        return Vec::new();
    }
    match picker.priority {
        Priority::Random => {
            let mut all: Vec<u32> = candidates.iter().map(|c| c.0).collect();
            // Partial Fisher-Yates: the first k of a uniform permutation.
            let k = k.min(all.len());
            for i in 0..k {
                let j = i + picker.rng.below(all.len() - i);
                all.swap(i, j);
            }
            all.truncate(k);
            all
        }
        Priority::RoundRobin => {
            let start = candidates.partition_point(|c| (c.0 as usize) < picker.cursor);
            let out: Vec<u32> = candidates[start..].iter().chain(&candidates[..start]).take(k).map(|c| c.0).collect();
            let last = *out.last().expect("k >= 1 and candidates");
            picker.cursor = (last as usize + 1) % rows.max(1);
            out
        }
        Priority::Absolute | Priority::Relative => {
            let relative = picker.priority == Priority::Relative;
            let score = |c: &(u32, f32, f32)| if relative && c.2 > 0.0 { c.1 / c.2 } else { c.1 };
            let mut scored: Vec<(f32, u32)> = candidates.iter().map(|c| (score(c), c.0)).collect();
            let k = k.min(scored.len());
            // Largest first; ties by row so the order is deterministic.
            let cmp = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
            if k < scored.len() {
                scored.select_nth_unstable_by(k - 1, cmp);
                scored.truncate(k);
            }
            scored.sort_unstable_by(cmp);
            scored.into_iter().map(|s| s.1).collect()
        }
    }
}

/// AdaRevision's per-coordinate state on a shard server (McMahan and Streeter, NIPS 2014, as
/// used by Bosen §3.4): the accumulated gradient, and the adaptive denominators z and z' = max z.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaRevision {
    /// alpha: the initial step size (`--lr`).
    pub alpha: f32,
    pub g_sum: Vec<f32>,
    pub z: Vec<f32>,
    pub z_max: Vec<f32>,
}

impl AdaRevision {
    /// State for `len` coordinates. z starts at 1 (as Bosen's implementation does), so the first
    /// step is alpha * g rather than alpha * sign(g).
    pub fn new(alpha: f32, len: usize) -> Self {
        AdaRevision { alpha, g_sum: vec![0.0; len], z: vec![1.0; len], z_max: vec![1.0; len] }
    }

    /// Applies gradient `g` to coordinates `at..at + g.len()` of `x`, computed by a client that
    /// read those coordinates when the accumulated gradient was `g_old` (its snapshot): the
    /// gradients applied since (the backlog g_bck = g_sum - g_old) enlarge the denominator, and
    /// the steps they were given are revised to the new, smaller step size:
    ///   eta_old = alpha / sqrt(z'),  z += g^2 + 2 g g_bck,  z' = max(z', z),  eta = alpha / sqrt(z'),
    ///   x += -eta g + (eta_old - eta) g_bck,  g_sum += g.
    pub fn apply(&mut self, x: &mut [f32], at: usize, g: &[f32], g_old: &[f32]) {
        for (i, (&gi, &old)) in g.iter().zip(g_old).enumerate() {
            let j = at + i;
            let bck = self.g_sum[j] - old;
            let eta_old = self.alpha / self.z_max[j].sqrt();
            self.z[j] += gi * gi + 2.0 * gi * bck;
            self.z_max[j] = self.z_max[j].max(self.z[j]);
            let eta = self.alpha / self.z_max[j].sqrt();
            x[i] += -eta * gi + (eta_old - eta) * bck;
            self.g_sum[j] += gi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands() -> Vec<(u32, f32, f32)> {
        // (row, |delta|, |a|)
        vec![(0, 1.0, 100.0), (2, 0.5, 0.0), (3, 3.0, 30.0), (5, 2.0, 1.0), (7, 0.1, 0.01)]
    }

    #[test]
    fn absolute_and_relative_order_by_significance() {
        let mut p = Picker::new(Priority::Absolute, 1);
        assert_eq!(pick(&mut p, &cands(), 3, 8), vec![3, 5, 0]);
        // Relative: 0.01, 0.5 (a = 0: absolute), 0.1, 2.0, 10.0.
        let mut p = Picker::new(Priority::Relative, 1);
        assert_eq!(pick(&mut p, &cands(), 5, 8), vec![7, 5, 2, 3, 0]);
        assert_eq!(pick(&mut p, &cands(), 2, 8), vec![7, 5]);
    }

    #[test]
    fn round_robin_continues_where_it_stopped_and_wraps() {
        let mut p = Picker::new(Priority::RoundRobin, 1);
        assert_eq!(pick(&mut p, &cands(), 2, 8), vec![0, 2]);
        assert_eq!(pick(&mut p, &cands(), 2, 8), vec![3, 5]);
        assert_eq!(pick(&mut p, &cands(), 2, 8), vec![7, 0]);
        assert_eq!(p.cursor, 1);
    }

    #[test]
    fn random_takes_distinct_rows_and_covers_all_over_time() {
        let mut p = Picker::new(Priority::Random, 7);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let out = pick(&mut p, &cands(), 2, 8);
            assert_eq!(out.len(), 2);
            assert_ne!(out[0], out[1]);
            seen.extend(out);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 2, 3, 5, 7]);
    }

    /// A hand-computed example: alpha = 1, z starts at 1.
    #[test]
    fn adarevision_revises_the_backlog() {
        let mut a = AdaRevision::new(1.0, 1);
        let mut x = [0.0f32];
        // Client A read at g_sum = 0 and pushes g = 1: no backlog. z = 1 + 1 = 2, eta = 1/sqrt 2.
        a.apply(&mut x, 0, &[1.0], &[0.0]);
        let e1 = 1.0 / 2f32.sqrt();
        assert!((x[0] + e1).abs() < 1e-6);
        // Client B also read at g_sum = 0 and pushes g = 1: backlog 1.
        // eta_old = 1/sqrt 2; z = 2 + 1 + 2 = 5; eta = 1/sqrt 5;
        // x = -e1 - eta * 1 + (eta_old - eta) * 1 = -2 eta.
        a.apply(&mut x, 0, &[1.0], &[0.0]);
        let eta = 1.0 / 5f32.sqrt();
        assert!((x[0] + 2.0 * eta).abs() < 1e-6, "{}", x[0]);
        assert_eq!(a.g_sum[0], 2.0);
        assert_eq!(a.z_max[0], 5.0);
        // A fresh read (g_old = g_sum) has no backlog: plain AdaGrad-like step.
        a.apply(&mut x, 0, &[-1.0], &[2.0]);
        let eta3 = 1.0 / 6f32.sqrt();
        assert!((x[0] - (-2.0 * eta + eta3)).abs() < 1e-6);
    }
}

/// `--sync bosen`'s declaration (see [`super::ModeSpec`]): ssp's parameter server (ssp.rs) with
/// its options, plus this file's managed communication.
pub const MODE: super::ModeSpec = super::ModeSpec {
    uses: &[(&[], &["SspOptions", "BosenOptions"])],
    server_steps: true,
    paces_sends: |_| true,
    validate: validate_bosen,
    resolve: |o| super::ssp::resolve_ps(o, true),
    fit_to_epoch: |o, rounds| o.ssp.fit_to_epoch(rounds),
    build_counts: Some(bosen_counts),
    ..super::ModeSpec::new(
        "bosen",
        "SSP plus Bosen's managed communication: a per-rank bandwidth budget spent between clocks on the most significant updates first (--bandwidth-mbps, --priority, --fp16)",
        |ctx, run, init| super::ssp::build_ps(ctx, run, init, true),
    )
};

fn validate_bosen(run: &super::RunSpec) -> anyhow::Result<()> {
    let o = run.opts;
    anyhow::ensure!(o.bosen.queue_size >= 1, "--queue-size must be at least 1 row");
    anyhow::ensure!(o.bosen.max_snapshots >= 1, "--max-snapshots must be at least 1");
    anyhow::ensure!(
        o.bosen.bandwidth_mbps.is_some() || run.emulated_link,
        "--sync bosen needs a per-rank budget: --bandwidth-mbps MBPS (or --emulate-bandwidth, which it then defaults to)"
    );
    anyhow::ensure!(
        o.ssp.apply != Some(super::ssp::ApplyRule::Dynsgd),
        "--sync bosen pushes parts of a clock's update early, which DynSGD's per-version bookkeeping does not define: use --apply consgd (the default for bosen) or plain"
    );
    Ok(())
}

fn bosen_counts(ctx: &super::SyncContext, run: &super::RunSpec, init: &[f32]) -> anyhow::Result<Box<dyn super::SyncMode>> {
    super::ssp::build_ps_counts(ctx, run, init, true)
}
