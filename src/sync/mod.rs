//! Sync modes: how ranks exchange what they learned. One file per mode, all behind [`SyncMode`].
//! A mode sees the model only as a flat `f32` parameter slice with its [`RowLayout`].
//!
//! What the training loop does with a mode, in order (see docs/sync-modes.md):
//! - [`SyncMode::before_step`] before every local step (a read gate: SSP waits there for rows
//!   fresh enough and puts them into the replica);
//! - [`SyncMode::sync`] after every `--sync-every` steps (one round, or one clock);
//! - at an evaluation round, [`SyncMode::mark_evaluation`]; the evaluation itself runs at once
//!   only when the mode is [`SyncMode::lockstep`], otherwise later, from snapshots, using
//!   [`SyncMode::evaluated_model`], so an asynchronous mode is never forced into step;
//! - before a checkpoint, [`SyncMode::quiesce`] (a consistent cut), then
//!   [`SyncMode::save_state`]; on `--resume`, [`SyncMode::restore_state`];
//! - [`SyncMode::finish`] once at the end: the final model, every rank the same.

use std::time::{Duration, Instant};

use mpi::topology::{Communicator, SimpleCommunicator};

use crate::comm::collectives;
use crate::comm::grouplink::GroupLink;
use crate::comm::pace::{Ingress, Links, Pacer};
use crate::model::RowLayout;

#[macro_use]
mod registry;
pub use registry::{Built, ModeSpec, RunSpec, Uses};

// Shared machinery of the modes (the modes' own files are declared by the registry below).
pub mod codec;
pub mod delta_sum;
pub mod gossip;
pub mod groups;
pub mod outer;
pub mod ps;

// The registry: one line per mode, `Variant: file { field: OptionsType }` (the options part only
// for a mode with an option group of its own). Each line declares the mode's module (its file in
// src/sync/, which holds `pub const MODE: ModeSpec`), the `--sync` value (`SyncKind::Variant`,
// named and described by `MODE`), and the mode's option group as a field of [`ModeOptions`]
// (flattened into the configuration: its flags, config-file keys and defaults). The order is the
// order of `--help` and of the modes listed in messages. The last line, `@shared`, lists the
// option groups several modes read (groups.rs), each a field of [`ModeOptions`] too.
modes! {
    Allreduce: allreduce { allreduce: AllreduceOptions };
    Asap: asap { asap: AsapOptions };
    Ssp: ssp { ssp: SspOptions };
    Async: async_mode { async_mode: AsyncOptions };
    Bosen: bosen { bosen: BosenOptions };
    Gaia: gaia { gaia: GaiaOptions };
    None: independent;
    @shared { graph: GraphOptions, staleness: StalenessOptions, budget: BudgetOptions, outer: OuterOptions, compress: CompressOptions, consensus: ConsensusOptions }
}

/// Communication counters every mode keeps the same way; the training loop reports them per rank
/// as mean and max.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CommStats {
    /// Bytes this rank sent to other ranks for training (payload + protocol; not the final model).
    pub bytes_sent: u64,
    /// Bytes this rank received from other ranks for training.
    pub bytes_received: u64,
    /// Seconds in the sync layer moving data (puts, messages, reductions); for allreduce this
    /// includes waiting, which MPI_Allreduce does not tell apart.
    pub comm_seconds: f64,
    /// Seconds the sync layer knew it was waiting for other ranks (notifications, clocks).
    pub wait_seconds: f64,
    /// Sync rounds (clocks) done.
    pub rounds: u64,
    /// Bytes sent to build the final model (counted the same way in every mode).
    pub final_bytes: u64,
    /// Seconds spent building the final model.
    pub final_seconds: f64,
}

/// How per-rank values of a mode metric combine into the one the metrics file reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// Added up over ranks (counters; histograms element by element).
    Sum,
    /// Mean over ranks.
    Mean,
    /// Largest over ranks.
    Max,
}

