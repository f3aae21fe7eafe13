//! `--sync ssp`: stale synchronous parallel on a parameter server whose shards live on the ranks
//! themselves (Bosen §3.1-3.2: every process is client and server), with the server-side rules of
//! the heterogeneity-aware parameter server (ConSGD, DynSGD: its §4-5).
//!
//! - **Shards**: the model's rows are split into contiguous blocks, one per rank, balanced by
//!   parameter count; rank s serves the rows of block s. Ranks whose block is empty (fewer rows
//!   than ranks) serve nothing.
//! - **Clocks**: round r ends clock r-1. At the end of clock k a worker pushes, to every shard,
//!   the update its steps made to that shard's rows since it last read them (`params - base`),
//!   together with a read request for clock k+1. The server answers the read once every worker's
//!   updates of clocks <= k-S are applied (its `cmin`, the smallest number of clocks any worker
//!   has pushed, is >= k+1-S), with the shard's rows and `cmin`. So a worker at clock c only ever
//!   uses rows that hold every update of clocks <= c-S-1: the SSP guarantee. S = 0 is BSP.
//!   Before its first step of clock c the worker puts the answers that arrived into its replica
//!   and waits only for shards whose newest answer has `cmin < c - S` (lazy reads, the paper's
//!   Algorithm 1: pull only when the replica is too stale; its own pushes not yet in an answer
//!   stay on top of the answer's rows), then records each shard's staleness `c - cmin` (in
//!   [0, S]). Bosen's managed clients still wait for every answer.
//! - **Apply rules**: plain (w += u), ConSGD (w += u/M) and DynSGD (per-version staleness
//!   scaling with V(m), S(v), u(PS,v), Algorithm 2 of the paper; versions every worker has passed
//!   are freed).
//! - **Order**: with S = 0 a shard applies the pushes of a clock in worker order once all have
//!   arrived (nobody may read before then anyway), so runs and resumed runs are bit-identical;
//!   with S > 0 pushes are applied as they arrive, which is the point of SSP (fresher reads).
//! - **Transport**: two-sided messages ([`Postbox`]): a shard server must run code when an update
//!   arrives (the DynSGD bookkeeping, deferred reads), and a worker may run up to S clocks ahead,
//!   so updates queue per edge; docs/sync-modes.md has the measurement behind the choice. Every
//!   wait keeps serving other ranks' pushes; past `--wait-timeout` it says what it lacks (the
//!   shards that have not answered, the ranks whose clocks are behind) and names as holding it up
//!   only the ranks without a sign of life (`comm::deadline`): a shard that has not answered may
//!   itself wait for the stopped rank.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::bail;
use mpi::topology::Communicator;

use super::bosen::{self, AdaRevision, BosenOptions, Picker};
use super::ps::clocks::{EvalSnapshots, WorkerClocks};
use super::codec::fp16::F16_HALF_MIN;
use super::codec::rows::{decode_rows, encode_rows, word_at, RowBlock};
use super::ps::shards::{shard_ranges, shard_rows};
use super::ps;
use super::{Aggregate, CommStats, ModeMetric, ModeState, SyncContext, SyncMode};
use crate::comm::backoff::Backoff;
use crate::comm::deadline::WaitDeadline;
use crate::comm::postbox::Postbox;

/// How a shard server applies a worker's update (`--apply`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyRule {
    /// w += u (SSPSGD): with M workers the steps add up, so use about 1/M of the allreduce --lr.
    Plain,
    /// w += u / M (ConSGD): at S = 0 exactly model averaging.
    Consgd,
    /// DynSGD: u scaled by 1/staleness, earlier updates of the same version revised.
    Dynsgd,
}

/// Options of `--sync ssp`.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "SSP (--sync ssp)")]
pub struct SspOptions {
    /// Staleness bound S. ssp/bosen: a worker at clock c reads only rows holding every update of
    /// clocks <= c-S-1 (waiting otherwise); 0 is BSP [default: 3, at most the rounds of an epoch
    /// less one]. asap (notify-ack): a rank
    /// reduces each in-neighbour's newest message no older than S rounds and runs at most S
    /// messages ahead of what its receivers have read (S + 1 slots per edge); 0 is ASAP's
    /// NOTIFY-ACK [default: 0].
    #[arg(long, value_name = "S", value_parser = staleness_bound, group = "staleness_group")]
    pub staleness: Option<u64>,
    /// Server-side rule: plain (add updates), consgd (scale by 1/M), dynsgd (scale by
    /// 1/staleness per model version; not with bosen, whose early partial pushes DynSGD's
    /// per-version bookkeeping does not define). [default: dynsgd for ssp, consgd for bosen]
    #[arg(long, value_enum)]
    pub apply: Option<ApplyRule>,
}

impl SspOptions {
    /// The apply rule in force for `--sync ssp` (`bosen` false) or `--sync bosen`.
    pub fn apply_rule(&self, bosen: bool) -> ApplyRule {
        self.apply.unwrap_or(if bosen { ApplyRule::Consgd } else { ApplyRule::Dynsgd })
    }
}

impl SspOptions {
    /// The staleness bound of ssp and bosen (`--staleness`, default 3).
    pub fn ssp_staleness(&self) -> u64 {
        self.staleness.unwrap_or(3)
    }

    /// ssp and bosen with `--staleness` not given: the default bounded by the rounds of an epoch
    /// less one, so that by the last clock of every epoch each worker reads rows holding every
    /// update of the epoch before (a read at clock c holds every update of clocks <= c - S - 1).
    /// With S at or above an epoch's R rounds, a whole epoch's steps may be computed from rows
    /// that lack the other workers' updates of the epoch before, and the stale updates summed on
    /// the servers overshoot: heart_scale at 8 ranks (33 examples per rank, R = 2) rose in the
    /// third epoch in 3 of 3 runs at S = 3 and 1 of 3 at S = 2, and fell every epoch in 8 of 8 at
    /// S = 1 (benches/defaults-sweep.md). Only data sets of under 4 rounds per epoch are
    /// affected. Returns what it chose, for the start line; None when the default stands.
    pub fn fit_to_epoch(&mut self, rounds_per_epoch: u64) -> Option<String> {
        if self.staleness.is_some() {
            return None;
        }
        let default = self.ssp_staleness();
        let bounded = default.min(rounds_per_epoch.saturating_sub(1));
        if bounded == default {
            return None;
        }
        self.staleness = Some(bounded);
        Some(format!(
            "--staleness not given: {bounded} (the default {default} bounded by the {rounds_per_epoch} round(s) of an epoch less one, so that each epoch ends reading every update of the epoch before; --staleness sets it)"
        ))
    }
}

/// `--staleness`: at most 1000 (asap, ssp and bosen alike: the rule of the shared staleness
/// group, checked where the value is parsed).
fn staleness_bound(s: &str) -> Result<u64, String> {
    let v: u64 = s.trim().parse().map_err(|_| format!("expected a number of clocks >= 0, got {s:?}"))?;
    if v <= 1000 {
        Ok(v)
    } else {
        Err(format!("{v} is too large (at most 1000: each step of it costs a model-sized slot per edge under asap)"))
    }
}

impl Default for SspOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// Worker -> server: `[clock u64][want u64][flags u64]` + rows (the rows this worker changed).
const TAG_PUSH: i32 = 11;
/// Server -> worker: `[cmin u64][flags u64]` + rows (the rows changed since this worker got them).
const TAG_ROWS: i32 = 12;
/// Push flag: part of a clock's update sent early (bosen), not the end of the clock.
const PARTIAL: u64 = 1;
/// Push flag: values are binary16.
const HALF: u64 = 2;
/// Flag: each row carries the version it was computed from / is sent at (AdaRevision).
const VERSIONS: u64 = 4;
/// Rows flag: pushed by the server between clocks (bosen), not the answer to a read.
const UNSOLICITED: u64 = 1;

/// DynSGD bookkeeping of one shard (the paper's Table 1).
#[derive(Default)]
struct DynState {
    /// V(m): the version each worker's next update is stamped with.
    version: Vec<u64>,
    /// Number of global-update versions so far (the fastest worker's clock).
    cmax: u64,
    /// Per live version v: (S(v), u(PS, v)).
    updates: BTreeMap<u64, (u64, Vec<f32>)>,
}

/// Snapshots kept per row at most (the oldest go first): a client that never updates a row never
/// says it moved past a version, so without a cap a popular row of a sparse model would keep one
/// snapshot per update.
const SNAPSHOTS_PER_ROW: usize = 16;

/// AdaRevision on a shard (Bosen §3.4): rows carry versions; a snapshot of the accumulated
/// gradient is kept per (row, version) while some client may still compute with that version.
struct AdaShard {
    rev: AdaRevision,
    /// The client steps' size: a pushed update u is the gradient sum -u / lr.
    lr: f32,
    /// Per local row: its version, bumped by every update.
    version: Vec<u64>,
    /// (row, version) -> accumulated gradient of the row at that version. Version 0 is the zero
    /// vector for every row and never stored.
    snapshots: BTreeMap<(u32, u64), Vec<f32>>,
    /// Per worker, per local row: the oldest version it may still push updates for (its pushes
    /// arrive in order and carry the version they were computed from, so a push of version v
    /// means it holds nothing older).
    held_lo: Vec<Vec<u64>>,
    snapshots_peak: usize,
    /// Updates whose snapshot was evicted: the oldest one kept stood in (a smaller backlog, so a
    /// step between the exact one and no revision).
    snapshot_misses: u64,
}

