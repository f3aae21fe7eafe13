//! Step-size schedules (`--lr-schedule`, `--warmup-epochs`), and the slow-down of straggling
//! ranks (`--straggler`).
//!
//! Cosine decay (Loshchilov & Hutter's SGDR without restarts, PyTorch's CosineAnnealingLR with
//! eta_min 0) runs from the end of the warm-up to the run's last mini-batch, counted over all
//! `--epochs` (not `--max-rounds`, which stops one invocation of a run that `--resume` goes on
//! with). The warm-up is linear, as Goyal et al.'s for large mini-batches: step t of W takes
//! (t+1)/W of the schedule's step, so the first step is small but not zero.

use crate::config::{parse_straggler, LrSchedule, TrainConfig, MAX_STRAGGLER_FACTOR};
use crate::rng::Rng;

/// Every rank's compute slow-down factor (1 = full speed) from a `--straggler` form:
/// - `RANKS:FACTOR`, e.g. `0,3:2` or `1-5:2.5`: those ranks FACTOR x slower;
/// - `delay:P` or `delay:P@RANK`: the ASYNC paper's controlled delay, one worker (default the last
///   rank) delayed by P % (0-100) of its iteration time, i.e. factor 1 + P/100;
/// - `production` or `production:SEED`: the paper's production-cluster pattern: 25 % of the ranks
///   (rounded) straggle, 80 % of those (rounded) by a factor drawn uniformly from 1.5-2.5 and the
///   rest, the long tail, from 2.5-10; ranks and factors drawn once from SEED (default `--seed`).
///
/// Rank 0 is never drawn and is the last choice of `delay`: under `--sync async` it hosts the
/// coordinator, whose sleeping would stall every worker; the same ranks are slowed in every mode.
pub fn straggler_factors(spec: &str, nranks: usize, seed: u64) -> anyhow::Result<Vec<f64>> {
    let mut f = vec![1.0; nranks];
    if let Some(rest) = spec.strip_prefix("delay:") {
        let hint = "expected --straggler delay:P or delay:P@RANK with P in 0..100 (percent of an iteration)";
        let (p, rank) = match rest.split_once('@') {
            Some((p, r)) => (p, r.trim().parse::<usize>().map_err(|_| anyhow::anyhow!("{hint}: bad rank {r:?}"))?),
            None => (rest, nranks - 1),
        };
        let p: f64 = p.trim().parse().map_err(|_| anyhow::anyhow!("{hint}: bad percentage {p:?}"))?;
        anyhow::ensure!((0.0..=100.0).contains(&p), "{hint}, got {p}");
        anyhow::ensure!(rank < nranks, "{hint}: rank {rank} is outside 0..{}", nranks - 1);
        f[rank] = 1.0 + p / 100.0;
    } else if spec == "production" || spec.starts_with("production:") {
        let seed = match spec.strip_prefix("production:") {
            Some(s) => {
                s.trim().parse::<u64>().map_err(|_| anyhow::anyhow!("expected --straggler production or production:SEED, got {spec:?}"))?
            }
            None => seed,
        };
        let mut rng = Rng::new(seed ^ 0x5354_5241_4747_4c45);
        let mut candidates: Vec<usize> = (1..nranks).collect();
        rng.shuffle(&mut candidates);
        let stragglers = ((nranks as f64 * 0.25).round() as usize).min(candidates.len());
        let moderate = (stragglers as f64 * 0.8).round() as usize;
        for (i, &r) in candidates[..stragglers].iter().enumerate() {
            let (lo, hi) = if i < moderate { (1.5, 2.5) } else { (2.5, 10.0) };
            f[r] = lo + (hi - lo) * rng.next_f64();
        }
    } else {
        let (ranks, factor) = parse_straggler(spec, nranks)?;
        ranks.into_iter().for_each(|r| f[r] = factor);
    }
    Ok(f)
}

/// Every rank's slow-down over time (`--straggler`): the fixed forms of [`straggler_factors`],
/// plus two that change with the round:
/// - `RANKS:FACTOR@A-B`: those ranks are FACTOR x slower from round A to round B (inclusive)
///   and recover after (a machine busy with something else for a while);
/// - `transient:FACTOR:ROUNDS[:SEED]`: every stretch of ROUNDS rounds one rank drawn at random
///   (seeded; never rank 0, as for `production`) is FACTOR x slower (the heterogeneity paper's
///   transient stragglers of a shared production cluster).
#[derive(Clone, Debug, PartialEq)]
pub enum StragglerPlan {
    Fixed(Vec<f64>),
    Window { factors: Vec<f64>, from: u64, to: u64 },
    Transient { factor: f64, rounds: u64, seed: u64, nranks: usize },
}