/// One mode-specific metric of this rank.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeMetric {
    pub name: &'static str,
    pub aggregate: Aggregate,
    /// One number, or a histogram (aggregated element by element).
    pub values: Vec<f64>,
    /// True when `values` is a histogram/array, false for a single number.
    pub is_array: bool,
}

impl ModeMetric {
    /// A single number.
    pub fn number(name: &'static str, aggregate: Aggregate, v: f64) -> Self {
        ModeMetric { name, aggregate, values: vec![v], is_array: false }
    }
    /// An array (a histogram), aggregated element by element.
    pub fn array(name: &'static str, aggregate: Aggregate, v: impl IntoIterator<Item = f64>) -> Self {
        ModeMetric { name, aggregate, values: v.into_iter().collect(), is_array: true }
    }
}

/// A mode's own state for checkpoints: named arrays (f64 holds every f32 and every counter below
/// 2^53 exactly). Each rank saves and restores its own.
pub type ModeState = Vec<(String, Vec<f64>)>;

/// What a history-based optimizer (`--optimizer saga`) hands the mode with a round's update: its
/// steps left out the mean of the stored gradients, which the mode applies (it alone can know it
/// over all ranks' examples).
pub struct HistoryDelta<'a> {
    /// The change the round's steps made to the mean over all examples of their stored
    /// gradients, one value per parameter.
    pub mean_change: &'a [f32],
    /// The sum of the round's step sizes: the weight of the mean's term in the update.
    pub step_sum: f32,
}

/// What every mode is built from.
pub struct SyncContext<'a> {
    pub comm: &'a SimpleCommunicator,
    /// Row structure of the model (the unit parameter-server modes shard and push).
    pub layout: RowLayout,
    /// Longest wait for another rank before failing (`--wait-timeout`).
    pub wait_timeout: Duration,
    /// Fault injection for tests: `(rank, round)`: that rank sends nothing after that round.
    pub stop_sending_after: Option<(usize, u64)>,
    pub seed: u64,
    /// `--emulate-bandwidth` and `--emulate-latency`: (Mbit/s, one-way latency) of this rank's
    /// emulated link.
    pub emulate: Option<(f64, Duration)>,
    /// Every rank's emulated link (with `emulate`): a message runs at the slower end's rate.
    pub links: Option<Links>,
    /// `--send-log`: pacers keep a log of every send.
    pub record_sends: bool,
    /// Rounds (clocks) in one epoch: steps per epoch / `--sync-every`, at least 1.
    pub rounds_per_epoch: u64,
    /// `--emulate-groups`: the shared links between groups (with `links`), which every pacer of
    /// this rank takes for its messages across groups.
    pub group_link: Option<std::rc::Rc<GroupLink>>,
}

impl SyncContext<'_> {
    /// Length of the flat parameter vector.
    pub fn n_params(&self) -> usize {
        *self.layout.offsets.last().unwrap_or(&0)
    }

    /// The pacer of this rank's sends: the emulated link, further limited to `budget_mbps` (a
    /// mode's own bandwidth budget) when given; None when neither applies. Two rate limits in
    /// series on one FIFO queue let bytes out as one at the smaller rate.
    pub fn pacer(&self, budget_mbps: Option<f64>) -> Option<Pacer> {
        if let Some(links) = &self.links {
            let p = Pacer::for_rank(links, self.comm.rank() as usize, budget_mbps).with_group_link(self.group_link.clone());
            return Some(if self.record_sends { p.record() } else { p });
        }
        let (rate, latency) = match (self.emulate, budget_mbps) {
            (None, None) => return None,
            (Some((e, l)), None) => (e, l),
            (None, Some(b)) => (b, Duration::ZERO),
            (Some((e, l)), Some(b)) => (e.min(b), l),
        };
        let p = Pacer::new(rate, latency);
        Some(if self.record_sends { p.record() } else { p })
    }

    /// The same run's context on `group`, a communicator of some of the ranks (gaia's data
    /// centres), for a mode run inside it: unpaced (only the links between groups are
    /// emulated, by the outer mode), without fault injection (the outer mode's), no send log.
    pub fn on_group<'b>(&self, group: &'b SimpleCommunicator) -> SyncContext<'b> {
        SyncContext {
            comm: group,
            layout: self.layout.clone(),
            wait_timeout: self.wait_timeout,
            stop_sending_after: None,
            seed: self.seed,
            emulate: None,
            links: None,
            record_sends: false,
            rounds_per_epoch: self.rounds_per_epoch,
            group_link: None,
        }
    }

    /// This rank's inbound link, when per-rank links are emulated (`--emulate-bandwidth`,
    /// `--cluster`): several senders to this rank share its rate. Every rank gets one or none.
    pub fn ingress(&self) -> Option<Ingress> {
        let links = self.links.as_ref()?;
        let i = Ingress::new(links.inbound_rate(self.comm.rank() as usize));
        Some(if self.record_sends { i.record() } else { i })
    }
}