impl AdaShard {
    /// The current version of `row` is being sent to a client: keep its snapshot.
    fn snapshot_current(&mut self, row: u32, offsets: &[usize]) {
        let (r, v) = (row as usize, self.version[row as usize]);
        if v == 0 || self.snapshots.contains_key(&(row, v)) {
            return;
        }
        self.snapshots.insert((row, v), self.rev.g_sum[offsets[r]..offsets[r + 1]].to_vec());
        let kept: Vec<u64> = self.snapshots.range((row, 0)..=(row, u64::MAX)).map(|(k, _)| k.1).collect();
        for &old in kept.iter().take(kept.len().saturating_sub(SNAPSHOTS_PER_ROW)) {
            self.snapshots.remove(&(row, old));
        }
        self.snapshots_peak = self.snapshots_peak.max(self.snapshots.len());
    }

    /// The accumulated gradient a client saw at version `v` of `row`.
    fn g_old(&mut self, row: u32, v: u64, n: usize) -> Vec<f32> {
        if v == 0 {
            return vec![0.0; n];
        }
        if let Some(g) = self.snapshots.get(&(row, v)) {
            return g.clone();
        }
        self.snapshot_misses += 1;
        match self.snapshots.range((row, 0)..=(row, u64::MAX)).next() {
            Some((_, g)) => g.clone(),
            None => vec![0.0; n],
        }
    }

    /// Worker `m` pushed `row` computed from version `v`: it holds nothing older; snapshots no
    /// worker can use any more are freed.
    fn release(&mut self, m: usize, row: u32, v: u64) {
        let r = row as usize;
        self.held_lo[m][r] = self.held_lo[m][r].max(v);
        let oldest = self.held_lo.iter().map(|h| h[r]).min().unwrap_or(0);
        let gone: Vec<u64> = self.snapshots.range((row, 0)..(row, oldest)).map(|(k, _)| k.1).collect();
        gone.into_iter().for_each(|u| {
            self.snapshots.remove(&(row, u));
        });
    }
}

/// The server half of a rank: one shard of the model.
struct ShardServer {
    range: Range<usize>,
    rows: Vec<f32>,
    /// Local row r is `rows[offsets[r]..offsets[r+1]]`.
    offsets: Vec<usize>,
    /// Per row: the apply count (`seq`) when it last changed.
    stamp: Vec<u64>,
    /// Pushes applied so far.
    seq: u64,
    /// Per worker, per row: the row's stamp when it was last sent to that worker (rows stamped
    /// later are news to it).
    sent: Vec<Vec<u64>>,
    /// Bosen: per worker, per row, the L1 change since the row was last sent to it (priority).
    change: Vec<Vec<f32>>,
    /// Clocks each worker has pushed and had applied, and the slowest (`cmin`).
    clocks: WorkerClocks,
    rule: ApplyRule,
    staleness: u64,
    dyn_state: DynState,
    ada: Option<AdaShard>,
    /// Pushes received but not applied yet: (clock, worker) -> rows.
    queued: BTreeMap<(u64, usize), RowBlock>,
    /// DynSGD: the version a queued push was computed from, as its worker stamped it (a worker
    /// that read lazily may still compute from an answer older than the newest one sent to it).
    stamps: BTreeMap<(u64, usize), u64>,
    /// Reads waiting for `cmin >= want`: (worker, want).
    reads: Vec<(usize, u64)>,
    /// Evaluation snapshots: round -> rows once `cmin >= round`.
    snapshots: EvalSnapshots,
    max_live_versions: usize,
}

impl ShardServer {
    fn new(range: Range<usize>, init: &[f32], offsets: Vec<usize>, n: usize, rule: ApplyRule, staleness: u64) -> Self {
        let rows = offsets.len() - 1;
        ShardServer {
            rows: init.to_vec(),
            stamp: vec![0; rows],
            seq: 0,
            sent: vec![vec![0; rows]; n],
            change: Vec::new(),
            range,
            offsets,
            clocks: WorkerClocks::new(n),
            rule,
            staleness,
            dyn_state: DynState { version: vec![0; n], ..Default::default() },
            ada: None,
            queued: BTreeMap::new(),
            stamps: BTreeMap::new(),
            reads: Vec::new(),
            snapshots: EvalSnapshots::default(),
            max_live_versions: 0,
        }
    }

    fn workers(&self) -> usize {
        self.clocks.len()
    }

    /// Applies every queued push that may be applied now; returns whether anything changed.
    fn apply_queued(&mut self) -> anyhow::Result<bool> {
        let mut changed = false;
        loop {
            let next = if self.staleness == 0 {
                // BSP: the whole clock, in worker order, once every worker's push is here.
                let c = self.clocks.min();
                let all_here = (0..self.workers()).all(|m| self.queued.contains_key(&(c, m)));
                if !all_here {
                    break;
                }
                (0..self.workers()).map(|m| (c, m)).collect::<Vec<_>>()
            } else {
                self.queued.keys().copied().collect()
            };
            if next.is_empty() {
                break;
            }
            for key in next {
                let block = self.queued.remove(&key).expect("queued");
                self.apply(key.1, key.0, &block)?;
                changed = true;
            }
            if self.staleness != 0 {
                break;
            }
        }
        Ok(changed)
    }

    /// Applies worker `m`'s update of `clock` and completes that clock.
    fn apply(&mut self, m: usize, clock: u64, block: &RowBlock) -> anyhow::Result<()> {
        if clock != self.clocks.of(m) {
            bail!("ssp protocol error: rank {m} pushed clock {clock} but {} was expected", self.clocks.of(m));
        }
        let stamp = self.stamps.remove(&(clock, m));
        self.apply_rows(m, clock, block, stamp);
        if self.clocks.complete(m) {
            self.snapshots.release(self.clocks.min(), &self.rows);
        }
        Ok(())
    }

    /// Applies worker `m`'s rows (part of its update of `clock`) under the apply rule.
    fn apply_rows(&mut self, m: usize, clock: u64, block: &RowBlock, stamp: Option<u64>) {
        self.seq += 1;
        let seq = self.seq;
        let rows = &block.rows;
        let values = &block.values;
        if self.ada.is_some() {
            let mut at = 0;
            for (k, &r) in rows.iter().enumerate() {
                let range = self.offsets[r as usize]..self.offsets[r as usize + 1];
                let n = range.len();
                let ada = self.ada.as_mut().expect("checked");
                let g: Vec<f32> = values[at..at + n].iter().map(|u| -u / ada.lr).collect();
                let v = block.versions.get(k).copied().unwrap_or(0);
                let g_old = ada.g_old(r, v, n);
                ada.release(m, r, v);
                let before = self.rows[range.clone()].to_vec();
                ada.rev.apply(&mut self.rows[range.clone()], range.start, &g, &g_old);
                ada.version[r as usize] += 1;
                let moved: f32 = self.rows[range.clone()].iter().zip(&before).map(|(a, b)| (a - b).abs()).sum();
                self.note_change(r as usize, moved);
                self.stamp[r as usize] = seq;
                at += n;
            }
            return;
        }
        let scale = match self.rule {
            ApplyRule::Plain => 1.0,
            _ => 1.0 / self.workers() as f32,
        };
        let mut at = 0;
        if self.rule != ApplyRule::Dynsgd {
            for &r in rows {
                let range = self.offsets[r as usize]..self.offsets[r as usize + 1];
                let n = range.len();
                let mut moved = 0.0;
                self.rows[range].iter_mut().zip(&values[at..at + n]).for_each(|(w, x)| {
                    *w += x * scale;
                    moved += (x * scale).abs();
                });
                self.note_change(r as usize, moved);
                self.stamp[r as usize] = seq;
                at += n;
            }
        } else {
            // DynSGD revises the rows earlier updates of the version touched, too: work on the
            // dense update.
            let mut u = vec![0f32; self.rows.len()];
            for &r in rows {
                let range = self.offsets[r as usize]..self.offsets[r as usize + 1];
                let n = range.len();
                u[range].copy_from_slice(&values[at..at + n]);
                self.stamp[r as usize] = seq;
                at += n;
            }
            let st = &mut self.dyn_state;
            // A worker's stamp can fall below V(m): it restarts from the newest answer's cmax,
            // and an answer composed before this worker's last pushes were applied carries a
            // cmax that does not count them. Taken as sent, such a stamp put a second update of
            // the worker into a version it had already stamped, or, where every V had passed
            // that version, into a freed one restarting at S = 1: weight 1, eight times the
            // averaged step at 8 ranks (MovieLens MF, ssp S = 3, 8 ranks: 168-177 such pushes
            // per run, and held-out RMSE spikes to 1.86 that ended 3 of 3 runs beside two
            // CPU burners above the quick report's floor). V(m) only grows, as in the paper's
            // Algorithm 2 (line 9, and line 18 reads cmax >= V(m)).
            let v = stamp.unwrap_or(0).max(st.version[m]);
            let len = self.rows.len();
            let (s_v, u_v) = st.updates.entry(v).or_insert_with(|| (1, vec![0.0; len]));
            // Delta u = (u - u(PS, v)) / S(v): this update weighted 1/d, and the d-1 earlier
            // updates of version v revised from 1/(d-1) to 1/d.
            let inv = 1.0 / *s_v as f32;
            for r in 0..self.offsets.len() - 1 {
                let mut moved = false;
                for j in self.offsets[r]..self.offsets[r + 1] {
                    let du = (u[j] - u_v[j]) * inv;
                    self.rows[j] += du;
                    u_v[j] += du;
                    moved |= du != 0.0;
                }
                if moved {
                    self.stamp[r] = seq;
                }
            }
            *s_v += 1;
            // V(m) + 1: the least version worker m's next update goes into.
            st.version[m] = v + 1;
            st.cmax = st.cmax.max(clock + 1);
            let oldest = *st.version.iter().min().expect("workers");
            st.updates.retain(|&ver, _| ver >= oldest);
            self.max_live_versions = self.max_live_versions.max(st.updates.len());
        }
    }

