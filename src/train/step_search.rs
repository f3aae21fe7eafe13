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
//! (powers of two; annealed over the passes as the run's schedule anneals the run where it is
//! cosine, the default: [`search_step_at`]), and measures the sample's objective; the objectives
//! are summed over the ranks (one allreduce), and the step with the lowest sum, times [`SAFETY`]
//! ([`ANNEALED_SAFETY`] under cosine), is used by every rank.
//!
//! Above [`REFERENCE_RANKS`] ranks the step grows with the ranks' combined batch where a check
//! allows it (measured in benches/defaults-sweep.md, Part 7). Under averaging every step, N ranks
//! with mini-batches of b take one step on a combined batch of N b, so an epoch holds N times
//! fewer steps; the search above runs each rank's sample on its own and answers the same step at
//! every rank count (0.03125 on Fashion-MNIST at 4, 8 and 32 ranks), so the default lost 0.55 pt
//! at 8 ranks (83.67 % against 84.22 %) and 1.2 pt at 32. The linear scaling rule (Goyal et al.
//! 2017; here the step x N/4, from the 4-rank step, whose decay per epoch then stays) gave the
//! 4-rank run back: the same objective after 10 epochs at 8 and 32 ranks, 84.16 % and 84.13 %. Up
//! to 4 ranks the searched step served 1, 2 and 4 ranks alike (84.18, 84.36, 84.22 %). The same
//! rule ruined the sparse RCV1-shape set at 32 ranks (logreg 45 % at a step of 32, svm 53 % at 16),
//! so [`combined_batch_factor`] takes the scaled step only where a short run on the combined batch
//! (each rank's sample step averaged over the ranks, as the run's allreduce step) stays at or
//! below its starting objective, scored after every quarter pass on rows of the shards outside
//! the sample: logreg's 32 there went from 0.693 to 4.49 after a pass, svm's 16 from 1.0 to 1.02,
//! Fashion-MNIST's 0.25 from 2.30 to 1.02. Under the modes that apply updates stale (ssp, bosen,
//! async) the check runs at twice the scaled step, as [`SAFETY`] halves the searched one: at 32
//! ranks it refused Fashion-MNIST's 0.25 at seed 1 (its 0.5 rose to 2.91) and took it at seeds 2
//! and 3, where ssp's objective had risen in epochs 3 and 4 at seed 1 (0.889 0.603 0.717 0.612
//! ...). Two other checks were measured and dropped: ending
//! no worse than the searched step after the short run (Fashion-MNIST at 32 ranks, seed 2: 0.635
//! against 0.592, refused, 82.98 % where the scaled step reaches 84.07 %: 64 constant steps do
//! not rank steps for 590 decaying ones), and the whole search on the combined batch (0.0625 at 32
//! ranks, 83.34 %; logreg chose 16 at 8 and 32 ranks, scored on the sample, which 1,024 rows of
//! 47,236 features let a large step memorise).

use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;

use crate::comm::collectives;
use crate::config::{InnerOptimizer, LrSchedule, TrainConfig};
use crate::model::{Model, ModelSpec};
use crate::rng::Rng;

use super::setup::Shards;

/// Candidate steps: 2^-10 .. 2^8. Under the cosine schedule the RCV1-shape set's best sample
/// step is 2^7 for svm and logreg (seed 1; 0.275 and 0.312 there, 0.499 and 0.434 at 2^8): up to
/// 2^6 it was the range's largest, with a warning.
const CANDIDATES: std::ops::RangeInclusive<i32> = -10..=8;
/// Rows of each rank's shard in the sample (fewer if the shard is smaller).
const SAMPLE_ROWS: usize = 1024;
/// Passes over the sample per candidate.
const PASSES: usize = 2;
/// Up to this many ranks the searched step is used as it is; above, it may grow as N / this
/// (module doc).
pub const REFERENCE_RANKS: usize = 4;
/// The modes whose updates are applied stale (a staleness bound, or none at all): the scaled
/// step's check leaves them [`SAFETY`]'s headroom ([`combined_batch_factor`]).
const STALE_MODES: [&str; 3] = ["ssp", "bosen", "async"];

