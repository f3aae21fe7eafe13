//! `--sync async`: a coordinator and workers with a barrier predicate over the workers' status,
//! after the ASYNC engine (Soori et al., "ASYNC: a cloud engine with asynchrony and history for
//! distributed machine learning"): its ASYNCcoordinator, STAT table and ASYNCbarrier.
//!
//! - **Tasks.** Every rank is a worker. A task is one round (`--sync-every` local steps) started
//!   from the model the worker was last released with (its version: the number of results the
//!   coordinator had applied). At `sync` the worker sends the task's result (the update its steps
//!   made, sparse rows, with the task's clock and the model version) to the coordinator and is
//!   *available*; before its next step it waits for the coordinator to *release* it with the
//!   newest model (only the rows changed since its last release).
//! - **Coordinator.** Rank 0 also hosts the coordinator: it applies results as they arrive
//!   (`w += u / M` for M workers: the step of an asynchronous update is 1/M of the synchronous one,
//!   the paper's heuristic; under `bsp` the results of a round are applied together in worker
//!   order, which is model averaging, bit-reproducible), keeps the status table ([`StatusTable`]:
//!   clock, availability, task and wait times, staleness per worker) and, after every change,
//!   releases the available workers that the barrier predicate ([`Barrier`]) lets go.
//! - **History (SAGA).** With `--optimizer saga` a worker's steps leave out the mean of the stored
//!   gradients and send, with the result, the change their steps made to it (see
//!   `train::optimizer`); the coordinator keeps that mean A (one value per parameter) and adds
//!   `-(sum of the task's step sizes) * A / M` with each result. Under `bsp` every result of a
//!   round uses the same A (synchronous SAGA with an M-fold mini-batch); under an asynchronous
//!   predicate it is ASAGA. The per-example history stays on the worker that owns the example.
//! - **Staleness.** A result of clock c released when the slowest worker had completed c_min
//!   tasks has clock staleness c - c_min (the model lacked at most that many clocks of others'
//!   results; `ssp:S` keeps it <= S, and the coordinator refuses to apply one that is not) and
//!   update staleness = results applied between its release and its application (what the
//!   asynchronous SGD literature calls the delay).
//! - **Transport**: the SSP mode's two-sided [`Postbox`] and sparse row encoding. The coordinator
//!   serves whenever rank 0 is in the sync layer (before every step, in every wait, through
//!   its emulated step's idle time and its stop-vote waits: [`SyncMode::idle`]). Under `bsp`,
//!   `ssp:S` and `throttled:K` its own worker is kept within [`Barrier::lead`] clocks of the
//!   slowest worker; under `async` it runs ahead as the others do ([`Barrier::lead_bounds`]).

use std::fmt;
use std::time::{Duration, Instant};

use anyhow::bail;
use mpi::topology::Communicator;

use super::ps::clocks::{EvalSnapshots, WorkerClocks};
use super::codec::rows::{decode_rows, encode_rows};
use super::ps::serve::serve_until;
use super::{Aggregate, CommStats, HistoryDelta, ModeMetric, ModeState, SyncContext, SyncMode};
use crate::comm::backoff::Backoff;
use crate::comm::postbox::Postbox;

/// The rank hosting the coordinator.
const COORDINATOR: usize = 0;
/// Worker -> coordinator: a task's result (40 bytes or more), or that the worker sits at a
/// consistent cut (8 bytes: the round). One tag for both, since MPI keeps the order of one
/// sender's messages only within a tag, and a cut must not overtake the result before it.
const TAG_RESULT: i32 = 21;
/// Coordinator -> worker: a release with the newest model.
const TAG_RELEASE: i32 = 22;
/// How many clocks the coordinator's own worker may run ahead of the slowest worker under the
/// `throttled` and `async` predicates (see the module doc); the training loop votes on stopping
/// no more often than every `lead + 1` rounds.
const ASYNC_COORDINATOR_LEAD: u64 = 32;
/// How often the coordinator looks for results while its own worker's emulated step idles: a
/// result waits at most this (plus the OS's late wake-up, 50-100 us here) for its release.
const IDLE_POLL: Duration = Duration::from_micros(200);
/// Histogram buckets of clock staleness for predicates without a bound (the last counts more).
const UNBOUNDED_BUCKETS: u64 = 32;

/// A barrier predicate (`--barrier`): which available workers may start their next task, decided
/// from the status table alone. Adding one is a variant, a line in [`Barrier::parse`] and
/// [`fmt::Display`], and an arm in [`Barrier::release`] (docs/sync-modes.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Barrier {
    /// Bulk synchronous: release only when every worker is available (all results of the round
    /// are in), then everybody.
    Bsp,
    /// Stale synchronous: release worker m when its clock is at most S ahead of the slowest
    /// worker's (S = 0 is BSP; the paper's "max staleness < S+1").
    Ssp(u64),
    /// Throttled release (the paper's CCM1): release only when at least K workers are available,
    /// then all of them.
    Throttled(usize),
    /// Fully asynchronous (CCM2): every worker proceeds as soon as its result is in.
    Async,
}

