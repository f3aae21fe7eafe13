//! A small multilayer perceptron: one or two ReLU hidden layers, softmax output, cross entropy,
//! L2 on the weights. Each layer is a block of rows, one row per neuron: its incoming weights
//! then its bias. Sparse inputs are multiplied one non-zero at a time in the first layer.

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, ArrayView2, ArrayViewMut2};

use super::{EvalSums, MetricKind, Model, ModelSpec, RowLayout};
use crate::data::{Dataset, Features, Row};
use crate::rng::Rng;

/// The MLP.
pub struct Mlp {
    spec: ModelSpec,
    /// Layer widths: inputs, hidden..., classes.
    widths: Vec<usize>,
    /// Start of each layer's block in the parameters (plus the end).
    offsets: Vec<usize>,
}

struct Forward {
    /// Pre-activations of each layer (B x width).
    z: Vec<Array2<f32>>,
    /// Activations of the hidden layers (B x width).
    h: Vec<Array2<f32>>,
}

impl Mlp {
    /// Widths from `spec.features`, `spec.hidden`, `spec.classes`.
    pub fn new(spec: &ModelSpec) -> Self {
        let mut widths = vec![spec.features];
        widths.extend(&spec.hidden);
        widths.push(spec.classes);
        let mut offsets = vec![0];
        for l in 0..widths.len() - 1 {
            offsets.push(offsets[l] + widths[l + 1] * (widths[l] + 1));
        }
        Mlp { spec: spec.clone(), widths, offsets }
    }

    fn layers(&self) -> usize {
        self.widths.len() - 1
    }

    fn w<'a>(&self, params: &'a [f32], l: usize) -> ArrayView2<'a, f32> {
        ArrayView2::from_shape((self.widths[l + 1], self.widths[l] + 1), &params[self.offsets[l]..self.offsets[l + 1]]).unwrap()
    }

    fn first_layer(&self, params: &[f32], data: &Dataset, batch: &[usize]) -> Array2<f32> {
        let (d, h) = (self.widths[0], self.widths[1]);
        let w = self.w(params, 0);
        let mut z = Array2::<f32>::zeros((batch.len(), h));
        match &data.features {
            Features::Dense { x, d: xd } => {
                let xb = gather(x, *xd, d, batch);
                general_mat_mul(1.0, &xb, &w.slice(s![.., ..d]).t(), 0.0, &mut z);
            }
            _ => {
                for (r, &i) in batch.iter().enumerate() {
                    if let Row::Sparse { indices, values } = data.row(i) {
                        for (&k, &v) in indices.iter().zip(values) {
                            z.row_mut(r).scaled_add(v, &w.column(k as usize));
                        }
                    }
                }
            }
        }
        z.rows_mut().into_iter().for_each(|mut row| row += &w.column(d));
        z
    }

    fn forward(&self, params: &[f32], data: &Dataset, batch: &[usize]) -> Forward {
        let mut z = vec![self.first_layer(params, data, batch)];
        let mut h = Vec::new();
        for l in 1..self.layers() {
            let a = z[l - 1].mapv(|v| v.max(0.0));
            let w = self.w(params, l);
            let n_in = self.widths[l];
            let mut zl = Array2::<f32>::zeros((batch.len(), self.widths[l + 1]));
            general_mat_mul(1.0, &a, &w.slice(s![.., ..n_in]).t(), 0.0, &mut zl);
            zl.rows_mut().into_iter().for_each(|mut row| row += &w.column(n_in));
            h.push(a);
            z.push(zl);
        }
        Forward { z, h }
    }
}

fn gather(x: &[f32], xd: usize, d: usize, batch: &[usize]) -> Array2<f32> {
    let mut xb = Array2::<f32>::zeros((batch.len(), d));
    let c = xd.min(d);
    for (r, &i) in batch.iter().enumerate() {
        xb.row_mut(r).slice_mut(s![..c]).assign(&ndarray::ArrayView1::from(&x[i * xd..i * xd + c]));
    }
    xb
}

