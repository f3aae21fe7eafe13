//! Losing a rank in place (`--on-rank-loss continue`, issue 42 item 3): the survivors of a
//! killed rank shrink the job to themselves and go on, as a resize to N - 1 ranks would
//! (train::elastic) but from what they hold in memory instead of a checkpoint. The rule
//! (docs/training.md, "Losing a rank in place"):
//!
//! - **Detection**: src/comm/ulfm.rs (the first failed MPI call revokes the communicators; every
//!   survivor's wait ends and unwinds here within the runtime's detection time).
//! - **Communicator**: the world shrunk to the survivors (`MPIX_Comm_shrink`, then
//!   `MPIX_Comm_agree`); they keep their order, so survivor q is the q-th live rank of the old
//!   numbering.
//! - **Model**: every survivor continues from the average of the survivors' replicas (the dead
//!   rank's replica is gone; its past steps are in the others' replicas through the gossip).
//!   The mode, the optimizer and the early-stopping state are rebuilt as at a resize from the
//!   survivors' states (averaged where a resize averages them, afresh where it starts afresh),
//!   and the mode's graph is built again over N - 1 ranks by the same code as a fresh run's,
//!   which checks its spectral gap (or refuses a graph that does not mix).
//! - **Data**: the epoch the furthest survivor is in is finished over the survivors: the
//!   examples the survivors in it had not yet stepped on in their current pass are dealt over
//!   the N - 1 ranks (each takes those in its new shard, as a resize deals them). The dead rank's
//!   examples not yet stepped on by a survivor are **dropped for the rest of that epoch** (its
//!   own position died with it): counted in the metrics as `examples_dropped`. Later epochs shard
//!   the whole training set over N - 1 ranks as a fresh run does, so no example is lost for good.
//!   Under a label-skewed `--partition` a survivor's "not yet stepped on" is the rest of its
//!   epoch's plan, as a resize reads it (train::elastic: a small shard's remaining passes, not a
//!   large one's unplanned rest; [`elastic::left_in_walk`] from its pass's order and stream in
//!   memory), dealt to the ranks holding the examples in the N - 1-rank partition; the dead
//!   rank's rest of its plan is the dropped.
//! - **Run plan**: the options the run resolved at N ranks (learning rate, graph kind, schedule)
//!   are kept; the run identity records N - 1 ranks, so its later checkpoints resume at N - 1.
//! - **Record**: a `rank_lost` line in the metrics (which rank, when, the steps and examples,
//!   the seconds lost) and the same in the summary's `ranks_lost`.

use std::time::Instant;

use mpi::topology::{Communicator, SimpleCommunicator};
use serde_json::json;

use super::checkpoint::{Position, Resized, Restored};
use super::elastic::{self, Dealt};
use crate::comm::ulfm::Phase;
use crate::comm::{self, collectives};

/// What one survivor knows of itself when the loss unwinds to the training loop.
pub struct Survivor {
    pub pos: Position,
    pub params: Vec<f32>,
    /// The examples (global ids) it had not yet stepped on in its epoch's current pass.
    pub left: Vec<u64>,
    /// Its mode, optimizer and early-stopping state.
    pub state: crate::sync::ModeState,
    /// Examples of the epoch it stepped on.
    pub seen: u64,
    /// When it last started a step (the end of its progress before the failure).
    pub last_step: Instant,
}

/// The examples of its epoch a rank had not yet stepped on in its current pass: the rest of its
/// share of a dealt epoch (`dealt`, its order `dealt_order`), or of `perm` after `step` steps of
/// `b` (all of them at the start of a pass, whose order is not yet drawn).
pub fn left_of_pass(ids: &[u64], perm: &[usize], dealt: Option<(&Dealt, &[usize])>, step: usize, b: usize) -> Vec<u64> {
    if let Some((d, order)) = dealt {
        let from = elastic::dealt_batch(order.len(), d.steps, step).start;
        return order[from..].iter().map(|&i| ids[i]).collect();
    }
    let n = perm.len();
    let s = step % n.div_ceil(b).max(1);
    if s == 0 {
        return ids.to_vec();
    }
    perm[(s * b).min(n)..].iter().map(|&i| ids[i]).collect()
}

