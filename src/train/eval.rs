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

/// Memory a rank may spend on other ranks' replicas in [`per_rank_metrics`].
pub const PER_RANK_EVAL_BYTES: usize = 64 << 20;

/// Each rank's own replica evaluated on the whole held-out (or training) set, in rank order, on
/// every rank. No rank ever holds the whole data set: the replicas travel instead. They are
/// gathered on every rank in blocks of at most PER_RANK_EVAL_BYTES (all of them at once for
/// Fashion-MNIST MLR up to ~2,000 ranks), every rank evaluates each gathered replica on its own
/// shard, and one allreduce adds the sums.
///
/// Measured reason: the replicas used to be broadcast one at a time, each followed by an
/// allreduce of its sums, so a 256-rank run made 2 x 256 collectives per evaluation point
/// (1,024 for the default 3 epochs and the final models), most of its 128 s of program time
/// after 1.5 s of training. The arithmetic is the same (every rank evaluates N replicas on
/// 1/N of the set); only the number of collectives changes: ceil(N / block) + 1.
pub fn per_rank_metrics(
    comm: &SimpleCommunicator,
    model: &dyn Model,
    params: &[f32],
    data: &Dataset,
) -> Vec<f64> {
    let (rank, n, p) = (comm.rank() as usize, comm.size() as usize, params.len());
    let block = (PER_RANK_EVAL_BYTES / (4 * p).max(1)).clamp(1, n);
    let mut sums = vec![0f64; 3 * n];
    for first in (0..n).step_by(block) {
        let members = first..(first + block).min(n);
        let counts: Vec<i32> = (0..n).map(|r| if members.contains(&r) { p as i32 } else { 0 }).collect();
        let mine = if members.contains(&rank) { params } else { &[] };
        let replicas = collectives::all_gather_varcount(comm, mine, &counts);
        for (k, replica) in replicas.chunks(p.max(1)).enumerate() {
            let s = model.evaluate(replica, data);
            sums[3 * (first + k)..3 * (first + k + 1)].copy_from_slice(&[s.loss_sum, s.metric_sum, s.count]);
        }
    }
    collectives::sum_f64(comm, &mut sums);
    let kind = model.metric_kind();
    sums.chunks(3).map(|s| EvalSums { loss_sum: s[0], metric_sum: s[1], count: s[2] }.metric(kind)).collect()
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
