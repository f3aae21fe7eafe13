//! Models trained by mini-batch SGD. No MPI in here. Parameters are one flat `f32` vector with a
//! row structure ([`RowLayout`]) so that sync modes can exchange whole rows.

use crate::data::Dataset;
use crate::rng::Rng;

/// Which model to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Linear SVM, hinge loss + L2 (labels > 0 are +1, others -1).
    Svm,
    /// Binary logistic regression + L2 (labels > 0 are +1, others -1).
    Logreg,
    /// Multiclass softmax ("multinomial logistic") regression + L2; labels are 0..J-1.
    Mlr,
    /// Matrix factorisation of ratings, squared loss + L2.
    Mf,
    /// Small multilayer perceptron (ReLU hidden layers, softmax output) + L2.
    Mlp,
    /// Least squares: linear regression, squared loss 1/2 (x.w + b - y)^2 + L2 (labels as read).
    Lsq,
    /// Latent Dirichlet allocation by collapsed Gibbs sampling (not SGD: trained by
    /// `train::lda`, its word-topic counts are the shared rows).
    Lda,
}

/// Everything needed to build a model. Dimensions are global (agreed across ranks by the caller).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelSpec {
    pub kind: ModelKind,
    /// L2 regularisation strength.
    pub lambda: f32,
    /// Input features (unused by MF).
    pub features: usize,
    /// Classes for MLR/MLP (>= 2).
    pub classes: usize,
    /// Hidden layer widths for MLP (one or two entries).
    pub hidden: Vec<usize>,
    /// Latent factors per user and item for MF (the factorisation's rank k).
    #[serde(alias = "rank")]
    pub factors: usize,
    /// Users and items for MF.
    pub users: usize,
    pub items: usize,
}

/// How the flat parameter vector splits into rows (the unit a parameter server shards and pushes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowLayout {
    /// Row `r` is `params[offsets[r]..offsets[r+1]]`; `offsets.len() == rows + 1`.
    pub offsets: Vec<usize>,
}

impl RowLayout {
    /// `rows` rows of `row_len` each.
    pub fn uniform(rows: usize, row_len: usize) -> Self {
        RowLayout { offsets: (0..=rows).map(|r| r * row_len).collect() }
    }
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.offsets.len() - 1
    }
    /// Parameter range of row `r`.
    pub fn range(&self, r: usize) -> std::ops::Range<usize> {
        self.offsets[r]..self.offsets[r + 1]
    }
}

/// Which held-out metric a model reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricKind {
    /// Fraction of examples classified correctly (higher is better).
    Accuracy,
    /// Root mean squared error (lower is better).
    Rmse,
}

/// Sums over a shard, so that ranks can add them up with one reduction before dividing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalSums {
    /// Sum of per-example losses (no regulariser).
    pub loss_sum: f64,
    /// Number of correct predictions (accuracy) or sum of squared errors (RMSE).
    pub metric_sum: f64,
    /// Examples seen.
    pub count: f64,
}

impl EvalSums {
    /// Adds another shard's sums.
    pub fn add(&mut self, o: &EvalSums) {
        self.loss_sum += o.loss_sum;
        self.metric_sum += o.metric_sum;
        self.count += o.count;
    }
    /// Mean loss (without regulariser).
    pub fn mean_loss(&self) -> f64 {
        self.loss_sum / self.count.max(1.0)
    }
    /// The metric value (accuracy in [0,1] or RMSE).
    pub fn metric(&self, kind: MetricKind) -> f64 {
        match kind {
            MetricKind::Accuracy => self.metric_sum / self.count.max(1.0),
            MetricKind::Rmse => (self.metric_sum / self.count.max(1.0)).sqrt(),
        }
    }
}