    /// Bosen priority bookkeeping: row `r` moved by `moved` (L1) for every client.
    fn note_change(&mut self, r: usize, moved: f32) {
        for c in self.change.iter_mut() {
            c[r] += moved;
        }
    }

    /// A rows message to worker `m` with the listed local rows (marked as sent to it).
    /// `header`: [cmin, clocks of worker `m` applied here, DynSGD's newest version (cmax)].
    fn rows_message(&mut self, m: usize, header: [u64; 3], flags: u64, rows: &[u32]) -> Vec<u8> {
        for &r in rows {
            self.sent[m][r as usize] = self.stamp[r as usize];
            if let Some(c) = self.change.get_mut(m) {
                c[r as usize] = 0.0;
            }
        }
        let versions: Option<Vec<u64>> = self.ada.as_mut().map(|ada| {
            rows.iter()
                .map(|&r| {
                    ada.snapshot_current(r, &self.offsets);
                    ada.version[r as usize]
                })
                .collect()
        });
        let flags = flags | if versions.is_some() { VERSIONS } else { 0 };
        let mut msg = Vec::new();
        msg.extend_from_slice(&header[0].to_le_bytes());
        msg.extend_from_slice(&flags.to_le_bytes());
        msg.extend_from_slice(&header[1].to_le_bytes());
        msg.extend_from_slice(&header[2].to_le_bytes());
        encode_rows(&mut msg, &self.offsets, rows, versions.as_deref(), &self.rows, false);
        msg
    }

    /// Rows worker `m` has not seen in their current state.
    fn news(&self, m: usize) -> Vec<u32> {
        (0..self.stamp.len()).filter(|&r| self.stamp[r] > self.sent[m][r]).map(|r| r as u32).collect()
    }

    /// Reads that may be answered now: (worker, messages). With `chunk`, the answer is split
    /// into messages of at most that many rows; all but the last go as unsolicited rows.
    fn answerable(&mut self, chunk: Option<usize>) -> Vec<(usize, Vec<u8>)> {
        let cmin = self.clocks.min();
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.reads.len() {
            let (m, want) = self.reads[i];
            if want <= cmin {
                // In order: a worker that reads lazily has several reads out, and takes their
                // answers in turn.
                self.reads.remove(i);
                let version = self.dyn_state.cmax;
                // Only the rows that changed since this worker last got them: the others still
                // hold what it has (its own changes were pushed, and so changed them here).
                let news = self.news(m);
                let size = chunk.unwrap_or(usize::MAX).max(1);
                let mut parts: Vec<&[u32]> = news.chunks(size).collect();
                let last = parts.pop().unwrap_or(&[]);
                let applied = self.clocks.of(m);
                for part in parts {
                    let msg = self.rows_message(m, [cmin, applied, version], UNSOLICITED, part);
                    out.push((m, msg));
                }
                let msg = self.rows_message(m, [cmin, applied, version], 0, last);
                out.push((m, msg));
            } else {
                i += 1;
            }
        }
        out
    }

    /// Ranks whose clock is the slowest this shard has seen.
    fn laggards(&self) -> Vec<usize> {
        self.clocks.slowest()
    }
}

/// Longest look-ahead of the early sends' budget: a step interval that includes a long wait
/// (the end of a clock, an evaluation) must not let one call queue seconds of early sends
/// ahead of the next clock's mandatory push.
const MAX_HORIZON: Duration = Duration::from_millis(200);

/// What `--sync bosen` adds on the client and server side of a rank.
struct Manage {
    queue_size: usize,
    fp16: bool,
    max_snapshots: usize,
    client: Picker,
    server: Picker,
    /// The next worker a server push goes to (cycling, so every client gets fresh rows).
    next_worker: usize,
    /// Sends not yet completed above which no early send is made (Bosen §3.3.1: the network is
    /// overused when messages are not acknowledged).
    unacked_limit: usize,
    /// No early sends while the ranks are brought to a consistent cut.
    quiet: bool,
    /// How far ahead of now spare budget is filled: the time since the last local step began
    /// (capped at [`MAX_HORIZON`]). Early sends are only made between steps, so a bucket that
    /// is only refilled when it is empty leaves the link idle for the rest of each step: with
    /// one message of --queue-size rows per step, MF at 40 Mbit/s and 7.6 ms steps spent about
    /// a quarter of the budget (benches/claim-bosen.md). Filled up to the next step instead, the
    /// budget (the pacer's rate) is what limits the early sends.
    horizon: Duration,
    last_step: Option<Instant>,
    /// Per global row: pushes of its update by this client, and server pushes of it to clients.
    row_pushes: Vec<u64>,
    row_serves: Vec<u64>,
    early_pushes: u64,
    early_serves: u64,
    backoffs: u64,
    /// Bytes of this client's push messages and the update values they carried.
    push_bytes: u64,
    pushed_values: u64,
}

/// SSP over rank-hosted shards (and bosen: SSP with managed communication). Collective: every
/// rank builds it and runs the same rounds.
pub struct StaleSynchronous {
    post: Postbox,
    rank: usize,
    staleness: u64,
    wait_timeout: Duration,
    stop_sending_after: Option<(usize, u64)>,
    /// Parameter range served by each rank.
    shards: Vec<Range<usize>>,
    /// Global row range served by each rank.
    row_ranges: Vec<Range<usize>>,
    /// Row offsets inside each rank's shard (relative to its start).
    local_offsets: Vec<Vec<usize>>,
    server: Option<ShardServer>,
    /// The replica's values as last received from the shards, plus what was pushed since: the
    /// update not yet sent is `params - base` (AdaRevision: `pending`).
    base: Vec<f32>,
    /// AdaRevision: updates computed and not yet pushed (the replica itself stays what the
    /// servers sent: Bosen's read-only client cache); and the version of each global row held.
    pending: Option<Vec<f32>>,
    held_version: Vec<u64>,
    /// fp16: the unsent update of each row right after it was last pushed (its rounding error).
    /// A row whose unsent update is still exactly that was not touched since, and its residual
    /// waits for the row's next change or for spare budget instead of costing a message every
    /// clock (a residual below half the smallest binary16 could never be sent on its own).
    residual: Option<Vec<f32>>,
    /// Per shard: reads sent whose answer has not been put into the replica yet.
    awaiting: Vec<u32>,
    /// Per shard: `cmin` of the newest answer put into the replica (its rows hold every update
    /// of clocks < it).
    fresh_cmin: Vec<u64>,
    /// Lazy reads: per shard, (clock, update) of this worker's pushes that the newest answer put
    /// into the replica did not hold yet; they stay on top of the answer's rows (read-my-writes).
    in_flight: Vec<VecDeque<(u64, Vec<f32>)>>,
    /// DynSGD: per shard, the version this worker's next update is computed from (the newest
    /// answer's cmax, + 1 per push since), stamped on the push; None after a resume until the
    /// next answer (the server's V(m) then stands in).
    dyn_stamp: Vec<Option<u64>>,
    /// Rows received and not yet put into the replica, in order.
    inbox: Vec<Answer>,
    last_round: u64,
    manage: Option<Manage>,
    stats: CommStats,
    /// staleness_histogram[k] = reads with staleness k; the last bucket counts k > S (must stay 0).
    staleness_histogram: Vec<u64>,
    blocked_reads: u64,
}

/// A rows message received from shard server `src`: its header and rows.
struct Answer {
    src: usize,
    cmin: u64,
    flags: u64,
    /// Clocks of this worker the server had applied when it answered.
    applied: u64,
    /// The server's newest DynSGD version (cmax) then.
    version: u64,
    block: RowBlock,
}

/// What `--sync bosen` was asked for, beyond its SSP options.
pub struct BosenSetup<'a> {
    pub opts: &'a BosenOptions,
    /// `--lr-schedule adarevision`: the servers apply AdaRevision steps with alpha = `lr`.
    pub adarevision: bool,
    pub lr: f32,
}

