//! How a rank steps: mini-batch SGD (the model's own step); heavy-ball momentum or AdamW
//! (`--inner-optimizer`, DiLoCo's inner optimizer, Douillard et al. 2023); or SAGA for linear
//! models with one stored scalar per example (`--sync async --optimizer saga`; Defazio et al.
//! 2014; ASAGA when the sync mode's predicate is asynchronous, Leblond et al. 2016).
//!
//! Momentum and AdamW step on the model's dense gradient of the mean batch loss plus its L2 term
//! ([`Model::loss_grad`]), with PyTorch's arithmetic (`torch.optim.SGD(momentum=mu)`:
//! `v = mu v + g; w -= eta v`; `torch.optim.AdamW`: `w *= 1 - eta wd`, then the bias-corrected
//! moments), so a run can be set against a PyTorch one. Their state is per rank and kept across
//! syncs (`--inner-state local`), as DiLoCo's inner AdamW and DDP's local optimizers keep theirs;
//! `--inner-state reset` zeroes it at every sync. benches/inner-state.md measured the two (4
//! ranks, Fashion-MNIST, 3 seeds): see docs/training.md. SGD stays the model's own step,
//! bit for bit (a sparse batch touches only its rows).
//!
//! SAGA's step on a mini-batch B is `w -= lr * (mean_{i in B} (g_i(w) - h_i) + A + lambda w)`
//! where h_i is example i's gradient when it was last visited and A the mean of all stored h
//! over every rank's examples. For a linear model g_i(w) = s_i(w) (x_i, 1), with s_i the slope of
//! the loss at the margin, so storing s_i recovers h_i exactly (the ASYNC paper's "history
//! recovered from earlier models" without keeping them): memory is one f32 per example of this
//! rank's shard. A spans all ranks, so the sync mode keeps it: the step here leaves `lr * A` out
//! and hands the mode the change it made to A and the sum of its step sizes
//! ([`crate::sync::HistoryDelta`]); `--sync async`'s coordinator applies `-(step sum) * A / M`.

use crate::config::{AdamOptions, InnerOptimizer, InnerState};
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

/// Heavy-ball momentum's state: the velocity, one value per parameter.
pub struct Momentum {
    mu: f32,
    velocity: Vec<f32>,
}

impl Momentum {
    /// `v = mu v + g; w -= lr v`, g the gradient in `grad`.
    fn apply(&mut self, params: &mut [f32], grad: &[f32], lr: f32) {
        for ((w, v), &g) in params.iter_mut().zip(self.velocity.iter_mut()).zip(grad) {
            *v = self.mu * *v + g;
            *w -= lr * *v;
        }
    }
}

/// AdamW's state: the two moments and the step count.
pub struct AdamW {
    opts: AdamOptions,
    first: Vec<f32>,
    second: Vec<f32>,
    /// Steps taken since the state was last zeroed (the bias corrections' exponent).
    steps: u64,
}

impl AdamW {
    /// One AdamW step with the gradient in `grad`, as PyTorch's (single-tensor) AdamW computes it.
    fn apply(&mut self, params: &mut [f32], grad: &[f32], lr: f32) {
        let a = &self.opts;
        self.steps += 1;
        let bias1 = 1.0 - (a.beta1 as f64).powi(self.steps.min(i32::MAX as u64) as i32);
        let bias2 = 1.0 - (a.beta2 as f64).powi(self.steps.min(i32::MAX as u64) as i32);
        let step_size = (lr as f64 / bias1) as f32;
        let root_bias2 = bias2.sqrt() as f32;
        let decay = 1.0 - lr * a.weight_decay;
        for (((w, m), v), &g) in params.iter_mut().zip(self.first.iter_mut()).zip(self.second.iter_mut()).zip(grad) {
            *w *= decay;
            *m += (g - *m) * (1.0 - a.beta1);
            *v = *v * a.beta2 + (1.0 - a.beta2) * g * g;
            *w -= step_size * *m / (v.sqrt() / root_bias2 + a.adam_eps);
        }
    }
}

