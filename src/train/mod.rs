//! The SPMD training loop: every rank trains its replica by mini-batch SGD on its shard and calls
//! the sync mode every `--sync-every` mini-batches; rank 0 reports.

pub mod checkpoint;
pub mod early_stop;
pub mod elastic;
pub mod emulate;
pub mod eval;
pub mod jitter;
pub mod lda;
pub mod model_file;
pub mod optimizer;
pub mod outputs;
pub mod phases;
pub mod plan;
pub mod report;
pub mod restart;
pub mod schedule;
pub mod setup;
pub mod shrink;
pub mod step_search;
pub mod summary;

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context;
use mpi::topology::{Communicator, SimpleCommunicator};
use serde_json::json;

use crate::comm::{self, collectives};
use crate::config::{Merged, TargetOn, TrainConfig};
use crate::model::{MetricKind, Model};
use crate::rng::Rng;
use crate::sync::{ModeMetric, SyncContext, SyncMode};
use checkpoint::Position;
use eval::{fmt_metric, Evaluation};
use report::{MetricsFile, Progress};

/// What a finished run tells its caller (on every rank; per-rank lists only on rank 0). The
/// metrics' summary line is [`summary::Summary`].
#[derive(Clone, Debug)]
pub struct Outcome {
    pub final_eval: Evaluation,
    pub rounds: u64,
    pub train_seconds: f64,
    pub time_to_target: Option<f64>,
    /// Stopped by SIGTERM/SIGUSR1 (the process should exit with [`PREEMPTED_EXIT`]).
    pub preempted: bool,
}

/// Exit status of a run stopped by SIGTERM/SIGUSR1 after writing its checkpoint (EX_TEMPFAIL:
/// "try again"); `slurm/asap-train.sbatch` requeues the job on it.
pub const PREEMPTED_EXIT: u8 = 75;

/// Builds the sync mode chosen by `--sync`, as its declaration says
/// ([`crate::sync::ModeSpec::build`]). Returns what the metrics' start line records about it.
fn build_sync(cfg: &TrainConfig, ctx: &SyncContext, init: &[f32]) -> anyhow::Result<(Box<dyn SyncMode>, serde_json::Value)> {
    cfg.sync.spec().build_run(ctx, &cfg.mode_run(), init)
}

/// Collectives with a deadline while it lives.
struct DeadlineGuard;

impl DeadlineGuard {
    fn arm(comm: &SimpleCommunicator, timeout: Duration) -> anyhow::Result<Self> {
        comm::deadline::arm(comm, timeout).context("setting up the collectives' deadline (one-sided window)")?;
        Ok(DeadlineGuard)
    }
}

impl Drop for DeadlineGuard {
    fn drop(&mut self) {
        comm::deadline::disarm();
    }
}

/// Timers and counters of this rank that are not the sync mode's.
#[derive(Default)]
struct Clock {
    compute: f64,
    excluded: Duration,
    /// Time in evaluations and in checkpoints (both also in `excluded`), for the phases.
    evaluating: Duration,
    checkpointing: Duration,
}

/// An evaluation point whose evaluation may run later: what this rank knew at that round.
struct PendingEval {
    round: u64,
    epoch: f64,
    step: u64,
    train_seconds: f64,
    wall_seconds: f64,
    replica: Vec<f32>,
    counters: Vec<f64>,
    mode_metrics: Vec<ModeMetric>,
}

/// Pending evaluations are run once their replicas would hold more than this many bytes on a
/// rank, even under an asynchronous mode (a collective that makes the ranks meet once).
const PENDING_EVAL_BYTES: usize = 256 << 20;

/// Names of the per-rank counters, in the order [`Run::local_counters`] returns them.
const COUNTER_NAMES: [&str; 18] = [
    "compute_seconds",
    "comm_seconds",
    "wait_seconds",
    "sync_seconds",
    "straggler_sleep_seconds",
    "bytes_sent",
    "bytes_received",
    "final_bytes",
    "final_seconds",
    "emulated_steps",
    "emulation_broken_steps",
    "emulation_overrun_seconds",
    "emulation_broken_fraction",
    "emulation_late_wakeups",
    "emulation_drift",
    "emulation_jitter_mean",
    "emulation_jitter_quantile_error",
    "cpu_seconds",
];

struct Run<'a> {
    cfg: &'a TrainConfig,
    comm: &'a SimpleCommunicator,
    model: Box<dyn Model>,
    shards: setup::Shards,
    sync: Box<dyn SyncMode>,
    optimizer: optimizer::Optimizer,
    metrics: MetricsFile,
    progress: Progress,
    clock: Clock,
    train_start: Instant,
    pos: Position,
    steps_per_epoch: usize,
    /// The step size of each mini-batch.
    schedule: schedule::StepSchedule,
    reached: Option<(f64, u64, f64)>,
    last_eval: Evaluation,
    /// The round of `last_eval` (0: none yet).
    last_eval_round: u64,
    /// `--patience`'s count of evaluations without improvement.
    early_stop: Option<early_stop::EarlyStop>,
    /// The round whose end-of-epoch evaluation a checkpoint ran ahead of its epoch's end, so the
    /// checkpoint holds its early-stopping count (the epoch's end does not run it again).
    epoch_end_evaluated: Option<u64>,
    pending: Vec<PendingEval>,
    run_id: checkpoint::RunIdentity,
    /// The emulated compute (`--emulate-compute`, `--straggler`, `--balance`).
    step_pacer: emulate::StepPacer,
    /// CPU seconds of this process when training started.
    cpu_start: f64,
    /// When `cpu_start` was read: CPU time is set against the wall time since then (evaluations
    /// included on both sides; against training time alone, 64 ranks' evaluations made 339 %).
    cpu_wall_start: Instant,
    /// `--fault-panic`: the (rank, round) that panics.
    fault_panic: Option<(usize, u64)>,
    /// `--fault-kill`: the (rank, round) that kills itself (None after a rank was lost).
    fault_kill: Option<(usize, u64)>,
    /// When this rank last started a step (`--on-rank-loss continue`: the end of its progress
    /// before a failure, train::shrink).
    last_step: Instant,
    /// Between taking a mini-batch and counting its step (train::shrink: a loss that unwinds
    /// from inside a step, from the mode's `before_step` or its idle time, counts the batch as
    /// taken: it is in the trace, and dealing it again would show it twice in its epoch).
    mid_step: bool,
    /// The ranks lost so far (`--on-rank-loss continue`): their `rank_lost` records, for the
    /// summary.
    losses: Vec<serde_json::Value>,
    /// This rank's training examples as global row ids (None: the shard is no range of the file).
    ids: Option<Vec<u64>>,
    /// This rank's share of the current epoch's examples dealt at a resize to another rank count
    /// (train::elastic).
    dealt: Option<elastic::Dealt>,
    /// How this run resumed, for the start line.
    resumed: Option<serde_json::Value>,
    /// The restarts after lost ranks that `asap-train elastic` made before this launch
    /// ([`restart::RESTARTS_ENV`]), for the start line and the summary.
    restarts: Vec<restart::Restart>,
    /// The example trace ([`TRACE_ENV`]).
    trace: Option<std::io::BufWriter<std::fs::File>>,
    /// When `run` was called, and the seconds its loading, step search and set-up took.
    started: Instant,
    load_seconds: f64,
    search_seconds: f64,
    setup_seconds: f64,
    /// `--emulate-groups`: the group links this rank's pacers share (for `--send-log`'s log).
    group_link: Option<std::rc::Rc<crate::comm::grouplink::GroupLink>>,
}

/// This rank's replica and what draws its mini-batches: what the step phase changes besides
/// [`Run`]'s position and counters.
struct Replica {
    params: Vec<f32>,
    rng: Rng,
    /// This pass's order of the shard's examples.
    perm: Vec<usize>,
    /// In a dealt epoch, this rank's share of it in its order (local indices).
    dealt_order: Vec<usize>,
    batch: Vec<usize>,
    scratch: Vec<f32>,
}

impl Replica {
    /// Mini-batch steps in one pass over the shard (the last takes the examples left).
    fn steps_per_pass(&self, batch: usize) -> usize {
        self.perm.len().div_ceil(batch)
    }

    /// Starts a pass over the shard: a fresh order from the rank's shuffle stream. Every epoch
    /// starts one; a shard smaller than an epoch's steps starts more (plan::steps_per_epoch).
    fn new_pass(&mut self) {
        self.perm.iter_mut().enumerate().for_each(|(i, x)| *x = i);
        self.rng.shuffle(&mut self.perm);
    }
}