/// A model trained by SGD on a flat parameter vector.
///
/// The training objective is `mean_i loss(w; x_i, y_i) + regulariser(w)`.
pub trait Model: Send + Sync {
    /// The spec it was built from.
    fn spec(&self) -> &ModelSpec;
    /// Length of the flat parameter vector.
    fn num_params(&self) -> usize;
    /// Row structure of the parameter vector.
    fn layout(&self) -> RowLayout;
    /// Initial parameters (deterministic given the RNG).
    fn init(&self, params: &mut [f32], rng: &mut Rng);
    /// Mean loss over `batch` (regulariser excluded); ADDS the gradient of
    /// `mean batch loss + regulariser` into `grad` (which has `num_params()` entries).
    fn loss_grad(&self, params: &[f32], data: &Dataset, batch: &[usize], grad: &mut [f32]) -> f64;
    /// One SGD step `w <- w - lr * grad` on `batch`; returns the mean batch loss. Models override
    /// this to touch only the parameters a sparse batch reaches (regulariser applied lazily or
    /// to touched rows as documented by the model).
    fn sgd_step(&self, params: &mut [f32], data: &Dataset, batch: &[usize], lr: f32, scratch: &mut Vec<f32>) -> f64 {
        scratch.clear();
        scratch.resize(params.len(), 0.0);
        let loss = self.loss_grad(params, data, batch, scratch);
        for (w, g) in params.iter_mut().zip(scratch.iter()) {
            *w -= lr * g;
        }
        loss
    }
    /// The regulariser's value at `params` (0 where the loss holds it: MF's is per rating).
    fn regulariser(&self, params: &[f32]) -> f64;
    /// What the objective is, in words, where "mean training loss + L2 regulariser" would not
    /// say it (empty otherwise).
    fn objective_definition(&self) -> &'static str {
        ""
    }
    /// Loss and metric sums over the whole shard `data`.
    fn evaluate(&self, params: &[f32], data: &Dataset) -> EvalSums;
    /// Which metric [`Model::evaluate`] measures.
    fn metric_kind(&self) -> MetricKind;
    /// The model's output for every example of `data`, decided as [`Model::evaluate`] decides
    /// (so counting the outputs that match the labels gives its metric): the class index for
    /// mlr/mlp, +1 or -1 for svm/logreg, the predicted value for lsq and mf.
    fn predict(&self, params: &[f32], data: &Dataset) -> Vec<f32>;
    /// How the flat parameter vector is laid out, in words (stored with a saved model).
    fn describe_layout(&self) -> String;
    /// The model as a [`MarginLoss`], when it is one (what SAGA needs to keep one scalar per
    /// example); None for models whose gradient is not a multiple of the input.
    fn margin_loss(&self) -> Option<&dyn MarginLoss> {
        None
    }
}

/// A linear model `z = x.w + b` (w = `params[..d]`, b = `params[d]`) whose per-example loss
/// depends on the parameters only through z, plus `lambda/2 ||w||^2`: the gradient of example i
/// is `slope_i * (x_i, 1)`, so one scalar per example recovers it at any earlier model (SAGA).
pub trait MarginLoss {
    /// d, the number of weights before the bias.
    fn features(&self) -> usize;
    /// The L2 strength (on w, not on b).
    fn lambda(&self) -> f32;
    /// Example `i`'s (loss, d loss / d z) at `params`.
    fn loss_slope(&self, params: &[f32], data: &Dataset, i: usize) -> (f64, f32);
}

pub mod lda;
pub mod lda_moves;
pub mod linear;
pub mod mf;
pub mod mlp;
pub mod mlr;

use crate::data::Row;

/// x . w for a dense or sparse row (w may be longer than a dense row). A dense row goes through
/// BLAS sdot: the crate is built for baseline x86-64 (SSE2, no FMA) and an iterator's f32 sum is
/// kept in order, so the plain loop is one scalar add chain (about 3 cycles a feature); OpenBLAS
/// picks AVX2/FMA kernels at run time. bench, load 1.9: svm 1.32M -> 2.95M examples/s, logreg
/// 1.26M -> 2.19M (benches/kernels.md).
pub fn row_dot(row: Row<'_>, w: &[f32]) -> f32 {
    match row {
        Row::Dense(x) => {
            let n = x.len().min(w.len());
            ndarray::ArrayView1::from(&x[..n]).dot(&ndarray::ArrayView1::from(&w[..n]))
        }
        Row::Sparse { indices, values } => indices.iter().zip(values).map(|(&k, &v)| v * w[k as usize]).sum(),
        Row::Rating { .. } => 0.0,
    }
}