/// The interface every sync mode implements.
pub trait SyncMode {
    /// Short name for logs and metrics (e.g. "allreduce").
    fn name(&self) -> &'static str;
    /// True when every round makes all ranks wait for each other anyway (BSP): evaluations and
    /// checkpoints then run at once. False: they are taken without forcing ranks into step.
    fn lockstep(&self) -> bool;
    /// How many rounds a rank may run ahead of a rank that still needs it to answer (SSP: S + 1).
    /// The training loop does not make a rank wait for the others more often than that, or a
    /// rank waiting could hold up the one it waits for.
    fn round_lead(&self) -> u64 {
        0
    }
    /// Called before each local step; `clock` is the number of rounds done so far. A mode may
    /// wait here and overwrite (parts of) `params` with fresher values.
    fn before_step(&mut self, _params: &mut [f32], _clock: u64) -> anyhow::Result<()> {
        Ok(())
    }
    /// Called while an emulated step (`--emulate-compute`, a `--straggler`'s sleep) waits out
    /// the rest of its time `d`, and with `d` = 0 from every poll of a stop-vote wait; returns
    /// after about `d`. The default sleeps. A rank that also
    /// serves others (the async coordinator) serves them meanwhile: on the emulated cluster the
    /// step's compute would not stop its server from answering, and sleeping through it made
    /// every worker wait for rank 0's next step boundary (fast workers' tasks took 2 steps).
    fn idle(&mut self, d: Duration) -> anyhow::Result<()> {
        std::thread::sleep(d);
        Ok(())
    }
    /// Called before `sync` with what a history-based optimizer's steps of the round left to the
    /// mode. Only modes that can keep the history take it.
    fn history(&mut self, _h: HistoryDelta<'_>) -> anyhow::Result<()> {
        anyhow::bail!("--optimizer saga needs --sync async (--sync {} keeps no gradient history)", self.name())
    }
    /// Exchange after a block of local steps. `round` counts from 1. On return `params` holds the
    /// rank's model for the next steps.
    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()>;
    /// Called once after training; leaves every rank's `params` as the final model the mode
    /// defines (the average of the replicas, or the parameter servers' model).
    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()>;
    /// The training loop will evaluate the model of `round` (called right after `sync(round)`).
    fn mark_evaluation(&mut self, _round: u64) {}
    /// This rank's additive part of the model evaluated at `round` (the loop sums the parts over
    /// ranks), or None: evaluate the average of the replicas. Collective in the sense that every
    /// rank calls it for the same rounds, in order; may wait for other ranks.
    fn evaluated_model(&mut self, _round: u64) -> anyhow::Result<Option<Vec<f32>>> {
        Ok(None)
    }
    /// Brings the mode to a consistent cut after `sync(round)` on every rank (no message in
    /// flight, every update of rounds <= `round` applied), before a checkpoint.
    fn quiesce(&mut self, _params: &mut [f32], _round: u64) -> anyhow::Result<()> {
        Ok(())
    }
    /// This rank's mode state for a checkpoint taken after `quiesce`.
    fn save_state(&self) -> ModeState {
        Vec::new()
    }
    /// Whether the entry `name` of [`SyncMode::save_state`] is averaged over the old ranks when a
    /// checkpoint resumes at another rank count (state of the model's motion, e.g. an outer
    /// velocity); the rest starts as a fresh run's would (`train::elastic`).
    fn averaged_on_resize(&self, _name: &str) -> bool {
        false
    }
    /// Whether the entry `name` of [`SyncMode::save_state`] is one part of an array split over
    /// the ranks in rank order (a parameter server's shard of per-row state): at a resume on
    /// another rank count the old ranks' parts are laid end to end ([`SyncMode::repartition`]).
    fn laid_on_resize(&self, _name: &str) -> bool {
        false
    }
    /// At a resume on another rank count: this rank's state for [`SyncMode::restore_state`],
    /// from `state` (a fresh one's, with what [`SyncMode::averaged_on_resize`] carried in place)
    /// and `laid` (the entries [`SyncMode::laid_on_resize`] names, whole), written by
    /// `ranks_before` ranks. The default keeps `state`.
    fn repartition(&self, state: ModeState, _laid: &ModeState, _ranks_before: usize) -> anyhow::Result<ModeState> {
        Ok(state)
    }
    /// Restores what `save_state` returned (on `--resume`).
    fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        anyhow::ensure!(state.is_empty(), "the checkpoint holds sync-mode state that {} does not use", self.name());
        Ok(())
    }
    /// Counters so far.
    fn stats(&self) -> &CommStats;
    /// The paced sends of this rank (seconds since set-up, bytes), when `--send-log` asked for
    /// them and the mode paces its sends.
    fn send_log(&self) -> Vec<(f64, u64)> {
        Vec::new()
    }
    /// The messages this rank's emulated inbound link carried in (seconds since set-up, bytes),
    /// when `--send-log` asked for them and the mode models the receiver's link.
    fn receive_log(&self) -> Vec<(f64, u64)> {
        Vec::new()
    }
    /// Mode-specific metrics (consistency histogram, staleness distribution ...).
    fn metrics(&self) -> Vec<ModeMetric> {
        Vec::new()
    }
}

