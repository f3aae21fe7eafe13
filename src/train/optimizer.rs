//! How a rank steps (`--optimizer`): mini-batch SGD (the model's own step), or SAGA for linear
//! models with one stored scalar per example (Defazio et al. 2014; ASAGA when the sync mode's
//! predicate is asynchronous, Leblond et al. 2016).
//!
//! SAGA's step on a mini-batch B is `w -= lr * (mean_{i in B} (g_i(w) - h_i) + A + lambda w)`
//! where h_i is example i's gradient when it was last visited and A the mean of all stored h
//! over every rank's examples. For a linear model g_i(w) = s_i(w) (x_i, 1), with s_i the slope of
//! the loss at the margin, so storing s_i recovers h_i exactly (the ASYNC paper's "history
//! recovered from earlier models" without keeping them): memory is one f32 per example of this
//! rank's shard. A spans all ranks, so the sync mode keeps it: the step here leaves `lr * A` out
//! and hands the mode the change it made to A and the sum of its step sizes
//! ([`crate::sync::HistoryDelta`]); `--sync async`'s coordinator applies `-(step sum) * A / M`.

use crate::data::Dataset;
use crate::model::{row_axpy, MarginLoss, Model};
use crate::sync::{HistoryDelta, ModeState, SyncMode};

/// SAGA's state on one rank.
pub struct Saga {
    /// Per example of this rank's shard: the loss slope at the model it was last visited with
    /// (0 before its first visit: a zero stored gradient, so A starts at 0).
    slope: Vec<f32>,
    /// The change the steps since the last hand-over made to A (one value per parameter).
    mean_change: Vec<f32>,
    /// The sum of those steps' sizes.
    step_sum: f32,
    /// 1 / (examples over all ranks).
    inv_total: f32,
}

impl Saga {
    fn step(&mut self, m: &dyn MarginLoss, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, coef: &mut Vec<f32>) -> f64 {
        let d = m.features();
        coef.clear();
        let mut loss = 0.0;
        // Slopes at the model before the step, then g_i - h_i = (s_i - stored s_i) (x_i, 1).
        for &i in batch {
            let (l, s) = m.loss_slope(params, data, i);
            loss += l;
            coef.push(s);
        }
        for (c, &i) in coef.iter_mut().zip(batch) {
            let s = *c;
            *c = s - self.slope[i];
            self.slope[i] = s;
        }
        let decay = 1.0 - lr * m.lambda();
        if decay != 1.0 {
            params[..d].iter_mut().for_each(|w| *w *= decay);
        }
        let inv_b = 1.0 / batch.len() as f32;
        for (&i, &c) in batch.iter().zip(coef.iter()) {
            if c != 0.0 {
                row_axpy(data.row(i), -lr * c * inv_b, &mut params[..d]);
                params[d] -= lr * c * inv_b;
                row_axpy(data.row(i), c * self.inv_total, &mut self.mean_change[..d]);
                self.mean_change[d] += c * self.inv_total;
            }
        }
        self.step_sum += lr;
        loss * inv_b as f64
    }
}

/// The optimizer of a run.
pub enum Optimizer {
    Sgd,
    Saga(Saga),
}

impl Optimizer {
    /// SAGA when `saga` (the mode keeps its history: [`crate::sync::ModeSpec::keeps_history`]),
    /// else SGD; `local_examples` of this rank, `total_examples` over all ranks, `n_params`
    /// parameters.
    pub fn new(saga: bool, model: &dyn Model, local_examples: usize, total_examples: u64, n_params: usize) -> anyhow::Result<Self> {
        Ok(match saga {
            false => Optimizer::Sgd,
            true => {
                // The mode's declaration refuses SAGA for other models before any data is read;
                // an error rather than a panic keeps a caller that skipped it from hanging a job.
                let m = model.margin_loss().ok_or_else(|| {
                    anyhow::anyhow!("--optimizer saga needs a linear model (lsq, logreg, svm), not {:?}", model.spec().kind)
                })?;
                anyhow::ensure!(m.features() + 1 == n_params, "SAGA expects d weights and a bias");
                Optimizer::Saga(Saga {
                    slope: vec![0.0; local_examples],
                    mean_change: vec![0.0; n_params],
                    step_sum: 0.0,
                    inv_total: 1.0 / total_examples.max(1) as f32,
                })
            }
        })
    }