impl Barrier {
    /// `bsp`, `ssp:S`, `throttled:K` or `async`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let hint = "expected bsp, ssp:S (S >= 0), throttled:K (K >= 1) or async";
        let number = |v: &str| v.trim().parse::<u64>().map_err(|_| format!("{hint}, got {s:?}"));
        match s.trim().split_once(':') {
            None if s.trim() == "bsp" => Ok(Barrier::Bsp),
            None if s.trim() == "async" => Ok(Barrier::Async),
            Some(("ssp", v)) => Ok(Barrier::Ssp(number(v)?)),
            Some(("throttled", v)) => match number(v)? {
                0 => Err(format!("{hint}: throttled:0 would release tasks with no worker available")),
                k => Ok(Barrier::Throttled(k as usize)),
            },
            _ => Err(format!("{hint}, got {s:?}")),
        }
    }

    /// The available workers that may start a task now.
    pub fn release(&self, stat: &StatusTable) -> Vec<usize> {
        let available = stat.available();
        match *self {
            Barrier::Bsp if available.len() == stat.len() => available,
            Barrier::Bsp => Vec::new(),
            Barrier::Ssp(s) => available.into_iter().filter(|&m| stat.lead_over_slowest(m) <= s).collect(),
            Barrier::Throttled(k) if available.len() >= k => available,
            Barrier::Throttled(_) => Vec::new(),
            Barrier::Async => available,
        }
    }

    /// Clocks the coordinator's own worker (under `throttled` every worker) may be ahead of the
    /// slowest worker.
    pub fn lead(&self) -> u64 {
        match *self {
            Barrier::Bsp => 0,
            Barrier::Ssp(s) => s,
            Barrier::Throttled(_) | Barrier::Async => ASYNC_COORDINATOR_LEAD,
        }
    }

    /// Whether worker `m` is kept within [`Barrier::lead`] clocks of the slowest. Under
    /// `throttled` every worker: a worker waiting in a stop vote (which every rank joins every
    /// `lead + 1` rounds) is idle but not available, and with unbounded drift the workers a
    /// throttled release needs could all sit in a vote that waits for the worker the release
    /// would let go. Under `async` no one: the coordinator serves while it waits in a stop vote
    /// (`SyncMode::idle`), so its own worker may run ahead as the others do. Bounded, rank 0's
    /// worker fell to the straggler's pace: with one straggler at half speed on 8 ranks, 7 of
    /// the 7.5 tasks per step time an unbounded ASGD gets. Under `ssp:S` the predicate bounds everyone anyway.
    pub fn lead_bounds(&self, m: usize) -> bool {
        match self {
            Barrier::Throttled(_) => true,
            Barrier::Async => false,
            Barrier::Bsp | Barrier::Ssp(_) => m == COORDINATOR,
        }
    }

    /// Largest clock staleness the predicate allows (None: unbounded).
    pub fn bound(&self) -> Option<u64> {
        match *self {
            Barrier::Bsp => Some(0),
            Barrier::Ssp(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Barrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Barrier::Bsp => write!(f, "bsp"),
            Barrier::Ssp(s) => write!(f, "ssp:{s}"),
            Barrier::Throttled(k) => write!(f, "throttled:{k}"),
            Barrier::Async => write!(f, "async"),
        }
    }
}

impl TryFrom<String> for Barrier {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Barrier::parse(&s)
    }
}

impl From<Barrier> for String {
    fn from(b: Barrier) -> String {
        b.to_string()
    }
}

/// How workers step (`--optimizer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// Mini-batch SGD (ASGD under an asynchronous predicate).
    Sgd,
    /// SAGA: one stored scalar per example recovers its last gradient (linear models: lsq,
    /// logreg, svm); ASAGA under an asynchronous predicate.
    Saga,
}

/// Options of `--sync async`.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "ASYNC (--sync async)")]
pub struct AsyncOptions {
    /// Barrier predicate over the workers' status: bsp (release when every worker's result is
    /// in), ssp:S (a worker may be at most S clocks ahead of the slowest), throttled:K (release
    /// only when at least K workers are available, then all of them), async (every worker
    /// proceeds as soon as its result is in).
    #[arg(long, value_name = "PREDICATE", default_value = "async", value_parser = Barrier::parse)]
    pub barrier: Barrier,
    /// Optimizer of --sync async: sgd, or saga (history of one scalar per example, linear models
    /// lsq/logreg/svm only; use a constant --lr-schedule).
    #[arg(long, value_enum, default_value_t = OptimizerKind::Sgd)]
    pub optimizer: OptimizerKind,
}

impl Default for AsyncOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// One worker's row of the status table (the paper's STAT).
#[derive(Clone, Debug)]
pub struct WorkerStatus {
    /// Its result is in and it waits for a release (or it sits at a cut).
    pub available: bool,
    /// It sits at a consistent cut: counted as available, released only when every worker is
    /// at the cut with every result up to it applied.
    pub at_cut: bool,
    /// When it was last released / its last result arrived.
    released_at: Instant,
    returned_at: Instant,
    /// The coordinator's version and slowest clock when it was last released.
    release_version: u64,
    release_cmin: u64,
    /// Sums for the mean task time (release -> result) and wait time (result -> release).
    task_seconds: f64,
    tasks_timed: u64,
    wait_seconds: f64,
    waits_timed: u64,
}

impl WorkerStatus {
    fn new(now: Instant) -> Self {
        WorkerStatus {
            available: false,
            at_cut: false,
            released_at: now,
            returned_at: now,
            release_version: 0,
            release_cmin: 0,
            task_seconds: 0.0,
            tasks_timed: 0,
            wait_seconds: 0.0,
            waits_timed: 0,
        }
    }

    /// Mean seconds of a task (release to result).
    pub fn mean_task_seconds(&self) -> f64 {
        self.task_seconds / self.tasks_timed.max(1) as f64
    }
}

/// The coordinator's status table: one row per worker, and the clocks column (results of each
/// worker applied = the clock of its next task), kept as every parameter server keeps it.
#[derive(Clone, Debug)]
pub struct StatusTable {
    pub workers: Vec<WorkerStatus>,
    pub clocks: WorkerClocks,
}

impl StatusTable {
    fn new(n: usize, now: Instant) -> Self {
        StatusTable { workers: (0..n).map(|_| WorkerStatus::new(now)).collect(), clocks: WorkerClocks::new(n) }
    }
    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }
    /// True with no workers.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
    /// Workers whose result is in and who wait for a release.
    pub fn available(&self) -> Vec<usize> {
        (0..self.len()).filter(|&m| self.workers[m].available).collect()
    }
    /// The slowest worker's clock.
    pub fn min_clock(&self) -> u64 {
        self.clocks.min()
    }
    /// The fastest worker's clock.
    pub fn max_clock(&self) -> u64 {
        self.clocks.max()
    }
    /// How many clocks worker `m` is ahead of the slowest.
    pub fn lead_over_slowest(&self, m: usize) -> u64 {
        self.clocks.lead_over_slowest(m)
    }
    /// Workers whose task is out (released, no result yet), with the seconds since release.
    fn busy(&self, now: Instant) -> Vec<(usize, f64)> {
        (0..self.len()).filter(|&m| !self.workers[m].available).map(|m| (m, (now - self.workers[m].released_at).as_secs_f64())).collect()
    }
}

/// A task's result as the coordinator receives it.
struct TaskResult {
    worker: usize,
    clock: u64,
    step_sum: f32,
    rows: Vec<u32>,
    values: Vec<f32>,
    history: Option<(Vec<u32>, Vec<f32>)>,
}

/// The coordinator: the model, the status table and what the metrics report of it.
struct Coordinator {
    model: Vec<f32>,
    offsets: Vec<usize>,
    /// Per row: `version` when it last changed; per worker: `version` at its last release.
    stamp: Vec<u64>,
    seen: Vec<u64>,
    /// Results applied so far (the model's version).
    version: u64,
    /// SAGA: the mean over all examples of their stored gradients.
    history: Option<Vec<f32>>,
    stat: StatusTable,
    barrier: Barrier,
    /// Results of a `bsp` round waiting for the rest of the round.
    queued: Vec<TaskResult>,
    /// The round of the cut workers are gathering at.
    cut_round: u64,
    /// Evaluation snapshots: round -> the model once every worker's results up to it are applied.
    snapshots: EvalSnapshots,
    staleness_histogram: Vec<u64>,
    update_staleness_sum: u64,
    update_staleness_max: u64,
    releases: u64,
    released_workers: u64,
    min_available_at_release: Option<usize>,
}