impl StragglerPlan {
    /// Parses a `--straggler` form for `nranks` ranks (`seed`: the run's, for the seeded forms).
    pub fn parse(spec: &str, nranks: usize, seed: u64) -> anyhow::Result<StragglerPlan> {
        if let Some(rest) = spec.strip_prefix("transient:") {
            let hint = "expected --straggler transient:FACTOR:ROUNDS[:SEED] (one random rank FACTOR x slower per ROUNDS rounds)";
            let mut it = rest.split(':');
            let text = it.next().unwrap_or("").trim();
            let factor: f64 = text.parse().map_err(|_| anyhow::anyhow!("{hint}, got {spec:?}"))?;
            anyhow::ensure!(
                factor.is_finite() && (1.0..=MAX_STRAGGLER_FACTOR).contains(&factor),
                "{hint}: FACTOR must be in 1..{MAX_STRAGGLER_FACTOR}, got {text}"
            );
            let rounds: u64 = it.next().unwrap_or("").trim().parse().map_err(|_| anyhow::anyhow!("{hint}, got {spec:?}"))?;
            anyhow::ensure!(rounds > 0, "{hint}: ROUNDS must be positive");
            let seed = match it.next() {
                Some(s) => s.trim().parse().map_err(|_| anyhow::anyhow!("{hint}: bad SEED {s:?}"))?,
                None => seed,
            };
            anyhow::ensure!(it.next().is_none(), "{hint}, got {spec:?}");
            anyhow::ensure!(nranks > 1, "--straggler {spec}: a transient straggler needs 2 or more ranks (rank 0 is never drawn)");
            return Ok(StragglerPlan::Transient { factor, rounds, seed, nranks });
        }
        if let (Some((fixed, window)), false) = (spec.rsplit_once('@'), spec.starts_with("delay:")) {
            let hint = "expected --straggler RANKS:FACTOR@A-B (slowed from round A to round B)";
            let (a, b) = window.split_once('-').ok_or_else(|| anyhow::anyhow!("{hint}, got {spec:?}"))?;
            let parse = |x: &str| x.trim().parse::<u64>().map_err(|_| anyhow::anyhow!("{hint}: bad round {x:?}"));
            let (from, to) = (parse(a)?, parse(b)?);
            anyhow::ensure!(from >= 1 && from <= to, "{hint}: need 1 <= A <= B, got {window}");
            let factors = straggler_factors(fixed, nranks, seed)?;
            return Ok(StragglerPlan::Window { factors, from, to });
        }
        Ok(StragglerPlan::Fixed(straggler_factors(spec, nranks, seed)?))
    }

    /// No straggler.
    pub fn none(nranks: usize) -> StragglerPlan {
        StragglerPlan::Fixed(vec![1.0; nranks])
    }

    /// The slow-down of `rank` during round `round` (counted from 1: the round its step belongs to).
    pub fn factor(&self, rank: usize, round: u64) -> f64 {
        match self {
            StragglerPlan::Fixed(f) => f[rank],
            StragglerPlan::Window { factors, from, to } => {
                if (*from..=*to).contains(&round) {
                    factors[rank]
                } else {
                    1.0
                }
            }
            StragglerPlan::Transient { factor, rounds, seed, nranks } => {
                let stretch = round.saturating_sub(1) / rounds;
                let mut r = Rng::for_stream(*seed ^ 0x5452_414e_5349_454e, stretch + 1);
                let slow = 1 + (r.next_f64() * (*nranks - 1) as f64) as usize;
                if rank == slow.min(nranks - 1) {
                    *factor
                } else {
                    1.0
                }
            }
        }
    }

    /// The largest slow-down any rank ever has (what bounds the rounds' pace).
    pub fn max_factor(&self) -> f64 {
        match self {
            StragglerPlan::Fixed(f) | StragglerPlan::Window { factors: f, .. } => f.iter().copied().fold(1.0, f64::max),
            StragglerPlan::Transient { factor, .. } => *factor,
        }
    }

    /// A line for the start of the run.
    pub fn describe(&self) -> String {
        let list = |f: &[f64]| {
            let slowed: Vec<String> = (0..f.len()).filter(|&r| f[r] != 1.0).map(|r| format!("{r}: x{:.2}", f[r])).collect();
            if slowed.is_empty() {
                "none".to_string()
            } else {
                slowed.join(", ")
            }
        };
        match self {
            StragglerPlan::Fixed(f) => list(f),
            StragglerPlan::Window { factors, from, to } => format!("{} during rounds {from}-{to}", list(factors)),
            StragglerPlan::Transient { factor, rounds, .. } => format!("one random rank (not 0) x{factor:.2} per {rounds} rounds"),
        }
    }
}