/// How the training loop ended.
#[derive(Clone, Copy, Default)]
struct Ending {
    /// By --max-rounds, --stop-at-target or a signal, before the last epoch's end.
    stopped_early: bool,
    /// By SIGTERM/SIGUSR1.
    preempted: bool,
    /// By --patience.
    patience: bool,
}

impl Run<'_> {
    /// Rank 0 alone writes metrics, so a failure there cannot be agreed on: it ends the job.
    fn write_metrics(&mut self, v: &serde_json::Value) {
        if let Err(e) = self.metrics.write(v) {
            comm::abort_job(&format!("cannot write the metrics file: {e:#}"), 5);
        }
    }

    fn train_seconds(&self) -> f64 {
        self.pos.train_seconds + self.train_start.elapsed().saturating_sub(self.clock.excluded).as_secs_f64()
    }

    fn epoch_fraction(&self) -> f64 {
        match &self.dealt {
            None => self.pos.epoch as f64 + self.pos.step_in_epoch as f64 / self.steps_per_epoch as f64,
            // The share of the epoch left when it was dealt, done in proportion to the steps.
            Some(d) => {
                let left = d.total as f64 / self.shards.total_train.max(1) as f64;
                let done = self.pos.step_in_epoch as f64 / d.steps.max(1) as f64;
                self.pos.epoch as f64 + (1.0 - left * (1.0 - done)).clamp(0.0, 1.0)
            }
        }
    }

    /// The step the step-size schedule is at: `global_step` in a run never resized (epochs of
    /// `steps_per_epoch` steps), and after a resize the step this rank count's run would be at,
    /// so the schedule ends with the run's last mini-batch at any count (a dealt epoch's steps
    /// end where the epoch does).
    fn schedule_step(&self) -> u64 {
        let s = self.steps_per_epoch;
        let within = match &self.dealt {
            None => self.pos.step_in_epoch,
            Some(d) if d.steps <= s => s - d.steps + self.pos.step_in_epoch,
            Some(d) => self.pos.step_in_epoch * s / d.steps,
        };
        (self.pos.epoch * s + within) as u64
    }

    /// The steps of the current epoch: a pass over the shard, or those of a dealt epoch.
    fn epoch_steps(&self) -> usize {
        self.dealt.as_ref().map_or(self.steps_per_epoch, |d| d.steps)
    }

    /// This rank's counters, named by [`COUNTER_NAMES`].
    fn local_counters(&self) -> Vec<f64> {
        let s = self.sync.stats();
        vec![
            self.clock.compute,
            s.comm_seconds,
            s.wait_seconds,
            s.comm_seconds + s.wait_seconds,
            self.step_pacer.straggle_seconds,
            s.bytes_sent as f64,
            s.bytes_received as f64,
            s.final_bytes as f64,
            s.final_seconds,
            self.step_pacer.stats.steps as f64,
            self.step_pacer.stats.broken as f64,
            self.step_pacer.stats.overrun_seconds,
            self.step_pacer.stats.broken as f64 / self.step_pacer.stats.steps.max(1) as f64,
            self.step_pacer.stats.late_wakeups as f64,
            self.step_pacer.drift(),
            self.step_pacer.jitter.as_ref().map_or(1.0, |j| j.mean_drawn()),
            self.step_pacer.jitter.as_ref().map_or(0.0, |j| j.quantile_error()),
            comm::process_cpu_seconds().map_or(0.0, |c| c - self.cpu_start),
        ]
    }

    /// Records an evaluation point at the current round; evaluates at once under a lockstep mode
    /// (or when the pending snapshots grow too big), later otherwise.
    fn mark_evaluation(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        let round = self.pos.round;
        self.sync.mark_evaluation(round);
        self.pending.push(PendingEval {
            round,
            epoch: self.epoch_fraction(),
            step: self.pos.global_step,
            train_seconds: self.train_seconds(),
            wall_seconds: self.train_start.elapsed().as_secs_f64(),
            replica: params.to_vec(),
            counters: self.local_counters(),
            mode_metrics: self.sync.metrics(),
        });
        if self.sync.lockstep() {
            self.evaluate_pending()?;
        } else if self.cfg.stop_at_target || self.early_stop.is_some() {
            // --stop-at-target and --patience must know at once: the ranks meet here (outside
            // training time).
            self.quiesce(params);
            self.evaluate_pending()?;
        } else if self.pending.len() * params.len() * 4 > PENDING_EVAL_BYTES {
            self.quiesce(params);
            self.evaluate_pending()?;
        }
        Ok(())
    }

    /// A consistent cut of the mode (every rank calls it at the same round): afterwards no rank
    /// needs another to make progress, so blocking collectives are safe.
    fn quiesce(&mut self, params: &mut [f32]) {
        if let Err(e) = self.sync.quiesce(params, self.pos.round) {
            comm::abort_job(&format!("{e:#}"), 4);
        }
    }

    /// Whether each rank's own replica is evaluated: replicas of a mode that declares them equal
    /// after every round (allreduce) need not be (the averaged model stands for them), and one
    /// rank has nothing to compare.
    fn own_models_differ(&self) -> bool {
        !self.cfg.sync.spec().replicas_agree && self.comm.size() > 1
    }

    /// The ranks whose own replicas evaluations score (`--own-models`; none when they do not
    /// differ).
    fn own_ranks(&self) -> Vec<usize> {
        if self.own_models_differ() {
            eval::own_model_ranks(self.comm.size() as usize, self.cfg.own_models)
        } else {
            Vec::new()
        }
    }

    /// The worst and the mean of the ranks' own models' metrics.
    fn worst_and_mean(&self, own: &[f64]) -> (f64, f64) {
        let kind = self.model.metric_kind();
        let worst = own.iter().copied().fold(if kind == MetricKind::Accuracy { f64::INFINITY } else { f64::NEG_INFINITY }, |a, b| {
            if kind == MetricKind::Accuracy {
                a.min(b)
            } else {
                a.max(b)
            }
        });
        (worst, own.iter().sum::<f64>() / own.len() as f64)
    }

    /// Collective evaluation of every pending evaluation point, in order: metrics line, progress
    /// line, target and divergence checks. All ranks call it at the same points. The points are
    /// evaluated together, in a fixed number of collectives (`eval::evaluate_batch`).
    fn evaluate_pending(&mut self) -> anyhow::Result<()> {
        let t0 = Instant::now();
        let pending = std::mem::take(&mut self.pending);
        let mut parts = Vec::with_capacity(pending.len());
        for p in &pending {
            match self.sync.evaluated_model(p.round) {
                Ok(m) => parts.push(m),
                Err(e) => comm::abort_job(&format!("{e:#}"), 4),
            }
        }
        let own = self.own_models_differ();
        let inputs = pending
            .iter()
            .zip(parts)
            .map(|(p, part)| eval::PointInput {
                replica: &p.replica,
                part,
                own: own.then_some(&p.replica[..]),
                counters: &p.counters,
                metrics: &p.mode_metrics,
                train_seconds: p.train_seconds,
            })
            .collect();
        let own_ranks = self.own_ranks();
        let results =
            eval::evaluate_batch(self.comm, self.model.as_ref(), inputs, &self.shards.train, self.shards.test.as_ref(), &own_ranks);
        for (p, r) in pending.into_iter().zip(results) {
            let ev = r.eval;
            let counters = summary::counters(&r.counters_mean, &r.counters_max);
            let extra = r.metrics;
            // The round was done everywhere when the slowest rank got there.
            let train_s = r.train_seconds;
            let kind = self.model.metric_kind();
            let (worst, mean) = if own { self.worst_and_mean(&r.own) } else { (ev.metric, ev.metric) };
            let judged = match self.cfg.target_on {
                TargetOn::Averaged => ev.metric,
                TargetOn::WorstRank => worst,
                TargetOn::MeanRank => mean,
            };
            if let (Some(t), None) = (self.cfg.target, self.reached) {
                if eval::reached(kind, judged, t) {
                    self.reached = Some((train_s, p.round, p.epoch));
                }
            }
            let record = json!({
                "event": "eval",
                "epoch": p.epoch,
                "round": p.round,
                "step": p.step,
                "train_seconds": train_s,
                "wall_seconds": p.wall_seconds,
                "objective": ev.objective,
                "metric": kind,
                "test_metric": if self.shards.test.is_some() { json!(ev.metric) } else { json!(null) },
                "train_metric": ev.train_metric,
                "consensus_distance": ev.consensus_distance,
                "rank_metric": {"worst": worst, "mean": mean},
                "counters": counters,
                "sync": extra,
            });
            self.write_metrics(&record);
            let which = if self.shards.test.is_some() { "test" } else { "train" };
            self.progress.last_metric = format!("{which} {}", fmt_metric(kind, ev.metric));
            let line = format!(
                "epoch {:6.2} round {:7} | objective {:.5} | {which} {} | consensus {:.3e} | {:.1}s",
                p.epoch,
                p.round,
                ev.objective,
                fmt_metric(kind, ev.metric),
                ev.consensus_distance,
                train_s
            );
            self.progress.line(&line);
            if !ev.objective.is_finite() {
                anyhow::bail!(
                    "training diverged by epoch {:.2} (round {}): the objective is {}; try a smaller --lr (now {})",
                    p.epoch,
                    p.round,
                    ev.objective,
                    self.cfg.lr
                );
            }
            if self.last_eval_round > 0 && self.comm.rank() == 0 {
                if let Some(w) = objective_jump(self.last_eval.objective, ev.objective, p.epoch, self.cfg.lr, self.cfg.sync.spec().name) {
                    log::warn!("{w}");
                }
            }
            if let Some(es) = &mut self.early_stop {
                es.observe(ev.metric, p.round, p.epoch);
            }
            self.last_eval = ev;
            self.last_eval_round = p.round;
        }
        self.clock.excluded += t0.elapsed();
        self.clock.evaluating += t0.elapsed();
        Ok(())
    }

    /// The summary's time by phase (collective: launch and MPI start-up are the slowest rank's).
    fn phases(&self, load: f64, setup: f64, train: f64, final_evaluation: Duration, final_model: f64) -> phases::Phases {
        let (launch, mpi_init) = phases::startup();
        // -1 stands for unknown; any rank that knows gives the maximum over those that do.
        let mut v = [launch.unwrap_or(-1.0), mpi_init.unwrap_or(-1.0)];
        collectives::max_f64(self.comm, &mut v);
        let known = |x: f64| (x >= 0.0).then_some(x);
        phases::Phases {
            launch: known(v[0]),
            mpi_init: known(v[1]),
            load,
            step_search: self.search_seconds,
            setup,
            train,
            evaluate: (self.clock.evaluating + final_evaluation).as_secs_f64(),
            checkpoint: self.clock.checkpointing.as_secs_f64(),
            final_model,
        }
    }

    /// A consistent cut of the mode, then the pending evaluations, then the checkpoint (all
    /// collective).
    fn checkpoint(&mut self, params: &mut [f32], epoch_rng: [u64; 4], rng_now: [u64; 4]) -> anyhow::Result<()> {
        let Some(dir) = self.cfg.checkpoint_dir.clone() else { return Ok(()) };
        // Time excluded from training: the cut and the checkpoint itself (the evaluations count
        // their own time).
        let t0 = Instant::now();
        self.quiesce(params);
        let cut = t0.elapsed();
        // The epoch's last round, before its end-of-epoch evaluation: run it now, so that the
        // early-stopping count a resumed run starts from holds it (a resume starts the next epoch).
        let at_epoch_end = self.pos.step_in_epoch >= self.epoch_steps();
        if self.early_stop.is_some() && self.cfg.eval_every == 0 && at_epoch_end && self.epoch_end_evaluated != Some(self.pos.round) {
            // Its epoch (epoch_fraction) and round are the ones the epoch's end would record.
            self.epoch_end_evaluated = Some(self.pos.round);
            self.mark_evaluation(params)?;
        }
        self.evaluate_pending()?;
        let t0 = Instant::now();
        let mut pos = self.pos.clone();
        pos.train_seconds = self.train_seconds();
        // At the end of an epoch the next epoch starts from the current RNG state.
        let rng_state = if at_epoch_end {
            pos.epoch += 1;
            pos.step_in_epoch = 0;
            rng_now
        } else {
            epoch_rng
        };
        // Before the save, so a checkpoint on disk has its mark in every rank's trace.
        self.trace_mark(&format!("checkpoint {}", pos.round));
        let contents = checkpoint::Contents {
            params,
            epoch_rng: rng_state,
            mode_state: &[
                self.sync.save_state(),
                self.optimizer.save_state(),
                self.early_stop.as_ref().map_or(Vec::new(), |e| e.save_state()),
            ]
            .concat(),
            config_json: &serde_json::to_string(self.cfg)?,
            spec_json: &serde_json::to_string(self.model.spec())?,
            rows: self.shards.rows,
            ids: (self.cfg.partition != "iid").then(|| self.ids.as_deref().unwrap_or(&[])),
            dealt: self.dealt.as_ref().filter(|_| !at_epoch_end),
        };
        checkpoint::save(self.comm, &dir, &self.run_id, &pos, &contents)?;
        self.clock.excluded += cut + t0.elapsed();
        self.clock.checkpointing += cut + t0.elapsed();
        Ok(())
    }
}

