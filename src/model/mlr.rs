//! Multiclass softmax ("multinomial logistic") regression. Row j of the parameters is class j:
//! its d weights then its bias (row length d + 1), so a parameter server can shard by class.
//! Dense batches are gathered once and go through two matrix products; sparse rows are handled
//! one non-zero at a time.

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, ArrayRef2, ArrayView2, ArrayViewMut2};

use super::{EvalSums, MetricKind, Model, ModelSpec, RowLayout};
use crate::data::{Dataset, Features, Row};
use crate::rng::Rng;

/// Softmax regression over `classes` x `features`.
pub struct Mlr {
    spec: ModelSpec,
}

impl Mlr {
    /// A model of `spec.classes` classes over `spec.features` inputs.
    pub fn new(spec: &ModelSpec) -> Self {
        Mlr { spec: spec.clone() }
    }

    fn dims(&self) -> (usize, usize) {
        (self.spec.classes, self.spec.features)
    }

    /// Class scores of the batch rows, B x J.
    fn scores(&self, params: &[f32], data: &Dataset, batch: &[usize]) -> Array2<f32> {
        let (j, d) = self.dims();
        let mut z = Array2::<f32>::zeros((batch.len(), j));
        if let Features::Dense { x, d: xd } = &data.features {
            let n = (*xd).min(d);
            let mut buf = vec![0f32; batch.len() * n];
            let xb = super::gather_rows(x, *xd, n, batch, &mut buf);
            self.dense_scores(params, &xb, &mut z);
            return z;
        }
        let w = ArrayView2::from_shape((j, d + 1), params).expect("parameter length matches the model");
        for (r, &i) in batch.iter().enumerate() {
            if let Row::Sparse { indices, values } = data.row(i) {
                for c in 0..j {
                    let wc = &params[c * (d + 1)..];
                    z[[r, c]] = indices.iter().zip(values).map(|(&k, &v)| v * wc[k as usize]).sum();
                }
            }
        }
        for mut row in z.rows_mut() {
            row.iter_mut().zip(w.column(d)).for_each(|(zc, b)| *zc += b);
        }
        z
    }

    /// z = X W^T + b for gathered dense rows X (B x n, n <= d: the weights past n meet zeros).
    fn dense_scores(&self, params: &[f32], xb: &ArrayView2<f32>, z: &mut ArrayRef2<f32>) {
        let (j, d) = self.dims();
        let w = ArrayView2::from_shape((j, d + 1), params).expect("parameter length matches the model");
        general_mat_mul(1.0, xb, &w.slice(s![.., ..xb.ncols()]).t(), 0.0, z);
        for mut row in z.rows_mut() {
            row.iter_mut().zip(w.column(d)).for_each(|(zc, b)| *zc += b);
        }
    }

    /// grad_W = alpha * G^T X + beta * grad_W (W only), grad_b += alpha * column sums of G, for
    /// gathered dense rows X (B x n; the weights past n are only scaled by beta).
    fn dense_accumulate(&self, out: &mut [f32], g: &ArrayRef2<f32>, xb: &ArrayView2<f32>, alpha: f32, beta: f32) {
        let (j, d) = self.dims();
        let n = xb.ncols();
        let mut w = ArrayViewMut2::from_shape((j, d + 1), out).expect("parameter length matches the model");
        general_mat_mul(alpha, &g.t(), xb, beta, &mut w.slice_mut(s![.., ..n]));
        if beta != 1.0 {
            w.slice_mut(s![.., n..d]).iter_mut().for_each(|v| *v *= beta);
        }
        for (c, col) in g.columns().into_iter().enumerate() {
            w[[c, d]] += alpha * col.sum();
        }
    }

    /// grad_W = alpha * G^T X + beta * grad_W (W only), grad_b += alpha * column sums of G, for
    /// sparse rows, one non-zero at a time.
    fn sparse_accumulate(&self, out: &mut [f32], g: &ArrayRef2<f32>, data: &Dataset, batch: &[usize], alpha: f32, beta: f32) {
        let (j, d) = self.dims();
        let mut w = ArrayViewMut2::from_shape((j, d + 1), out).expect("parameter length matches the model");
        if beta != 1.0 {
            w.slice_mut(s![.., ..d]).iter_mut().for_each(|v| *v *= beta);
        }
        for (r, &i) in batch.iter().enumerate() {
            if let Row::Sparse { indices, values } = data.row(i) {
                for c in 0..j {
                    let gc = alpha * g[[r, c]];
                    let mut wc = w.row_mut(c);
                    for (&k, &v) in indices.iter().zip(values) {
                        wc[k as usize] += gc * v;
                    }
                }
            }
        }
        for (c, col) in g.columns().into_iter().enumerate() {
            w[[c, d]] += alpha * col.sum();
        }
    }

