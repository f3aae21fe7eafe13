//! Matrix factorisation of ratings: D ~ L R^T with rank k. Parameters: one row of k factors per
//! user (L), then one per item (R). Loss per rating (r - l_u . r_i)^2 / 2. The objective's
//! regulariser is global, (lambda/2)(||L||^2 + ||R||^2), and `loss_grad` is its exact gradient;
//! `sgd_step` regularises only the rows the batch touches (as SGD-MF implementations do), so a
//! step costs O(batch * k), not O(model).

use super::{EvalSums, MetricKind, Model, ModelSpec, RowLayout};
use crate::data::{Dataset, Row};
use crate::rng::Rng;

/// The factorisation model.
pub struct Mf {
    spec: ModelSpec,
}

impl Mf {
    /// `spec.users` x `spec.items` ratings, `spec.factors` factors.
    pub fn new(spec: &ModelSpec) -> Self {
        Mf { spec: spec.clone() }
    }

    fn rows(&self, data: &Dataset, i: usize) -> (usize, usize) {
        let k = self.spec.factors;
        match data.row(i) {
            Row::Rating { user, item } => (user as usize * k, (self.spec.users + item as usize) * k),
            _ => panic!("matrix factorisation needs ratings data (the trainer checks this)"),
        }
    }

    /// Rating `i`'s user row, item row and residual r - l_u . r_i.
    fn residual(&self, params: &[f32], data: &Dataset, i: usize) -> (usize, usize, f32) {
        let (u, v) = self.rows(data, i);
        (u, v, data.labels[i] - self.predict(params, u, v))
    }

    fn predict(&self, params: &[f32], u: usize, v: usize) -> f32 {
        let k = self.spec.factors;
        params[u..u + k].iter().zip(&params[v..v + k]).map(|(a, b)| a * b).sum()
    }
}

impl Model for Mf {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }
    fn num_params(&self) -> usize {
        (self.spec.users + self.spec.items) * self.spec.factors
    }
    fn layout(&self) -> RowLayout {
        RowLayout::uniform(self.spec.users + self.spec.items, self.spec.factors)
    }
    fn init(&self, params: &mut [f32], rng: &mut Rng) {
        // Small random factors: zero would be a saddle point where SGD never moves.
        let std = 0.3 / (self.spec.factors as f64).sqrt();
        params.iter_mut().for_each(|w| *w = (rng.normal() * std) as f32);
    }
    fn loss_grad(&self, params: &[f32], data: &Dataset, batch: &[usize], grad: &mut [f32]) -> f64 {
        let k = self.spec.factors;
        let inv = 1.0 / batch.len() as f32;
        let mut loss = 0.0;
        for &i in batch {
            let (u, v, e) = self.residual(params, data, i);
            loss += 0.5 * (e as f64).powi(2);
            for t in 0..k {
                grad[u + t] -= e * params[v + t] * inv;
                grad[v + t] -= e * params[u + t] * inv;
            }
        }
        grad.iter_mut().zip(params).for_each(|(g, w)| *g += self.spec.lambda * w);
        loss / batch.len() as f64
    }
    fn sgd_step(&self, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, _scratch: &mut Vec<f32>) -> f64 {
        let k = self.spec.factors;
        let inv = 1.0 / batch.len() as f32;
        let lam = self.spec.lambda;
        let mut loss = 0.0;
        for &i in batch {
            let (u, v, e) = self.residual(params, data, i);
            loss += 0.5 * (e as f64).powi(2);
            for t in 0..k {
                let (a, b) = (params[u + t], params[v + t]);
                params[u + t] += lr * (e * b * inv - lam * a * inv);
                params[v + t] += lr * (e * a * inv - lam * b * inv);
            }
        }
        loss / batch.len() as f64
    }
    fn regulariser(&self, params: &[f32]) -> f64 {
        0.5 * self.spec.lambda as f64 * params.iter().map(|&w| (w as f64).powi(2)).sum::<f64>()
    }
    fn evaluate(&self, params: &[f32], data: &Dataset) -> EvalSums {
        let mut s = EvalSums::default();
        for i in 0..data.len() {
            let e = self.residual(params, data, i).2 as f64;
            s.loss_sum += 0.5 * e * e;
            s.metric_sum += e * e;
            s.count += 1.0;
        }
        s
    }
    fn metric_kind(&self) -> MetricKind {
        MetricKind::Rmse
    }
}