/// Runs training as configured (`merged`: the merge of the options' sources). Collective: every
/// rank calls it. The phases: loading, the run plan ([`plan::RunPlan::resolve`]: the defaults
/// that depend on the run; with `print_config` rank 0 prints it), set-up ([`set_up`]), the
/// training loop ([`Run::train`]: steps and ends of rounds) and the finish ([`Run::finish`]: final
/// model, evaluation, summary).
pub fn run(merged: Merged, comm: &SimpleCommunicator, print_config: bool) -> anyhow::Result<Outcome> {
    let cfg = &merged.options;
    let started = Instant::now();
    // Before any communicator is derived from the world: they inherit its error handler.
    if cfg.on_rank_loss == crate::config::OnRankLoss::Continue {
        comm::ulfm::install(comm)?;
    } else {
        comm::ulfm::install_stop(comm)?;
    }
    // `--fault-kill RANK:0`: a rank lost during start-up, before the first collective.
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    if cfg.fault_kill.as_deref().map(|s| crate::config::parse_rank_round("--fault-kill", s, n)).transpose()? == Some((rank, 0)) {
        kill_self_at(rank, 0);
    }
    // From here on every collective gives up after --wait-timeout naming the ranks that never
    // reached it (disarmed when this function returns, on every rank alike).
    let _deadline = DeadlineGuard::arm(comm, Duration::from_secs_f64(cfg.wait_timeout))?;
    // Every rank checks the outputs it writes (rank 0 most of them) before anything is read or
    // trained; a bad path stops every rank.
    collectives::agree(comm, outputs::check(cfg, comm.rank() as usize))?;
    for path in std::iter::once(&cfg.data).chain(&cfg.test_data) {
        if path.contains("datasets/out/") && !std::path::Path::new(path).exists() {
            anyhow::bail!("{path} does not exist: `make datasets` (or datasets/prepare.sh) prepares the data sets under datasets/out/");
        }
    }
    let lda = cfg.model == crate::model::ModelKind::Lda;
    let training = if lda { None } else { Some(setup::prepare(cfg, comm)?) };
    let plan = plan::RunPlan::resolve(merged, comm, training.as_ref().map(|(shards, spec)| (shards, spec)))?;
    collectives::agree(comm, if comm.rank() == 0 { write_configuration(&plan.cfg, print_config) } else { Ok(()) })?;
    let Some((shards, spec)) = training else { return lda::run(&plan, comm, started) };
    if plan.cfg.on_rank_loss == crate::config::OnRankLoss::Continue {
        return shrink::run_surviving(&plan, comm, shards, &spec, started);
    }
    let (mut run, mut replica) = set_up(&plan, comm, shards, &spec, started, None)?;
    let ending = run.train(&mut replica)?;
    run.finish(replica, ending)
}

/// `--print-config` and `--save-config` (rank 0): the run plan's options as a config file that
/// gives the same run ([`TrainConfig::config_file_text`]: only the options that apply to it, the
/// defaults that depend on the run as chosen). Printed as JSON alone on standard output, ahead of
/// the summary, with no header: the object can be cut out and fed back with `--config`. Written
/// to `--save-config FILE` as TOML or JSON by its name, as `--config` reads it.
fn write_configuration(cfg: &TrainConfig, print: bool) -> anyhow::Result<()> {
    if print {
        let mut out = std::io::stdout().lock();
        std::io::Write::write_all(&mut out, cfg.config_file_text(std::path::Path::new("/dev/stdout"))?.as_bytes())?;
        std::io::Write::flush(&mut out)?;
    }
    if let Some(path) = &cfg.save_config {
        let text = cfg.config_file_text(std::path::Path::new(path))?;
        std::fs::write(path, text).with_context(|| format!("--save-config {path}: cannot write the configuration"))?;
    }
    Ok(())
}