/// What the survivors continue from, agreed over `comm` (the shrunk world; collective): the
/// survivors' average replica, the furthest epoch with the examples its survivors had left,
/// the old states on rank 0, and the loss's record (without the set-up's seconds). `planned`:
/// the examples an epoch of the old ranks takes ([`epoch_plan`]), of which those neither seen
/// nor dealt are the dropped.
pub fn continue_from(comm: &SimpleCommunicator, me: Survivor, from: usize, dead: &[usize], planned: u64) -> (Restored, serde_json::Value) {
    let n = comm.size() as usize;
    let p = &me.pos;
    let epoch = collectives::max_u64(comm, p.epoch as u64) as usize;
    let mut params = me.params;
    let mut scratch = Vec::new();
    collectives::sum_f32(comm, &mut params, &mut scratch);
    params.iter_mut().for_each(|x| *x /= n as f32);
    // Survivors behind the furthest epoch hand in nothing of it (their shard's rest of the
    // earlier epoch is dropped with the dead rank's).
    let (left, seen) = if p.epoch == epoch { (me.left, me.seen) } else { (Vec::new(), 0) };
    let mut left = collectives::all_gather_varcount(comm, &left, &all_counts(comm, left.len()));
    left.sort_unstable();
    let seen = collectives::sum_u64(comm, seen);
    let state_text = serde_json::to_string(&me.state).unwrap_or_default();
    let texts = collectives::gather_varcount(comm, 0, state_text.as_bytes());
    let old_states = texts.iter().filter_map(|t| serde_json::from_slice(t).ok()).collect();
    let position = Position {
        epoch,
        step_in_epoch: 0,
        global_step: collectives::max_u64(comm, p.global_step),
        round: collectives::max_u64(comm, p.round),
        train_seconds: max_f64(comm, p.train_seconds),
    };
    let stalled = max_f64(comm, me.last_step.elapsed().as_secs_f64());
    let dropped = planned.saturating_sub(seen + left.len() as u64);
    let record = json!({
        "event": "rank_lost",
        "dead_ranks": dead,
        "ranks_before": from,
        "ranks": n,
        "epoch": epoch,
        "round": position.round,
        "step": position.global_step,
        "train_seconds": position.train_seconds,
        "examples_seen_in_epoch": seen,
        "examples_dealt": left.len(),
        "examples_dropped": dropped,
        "rule": RULE,
        "stalled_seconds": stalled,
    });
    let count = left.len() as u64;
    // Dealt even when empty: then the next epoch starts (train::deal_rest).
    let dealt = Some(Dealt { ids: left, steps: 0, total: count });
    let restored = Restored {
        position,
        params,
        epoch_rng: [0; 4],
        path: std::path::PathBuf::from("(in memory: the survivors of a lost rank)"),
        dealt,
        resized: Some(Resized { from, old_states, per_example: (Vec::new(), Vec::new()) }),
    };
    (restored, record)
}

/// The rule in one line, for the metrics and rank 0's message.
pub const RULE: &str = "the survivors continue from the average of their replicas over a graph rebuilt on them; the examples \
                        they had left of the epoch are dealt over them and the dead rank's are dropped for the rest of it; \
                        later epochs shard over the survivors";

/// The examples an epoch of the ranks of `comm` takes (collective): every training example once,
/// or under a label-skewed `--partition` every shard's walk over the epoch's steps summed (a
/// smaller shard's passes repeat it, a larger one is cut).
fn epoch_plan(run: &super::Run<'_>, comm: &SimpleCommunicator) -> u64 {
    if run.cfg.partition == "iid" {
        return run.shards.total_train;
    }
    collectives::sum_u64(comm, elastic::taken_in_walk(run.shards.train.len(), run.cfg.batch_size, run.steps_per_epoch))
}

