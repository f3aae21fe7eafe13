//! Linear models, `svm` (hinge), `logreg` (logistic) and `lsq` (least squares), sharing one
//! implementation: w (d weights) then the bias b; L2 on w only. For svm and logreg labels > 0
//! are +1, others -1; lsq regresses on the labels as read (`--label-threshold` makes them +-1).
//! Sparse rows are computed sparsely, and an SGD step touches only the weights the batch reaches
//! plus one O(d) multiplicative decay for the regulariser. A dense batch is gathered and goes
//! through two BLAS matrix-vector products.

use super::{row_axpy, row_dot, EvalSums, MetricKind, Model, ModelKind, ModelSpec, RowLayout};
use crate::data::{Dataset, Features};
use crate::rng::Rng;
use ndarray::linalg::general_mat_vec_mul;
use ndarray::{ArrayView1, ArrayViewMut1};

/// Rows of this many parameters, so a parameter server can push the vector in pieces.
const ROW_LEN: usize = 64;

/// A linear classifier with a per-example margin loss.
pub struct Linear {
    spec: ModelSpec,
}

impl Linear {
    /// `spec.kind` must be Svm or Logreg.
    pub fn new(spec: &ModelSpec) -> Self {
        Linear { spec: spec.clone() }
    }

    /// (loss, d loss / d z) at margin z for label y in {-1, +1}.
    fn loss_and_slope(&self, z: f32, y: f32) -> (f64, f32) {
        let m = y * z;
        match self.spec.kind {
            ModelKind::Svm => {
                if m < 1.0 {
                    ((1.0 - m) as f64, -y)
                } else {
                    (0.0, 0.0)
                }
            }
            ModelKind::Lsq => {
                let r = z - y;
                (0.5 * (r as f64).powi(2), r)
            }
            _ => {
                // log(1 + e^-m), computed without overflow for either sign of m.
                let loss = if m > 0.0 { (-m).exp().ln_1p() } else { -m + m.exp().ln_1p() };
                let sig = 1.0 / (1.0 + m.exp()); // sigma(-m)
                (loss as f64, -y * sig)
            }
        }
    }

    /// The target the loss compares z with: +-1 for the classifiers, the label for lsq.
    fn target(&self, y: f32) -> f32 {
        match self.spec.kind {
            ModelKind::Lsq => y,
            _ if y > 0.0 => 1.0,
            _ => -1.0,
        }
    }

    fn d(&self) -> usize {
        self.spec.features
    }

    /// One SGD step on dense rows: the batch gathered into `scratch` (B x n, n = min(row length,
    /// d)) once, its margins as one sgemv and the update w <- decay w - lr/B X^T slopes (the
    /// decay folded in as sgemv's beta) as a second one, so both run in OpenBLAS's AVX2/FMA
    /// kernels on a copy in L2. Against a BLAS dot and the compiled axpy row by row, on the same
    /// run (bench, 3 runs each, per CPU second): svm 2.34M -> 2.66M examples/s, logreg 1.76M ->
    /// 2.65M; against the margins by sdot on the rows in place and the gather after them: 2.31M
    /// -> 2.84M (svm and logreg alike). Every row is read from DRAM once, and that read bounds the
    /// step (benches/rowread.c, benches/kernels.md).
    /// None where the rows are not dense.
    fn dense_step(&self, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, scratch: &mut Vec<f32>) -> Option<f64> {
        let Features::Dense { x, d: xd } = &data.features else { return None };
        let xd = *xd;
        let (d, b) = (self.d(), batch.len());
        let n = xd.min(d);
        if scratch.len() < b * (n + 1) {
            scratch.resize(b * (n + 1), 0.0);
        }
        let (slopes, xs) = scratch.split_at_mut(b);
        let xm = super::gather_rows(x, xd, n, batch, &mut xs[..b * n]);
        general_mat_vec_mul(1.0, &xm, &ArrayView1::from(&params[..n]), 0.0, &mut ArrayViewMut1::from(&mut *slopes));
        let inv = 1.0 / b as f32;
        let (mut loss, bias) = (0.0, params[d]);
        for (z, &i) in slopes.iter_mut().zip(batch) {
            let (l, g) = self.loss_and_slope(*z + bias, self.target(data.labels[i]));
            loss += l;
            if g != 0.0 {
                params[d] -= lr * g * inv;
            }
            *z = -lr * g * inv;
        }
        let decay = 1.0 - lr * self.spec.lambda;
        general_mat_vec_mul(1.0, &xm.t(), &ArrayView1::from(&*slopes), decay, &mut ArrayViewMut1::from(&mut params[..n]));
        params[n..d].iter_mut().for_each(|w| *w *= decay);
        Some(loss / b as f64)
    }