impl Model for Mlp {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }
    fn num_params(&self) -> usize {
        *self.offsets.last().unwrap()
    }
    fn layout(&self) -> RowLayout {
        let mut offsets = vec![0];
        for l in 0..self.layers() {
            for _ in 0..self.widths[l + 1] {
                offsets.push(offsets.last().unwrap() + self.widths[l] + 1);
            }
        }
        RowLayout { offsets }
    }
    fn init(&self, params: &mut [f32], rng: &mut Rng) {
        // He initialisation for ReLU layers; zero biases.
        for l in 0..self.layers() {
            let n_in = self.widths[l];
            let std = (2.0 / n_in as f64).sqrt();
            for row in params[self.offsets[l]..self.offsets[l + 1]].chunks_mut(n_in + 1) {
                row[..n_in].iter_mut().for_each(|w| *w = (rng.normal() * std) as f32);
                row[n_in] = 0.0;
            }
        }
    }
    fn loss_grad(&self, params: &[f32], data: &Dataset, batch: &[usize], grad: &mut [f32]) -> f64 {
        let mut f = self.forward(params, data, batch);
        let last = self.layers() - 1;
        let (loss, _) =
            super::softmax_residual(&mut f.z[last], batch.iter().map(|&i| super::class_of(data.labels[i])), 1.0 / batch.len() as f32);
        let mut g = f.z.pop().unwrap(); // dL/dz of the current layer
        for l in (0..self.layers()).rev() {
            let n_in = self.widths[l];
            let w = self.w(params, l);
            let mut gw =
                ArrayViewMut2::from_shape((self.widths[l + 1], n_in + 1), &mut grad[self.offsets[l]..self.offsets[l + 1]]).unwrap();
            // Regulariser on weights.
            gw.slice_mut(s![.., ..n_in]).scaled_add(self.spec.lambda, &w.slice(s![.., ..n_in]));
            for (c, col) in g.columns().into_iter().enumerate() {
                gw[[c, n_in]] += col.sum();
            }
            if l == 0 {
                match &data.features {
                    Features::Dense { x, d: xd } => {
                        let xb = gather(x, *xd, n_in, batch);
                        general_mat_mul(1.0, &g.t(), &xb, 1.0, &mut gw.slice_mut(s![.., ..n_in]));
                    }
                    _ => {
                        for (r, &i) in batch.iter().enumerate() {
                            if let Row::Sparse { indices, values } = data.row(i) {
                                for (&k, &v) in indices.iter().zip(values) {
                                    gw.column_mut(k as usize).scaled_add(v, &g.row(r));
                                }
                            }
                        }
                    }
                }
            } else {
                let a = &f.h[l - 1];
                general_mat_mul(1.0, &g.t(), a, 1.0, &mut gw.slice_mut(s![.., ..n_in]));
                let mut gh = Array2::<f32>::zeros((batch.len(), n_in));
                general_mat_mul(1.0, &g, &w.slice(s![.., ..n_in]), 0.0, &mut gh);
                let zprev = f.z.pop().unwrap();
                gh.zip_mut_with(&zprev, |d, &z| {
                    if z <= 0.0 {
                        *d = 0.0
                    }
                });
                g = gh;
            }
        }
        loss / batch.len() as f64
    }
    fn regulariser(&self, params: &[f32]) -> f64 {
        let mut s = 0.0;
        for l in 0..self.layers() {
            let n_in = self.widths[l];
            for row in params[self.offsets[l]..self.offsets[l + 1]].chunks(n_in + 1) {
                s += row[..n_in].iter().map(|&w| (w as f64).powi(2)).sum::<f64>();
            }
        }
        0.5 * self.spec.lambda as f64 * s
    }
    fn evaluate(&self, params: &[f32], data: &Dataset) -> EvalSums {
        let mut s = EvalSums::default();
        let idx: Vec<usize> = (0..data.len()).collect();
        for chunk in idx.chunks(512) {
            let mut f = self.forward(params, data, chunk);
            let last = self.layers() - 1;
            let (loss, correct) = super::softmax_residual(&mut f.z[last], chunk.iter().map(|&i| super::class_of(data.labels[i])), 1.0);
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
        let last = self.layers() - 1;
        idx.chunks(512).flat_map(|chunk| super::argmax_rows(&self.forward(params, data, chunk).z[last]).collect::<Vec<_>>()).collect()
    }
    fn describe_layout(&self) -> String {
        let blocks: Vec<String> = (0..self.layers())
            .map(|l| {
                format!(
                    "layer {}: {} rows (one per neuron) of {} incoming weights then the bias",
                    l + 1,
                    self.widths[l + 1],
                    self.widths[l]
                )
            })
            .collect();
        format!("mlp (ReLU hidden layers, softmax output; the last layer's rows are the classes in label order): {}", blocks.join("; "))
    }
}
