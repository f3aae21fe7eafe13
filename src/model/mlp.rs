//! A small multilayer perceptron: one or two ReLU hidden layers, softmax output, cross entropy,
//! L2 on the weights. Each layer is a block of rows, one row per neuron: its incoming weights
//! then its bias. Sparse inputs are multiplied one non-zero at a time in the first layer; a dense
//! batch is gathered once for the forward pass and the first layer's gradient, and an SGD step
//! writes its update into the parameters as it back-propagates.

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

    /// The batch's first-layer input: dense rows gathered into `buf` (grown as needed, never
    /// zero-filled; gathered once for the forward pass and the first layer's gradient), or None
    /// for sparse rows.
    fn input<'a>(&self, data: &Dataset, batch: &[usize], buf: &'a mut Vec<f32>) -> Option<ArrayView2<'a, f32>> {
        let Features::Dense { x, d: xd } = &data.features else { return None };
        let n = (*xd).min(self.widths[0]);
        if buf.len() < batch.len() * n {
            buf.resize(batch.len() * n, 0.0);
        }
        Some(super::gather_rows(x, *xd, n, batch, &mut buf[..batch.len() * n]))
    }

    fn first_layer(&self, params: &[f32], data: &Dataset, batch: &[usize], xb: Option<&ArrayView2<f32>>) -> Array2<f32> {
        let (d, h) = (self.widths[0], self.widths[1]);
        let w = self.w(params, 0);
        let mut z = Array2::<f32>::zeros((batch.len(), h));
        match xb {
            Some(xb) => general_mat_mul(1.0, xb, &w.slice(s![.., ..xb.ncols()]).t(), 0.0, &mut z),
            None => {
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

    fn forward(&self, params: &[f32], data: &Dataset, batch: &[usize], xb: Option<&ArrayView2<f32>>) -> Forward {
        let mut z = vec![self.first_layer(params, data, batch, xb)];
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

    /// Back-propagation from the output deltas (the last z of `f`, softmax residuals): each
    /// layer's weights become beta W + alpha g^T a and its biases b + alpha (column sums of g) in
    /// `out`. The weights the deltas pass back through are read from `params`, or, when it is
    /// None, from `out` itself before the layer is overwritten: the SGD step then updates the
    /// parameters in place, with no gradient vector to zero and add (a 400 KB memset and a pass
    /// over the 101,770 parameters each step at hidden 128). With the input gathered once:
    /// 100.4k -> 72.1k instructions an example (callgrind), bench per CPU second 168k -> 204k
    /// examples/s (load 8-11, benches/kernels.md).
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        params: Option<&[f32]>,
        out: &mut [f32],
        mut f: Forward,
        xb: Option<&ArrayView2<f32>>,
        data: &Dataset,
        batch: &[usize],
        alpha: f32,
        beta: f32,
    ) {
        let mut g = f.z.pop().expect("an output layer"); // dL/dz of the current layer
        for l in (0..self.layers()).rev() {
            let n_in = self.widths[l];
            // The deltas below this layer, through its weights before they change.
            let below = (l > 0).then(|| {
                let mut gh = Array2::<f32>::zeros((batch.len(), n_in));
                general_mat_mul(1.0, &g, &self.w(params.unwrap_or(out), l).slice(s![.., ..n_in]), 0.0, &mut gh);
                gh.zip_mut_with(&f.z[l - 1], |d, &z| {
                    if z <= 0.0 {
                        *d = 0.0
                    }
                });
                gh
            });
            let mut gw = ArrayViewMut2::from_shape((self.widths[l + 1], n_in + 1), &mut out[self.offsets[l]..self.offsets[l + 1]]).unwrap();
            for (c, col) in g.columns().into_iter().enumerate() {
                gw[[c, n_in]] += alpha * col.sum();
            }
            match (l, xb) {
                (0, Some(xb)) => {
                    let n = xb.ncols();
                    general_mat_mul(alpha, &g.t(), xb, beta, &mut gw.slice_mut(s![.., ..n]));
                    if beta != 1.0 {
                        gw.slice_mut(s![.., n..n_in]).iter_mut().for_each(|v| *v *= beta);
                    }
                }
                (0, None) => {
                    if beta != 1.0 {
                        gw.slice_mut(s![.., ..n_in]).iter_mut().for_each(|v| *v *= beta);
                    }
                    for (r, &i) in batch.iter().enumerate() {
                        if let Row::Sparse { indices, values } = data.row(i) {
                            for (&k, &v) in indices.iter().zip(values) {
                                gw.column_mut(k as usize).scaled_add(alpha * v, &g.row(r));
                            }
                        }
                    }
                }
                _ => general_mat_mul(alpha, &g.t(), &f.h[l - 1], beta, &mut gw.slice_mut(s![.., ..n_in])),
            }
            if let Some(gh) = below {
                g = gh;
            }
        }
    }
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
        let mut buf = Vec::new();
        let xb = self.input(data, batch, &mut buf);
        let mut f = self.forward(params, data, batch, xb.as_ref());
        let last = self.layers() - 1;
        let (loss, _) =
            super::softmax_residual(&mut f.z[last], batch.iter().map(|&i| super::class_of(data.labels[i])), 1.0 / batch.len() as f32);
        // Regulariser on the weights, then the data term.
        for l in 0..self.layers() {
            let n_in = self.widths[l];
            let w = self.w(params, l);
            let mut gw =
                ArrayViewMut2::from_shape((self.widths[l + 1], n_in + 1), &mut grad[self.offsets[l]..self.offsets[l + 1]]).unwrap();
            gw.slice_mut(s![.., ..n_in]).scaled_add(self.spec.lambda, &w.slice(s![.., ..n_in]));
        }
        self.backward(Some(params), grad, f, xb.as_ref(), data, batch, 1.0, 1.0);
        loss / batch.len() as f64
    }
    fn sgd_step(&self, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, scratch: &mut Vec<f32>) -> f64 {
        let xb = self.input(data, batch, scratch);
        let mut f = self.forward(params, data, batch, xb.as_ref());
        let last = self.layers() - 1;
        let (loss, _) =
            super::softmax_residual(&mut f.z[last], batch.iter().map(|&i| super::class_of(data.labels[i])), 1.0 / batch.len() as f32);
        // W <- (1 - lr lambda) W - lr g^T a, layer by layer in place.
        self.backward(None, params, f, xb.as_ref(), data, batch, -lr, 1.0 - lr * self.spec.lambda);
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
            let mut buf = Vec::new();
            let xb = self.input(data, chunk, &mut buf);
            let mut f = self.forward(params, data, chunk, xb.as_ref());
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
        let mut buf = Vec::new();
        idx.chunks(512)
            .flat_map(|chunk| {
                let xb = self.input(data, chunk, &mut buf);
                super::argmax_rows(&self.forward(params, data, chunk, xb.as_ref()).z[last]).collect::<Vec<_>>()
            })
            .collect()
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