/// w += a * x for a dense or sparse row, touching only the row's non-zeros. The compiled loop
/// (SSE2, vectorised: no reduction) is kept: ndarray has no safe saxpy, and an n x 1 sgemv is run
/// by OpenBLAS as n dot products of length 1 (logreg 1.53M examples/s against 2.19M with this
/// loop, load 1.9). Dense batches of the linear models skip it ([`linear::Linear`]'s dense step).
pub fn row_axpy(row: Row<'_>, a: f32, w: &mut [f32]) {
    match row {
        Row::Dense(x) => w.iter_mut().zip(x).for_each(|(w, &v)| *w += a * v),
        Row::Sparse { indices, values } => indices.iter().zip(values).for_each(|(&k, &v)| w[k as usize] += a * v),
        Row::Rating { .. } => {}
    }
}

/// Copies the dense rows `batch` of `x` (rows of `xd`) into `buf` as a B x n matrix (n <= xd:
/// their first n features); `buf` holds exactly B x n values. Only the batch is copied, into a
/// buffer the caller keeps, so a step neither allocates nor zero-fills it.
pub(crate) fn gather_rows<'a>(x: &[f32], xd: usize, n: usize, batch: &[usize], buf: &'a mut [f32]) -> ndarray::ArrayView2<'a, f32> {
    for (dst, &i) in buf.chunks_exact_mut(n.max(1)).zip(batch) {
        dst.copy_from_slice(&x[i * xd..i * xd + n]);
    }
    ndarray::ArrayView2::from_shape((batch.len(), n), buf).expect("the buffer holds B x n values")
}

/// Class index of a label (labels outside 0..J never match a class).
pub(crate) fn class_of(y: f32) -> usize {
    if y >= 0.0 {
        y as usize
    } else {
        usize::MAX
    }
}

/// The index of each row's largest score, the first one on ties (as [`softmax_residual`] decides).
pub(crate) fn argmax_rows(z: &ndarray::Array2<f32>) -> impl Iterator<Item = f32> + '_ {
    z.rows()
        .into_iter()
        .map(|row| row.iter().enumerate().fold((0, f32::NEG_INFINITY), |a, (k, &v)| if v > a.1 { (k, v) } else { a }).0 as f32)
}

/// Softmax cross entropy on a B x J score matrix, in place: each row becomes
/// (probabilities - onehot(label)) * `scale`. Returns (summed loss, correct predictions).
pub(crate) fn softmax_residual(z: &mut ndarray::ArrayRef2<f32>, labels: impl Iterator<Item = usize>, scale: f32) -> (f64, usize) {
    let mut loss = 0.0;
    let mut correct = 0;
    for (mut row, y) in z.rows_mut().into_iter().zip(labels) {
        let (arg, max) = row.iter().enumerate().fold((0, f32::NEG_INFINITY), |a, (k, &v)| if v > a.1 { (k, v) } else { a });
        correct += (arg == y) as usize;
        let mut sum = 0f32;
        row.iter_mut().for_each(|v| {
            *v = (*v - max).exp();
            sum += *v;
        });
        loss -= ((row.get(y).copied().unwrap_or(0.0) / sum).max(1e-30) as f64).ln();
        row.iter_mut().for_each(|v| *v = *v / sum * scale);
        if let Some(v) = row.get_mut(y) {
            *v -= scale;
        }
    }
    (loss, correct)
}