    /// Example `i`'s (loss, d loss / d z) at `params`.
    fn example(&self, params: &[f32], data: &Dataset, i: usize) -> (f64, f32) {
        let d = self.d();
        let z = row_dot(data.row(i), &params[..d]) + params[d];
        self.loss_and_slope(z, self.target(data.labels[i]))
    }
}

impl Model for Linear {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }
    fn num_params(&self) -> usize {
        self.d() + 1
    }
    fn layout(&self) -> RowLayout {
        let p = self.num_params();
        let mut offsets: Vec<usize> = (0..p).step_by(ROW_LEN).collect();
        offsets.push(p);
        RowLayout { offsets }
    }
    fn init(&self, params: &mut [f32], _rng: &mut Rng) {
        params.fill(0.0);
    }
    fn loss_grad(&self, params: &[f32], data: &Dataset, batch: &[usize], grad: &mut [f32]) -> f64 {
        let d = self.d();
        let inv = 1.0 / batch.len() as f32;
        let mut loss = 0.0;
        for &i in batch {
            let (l, g) = self.example(params, data, i);
            loss += l;
            if g != 0.0 {
                row_axpy(data.row(i), g * inv, &mut grad[..d]);
                grad[d] += g * inv;
            }
        }
        for (g, w) in grad[..d].iter_mut().zip(&params[..d]) {
            *g += self.spec.lambda * w;
        }
        loss / batch.len() as f64
    }
    fn sgd_step(&self, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, scratch: &mut Vec<f32>) -> f64 {
        if let Some(loss) = self.dense_step(params, data, batch, lr, scratch) {
            return loss;
        }
        let d = self.d();
        let inv = 1.0 / batch.len() as f32;
        // Slopes at the old weights first, so the step equals w - lr * grad exactly.
        scratch.clear();
        let mut loss = 0.0;
        for &i in batch {
            let (l, g) = self.example(params, data, i);
            loss += l;
            scratch.push(g);
        }
        let decay = 1.0 - lr * self.spec.lambda;
        if decay != 1.0 {
            params[..d].iter_mut().for_each(|w| *w *= decay);
        }
        for (&i, &g) in batch.iter().zip(scratch.iter()) {
            if g != 0.0 {
                row_axpy(data.row(i), -lr * g * inv, &mut params[..d]);
                params[d] -= lr * g * inv;
            }
        }
        loss / batch.len() as f64
    }
    fn regulariser(&self, params: &[f32]) -> f64 {
        0.5 * self.spec.lambda as f64 * params[..self.d()].iter().map(|&w| (w as f64).powi(2)).sum::<f64>()
    }
    fn evaluate(&self, params: &[f32], data: &Dataset) -> EvalSums {
        let d = self.d();
        let mut s = EvalSums::default();
        for i in 0..data.len() {
            let y = self.target(data.labels[i]);
            let z = row_dot(data.row(i), &params[..d]) + params[d];
            s.loss_sum += self.loss_and_slope(z, y).0;
            s.metric_sum += match self.spec.kind {
                ModelKind::Lsq => ((z - y) as f64).powi(2),
                _ => ((z > 0.0) == (y > 0.0)) as u8 as f64,
            };
            s.count += 1.0;
        }
        s
    }
    fn metric_kind(&self) -> MetricKind {
        match self.spec.kind {
            ModelKind::Lsq => MetricKind::Rmse,
            _ => MetricKind::Accuracy,
        }
    }
    fn margin_loss(&self) -> Option<&dyn super::MarginLoss> {
        Some(self)
    }
    fn predict(&self, params: &[f32], data: &Dataset) -> Vec<f32> {
        let d = self.d();
        (0..data.len())
            .map(|i| {
                let z = row_dot(data.row(i), &params[..d]) + params[d];
                match self.spec.kind {
                    ModelKind::Lsq => z,
                    _ if z > 0.0 => 1.0,
                    _ => -1.0,
                }
            })
            .collect()
    }
    fn describe_layout(&self) -> String {
        let what = match self.spec.kind {
            ModelKind::Lsq => "the predicted value is x.w + b",
            _ => "the class is +1 where x.w + b > 0, else -1",
        };
        format!("{:?}: {} feature weights w, then the bias b ({} values; {what})", self.spec.kind, self.d(), self.d() + 1).to_lowercase()
    }
}

impl super::MarginLoss for Linear {
    fn features(&self) -> usize {
        self.d()
    }
    fn lambda(&self) -> f32 {
        self.spec.lambda
    }
    fn loss_slope(&self, params: &[f32], data: &Dataset, i: usize) -> (f64, f32) {
        self.example(params, data, i)
    }
}