impl StaleSynchronous {
    /// Collective set-up: every rank starts from the same initial model `init` (the replicas'
    /// common start), which also initialises the shards. With `bosen`, communication is managed.
    pub fn new(ctx: &SyncContext, opts: &SspOptions, init: &[f32], bosen: Option<BosenSetup>) -> anyhow::Result<Self> {
        let n = ctx.comm.size() as usize;
        let rank = ctx.comm.rank() as usize;
        let shards = shard_ranges(&ctx.layout, n);
        let row_ranges = shard_rows(&ctx.layout, n);
        let local_offsets: Vec<Vec<usize>> = row_ranges
            .iter()
            .zip(&shards)
            .map(|(rows, params)| ctx.layout.offsets[rows.start..=rows.end].iter().map(|o| o - params.start).collect())
            .collect();
        let mine = shards[rank].clone();
        let mut server = (!mine.is_empty())
            .then(|| ShardServer::new(mine.clone(), &init[mine.clone()], local_offsets[rank].clone(), n, opts.apply_rule(bosen.is_some()), opts.ssp_staleness()));
        let n_rows = ctx.layout.rows();
        if bosen.is_some() && opts.apply_rule(true) == ApplyRule::Dynsgd {
            bail!("--sync bosen pushes parts of a clock's update early, which DynSGD's per-version bookkeeping does not define: use --apply consgd (the default for bosen) or plain");
        }
        let budget = match &bosen {
            Some(b) => {
                let rate = b.opts.bandwidth_mbps.or(ctx.emulate.map(|e| e.0)).ok_or_else(|| {
                    anyhow::anyhow!("--sync bosen needs a per-rank budget: --bandwidth-mbps MBPS (or --emulate-bandwidth, which it then defaults to)")
                })?;
                Some(rate)
            }
            None => None,
        };
        let adarevision = bosen.as_ref().is_some_and(|b| b.adarevision);
        if let (Some(b), Some(sv)) = (&bosen, server.as_mut()) {
            let rows = sv.stamp.len();
            sv.change = vec![vec![0.0; rows]; n];
            if b.adarevision {
                sv.ada = Some(AdaShard {
                    rev: AdaRevision::new(b.lr, sv.rows.len()),
                    lr: b.lr,
                    version: vec![0; rows],
                    snapshots: BTreeMap::new(),
                    held_lo: vec![vec![0; rows]; n],
                    snapshots_peak: 0,
                    snapshot_misses: 0,
                });
            }
        }
        let manage = bosen.as_ref().map(|b| Manage {
            queue_size: b.opts.queue_size.max(1),
            fp16: b.opts.fp16,
            max_snapshots: b.opts.max_snapshots,
            client: Picker::new(b.opts.priority, ctx.seed ^ (rank as u64).wrapping_mul(0x9E37_79B9)),
            server: Picker::new(b.opts.priority, ctx.seed ^ ((rank as u64 + 1) << 32)),
            next_worker: 0,
            unacked_limit: 2 * n,
            quiet: false,
            horizon: Duration::ZERO,
            last_step: None,
            row_pushes: vec![0; n_rows],
            row_serves: vec![0; n_rows],
            early_pushes: 0,
            early_serves: 0,
            backoffs: 0,
            push_bytes: 0,
            pushed_values: 0,
        });
        Ok(StaleSynchronous {
            post: Postbox::new(ctx.comm).with_pacer(ctx.pacer(budget)).with_ingress(ctx.ingress()),
            rank,
            staleness: opts.ssp_staleness(),
            wait_timeout: ctx.wait_timeout,
            stop_sending_after: ctx.stop_sending_after,
            awaiting: vec![0; n],
            fresh_cmin: vec![0; n],
            in_flight: vec![VecDeque::new(); n],
            dyn_stamp: vec![Some(0); n],
            base: init.to_vec(),
            pending: adarevision.then(|| vec![0.0; init.len()]),
            held_version: vec![0; n_rows],
            residual: bosen.as_ref().is_some_and(|b| b.opts.fp16).then(|| vec![0.0; init.len()]),
            shards,
            row_ranges,
            local_offsets,
            server,
            inbox: Vec::new(),
            last_round: 0,
            manage,
            stats: CommStats::default(),
            staleness_histogram: vec![0; opts.ssp_staleness() as usize + 2],
            blocked_reads: 0,
        })
    }

    fn sending(&self, round: u64) -> bool {
        !matches!(self.stop_sending_after, Some((r, last)) if r == self.rank && round > last)
    }

    /// Bytes managed communication may send early now: what the budget carries by the
    /// horizon (the next local step), and at least one message when the bucket is empty; None
    /// when it may not send (quiet, stopped, the bucket full to the horizon, or sends not
    /// completing: that counts a back-off).
    fn early_room(&mut self) -> Option<f64> {
        let idle = self.post.link_idle();
        let unacked = self.post.unacknowledged();
        let sending = self.sending(self.last_round + 1);
        let Some(m) = self.manage.as_ref() else { return None };
        let room = self.post.room_within(m.horizon).unwrap_or(f64::INFINITY);
        if m.quiet || !sending || !(idle || room > 0.0) {
            return None;
        }
        let m = self.manage.as_mut().expect("checked");
        if unacked > m.unacked_limit {
            m.backoffs += 1;
            return None;
        }
        Some(room)
    }

    /// Takes every waiting message: pushes are applied (server), rows are kept for the worker;
    /// answers the reads that became answerable; with management, spends spare budget on
    /// pushing fresh rows to a client.
    fn serve(&mut self) -> anyhow::Result<()> {
        let mut changed = false;
        let half_ok = self.manage.as_ref().is_some_and(|m| m.fp16);
        while let Some((src, bytes)) = self.post.try_receive(TAG_PUSH) {
            let server = self.server.as_mut().ok_or_else(|| anyhow::anyhow!("rank {src} pushed to rank {} which serves no rows", self.rank))?;
            let (clock, want, flags, stamp) = (word_at(&bytes, 0)?, word_at(&bytes, 8)?, word_at(&bytes, 16)?, word_at(&bytes, 24)?);
            anyhow::ensure!(half_ok || flags & HALF == 0, "ssp protocol error: rank {src} pushed half precision unasked");
            let block = decode_rows(&bytes, 32, &server.offsets, flags & VERSIONS != 0, flags & HALF != 0)?;
            if flags & PARTIAL != 0 {
                // Part of the clock in progress, sent early: applied at once, clock not complete.
                server.apply_rows(src, clock, &block, None);
            } else {
                if stamp > 0 {
                    server.stamps.insert((clock, src), stamp - 1);
                }
                server.queued.insert((clock, src), block);
                server.reads.push((src, want));
            }
            changed = true;
        }
        while let Some((src, bytes)) = self.post.try_receive(TAG_ROWS) {
            let (cmin, flags, applied, version) = (word_at(&bytes, 0)?, word_at(&bytes, 8)?, word_at(&bytes, 16)?, word_at(&bytes, 24)?);
            let block = decode_rows(&bytes, 32, &self.local_offsets[src], flags & VERSIONS != 0, false)?;
            self.inbox.push(Answer { src, cmin, flags, applied, version, block });
        }
        let t = Instant::now();
        if changed {
            let chunk = self.manage.as_ref().map(|m| m.queue_size);
            let server = self.server.as_mut().expect("checked above");
            server.apply_queued()?;
            for (m, msg) in server.answerable(chunk) {
                self.post.send(m, TAG_ROWS, msg)?;
            }
        }
        self.push_fresh_rows()?;
        self.stats.comm_seconds += t.elapsed().as_secs_f64();
        self.post.progress_sends()?;
        self.stats.bytes_sent = self.post.bytes_sent();
        self.stats.bytes_received = self.post.bytes_received();
        Ok(())
    }

    /// Bosen server side: while the budget allows (up to the horizon), sends clients in turn the
    /// rows of this shard that changed most since they last got them (at most --queue-size rows
    /// a message, one message per client per call).
    fn push_fresh_rows(&mut self) -> anyhow::Result<()> {
        if self.server.is_none() {
            return Ok(());
        }
        let Some(mut room) = self.early_room() else { return Ok(()) };
        let (m, sv) = (self.manage.as_mut().expect("managed"), self.server.as_mut().expect("checked"));
        if sv.ada.as_ref().is_some_and(|a| a.snapshots.len() >= m.max_snapshots) {
            // Bosen: bandwidth-triggered sends stop while the snapshot store is full.
            return Ok(());
        }
        let n = sv.workers();
        let row0 = self.row_ranges[self.rank].start;
        let start = m.next_worker;
        for k in 0..n {
            let w = (start + k) % n;
            if w == self.rank {
                continue;
            }
            if room <= 0.0 {
                break;
            }
            let news = sv.news(w);
            if news.is_empty() {
                continue;
            }
            let cands: Vec<(u32, f32, f32)> = news
                .iter()
                .map(|&r| {
                    let range = sv.offsets[r as usize]..sv.offsets[r as usize + 1];
                    (r, sv.change[w][r as usize], sv.rows[range].iter().map(|x| x.abs()).sum())
                })
                .collect();
            let chosen = bosen::pick(&mut m.server, &cands, m.queue_size, sv.stamp.len());
            chosen.iter().for_each(|&r| m.row_serves[row0 + r as usize] += 1);
            let msg = sv.rows_message(w, [sv.clocks.min(), sv.clocks.of(w), sv.dyn_state.cmax], UNSOLICITED, &chosen);
            m.next_worker = (w + 1) % n;
            m.early_serves += 1;
            room -= msg.len() as f64;
            self.post.send(w, TAG_ROWS, msg)?;
        }
        Ok(())
    }

    /// AdaRevision: moves the replica's local changes into `pending` and restores the replica to
    /// the servers' values (the client cache is read-only; updates are applied only on servers).
    fn take_local_changes(&mut self, params: &mut [f32]) {
        if let Some(p) = self.pending.as_mut() {
            for ((q, w), b) in p.iter_mut().zip(params.iter_mut()).zip(&self.base) {
                *q += *w - *b;
                *w = *b;
            }
        }
    }

    /// The update of shard `s` not yet sent, by shard-local parameter.
    fn unsent(&self, params: &[f32], s: usize) -> Vec<f32> {
        let range = self.shards[s].clone();
        match &self.pending {
            Some(p) => p[range].to_vec(),
            None => params[range.clone()].iter().zip(&self.base[range]).map(|(p, b)| p - b).collect(),
        }
    }