/// The step the search chose, and the factor it was scaled by for the ranks' combined batch (1
/// where it was not: up to [`REFERENCE_RANKS`] ranks, or where the check refused it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchedStep {
    pub lr: f32,
    pub rank_factor: f32,
}
/// The chosen step is the best candidate times this. A short run rewards the largest step that
/// does not blow up; the full run decays from it over many more steps, and under asynchronous
/// modes stale updates add to it. Halving it made the objective fall every epoch in the sweep of
/// benches/defaults-sweep.md where the best candidate itself did not always.
const SAFETY: f32 = 0.5;
/// Under the cosine schedule the chosen step is the best candidate times this instead: the
/// annealed short run ([`search_step_at`]) forgives a larger step than the run's thousands of
/// steps at the top of its curve do. Measured at half the best candidate: Fashion-MNIST (MLR, 4
/// ranks) at 0.125 rose in epochs 3 and 4 (0.4187 0.4207 0.4327, seed 1), the RCV1-shape logreg at
/// 64 jumped from 1.09 to 5.08 in epoch 2 (seed 3); at a quarter, 0.0625 and 16-32, every epoch
/// fell and the held-out results stayed (84.51 and 84.59 % against 84.50 and 84.56 %; 85.5-86.4 %).
const ANNEALED_SAFETY: f32 = 0.25;

/// The step size to use when `--lr` was not given (the caller, the run plan (plan.rs),
/// asks only then), or None when the configured one stays (AdaRevision's alpha, or a run that
/// takes no gradient steps). Collective over `comm`.
pub fn default_lr(cfg: &TrainConfig, shards: &Shards, spec: &ModelSpec, comm: &SimpleCommunicator) -> anyhow::Result<Option<SearchedStep>> {
    if cfg.consensus_only || cfg.lr_schedule == LrSchedule::Adarevision {
        return Ok(None);
    }
    let model = crate::model::build(spec)?;
    let data = &shards.train;
    // The same sample size on every rank, so that each rank's objective weighs the same.
    let local = data.len().min(SAMPLE_ROWS) as u64;
    let rows = collectives::min_u64(comm, local) as usize;
    let mut rng = Rng::for_stream(cfg.seed ^ 0x6c72_7365, comm.rank() as u64 + 1);
    let mut perm: Vec<usize> = (0..data.len()).collect();
    rng.shuffle(&mut perm);
    let mut objectives = if rows == 0 {
        vec![0.0; CANDIDATES.count()]
    } else {
        CANDIDATES.map(|k| sample_objective(model.as_ref(), cfg, data, &perm[..rows], 2f32.powi(k))).collect()
    };
    // A diverged candidate counts as infinitely bad on every rank (the sum must stay finite).
    objectives.iter_mut().for_each(|o| *o = if o.is_finite() { *o } else { 1e300 });
    collectives::sum_f64(comm, &mut objectives);
    let best = (0..objectives.len()).min_by(|&a, &b| objectives[a].total_cmp(&objectives[b])).unwrap_or(0);
    let safety = if cfg.lr_schedule == LrSchedule::Cosine { ANNEALED_SAFETY } else { SAFETY };
    let step = 2f32.powi(*CANDIDATES.start() + best as i32) * safety;
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
    let rank_factor = combined_batch_factor(model.as_ref(), cfg, data, &perm, rows, step, comm);
    Ok(Some(SearchedStep { lr: step * rank_factor, rank_factor }))
}

