//! Collective evaluation of a training run: the run's model (averaged replicas or server shards) on the held-out (or training) set,
//! the training objective, the consensus distance of the replicas, and time/byte counters
//! summarised over ranks. The extra allreduces done here are not counted as training traffic.

use std::ops::Range;

use mpi::topology::{Communicator, SimpleCommunicator};

use crate::comm::collectives;
use crate::data::Dataset;
use crate::model::{EvalSums, MetricKind, Model};
use crate::sync::{Aggregate, ModeMetric};

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

/// What one evaluation point gives to a batch: this rank's replica (averaged over ranks for the
/// run's model and the consensus distance), the mode's additive part of the model when it has
/// one (summed over ranks instead), the replica whose own metric every rank wants (None: skip),
/// and the counters and mode metrics to combine over ranks.
pub struct PointInput<'a> {
    pub replica: &'a [f32],
    pub part: Option<Vec<f32>>,
    pub own: Option<&'a [f32]>,
    /// Per-rank counters, each combined as mean and max.
    pub counters: &'a [f64],
    pub metrics: &'a [ModeMetric],
    /// This rank's training seconds at the point (the maximum over ranks is reported).
    pub train_seconds: f64,
}

/// What a batch gives back for one point (the same on every rank).
pub struct PointResult {
    pub eval: Evaluation,
    /// Mean and maximum over ranks of each counter.
    pub counters_mean: Vec<f64>,
    pub counters_max: Vec<f64>,
    /// The mode metrics combined as each says, `{name: value, ..., "aggregation": {...}}`
    /// (null when the mode has none).
    pub metrics: serde_json::Value,
    pub train_seconds: f64,
    /// The own model's metric of each rank in the batch's `own_ranks`, in that order (empty
    /// when not asked for).
    pub own: Vec<f64>,
}

/// Sums and maxima of many values over ranks, packed so that they cost one allreduce of each
/// kind however many evaluation points and counters contribute.
#[derive(Default)]
struct Packed {
    sum: Vec<f64>,
    max: Vec<f64>,
}

impl Packed {
    fn sum(&mut self, v: &[f64]) -> Range<usize> {
        self.sum.extend_from_slice(v);
        self.sum.len() - v.len()..self.sum.len()
    }
    fn max(&mut self, v: &[f64]) -> Range<usize> {
        self.max.extend_from_slice(v);
        self.max.len() - v.len()..self.max.len()
    }
    fn reduce(&mut self, comm: &SimpleCommunicator) {
        collectives::sum_f64(comm, &mut self.sum);
        collectives::max_f64(comm, &mut self.max);
    }
}

/// Evaluates a batch of points collectively with a fixed number of collectives whatever the
/// number of points: one maximum of the mode metrics' lengths, one sum of all replicas (and
/// model parts), the own replicas gathered in blocks of at most PER_RANK_EVAL_BYTES per rank,
/// and one sum and one maximum of every number. All ranks call it with the same number of
/// points, each with the same fields present, and the same `own_ranks` (sorted): the ranks whose
/// own replicas are scored (see [`own_model_ranks`]).
///
/// Measured reason: at 256 ranks each collective costs ~0.1 s on 2 cores, and one evaluation
/// point made about 20 of them (averaged model, distance, training and held-out sums, counters
/// mean and max, two per mode metric, the slowest rank's time, then 2 x 256 for the own
/// models): evaluating 4 points took 13 s after 0.75 s of training.
pub fn evaluate_batch(
    comm: &SimpleCommunicator,
    model: &dyn Model,
    points: Vec<PointInput>,
    train: &Dataset,
    test: Option<&Dataset>,
    own_ranks: &[usize],
) -> Vec<PointResult> {
    let n = comm.size() as usize;
    let t0 = std::time::Instant::now();
    // Histograms may be longer on some ranks: agree on every metric's length first.
    let mut lengths: Vec<f64> = points.iter().flat_map(|p| p.metrics.iter().map(|m| m.values.len() as f64)).collect();
    if !lengths.is_empty() {
        collectives::max_f64(comm, &mut lengths);
    }
    // The run's models: replicas summed (then averaged), parts summed, all in one allreduce.
    let p_len = points.first().map_or(0, |p| p.replica.len());
    let mut models: Vec<f32> = Vec::with_capacity(points.len() * p_len);
    for p in &points {
        models.extend_from_slice(p.replica);
    }
    for p in &points {
        if let Some(part) = &p.part {
            models.extend_from_slice(part);
        }
    }
    let t_lengths = t0.elapsed().as_secs_f64();
    collectives::sum_f32(comm, &mut models, &mut Vec::new());
    let t_models = t0.elapsed().as_secs_f64();
    let inv = 1.0 / n as f32;
    let (averages, parts) = models.split_at_mut(points.len() * p_len);
    averages.iter_mut().for_each(|w| *w *= inv);
    let mut parts = parts.chunks(p_len.max(1));
    // Own replicas: those of own_ranks, gathered, each evaluated on this rank's shard.
    let own_set = test.unwrap_or(train);
    let owns: Vec<&[f32]> = points.iter().filter_map(|p| p.own).collect();
    let own_sums = own_model_sums(comm, model, &owns, own_set, own_ranks);
    let m = own_ranks.len();
    let t_own = t0.elapsed().as_secs_f64();

    let mut packed = Packed::default();
    let mut slots = Vec::with_capacity(points.len());
    let mut own_points = 0;
    let mut lens = lengths.iter().map(|&l| l as usize);
    for (i, p) in points.iter().enumerate() {
        let avg = &averages[i * p_len..(i + 1) * p_len];
        let evaluated: &[f32] = if p.part.is_some() { parts.next().expect("one summed part per point with a part") } else { avg };
        let dist = p.replica.iter().zip(avg).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
        let tr = model.evaluate(evaluated, train);
        let te = test.map(|t| model.evaluate(evaluated, t));
        let sums = packed.sum(&[dist, tr.loss_sum, tr.metric_sum, tr.count]);
        let test_sums = te.map(|te| packed.sum(&[te.loss_sum, te.metric_sum, te.count]));
        let counters_sum = packed.sum(p.counters);
        let counters_max = packed.max(p.counters);
        let train_max = packed.max(&[p.train_seconds]);
        let own = p.own.map(|_| {
            own_points += 1;
            packed.sum(&own_sums[(own_points - 1) * 3 * m..own_points * 3 * m])
        });
        let metrics: Vec<(Range<usize>, &ModeMetric)> = p
            .metrics
            .iter()
            .map(|m| {
                let mut v = m.values.clone();
                v.resize(lens.next().expect("one length per metric"), 0.0);
                (if m.aggregate == Aggregate::Max { packed.max(&v) } else { packed.sum(&v) }, m)
            })
            .collect();
        slots.push(Slot { evaluated: evaluated.to_vec(), sums, test_sums, counters_sum, counters_max, train_max, own, metrics });
    }
    let t_local = t0.elapsed().as_secs_f64();
    packed.reduce(comm);
    log::debug!(
        "evaluated {} point(s): lengths {t_lengths:.3} s, models summed by {t_models:.3} s, own models by {t_own:.3} s, local sums by {t_local:.3} s, reduced by {:.3} s",
        points.len(), t0.elapsed().as_secs_f64()
    );
    slots.into_iter().map(|slot| slot.result(&packed, model, n)).collect()
}