impl Coordinator {
    fn workers(&self) -> usize {
        self.stat.len()
    }

    /// Takes a result in: the worker is available; under `bsp` the result waits for its round.
    fn receive(&mut self, r: TaskResult) -> anyhow::Result<()> {
        let now = Instant::now();
        let expected = self.stat.clocks.of(r.worker);
        let w = &mut self.stat.workers[r.worker];
        if w.available || r.clock != expected {
            bail!(
                "async protocol error: rank {} sent the result of clock {} while the coordinator expected clock {}{}",
                r.worker,
                r.clock,
                expected,
                if w.available { " after its release" } else { "" }
            );
        }
        w.available = true;
        w.returned_at = now;
        w.task_seconds += (now - w.released_at).as_secs_f64();
        w.tasks_timed += 1;
        if self.barrier == Barrier::Bsp {
            self.queued.push(r);
            if self.queued.len() == self.workers() {
                let mut round = std::mem::take(&mut self.queued);
                round.sort_by_key(|r| r.worker);
                self.apply(round)?;
            }
            Ok(())
        } else {
            self.apply(vec![r])
        }
    }

    /// Applies results: the updates first (each with the history term of the current A), then
    /// the changes of A, then the clocks.
    fn apply(&mut self, results: Vec<TaskResult>) -> anyhow::Result<()> {
        let scale = 1.0 / self.workers() as f32;
        for r in &results {
            let w = &self.stat.workers[r.worker];
            let clock_staleness = r.clock - w.release_cmin;
            if let Some(bound) = self.barrier.bound() {
                if clock_staleness > bound {
                    bail!(
                        "barrier {} violated: rank {}'s result of clock {} was computed without the results of clock {} (staleness {clock_staleness})",
                        self.barrier,
                        r.worker,
                        r.clock,
                        w.release_cmin
                    );
                }
            }
            let last = self.staleness_histogram.len() - 1;
            self.staleness_histogram[(clock_staleness as usize).min(last)] += 1;
            let delay = self.version - w.release_version;
            self.update_staleness_sum += delay;
            self.update_staleness_max = self.update_staleness_max.max(delay);
            self.version += 1;
            let mut at = 0;
            for &row in &r.rows {
                let range = self.offsets[row as usize]..self.offsets[row as usize + 1];
                let n = range.len();
                self.model[range].iter_mut().zip(&r.values[at..at + n]).for_each(|(w, u)| *w += u * scale);
                self.stamp[row as usize] = self.version;
                at += n;
            }
            if let (Some(a), true) = (&self.history, r.step_sum != 0.0) {
                let c = r.step_sum * scale;
                self.model.iter_mut().zip(a).for_each(|(w, a)| *w -= c * a);
                self.stamp.iter_mut().for_each(|s| *s = self.version);
            }
        }
        for r in &results {
            if let (Some(a), Some((rows, values))) = (self.history.as_mut(), &r.history) {
                let mut at = 0;
                for &row in rows {
                    let range = self.offsets[row as usize]..self.offsets[row as usize + 1];
                    let n = range.len();
                    a[range].iter_mut().zip(&values[at..at + n]).for_each(|(a, d)| *a += d);
                    at += n;
                }
            }
            if self.stat.clocks.complete(r.worker) {
                self.snapshots.release(self.stat.clocks.min(), &self.model);
            }
        }
        Ok(())
    }

    /// Worker `m` sits at the cut after `round`: it is idle, so the predicates count it as
    /// available (a worker waiting at a checkpoint must not hold others' releases back), but it
    /// is released only when the cut is complete.
    fn cut(&mut self, m: usize, round: u64) {
        let w = &mut self.stat.workers[m];
        if !w.available {
            w.available = true;
            w.returned_at = Instant::now();
        }
        w.at_cut = true;
        self.cut_round = round;
    }

    /// The releases the predicate allows now: (worker, message with the newest rows).
    fn releases(&mut self) -> Vec<(usize, Vec<u8>)> {
        let cmin = self.stat.min_clock();
        let lead = self.barrier.lead();
        let available = self.stat.available().len();
        let cut_done = self.stat.workers.iter().all(|w| w.at_cut) && cmin >= self.cut_round;
        let go: Vec<usize> = if cut_done {
            (0..self.workers()).collect()
        } else {
            self.barrier
                .release(&self.stat)
                .into_iter()
                .filter(|&m| !self.stat.workers[m].at_cut && (!self.barrier.lead_bounds(m) || self.stat.clocks.lead_over_slowest(m) <= lead))
                .collect()
        };
        if go.is_empty() {
            return Vec::new();
        }
        self.releases += 1;
        self.released_workers += go.len() as u64;
        self.min_available_at_release = Some(self.min_available_at_release.map_or(available, |a| a.min(available)));
        let now = Instant::now();
        go.into_iter()
            .map(|m| {
                let w = &mut self.stat.workers[m];
                w.available = false;
                w.at_cut = false;
                w.wait_seconds += (now - w.returned_at).as_secs_f64();
                w.waits_timed += 1;
                w.released_at = now;
                w.release_version = self.version;
                w.release_cmin = cmin;
                let news: Vec<u32> = (0..self.stamp.len()).filter(|&r| self.stamp[r] > self.seen[m]).map(|r| r as u32).collect();
                self.seen[m] = self.version;
                let mut msg = Vec::with_capacity(16 + 8 + 4 * news.len() + 4 * self.model.len());
                msg.extend_from_slice(&self.version.to_le_bytes());
                msg.extend_from_slice(&cmin.to_le_bytes());
                msg.extend_from_slice(&(cut_done as u64).to_le_bytes());
                encode_rows(&mut msg, &self.offsets, &news, None, &self.model, false);
                (m, msg)
            })
            .collect()
    }