/// The first replica: the model's initial parameters (random ones of each rank's own under
/// `--consensus-only`).
fn initial_params(cfg: &TrainConfig, model: &dyn Model, rank: usize) -> Vec<f32> {
    let mut params = vec![0f32; model.num_params()];
    model.init(&mut params, &mut Rng::new(cfg.seed));
    if cfg.consensus_only {
        let mut r = Rng::for_stream(cfg.seed ^ 0x636f_6e73, rank as u64 + 1);
        params.iter_mut().for_each(|x| *x = r.normal() as f32);
    }
    params
}

/// The emulated compute of this rank (`--emulate-compute`, `--straggler`, `--straggler-wait`);
/// rank 0 says what it emulates.
fn step_pacer(cfg: &TrainConfig, n: usize, rank: usize) -> anyhow::Result<emulate::StepPacer> {
    let plan = match &cfg.straggler {
        Some(s) => {
            let plan = schedule::StragglerPlan::parse(s, n, cfg.seed)?;
            if rank == 0 {
                eprintln!("asap-train: stragglers (rank: compute slowed) {}", plan.describe());
            }
            plan
        }
        None => schedule::StragglerPlan::none(n),
    };
    let pacer =
        emulate::StepPacer::new(cfg.emulate_compute, plan, rank, cfg.straggler_wait).with_jitter(cfg.emulate_jitter.as_ref(), cfg.seed);
    if let (Some(ms), true) = (cfg.emulate_compute, rank == 0) {
        eprintln!(
            "asap-train: emulated cluster: every step takes {ms} ms at nominal speed{}{}",
            match &cfg.emulate_jitter {
                Some(j) => format!(" times a factor drawn per step from the quantiles {j} (mean {:.3})", j.mean()),
                None => String::new(),
            },
            if cfg.balance { "; --balance: slowed ranks take smaller mini-batches" } else { "" }
        );
    }
    Ok(pacer)
}

/// The checkpoint this run continues from (`--resume`, or `--auto-resume` finding one it can
/// continue: its own, or one of its options at another rank count where `resize` allows it),
/// after removing the temporaries a killed run left; None for a fresh start.
fn resume_point(
    cfg: &TrainConfig,
    comm: &SimpleCommunicator,
    run_id: &checkpoint::RunIdentity,
    n_params: usize,
    resize: &checkpoint::ResizePlan,
) -> anyhow::Result<Option<checkpoint::Restored>> {
    if let (Some(dir), true) = (&cfg.checkpoint_dir, comm.rank() == 0) {
        checkpoint::remove_stale_temporaries(std::path::Path::new(dir), run_id);
    }
    let elastic = resize.allowed.is_ok();
    let resume = cfg.resume || (cfg.auto_resume && checkpoint::has_resumable(comm, cfg.checkpoint_dir.as_deref(), run_id, elastic));
    if !resume {
        return Ok(None);
    }
    let dir = cfg.checkpoint_dir.as_deref().expect("validated: --resume needs --checkpoint-dir");
    let r = checkpoint::restore(comm, dir, run_id, n_params, resize)?;
    if comm.rank() == 0 {
        eprintln!("asap-train: resuming from {} (epoch {}, round {})", r.path.display(), r.position.epoch, r.position.round);
    }
    Ok(Some(r))
}

/// The rounds the run will have done at its end (for the progress line): in a dealt epoch, the
/// rounds so far and those its steps left and the later epochs take.
fn total_rounds(cfg: &TrainConfig, steps_per_epoch: usize, pos: &Position, dealt: Option<&elastic::Dealt>) -> u64 {
    let all = match dealt {
        None => (cfg.epochs * steps_per_epoch / cfg.sync_every) as u64,
        Some(d) => {
            let later = cfg.epochs.saturating_sub(pos.epoch + 1) * steps_per_epoch;
            pos.round + ((d.steps.saturating_sub(pos.step_in_epoch) + later) / cfg.sync_every) as u64
        }
    };
    cfg.max_rounds.map_or(all, |m| m.min(all))
}

/// Whether and how a checkpoint of another rank count can be continued (train::elastic): in the
/// modes that declare it, under every `--partition`.
fn resize_plan(cfg: &TrainConfig) -> checkpoint::ResizePlan {
    let mode = cfg.sync.spec();
    let allowed = if !mode.elastic {
        Err(format!(
            "--sync {} cannot change its rank count at a resume; --sync {} can",
            mode.name,
            crate::sync::SyncKind::names_where(|m| m.elastic)
        ))
    } else {
        Ok(())
    };
    let holdout = (cfg.test_data.is_none() && cfg.test_fraction > 0.0).then_some((cfg.test_fraction, cfg.seed));
    checkpoint::ResizePlan { allowed, batch: cfg.batch_size, holdout, model: mode.resize_model }
}

/// At a resume on another rank count: this rank's share of the examples left of the interrupted
/// epoch (`left`, all of them) with the steps every rank takes over its share (the largest
/// share's mini-batches), or None when none are left (then the next epoch starts). `ids`: this
/// rank's training examples.
fn deal_rest(
    comm: &SimpleCommunicator,
    left: Vec<u64>,
    ids: Option<&[u64]>,
    batch: usize,
    pos: &mut Position,
) -> anyhow::Result<Option<elastic::Dealt>> {
    let count = left.len() as u64;
    let share = ids.map(|ids| elastic::Dealt { ids: left, steps: 0, total: count }.share(ids)).ok_or_else(|| {
        anyhow::anyhow!(
            "rank {}: its training shard is no range of the file, so the examples left of the epoch cannot be dealt",
            comm.rank()
        )
    });
    let share = collectives::agree(comm, share)?;
    let total = collectives::sum_u64(comm, share.ids.len() as u64);
    anyhow::ensure!(
        total == count,
        "the checkpoint's epoch has {count} examples left, and this run's shards hold {total} of them: resume with the data and \
         --test-fraction of the run that wrote it"
    );
    let steps = collectives::max_u64(comm, share.ids.len().div_ceil(batch) as u64) as usize;
    pos.step_in_epoch = 0;
    if steps == 0 {
        pos.epoch += 1;
        return Ok(None);
    }
    Ok(Some(elastic::Dealt { steps, ..share }))
}

/// At a resume: this rank's mode, optimizer and early-stopping state. On the same rank count
/// the checkpoint's (at `path`); on another (`resized`), fresh ones built from the replicas'
/// average (or the servers' model) with what the resize carries, and the mode's own rows of
/// what its old ranks held split by row (train::elastic).
fn resumed_state(
    comm: &SimpleCommunicator,
    path: &std::path::Path,
    resized: Option<&checkpoint::Resized>,
    sync: &dyn SyncMode,
    optimizer: &optimizer::Optimizer,
    early: Option<&early_stop::EarlyStop>,
    ids: Option<&[u64]>,
) -> anyhow::Result<crate::sync::ModeState> {
    let Some(resized) = resized else { return checkpoint::restore_mode_state(comm, path) };
    let carried = elastic::carried_state(&resized.old_states, |name| {
        sync.averaged_on_resize(name) || optimizer::Optimizer::averaged_on_resize(name) || early_stop::EarlyStop::averaged_on_resize(name)
    });
    let carried = checkpoint::broadcast_state(comm, carried);
    let fresh = [sync.save_state(), optimizer.save_state(), early.map_or(Vec::new(), |e| e.save_state())].concat();
    let mut state = elastic::overlay(fresh, &carried);
    // SAGA's stored slopes follow their examples (the coordinator's mean of them is carried).
    let (all_ids, all_values) = &resized.per_example;
    if let (Some((_, slopes)), Some(ids), false) =
        (state.iter_mut().find(|(n, _)| n == optimizer::Optimizer::PER_EXAMPLE), ids, all_ids.is_empty())
    {
        *slopes = elastic::own_per_example(all_ids, all_values, ids);
    }
    // A parameter server's per-row state follows its rows to their new shards.
    let laid = checkpoint::broadcast_state(comm, elastic::laid_end_to_end(&resized.old_states, |name| sync.laid_on_resize(name)));
    collectives::agree(comm, sync.repartition(state, &laid, resized.from))
}