    /// One step on `batch`; returns the mean batch loss.
    pub fn step(&mut self, model: &dyn Model, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, scratch: &mut Vec<f32>) -> f64 {
        match self {
            Optimizer::Sgd => model.sgd_step(params, data, batch, lr, scratch),
            Optimizer::Saga(s) => s.step(model.margin_loss().expect("checked in new"), params, data, batch, lr, scratch),
        }
    }

    /// Before a round's `sync`: hands what the steps left for the mode over, and starts anew.
    pub fn hand_over(&mut self, sync: &mut dyn SyncMode) -> anyhow::Result<()> {
        if let Optimizer::Saga(s) = self {
            sync.history(HistoryDelta { mean_change: &s.mean_change, step_sum: s.step_sum })?;
            s.mean_change.iter_mut().for_each(|x| *x = 0.0);
            s.step_sum = 0.0;
        }
        Ok(())
    }

    /// This rank's optimizer state for a checkpoint (stored beside the mode's, names `saga_*`).
    pub fn save_state(&self) -> ModeState {
        match self {
            Optimizer::Sgd => Vec::new(),
            Optimizer::Saga(s) => vec![("saga_slope".into(), s.slope.iter().map(|&x| x as f64).collect())],
        }
    }

    /// Takes this optimizer's entries out of a checkpoint's state (the rest is the mode's).
    pub fn restore_state(&mut self, state: &mut ModeState) -> anyhow::Result<()> {
        let mine: Vec<(String, Vec<f64>)> = state.extract_if(.., |(k, _)| k.starts_with("saga_")).collect();
        match self {
            Optimizer::Sgd => anyhow::ensure!(mine.is_empty(), "the checkpoint holds SAGA state but this run uses --optimizer sgd"),
            Optimizer::Saga(s) => {
                let slope = mine
                    .iter()
                    .find(|(k, _)| k == "saga_slope")
                    .map(|(_, v)| v)
                    .ok_or_else(|| anyhow::anyhow!("the checkpoint holds no SAGA history (it was written with --optimizer sgd)"))?;
                anyhow::ensure!(
                    slope.len() == s.slope.len(),
                    "the checkpoint's SAGA history has {} examples, this rank's shard {}",
                    slope.len(),
                    s.slope.len()
                );
                s.slope = slope.iter().map(|&x| x as f32).collect();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Features;
    use crate::model::{build, ModelKind, ModelSpec};
    use crate::rng::Rng;

    /// A noisy least-squares problem; returns (data, objective at the optimum found by many
    /// exact gradient steps).
    fn problem(rng: &mut Rng) -> (Dataset, Box<dyn Model>, f64) {
        let (n, d) = (200, 5);
        let truth: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
        let mut x = Vec::new();
        let mut y = Vec::new();
        for _ in 0..n {
            let row: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
            y.push(row.iter().zip(&truth).map(|(a, b)| a * b).sum::<f32>() + 0.5 * rng.normal() as f32 + 1.0);
            x.extend(row);
        }
        let data = Dataset { features: Features::Dense { x, d }, labels: y, source: "lsq".into(), first_row: 0 };
        let m = build(&ModelSpec {
            kind: ModelKind::Lsq,
            lambda: 0.01,
            features: d,
            classes: 2,
            hidden: vec![],
            factors: 0,
            users: 0,
            items: 0,
        })
        .unwrap();
        let mut w = vec![0f32; d + 1];
        let all: Vec<usize> = (0..n).collect();
        for _ in 0..5000 {
            let mut g = vec![0f32; d + 1];
            m.loss_grad(&w, &data, &all, &mut g);
            w.iter_mut().zip(&g).for_each(|(w, g)| *w -= 0.1 * g);
        }
        let best = m.evaluate(&w, &data).mean_loss() + m.regulariser(&w);
        (data, m, best)
    }

    /// With a constant step SGD stalls at a noise floor; SAGA (its mean term applied as the
    /// coordinator would, with M = 1) converges to the optimum.
    #[test]
    fn saga_beats_sgd_at_equal_epochs_on_least_squares() {
        let mut rng = Rng::new(4);
        let (data, m, best) = problem(&mut rng);
        let n = data.len();
        let run = |saga: bool, rng: &mut Rng| -> f64 {
            let mut opt = Optimizer::new(saga, m.as_ref(), n, n as u64, m.num_params()).unwrap();
            let mut w = vec![0f32; m.num_params()];
            let mut a = vec![0f32; w.len()];
            let mut order: Vec<usize> = (0..n).collect();
            for _ in 0..30 {
                rng.shuffle(&mut order);
                for b in order.chunks(4) {
                    opt.step(m.as_ref(), &mut w, &data, b, 0.05, &mut Vec::new());
                    if let Optimizer::Saga(s) = &mut opt {
                        w.iter_mut().zip(&a).for_each(|(w, a)| *w -= s.step_sum * a);
                        a.iter_mut().zip(&s.mean_change).for_each(|(a, c)| *a += c);
                        s.mean_change.iter_mut().for_each(|c| *c = 0.0);
                        s.step_sum = 0.0;
                    }
                }
            }
            if let Optimizer::Saga(s) = &opt {
                // A is the mean of the stored gradients, recovered from one scalar per example.
                let mut want = vec![0f32; w.len()];
                for i in 0..n {
                    row_axpy(data.row(i), s.slope[i] / n as f32, &mut want[..w.len() - 1]);
                    want[w.len() - 1] += s.slope[i] / n as f32;
                }
                want.iter().zip(&a).for_each(|(x, y)| assert!((x - y).abs() < 1e-3, "{want:?} vs {a:?}"));
            }
            m.evaluate(&w, &data).mean_loss() + m.regulariser(&w) - best
        };
        let sgd = run(false, &mut Rng::new(1));
        let saga = run(true, &mut Rng::new(1));
        assert!(saga < 1e-4 && saga < sgd / 10.0, "gap to the optimum: SGD {sgd:e}, SAGA {saga:e}");
    }

    #[test]
    fn saga_needs_a_linear_model_and_its_own_checkpoint_state() {
        let mlr = build(&ModelSpec {
            kind: ModelKind::Mlr,
            lambda: 0.0,
            features: 3,
            classes: 3,
            hidden: vec![],
            factors: 0,
            users: 0,
            items: 0,
        })
        .unwrap();
        assert!(Optimizer::new(true, mlr.as_ref(), 5, 5, mlr.num_params()).is_err());
        let lsq = build(&ModelSpec {
            kind: ModelKind::Lsq,
            lambda: 0.0,
            features: 3,
            classes: 2,
            hidden: vec![],
            factors: 0,
            users: 0,
            items: 0,
        })
        .unwrap();
        let mut saga = Optimizer::new(true, lsq.as_ref(), 5, 5, 4).unwrap();
        let mut st = vec![("awaiting".to_string(), vec![0.0]), ("saga_slope".to_string(), vec![1.0; 5])];
        saga.restore_state(&mut st).unwrap();
        assert_eq!(st.len(), 1, "the mode's entries are left");
        assert!(saga.restore_state(&mut vec![("saga_slope".into(), vec![1.0; 4])]).is_err());
        assert!(Optimizer::Sgd.restore_state(&mut vec![("saga_slope".into(), vec![1.0; 4])]).is_err());
    }
}