    /// Says who holds a release back, for timeout messages.
    fn holdup(&self) -> String {
        let now = Instant::now();
        let mut busy = self.stat.busy(now);
        busy.sort_by(|a, b| b.1.total_cmp(&a.1));
        let busy: Vec<String> = busy.iter().map(|(m, s)| format!("rank {m} for {s:.1} s")).collect();
        let at_cut: Vec<usize> = (0..self.workers()).filter(|&m| self.stat.workers[m].at_cut).collect();
        format!(
            "barrier {} holds the release back; workers whose task is out (longest first): [{}]; clocks per worker {:?}, available {:?}, at the cut of round {} {:?}",
            self.barrier,
            busy.join(", "),
            self.stat.clocks.all(),
            self.stat.available(),
            self.cut_round,
            at_cut
        )
    }
}

/// `--sync async`. Collective: every rank builds it and runs the same rounds.
pub struct CoordinatedAsync {
    post: Postbox,
    rank: usize,
    barrier: Barrier,
    wait_timeout: Duration,
    stop_sending_after: Option<(usize, u64)>,
    offsets: Vec<usize>,
    coordinator: Option<Coordinator>,
    /// The replica at its last release (the task's update is `params - base`).
    base: Vec<f32>,
    base_version: u64,
    /// The result is out and the release not yet taken into the replica.
    awaiting: bool,
    /// Releases received and not yet taken: (version, after a cut, rows, their values).
    releases: Vec<(u64, bool, Vec<u32>, Vec<f32>)>,
    /// SAGA: what the optimizer handed over for the current task.
    history: Option<(Vec<f32>, f32)>,
    saga: bool,
    last_round: u64,
    stats: CommStats,
    blocked_tasks: u64,
    /// Releases the coordinator sent while its own worker's emulated step idled ([`SyncMode::idle`]).
    idle_releases: u64,
}

impl CoordinatedAsync {
    /// Collective set-up from the common initial model `init`.
    pub fn new(ctx: &SyncContext, opts: &AsyncOptions, init: &[f32]) -> anyhow::Result<Self> {
        let n = ctx.comm.size() as usize;
        let rank = ctx.comm.rank() as usize;
        if let Barrier::Throttled(k) = opts.barrier {
            anyhow::ensure!(k <= n, "--barrier throttled:{k} needs K <= the number of workers ({n} ranks)");
        }
        let offsets = ctx.layout.offsets.clone();
        let saga = opts.optimizer == OptimizerKind::Saga;
        let buckets = opts.barrier.bound().map_or(UNBOUNDED_BUCKETS, |b| b + 1) as usize + 1;
        let coordinator = (rank == COORDINATOR).then(|| Coordinator {
            model: init.to_vec(),
            stamp: vec![0; offsets.len() - 1],
            seen: vec![0; n],
            offsets: offsets.clone(),
            version: 0,
            history: saga.then(|| vec![0.0; init.len()]),
            stat: StatusTable::new(n, Instant::now()),
            barrier: opts.barrier,
            queued: Vec::new(),
            cut_round: 0,
            snapshots: EvalSnapshots::default(),
            staleness_histogram: vec![0; buckets],
            update_staleness_sum: 0,
            update_staleness_max: 0,
            // Every worker starts at once with the initial model: one release of all.
            releases: 1,
            released_workers: n as u64,
            min_available_at_release: Some(n),
        });
        Ok(CoordinatedAsync {
            // --emulate-bandwidth paces this mode's messages like every other mode's.
            post: Postbox::new(ctx.comm).with_pacer(ctx.pacer(None)).with_ingress(ctx.ingress()),
            rank,
            barrier: opts.barrier,
            wait_timeout: ctx.wait_timeout,
            stop_sending_after: ctx.stop_sending_after,
            offsets,
            coordinator,
            base: init.to_vec(),
            base_version: 0,
            awaiting: false,
            releases: Vec::new(),
            history: None,
            saga,
            last_round: 0,
            stats: CommStats::default(),
            blocked_tasks: 0,
            idle_releases: 0,
        })
    }

    fn sending(&self, round: u64) -> bool {
        !matches!(self.stop_sending_after, Some((r, last)) if r == self.rank && round > last)
    }