fn all_counts(comm: &SimpleCommunicator, mine: usize) -> Vec<i32> {
    collectives::all_gather_varcount(comm, &[mine as i32], &vec![1; comm.size() as usize])
}

fn max_f64(comm: &SimpleCommunicator, x: f64) -> f64 {
    let mut v = [x];
    collectives::max_f64(comm, &mut v);
    v[0]
}

/// Shrinks `comm` to its survivors (collective over them) after a loss unwound to the loop: the
/// old communicators' windows and the deadline's board are left allocated (freeing them is a
/// collective the dead rank cannot join), the new world armed with the deadline.
pub fn shrink(comm: &SimpleCommunicator, timeout: std::time::Duration) -> anyhow::Result<(SimpleCommunicator, Vec<usize>)> {
    comm::deadline::abandon();
    let (shrunk, dead) = comm::ulfm::shrink(comm)?;
    comm::deadline::arm(&shrunk, timeout).map_err(|e| anyhow::anyhow!("re-arming the deadline after a lost rank: {e}"))?;
    Ok((shrunk, dead))
}

/// The training of `--on-rank-loss continue` (collective): set-up, training and finish as
/// `train::run` does them, and on each lost rank the survivors shrink, set up again from what
/// they hold ([`continue_from`]) and go on. A rank lost after training (in the final model or
/// evaluation) ends the job.
pub(super) fn run_surviving(
    plan: &super::plan::RunPlan,
    world: &SimpleCommunicator,
    shards: super::setup::Shards,
    spec: &crate::model::ModelSpec,
    started: Instant,
) -> anyhow::Result<super::Outcome> {
    // A rank lost while the survivors of another recover (shrinking, reading, setting up) ends
    // the job: only the training loop continues from a loss.
    ending_the_job_on_loss("a rank was lost while the survivors of another were recovering", || {
        surviving(plan, world, shards, spec, started)
    })
}

