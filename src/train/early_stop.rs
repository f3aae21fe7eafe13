//! Early stopping by patience (`--patience P`): the run stops when the held-out metric of its
//! model has not improved for P evaluations in a row.
//!
//! The decision is collective without a collective of its own: every rank reads the same
//! evaluation (`eval::evaluate_batch` reduces it over the ranks), so every rank counts the same
//! evaluations without improvement and stops at the same one. An improvement is strict (a
//! metric equal to the best is not one), as Keras's EarlyStopping with min_delta 0. The state
//! (the best and the evaluations since) is checkpointed beside the optimizer's, so a resumed run
//! stops where the uninterrupted one does. `--save-model` writes the last model, not the best:
//! Keras's default (restore_best_weights false), and the model every other option reports.

use serde::Serialize;

use crate::model::MetricKind;
use crate::sync::ModeState;

/// The checkpoint's entry: [best metric (NaN: none yet), its round, its epoch, evaluations since].
const STATE_KEY: &str = "early_stop";

/// The best evaluation so far.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Best {
    pub metric: f64,
    pub round: u64,
    pub epoch: f64,
}

/// The patience count of a run with `--patience`.
#[derive(Clone, Debug, PartialEq)]
pub struct EarlyStop {
    patience: usize,
    kind: MetricKind,
    best: Option<Best>,
    since_best: usize,
}

/// What the summary says about early stopping.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct EarlyStopping {
    pub patience: usize,
    /// Whether the run stopped by it.
    pub stopped: bool,
    /// The best evaluation (null when none was evaluated).
    pub best: Option<Best>,
    /// Evaluations since the best.
    pub evaluations_since_best: usize,
}

impl EarlyStop {
    /// A count of `patience` evaluations of a `kind` metric.
    pub fn new(patience: usize, kind: MetricKind) -> EarlyStop {
        EarlyStop { patience, kind, best: None, since_best: 0 }
    }

    /// Counts an evaluation of the run's model: `metric` at `round` and `epoch`.
    pub fn observe(&mut self, metric: f64, round: u64, epoch: f64) {
        let better = match (self.best, self.kind) {
            _ if !metric.is_finite() => false,
            (None, _) => true,
            (Some(b), MetricKind::Accuracy) => metric > b.metric,
            (Some(b), MetricKind::Rmse) => metric < b.metric,
        };
        if better {
            self.best = Some(Best { metric, round, epoch });
            self.since_best = 0;
        } else {
            self.since_best += 1;
        }
    }

    /// Whether the run stops: `patience` evaluations without improvement.
    pub fn exhausted(&self) -> bool {
        self.since_best >= self.patience
    }

    /// The summary's record; `stopped`: the run ended by it.
    pub fn summary(&self, stopped: bool) -> EarlyStopping {
        EarlyStopping { patience: self.patience, stopped, best: self.best, evaluations_since_best: self.since_best }
    }

    /// The state for a checkpoint (stored beside the mode's and the optimizer's).
    pub fn save_state(&self) -> ModeState {
        let b = self.best.unwrap_or(Best { metric: f64::NAN, round: 0, epoch: 0.0 });
        vec![(STATE_KEY.into(), vec![b.metric, b.round as f64, b.epoch, self.since_best as f64])]
    }

    /// Whether the checkpoint entry `name` is the early-stopping count (the same on every rank,
    /// carried as it is at a resume on another rank count).
    pub fn averaged_on_resize(name: &str) -> bool {
        name == STATE_KEY
    }

    /// Takes the early-stopping entry out of a checkpoint's state (`this`: the run's count, None
    /// without --patience, which drops the entry). A checkpoint without one (written without
    /// --patience) starts the count afresh.
    pub fn restore_state(this: Option<&mut EarlyStop>, state: &mut ModeState) -> anyhow::Result<()> {
        let mine: Vec<(String, Vec<f64>)> = state.extract_if(.., |(k, _)| k == STATE_KEY).collect();
        let (Some(es), Some((_, v))) = (this, mine.first()) else { return Ok(()) };
        anyhow::ensure!(
            v.len() == 4,
            "the checkpoint's {STATE_KEY} entry holds {} values, not 4: it was not written by this program",
            v.len()
        );
        es.best = v[0].is_finite().then_some(Best { metric: v[0], round: v[1] as u64, epoch: v[2] });
        es.since_best = v[3] as usize;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_evaluations_without_a_strict_improvement() {
        let mut es = EarlyStop::new(2, MetricKind::Accuracy);
        es.observe(0.5, 1, 1.0);
        es.observe(0.6, 2, 2.0);
        es.observe(0.6, 3, 3.0);
        assert!(!es.exhausted());
        es.observe(f64::NAN, 4, 4.0);
        assert!(es.exhausted());
        assert_eq!(es.summary(true).best, Some(Best { metric: 0.6, round: 2, epoch: 2.0 }));
        let mut rmse = EarlyStop::new(1, MetricKind::Rmse);
        rmse.observe(2.0, 1, 1.0);
        rmse.observe(1.5, 2, 2.0);
        assert!(!rmse.exhausted());
        rmse.observe(1.7, 3, 3.0);
        assert!(rmse.exhausted());
        // Through a checkpoint's state, beside another entry that stays.
        let mut state = [vec![("awaiting".to_string(), vec![1.0])], es.save_state()].concat();
        let mut back = EarlyStop::new(2, MetricKind::Accuracy);
        EarlyStop::restore_state(Some(&mut back), &mut state).unwrap();
        assert_eq!((back, state.len()), (es, 1));
        let mut fresh = vec![("early_stop".to_string(), vec![f64::NAN, 0.0, 0.0, 0.0])];
        let mut none = EarlyStop::new(3, MetricKind::Accuracy);
        EarlyStop::restore_state(Some(&mut none), &mut fresh).unwrap();
        assert_eq!((none.best, fresh.len()), (None, 0));
    }
}