    /// Takes every waiting message: results (coordinator) are applied and the releases the
    /// predicate allows are sent; a release for this worker is kept.
    fn serve(&mut self) -> anyhow::Result<()> {
        let t = Instant::now();
        let mut changed = false;
        while let Some((src, bytes)) = self.post.try_receive(TAG_RESULT) {
            let c = self.coordinator.as_mut().ok_or_else(|| anyhow::anyhow!("rank {src} sent a result to rank {}, which is no coordinator", self.rank))?;
            if bytes.len() == 8 {
                c.cut(src, u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")));
            } else {
                c.receive(decode_result(src, &bytes, &c.offsets)?)?;
            }
            changed = true;
        }
        if changed {
            let c = self.coordinator.as_mut().expect("received above");
            for (m, msg) in c.releases() {
                self.post.send(m, TAG_RELEASE, msg)?;
            }
            self.stats.comm_seconds += t.elapsed().as_secs_f64();
        }
        while let Some((_, bytes)) = self.post.try_receive(TAG_RELEASE) {
            let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
            anyhow::ensure!(bytes.len() >= 32, "async protocol error: a release of {} bytes", bytes.len());
            let b = decode_rows(&bytes, 24, &self.offsets, false, false)?;
            self.releases.push((word(0), word(16) != 0, b.rows, b.values));
        }
        self.post.progress_sends()?;
        self.stats.bytes_sent = self.post.bytes_sent();
        self.stats.bytes_received = self.post.bytes_received();
        Ok(())
    }

    /// Serves until `done(self)`, counting the time as waiting. The coordinator is judged after
    /// `--wait-timeout`, saying which workers hold the release back; other workers after 1.5 x
    /// `--wait-timeout`, so that the coordinator's message (which says what it lacks) usually
    /// comes first. Either names as holding it up only ranks without a sign of life
    /// ([`serve_until`]): a worker that waits for its release cannot tell a stopped
    /// coordinator from one that waits for a stopped worker.
    fn wait_until(&mut self, what: &str, done: impl Fn(&Self) -> bool) -> anyhow::Result<()> {
        let limit = if self.coordinator.is_some() { self.wait_timeout } else { self.wait_timeout.mul_f64(1.5) };
        // Yield briefly (the answer is usually one step of another rank away), then sleep: with
        // more ranks than cores a waiting rank must leave the CPU to the ones it waits for.
        let backoff = Backoff::with_yield_window(Duration::from_millis(2));
        let waited = serve_until(self, limit, backoff, Self::serve, done, |s, waited, why| {
            let lacks = match &s.coordinator {
                Some(c) => format!(" (--wait-timeout) for {what}; {}", c.holdup()),
                None => format!(" (1.5 x --wait-timeout) for {what}"),
            };
            anyhow::anyhow!("rank {}: waited {:.1} s{lacks}: {why}", s.rank, waited.as_secs_f64())
        })?;
        self.stats.wait_seconds += waited.as_secs_f64();
        Ok(())
    }

    /// Puts the releases received into the replica, in order (a worker idle at a cut may get a
    /// second one; each carries the rows changed since the one before).
    fn apply_releases(&mut self, params: &mut [f32]) {
        for (version, _, rows, values) in std::mem::take(&mut self.releases) {
            let mut at = 0;
            for &r in &rows {
                let range = self.offsets[r as usize]..self.offsets[r as usize + 1];
                let n = range.len();
                self.base[range.clone()].copy_from_slice(&values[at..at + n]);
                at += n;
            }
            self.base_version = version;
        }
        // Rows not in a release are unchanged at the coordinator since the last release, and
        // the worker's own changes were all in its result: the replica is the released model.
        params.copy_from_slice(&self.base);
        self.awaiting = false;
    }

    /// Waits for this worker's release (if its result is out) and puts the model into `params`.
    fn take_release(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        if !self.awaiting {
            return Ok(());
        }
        if self.releases.is_empty() {
            self.blocked_tasks += 1;
            self.wait_until(&format!("its release from the coordinator (rank {COORDINATOR})"), |s| !s.releases.is_empty())?;
        }
        self.apply_releases(params);
        Ok(())
    }

    /// A consistent cut after `clock` rounds: this worker tells the coordinator it sits at the
    /// cut and waits for the release that comes once every worker does and every result up to
    /// the cut is applied; then every message of this rank is delivered.
    fn drain(&mut self, params: &mut [f32], clock: u64) -> anyhow::Result<()> {
        if self.sending(clock) {
            self.post.send(COORDINATOR, TAG_RESULT, clock.to_le_bytes().to_vec())?;
        }
        self.awaiting = true;
        self.wait_until(&format!("the release of the cut after round {clock} from the coordinator (rank {COORDINATOR})"), |s| {
            s.releases.iter().any(|r| r.1)
        })?;
        self.apply_releases(params);
        let start = Instant::now();
        self.post.flush_sends(self.wait_timeout, |_| Ok(()))?;
        self.stats.wait_seconds += start.elapsed().as_secs_f64();
        Ok(())
    }
}

/// Reads a result: `[clock u64][version u64][step sum f32][0 u32][update bytes u64]`, the
/// update's rows, then (SAGA) the history change's rows.
fn decode_result(worker: usize, bytes: &[u8], offsets: &[usize]) -> anyhow::Result<TaskResult> {
    anyhow::ensure!(bytes.len() >= 40, "async protocol error: a result of {} bytes from rank {worker}", bytes.len());
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let step_sum = f32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let len = word(24) as usize;
    anyhow::ensure!(32 + len <= bytes.len(), "async protocol error: a result of {} bytes from rank {worker} announces {len}", bytes.len());
    let update = decode_rows(&bytes[32..32 + len], 0, offsets, false, false)?;
    let history = if bytes.len() > 32 + len {
        let h = decode_rows(&bytes[32 + len..], 0, offsets, false, false)?;
        Some((h.rows, h.values))
    } else {
        None
    };
    Ok(TaskResult { worker, clock: word(0), step_sum, rows: update.rows, values: update.values, history })
}

/// Rows of `v` with a non-zero value.
fn nonzero_rows(offsets: &[usize], v: &[f32]) -> Vec<u32> {
    (0..offsets.len() - 1).filter(|&r| v[offsets[r]..offsets[r + 1]].iter().any(|&x| x != 0.0)).map(|r| r as u32).collect()
}

impl SyncMode for CoordinatedAsync {
    fn name(&self) -> &'static str {
        "async"
    }

    fn lockstep(&self) -> bool {
        self.barrier == Barrier::Bsp
    }

    fn round_lead(&self) -> u64 {
        self.barrier.lead() + 1
    }

    fn before_step(&mut self, params: &mut [f32], _clock: u64) -> anyhow::Result<()> {
        if self.coordinator.is_some() {
            self.serve()?;
        }
        self.take_release(params)
    }

    /// The coordinator serves through its own worker's emulated step, as the paper's separate
    /// server would: sleeping through it held every result until rank 0's next step boundary.
    /// Measured before (8 ranks, 5.6 ms steps, `--straggler delay:100`, `--barrier async`): the
    /// fast workers' tasks took 10.9-11.7 ms release to result, two steps, so they ran at the
    /// straggler's pace.
    fn idle(&mut self, d: Duration) -> anyhow::Result<()> {
        let Some(before) = self.coordinator.as_ref().map(|c| c.releases) else {
            std::thread::sleep(d);
            return Ok(());
        };
        let until = Instant::now() + d;
        loop {
            self.serve()?;
            let now = Instant::now();
            if now >= until {
                break;
            }
            std::thread::sleep((until - now).min(IDLE_POLL));
        }
        self.idle_releases += self.coordinator.as_ref().map_or(0, |c| c.releases - before);
        Ok(())
    }