/// N / [`REFERENCE_RANKS`] on N > [`REFERENCE_RANKS`] ranks of plain SGD (`--inner-optimizer sgd`, no SAGA) where a short run on the ranks'
/// combined batch at the searched `step` times it [`stays_below_start`] (module doc), else the
/// largest of its halvings above 1 that does; 1 otherwise.
/// `perm`'s first `rows` are the sample; as many of the rows after them as every shard has score
/// it (the sample itself where some shard has none). Collective over `comm`.
fn combined_batch_factor(
    model: &dyn Model,
    cfg: &TrainConfig,
    data: &crate::data::Dataset,
    perm: &[usize],
    rows: usize,
    step: f32,
    comm: &SimpleCommunicator,
) -> f32 {
    let ranks = comm.size() as usize;
    // Measured for plain SGD only: momentum's and SAGA's steps are not the check's `sgd_step`, and
    // Adam's normalised step does not grow with the batch as SGD's does.
    let plain_sgd = cfg.inner_optimizer == InnerOptimizer::Sgd && !(cfg.sync.spec().keeps_history)(&cfg.modes);
    if ranks <= REFERENCE_RANKS || rows == 0 || !plain_sgd {
        return 1.0;
    }
    let outside = collectives::min_u64(comm, (perm.len() - rows).min(rows) as u64) as usize;
    let scored = if outside > 0 { &perm[rows..rows + outside] } else { &perm[..rows] };
    // A refused factor is halved and checked again while it stays above 1: under the cosine
    // schedule at 32 ranks the stale modes' check refused x 8 (0.0625 x 8, checked at 1.0) at
    // every seed and the run fell to 83.3 %, 1.25 pt under 4 ranks (benches/defaults-sweep.md,
    // Part 8).
    let mut factor = ranks as f32 / REFERENCE_RANKS as f32;
    while factor > 1.0 {
        // Where updates are applied stale, checked at twice the step, the headroom [`SAFETY`]
        // leaves the searched step: stale updates add to it. RCV1-shape logreg at 8 ranks under
        // ssp, at a step of 8 that passed at itself: the objective rose in 2 of 3 runs, 59 %
        // against 66-68 % at the searched 4 (under asap the same 8 fell every epoch, to 0.554
        // against 0.595).
        let checked = if STALE_MODES.contains(&cfg.sync.spec().name) { step * factor / SAFETY } else { step * factor };
        if stays_below_start(model, cfg, data, &perm[..rows], scored, checked, comm) {
            return factor;
        }
        factor /= 2.0;
    }
    1.0
}

/// Whether [`PASSES`] passes of SGD at `lr` over `sample` on the ranks' combined batch (each step
/// every rank's step on its own mini-batch, averaged over the ranks by one allreduce, as the run's
/// allreduce step) keep the objective on `scored` (mean over the ranks) at or below where it
/// started, scored after every quarter of a pass, and diverge on no rank. Collective over `comm`.
fn stays_below_start(
    model: &dyn Model,
    cfg: &TrainConfig,
    data: &crate::data::Dataset,
    sample: &[usize],
    scored: &[usize],
    lr: f32,
    comm: &SimpleCommunicator,
) -> bool {
    let p = model.num_params();
    let ranks = comm.size() as f32;
    // The parameters, then a flag that this rank diverged: summed with them.
    let mut params = vec![0f32; p + 1];
    model.init(&mut params[..p], &mut Rng::new(cfg.seed));
    let (mut scratch, mut sum_scratch, mut grad) = (Vec::new(), Vec::new(), vec![0f32; p]);
    let mut objective = |params: &[f32]| {
        grad.fill(0.0);
        let mut o = [model.loss_grad(params, data, scored, &mut grad) + model.regulariser(params)];
        collectives::sum_f64(comm, &mut o);
        o[0] / ranks as f64
    };
    let start = objective(&params[..p]);
    let b = cfg.batch_size.clamp(1, sample.len());
    let batches: Vec<&[usize]> = sample.chunks(b).collect();
    for _ in 0..PASSES {
        // Scored after every quarter of a pass: a step past the combined batch's stable range
        // can overshoot and come back down within a pass (logreg's 32 on the RCV1-shape set).
        for quarter in batches.chunks(batches.len().div_ceil(4)) {
            for batch in quarter {
                let loss = model.sgd_step(&mut params[..p], data, batch, lr, &mut scratch);
                params[p] = (!loss.is_finite() || params[..p].iter().any(|w| !w.is_finite())) as u8 as f32;
                collectives::sum_f32(comm, &mut params, &mut sum_scratch);
                params[..p].iter_mut().for_each(|w| *w /= ranks);
                if params[p] != 0.0 || params[..p].iter().any(|w| !w.is_finite()) {
                    return false;
                }
            }
            // NaN counts as above.
            let now = objective(&params[..p]);
            if now.is_nan() || now > start {
                return false;
            }
        }
    }
    true
}