/// The start line's record of a resume (`from`: the rank count that wrote the checkpoint, when
/// it is not this run's): the checkpoint, the rank counts and at a resize the rule applied
/// (`rule`) and the examples dealt (train::elastic).
fn resume_record(
    path: &std::path::Path,
    from: Option<usize>,
    rule: &str,
    n: usize,
    dealt: Option<&elastic::Dealt>,
    pos: &Position,
) -> serde_json::Value {
    let mut v = json!({"checkpoint": path, "epoch": pos.epoch, "round": pos.round, "ranks_before": from.unwrap_or(n), "ranks": n});
    if from.is_some() {
        v["rule"] = json!(rule);
        v["examples_dealt"] = json!(dealt.map_or(0, |d| d.total));
        v["dealt_steps"] = json!(dealt.map_or(0, |d| d.steps));
        // Not from a checkpoint: the survivors of a lost rank (train::shrink).
        v["in_place"] = json!(rule == shrink::RULE);
    }
    v
}

/// `--patience` needs a held-out set.
fn check_patience(cfg: &TrainConfig, shards: &setup::Shards) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg.patience.is_none() || shards.test.is_some(),
        "--patience {} stops on the held-out metric, and this run has no held-out set: give --test-data FILE or --test-fraction F",
        cfg.patience.unwrap_or(0)
    );
    Ok(())
}

/// A fault injection's (rank, round), if any.
type RankRound = Option<(usize, u64)>;

/// `--fault-kill RANK:ROUND` on its rank: says so (with the unix time, which
/// benches/ulfm-kill.sh measures from) and kills this process with SIGKILL.
fn kill_self_at(rank: usize, round: u64) -> ! {
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    comm::say(&format!("asap-train: fault injection: rank {rank} kills itself (SIGKILL) at round {round} (unix time {unix:.6})"));
    comm::ulfm::kill_self()
}

/// The fault injections of this run at `n` ranks: `--fault-panic`'s and `--fault-kill`'s (rank,
/// round); the kill is done once, so a run continued in place after it (`in_place`) has none.
fn fault_points(cfg: &TrainConfig, n: usize, in_place: bool) -> anyhow::Result<(RankRound, RankRound)> {
    let at = |flag: &str, v: &Option<String>| v.as_deref().map(|s| crate::config::parse_rank_round(flag, s, n)).transpose();
    Ok((at("--fault-panic", &cfg.fault_panic)?, if in_place { None } else { at("--fault-kill", &cfg.fault_kill)? }))
}

/// The environment variable that makes every rank write the global row of each example it steps
/// on, after the epoch, one a line, to `$ASAP_TRAIN_TRACE_EXAMPLES.rank{r}` (appended): the
/// record the elastic tests count examples by (tests/elastic.rs). Lines starting `#` are marks:
/// `# start` where each launch begins, `# checkpoint ROUND` before each checkpoint
/// (`Run::trace_mark`).
pub const TRACE_ENV: &str = "ASAP_TRAIN_TRACE_EXAMPLES";

/// The example trace of this rank ([`TRACE_ENV`]), when asked for; named by the rank in the
/// world, which a lost rank's survivors keep (their rank in the shrunk world is another, and a
/// dead rank's file may end in half a line).
fn open_trace(comm: &SimpleCommunicator) -> anyhow::Result<Option<std::io::BufWriter<std::fs::File>>> {
    let Ok(prefix) = std::env::var(TRACE_ENV) else { return Ok(None) };
    let path = format!("{prefix}.rank{}", SimpleCommunicator::world().rank());
    let file =
        std::fs::OpenOptions::new().create(true).append(true).open(&path).with_context(|| format!("{TRACE_ENV}: cannot open {path}"));
    let mut trace = std::io::BufWriter::new(collectives::agree(comm, file)?);
    collectives::agree(comm, writeln!(trace, "# start").with_context(|| format!("{TRACE_ENV}: cannot write {path}")))?;
    Ok(Some(trace))
}

/// Set-up (collective): the model and its first replica, the optimizer, the resume point, the
/// sync mode and the metrics file; writes the metrics' start line. `continued`: what the
/// survivors of a lost rank continue from (train::shrink), in place of a resume point.
fn set_up<'a>(
    plan: &'a plan::RunPlan,
    comm: &'a SimpleCommunicator,
    mut shards: setup::Shards,
    spec: &crate::model::ModelSpec,
    started: Instant,
    continued: Option<checkpoint::Restored>,
) -> anyhow::Result<(Run<'a>, Replica)> {
    let cfg = &plan.cfg;
    // The step search ran between loading and set-up: its time is its own phase.
    let load_seconds = started.elapsed().as_secs_f64() - plan.search_seconds;
    let setup_start = Instant::now();
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    let model = crate::model::build(spec)?;
    let p = model.num_params();
    let mut params = initial_params(cfg, model.as_ref(), rank);
    let mut rng = Rng::for_stream(cfg.seed, rank as u64 + 1);
    let step_pacer = step_pacer(cfg, n, rank)?;
    let in_place = continued.is_some();
    let (fault_panic, fault_kill) = fault_points(cfg, n, in_place)?;
    let local_n = shards.train.len();
    let mut optimizer = optimizer::Optimizer::new(
        (cfg.sync.spec().keeps_history)(&cfg.modes),
        &optimizer::Inner::of(cfg),
        model.as_ref(),
        local_n,
        shards.total_train,
        p,
    )?;
    let steps_per_epoch = plan::steps_per_epoch(cfg, &shards, comm);
    check_patience(cfg, &shards)?;
    let mut early = cfg.patience.map(|p| early_stop::EarlyStop::new(p, model.metric_kind()));
    let mut pos = Position { epoch: 0, step_in_epoch: 0, global_step: 0, round: 0, train_seconds: 0.0 };
    let run_id = checkpoint::RunIdentity::new(&plan.resolved, n).with_chosen(&plan.chosen);
    let resize = resize_plan(cfg);
    let ids = shards.take_ids(resize.holdout);
    let mut dealt = None;
    let restored = if in_place { continued } else { resume_point(cfg, comm, &run_id, p, &resize)? };
    let resumed = match restored {
        Some(r) => {
            (params, pos) = (r.params, r.position);
            rng = match r.resized {
                Some(_) => elastic::resized_stream(cfg.seed, pos.epoch, rank),
                None => Rng::from_state(r.epoch_rng),
            };
            dealt = match (&r.resized, r.dealt) {
                (Some(_), Some(left)) => deal_rest(comm, left.ids, ids.as_deref(), cfg.batch_size, &mut pos)?,
                (_, d) => d.map(|d| d.share(ids.as_deref().unwrap_or(&[]))),
            };
            Some((r.path, r.resized))
        }
        None => None,
    };
    let ctx = plan.sync_context(comm, model.layout(), ((steps_per_epoch / cfg.sync_every) as u64).max(1))?;
    let (mut sync, sync_info) = build_sync(cfg, &ctx, &params)?;
    if let Some((path, resized)) = &resumed {
        let mut state = resumed_state(comm, path, resized.as_ref(), sync.as_ref(), &optimizer, early.as_ref(), ids.as_deref())?;
        collectives::agree(comm, optimizer.restore_state(&mut state))?;
        collectives::agree(comm, early_stop::EarlyStop::restore_state(early.as_mut(), &mut state))?;
        collectives::agree(comm, sync.restore_state(state))?;
    }
    let rule = if in_place { shrink::RULE } else { elastic::rule(cfg.sync.spec().resize_model.is_some()) };
    let resumed = resumed.map(|(path, rz)| resume_record(&path, rz.as_ref().map(|r| r.from), rule, n, dealt.as_ref(), &pos));
    let trace = open_trace(comm)?;
    let metrics = collectives::agree(comm, MetricsFile::open(cfg.metrics.as_deref(), rank == 0, resumed.is_some()))?;
    // Training time starts where set-up ends (`train_start` below).
    let setup_seconds = setup_start.elapsed().as_secs_f64();
    let mut run = Run {
        cfg,
        comm,
        model,
        steps_per_epoch,
        schedule: schedule::StepSchedule::new(cfg, steps_per_epoch),
        metrics,
        progress: Progress::new(rank == 0, total_rounds(cfg, steps_per_epoch, &pos, dealt.as_ref())),
        clock: Clock::default(),
        train_start: Instant::now(),
        pos,
        sync,
        optimizer,
        reached: None,
        last_eval: Evaluation::default(),
        last_eval_round: 0,
        early_stop: early,
        epoch_end_evaluated: None,
        pending: Vec::new(),
        run_id,
        shards,
        step_pacer,
        cpu_start: comm::process_cpu_seconds().unwrap_or(0.0),
        cpu_wall_start: Instant::now(),
        fault_panic,
        fault_kill,
        last_step: Instant::now(),
        mid_step: false,
        losses: Vec::new(),
        ids,
        dealt,
        resumed,
        restarts: restart::from_env()?,
        trace,
        started,
        load_seconds,
        search_seconds: plan.search_seconds,
        setup_seconds,
        group_link: ctx.group_link.clone(),
    };
    run.write_start(sync_info)?;
    let replica = Replica {
        params,
        rng,
        perm: (0..local_n).collect(),
        dealt_order: Vec::new(),
        batch: Vec::with_capacity(cfg.batch_size),
        scratch: Vec::new(),
    };
    Ok((run, replica))
}