    fn history(&mut self, h: HistoryDelta<'_>) -> anyhow::Result<()> {
        anyhow::ensure!(self.saga, "--sync async was built for --optimizer sgd but got a SAGA history");
        self.history = Some((h.mean_change.to_vec(), h.step_sum));
        Ok(())
    }

    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let t = Instant::now();
        if self.sending(round) {
            let update: Vec<f32> = params.iter().zip(&self.base).map(|(p, b)| p - b).collect();
            let rows = nonzero_rows(&self.offsets, &update);
            let (history, step_sum) = match self.history.take() {
                Some((h, s)) => (Some(h), s),
                None => (None, 0.0),
            };
            anyhow::ensure!(history.is_some() == self.saga, "--optimizer saga: no history was handed over for round {round}");
            let mut block = Vec::new();
            encode_rows(&mut block, &self.offsets, &rows, None, &update, false);
            let mut msg = Vec::with_capacity(32 + 2 * block.len());
            msg.extend_from_slice(&(round - 1).to_le_bytes());
            msg.extend_from_slice(&self.base_version.to_le_bytes());
            msg.extend_from_slice(&step_sum.to_le_bytes());
            msg.extend_from_slice(&0u32.to_le_bytes());
            msg.extend_from_slice(&(block.len() as u64).to_le_bytes());
            msg.extend_from_slice(&block);
            if let Some(h) = history {
                encode_rows(&mut msg, &self.offsets, &nonzero_rows(&self.offsets, &h), None, &h, false);
            }
            self.post.send(COORDINATOR, TAG_RESULT, msg)?;
        }
        self.awaiting = true;
        self.stats.comm_seconds += t.elapsed().as_secs_f64();
        self.serve()?;
        self.last_round = round;
        self.stats.rounds += 1;
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        let clock = self.last_round;
        self.drain(params, clock)?;
        // The final model is the coordinator's, sent to every rank like SSP's shards.
        let coordinator = &self.coordinator;
        super::assemble_parts(self.post.comm(), params, &mut self.stats, |p| {
            if let Some(c) = coordinator {
                p.copy_from_slice(&c.model);
            }
        });
        Ok(())
    }

    fn mark_evaluation(&mut self, round: u64) {
        if let Some(c) = self.coordinator.as_mut() {
            c.snapshots.mark(round, c.stat.min_clock(), &c.model);
        }
    }

    fn evaluated_model(&mut self, round: u64) -> anyhow::Result<Option<Vec<f32>>> {
        let mut part = vec![0f32; self.base.len()];
        if self.coordinator.is_some() {
            self.wait_until(&format!("every worker's results up to clock {} (evaluation)", round.saturating_sub(1)), |s| {
                s.coordinator.as_ref().is_some_and(|c| c.snapshots.ready(round))
            })?;
            let c = self.coordinator.as_mut().expect("checked");
            part = c.snapshots.take(round).expect("waited for it");
        } else {
            // The evaluation that follows is a collective, and under --emulate-bandwidth this
            // worker's result may still sit in its send queue (held until the emulated link has
            // carried it): the coordinator waits for it above, so deliver it first. Without this
            // `--barrier bsp --eval-every N` with emulated links hung at the first evaluation.
            let start = Instant::now();
            self.post.flush_sends(self.wait_timeout, |_| Ok(()))?;
            self.stats.wait_seconds += start.elapsed().as_secs_f64();
        }
        Ok(Some(part))
    }

    fn quiesce(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        self.drain(params, round)
    }

    fn save_state(&self) -> ModeState {
        let mut st: ModeState = vec![
            ("awaiting".into(), vec![self.awaiting as u8 as f64]),
            ("base".into(), self.base.iter().map(|&x| x as f64).collect()),
            ("base_version".into(), vec![self.base_version as f64]),
        ];
        if let Some(c) = &self.coordinator {
            st.push(("model".into(), c.model.iter().map(|&x| x as f64).collect()));
            st.push(("stamp".into(), c.stamp.iter().map(|&x| x as f64).collect()));
            st.push(("seen".into(), c.seen.iter().map(|&x| x as f64).collect()));
            st.push(("version".into(), vec![c.version as f64]));
            st.push(("clock".into(), c.stat.clocks.all().iter().map(|&c| c as f64).collect()));
            st.push(("release_version".into(), c.stat.workers.iter().map(|w| w.release_version as f64).collect()));
            st.push(("release_cmin".into(), c.stat.workers.iter().map(|w| w.release_cmin as f64).collect()));
            if let Some(a) = &c.history {
                st.push(("history_mean".into(), a.iter().map(|&x| x as f64).collect()));
            }
        }
        st
    }

    /// At a checkpoint's cut every worker has been released with the coordinator's newest model
    /// at one clock: the coordinator's model, stamps, version and history, and the workers'
    /// uniform clocks, release versions and bases carry over to another worker count; `seen` starts
    /// afresh (the first release then sends every row changed since the start).
    fn averaged_on_resize(&self, name: &str) -> bool {
        name != "seen" && name != "awaiting"
    }

    fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        let get = |name: &str| -> anyhow::Result<&Vec<f64>> {
            state.iter().find(|(k, _)| k == name).map(|(_, v)| v).ok_or_else(|| anyhow::anyhow!("the checkpoint lacks async state {name:?}"))
        };
        anyhow::ensure!(get("awaiting")?.iter().all(|&a| a == 0.0), "the checkpoint was taken with a task's release in flight");
        let base = get("base")?;
        anyhow::ensure!(base.len() == self.base.len(), "the checkpoint's model has {} values, this run's {}", base.len(), self.base.len());
        self.base = base.iter().map(|&x| x as f32).collect();
        self.base_version = get("base_version")?.first().map_or(0, |&v| v as u64);
        let saga = self.saga;
        if let Some(c) = self.coordinator.as_mut() {
            let n = c.workers();
            c.model = get("model")?.iter().map(|&x| x as f32).collect();
            c.stamp = get("stamp")?.iter().map(|&x| x as u64).collect();
            c.seen = get("seen")?.iter().map(|&x| x as u64).collect();
            c.version = get("version")?.first().map_or(0, |&v| v as u64);
            let clocks = get("clock")?;
            let versions = get("release_version")?;
            let cmins = get("release_cmin")?;
            anyhow::ensure!(
                clocks.len() == n && versions.len() == n && cmins.len() == n && c.seen.len() == n,
                "the checkpoint's status table has {} workers, this run {n}",
                clocks.len()
            );
            anyhow::ensure!(c.model.len() == self.base.len() && c.stamp.len() == c.offsets.len() - 1, "the checkpoint's coordinator model does not match this model");
            c.stat.clocks = WorkerClocks::from_clocks(clocks.iter().map(|&x| x as u64).collect());
            for (m, w) in c.stat.workers.iter_mut().enumerate() {
                w.release_version = versions[m] as u64;
                w.release_cmin = cmins[m] as u64;
                w.available = false;
            }
            if saga {
                let a: Vec<f32> = get("history_mean")?.iter().map(|&x| x as f32).collect();
                anyhow::ensure!(a.len() == c.model.len(), "the checkpoint's SAGA history does not match this model");
                c.history = Some(a);
            }
        }
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.stats
    }

    fn send_log(&self) -> Vec<(f64, u64)> {
        self.post.pacer().map_or(Vec::new(), |p| p.log().to_vec())
    }

    fn receive_log(&self) -> Vec<(f64, u64)> {
        self.post.ingress().map_or(Vec::new(), |i| i.log().to_vec())
    }

    fn metrics(&self) -> Vec<ModeMetric> {
        let mut out = vec![
            ModeMetric::number("blocked_tasks", Aggregate::Sum, self.blocked_tasks as f64),
            ModeMetric::number("idle_releases", Aggregate::Sum, self.idle_releases as f64),
        ];
        // The status table lives on the coordinator; other ranks report zeros, so sums and
        // maxima over ranks are the coordinator's values.
        let n = self.post.size();
        let zeros = |len: usize| vec![0.0; len];
        let (tasks, task_s, wait_s, behind, available) = match &self.coordinator {
            Some(c) => {
                let max = c.stat.max_clock();
                let w = &c.stat.workers;
                let clocks = c.stat.clocks.all();
                (
                    clocks.iter().map(|&c| c as f64).collect(),
                    w.iter().map(|w| w.mean_task_seconds()).collect(),
                    w.iter().map(|w| w.wait_seconds / w.waits_timed.max(1) as f64).collect(),
                    clocks.iter().map(|&c| (max - c) as f64).collect(),
                    w.iter().map(|w| w.available as u8 as f64).collect(),
                )
            }
            None => (zeros(n), zeros(n), zeros(n), zeros(n), zeros(n)),
        };
        out.push(ModeMetric::array("worker_tasks", Aggregate::Sum, tasks));
        out.push(ModeMetric::array("worker_mean_task_seconds", Aggregate::Sum, task_s));
        out.push(ModeMetric::array("worker_mean_wait_seconds", Aggregate::Sum, wait_s));
        out.push(ModeMetric::array("worker_clocks_behind_fastest", Aggregate::Sum, behind));
        out.push(ModeMetric::array("worker_available", Aggregate::Sum, available));
        let c = self.coordinator.as_ref();
        let hist: Vec<f64> = match c {
            Some(c) => c.staleness_histogram.iter().map(|&x| x as f64).collect(),
            None => zeros(self.barrier.bound().map_or(UNBOUNDED_BUCKETS, |b| b + 1) as usize + 1),
        };
        let results: f64 = hist.iter().sum();
        let max_seen = hist.iter().rposition(|&x| x > 0.0).unwrap_or(0);
        let mean = hist.iter().enumerate().map(|(k, &x)| k as f64 * x).sum::<f64>() / results.max(1.0);
        out.push(ModeMetric::array("result_staleness_histogram", Aggregate::Sum, hist));
        out.push(ModeMetric::number("results", Aggregate::Sum, results));
        out.push(ModeMetric::number("max_result_staleness", Aggregate::Max, max_seen as f64));
        out.push(ModeMetric::number("mean_result_staleness", Aggregate::Max, mean));
        out.push(ModeMetric::number(
            "mean_update_staleness",
            Aggregate::Max,
            c.map_or(0.0, |c| c.update_staleness_sum as f64 / results.max(1.0)),
        ));
        out.push(ModeMetric::number("max_update_staleness", Aggregate::Max, c.map_or(0.0, |c| c.update_staleness_max as f64)));
        out.push(ModeMetric::number("releases", Aggregate::Sum, c.map_or(0.0, |c| c.releases as f64)));
        out.push(ModeMetric::number("released_workers", Aggregate::Sum, c.map_or(0.0, |c| c.released_workers as f64)));
        out.push(ModeMetric::number(
            "min_available_at_release",
            Aggregate::Max,
            c.and_then(|c| c.min_available_at_release).map_or(0.0, |a| a as f64),
        ));
        let param = match self.barrier {
            Barrier::Ssp(s) => s as f64,
            Barrier::Throttled(k) => k as f64,
            _ => 0.0,
        };
        out.push(ModeMetric::number("barrier_parameter", Aggregate::Max, param));
        out
    }
}