/// Where one point's numbers sit in a batch's packed sums and maxima.
struct Slot<'a> {
    /// The model evaluated (the average of the replicas, or the summed part).
    evaluated: Vec<f32>,
    /// Consensus distance and the training sums.
    sums: Range<usize>,
    test_sums: Option<Range<usize>>,
    counters_sum: Range<usize>,
    counters_max: Range<usize>,
    train_max: Range<usize>,
    /// The own models' sums, three per scored rank.
    own: Option<Range<usize>>,
    metrics: Vec<(Range<usize>, &'a ModeMetric)>,
}

impl Slot<'_> {
    /// The point's result from the reduced sums and maxima over `n` ranks.
    fn result(self, packed: &Packed, model: &dyn Model, n: usize) -> PointResult {
        let kind = model.metric_kind();
        let s = &packed.sum[self.sums];
        let tr = EvalSums { loss_sum: s[1], metric_sum: s[2], count: s[3] };
        let metric = match self.test_sums {
            Some(r) => {
                let t = &packed.sum[r];
                EvalSums { loss_sum: t[0], metric_sum: t[1], count: t[2] }.metric(kind)
            }
            None => tr.metric(kind),
        };
        let eval = Evaluation {
            objective: tr.mean_loss() + model.regulariser(&self.evaluated),
            metric,
            train_metric: tr.metric(kind),
            consensus_distance: s[0] / n as f64,
        };
        PointResult {
            eval,
            counters_mean: packed.sum[self.counters_sum].iter().map(|x| x / n as f64).collect(),
            counters_max: packed.max[self.counters_max].to_vec(),
            metrics: metrics_json(self.metrics, packed, n),
            train_seconds: packed.max[self.train_max][0],
            own: self.own.map_or_else(Vec::new, |r| {
                packed.sum[r].chunks(3).map(|s| EvalSums { loss_sum: s[0], metric_sum: s[1], count: s[2] }.metric(kind)).collect()
            }),
        }
    }
}

/// The mode metrics combined as each says, `{name: value, ..., "aggregation": {...}}` (null when
/// the mode has none).
fn metrics_json(metrics: Vec<(Range<usize>, &ModeMetric)>, packed: &Packed, n: usize) -> serde_json::Value {
    if metrics.is_empty() {
        return serde_json::Value::Null;
    }
    let mut out = serde_json::Map::new();
    let mut how = serde_json::Map::new();
    for (range, m) in metrics {
        let v: Vec<f64> = match m.aggregate {
            Aggregate::Max => packed.max[range].to_vec(),
            Aggregate::Sum => packed.sum[range].to_vec(),
            Aggregate::Mean => packed.sum[range].iter().map(|x| x / n as f64).collect(),
        };
        out.insert(m.name.into(), if m.is_array { serde_json::json!(v) } else { serde_json::json!(v[0]) });
        how.insert(m.name.into(), serde_json::json!(m.aggregate));
    }
    out.insert("aggregation".into(), serde_json::Value::Object(how));
    serde_json::Value::Object(out)
}