/// The step size of each mini-batch of a run on a rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepSchedule {
    pub kind: LrSchedule,
    pub eta0: f32,
    /// `--lambda` (Bottou's schedule reads it).
    pub lambda: f32,
    /// `--lr-decay`'s per-epoch factor.
    pub decay: f32,
    /// Examples per mini-batch.
    pub batch: usize,
    /// Mini-batches of the linear warm-up (0: none).
    pub warmup_steps: u64,
    /// Mini-batches of the whole run on a rank (cosine's step reaches 0 there).
    pub total_steps: u64,
}

impl StepSchedule {
    /// The schedule of a run of `cfg` with `steps_per_epoch` mini-batches per epoch on a rank.
    pub fn new(cfg: &TrainConfig, steps_per_epoch: usize) -> StepSchedule {
        StepSchedule {
            kind: cfg.lr_schedule,
            eta0: cfg.lr,
            lambda: cfg.lambda,
            decay: cfg.lr_decay,
            batch: cfg.batch_size,
            warmup_steps: (cfg.warmup_epochs * steps_per_epoch as f64).round() as u64,
            total_steps: (cfg.epochs * steps_per_epoch) as u64,
        }
    }

    /// Step size for mini-batch `t` (0-based, counted on this rank) in `epoch`.
    pub fn at(&self, t: u64, epoch: usize) -> f32 {
        let eta0 = self.eta0;
        let eta = match self.kind {
            LrSchedule::Constant => eta0,
            LrSchedule::InvSqrt => eta0 / ((1 + t) as f32).sqrt(),
            // Bottou counts examples, so the schedule does not change with the batch size.
            LrSchedule::Bottou => eta0 / (1.0 + self.lambda * eta0 * (t as f32 * self.batch as f32)),
            LrSchedule::Decay => eta0 * self.decay.powi(epoch as i32),
            LrSchedule::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
                let progress = (t.saturating_sub(self.warmup_steps) as f64 / span as f64).min(1.0);
                (eta0 as f64 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())) as f32
            }
            // The client's steps are converted back to gradients (divided by eta0) by the servers,
            // which choose the step sizes.
            LrSchedule::Adarevision => eta0,
        };
        if t < self.warmup_steps {
            eta * ((t + 1) as f64 / self.warmup_steps as f64) as f32
        } else {
            eta
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(kind: LrSchedule, eta0: f32, lambda: f32, decay: f32, batch: usize) -> StepSchedule {
        StepSchedule { kind, eta0, lambda, decay, batch, warmup_steps: 0, total_steps: 1000 }
    }

    #[test]
    fn schedules() {
        assert_eq!(schedule(LrSchedule::Constant, 0.5, 0.1, 0.9, 8).at(100, 3), 0.5);
        assert!((schedule(LrSchedule::InvSqrt, 1.0, 0.0, 0.9, 8).at(3, 0) - 0.5).abs() < 1e-7);
        assert!((schedule(LrSchedule::Bottou, 1.0, 0.1, 0.9, 1).at(10, 0) - 0.5).abs() < 1e-7);
        assert!((schedule(LrSchedule::Decay, 1.0, 0.0, 0.5, 1).at(0, 2) - 0.25).abs() < 1e-7);
    }

    /// Cosine after a linear warm-up, at steps whose values are known in closed form: warm-up
    /// step t of W is (t+1)/W of eta0; then eta0 (1 + cos(pi p)) / 2 with p the fraction of the
    /// decay done: eta0 at its start, eta0/2 half-way, eta0 (2 - sqrt 2)/4 at three quarters,
    /// and 0 at the run's end.
    #[test]
    fn cosine_after_a_linear_warm_up() {
        let s = StepSchedule { warmup_steps: 10, total_steps: 110, ..schedule(LrSchedule::Cosine, 0.4, 0.0, 0.9, 8) };
        let close = |t: u64, want: f64| {
            let got = s.at(t, 0) as f64;
            assert!((got - want).abs() < 1e-7, "step {t}: {got} against {want}");
        };
        close(0, 0.04);
        close(4, 0.2);
        close(9, 0.4);
        close(10, 0.4);
        close(60, 0.2);
        close(85, 0.4 * (2.0 - 2f64.sqrt()) / 4.0);
        close(110, 0.0);
        close(500, 0.0);
        assert!(s.at(109, 0) > 0.0 && s.at(109, 0) < 1e-3, "the last step is small but not zero");
        assert!((10..110).all(|t| s.at(t + 1, 0) <= s.at(t, 0)), "decreasing after the warm-up");
        // Warm-up in front of another schedule scales it; without one every schedule is as before.
        let d = StepSchedule { warmup_steps: 4, ..schedule(LrSchedule::Decay, 1.0, 0.0, 0.5, 1) };
        assert_eq!((d.at(1, 0), d.at(3, 0), d.at(4, 1)), (0.5, 1.0, 0.5));
        let cfg = TrainConfig { epochs: 4, warmup_epochs: 0.5, lr_schedule: LrSchedule::Cosine, ..TrainConfig::default() };
        let from_cfg = StepSchedule::new(&cfg, 30);
        assert_eq!((from_cfg.warmup_steps, from_cfg.total_steps), (15, 120));
    }

    #[test]
    fn time_varying_straggler_forms() {
        let w = StragglerPlan::parse("0-1:2@5-7", 4, 0).unwrap();
        assert_eq!((w.factor(0, 4), w.factor(0, 5), w.factor(1, 7), w.factor(1, 8), w.factor(2, 6)), (1.0, 2.0, 2.0, 1.0, 1.0));
        assert_eq!(w.max_factor(), 2.0);
        let t = StragglerPlan::parse("transient:3:10", 8, 42).unwrap();
        // One rank, never 0, slowed in every stretch of 10 rounds, the same within a stretch.
        let mut seen = std::collections::BTreeSet::new();
        for stretch in 0..50u64 {
            let slow: Vec<usize> = (0..8).filter(|&r| t.factor(r, stretch * 10 + 1) == 3.0).collect();
            assert_eq!(slow.len(), 1);
            assert_ne!(slow[0], 0);
            assert!((1..=10).all(|k| t.factor(slow[0], stretch * 10 + k) == 3.0));
            seen.insert(slow[0]);
        }
        assert_eq!(seen.len(), 7, "every rank but 0 is drawn in 50 stretches: {seen:?}");
        assert_eq!(t, StragglerPlan::parse("transient:3:10:42", 8, 7).unwrap());
        assert_eq!(StragglerPlan::parse("1:2", 2, 0).unwrap(), StragglerPlan::Fixed(vec![1.0, 2.0]));
        assert!(matches!(StragglerPlan::parse("delay:30@1", 2, 0).unwrap(), StragglerPlan::Fixed(_)));
        for bad in
            ["transient:0.5:10", "transient:2:0", "transient:2", "transient:nan:3", "0:2@0-3", "0:2@5-3", "0:2@x", "transient:2:5:1:1"]
        {
            assert!(StragglerPlan::parse(bad, 4, 0).is_err(), "{bad}");
        }
        assert!(StragglerPlan::parse("transient:2:5", 1, 0).is_err());
    }

    #[test]
    fn straggler_forms() {
        assert_eq!(straggler_factors("1,3:2", 4, 0).unwrap(), vec![1.0, 2.0, 1.0, 2.0]);
        assert_eq!(straggler_factors("delay:100", 8, 0).unwrap()[7], 2.0);
        assert_eq!(straggler_factors("delay:30@2", 8, 0).unwrap(), vec![1.0, 1.0, 1.3, 1.0, 1.0, 1.0, 1.0, 1.0]);
        for bad in ["delay:101", "delay:-5", "delay:50@8", "delay:x", "production:x", "8:2", "0:0.5"] {
            assert!(straggler_factors(bad, 8, 0).is_err(), "{bad}");
        }
        // 32 ranks: 8 stragglers, 6 at 1.5-2.5 and 2 in the long tail, never rank 0; seeded.
        let f = straggler_factors("production", 32, 7).unwrap();
        assert_eq!(f, straggler_factors("production:7", 32, 99).unwrap());
        assert_ne!(f, straggler_factors("production:8", 32, 7).unwrap());
        assert_eq!(f[0], 1.0);
        let moderate = f.iter().filter(|&&x| (1.5..2.5).contains(&x)).count();
        let tail = f.iter().filter(|&&x| (2.5..=10.0).contains(&x)).count();
        assert_eq!((moderate, tail, f.iter().filter(|&&x| x == 1.0).count()), (6, 2, 24));
        assert_eq!(straggler_factors("production", 1, 7).unwrap(), vec![1.0]);
    }
}