    /// Pushes rows `rows` (local to shard `s`, values from `delta`) in one message and takes
    /// what was sent out of the unsent update.
    /// `header`: [clock, the read's want (0: none), DynSGD stamp + 1 (0: none)].
    fn push_rows(&mut self, params: &[f32], s: usize, rows: &[u32], delta: &[f32], header: [u64; 3], flags: u64) -> anyhow::Result<()> {
        let half = self.manage.as_ref().is_some_and(|m| m.fp16);
        let offsets = &self.local_offsets[s];
        let versions: Option<Vec<u64>> =
            self.pending.is_some().then(|| rows.iter().map(|&r| self.held_version[self.row_ranges[s].start + r as usize]).collect());
        let flags = flags | if half { HALF } else { 0 } | if versions.is_some() { VERSIONS } else { 0 };
        let mut msg = Vec::new();
        msg.extend_from_slice(&header[0].to_le_bytes());
        msg.extend_from_slice(&header[1].to_le_bytes());
        msg.extend_from_slice(&flags.to_le_bytes());
        msg.extend_from_slice(&header[2].to_le_bytes());
        let sent = encode_rows(&mut msg, offsets, rows, versions.as_deref(), delta, half);
        let start = self.shards[s].start;
        let mut at = 0;
        for &r in rows {
            let local = offsets[r as usize]..offsets[r as usize + 1];
            let global = start + local.start..start + local.end;
            match (&mut self.pending, half) {
                (Some(p), false) => p[global.clone()].iter_mut().for_each(|x| *x = 0.0),
                (Some(p), true) => p[global.clone()].iter_mut().zip(&sent[at..]).for_each(|(x, q)| *x -= q),
                // Sent exactly: nothing of these rows is left to send.
                (None, false) => self.base[global.clone()].copy_from_slice(&params[global.clone()]),
                (None, true) => self.base[global.clone()].iter_mut().zip(&sent[at..]).for_each(|(b, q)| *b += q),
            }
            if let Some(res) = self.residual.as_mut() {
                for j in global {
                    res[j] = match &self.pending {
                        Some(p) => p[j],
                        None => params[j] - self.base[j],
                    };
                }
            }
            at += local.len();
            if let Some(m) = self.manage.as_mut() {
                m.row_pushes[self.row_ranges[s].start + r as usize] += 1;
                m.pushed_values += local.len() as u64;
            }
        }
        if let Some(m) = self.manage.as_mut() {
            m.push_bytes += msg.len() as u64;
        }
        self.post.send(s, TAG_PUSH, msg)?;
        Ok(())
    }