/// Memory a rank may spend on other ranks' replicas in [`own_model_sums`].
pub const PER_RANK_EVAL_BYTES: usize = 64 << 20;

/// The ranks whose own replicas an evaluation scores when `k` are asked for out of `n` (0 or
/// `k >= n`: all): `k` ranks spread evenly, `floor(i n / k)` for i < k, so rank 0 is always one.
///
/// Measured reason: scoring a replica is a pass over the whole held-out set, so scoring all N of
/// them costs N passes per evaluation however the work is spread. At 256 ranks (Fashion-MNIST
/// MLR, 3 epochs, 4 evaluation points) that is ~5x the floating-point work of the training, and
/// gathering all replicas on every rank moved 32 MB into each of 256 processes on 2 cores: the
/// allgather did not finish within the 60 s wait timeout under load. A sample of 8 costs less
/// than the training at any rank count and shows the spread; `--own-models 0` scores all.
pub fn own_model_ranks(n: usize, k: usize) -> Vec<usize> {
    if k == 0 || k >= n {
        return (0..n).collect();
    }
    (0..k).map(|i| i * n / k).collect()
}

/// For each of this rank's `owns` replicas (every rank passes the same number), the sums of the
/// corresponding replica of every rank in `ranks` on this rank's shard of `data`: 3 x
/// `ranks.len()` numbers per replica, [point][sampled rank][loss, metric, count], to be added
/// over ranks. No rank ever holds the whole data set: the replicas travel instead. They are
/// allgathered (only the sampled ranks contribute) in blocks of ranks of at most
/// PER_RANK_EVAL_BYTES per receiving rank.
///
/// Measured reason: the replicas used to be broadcast one at a time, each followed by an
/// allreduce of its sums: 2 x 256 collectives per evaluation point at 256 ranks. The arithmetic
/// is the same (every rank evaluates the sampled replicas on 1/N of the set); only the number of
/// collectives changes.
fn own_model_sums(comm: &SimpleCommunicator, model: &dyn Model, owns: &[&[f32]], data: &Dataset, ranks: &[usize]) -> Vec<f64> {
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    let (k, m) = (owns.len(), ranks.len());
    let mut sums = vec![0f64; 3 * m * k];
    if k == 0 || m == 0 {
        return sums;
    }
    let p = owns[0].len();
    let per_rank = k * p;
    let block = (PER_RANK_EVAL_BYTES / (4 * per_rank).max(1)).clamp(1, m);
    let mine: Vec<f32> = owns.iter().flat_map(|o| o.iter().copied()).collect();
    for (b, members) in ranks.chunks(block).enumerate() {
        let counts: Vec<i32> = (0..n).map(|r| if members.contains(&r) { per_rank as i32 } else { 0 }).collect();
        let send: &[f32] = if members.contains(&rank) { &mine } else { &[] };
        let t = std::time::Instant::now();
        let gathered = collectives::all_gather_varcount(comm, send, &counts);
        let t_gather = t.elapsed().as_secs_f64();
        // The gathered replicas arrive in rank order, which is the order of `members` (sorted).
        for (j, theirs) in gathered.chunks(per_rank.max(1)).enumerate() {
            let slot = b * block + j;
            for (i, replica) in theirs.chunks(p.max(1)).enumerate() {
                let s = model.evaluate(replica, data);
                sums[3 * (i * m + slot)..3 * (i * m + slot + 1)].copy_from_slice(&[s.loss_sum, s.metric_sum, s.count]);
            }
        }
        log::debug!(
            "own models of {} rank(s) from {}: gathered in {t_gather:.3} s, evaluated in {:.3} s",
            members.len(),
            members[0],
            t.elapsed().as_secs_f64() - t_gather
        );
    }
    sums
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

#[cfg(test)]
mod tests {
    use super::own_model_ranks;

    #[test]
    fn own_model_samples_are_spread_sorted_distinct_and_start_at_rank_0() {
        assert_eq!(own_model_ranks(5, 0), vec![0, 1, 2, 3, 4]);
        assert_eq!(own_model_ranks(5, 8), vec![0, 1, 2, 3, 4]);
        assert_eq!(own_model_ranks(256, 8), vec![0, 32, 64, 96, 128, 160, 192, 224]);
        for n in 1..200 {
            for k in 1..n {
                let r = own_model_ranks(n, k);
                assert_eq!(r.len(), k);
                assert_eq!(r[0], 0);
                assert!(r.windows(2).all(|w| w[0] < w[1]) && *r.last().unwrap() < n, "{n} {k}: {r:?}");
                // Spread: neighbouring samples are floor(n/k) or ceil(n/k) ranks apart.
                assert!(r.windows(2).all(|w| w[1] - w[0] >= n / k && w[1] - w[0] <= n.div_ceil(k)), "{n} {k}: {r:?}");
            }
        }
    }
}
