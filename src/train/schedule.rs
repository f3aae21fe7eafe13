//! Step-size schedules, and the slow-down of straggling ranks (`--straggler`).

use crate::config::{parse_straggler, LrSchedule};
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
            Some(s) => s.trim().parse::<u64>().map_err(|_| anyhow::anyhow!("expected --straggler production or production:SEED, got {spec:?}"))?,
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

/// Step size for mini-batch `t` (0-based, counted on this rank) in `epoch`, with `batch`
/// examples per mini-batch.
pub fn step_size(kind: LrSchedule, eta0: f32, lambda: f32, decay: f32, t: u64, epoch: usize, batch: usize) -> f32 {
    match kind {
        LrSchedule::Constant => eta0,
        LrSchedule::InvSqrt => eta0 / ((1 + t) as f32).sqrt(),
        // Bottou counts examples, so the schedule does not change with the batch size.
        LrSchedule::Bottou => eta0 / (1.0 + lambda * eta0 * (t as f32 * batch as f32)),
        LrSchedule::Decay => eta0 * decay.powi(epoch as i32),
        // The client's steps are converted back to gradients (divided by eta0) by the servers,
        // which choose the step sizes.
        LrSchedule::Adarevision => eta0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules() {
        assert_eq!(step_size(LrSchedule::Constant, 0.5, 0.1, 0.9, 100, 3, 8), 0.5);
        assert!((step_size(LrSchedule::InvSqrt, 1.0, 0.0, 0.9, 3, 0, 8) - 0.5).abs() < 1e-7);
        assert!((step_size(LrSchedule::Bottou, 1.0, 0.1, 0.9, 10, 0, 1) - 0.5).abs() < 1e-7);
        assert!((step_size(LrSchedule::Decay, 1.0, 0.0, 0.5, 0, 2, 1) - 0.25).abs() < 1e-7);
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