    /// Bosen client side: when the budget allows, pushes the most significant rows of the
    /// update not yet sent: as many as the budget carries by the horizon (at least --queue-size
    /// rows when the bucket is empty), in messages of at most --queue-size rows per shard.
    fn push_early(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        let Some(room) = self.early_room() else { return Ok(()) };
        self.take_local_changes(params);
        let mut cands = Vec::new();
        let mut cand_values = 0usize;
        let mut deltas = Vec::with_capacity(self.shards.len());
        for s in 0..self.shards.len() {
            let delta = if self.shards[s].is_empty() { Vec::new() } else { self.unsent(params, s) };
            let offsets = &self.local_offsets[s];
            let start = self.shards[s].start;
            for r in 0..offsets.len().saturating_sub(1) {
                let row = &delta[offsets[r]..offsets[r + 1]];
                let d: f32 = row.iter().map(|x| x.abs()).sum();
                // In fp16 a value below 2^-25 encodes as zero: sending it would change nothing.
                let sendable = if self.residual.is_some() { row.iter().any(|x| x.abs() > F16_HALF_MIN) } else { d > 0.0 };
                if sendable {
                    let a: f32 = self.base[start + offsets[r]..start + offsets[r + 1]].iter().map(|x| x.abs()).sum();
                    cands.push(((self.row_ranges[s].start + r) as u32, d, a));
                    cand_values += row.len();
                }
            }
            deltas.push(delta);
        }
        let m = self.manage.as_mut().expect("managed");
        let k = early_rows(room, m.queue_size, cands.len(), cand_values, if m.fp16 { 2 } else { 4 });
        let mut chosen = bosen::pick(&mut m.client, &cands, k, self.base.len().max(1));
        if chosen.is_empty() {
            return Ok(());
        }
        m.early_pushes += 1;
        chosen.sort_unstable();
        let chunk = m.queue_size;
        let t = Instant::now();
        for (s, delta) in deltas.iter().enumerate() {
            let rr = self.row_ranges[s].clone();
            let local: Vec<u32> = chosen.iter().filter(|&&r| rr.contains(&(r as usize))).map(|&r| r - rr.start as u32).collect();
            for part in local.chunks(chunk) {
                self.push_rows(params, s, part, delta, [self.last_round, 0, 0], PARTIAL)?;
            }
        }
        self.stats.comm_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Serves until `done(self)` holds, counting the time as waiting; past `--wait-timeout` fails
    /// with `what(self)` (said at that moment: what it still waits for), what this rank's shard
    /// lacks, and the verdict of the sign-of-life board (see [`ps::serve_until`]).
    fn wait_until(&mut self, what: impl Fn(&Self) -> String, done: impl Fn(&Self) -> bool) -> anyhow::Result<()> {
        // Yield (not sleep) for a while: the answer usually comes from a rank that only needs
        // the CPU for one step, and sleeping 1 ms per clock made S = 0 take 2.1 s instead of
        // 0.75 s for 938 clocks at 4 ranks on 2 cores.
        let backoff = Backoff::with_yield_window(Duration::from_millis(20));
        let limit = self.wait_timeout;
        let waited = ps::serve_until(self, limit, backoff, Self::serve, done, |s, waited, why| s.waited_too_long(waited, &what(s), why))?;
        self.stats.wait_seconds += waited.as_secs_f64();
        Ok(())
    }

    /// The error of a wait for `what` that ran past `--wait-timeout`: when this rank's shard
    /// holds reads back, the ranks whose updates it lacks (facts, not blame: they may be alive
    /// and waiting themselves); then `why`, the board's verdict on who holds it up.
    fn waited_too_long(&self, waited: Duration, what: &str, why: &str) -> anyhow::Error {
        let behind = match &self.server {
            Some(s) if !s.reads.is_empty() || !s.queued.is_empty() => format!(
                "; this rank's shard has every update of clocks < {} and lacks the updates of ranks {:?} \
                 (clocks pushed per rank {:?}, reads deferred {:?}, pushes queued {:?})",
                s.clocks.min(),
                s.laggards(),
                s.clocks.all(),
                s.reads,
                s.queued.keys().collect::<Vec<_>>()
            ),
            _ => String::new(),
        };
        anyhow::anyhow!("rank {}: waited {:.1} s (--wait-timeout) for {what}{behind}: {why}", self.rank, waited.as_secs_f64())
    }

    /// Ranks that have not pushed `clock` clocks to this rank's shard.
    fn behind(&self, clock: u64) -> Vec<usize> {
        self.server.as_ref().map_or(Vec::new(), |s| s.clocks.behind(clock))
    }

    /// Puts every received row into the replica (keeping the update not yet sent on top) and
    /// records each answered read's staleness.
    fn absorb(&mut self, params: &mut [f32]) {
        for a in std::mem::take(&mut self.inbox) {
            let src = a.src;
            if a.flags & UNSOLICITED == 0 {
                self.awaiting[src] = self.awaiting[src].saturating_sub(1);
                self.fresh_cmin[src] = self.fresh_cmin[src].max(a.cmin);
                self.dyn_stamp[src] = Some(a.version);
                // The server had applied this worker's clocks < `applied`: those pushes are in
                // the rows now; later ones go back on top of them.
                while self.in_flight[src].front().is_some_and(|(c, _)| *c < a.applied) {
                    self.in_flight[src].pop_front();
                }
            }
            let (start, offsets) = (self.shards[src].start, &self.local_offsets[src]);
            let mine = &self.in_flight[src];
            let mut at = 0;
            for (k, &r) in a.block.rows.iter().enumerate() {
                let local = offsets[r as usize]..offsets[r as usize + 1];
                let range = start + local.start..start + local.end;
                let n = range.len();
                for (j, ((w, b), &v)) in params[range.clone()].iter_mut().zip(&mut self.base[range]).zip(&a.block.values[at..at + n]).enumerate() {
                    let own: f32 = mine.iter().map(|(_, u)| u[local.start + j]).sum();
                    *w = v + own + (*w - *b);
                    *b = v + own;
                }
                if let Some(&v) = a.block.versions.get(k) {
                    self.held_version[self.row_ranges[src].start + r as usize] = v;
                }
                at += n;
            }
        }
    }

    /// Lazy reads (`--sync ssp` with S > 0): a worker starts a clock without the answer to its
    /// last read when the rows it holds already satisfy the bound (Algorithm 1 of the
    /// heterogeneity paper pulls only then). Waiting for every answer made each clock wait for
    /// every shard server to finish its own step (a server answers between its steps): measured
    /// with 8 ranks, 20 ms emulated steps, no stragglers, 120 clocks of MLR: S = 3 took 4.12 s
    /// of training and 1.69 s of sync per rank, against 2.91 s and 0.47 s at S = 0, with all
    /// 960 reads blocked.
    fn lazy_reads(&self) -> bool {
        self.staleness > 0 && self.manage.is_none()
    }

    /// Waits for the answers to this rank's reads and puts the rows into the replica.
    /// With `all`, waits for every answer; otherwise (lazy reads) only for those the bound
    /// needs: every shard's rows must hold the updates of clocks < `clock` - S.
    fn complete_reads(&mut self, params: &mut [f32], clock: u64, all: bool) -> anyhow::Result<()> {
        if !self.awaiting.iter().any(|&a| a > 0) {
            return Ok(());
        }
        let lazy = !all && self.lazy_reads();
        let missing = |s: &Self| -> Vec<usize> {
            let answers = |r: usize| s.inbox.iter().filter(move |a| a.src == r && a.flags & UNSOLICITED == 0);
            (0..s.awaiting.len())
                .filter(|&r| {
                    let outstanding = s.awaiting[r] as usize > answers(r).count();
                    let fresh = answers(r).map(|a| a.cmin).max().unwrap_or(0).max(s.fresh_cmin[r]);
                    outstanding && (!lazy || fresh + s.staleness < clock)
                })
                .collect()
        };
        if !missing(self).is_empty() {
            self.blocked_reads += 1;
            self.wait_until(
                |s| format!("the rows of clock {clock} from the shard servers on ranks {:?}", missing(s)),
                |s| missing(s).is_empty(),
            )?;
        }
        self.absorb(params);
        // The staleness this clock computes with, per shard: clock - cmin of the newest rows.
        for r in (0..self.shards.len()).filter(|&r| !self.shards[r].is_empty()) {
            let st = clock.saturating_sub(self.fresh_cmin[r]) as usize;
            self.staleness_histogram[st.min(self.staleness as usize + 1)] += 1;
        }
        Ok(())
    }

    /// Waits until this rank's shard holds every update of clocks < `clock` and every message
    /// this rank sent is delivered. With management, early sends stop first, and the rank keeps
    /// receiving until every rank has got that far: a server's early push may be on its way to a
    /// rank that is already done, and must still be taken (or its send never completes).
    fn drain(&mut self, params: &mut [f32], clock: u64) -> anyhow::Result<()> {
        if let Some(m) = self.manage.as_mut() {
            m.quiet = true;
        }
        self.complete_reads(params, clock, true)?;
        if self.server.is_some() {
            self.wait_until(|s| format!("the updates up to clock {} of ranks {:?}", clock.saturating_sub(1), s.behind(clock)), |s| {
                s.server.as_ref().is_some_and(|sv| sv.clocks.min() >= clock)
            })?;
        }
        let timeout = self.wait_timeout;
        let start = Instant::now();
        if self.manage.is_some() {
            // Every message of this rank handed to MPI and delivered (paced ones are held back
            // until their time), while serving; then the barrier, still serving.
            self.wait_until(|s| format!("{} message(s) of this rank to be delivered", s.post.unacknowledged()), |s| s.post.link_idle() && s.post.unacknowledged() == 0)?;
            let mut barrier = self.post.start_barrier()?;
            let mut backoff = Backoff::with_yield_window(Duration::from_millis(20));
            let mut deadline = WaitDeadline::new(timeout);
            while !self.post.barrier_done(&mut barrier)? {
                let mut failed = None;
                let verdict = deadline.check(|| {
                    if failed.is_none() {
                        failed = self.serve().err();
                    }
                });
                if let Some(e) = failed {
                    return Err(e);
                }
                if let Some(why) = verdict {
                    if !self.post.barrier_done(&mut barrier)? {
                        bail!("rank {}: waited {:.1} s (--wait-timeout) for every rank to finish its clock {clock}: {why}", self.rank, deadline.waited().as_secs_f64());
                    }
                }
                backoff.pause();
                self.serve()?;
                self.absorb(params);
            }
        }
        self.post.flush_sends(timeout, |_| Ok(()))?;
        self.serve()?;
        self.absorb(params);
        self.stats.wait_seconds += start.elapsed().as_secs_f64();
        Ok(())
    }
}

/// Rows a client's early push takes: as many of the `cands` candidate rows (`values` values
/// between them, `value_bytes` each on the wire, plus a 4-byte row index) as `room` bytes hold,
/// and at least `queue_size` (the one message a bucket that is empty now may always take).
fn early_rows(room: f64, queue_size: usize, cands: usize, values: usize, value_bytes: usize) -> usize {
    if cands == 0 {
        return 0;
    }
    let per_row = 4.0 + (values * value_bytes) as f64 / cands as f64;
    let fit = if room.is_finite() { (room / per_row) as usize } else { cands };
    fit.max(queue_size).min(cands)
}

fn floats<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

fn counts(v: &[u64]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

impl SyncMode for StaleSynchronous {
    fn name(&self) -> &'static str {
        if self.manage.is_some() {
            "bosen"
        } else {
            "ssp"
        }
    }

    fn lockstep(&self) -> bool {
        // S = 0 waits for every worker each clock, but a rank's last pushes of a clock may still
        // be held in this process (a bosen budget or an emulated link paces them; an emulated
        // inbound link delays their delivery). Evaluated at once, a rank whose shard was ready
        // went into the evaluation's allreduce holding pushes that another shard waited for:
        // `--sync ssp --staleness 0 --emulate-bandwidth 10` and bosen at S = 0 (also a default
        // fitted to 0) hung at the first evaluation, 4 ranks, MovieLens 2,000 ratings. With held
        // messages the evaluation waits for a cut instead (`quiesce`), as at S > 0.
        self.staleness == 0 && self.post.pacer().is_none() && self.post.ingress().is_none()
    }

    fn round_lead(&self) -> u64 {
        self.staleness + 1
    }

    fn before_step(&mut self, params: &mut [f32], clock: u64) -> anyhow::Result<()> {
        if let Some(m) = self.manage.as_mut() {
            let now = Instant::now();
            m.horizon = m.last_step.map_or(Duration::ZERO, |t| (now - t).min(MAX_HORIZON));
            m.last_step = Some(now);
            self.take_local_changes(params);
            self.serve()?;
            self.absorb(params);
            self.complete_reads(params, clock, false)?;
            return self.push_early(params);
        }
        self.complete_reads(params, clock, false)
    }

    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let t = Instant::now();
        let clock = round - 1;
        if let Some(m) = self.manage.as_mut() {
            m.quiet = false;
        }
        self.take_local_changes(params);
        if self.sending(round) {
            let want = round.saturating_sub(self.staleness);
            let chunk = self.manage.as_ref().map_or(usize::MAX, |m| m.queue_size);
            for s in 0..self.shards.len() {
                if self.shards[s].is_empty() {
                    continue;
                }
                // The rows this worker changed and has not sent yet, as updates; the last
                // message of the clock carries the read request.
                let delta = self.unsent(params, s);
                let offsets = &self.local_offsets[s];
                let start = self.shards[s].start;
                let touched = |r: usize| -> bool {
                    let (a, b) = (offsets[r], offsets[r + 1]);
                    match &self.residual {
                        Some(res) => delta[a..b] != res[start + a..start + b],
                        None => delta[a..b].iter().any(|&d| d != 0.0),
                    }
                };
                let changed: Vec<u32> = (0..offsets.len() - 1).filter(|&r| touched(r)).map(|r| r as u32).collect();
                let mut parts: Vec<&[u32]> = changed.chunks(chunk).collect();
                let last = parts.pop().unwrap_or(&[]);
                for part in parts {
                    self.push_rows(params, s, part, &delta, [clock, 0, 0], PARTIAL)?;
                }
                let stamp = self.dyn_stamp[s].map_or(0, |v| v + 1);
                self.push_rows(params, s, last, &delta, [clock, want, stamp], 0)?;
                self.dyn_stamp[s] = self.dyn_stamp[s].map(|v| v + 1);
                if self.lazy_reads() {
                    self.in_flight[s].push_back((clock, delta));
                }
                self.awaiting[s] += 1;
            }
        }
        self.stats.comm_seconds += t.elapsed().as_secs_f64();
        self.serve()?;
        self.last_round = round;
        self.stats.rounds += 1;
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        let clock = self.last_round;
        self.drain(params, clock)?;
        // The final model is the servers' model: each rank contributes its shard.
        let server = &self.server;
        super::assemble_parts(self.post.comm(), params, &mut self.stats, |p| {
            if let Some(s) = server {
                p[s.range.clone()].copy_from_slice(&s.rows);
            }
        });
        Ok(())
    }

    fn mark_evaluation(&mut self, round: u64) {
        if let Some(s) = self.server.as_mut() {
            s.snapshots.mark(round, s.clocks.min(), &s.rows);
        }
    }

    fn evaluated_model(&mut self, round: u64) -> anyhow::Result<Option<Vec<f32>>> {
        let n_params = self.base.len();
        let mut part = vec![0f32; n_params];
        if self.server.is_some() {
            self.wait_until(|s| format!("the updates up to clock {} of rank(s) {:?} (evaluation)", round.saturating_sub(1), s.behind(round)), |s| {
                s.server.as_ref().is_some_and(|sv| sv.snapshots.ready(round))
            })?;
            let s = self.server.as_mut().expect("checked");
            let rows = s.snapshots.take(round).expect("waited for it");
            part[s.range.clone()].copy_from_slice(&rows);
        }
        Ok(Some(part))
    }

    fn quiesce(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        // No early sends until the next clock (`drain` stops them): they would cross the cut.
        self.drain(params, round)
    }

