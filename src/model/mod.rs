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
    /// Factor rank k for MF.
    pub rank: usize,
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
    /// The regulariser's value at `params`.
    fn regulariser(&self, params: &[f32]) -> f64;
    /// Loss and metric sums over the whole shard `data`.
    fn evaluate(&self, params: &[f32], data: &Dataset) -> EvalSums;
    /// Which metric [`Model::evaluate`] measures.
    fn metric_kind(&self) -> MetricKind;
}