impl Run<'_> {
    /// The metrics' start line (the class counts per rank are a collective) and rank 0's line
    /// about the job.
    fn write_start(&mut self, sync_info: serde_json::Value) -> anyhow::Result<()> {
        let (cfg, n) = (self.cfg, self.comm.size() as usize);
        let p = self.model.num_params();
        let class_counts = (cfg.partition != "iid").then(|| setup::class_counts(&self.shards.train, self.comm));
        let start = json!({
            "event": "start",
            "class_counts_per_rank": class_counts,
            "ranks": n,
            "config": json_value(cfg)?,
            "model_spec": json_value(self.model.spec())?,
            "params": p,
            "train_examples": self.shards.total_train,
            "test_examples": self.shards.total_test,
            "steps_per_epoch": self.steps_per_epoch,
            "load_seconds": self.load_seconds,
            "step_search_seconds": self.search_seconds,
            "sync_info": &sync_info,
            "resumed": self.resumed,
            "restarts": restart::to_json(&self.restarts),
        });
        self.write_metrics(&start);
        if self.comm.rank() == 0 {
            eprintln!(
                "asap-train: {n} rank{}, sync {}{}, {} training examples ({}), {} parameters, {} steps/epoch/rank{}, data loaded in {:.2}s{}",
                if n == 1 { "" } else { "s" },
                self.sync.name(),
                // What the mode chose for itself, and why (sync_info's "chosen").
                sync_info["chosen"].as_str().map_or(String::new(), |c| format!(" by {c}")),
                self.shards.total_train,
                if self.shards.total_test > 0 { format!("{} held out", self.shards.total_test) } else { "no held-out set".into() },
                p,
                self.steps_per_epoch,
                // plan::steps_per_epoch: label-skewed shards differ in size.
                if cfg.partition != "iid" { " (an epoch is a pass over the mean shard; smaller shards cycle)" } else { "" },
                self.load_seconds,
                if self.search_seconds > 0.0 { format!(", step search {:.2}s", self.search_seconds) } else { String::new() }
            );
            if let Some(r) = self.resumed.as_ref().filter(|r| r["ranks_before"] != json!(n)) {
                let ranks = if n == 1 { "1 rank".to_owned() } else { format!("{n} ranks") };
                let what = if r["in_place"] == json!(true) { "continued a {}-rank run in place" } else { "resumed a {}-rank checkpoint" };
                eprintln!(
                    "asap-train: {} on {ranks}: {}; {} examples were left of epoch {}, dealt over the {ranks} in {} steps",
                    what.replace("{}", &r["ranks_before"].to_string()),
                    r["rule"].as_str().unwrap_or(elastic::RULE),
                    r["examples_dealt"],
                    r["epoch"],
                    r["dealt_steps"]
                );
            }
        }
        Ok(())
    }

    /// The training loop: epochs of shuffled mini-batch steps, a round every `--sync-every`
    /// steps, until the last epoch, `--max-rounds`, `--stop-at-target` or a stop vote. Ends at a
    /// consistent cut of the mode with the stop votes closed.
    fn train(&mut self, r: &mut Replica) -> anyhow::Result<Ending> {
        let cfg = self.cfg;
        comm::preempt::install_handlers();
        // A rank waiting for a vote does not serve the sync mode: vote no more often than the mode
        // lets ranks drift apart, so every rank has started a vote before anyone waits for it.
        let vote_period = cfg.stop_check_every.max(self.sync.round_lead() + 1);
        let mut stop_vote = comm::preempt::StopVote::new(self.comm, vote_period, Duration::from_secs_f64(cfg.wait_timeout));
        let mut ending = Ending::default();
        // A resume at or past --max-rounds trains nothing: it writes its checkpoint and ends (a
        // resume at another rank count then leaves that count's checkpoint).
        if cfg.max_rounds.is_some_and(|m| self.pos.round >= m) && self.pos.epoch < cfg.epochs {
            self.checkpoint(&mut r.params, r.rng.state(), r.rng.state())?;
            ending = Ending { stopped_early: true, ..Ending::default() };
        }
        'epochs: while self.pos.epoch < cfg.epochs && !ending.stopped_early {
            // --patience at an epoch's end (or a resumed run whose checkpoint already ran out).
            if self.early_stop.as_ref().is_some_and(|e| e.exhausted()) {
                self.checkpoint(&mut r.params, r.rng.state(), r.rng.state())?;
                ending = Ending { stopped_early: true, preempted: false, patience: true };
                break 'epochs;
            }
            // A checkpoint keeps the shuffle stream as the epoch began: a resumed epoch replays the
            // shuffles of the passes begun before it stopped, and goes on as the uninterrupted run.
            let epoch_rng = r.rng.state();
            let steps_per_pass = r.steps_per_pass(cfg.batch_size);
            if let Some(d) = &self.dealt {
                // An epoch dealt at a resize: this rank's share, in an order of its stream.
                r.dealt_order = elastic::dealt_order(&d.ids, self.ids.as_deref().unwrap_or(&[]), &mut r.rng);
            } else {
                (0..self.pos.step_in_epoch.div_ceil(steps_per_pass)).for_each(|_| r.new_pass());
            }
            while self.pos.step_in_epoch < self.epoch_steps() {
                if self.dealt.is_none() && self.pos.step_in_epoch.is_multiple_of(steps_per_pass) {
                    r.new_pass();
                }
                self.step(r);
                if !self.pos.global_step.is_multiple_of(cfg.sync_every as u64) {
                    continue;
                }
                if let Some(end) = self.end_of_round(r, epoch_rng, &mut stop_vote)? {
                    ending = end;
                    break 'epochs;
                }
            }
            self.pos.epoch += 1;
            self.pos.step_in_epoch = 0;
            self.dealt = None;
            if cfg.eval_every == 0 && self.epoch_end_evaluated != Some(self.pos.round) {
                self.mark_evaluation(&mut r.params)?;
            }
        }
        // The last vote is a collective: bring the mode to a cut first (no rank needs another after).
        self.quiesce(&mut r.params);
        if let Err(e) = stop_vote.close() {
            comm::abort_job(&format!("{e:#}"), 4);
        }
        Ok(ending)
    }

    /// One mini-batch step of this rank (with the mode's `before_step` and the emulated compute).
    fn step(&mut self, r: &mut Replica) {
        let cfg = self.cfg;
        self.last_step = Instant::now();
        let b = cfg.batch_size;
        let this_round = self.pos.round + 1;
        let bk = self.take_batch(r);
        self.trace_batch(&r.batch);
        self.mid_step = true;
        if let Err(e) = self.sync.before_step(&mut r.params, self.pos.round) {
            comm::abort_job(&format!("{e:#}"), 4);
        }
        let lr = self.schedule.at(self.schedule_step(), self.pos.epoch);
        // --balance: a smaller mini-batch takes a proportionally smaller step (the linear
        // scaling rule), so averaging the replicas weighs each rank's step by the examples it
        // saw, as Hop does, and a slowed rank's noisier gradient moves it less. A dealt epoch's
        // smaller mini-batches (train::elastic) are scaled the same way.
        let lr = lr * bk as f32 / b as f32;
        let t0 = Instant::now();
        let loss = if cfg.consensus_only || (r.batch.is_empty() && self.dealt.is_some()) {
            0.0
        } else {
            self.optimizer.step(self.model.as_ref(), &mut r.params, &self.shards.train, &r.batch, lr, &mut r.scratch)
        };
        let dt = t0.elapsed().as_secs_f64();
        self.clock.compute += dt;
        if !loss.is_finite() {
            comm::abort_job(
                &format!(
                    "training diverged at epoch {} step {} (mini-batch loss {loss}); try a smaller --lr (now {})",
                    self.pos.epoch, self.pos.global_step, cfg.lr
                ),
                3,
            );
        }
        // The rest of the declared step is the mode's idle time: the async coordinator serves
        // its workers in it instead of sleeping through their results (see SyncMode::idle).
        let sync = &mut self.sync;
        let mut idle = |d: Duration| {
            if let Err(e) = sync.idle(d) {
                comm::abort_job(&format!("{e:#}"), 4);
            }
        };
        self.step_pacer.after_step_idle(t0, dt, this_round, bk as f64 / b as f64, &mut idle);
        self.pos.step_in_epoch += 1;
        self.pos.global_step += 1;
        self.mid_step = false;
    }

    /// Puts this step's mini-batch into `r.batch`: the next of the pass over the shard, or of the
    /// rank's share of a dealt epoch (train::elastic). Returns the size its step is scaled to.
    fn take_batch(&mut self, r: &mut Replica) -> usize {
        let b = self.cfg.batch_size;
        if let Some(d) = &self.dealt {
            r.batch.clear();
            r.batch.extend_from_slice(&r.dealt_order[elastic::dealt_batch(r.dealt_order.len(), d.steps, self.pos.step_in_epoch)]);
            return r.batch.len();
        }
        let local_n = r.perm.len();
        // The step's place in the current pass over the shard (Replica::new_pass).
        let s = self.pos.step_in_epoch % r.steps_per_pass(b);
        // --balance: a slowed rank takes the first examples of its full mini-batch's share.
        let bk = if self.cfg.balance { self.step_pacer.balanced_batch(b, self.pos.round + 1) } else { b };
        // The last mini-batch of an epoch takes the examples left (fewer than b), as a data
        // loader without drop_last does. It used to wrap around to the epoch's first examples,
        // visiting them twice in the epoch and the rest once, and SAGA's last step of every
        // epoch jumped (8 ranks, Fashion-MNIST t10k lsq, batch 100, lr 0.01: objective 0.171 ->
        // 0.297). An independent NumPy SAGA gave 0.171 -> 0.295 with the wrap and 0.170 without
        // it; there the last step's estimate was 4.2 from the true gradient against 0.6 a step
        // before. A shard smaller than b also repeated examples inside one batch.
        r.batch.clear();
        let start = s * b;
        r.batch.extend_from_slice(&r.perm[start..(start + bk).min(local_n)]);
        bk
    }

    /// The example trace's record of a mini-batch ([`TRACE_ENV`]): its examples' global rows,
    /// each after its epoch.
    fn trace_batch(&mut self, batch: &[usize]) {
        let (Some(t), Some(ids)) = (self.trace.as_mut(), self.ids.as_ref()) else { return };
        let epoch = self.pos.epoch;
        let written = batch.iter().try_for_each(|&i| writeln!(t, "{epoch} {}", ids[i]));
        if let Err(e) = written {
            comm::abort_job(&format!("cannot write the example trace ({TRACE_ENV}): {e}"), 5);
        }
    }

    /// A line `# WHAT` in the example trace, written out at once with what came before: the
    /// checkpoints' marks (`# checkpoint ROUND`), by which a test of a killed run cuts the trace
    /// at the checkpoint its restart continued (tests/elastic_restart.rs).
    fn trace_mark(&mut self, what: &str) {
        let Some(t) = self.trace.as_mut() else { return };
        if let Err(e) = writeln!(t, "# {what}").and_then(|_| t.flush()) {
            comm::abort_job(&format!("cannot write the example trace ({TRACE_ENV}): {e}"), 5);
        }
    }

    /// The end of a round: the mode's sync, the evaluation and checkpoint cadences and the stop
    /// vote. Some when the loop ends here.
    fn end_of_round(
        &mut self,
        r: &mut Replica,
        epoch_rng: [u64; 4],
        stop_vote: &mut comm::preempt::StopVote,
    ) -> anyhow::Result<Option<Ending>> {
        let cfg = self.cfg;
        self.pos.round += 1;
        let rank = self.comm.rank() as usize;
        if self.fault_panic == Some((rank, self.pos.round)) {
            panic!("fault injection: --fault-panic {rank}:{}", self.pos.round);
        }
        if self.fault_kill == Some((rank, self.pos.round)) {
            kill_self_at(rank, self.pos.round);
        }
        if let Err(e) = self.optimizer.hand_over(self.sync.as_mut()).and_then(|_| self.sync.sync(&mut r.params, self.pos.round)) {
            comm::abort_job(&format!("{e:#}"), 4);
        }
        let epoch = self.epoch_fraction();
        self.progress.tick(self.pos.round, epoch);
        if cfg.eval_every > 0 && self.pos.round.is_multiple_of(cfg.eval_every as u64) {
            self.mark_evaluation(&mut r.params)?;
        }
        let patience = self.early_stop.as_ref().is_some_and(|e| e.exhausted()) && cfg.eval_every > 0;
        let last = Some(self.pos.round) == cfg.max_rounds || (cfg.stop_at_target && self.reached.is_some()) || patience;
        // A rank waiting for the vote keeps serving the mode (the async coordinator's workers).
        let sync = &mut self.sync;
        let stop = match stop_vote.stop_after_serving(self.pos.round, &mut || sync.idle(Duration::ZERO)) {
            Ok(s) => s,
            Err(e) => comm::abort_job(&format!("{e:#}"), 4),
        };
        if cfg.checkpoint_every > 0 && self.pos.round.is_multiple_of(cfg.checkpoint_every) || last || stop {
            self.checkpoint(&mut r.params, epoch_rng, r.rng.state())?;
        }
        if !(last || stop) {
            return Ok(None);
        }
        if stop && rank == 0 {
            eprintln!(
                "asap-train: stopping at round {} on SIGTERM/SIGUSR1{}",
                self.pos.round,
                if cfg.checkpoint_dir.is_some() {
                    "; checkpoint written, continue with --resume or --auto-resume"
                } else {
                    " (no --checkpoint-dir: the work so far is not kept)"
                }
            );
        }
        Ok(Some(Ending { stopped_early: true, preempted: stop, patience: patience && !stop }))
    }

    /// The finish (collective): the last checkpoint and evaluations, the mode's final model, its
    /// evaluation, the summary (metrics line, rank 0's print) and the saved model.
    fn finish(mut self, mut r: Replica, ending: Ending) -> anyhow::Result<Outcome> {
        let cfg = self.cfg;
        if !ending.stopped_early && cfg.checkpoint_every > 0 {
            self.checkpoint(&mut r.params, r.rng.state(), r.rng.state())?;
        }
        self.quiesce(&mut r.params);
        self.evaluate_pending()?;
        self.progress.finish();
        let train_seconds = self.train_seconds();
        let (own, final_model_seconds) = self.final_model(&mut r.params)?;
        let final_eval_start = Instant::now();
        let result = self.final_evaluation(&r.params, &own, train_seconds)?;
        let phases = self.phases(self.load_seconds, self.setup_seconds, train_seconds, final_eval_start.elapsed(), final_model_seconds);
        let final_eval = result.eval.clone();
        let summary = self.summary(result, train_seconds, phases, ending);
        let mut summary_json = summary.to_json()?;
        if !self.losses.is_empty() {
            summary_json["ranks_lost"] = json!(self.losses);
        }
        self.write_metrics(&summary_json);
        phases::mark_summary();
        let saved = self.print_and_save(&summary, &summary_json, &r.params, ending.preempted);
        // The model file is written by rank 0 alone; nobody leaves before it is done or failed.
        collectives::agree(self.comm, saved)?;
        Ok(Outcome {
            final_eval,
            rounds: self.pos.round,
            train_seconds,
            time_to_target: self.reached.map(|r| r.0),
            preempted: ending.preempted,
        })
    }

    /// The final model: what the mode defines (the average of the replicas, or the servers'
    /// model), into `params`; writes the send log. Returns this rank's own replica and the
    /// seconds it took.
    fn final_model(&mut self, params: &mut [f32]) -> anyhow::Result<(Vec<f32>, f64)> {
        let final_start = Instant::now();
        let own = params.to_vec();
        if let Err(e) = self.sync.finish(params) {
            comm::abort_job(&format!("{e:#}"), 4);
        }
        if let Some(prefix) = &self.cfg.send_log {
            let path = outputs::send_log_path(prefix, self.comm.rank() as usize);
            let mut text = String::from("seconds,bytes\n");
            self.sync.send_log().iter().for_each(|(t, b)| text.push_str(&format!("{t:.6},{b}\n")));
            collectives::agree(self.comm, std::fs::write(&path, text).with_context(|| format!("cannot write the send log {path}")))?;
            // The inbound link's log beside it, where the mode models the receiver's link.
            let received = self.sync.receive_log();
            let written = if received.is_empty() {
                Ok(())
            } else {
                let path = outputs::receive_log_path(prefix, self.comm.rank() as usize);
                let mut text = String::from("seconds,bytes\n");
                received.iter().for_each(|(t, b)| text.push_str(&format!("{t:.6},{b}\n")));
                std::fs::write(&path, text).with_context(|| format!("cannot write the receive log {path}"))
            };
            collectives::agree(self.comm, written)?;
            // The messages' times on the links, on the wall clock, where groups share WAN links.
            let written = match &self.group_link {
                Some(g) => {
                    let (path, wan) = outputs::link_log_paths(prefix, self.comm.rank() as usize);
                    std::fs::write(&path, g.log_csv())
                        .and_then(|_| std::fs::write(&wan, g.taken_csv()))
                        .with_context(|| format!("cannot write the link logs {path} and {wan}"))
                }
                None => Ok(()),
            };
            collectives::agree(self.comm, written)?;
        }
        Ok((own, final_start.elapsed().as_secs_f64()))
    }

    /// The final model, each rank's own model, the counters and the mode metrics, evaluated in
    /// one batch. A model with non-finite values is never saved or reported as a result (the
    /// mini-batch loss check cannot see a last step that overflowed).
    fn final_evaluation(&self, params: &[f32], own: &[f32], train_seconds: f64) -> anyhow::Result<eval::PointResult> {
        // Every rank holds the same final model.
        if let Some(i) = params.iter().position(|w| !w.is_finite()) {
            anyhow::bail!(
                "training diverged: the final model has a non-finite parameter ({} at index {i}); nothing was saved; try a smaller --lr (now {})",
                params[i],
                self.cfg.lr
            );
        }
        let local_counters = self.local_counters();
        let mode_metrics = self.sync.metrics();
        let point = eval::PointInput {
            replica: params,
            part: None,
            own: self.own_models_differ().then_some(own),
            counters: &local_counters,
            metrics: &mode_metrics,
            train_seconds,
        };
        let own_ranks = self.own_ranks();
        let r =
            eval::evaluate_batch(self.comm, self.model.as_ref(), vec![point], &self.shards.train, self.shards.test.as_ref(), &own_ranks)
                .pop()
                .expect("one result per point");
        if !r.eval.objective.is_finite() {
            anyhow::bail!(
                "training diverged: the final objective is {}; nothing was saved; try a smaller --lr (now {})",
                r.eval.objective,
                self.cfg.lr
            );
        }
        Ok(r)
    }

    /// The summary of the run, from the final evaluation `r`.
    fn summary(&self, r: eval::PointResult, train_seconds: f64, phases: phases::Phases, ending: Ending) -> summary::Summary {
        let cfg = self.cfg;
        let n = self.comm.size() as usize;
        // Rank 0's examples: k steps from an epoch's start are k / pass whole passes over the
        // shard, then min(n, the rest x b) examples (Replica::new_pass); full epochs, then the
        // current one's.
        let (n_local, b) = (self.shards.train.len(), cfg.batch_size);
        let pass = n_local.div_ceil(b);
        let examples = |k: usize| k / pass * n_local + n_local.min(k % pass * b);
        let (epochs, rest) = (self.pos.global_step as usize / self.steps_per_epoch, self.pos.global_step as usize % self.steps_per_epoch);
        let examples_per_rank = (epochs * examples(self.steps_per_epoch) + examples(rest)) as f64;
        let emulation = cfg.emulate_compute.map(|ms| {
            summary::EmulationSummary::new(
                ms,
                n,
                self.pos.round,
                &r.counters_mean,
                &r.counters_max,
                self.cpu_wall_start.elapsed().as_secs_f64().max(train_seconds),
                &r.metrics,
            )
            .with_jitter(cfg.emulate_jitter.as_ref(), &r.counters_mean, &r.counters_max)
        });
        summary::Summary {
            event: "summary",
            ranks: n,
            sync: self.sync.name(),
            epochs: self.epoch_fraction(),
            rounds: self.pos.round,
            stopped_early: ending.stopped_early,
            preempted: ending.preempted,
            load_seconds: self.load_seconds,
            train_seconds,
            wall_seconds: self.started.elapsed().as_secs_f64(),
            examples_per_second_per_rank: examples_per_rank / train_seconds.max(1e-9),
            objective: r.eval.objective,
            objective_definition: Some(self.model.objective_definition()).filter(|d| !d.is_empty()),
            metric: self.model.metric_kind(),
            final_metric: r.eval.metric,
            train_metric: r.eval.train_metric,
            held_out: self.shards.test.is_some(),
            per_rank_metric: r.own,
            per_rank_metric_ranks: self.own_ranks(),
            target: cfg.target,
            target_on: cfg.target_on,
            time_to_target: self.reached.map(|(train_seconds, round, epoch)| summary::TimeToTarget { train_seconds, round, epoch }),
            counters: summary::counters(&r.counters_mean, &r.counters_max),
            sync_metrics: r.metrics,
            phases,
            emulation,
            early_stopping: self.early_stop.as_ref().map(|e| e.summary(ending.patience)),
            last_evaluation: (self.last_eval_round > 0)
                .then_some(summary::LastEvaluation { round: self.last_eval_round, metric: self.last_eval.metric }),
            restarts: restart::to_json(&self.restarts),
        }
    }

    /// Rank 0 prints the summary and writes the final model (`--save-model`, not after a
    /// signal); what a saved model needs to predict on its own is gathered on every rank (the
    /// labels are a collective). The result is rank 0's, to be agreed on.
    fn print_and_save(
        &self,
        summary: &summary::Summary,
        summary_json: &serde_json::Value,
        params: &[f32],
        preempted: bool,
    ) -> anyhow::Result<()> {
        let cfg = self.cfg;
        let extras = cfg.save_model.as_ref().filter(|_| !preempted).map(|_| model_file::Extras {
            scaling: self.shards.scaling.clone(),
            class_labels: setup::output_labels(self.model.spec(), &self.shards.train, self.comm),
            label_threshold: cfg.label_threshold,
            zero_based: self.shards.zero_based,
        });
        if self.comm.rank() != 0 {
            return Ok(());
        }
        summary.print();
        if let Some(line) = restart::line(&self.restarts) {
            println!("{line}");
        }
        if let (Some(path), Some(extras)) = (cfg.save_model.as_ref(), &extras) {
            model_file::save(path, self.model.as_ref(), params, extras, &serde_json::to_string(cfg)?, &summary_json.to_string())
                .with_context(|| "cannot save the final model (--save-model)")?;
            eprintln!("asap-train: final model written to {path}");
        }
        Ok(())
    }
}