/// `--sync async`'s declaration (see [`super::ModeSpec`]).
pub const MODE: super::ModeSpec = super::ModeSpec {
    elastic: true,
    uses: &[(&[], &["AsyncOptions"])],
    keeps_history: |o| o.async_mode.optimizer == OptimizerKind::Saga,
    validate: validate_async,
    ..super::ModeSpec::new(
        "async",
        "A coordinator (rank 0) and workers under a barrier predicate (--barrier); --optimizer saga",
        |ctx, run, init| {
            let o = &run.opts.async_mode;
            let info = serde_json::json!({"barrier": o.barrier, "optimizer": o.optimizer, "coordinator": 0});
            Ok((Box::new(CoordinatedAsync::new(ctx, o, init)?), info))
        },
    )
};

fn validate_async(run: &super::RunSpec) -> anyhow::Result<()> {
    use crate::model::ModelKind;
    if run.opts.async_mode.optimizer == OptimizerKind::Saga {
        anyhow::ensure!(
            matches!(run.model, ModelKind::Lsq | ModelKind::Logreg | ModelKind::Svm),
            "--optimizer saga needs a linear model (--model lsq, logreg or svm: one stored scalar per example), not {:?}",
            run.model
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(clocks: &[u64], available: &[bool]) -> StatusTable {
        let mut t = StatusTable::new(clocks.len(), Instant::now());
        t.clocks = WorkerClocks::from_clocks(clocks.to_vec());
        for (m, w) in t.workers.iter_mut().enumerate() {
            w.available = available[m];
        }
        t
    }

    #[test]
    fn barriers_parse_and_print_back() {
        for s in ["bsp", "ssp:0", "ssp:3", "throttled:2", "async"] {
            assert_eq!(Barrier::parse(s).unwrap().to_string(), s);
        }
        for bad in ["", "ssp", "ssp:-1", "throttled:0", "throttled:x", "sync", "async:1"] {
            let e = Barrier::parse(bad).unwrap_err();
            assert!(e.contains("bsp, ssp:S"), "{bad}: {e}");
        }
        let j = serde_json::to_string(&Barrier::Ssp(2)).unwrap();
        assert_eq!(j, "\"ssp:2\"");
        assert_eq!(serde_json::from_str::<Barrier>(&j).unwrap(), Barrier::Ssp(2));
        assert!(serde_json::from_str::<Barrier>("\"nope\"").is_err());
    }

    /// Config files name predicates as on the command line; a bad one names its line.
    #[test]
    fn config_files_take_barriers_and_optimizers() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("c.toml");
        std::fs::write(&t, "sync = \"async\"\nbarrier = \"throttled:2\"\noptimizer = \"saga\"\nmodel = \"lsq\"\n").unwrap();
        let c = crate::config::TrainConfig::from_file(&t).unwrap();
        assert_eq!((c.modes.async_mode.barrier, c.modes.async_mode.optimizer), (Barrier::Throttled(2), OptimizerKind::Saga));
        assert_eq!(crate::config::TrainConfig::default().modes.async_mode.barrier, Barrier::Async);
        std::fs::write(&t, "sync = \"async\"\nbarrier = \"sometimes\"\n").unwrap();
        let e = crate::config::TrainConfig::from_file(&t).unwrap_err().to_string();
        assert!(e.contains("c.toml:2:1") && e.contains("bsp, ssp:S"), "{e}");
    }

    #[test]
    fn predicates_release_what_they_promise() {
        let t = table(&[3, 5, 4, 5], &[true, true, false, true]);
        assert!(Barrier::Bsp.release(&t).is_empty(), "rank 2 is busy");
        assert_eq!(Barrier::Bsp.release(&table(&[2, 2], &[true, true])), vec![0, 1]);
        // Slowest clock 3: ssp:1 lets go only workers at clock <= 4.
        assert_eq!(Barrier::Ssp(1).release(&t), vec![0]);
        assert_eq!(Barrier::Ssp(2).release(&t), vec![0, 1, 3]);
        assert_eq!(Barrier::Throttled(3).release(&t), vec![0, 1, 3]);
        assert!(Barrier::Throttled(4).release(&t).is_empty(), "only 3 available");
        assert_eq!(Barrier::Async.release(&t), vec![0, 1, 3]);
        assert_eq!(t.lead_over_slowest(1), 2);
    }

    fn coordinator(barrier: Barrier, n: usize, saga: bool) -> Coordinator {
        Coordinator {
            model: vec![0.0; 2],
            offsets: vec![0, 1, 2],
            stamp: vec![0; 2],
            seen: vec![0; n],
            version: 0,
            history: saga.then(|| vec![0.0; 2]),
            stat: StatusTable::new(n, Instant::now()),
            barrier,
            queued: Vec::new(),
            cut_round: 0,
            snapshots: EvalSnapshots::default(),
            staleness_histogram: vec![0; barrier.bound().map_or(UNBOUNDED_BUCKETS, |b| b + 1) as usize + 1],
            update_staleness_sum: 0,
            update_staleness_max: 0,
            releases: 0,
            released_workers: 0,
            min_available_at_release: None,
        }
    }

    fn result(worker: usize, clock: u64, u: f32) -> TaskResult {
        TaskResult { worker, clock, step_sum: 0.0, rows: vec![0], values: vec![u], history: None }
    }

    #[test]
    fn bsp_applies_a_round_together_and_releases_everybody() {
        let mut c = coordinator(Barrier::Bsp, 3, false);
        c.receive(result(2, 0, 3.0)).unwrap();
        c.receive(result(0, 0, 1.0)).unwrap();
        assert_eq!(c.model[0], 0.0, "the round is not complete");
        assert!(c.releases().is_empty());
        c.receive(result(1, 0, 2.0)).unwrap();
        assert_eq!(c.model[0], 2.0, "the mean of the round's updates");
        let r = c.releases();
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        // The release carries row 0 only (row 1 never changed) and version 3.
        let b = decode_rows(&r[0].1, 24, &c.offsets, false, false).unwrap();
        assert_eq!((b.rows, b.values), (vec![0], vec![2.0]));
        assert_eq!(u64::from_le_bytes(r[0].1[0..8].try_into().unwrap()), 3);
        assert!(c.receive(result(1, 0, 1.0)).is_err(), "clock 0 again");
    }

    #[test]
    fn ssp_holds_the_fast_worker_and_records_staleness() {
        let mut c = coordinator(Barrier::Ssp(1), 2, false);
        // Worker 0 returns twice while worker 1 is busy: after the first it may go on (lead 1),
        // after the second it must wait.
        c.receive(result(0, 0, 1.0)).unwrap();
        assert_eq!(c.releases().len(), 1);
        c.receive(result(0, 1, 1.0)).unwrap();
        assert!(c.releases().is_empty(), "worker 0 is 2 clocks ahead of worker 1");
        c.receive(result(1, 0, 1.0)).unwrap();
        let r = c.releases();
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        // Worker 0's result of clock 1 was computed at cmin 0: staleness 1.
        assert_eq!(c.staleness_histogram, vec![2, 1, 0]);
        // A result older than the bound is refused.
        c.stat.workers[0].release_cmin = 0;
        let mut clocks = c.stat.clocks.all().to_vec();
        clocks[0] = 2;
        c.stat.clocks = WorkerClocks::from_clocks(clocks);
        assert!(c.receive(result(0, 2, 1.0)).unwrap_err().to_string().contains("violated"));
    }

    #[test]
    fn throttled_waits_for_k_available() {
        let mut c = coordinator(Barrier::Throttled(2), 3, false);
        c.receive(result(1, 0, 1.0)).unwrap();
        assert!(c.releases().is_empty());
        c.receive(result(2, 0, 1.0)).unwrap();
        assert_eq!(c.releases().len(), 2);
        assert_eq!(c.min_available_at_release, Some(2));
    }

    /// Workers idle at a checkpoint count as available, so throttled:K cannot deadlock there,
    /// and they are released only when the cut is complete.
    #[test]
    fn workers_at_a_cut_count_as_available_and_leave_together() {
        let mut c = coordinator(Barrier::Throttled(3), 4, false);
        for m in [0, 3] {
            c.receive(result(m, 0, 1.0)).unwrap();
        }
        c.receive(result(1, 0, 1.0)).unwrap();
        assert_eq!(c.releases().len(), 3);
        // Workers 0 and 3 reach the cut of round 2 first (after clock 1); 1 and 2 are behind.
        c.receive(result(0, 1, 1.0)).unwrap();
        c.receive(result(3, 1, 1.0)).unwrap();
        c.cut(0, 2);
        c.cut(3, 2);
        c.receive(result(2, 0, 1.0)).unwrap();
        let r = c.releases();
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2], "0 and 3 count but stay at the cut");
        c.receive(result(1, 1, 1.0)).unwrap();
        c.cut(1, 2);
        assert!(c.releases().is_empty(), "worker 2 has not returned clock 1");
        c.receive(result(2, 1, 1.0)).unwrap();
        c.cut(2, 2);
        let r = c.releases();
        assert_eq!(r.len(), 4);
        assert!(r.iter().all(|(_, msg)| u64::from_le_bytes(msg[16..24].try_into().unwrap()) == 1), "cut releases");
    }

    #[test]
    fn saga_history_term_uses_the_mean_before_the_result() {
        let mut c = coordinator(Barrier::Async, 1, true);
        let mut r = result(0, 0, 0.0);
        r.step_sum = 0.5;
        r.history = Some((vec![0, 1], vec![2.0, 4.0]));
        c.receive(r).unwrap();
        assert_eq!(c.model, vec![0.0, 0.0], "A was 0 when the result was computed");
        assert_eq!(c.history.as_ref().unwrap(), &vec![2.0, 4.0]);
        c.releases();
        let mut r = result(0, 1, 0.0);
        r.step_sum = 0.5;
        c.receive(r).unwrap();
        assert_eq!(c.model, vec![-1.0, -2.0], "w -= step sum * A / M");
    }
}
