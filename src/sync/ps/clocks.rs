//! The clock bookkeeping a parameter server keeps of its workers (an ssp or bosen shard server,
//! the async coordinator): how many clocks each worker has completed there, the slowest of them
//! (`cmin`, what the staleness bounds and the release predicates compare against), and the
//! evaluation snapshots that the slowest clock releases (the model of round r once every
//! worker's updates of clocks < r are in, taken without stopping anybody).
//!
//! gaia's mirror clocks ([`crate::sync::gaia::MirrorClocks`]) are not this: they count clocks per
//! data centre, leave out their own, and also track the clocks announced by selective barriers.

use std::collections::BTreeMap;

/// Clocks completed per worker, and the slowest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerClocks {
    done: Vec<u64>,
    /// The smallest of `done` (0 with no workers), kept as `done` changes.
    min: u64,
}

impl WorkerClocks {
    /// `n` workers at clock 0.
    pub fn new(n: usize) -> Self {
        WorkerClocks { done: vec![0; n], min: 0 }
    }

    /// The clocks given per worker (from a checkpoint, or a test's table).
    pub fn from_clocks(done: Vec<u64>) -> Self {
        let min = done.iter().copied().min().unwrap_or(0);
        WorkerClocks { done, min }
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.done.len()
    }

    /// True with no workers.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }

    /// Clocks worker `m` has completed (= the clock of its next update).
    pub fn of(&self, m: usize) -> u64 {
        self.done[m]
    }

    /// Every worker's clocks, in worker order.
    pub fn all(&self) -> &[u64] {
        &self.done
    }

    /// The slowest worker's clock.
    pub fn min(&self) -> u64 {
        self.min
    }

    /// The fastest worker's clock.
    pub fn max(&self) -> u64 {
        self.done.iter().copied().max().unwrap_or(0)
    }

    /// Worker `m` completed one more clock. Returns whether the slowest clock rose.
    pub fn complete(&mut self, m: usize) -> bool {
        self.done[m] += 1;
        let min = self.done.iter().copied().min().unwrap_or(0);
        let rose = min != self.min;
        self.min = min;
        rose
    }

    /// How many clocks worker `m` is ahead of the slowest.
    pub fn lead_over_slowest(&self, m: usize) -> u64 {
        self.done[m] - self.min
    }

    /// Workers that have completed fewer than `clock` clocks.
    pub fn behind(&self, clock: u64) -> Vec<usize> {
        (0..self.len()).filter(|&m| self.done[m] < clock).collect()
    }

    /// Workers at the slowest clock.
    pub fn slowest(&self) -> Vec<usize> {
        (0..self.len()).filter(|&m| self.done[m] == self.min).collect()
    }
}

/// Evaluation snapshots of a server's model: round -> how many evaluations want it, and the model
/// once the slowest clock has reached the round (None until then). Two evaluations may want the
/// same round: with `--sync-every` above an epoch's steps, two epochs can end before a clock
/// completes (bosen at 16 steps an epoch and `--sync-every 40` marked round 0 twice; the first
/// take removed it and the second evaluation waited for it until `--wait-timeout`).
#[derive(Debug, Default)]
pub struct EvalSnapshots {
    by_round: BTreeMap<u64, (usize, Option<Vec<f32>>)>,
}

impl EvalSnapshots {
    /// The model of `round` is wanted (once more): taken now when the slowest clock `min` has
    /// reached it, else by [`EvalSnapshots::release`] when it does.
    pub fn mark(&mut self, round: u64, min: u64, model: &[f32]) {
        let (wanted, snap) = self.by_round.entry(round).or_insert((0, None));
        *wanted += 1;
        if snap.is_none() && min >= round {
            *snap = Some(model.to_vec());
        }
    }

    /// The slowest clock is now `min`: every wanted round up to it takes `model`.
    pub fn release(&mut self, min: u64, model: &[f32]) {
        for (&round, (_, snap)) in self.by_round.iter_mut() {
            if snap.is_none() && round <= min {
                *snap = Some(model.to_vec());
            }
        }
    }

    /// Whether the model of `round` has been taken.
    pub fn ready(&self, round: u64) -> bool {
        self.by_round.get(&round).is_some_and(|x| x.1.is_some())
    }

    /// The model of `round`, once [`EvalSnapshots::ready`]; forgets it when no other evaluation
    /// wants it.
    pub fn take(&mut self, round: u64) -> Option<Vec<f32>> {
        let (wanted, snap) = self.by_round.get_mut(&round)?;
        let model = snap.clone()?;
        *wanted -= 1;
        if *wanted == 0 {
            self.by_round.remove(&round);
        }
        Some(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_clock_follows_the_workers_and_releases_snapshots() {
        let mut c = WorkerClocks::new(3);
        let mut s = EvalSnapshots::default();
        s.mark(1, c.min(), &[0.0]);
        s.mark(2, c.min(), &[0.0]);
        assert!(!c.complete(0), "workers 1 and 2 are still at 0");
        assert!(!c.complete(0));
        assert_eq!((c.min(), c.max(), c.lead_over_slowest(0)), (0, 2, 2));
        assert_eq!((c.behind(1), c.slowest()), (vec![1, 2], vec![1, 2]));
        assert!(!c.complete(1));
        assert!(c.complete(2), "every worker has one clock now");
        s.release(c.min(), &[1.0]);
        assert!(s.ready(1) && !s.ready(2));
        assert_eq!(s.take(1), Some(vec![1.0]));
        assert_eq!(s.take(1), None, "taken once");
        // Wanted twice (two epochs ended at the same round): taken twice, then forgotten.
        s.mark(3, c.min(), &[3.0]);
        s.mark(3, c.min(), &[3.0]);
        assert_eq!((s.ready(3), s.take(3)), (false, None), "not before the slowest clock reaches 3");
        s.release(3, &[4.0]);
        assert_eq!((s.take(3), s.take(3), s.take(3)), (Some(vec![4.0]), Some(vec![4.0]), None));
        // A snapshot of a round the slowest clock already passed is taken at once.
        s.mark(1, c.min(), &[5.0]);
        assert_eq!(s.take(1), Some(vec![5.0]));
        let r = WorkerClocks::from_clocks(vec![4, 2, 3]);
        assert_eq!((r.min(), r.max(), r.slowest(), r.all()), (2, 4, vec![1], &[4, 2, 3][..]));
        assert_eq!(WorkerClocks::new(0).min(), 0);
    }
}