    fn save_state(&self) -> ModeState {
        let mut st: ModeState = vec![
            ("awaiting".into(), self.awaiting.iter().map(|&a| a as f64).collect()),
            ("dyn_stamp".into(), self.dyn_stamp.iter().map(|v| v.map_or(0.0, |v| v as f64 + 1.0)).collect()),
        ];
        if self.manage.is_some() {
            st.push(("base".into(), floats(&self.base)));
            st.push(("held_version".into(), counts(&self.held_version)));
            if let Some(p) = &self.pending {
                st.push(("pending".into(), floats(p)));
            }
        }
        if let Some(s) = &self.server {
            st.push(("shard_rows".into(), floats(&s.rows)));
            st.push(("shard_completed".into(), counts(s.clocks.all())));
            st.push(("shard_stamp".into(), counts(&s.stamp)));
            st.push(("shard_sent".into(), s.sent.iter().flat_map(|v| counts(v)).collect()));
            st.push(("shard_seq".into(), vec![s.seq as f64]));
            let d = &s.dyn_state;
            st.push(("dyn_version".into(), counts(&d.version)));
            st.push(("dyn_cmax".into(), vec![d.cmax as f64]));
            st.push(("dyn_live".into(), d.updates.iter().flat_map(|(&v, (sv, _))| [v as f64, *sv as f64]).collect()));
            st.push(("dyn_updates".into(), d.updates.values().flat_map(|(_, u)| floats(u)).collect()));
            if let Some(a) = &s.ada {
                st.push(("ada_g_sum".into(), floats(&a.rev.g_sum)));
                st.push(("ada_z".into(), floats(&a.rev.z)));
                st.push(("ada_z_max".into(), floats(&a.rev.z_max)));
                st.push(("ada_version".into(), counts(&a.version)));
                st.push(("ada_held_lo".into(), a.held_lo.iter().flat_map(|v| counts(v)).collect()));
                st.push(("ada_snapshot_keys".into(), a.snapshots.keys().flat_map(|&(r, v)| [r as f64, v as f64]).collect()));
                st.push(("ada_snapshots".into(), a.snapshots.values().flat_map(|g| floats(g)).collect()));
            }
        }
        st
    }

    fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        let mode = self.name();
        let get = |name: &str| -> anyhow::Result<&Vec<f64>> {
            state.iter().find(|(k, _)| k == name).map(|(_, v)| v).ok_or_else(|| anyhow::anyhow!("the checkpoint lacks {mode} state {name:?}"))
        };
        let same_len = |name: &str, got: usize, want: usize| -> anyhow::Result<()> {
            anyhow::ensure!(got == want, "the checkpoint's {name} has {got} values, this run needs {want} (another model or rank count?)");
            Ok(())
        };
        let to_u64 = |v: &[f64]| -> Vec<u64> { v.iter().map(|&c| c as u64).collect() };
        anyhow::ensure!(get("awaiting")?.iter().all(|&a| a == 0.0), "the checkpoint was taken with reads in flight");
        // Checkpoints written before stamps existed: the servers' V(m) stands in until the next answer.
        self.dyn_stamp = match get("dyn_stamp") {
            Ok(v) => v.iter().map(|&x| (x > 0.0).then(|| x as u64 - 1)).collect(),
            Err(_) => vec![None; self.dyn_stamp.len()],
        };
        if self.manage.is_some() {
            let base = get("base")?;
            same_len("base", base.len(), self.base.len())?;
            self.base = base.iter().map(|&x| x as f32).collect();
            self.held_version = to_u64(get("held_version")?);
            if let Some(p) = self.pending.as_mut() {
                let saved = get("pending")?;
                same_len("pending", saved.len(), p.len())?;
                *p = saved.iter().map(|&x| x as f32).collect();
            }
        }
        if let Some(s) = self.server.as_mut() {
            let rows = get("shard_rows")?;
            same_len("shard", rows.len(), s.rows.len())?;
            s.rows = rows.iter().map(|&x| x as f32).collect();
            s.clocks = WorkerClocks::from_clocks(to_u64(get("shard_completed")?));
            s.stamp = to_u64(get("shard_stamp")?);
            same_len("row stamps", s.stamp.len(), s.offsets.len() - 1)?;
            let sent = get("shard_sent")?;
            same_len("sent rows", sent.len(), s.workers() * s.stamp.len())?;
            s.sent = sent.chunks(s.stamp.len().max(1)).map(to_u64).collect();
            s.sent.resize(s.workers(), Vec::new());
            s.seq = get("shard_seq")?.first().map_or(0, |&c| c as u64);
            let d = &mut s.dyn_state;
            d.version = to_u64(get("dyn_version")?);
            d.cmax = get("dyn_cmax")?.first().map_or(0, |&c| c as u64);
            let live = get("dyn_live")?;
            let ups = get("dyn_updates")?;
            let len = s.rows.len();
            anyhow::ensure!(ups.len() == live.len() / 2 * len, "the checkpoint's DynSGD versions do not match its shard");
            d.updates = live
                .chunks_exact(2)
                .zip(ups.chunks_exact(len.max(1)))
                .map(|(vs, u)| (vs[0] as u64, (vs[1] as u64, u.iter().map(|&x| x as f32).collect())))
                .collect();
            if let Some(a) = s.ada.as_mut() {
                let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
                a.rev.g_sum = f32s(get("ada_g_sum")?);
                a.rev.z = f32s(get("ada_z")?);
                a.rev.z_max = f32s(get("ada_z_max")?);
                same_len("AdaRevision state", a.rev.g_sum.len(), len)?;
                a.version = to_u64(get("ada_version")?);
                let held = get("ada_held_lo")?;
                same_len("AdaRevision holders", held.len(), s.clocks.len() * s.stamp.len())?;
                a.held_lo = held.chunks(s.stamp.len().max(1)).map(to_u64).collect();
                let keys = get("ada_snapshot_keys")?;
                let snaps = get("ada_snapshots")?;
                a.snapshots.clear();
                let mut at = 0;
                for k in keys.chunks_exact(2) {
                    let r = k[0] as usize;
                    anyhow::ensure!(r + 1 < s.offsets.len(), "the checkpoint's AdaRevision snapshot names row {r} outside the shard");
                    let n = s.offsets[r + 1] - s.offsets[r];
                    let g = snaps.get(at..at + n).ok_or_else(|| anyhow::anyhow!("the checkpoint's AdaRevision snapshots are truncated"))?;
                    a.snapshots.insert((r as u32, k[1] as u64), f32s(g));
                    at += n;
                }
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
        let reads: u64 = self.staleness_histogram.iter().sum();
        let max_seen = self.staleness_histogram.iter().rposition(|&c| c > 0).unwrap_or(0);
        let mean = if reads > 0 {
            self.staleness_histogram.iter().enumerate().map(|(k, &c)| (k as u64 * c) as f64).sum::<f64>() / reads as f64
        } else {
            0.0
        };
        let mut out = vec![
            ModeMetric::array("staleness_histogram", Aggregate::Sum, self.staleness_histogram.iter().map(|&c| c as f64)),
            ModeMetric::number("reads", Aggregate::Sum, reads as f64),
            ModeMetric::number("blocked_reads", Aggregate::Sum, self.blocked_reads as f64),
            ModeMetric::number("max_staleness", Aggregate::Max, max_seen as f64),
            ModeMetric::number("mean_staleness", Aggregate::Mean, mean),
            ModeMetric::number("staleness_bound", Aggregate::Max, self.staleness as f64),
            ModeMetric::number(
                "dynsgd_live_versions_max",
                Aggregate::Max,
                self.server.as_ref().map_or(0, |s| s.max_live_versions) as f64,
            ),
        ];
        if let Some(m) = &self.manage {
            out.push(ModeMetric::number("early_pushes", Aggregate::Sum, m.early_pushes as f64));
            out.push(ModeMetric::number("early_row_serves", Aggregate::Sum, m.early_serves as f64));
            out.push(ModeMetric::number("backoffs", Aggregate::Sum, m.backoffs as f64));
            out.push(ModeMetric::number("push_bytes", Aggregate::Sum, m.push_bytes as f64));
            out.push(ModeMetric::number("pushed_values", Aggregate::Sum, m.pushed_values as f64));
            // Bosen Figure 5a as data: how often each row went out (client pushes, server pushes).
            out.push(ModeMetric::array("row_pushes", Aggregate::Sum, counts(&m.row_pushes)));
            out.push(ModeMetric::array("row_serves", Aggregate::Sum, counts(&m.row_serves)));
            let ada = self.server.as_ref().and_then(|s| s.ada.as_ref());
            if self.pending.is_some() {
                out.push(ModeMetric::number("adarevision_snapshots_max", Aggregate::Max, ada.map_or(0, |a| a.snapshots_peak) as f64));
                out.push(ModeMetric::number("adarevision_snapshot_misses", Aggregate::Sum, ada.map_or(0, |a| a.snapshot_misses) as f64));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_staleness_is_bounded_by_an_epoch_and_a_given_one_is_kept() {
        let mut o = SspOptions::default();
        assert!(o.fit_to_epoch(4).is_none() && o.staleness.is_none(), "4 rounds an epoch: the default 3 stands");
        let why = o.fit_to_epoch(2).expect("2 rounds an epoch bound it");
        assert_eq!(o.ssp_staleness(), 1, "{why}");
        let mut o = SspOptions::default();
        o.fit_to_epoch(1);
        assert_eq!(o.ssp_staleness(), 0, "one round an epoch: BSP");
        let mut o = SspOptions { staleness: Some(3), ..SspOptions::default() };
        assert!(o.fit_to_epoch(1).is_none() && o.ssp_staleness() == 3, "given: kept");
    }

    fn server(rule: ApplyRule, n: usize, staleness: u64) -> ShardServer {
        ShardServer::new(0..1, &[0.0], vec![0, 1], n, rule, staleness)
    }

    fn block(rows: Vec<u32>, values: Vec<f32>) -> RowBlock {
        RowBlock { rows, versions: Vec::new(), values }
    }

    #[test]
    fn consgd_and_dynsgd_average_a_bsp_clock_and_plain_adds() {
        for (rule, want) in [(ApplyRule::Plain, 6.0), (ApplyRule::Consgd, 2.0), (ApplyRule::Dynsgd, 2.0)] {
            let mut s = server(rule, 3, 0);
            for (m, u) in [(2, 3.0), (0, 1.0), (1, 2.0)] {
                s.queued.insert((0, m), block(vec![0], vec![u]));
                s.apply_queued().unwrap();
            }
            assert_eq!(s.rows, vec![want], "{rule:?}");
            assert_eq!(s.clocks.min(), 1);
        }
    }

    /// The paper's Appendix C example, first steps: W1 pushes a (version 0), W2 pushes b, then W3
    /// c, W4 d: u(PS,0) is the running mean; W1 pulls (V(1) = cmax = 1) and pushes e (version 1,
    /// staleness 1); W4 ... here with scalars.
    #[test]
    fn dynsgd_scales_by_staleness_per_version() {
        let mut s = server(ApplyRule::Dynsgd, 4, 3);
        let push = |s: &mut ShardServer, m: usize, c: u64, u: f32| {
            s.queued.insert((c, m), block(vec![0], vec![u]));
            s.apply_queued().unwrap();
        };
        push(&mut s, 0, 0, 4.0); // d = 1: w = 4
        assert_eq!(s.rows[0], 4.0);
        push(&mut s, 1, 0, 8.0); // d = 2: w = (4 + 8) / 2
        assert_eq!(s.rows[0], 6.0);
        // Worker 0 reads: the answer carries cmax = 1, the version its next update is stamped with.
        s.reads.push((0, 0));
        let answers = s.answerable(None);
        assert_eq!(answers.len(), 1);
        assert_eq!(word_at(&answers[0].1, 24).unwrap(), 1);
        s.stamps.insert((1, 0), 1);
        push(&mut s, 0, 1, 2.0); // version 1, d = 1: w = 6 + 2
        assert_eq!(s.rows[0], 8.0);
        push(&mut s, 2, 0, 12.0); // version 0, d = 3: u(PS,0) = (4 + 8 + 12) / 3 = 8, w = 8 + 2
        assert_eq!(s.rows[0], 10.0);
        push(&mut s, 3, 0, 0.0); // version 0, d = 4: u(PS,0) = 6, w = 6 + 2
        assert_eq!(s.rows[0], 8.0);
        // Workers 1..3 are at version 1 now, worker 0 at 2: version 0 is freed.
        assert!(!s.dyn_state.updates.contains_key(&0));
        assert_eq!(s.clocks.min(), 1);
    }

    /// A stamp below V(m) (the worker's newest answer predates its last pushes) goes into
    /// version V(m): a worker adds at most one update to a version, and a freed version never
    /// comes back at S = 1. Checked against the sum every version contributes, its mean.
    #[test]
    fn dynsgd_never_stamps_a_worker_back_into_a_version_it_passed() {
        let mut s = server(ApplyRule::Dynsgd, 2, 3);
        let push = |s: &mut ShardServer, m: usize, c: u64, stamp: u64, u: f32| {
            s.stamps.insert((c, m), stamp);
            s.queued.insert((c, m), block(vec![0], vec![u]));
            s.apply_queued().unwrap();
        };
        push(&mut s, 0, 0, 0, 4.0);
        push(&mut s, 1, 0, 0, 8.0); // version 0: (4 + 8) / 2; both V = 1, version 0 freed
        assert!(!s.dyn_state.updates.contains_key(&0));
        push(&mut s, 0, 1, 1, 2.0); // version 1
        push(&mut s, 0, 2, 0, 10.0); // stale stamp 0: version 2, not a fresh version 0
        assert!(!s.dyn_state.updates.contains_key(&0));
        push(&mut s, 1, 1, 1, 6.0); // version 1: (2 + 6) / 2
        push(&mut s, 1, 2, 2, 30.0); // version 2: (10 + 30) / 2
        assert_eq!(s.rows[0], 6.0 + 4.0 + 20.0);
        assert_eq!(s.dyn_state.version, vec![3, 3]);
    }

    /// An answer carries only the rows that changed since the worker's previous answer.
    #[test]
    fn answers_carry_only_rows_changed_since_the_last_read() {
        let mut s = ShardServer::new(0..3, &[0.0; 3], vec![0, 1, 2, 3], 2, ApplyRule::Plain, 1);
        s.queued.insert((0, 0), block(vec![1], vec![5.0]));
        s.apply_queued().unwrap();
        s.reads.push((1, 0));
        let a = s.answerable(None);
        let b = decode_rows(&a[0].1, 32, &s.offsets, false, false).unwrap();
        assert_eq!((b.rows, b.values), (vec![1], vec![5.0]));
        s.reads.push((1, 0));
        let b = decode_rows(&s.answerable(None)[0].1, 32, &s.offsets, false, false).unwrap();
        assert!(b.rows.is_empty(), "nothing new since the last answer");
    }

    #[test]
    fn reads_wait_for_the_staleness_bound() {
        let mut s = server(ApplyRule::Plain, 2, 1);
        s.reads.push((0, 1));
        assert!(s.answerable(None).is_empty(), "cmin 0 < want 1");
        s.queued.insert((0, 0), block(vec![0], vec![1.0]));
        s.apply_queued().unwrap();
        assert!(s.answerable(None).is_empty(), "rank 1 has not pushed clock 0");
        s.queued.insert((0, 1), block(vec![0], vec![1.0]));
        s.apply_queued().unwrap();
        let a = s.answerable(None);
        assert_eq!(a.len(), 1);
        assert_eq!(u64::from_le_bytes(a[0].1[0..8].try_into().unwrap()), 1);
    }
}

/// `--sync ssp`'s declaration (see [`super::ModeSpec`]); `--sync bosen` (bosen.rs) is built on
/// the same parameter server with its budget.
pub const MODE: super::ModeSpec = super::ModeSpec {
    uses: &[(&[], &["SspOptions"])],
    resolve: |o| resolve_ps(o, false),
    fit_to_epoch: |o, rounds| o.ssp.fit_to_epoch(rounds),
    build_counts: Some(ssp_counts),
    ..super::ModeSpec::new(
        "ssp",
        "Stale synchronous parallel on parameter-server row shards hosted by the ranks themselves",
        |ctx, run, init| build_ps(ctx, run, init, false),
    )
};

fn ssp_counts(ctx: &SyncContext, run: &super::RunSpec, init: &[f32]) -> anyhow::Result<Box<dyn SyncMode>> {
    build_ps_counts(ctx, run, init, false)
}

/// The staleness bound and apply rule in force (ssp's defaults, or bosen's with `bosen`).
pub(crate) fn resolve_ps(o: &mut super::ModeOptions, bosen: bool) {
    (o.ssp.staleness, o.ssp.apply) = (Some(o.ssp.ssp_staleness()), Some(o.ssp.apply_rule(bosen)));
}

/// The parameter-server mode of `--sync ssp`, or of `--sync bosen` with `bosen`.
pub(crate) fn build_ps(ctx: &SyncContext, run: &super::RunSpec, init: &[f32], bosen: bool) -> super::Built {
    let o = run.opts;
    let shards = shard_ranges(&ctx.layout, ctx.comm.size() as usize);
    let mut info = serde_json::json!({"staleness": o.ssp.ssp_staleness(), "apply": o.ssp.apply_rule(bosen),
                                      "shard_params": shards.iter().map(|r| r.len()).collect::<Vec<_>>()});
    let setup = bosen.then(|| {
        info["bosen"] = serde_json::json!(o.bosen);
        BosenSetup { opts: &o.bosen, adarevision: run.adarevision, lr: run.lr }
    });
    Ok((Box::new(StaleSynchronous::new(ctx, &o.ssp, init, setup)?), info))
}

/// The parameter-server mode for `--model lda`'s count deltas, which the servers must add as they
/// are (`--apply plain`), exactly.
pub(crate) fn build_ps_counts(ctx: &SyncContext, run: &super::RunSpec, init: &[f32], bosen: bool) -> anyhow::Result<Box<dyn SyncMode>> {
    let o = run.opts;
    anyhow::ensure!(
        o.ssp.apply.is_none_or(|a| a == ApplyRule::Plain),
        "--model lda pushes count deltas that the servers must add as they are: --apply plain (the default for lda), not {:?}",
        o.ssp.apply.expect("checked")
    );
    let opts = SspOptions { apply: Some(ApplyRule::Plain), ..o.ssp.clone() };
    if bosen {
        anyhow::ensure!(!o.bosen.fp16, "--fp16 with --model lda: binary16 holds integers exactly only up to 2048, and count deltas must arrive exactly");
        anyhow::ensure!(!run.adarevision, "--lr-schedule adarevision with --model lda: a Gibbs sampler takes no gradient steps");
    }
    let setup = bosen.then_some(BosenSetup { opts: &o.bosen, adarevision: false, lr: run.lr });
    Ok(Box::new(StaleSynchronous::new(ctx, &opts, init, setup)?))
}