/// Builds the model `spec` describes, checking its sizes.
pub fn build(spec: &ModelSpec) -> anyhow::Result<Box<dyn Model>> {
    Ok(match spec.kind {
        ModelKind::Svm | ModelKind::Logreg | ModelKind::Lsq => {
            anyhow::ensure!(spec.features > 0, "the data has no features");
            Box::new(linear::Linear::new(spec))
        }
        ModelKind::Mlr => {
            anyhow::ensure!(spec.features > 0 && spec.classes >= 2, "mlr needs features and at least 2 classes");
            Box::new(mlr::Mlr::new(spec))
        }
        ModelKind::Mlp => {
            anyhow::ensure!(
                (1..=2).contains(&spec.hidden.len()) && spec.hidden.iter().all(|&h| h > 0),
                "--hidden takes one or two positive widths for mlp, got {:?}",
                spec.hidden
            );
            Box::new(mlp::Mlp::new(spec))
        }
        ModelKind::Lda => anyhow::bail!("--model lda is trained by Gibbs sampling (train::lda), not by SGD"),
        ModelKind::Mf => {
            anyhow::ensure!(spec.factors > 0, "--factors must be positive for mf");
            anyhow::ensure!(spec.users > 0 && spec.items > 0, "mf needs ratings with at least one user and item");
            Box::new(mf::Mf::new(spec))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Csr, Dataset, Features};

    fn spec(kind: ModelKind, features: usize) -> ModelSpec {
        ModelSpec { kind, lambda: 0.01, features, classes: 3, hidden: vec![5], factors: 3, users: 4, items: 5 }
    }

    fn dense(n: usize, d: usize, classes: usize, rng: &mut Rng) -> Dataset {
        let x: Vec<f32> = (0..n * d).map(|_| rng.normal() as f32).collect();
        let labels = (0..n).map(|i| (i % classes) as f32).collect();
        Dataset { features: Features::Dense { x, d }, labels, source: "synthetic".into(), first_row: 0 }
    }

    fn sparse(n: usize, d: usize, classes: usize, rng: &mut Rng) -> Dataset {
        let mut c = Csr { indptr: vec![0], ncols: d, ..Default::default() };
        for _ in 0..n {
            for k in 0..d {
                if rng.next_f64() < 0.4 {
                    c.indices.push(k as u32);
                    c.data.push(rng.normal() as f32);
                }
            }
            c.indptr.push(c.indices.len());
        }
        Dataset { features: Features::Sparse(c), labels: (0..n).map(|i| (i % classes) as f32).collect(), source: "s".into(), first_row: 0 }
    }

    fn ratings(rng: &mut Rng) -> Dataset {
        let (mut users, mut items, mut labels) = (vec![], vec![], vec![]);
        for u in 0..4 {
            for i in 0..5 {
                users.push(u);
                items.push(i);
                labels.push(1.0 + rng.next_f32() * 4.0);
            }
        }
        Dataset { features: Features::Ratings { users, items, n_users: 4, n_items: 5 }, labels, source: "r".into(), first_row: 0 }
    }

    /// Central differences of (mean batch loss + regulariser) against loss_grad.
    fn check_gradient(m: &dyn Model, data: &Dataset, rng: &mut Rng) {
        let mut p = vec![0f32; m.num_params()];
        m.init(&mut p, rng);
        p.iter_mut().for_each(|w| *w += 0.3 * rng.normal() as f32);
        let batch: Vec<usize> = (0..data.len()).collect();
        let mut g = vec![0f32; p.len()];
        m.loss_grad(&p, data, &batch, &mut g);
        let f = |q: &[f32]| {
            let mut sink = vec![0f32; q.len()];
            m.loss_grad(q, data, &batch, &mut sink) + m.regulariser(q)
        };
        // Small enough that a ReLU kink is rarely crossed, large enough for f32 round-off.
        let h = 1e-3f32;
        for k in 0..p.len() {
            let mut a = p.clone();
            a[k] += h;
            let mut b = p.clone();
            b[k] -= h;
            let num = (f(&a) - f(&b)) / (2.0 * h as f64);
            let tol = 2e-2 * num.abs().max(g[k].abs() as f64).max(1e-2);
            assert!(
                (num - g[k] as f64).abs() < tol,
                "{:?} {} hidden {:?} param {k}: numeric {num}, analytic {}",
                m.spec().kind,
                data.source,
                m.spec().hidden,
                g[k]
            );
        }
        // The objective's data term equals what evaluate sums.
        let e = m.evaluate(&p, data);
        let mut sink = vec![0f32; p.len()];
        let l = m.loss_grad(&p, data, &batch, &mut sink);
        assert!((e.mean_loss() - l).abs() < 1e-4 * l.abs().max(1.0));
    }

    #[test]
    fn gradients_match_finite_differences() {
        let mut rng = Rng::new(3);
        for kind in [ModelKind::Svm, ModelKind::Logreg, ModelKind::Lsq, ModelKind::Mlr, ModelKind::Mlp] {
            let m = build(&spec(kind, 4)).unwrap();
            let d = dense(9, 4, 3, &mut rng);
            check_gradient(m.as_ref(), &d, &mut rng);
            let s = sparse(9, 4, 3, &mut rng);
            check_gradient(m.as_ref(), &s, &mut rng);
        }
        let m = build(&spec(ModelKind::Mf, 0)).unwrap();
        check_gradient(m.as_ref(), &ratings(&mut rng), &mut rng);
        let two = ModelSpec { hidden: vec![4, 3], ..spec(ModelKind::Mlp, 4) };
        check_gradient(build(&two).unwrap().as_ref(), &dense(7, 4, 3, &mut rng), &mut rng);
    }

    /// `predict` decides as `evaluate` does: its outputs reproduce the metric's sums exactly
    /// (classifiers) or to rounding (regression), on dense, sparse and ratings data.
    #[test]
    fn predictions_reproduce_the_evaluated_metric() {
        let mut rng = Rng::new(4);
        for kind in [ModelKind::Svm, ModelKind::Logreg, ModelKind::Lsq, ModelKind::Mlr, ModelKind::Mlp, ModelKind::Mf] {
            let m = build(&spec(kind, 4)).unwrap();
            let sets =
                if kind == ModelKind::Mf { vec![ratings(&mut rng)] } else { vec![dense(700, 4, 3, &mut rng), sparse(600, 4, 3, &mut rng)] };
            for data in sets {
                let mut p = vec![0f32; m.num_params()];
                m.init(&mut p, &mut rng);
                p.iter_mut().for_each(|w| *w += rng.normal() as f32);
                let pred = m.predict(&p, &data);
                assert_eq!(pred.len(), data.len());
                let e = m.evaluate(&p, &data);
                let sum: f64 = match kind {
                    ModelKind::Svm | ModelKind::Logreg => {
                        pred.iter().zip(&data.labels).filter(|(p, &y)| **p == if y > 0.0 { 1.0 } else { -1.0 }).count() as f64
                    }
                    ModelKind::Mlr | ModelKind::Mlp => pred.iter().zip(&data.labels).filter(|(p, y)| p == y).count() as f64,
                    _ => pred.iter().zip(&data.labels).map(|(p, y)| ((y - p) as f64).powi(2)).sum(),
                };
                assert!(
                    (sum - e.metric_sum).abs() <= 1e-9 * e.metric_sum.abs().max(1.0),
                    "{kind:?} {}: {sum} against {}",
                    data.source,
                    e.metric_sum
                );
                assert!(!m.describe_layout().is_empty());
            }
        }
    }

    #[test]
    fn sgd_step_equals_a_gradient_step_for_dense_and_sparse() {
        let mut rng = Rng::new(9);
        let mut specs: Vec<ModelSpec> =
            [ModelKind::Svm, ModelKind::Logreg, ModelKind::Lsq, ModelKind::Mlr, ModelKind::Mlp].map(|k| spec(k, 4)).into();
        // Two hidden layers: the in-place step passes deltas through each layer before updating it.
        specs.push(ModelSpec { hidden: vec![4, 3], ..spec(ModelKind::Mlp, 4) });
        for s in specs {
            let kind = s.kind;
            for data in [dense(8, 4, 3, &mut rng), sparse(8, 4, 3, &mut rng)] {
                let m = build(&s).unwrap();
                let mut p = vec![0f32; m.num_params()];
                m.init(&mut p, &mut rng);
                p.iter_mut().for_each(|w| *w += 0.2 * rng.normal() as f32);
                let batch = [1, 3, 4, 7];
                let mut g = vec![0f32; p.len()];
                m.loss_grad(&p, &data, &batch, &mut g);
                let mut q = p.clone();
                // A scratch left over from a larger step: the dense steps keep and reuse it.
                m.sgd_step(&mut q, &data, &batch, 0.1, &mut vec![1e3; 200]);
                for k in 0..p.len() {
                    assert!((q[k] - (p[k] - 0.1 * g[k])).abs() < 1e-5, "{kind:?} hidden {:?} param {k}", s.hidden);
                }
            }
        }
    }

    /// Two Gaussian blobs per class; every classifier should separate them.
    #[test]
    fn classifiers_learn_a_separable_problem() {
        let mut rng = Rng::new(5);
        let (n, d) = (300, 6);
        let mut x = Vec::new();
        let mut y = Vec::new();
        for i in 0..n {
            let c = i % 3;
            for k in 0..d {
                x.push(rng.normal() as f32 * 0.5 + if k == c { 3.0 } else { 0.0 });
            }
            y.push(c as f32);
        }
        let multi = Dataset { features: Features::Dense { x, d }, labels: y.clone(), source: "b".into(), first_row: 0 };
        let mut binary = multi.clone();
        binary.labels.iter_mut().for_each(|v| *v = if *v == 0.0 { 1.0 } else { -1.0 });
        for kind in [ModelKind::Svm, ModelKind::Logreg, ModelKind::Mlr, ModelKind::Mlp] {
            let m = build(&ModelSpec { lambda: 1e-4, features: d, hidden: vec![16], ..spec(kind, d) }).unwrap();
            let data = if matches!(kind, ModelKind::Svm | ModelKind::Logreg) { &binary } else { &multi };
            let mut p = vec![0f32; m.num_params()];
            m.init(&mut p, &mut Rng::new(1));
            let mut order: Vec<usize> = (0..n).collect();
            for _ in 0..10 {
                rng.shuffle(&mut order);
                for b in order.chunks(10) {
                    m.sgd_step(&mut p, data, b, 0.1, &mut Vec::new());
                }
            }
            let acc = m.evaluate(&p, data).metric(MetricKind::Accuracy);
            assert!(acc > 0.95, "{kind:?}: accuracy {acc}");
        }
    }

    #[test]
    fn mf_recovers_a_low_rank_matrix() {
        let mut rng = Rng::new(11);
        let (nu, ni, k) = (30, 20, 2);
        let a: Vec<f32> = (0..nu * k).map(|_| rng.normal() as f32).collect();
        let b: Vec<f32> = (0..ni * k).map(|_| rng.normal() as f32).collect();
        let (mut users, mut items, mut labels) = (vec![], vec![], vec![]);
        for u in 0..nu {
            for i in 0..ni {
                users.push(u as u32);
                items.push(i as u32);
                labels.push((0..k).map(|t| a[u * k + t] * b[i * k + t]).sum());
            }
        }
        let data =
            Dataset { features: Features::Ratings { users, items, n_users: nu, n_items: ni }, labels, source: "r".into(), first_row: 0 };
        let m = build(&ModelSpec {
            kind: ModelKind::Mf,
            lambda: 1e-4,
            features: 0,
            classes: 2,
            hidden: vec![],
            factors: 3,
            users: nu,
            items: ni,
        })
        .unwrap();
        let mut p = vec![0f32; m.num_params()];
        m.init(&mut p, &mut Rng::new(2));
        let start = m.evaluate(&p, &data).metric(MetricKind::Rmse);
        let mut order: Vec<usize> = (0..data.len()).collect();
        for _ in 0..300 {
            rng.shuffle(&mut order);
            for bch in order.chunks(4) {
                m.sgd_step(&mut p, &data, bch, 0.2, &mut Vec::new());
            }
        }
        let rmse = m.evaluate(&p, &data).metric(MetricKind::Rmse);
        assert!(rmse < 0.1 && rmse < start / 5.0, "rmse {start} -> {rmse}");
    }
}
