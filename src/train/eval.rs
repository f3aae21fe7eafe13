//! Collective evaluation of a training run: the run's model (averaged replicas or server shards) on the held-out (or training) set,
//! the training objective, the consensus distance of the replicas, and time/byte counters
//! summarised over ranks. The extra allreduces done here are not counted as training traffic.

use mpi::topology::{Communicator, SimpleCommunicator};

use crate::comm::collectives;
use crate::data::Dataset;
use crate::model::{EvalSums, MetricKind, Model};

/// The numbers of one evaluation.
#[derive(Clone, Debug, Default)]
pub struct Evaluation {
    /// Mean training loss + regulariser of the averaged model.
    pub objective: f64,
    /// Held-out metric of the averaged model (training metric when there is no held-out set).
    pub metric: f64,
    /// Training-set metric of the averaged model.
    pub train_metric: f64,
    /// Mean over ranks of ||w_i - w_bar||.
    pub consensus_distance: f64,
}

/// Sums of `model` at `params` over every rank's shard of `data`.
pub fn global_sums(comm: &SimpleCommunicator, model: &dyn Model, params: &[f32], data: &Dataset) -> EvalSums {
    let s = model.evaluate(params, data);
    let mut v = [s.loss_sum, s.metric_sum, s.count];
    collectives::sum_f64(comm, &mut v);
    EvalSums { loss_sum: v[0], metric_sum: v[1], count: v[2] }
}

/// Average of all replicas (into `avg`), without touching `params`.
pub fn average_model(comm: &SimpleCommunicator, params: &[f32], avg: &mut Vec<f32>) {
    avg.clear();
    avg.extend_from_slice(params);
    let mut scratch = Vec::new();
    collectives::sum_f32(comm, avg, &mut scratch);
    let inv = 1.0 / comm.size() as f32;
    avg.iter_mut().for_each(|w| *w *= inv);
}

/// Collective evaluation of a run's model: the sum over ranks of `model_part` when the mode gives
/// one (a parameter server's shards), else the average of the replicas `params`. The consensus
/// distance is always that of the replicas.
pub fn evaluate(
    comm: &SimpleCommunicator,
    model: &dyn Model,
    params: &[f32],
    model_part: Option<Vec<f32>>,
    train: &Dataset,
    test: Option<&Dataset>,
) -> Evaluation {
    let mut avg = Vec::new();
    average_model(comm, params, &mut avg);
    let local_dist: f64 = params.iter().zip(&avg).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
    if let Some(mut part) = model_part {
        collectives::sum_f32(comm, &mut part, &mut Vec::new());
        avg = part;
    }
    let mut d = [local_dist];
    collectives::sum_f64(comm, &mut d);
    let kind = model.metric_kind();
    let tr = global_sums(comm, model, &avg, train);
    let metric = match test {
        Some(t) => global_sums(comm, model, &avg, t).metric(kind),
        None => tr.metric(kind),
    };
    Evaluation {
        objective: tr.mean_loss() + model.regulariser(&avg),
        metric,
        train_metric: tr.metric(kind),
        consensus_distance: d[0] / comm.size() as f64,
    }
}

/// Each rank's own replica evaluated on the whole held-out (or training) set, gathered at rank 0
/// (other ranks get an empty vector). Models are broadcast one at a time and every rank evaluates
/// its own shard, so no rank ever holds the whole data set.
pub fn per_rank_metrics(
    comm: &SimpleCommunicator,
    model: &dyn Model,
    params: &[f32],
    data: &Dataset,
) -> Vec<f64> {
    let kind = model.metric_kind();
    let mut buf = vec![0f32; params.len()];
    let mut out = Vec::new();
    for r in 0..comm.size() as usize {
        if r == comm.rank() as usize {
            buf.copy_from_slice(params);
        }
        collectives::broadcast_f32(comm, r, &mut buf);
        out.push(global_sums(comm, model, &buf, data).metric(kind));
    }
    if comm.rank() == 0 { out } else { Vec::new() }
}

/// Formats a metric for people: accuracy in percent, RMSE as is.
pub fn fmt_metric(kind: MetricKind, v: f64) -> String {
    match kind {
        MetricKind::Accuracy => format!("{:.2} %", 100.0 * v),
        MetricKind::Rmse => format!("RMSE {v:.4}"),
    }
}

/// True when `v` is at least as good as `target` for this metric.
pub fn reached(kind: MetricKind, v: f64, target: f64) -> bool {
    match kind {
        MetricKind::Accuracy => v >= target,
        MetricKind::Rmse => v <= target,
    }
}
