//! The default step size: a short search on a sample of the training data at start-up, run only
//! when `--lr` was not given (neither flag nor config file; the run plan, plan.rs, decides).
//!
//! Why a search: one fixed step cannot fit both dense standardised images and unit-norm sparse
//! rows (issue 27). Measured on the data the project ships: the largest eigenvalue of E[x x^T]
//! (bias included) is 173 on standardised Fashion-MNIST and 1.02 on the RCV1-shape synthetic set,
//! yet the steps that train best are 0.1 (MLR) and ~3 (SVM, logreg): eta * lambda_max is 17 on one
//! and 3 on the other, so a step scaled by the rows' norms or by the curvature still misses one of
//! them by ~6x, and scikit-learn's "optimal" schedule depends on lambda and the loss only (it
//! starts at 17.8 for lambda = 1e-5, fine for a hinge's direction but not for an objective that
//! must fall). Bottou's SGD code calibrates eta0 the same way as here: try steps on a sample and
//! keep the one with the lowest objective after one pass. It works for every model (MLP and MF
//! too) and every data set, and it costs a few passes over a small sample.
//!
//! The search: every rank takes the same number of rows of its own shard (seeded), runs
//! [`PASSES`] passes of plain SGD with mini-batches of `--batch-size` for each candidate step
//! (powers of two), and measures the sample's objective; the objectives are summed over the ranks
//! (one allreduce), and the step with the lowest sum, times [`SAFETY`], is used by every rank.

use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;

use crate::comm::collectives;
use crate::config::{LrSchedule, TrainConfig};
use crate::model::{Model, ModelSpec};
use crate::rng::Rng;

use super::setup::Shards;

/// Candidate steps: 2^-10 .. 2^6.
const CANDIDATES: std::ops::RangeInclusive<i32> = -10..=6;
/// Rows of each rank's shard in the sample (fewer if the shard is smaller).
const SAMPLE_ROWS: usize = 1024;
/// Passes over the sample per candidate.
const PASSES: usize = 2;
/// The chosen step is the best candidate times this. A short run rewards the largest step that
/// does not blow up; the full run decays from it over many more steps, and under asynchronous
/// modes stale updates add to it. Halving it made the objective fall every epoch in the sweep of
/// benches/defaults-sweep.md where the best candidate itself did not always.
const SAFETY: f32 = 0.5;

/// The step size to use when `--lr` was not given (the caller, the run plan (plan.rs),
/// asks only then), or None when the configured one stays (AdaRevision's alpha, or a run that
/// takes no gradient steps). Collective over `comm`.
pub fn default_lr(cfg: &TrainConfig, shards: &Shards, spec: &ModelSpec, comm: &SimpleCommunicator) -> anyhow::Result<Option<f32>> {
    if cfg.consensus_only || cfg.lr_schedule == LrSchedule::Adarevision {
        return Ok(None);
    }
    let model = crate::model::build(spec)?;
    let data = &shards.train;
    // The same sample size on every rank, so that each rank's objective weighs the same.
    let local = data.len().min(SAMPLE_ROWS) as u64;
    let rows = collectives::min_u64(comm, local) as usize;
    let mut objectives = if rows == 0 {
        vec![0.0; CANDIDATES.count()]
    } else {
        let mut rng = Rng::for_stream(cfg.seed ^ 0x6c72_7365, comm.rank() as u64 + 1);
        let mut perm: Vec<usize> = (0..data.len()).collect();
        rng.shuffle(&mut perm);
        perm.truncate(rows);
        CANDIDATES.map(|k| sample_objective(model.as_ref(), cfg, data, &perm, 2f32.powi(k))).collect()
    };
    // A diverged candidate counts as infinitely bad on every rank (the sum must stay finite).
    objectives.iter_mut().for_each(|o| *o = if o.is_finite() { *o } else { 1e300 });
    collectives::sum_f64(comm, &mut objectives);
    let best = (0..objectives.len()).min_by(|&a, &b| objectives[a].total_cmp(&objectives[b])).unwrap_or(0);
    let step = 2f32.powi(*CANDIDATES.start() + best as i32) * SAFETY;
    // The best candidate at either end of the range may not be the best step (issue 43: a search
    // that chose 2^-11, the smallest step, said nothing).
    if comm.rank() == 0 && (best == 0 || best + 1 == objectives.len()) {
        let (end, fix) = if best == 0 { ("smallest", "large feature values make small steps best: see --scale") } else { ("largest", "") };
        eprintln!(
            "asap-train: warning: the step search's best candidate is its {end} (2^{}), so the best step may lie outside \
             its range 2^{}..2^{}: give --lr (the search chose {step}){}",
            *CANDIDATES.start() + best as i32,
            CANDIDATES.start(),
            CANDIDATES.end(),
            if fix.is_empty() { String::new() } else { format!("; {fix}") }
        );
    }
    Ok(Some(step))
}

/// Objective (mean loss + regulariser) on `sample` after [`PASSES`] passes of SGD at `lr` from the
/// model's initial parameters; infinite when it diverged.
fn sample_objective(model: &dyn Model, cfg: &TrainConfig, data: &crate::data::Dataset, sample: &[usize], lr: f32) -> f64 {
    let mut params = vec![0f32; model.num_params()];
    model.init(&mut params, &mut Rng::new(cfg.seed));
    let mut scratch = Vec::new();
    let mut optimizer = super::optimizer::Optimizer::for_step_search(cfg, model);
    let b = cfg.batch_size.clamp(1, sample.len());
    for _ in 0..PASSES {
        for batch in sample.chunks(b) {
            let loss = optimizer.step(model, &mut params, data, batch, lr, &mut scratch);
            if !loss.is_finite() || params.iter().any(|p| !p.is_finite()) {
                return f64::INFINITY;
            }
        }
    }
    let mut grad = vec![0f32; params.len()];
    model.loss_grad(&params, data, sample, &mut grad) + model.regulariser(&params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_span_both_kinds_of_data() {
        // 0.1 (dense standardised images, MLR) and 3 (unit-norm sparse rows) both lie inside,
        // before and after the safety factor.
        let lo = 2f32.powi(*CANDIDATES.start()) * SAFETY;
        let hi = 2f32.powi(*CANDIDATES.end()) * SAFETY;
        assert!(lo < 0.01 && hi > 10.0, "{lo} .. {hi}");
    }
}
