//! Multiclass softmax ("multinomial logistic") regression. Row j of the parameters is class j:
//! its d weights then its bias (row length d + 1), so a parameter server can shard by class.
//! Dense batches go through two matrix products; sparse rows are handled one non-zero at a time.

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, ArrayView2, ArrayViewMut2};

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
        let w = ArrayView2::from_shape((j, d + 1), params).expect("parameter length matches the model");
        let mut z = Array2::<f32>::zeros((batch.len(), j));
        if let Features::Dense { x, d: xd } = &data.features {
            let xb = gather_dense(x, *xd, d, batch);
            general_mat_mul(1.0, &xb, &w.slice(s![.., ..d]).t(), 0.0, &mut z);
        } else {
            for (r, &i) in batch.iter().enumerate() {
                if let Row::Sparse { indices, values } = data.row(i) {
                    for c in 0..j {
                        let wc = &params[c * (d + 1)..];
                        z[[r, c]] = indices.iter().zip(values).map(|(&k, &v)| v * wc[k as usize]).sum();
                    }
                }
            }
        }
        for mut row in z.rows_mut() {
            row.iter_mut().zip(w.column(d)).for_each(|(zc, b)| *zc += b);
        }
        z
    }

    /// grad_W = alpha * G^T X + beta * grad_W (W only), grad_b += alpha * column sums of G.
    fn accumulate(&self, out: &mut [f32], g: &Array2<f32>, data: &Dataset, batch: &[usize], alpha: f32, beta: f32) {
        let (j, d) = self.dims();
        let mut w = ArrayViewMut2::from_shape((j, d + 1), out).expect("parameter length matches the model");
        if let Features::Dense { x, d: xd } = &data.features {
            let xb = gather_dense(x, *xd, d, batch);
            general_mat_mul(alpha, &g.t(), &xb, beta, &mut w.slice_mut(s![.., ..d]));
        } else {
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
        }
        for (c, col) in g.columns().into_iter().enumerate() {
            w[[c, d]] += alpha * col.sum();
        }
    }
}

/// Copies the batch rows into a B x d matrix (only B rows: the batch, never the data set).
fn gather_dense(x: &[f32], xd: usize, d: usize, batch: &[usize]) -> Array2<f32> {
    let mut xb = Array2::<f32>::zeros((batch.len(), d));
    for (r, &i) in batch.iter().enumerate() {
        xb.row_mut(r).slice_mut(s![..xd.min(d)]).assign(&ndarray::ArrayView1::from(&x[i * xd..i * xd + xd.min(d)]));
    }
    xb
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
        let mut z = self.scores(params, data, batch);
        let (loss, _) = super::softmax_residual(&mut z, batch.iter().map(|&i| super::class_of(data.labels[i])), 1.0 / batch.len() as f32);
        // Regulariser on the weights (not the biases), then the data term.
        let (j, d) = self.dims();
        for c in 0..j {
            let r = c * (d + 1)..c * (d + 1) + d;
            grad[r.clone()].iter_mut().zip(&params[r]).for_each(|(g, w)| *g += self.spec.lambda * w);
        }
        self.accumulate(grad, &z, data, batch, 1.0, 1.0);
        loss / batch.len() as f64
    }
    fn sgd_step(&self, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, _scratch: &mut Vec<f32>) -> f64 {
        let mut z = self.scores(params, data, batch);
        let (loss, _) = super::softmax_residual(&mut z, batch.iter().map(|&i| super::class_of(data.labels[i])), 1.0 / batch.len() as f32);
        // W <- (1 - lr lambda) W - lr G^T X in one product.
        self.accumulate(params, &z, data, batch, -lr, 1.0 - lr * self.spec.lambda);
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