    /// The SGD step on dense rows: the batch gathered once into `scratch` (which also holds the
    /// scores), then W <- (1 - lr lambda) W - lr G^T X as one sgemm over the same copy. Before,
    /// each of the two products gathered its own zero-filled copy: 47 % of the step's
    /// instructions were that gather and its memset (callgrind). Now 9.2k instructions an
    /// example against 16.8k, and bench per CPU second 742k -> 1,083k examples/s (load 8-11,
    /// benches/kernels.md). Measured and dropped: the scores stored class-major (J x B), 6 % more
    /// instructions; the scores as one sgemv per row on the row in place (no gather before
    /// them), 806k against 1,033k examples per CPU second.
    /// None where the rows are not dense.
    fn dense_step(&self, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, scratch: &mut Vec<f32>) -> Option<f64> {
        let Features::Dense { x, d: xd } = &data.features else { return None };
        let xd = *xd;
        let (j, d) = self.dims();
        let (b, n) = (batch.len(), xd.min(d));
        if scratch.len() < b * (j + n) {
            scratch.resize(b * (j + n), 0.0);
        }
        let (zs, xs) = scratch.split_at_mut(b * j);
        let xb = super::gather_rows(x, xd, n, batch, &mut xs[..b * n]);
        let mut z = ArrayViewMut2::from_shape((b, j), zs).expect("B x J scores");
        self.dense_scores(params, &xb, &mut z);
        let (loss, _) = super::softmax_residual(&mut z, batch.iter().map(|&i| super::class_of(data.labels[i])), 1.0 / b as f32);
        self.dense_accumulate(params, &z, &xb, -lr, 1.0 - lr * self.spec.lambda);
        Some(loss / b as f64)
    }
}

impl Model for Mlr {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }
    fn num_params(&self) -> usize {
        let (j, d) = self.dims();
        j * (d + 1)
    }
    fn layout(&self) -> RowLayout {
        let (j, d) = self.dims();
        RowLayout::uniform(j, d + 1)
    }
    fn init(&self, params: &mut [f32], _rng: &mut Rng) {
        params.fill(0.0);
    }
    fn loss_grad(&self, params: &[f32], data: &Dataset, batch: &[usize], grad: &mut [f32]) -> f64 {
        let (j, d) = self.dims();
        // The dense batch gathered once, for both products.
        let mut buf = Vec::new();
        let dense = match &data.features {
            Features::Dense { x, d: xd } => {
                let n = (*xd).min(d);
                buf.resize(batch.len() * n, 0.0);
                Some(super::gather_rows(x, *xd, n, batch, &mut buf))
            }
            _ => None,
        };
        let mut z = match &dense {
            Some(xb) => {
                let mut z = Array2::<f32>::zeros((batch.len(), j));
                self.dense_scores(params, xb, &mut z);
                z
            }
            None => self.scores(params, data, batch),
        };
        let (loss, _) = super::softmax_residual(&mut z, batch.iter().map(|&i| super::class_of(data.labels[i])), 1.0 / batch.len() as f32);
        // Regulariser on the weights (not the biases), then the data term.
        for c in 0..j {
            let r = c * (d + 1)..c * (d + 1) + d;
            grad[r.clone()].iter_mut().zip(&params[r]).for_each(|(g, w)| *g += self.spec.lambda * w);
        }
        match &dense {
            Some(xb) => self.dense_accumulate(grad, &z, xb, 1.0, 1.0),
            None => self.sparse_accumulate(grad, &z, data, batch, 1.0, 1.0),
        }
        loss / batch.len() as f64
    }
    fn sgd_step(&self, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, scratch: &mut Vec<f32>) -> f64 {
        if let Some(loss) = self.dense_step(params, data, batch, lr, scratch) {
            return loss;
        }
        let mut z = self.scores(params, data, batch);
        let (loss, _) = super::softmax_residual(&mut z, batch.iter().map(|&i| super::class_of(data.labels[i])), 1.0 / batch.len() as f32);
        // W <- (1 - lr lambda) W - lr G^T X.
        self.sparse_accumulate(params, &z, data, batch, -lr, 1.0 - lr * self.spec.lambda);
        loss / batch.len() as f64
    }
    fn regulariser(&self, params: &[f32]) -> f64 {
        let (_, d) = self.dims();
        let s: f64 = params.chunks(d + 1).flat_map(|r| &r[..d]).map(|&w| (w as f64).powi(2)).sum();
        0.5 * self.spec.lambda as f64 * s
    }
    fn evaluate(&self, params: &[f32], data: &Dataset) -> EvalSums {
        let mut s = EvalSums::default();
        let idx: Vec<usize> = (0..data.len()).collect();
        for chunk in idx.chunks(512) {
            let mut z = self.scores(params, data, chunk);
            let (loss, correct) = super::softmax_residual(&mut z, chunk.iter().map(|&i| super::class_of(data.labels[i])), 1.0);
            s.loss_sum += loss;
            s.metric_sum += correct as f64;
            s.count += chunk.len() as f64;
        }
        s
    }
    fn metric_kind(&self) -> MetricKind {
        MetricKind::Accuracy
    }
    fn predict(&self, params: &[f32], data: &Dataset) -> Vec<f32> {
        let idx: Vec<usize> = (0..data.len()).collect();
        // The chunks of `evaluate`, so each score is computed by the same products.
        idx.chunks(512).flat_map(|chunk| super::argmax_rows(&self.scores(params, data, chunk)).collect::<Vec<_>>()).collect()
    }
    fn describe_layout(&self) -> String {
        let (j, d) = self.dims();
        format!(
            "mlr: {j} rows, one per class in label order; each row is the class's {d} feature weights, then its bias ({} values)",
            d + 1
        )
    }
}