/// The optimizer of a run.
pub enum Optimizer {
    Sgd,
    Saga(Saga),
    /// Momentum or AdamW: the state, what happens to it at a sync, and the gradient's buffer.
    Dense {
        state: DenseState,
        at_sync: InnerState,
        grad: Vec<f32>,
    },
}

/// The state of an optimizer that steps on the dense gradient.
pub enum DenseState {
    Momentum(Momentum),
    AdamW(AdamW),
}

/// The inner optimizer a run asks for (`--inner-optimizer` and its options).
#[derive(Clone, Debug)]
pub struct Inner {
    pub kind: InnerOptimizer,
    pub momentum: f32,
    pub adam: AdamOptions,
    pub at_sync: InnerState,
}

impl Inner {
    /// The configuration's.
    pub fn of(cfg: &crate::config::TrainConfig) -> Inner {
        Inner { kind: cfg.inner_optimizer, momentum: cfg.momentum, adam: cfg.adam.clone(), at_sync: cfg.inner_state }
    }

    /// Plain SGD (the model's own step).
    pub fn sgd() -> Inner {
        Inner { kind: InnerOptimizer::Sgd, momentum: 0.0, adam: AdamOptions::default(), at_sync: InnerState::Local }
    }
}

impl Optimizer {
    /// SAGA when `saga` (the mode keeps its history: [`crate::sync::ModeSpec::keeps_history`]),
    /// else the `inner` optimizer; `local_examples` of this rank, `total_examples` over all
    /// ranks, `n_params` parameters.
    pub fn new(
        saga: bool,
        inner: &Inner,
        model: &dyn Model,
        local_examples: usize,
        total_examples: u64,
        n_params: usize,
    ) -> anyhow::Result<Self> {
        let dense = |state| Optimizer::Dense { state, at_sync: inner.at_sync, grad: vec![0.0; n_params] };
        // The configuration refuses these first (config::TrainConfig::check_optimizer); an error
        // rather than a dense step over every user's and item's row.
        anyhow::ensure!(
            inner.kind == InnerOptimizer::Sgd || model.spec().kind != crate::model::ModelKind::Mf,
            "--inner-optimizer {:?} needs a dense gradient step; --model mf's step is sparse: use --inner-optimizer sgd",
            inner.kind
        );
        Ok(match (saga, inner.kind) {
            (true, InnerOptimizer::Momentum | InnerOptimizer::Adamw) => {
                anyhow::bail!("--inner-optimizer and --optimizer saga are two optimizers of the same steps: choose one")
            }
            (false, InnerOptimizer::Sgd) => Optimizer::Sgd,
            (false, InnerOptimizer::Momentum) => {
                dense(DenseState::Momentum(Momentum { mu: inner.momentum, velocity: vec![0.0; n_params] }))
            }
            (false, InnerOptimizer::Adamw) => dense(DenseState::AdamW(AdamW {
                opts: inner.adam.clone(),
                first: vec![0.0; n_params],
                second: vec![0.0; n_params],
                steps: 0,
            })),
            (true, InnerOptimizer::Sgd) => {
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
            Optimizer::Dense { state, grad, .. } => {
                grad.fill(0.0);
                let loss = model.loss_grad(params, data, batch, grad);
                match state {
                    DenseState::Momentum(m) => m.apply(params, grad, lr),
                    DenseState::AdamW(a) => a.apply(params, grad, lr),
                }
                loss
            }
        }
    }

    /// What the step search (step_search.rs) tries its candidate steps with: the run's inner
    /// optimizer, from a fresh state (SGD's searched step is no step for AdamW: the search chose
    /// 2^-5 for SGD and 2^-9 for AdamW on Fashion-MNIST MLR at 2 ranks, ending at 83.69 % and
    /// 83.70 % after 2 epochs). SAGA's is plain SGD (no history at the start).
    pub fn for_step_search(cfg: &crate::config::TrainConfig, model: &dyn Model) -> Optimizer {
        // The configuration refused the models a dense optimizer cannot step (mf, lda) before.
        Optimizer::new(false, &Inner::of(cfg), model, 0, 0, model.num_params()).unwrap_or(Optimizer::Sgd)
    }

    /// Before a round's `sync`: hands what the steps left for the mode over, and starts anew;
    /// zeroes a dense optimizer's state under `--inner-state reset`.
    pub fn hand_over(&mut self, sync: &mut dyn SyncMode) -> anyhow::Result<()> {
        match self {
            Optimizer::Saga(s) => {
                sync.history(HistoryDelta { mean_change: &s.mean_change, step_sum: s.step_sum })?;
                s.mean_change.iter_mut().for_each(|x| *x = 0.0);
                s.step_sum = 0.0;
            }
            Optimizer::Dense { .. } => self.at_sync(),
            Optimizer::Sgd => {}
        }
        Ok(())
    }

    /// A dense optimizer's state at a sync: kept (`--inner-state local`) or zeroed (`reset`).
    fn at_sync(&mut self) {
        if let Optimizer::Dense { state, at_sync: InnerState::Reset, .. } = self {
            match state {
                DenseState::Momentum(m) => m.velocity.fill(0.0),
                DenseState::AdamW(a) => {
                    a.first.fill(0.0);
                    a.second.fill(0.0);
                    a.steps = 0;
                }
            }
        }
    }

    /// This rank's optimizer state for a checkpoint (stored beside the mode's, names `saga_*`,
    /// `momentum_*` and `adamw_*`; f32 values are exact in the f64 they are stored as).
    pub fn save_state(&self) -> ModeState {
        let wide = |x: &[f32]| x.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        match self {
            Optimizer::Sgd => Vec::new(),
            Optimizer::Saga(s) => vec![(Self::PER_EXAMPLE.into(), wide(&s.slope))],
            Optimizer::Dense { state: DenseState::Momentum(m), .. } => vec![("momentum_velocity".into(), wide(&m.velocity))],
            Optimizer::Dense { state: DenseState::AdamW(a), .. } => vec![
                ("adamw_first".into(), wide(&a.first)),
                ("adamw_second".into(), wide(&a.second)),
                ("adamw_steps".into(), vec![a.steps as f64]),
            ],
        }
    }

    /// The checkpoint's name of this optimizer (in messages).
    fn describe(&self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Saga(_) => "saga",
            Optimizer::Dense { state: DenseState::Momentum(_), .. } => "momentum",
            Optimizer::Dense { state: DenseState::AdamW(_), .. } => "adamw",
        }
    }

    /// The checkpoint entry of SAGA's history: one value per example of the rank's shard, which
    /// follows its examples at a resume on another rank count (`train::elastic::per_example`).
    pub const PER_EXAMPLE: &'static str = "saga_slope";

    /// Whether the checkpoint entry `name` is this optimizer's and averaged over the old ranks at
    /// a resume on another rank count (`train::elastic`): momentum and AdamW's moments follow
    /// the averaged model; SAGA's history follows its examples instead ([`Self::PER_EXAMPLE`]).
    pub fn averaged_on_resize(name: &str) -> bool {
        name.starts_with("momentum_") || name.starts_with("adamw_")
    }

    /// Takes this optimizer's entries out of a checkpoint's state (the rest is the mode's).
    pub fn restore_state(&mut self, state: &mut ModeState) -> anyhow::Result<()> {
        let prefixes = ["saga_", "momentum_", "adamw_"];
        let mine: Vec<(String, Vec<f64>)> = state.extract_if(.., |(k, _)| prefixes.iter().any(|p| k.starts_with(p))).collect();
        let this = self.describe();
        let theirs = |mine: &[(String, Vec<f64>)]| mine.first().and_then(|(k, _)| k.split('_').next()).unwrap_or("sgd").to_owned();
        let take = |name: &str, len: usize| -> anyhow::Result<Vec<f32>> {
            let v = mine.iter().find(|(k, _)| k == name).map(|(_, v)| v).ok_or_else(|| {
                anyhow::anyhow!(
                    "the checkpoint holds no {this} state ({name}): it was written with the {} optimizer; resume with the options it was written with",
                    theirs(&mine)
                )
            })?;
            anyhow::ensure!(v.len() == len, "the checkpoint's {name} holds {} values, this run's model {len}", v.len());
            Ok(v.iter().map(|&x| x as f32).collect())
        };
        match self {
            Optimizer::Dense { state: DenseState::Momentum(m), .. } => m.velocity = take("momentum_velocity", m.velocity.len())?,
            Optimizer::Dense { state: DenseState::AdamW(a), .. } => {
                a.first = take("adamw_first", a.first.len())?;
                a.second = take("adamw_second", a.second.len())?;
                a.steps = take("adamw_steps", 1)?[0] as u64;
            }
            Optimizer::Sgd => anyhow::ensure!(
                mine.is_empty(),
                "the checkpoint holds {} optimizer state but this run steps by plain SGD: resume with the options it was written with",
                theirs(&mine)
            ),
            Optimizer::Saga(s) => {
                let slope = mine
                    .iter()
                    .find(|(k, _)| k == Self::PER_EXAMPLE)
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
            let mut opt = Optimizer::new(saga, &Inner::sgd(), m.as_ref(), n, n as u64, m.num_params()).unwrap();
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
        assert!(Optimizer::new(true, &Inner::sgd(), mlr.as_ref(), 5, 5, mlr.num_params()).is_err());
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
        let mut saga = Optimizer::new(true, &Inner::sgd(), lsq.as_ref(), 5, 5, 4).unwrap();
        let mut st = vec![("awaiting".to_string(), vec![0.0]), ("saga_slope".to_string(), vec![1.0; 5])];
        saga.restore_state(&mut st).unwrap();
        assert_eq!(st.len(), 1, "the mode's entries are left");
        assert!(saga.restore_state(&mut vec![("saga_slope".into(), vec![1.0; 4])]).is_err());
        assert!(Optimizer::Sgd.restore_state(&mut vec![("saga_slope".into(), vec![1.0; 4])]).is_err());
    }

    fn spec(kind: ModelKind, lambda: f32) -> ModelSpec {
        ModelSpec { kind, lambda, features: 5, classes: 3, hidden: vec![4], factors: 0, users: 0, items: 0 }
    }

    /// Momentum and AdamW against the textbook updates in f64 (Polyak's heavy ball in PyTorch's
    /// form; Loshchilov & Hutter's AdamW, Algorithm 2 with PyTorch's placement of eta), from
    /// the same gradients: the model's, at the optimizer's own f32 parameters.
    #[test]
    fn momentum_and_adamw_steps_match_their_textbook_f64_updates() {
        let mut rng = Rng::new(6);
        let (data, _, _) = problem(&mut rng);
        let adam = AdamOptions { beta1: 0.8, beta2: 0.95, adam_eps: 1e-6, weight_decay: 0.1 };
        for kind in [ModelKind::Lsq, ModelKind::Logreg, ModelKind::Mlr, ModelKind::Mlp] {
            let mut data = data.clone();
            if matches!(kind, ModelKind::Mlr | ModelKind::Mlp) {
                data.labels.iter_mut().for_each(|y| *y = (y.abs() as usize % 3) as f32);
            }
            let m = build(&spec(kind, 0.01)).unwrap();
            for inner in [InnerOptimizer::Momentum, InnerOptimizer::Adamw] {
                let choice = Inner { kind: inner, momentum: 0.7, adam: adam.clone(), at_sync: InnerState::Local };
                let n = m.num_params();
                let mut opt = Optimizer::new(false, &choice, m.as_ref(), data.len(), data.len() as u64, n).unwrap();
                let mut w = vec![0f32; n];
                m.init(&mut w, &mut Rng::new(2));
                let mut oracle: Vec<f64> = w.iter().map(|&x| x as f64).collect();
                let (mut v, mut first, mut second) = (vec![0f64; n], vec![0f64; n], vec![0f64; n]);
                for t in 1..=20 {
                    let batch: Vec<usize> = (0..8).map(|k| (t * 8 + k) % data.len()).collect();
                    let lr = 0.05 * (1.0 + t as f32 / 20.0);
                    let mut g = vec![0f32; n];
                    m.loss_grad(&w, &data, &batch, &mut g);
                    opt.step(m.as_ref(), &mut w, &data, &batch, lr, &mut Vec::new());
                    let lr = lr as f64;
                    for k in 0..n {
                        let g = g[k] as f64;
                        if inner == InnerOptimizer::Momentum {
                            v[k] = 0.7 * v[k] + g;
                            oracle[k] -= lr * v[k];
                        } else {
                            oracle[k] *= 1.0 - lr * 0.1;
                            first[k] = 0.8 * first[k] + 0.2 * g;
                            second[k] = 0.95 * second[k] + 0.05 * g * g;
                            let (mhat, vhat) = (first[k] / (1.0 - 0.8f64.powi(t as i32)), second[k] / (1.0 - 0.95f64.powi(t as i32)));
                            oracle[k] -= lr * mhat / (vhat.sqrt() + 1e-6);
                        }
                    }
                    // Each step from the optimizer's own parameters, so f32 rounding does not add up.
                    for k in 0..n {
                        let tol = 1e-5 * oracle[k].abs().max(1.0);
                        assert!(
                            (w[k] as f64 - oracle[k]).abs() < tol,
                            "{kind:?} {inner:?} step {t} param {k}: {} against {}",
                            w[k],
                            oracle[k]
                        );
                        oracle[k] = w[k] as f64;
                    }
                }
            }
        }
    }

    /// The state survives a checkpoint's round trip exactly, is zeroed at a sync under
    /// `--inner-state reset`, and a checkpoint of another optimizer is refused naming it.
    #[test]
    fn dense_state_is_checkpointed_reset_and_checked() {
        let mut rng = Rng::new(8);
        let (data, m, _) = problem(&mut rng);
        let n = m.num_params();
        let adamw = Inner { kind: InnerOptimizer::Adamw, ..Inner::sgd() };
        let mut a = Optimizer::new(false, &adamw, m.as_ref(), data.len(), data.len() as u64, n).unwrap();
        let mut w = vec![0f32; n];
        for t in 0..5 {
            a.step(m.as_ref(), &mut w, &data, &[t, t + 1, t + 2], 0.01, &mut Vec::new());
        }
        let mut state = a.save_state();
        let mut b = Optimizer::new(false, &adamw, m.as_ref(), data.len(), data.len() as u64, n).unwrap();
        b.restore_state(&mut state).unwrap();
        assert!(state.is_empty());
        let (mut wa, mut wb) = (w.clone(), w.clone());
        a.step(m.as_ref(), &mut wa, &data, &[7, 8], 0.01, &mut Vec::new());
        b.step(m.as_ref(), &mut wb, &data, &[7, 8], 0.01, &mut Vec::new());
        assert_eq!(wa, wb, "a restored AdamW steps as the one it was saved from");
        let e = Optimizer::Sgd.restore_state(&mut a.save_state()).unwrap_err().to_string();
        assert!(e.contains("adamw optimizer state") && e.contains("options it was written with"), "{e}");
        let momentum = Inner { kind: InnerOptimizer::Momentum, ..Inner::sgd() };
        let mut c = Optimizer::new(false, &momentum, m.as_ref(), data.len(), data.len() as u64, n).unwrap();
        let e = c.restore_state(&mut a.save_state()).unwrap_err().to_string();
        assert!(e.contains("no momentum state") && e.contains("the adamw optimizer"), "{e}");
        let reset = Inner { at_sync: InnerState::Reset, ..adamw };
        let mut r = Optimizer::new(false, &reset, m.as_ref(), data.len(), data.len() as u64, n).unwrap();
        r.step(m.as_ref(), &mut w, &data, &[1, 2], 0.01, &mut Vec::new());
        let fresh = Optimizer::new(false, &reset, m.as_ref(), data.len(), data.len() as u64, n).unwrap();
        assert_ne!(r.save_state(), fresh.save_state());
        r.at_sync();
        assert_eq!(r.save_state(), fresh.save_state(), "reset at a sync");
        let mf = build(&ModelSpec { kind: ModelKind::Mf, factors: 2, users: 3, items: 3, ..spec(ModelKind::Mf, 0.0) }).unwrap();
        assert!(Optimizer::new(false, &momentum, mf.as_ref(), 3, 3, mf.num_params()).is_err());
    }
}