/// Replaces `params` by the average of all ranks' `params`, counted in `stats` as final-model
/// traffic the same way in every mode: the volume of a bandwidth-optimal (ring) allreduce,
/// 2 (N-1)/N of the model per rank, since MPI does not report what it sent.
pub fn average_replicas(comm: &SimpleCommunicator, params: &mut [f32], stats: &mut CommStats) {
    let t = Instant::now();
    let mut scratch = Vec::new();
    collectives::sum_f32(comm, params, &mut scratch);
    let inv = 1.0 / comm.size() as f32;
    params.iter_mut().for_each(|w| *w *= inv);
    stats.final_bytes += ring_allreduce_bytes(comm.size() as usize, params.len());
    stats.final_seconds += t.elapsed().as_secs_f64();
}

/// Replaces `params` by the model the ranks' server parts make up: each rank writes its part
/// (a parameter server's shard, a coordinator's whole model) with `fill` into a zeroed vector, and
/// the parts are summed over ranks. Counted as final-model traffic like [`average_replicas`].
pub fn assemble_parts(comm: &SimpleCommunicator, params: &mut [f32], stats: &mut CommStats, fill: impl FnOnce(&mut [f32])) {
    let t = Instant::now();
    params.iter_mut().for_each(|w| *w = 0.0);
    fill(params);
    collectives::sum_f32(comm, params, &mut Vec::new());
    stats.final_bytes += ring_allreduce_bytes(comm.size() as usize, params.len());
    stats.final_seconds += t.elapsed().as_secs_f64();
}

/// Bytes one rank sends in a ring allreduce of `len` f32s over `n` ranks.
pub fn ring_allreduce_bytes(n: usize, len: usize) -> u64 {
    if n <= 1 {
        return 0;
    }
    (2.0 * (n - 1) as f64 / n as f64 * (len * 4) as f64) as u64
}

/// The defaults of an option group, from its declaration (in values.rs, below every layer that
/// declares one).
pub use crate::values::option_defaults;