/// Objective (mean loss + regulariser) on `sample` after [`PASSES`] passes of SGD from the
/// model's initial parameters at `lr`, annealed over the passes as the run's schedule anneals
/// over the run where it is cosine ([`search_step_at`]); infinite when it diverged.
fn sample_objective(model: &dyn Model, cfg: &TrainConfig, data: &crate::data::Dataset, sample: &[usize], lr: f32) -> f64 {
    let mut params = vec![0f32; model.num_params()];
    model.init(&mut params, &mut Rng::new(cfg.seed));
    let mut scratch = Vec::new();
    let mut optimizer = super::optimizer::Optimizer::for_step_search(cfg, model);
    let b = cfg.batch_size.clamp(1, sample.len());
    let steps = PASSES * sample.len().div_ceil(b);
    let mut t = 0;
    for _ in 0..PASSES {
        for batch in sample.chunks(b) {
            let eta = search_step_at(cfg.lr_schedule, lr, t, steps);
            t += 1;
            let loss = optimizer.step(model, &mut params, data, batch, eta, &mut scratch);
            if !loss.is_finite() || params.iter().any(|p| !p.is_finite()) {
                return f64::INFINITY;
            }
        }
    }
    let mut grad = vec![0f32; params.len()];
    model.loss_grad(&params, data, sample, &mut grad) + model.regulariser(&params)
}

/// The step of the search's short run at its mini-batch `t` of `steps`: `lr` annealed to 0 as
/// the cosine schedule anneals the whole run, `lr` throughout under every other schedule.
///
/// Judged at a constant step, the search answers for a schedule that keeps its steps large; the
/// cosine run takes its largest step only at the start and its smallest at the end. Measured on
/// the RCV1-shape set (`data synth --rows 50000`, 1 rank, 5 epochs, seeds 1-3, both splits: 12
/// runs, benches/sklearn-defaults.md, Part 4): the constant-step search chose 1-4 for svm and 2-32
/// for logreg, and the cosine run then ended at 75.9-85.5 %, where scikit-learn's SGDClassifier
/// reaches 83.5-84.0 % (hinge) and 79.8-80.5 % (log loss); judged annealed, it chooses 64 (half
/// of 2^7) at every seed and the runs end at 85.6-86.3 %. On Fashion-MNIST (MLR, 4 ranks) it
/// chooses 0.125 where the constant search chose 0.03125: 84.50 % against 84.34 %.
fn search_step_at(schedule: LrSchedule, lr: f32, t: usize, steps: usize) -> f32 {
    match schedule {
        LrSchedule::Cosine => (lr as f64 * 0.5 * (1.0 + (std::f64::consts::PI * t as f64 / steps as f64).cos())) as f32,
        _ => lr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_span_both_kinds_of_data() {
        // 0.1 (dense standardised images, MLR) and 3 (unit-norm sparse rows) both lie inside,
        // before and after the safety factor.
        let lo = 2f32.powi(*CANDIDATES.start()) * ANNEALED_SAFETY;
        let hi = 2f32.powi(*CANDIDATES.end()) * SAFETY;
        assert!(lo < 0.01 && hi > 10.0, "{lo} .. {hi}");
    }

    #[test]
    fn the_search_anneals_only_for_the_cosine_schedule() {
        // Cosine: the full step first, half at the midpoint, a quarter of the way at 3/4 of it.
        assert_eq!(search_step_at(LrSchedule::Cosine, 2.0, 0, 64), 2.0);
        assert!((search_step_at(LrSchedule::Cosine, 2.0, 32, 64) - 1.0).abs() < 1e-6);
        let late = search_step_at(LrSchedule::Cosine, 2.0, 48, 64);
        assert!((late - (1.0 - std::f32::consts::FRAC_1_SQRT_2)).abs() < 1e-6, "{late}");
        for kind in [LrSchedule::Decay, LrSchedule::Constant, LrSchedule::InvSqrt, LrSchedule::Bottou] {
            assert_eq!(search_step_at(kind, 2.0, 48, 64), 2.0, "{kind:?}");
        }
    }
}