/// How far the objective may rise between two evaluations before rank 0 says so: 1.5x. SGD's
/// objective is noisy from one epoch to the next (the RCV1-shape SVM at 32 ranks moved 0.79 ->
/// 0.88 -> 0.80, +11 %: benches/defaults-sweep.md), while a step too large for the run's staleness
/// moved it 45 -> 169 -> 2.2 (ssp, issue 43): a jump of that kind said nothing until now.
const OBJECTIVE_JUMP: f64 = 1.5;

/// The warning for an objective that rose more than [`OBJECTIVE_JUMP`] times since the last
/// evaluation, or None.
fn objective_jump(before: f64, now: f64, epoch: f64, lr: f32, sync: &str) -> Option<String> {
    (before > 0.0 && before.is_finite() && now > OBJECTIVE_JUMP * before).then(|| {
        format!(
            "the objective rose from {before:.5} to {now:.5} (x{:.1}) by epoch {epoch:.2} under --sync {sync}: the step may be \
             too large for this run (a smaller --lr, now {lr}, or a smaller --staleness where the mode has one); \
             a run that recovers may still end well",
            now / before
        )
    })
}

/// The same value as `serde_json::to_value`, but with every `f32` written by its shortest
/// decimal form (1e-5, not 9.999999747378752e-6, which `to_value` gives by widening to f64).
fn json_value<T: serde::Serialize>(v: &T) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_str(&serde_json::to_string(v)?)?)
}