/// Runs `f`; a rank lost inside it ends the job with `what` (the places a loss cannot be
/// continued from), and any other panic goes on unwinding.
fn ending_the_job_on_loss<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) if p.is::<comm::ulfm::RankLost>() => comm::abort_now(what, 4),
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// [`run_surviving`]'s loop.
fn surviving(
    plan: &super::plan::RunPlan,
    world: &SimpleCommunicator,
    shards: super::setup::Shards,
    spec: &crate::model::ModelSpec,
    started: Instant,
) -> anyhow::Result<super::Outcome> {
    let cfg = &plan.cfg;
    let timeout = std::time::Duration::from_secs_f64(cfg.wait_timeout);
    let mut comm: &SimpleCommunicator = world;
    let mut shards = Some(shards);
    let mut continued: Option<(Restored, serde_json::Value, Instant)> = None;
    let mut losses: Vec<serde_json::Value> = Vec::new();
    loop {
        let reading = Instant::now();
        let shards_now = match shards.take() {
            Some(s) => s,
            None => super::setup::prepare(cfg, comm)?.0,
        };
        let reread = reading.elapsed().as_secs_f64();
        let (restored, record, caught) = match continued.take() {
            Some((r, rec, t)) => (Some(r), Some(rec), Some(t)),
            None => (None, None, None),
        };
        let (mut run, mut replica) = super::set_up(plan, comm, shards_now, spec, started, restored)?;
        if let (Some(mut rec), Some(t)) = (record, caught) {
            // The seconds lost: the slowest survivor's stall before it caught the loss, and the
            // shrink and set-up since (collective maximum: training goes on when all are back).
            let recovery = max_f64(comm, t.elapsed().as_secs_f64());
            rec["recovery_seconds"] = json!(recovery);
            // Of which: reading the new shards (the slowest survivor's).
            rec["reread_seconds"] = json!(max_f64(comm, reread));
            rec["seconds_lost"] = json!(rec["stalled_seconds"].as_f64().unwrap_or(0.0) + recovery);
            rec["resumed_unix"] =
                json!(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()));
            run.write_metrics(&rec);
            if comm.rank() == 0 {
                eprintln!("asap-train: rank(s) {} lost; {} ranks go on ({RULE}): {rec}", rec["dead_ranks"], comm.size());
            }
            losses.push(rec);
        }
        run.losses = losses.clone();
        let planned = epoch_plan(&run, comm);
        // Only here does the error handler let the survivors go on from a loss; anywhere else a
        // loss ends the job at once (src/comm/ulfm.rs, Phase).
        comm::ulfm::enter(Phase::Training);
        let trained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.train(&mut replica)));
        let payload = match trained {
            Ok(ending) => {
                comm::ulfm::enter(Phase::Finishing);
                return finish_or_end(run, replica, ending?);
            }
            Err(payload) if payload.is::<comm::ulfm::RankLost>() => payload,
            Err(payload) => std::panic::resume_unwind(payload),
        };
        drop(payload);
        comm::ulfm::enter(Phase::Recovering);
        let caught = Instant::now();
        let me = survivor(&run, &replica);
        let from = comm.size() as usize;
        // The old mode's windows and links cannot be freed (collectives with the dead rank).
        let super::Run { sync, .. } = run;
        std::mem::forget(sync);
        let (shrunk, dead) = shrink(comm, timeout)?;
        let shrinking = caught.elapsed().as_secs_f64();
        // Leaked: freeing a communicator is collective, and it lives to the end of the run.
        comm = Box::leak(Box::new(shrunk));
        let (restored, mut record) = continue_from(comm, me, from, &dead, planned);
        // The slowest survivor's time from catching the loss to the shrunk world.
        record["shrink_seconds"] = json!(max_f64(comm, shrinking));
        continued = Some((restored, record, caught));
    }
}

/// The run's finish; a rank lost in it ends the job (the model is trained, nothing to go on with).
fn finish_or_end(run: super::Run<'_>, replica: super::Replica, ending: super::Ending) -> anyhow::Result<super::Outcome> {
    ending_the_job_on_loss("a rank was lost after training, in the final model or evaluation", || run.finish(replica, ending))
}

/// This survivor's part of [`continue_from`].
fn survivor(run: &super::Run<'_>, r: &super::Replica) -> Survivor {
    let ids = run.ids.as_deref().unwrap_or(&[]);
    // A mini-batch taken by a step the loss interrupted counts as seen (`Run::mid_step`).
    let step = run.pos.step_in_epoch + usize::from(run.mid_step);
    let dealt = run.dealt.as_ref().map(|d| (d, &r.dealt_order[..]));
    let pass = dealt.map_or(ids.len(), |(_, o)| o.len());
    let b = run.cfg.batch_size;
    // A label-skewed shard's walk cycles or is cut: what is left is the rest of its plan.
    let skewed = dealt.is_none() && run.cfg.partition != "iid";
    let step = step.min(run.epoch_steps());
    let left = match (step >= run.epoch_steps(), skewed) {
        (true, _) => Vec::new(),
        (false, true) => elastic::left_in_walk(ids, &r.perm, r.rng.state(), b, run.steps_per_epoch, step),
        (false, false) => left_of_pass(ids, &r.perm, dealt, step, b),
    };
    let seen = if skewed { elastic::taken_in_walk(ids.len(), b, step) } else { pass.saturating_sub(left.len()) as u64 };
    let mut pos = run.pos.clone();
    pos.train_seconds = run.train_seconds();
    Survivor {
        pos,
        params: r.params.clone(),
        seen,
        left,
        state: [run.sync.save_state(), run.optimizer.save_state(), run.early_stop.as_ref().map_or(Vec::new(), |e| e.save_state())].concat(),
        last_step: run.last_step,
    }
}
