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
//!   Before its first step of a clock the worker waits for the answers (the read gate) and
//!   records each read's staleness `c - cmin` (in [0, S]).
//! - **Apply rules**: plain (w += u), ConSGD (w += u/M) and DynSGD (per-version staleness
//!   scaling with V(m), S(v), u(PS,v), Algorithm 2 of the paper; versions every worker has passed
//!   are freed).
//! - **Order**: with S = 0 a shard applies the pushes of a clock in worker order once all have
//!   arrived (nobody may read before then anyway), so runs and resumed runs are bit-identical;
//!   with S > 0 pushes are applied as they arrive, which is the point of SSP (fresher reads).
//! - **Transport**: two-sided messages ([`Postbox`]): a shard server must run code when an update
//!   arrives (the DynSGD bookkeeping, deferred reads), and a worker may run up to S clocks ahead,
//!   so updates queue per edge; docs/sync-modes.md has the measurement behind the choice. Every
//!   wait keeps serving other ranks' pushes, and gives up after `--wait-timeout` naming the ranks
//!   whose clocks are behind.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::bail;
use mpi::topology::Communicator;

use super::{Aggregate, CommStats, ModeMetric, ModeState, SyncContext, SyncMode};
use crate::comm::mailbox::Backoff;
use crate::comm::postbox::Postbox;
use crate::model::RowLayout;

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
    /// Staleness bound S: a worker at clock c reads only rows holding every update of clocks
    /// <= c-S-1 (waiting otherwise). 0 is BSP.
    #[arg(long, value_name = "S", default_value_t = 3)]
    pub staleness: u64,
    /// Server-side rule: plain (add updates), consgd (scale by 1/M), dynsgd (scale by
    /// 1/staleness per model version).
    #[arg(long, value_enum, default_value_t = ApplyRule::Dynsgd)]
    pub apply: ApplyRule,
}

impl Default for SspOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// Worker -> server: `[clock u64][want u64]` + sparse rows (the rows this worker changed).
const TAG_PUSH: i32 = 11;
/// Server -> worker: `[cmin u64]` + sparse rows (the rows changed since this worker's last read).
const TAG_ROWS: i32 = 12;

/// Appends sparse rows to a message: `[count u64][local row index u32 ...][values f32 ...]`, the
/// values of the listed rows in order. Sparse because a mini-batch touches few rows of a big
/// model: MF on MovieLens changes at most 64 of 9,737 rows per step, and dense pushes and
/// answers sent 9 GB per rank where the changed rows are a few percent of that.
pub(super) fn encode_rows(msg: &mut Vec<u8>, offsets: &[usize], rows: &[u32], values: &[f32]) {
    msg.extend_from_slice(&(rows.len() as u64).to_le_bytes());
    rows.iter().for_each(|r| msg.extend_from_slice(&r.to_le_bytes()));
    for &r in rows {
        let r = r as usize;
        values[offsets[r]..offsets[r + 1]].iter().for_each(|x| msg.extend_from_slice(&x.to_le_bytes()));
    }
}

/// Reads what [`encode_rows`] wrote (after `skip` header bytes), checked against the shard's
/// row offsets: `(rows, values of those rows in order)`.
pub(super) fn decode_rows(bytes: &[u8], skip: usize, offsets: &[usize]) -> anyhow::Result<(Vec<u32>, Vec<f32>)> {
    let word = |at: usize| -> Option<u64> { Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?)) };
    let bad = || anyhow::anyhow!("ssp protocol error: a malformed message of {} bytes", bytes.len());
    let count = word(skip).ok_or_else(bad)? as usize;
    let idx_end = skip + 8 + 4 * count;
    let rows: Vec<u32> = bytes.get(skip + 8..idx_end).ok_or_else(bad)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
    let nrows = offsets.len() - 1;
    let mut len = 0;
    for &r in &rows {
        anyhow::ensure!((r as usize) < nrows, "ssp protocol error: row {r} outside a shard of {nrows} rows");
        len += offsets[r as usize + 1] - offsets[r as usize];
    }
    anyhow::ensure!(bytes.len() == idx_end + 4 * len, "ssp protocol error: {} bytes for {} rows of {len} values", bytes.len(), rows.len());
    Ok((rows, decode_f32(&bytes[idx_end..])))
}

/// Parameter ranges of each rank's shard: contiguous rows, balanced by parameter count.
pub fn shard_ranges(layout: &RowLayout, n: usize) -> Vec<Range<usize>> {
    shard_rows(layout, n).into_iter().map(|r| layout.offsets[r.start]..layout.offsets[r.end]).collect()
}

/// Row ranges of each rank's shard (see [`shard_ranges`]).
pub fn shard_rows(layout: &RowLayout, n: usize) -> Vec<Range<usize>> {
    let total = *layout.offsets.last().unwrap_or(&0);
    let rows = layout.rows();
    // Rank r's first row is the first whose start offset is at or past r/n of the parameters.
    let first_row = |r: usize| -> usize {
        if r >= n {
            return rows;
        }
        layout.offsets[..rows].partition_point(|&o| o * n < r * total)
    };
    (0..n).map(|r| first_row(r)..first_row(r + 1)).collect()
}

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
    /// Per worker: `seq` when it was last answered (rows stamped later are news to it).
    seen: Vec<u64>,
    /// Clocks each worker has pushed and had applied.
    completed: Vec<u64>,
    cmin: u64,
    rule: ApplyRule,
    staleness: u64,
    dyn_state: DynState,
    /// Pushes received but not applied yet: (clock, worker) -> (changed rows, their values).
    queued: BTreeMap<(u64, usize), (Vec<u32>, Vec<f32>)>,
    /// Reads waiting for `cmin >= want`: (worker, want).
    reads: Vec<(usize, u64)>,
    /// Evaluation snapshots: round -> rows once `cmin >= round`.
    snapshots: BTreeMap<u64, Option<Vec<f32>>>,
    max_live_versions: usize,
}

impl ShardServer {
    fn workers(&self) -> usize {
        self.completed.len()
    }

    /// Applies every queued push that may be applied now; returns whether anything changed.
    fn apply_queued(&mut self) -> anyhow::Result<bool> {
        let mut changed = false;
        loop {
            let next = if self.staleness == 0 {
                // BSP: the whole clock, in worker order, once every worker's push is here.
                let c = self.cmin;
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
                let (rows, values) = self.queued.remove(&key).expect("queued");
                self.apply(key.1, key.0, &rows, &values)?;
                changed = true;
            }
            if self.staleness != 0 {
                break;
            }
        }
        Ok(changed)
    }

    /// Applies worker `m`'s update of `clock`: `values` of the local `rows` it changed.
    fn apply(&mut self, m: usize, clock: u64, rows: &[u32], values: &[f32]) -> anyhow::Result<()> {
        if clock != self.completed[m] {
            bail!("ssp protocol error: rank {m} pushed clock {clock} but {} was expected", self.completed[m]);
        }
        self.seq += 1;
        let seq = self.seq;
        let scale = match self.rule {
            ApplyRule::Plain => 1.0,
            _ => 1.0 / self.workers() as f32,
        };
        let mut at = 0;
        if self.rule != ApplyRule::Dynsgd {
            for &r in rows {
                let range = self.offsets[r as usize]..self.offsets[r as usize + 1];
                let n = range.len();
                self.rows[range].iter_mut().zip(&values[at..at + n]).for_each(|(w, x)| *w += x * scale);
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
            {
                let st = &mut self.dyn_state;
                let v = st.version[m];
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
                st.version[m] += 1;
                st.cmax = st.cmax.max(clock + 1);
                let oldest = *st.version.iter().min().expect("workers");
                st.updates.retain(|&ver, _| ver >= oldest);
                self.max_live_versions = self.max_live_versions.max(st.updates.len());
            }
        }
        self.completed[m] = clock + 1;
        let cmin = *self.completed.iter().min().expect("workers");
        if cmin != self.cmin {
            self.cmin = cmin;
            for (&round, snap) in self.snapshots.iter_mut() {
                if snap.is_none() && round <= cmin {
                    *snap = Some(self.rows.clone());
                }
            }
        }
        Ok(())
    }

    /// Reads that may be answered now: (worker, message).
    fn answerable(&mut self) -> Vec<(usize, Vec<u8>)> {
        let cmin = self.cmin;
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.reads.len() {
            let (m, want) = self.reads[i];
            if want <= cmin {
                self.reads.swap_remove(i);
                if self.rule == ApplyRule::Dynsgd {
                    // Pull: the worker's next update is computed from the newest version.
                    self.dyn_state.version[m] = self.dyn_state.cmax;
                }
                // Only the rows that changed since this worker's last answer: the others still
                // hold what it has (its own changes were pushed, and so changed them here).
                let news: Vec<u32> = (0..self.stamp.len()).filter(|&r| self.stamp[r] > self.seen[m]).map(|r| r as u32).collect();
                self.seen[m] = self.seq;
                let mut msg = Vec::new();
                msg.extend_from_slice(&cmin.to_le_bytes());
                encode_rows(&mut msg, &self.offsets, &news, &self.rows);
                out.push((m, msg));
            } else {
                i += 1;
            }
        }
        out
    }

    /// Ranks whose clock is the slowest this shard has seen.
    fn laggards(&self) -> Vec<usize> {
        (0..self.workers()).filter(|&m| self.completed[m] == self.cmin).collect()
    }
}

/// SSP over rank-hosted shards. Collective: every rank builds it and runs the same rounds.
pub struct StaleSynchronous {
    post: Postbox,
    rank: usize,
    staleness: u64,
    wait_timeout: Duration,
    stop_sending_after: Option<(usize, u64)>,
    /// Parameter range served by each rank.
    shards: Vec<Range<usize>>,
    /// Row offsets inside each rank's shard (relative to its start).
    local_offsets: Vec<Vec<usize>>,
    server: Option<ShardServer>,
    /// The replica's values at the last read of each shard (update = params - base).
    base: Vec<f32>,
    /// Shards whose answer to the last read has not arrived yet.
    awaiting: Vec<bool>,
    /// Answers received and not yet put into the replica: (shard, cmin, rows, their values).
    inbox: Vec<(usize, u64, Vec<u32>, Vec<f32>)>,
    last_round: u64,
    stats: CommStats,
    /// staleness_histogram[k] = reads with staleness k; the last bucket counts k > S (must stay 0).
    staleness_histogram: Vec<u64>,
    blocked_reads: u64,
}

impl StaleSynchronous {
    /// Collective set-up: every rank starts from the same initial model `init` (the replicas'
    /// common start), which also initialises the shards.
    pub fn new(ctx: &SyncContext, opts: &SspOptions, init: &[f32]) -> anyhow::Result<Self> {
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
        let server = (!mine.is_empty()).then(|| ShardServer {
            rows: init[mine.clone()].to_vec(),
            offsets: local_offsets[rank].clone(),
            stamp: vec![0; row_ranges[rank].len()],
            seq: 0,
            seen: vec![0; n],
            range: mine,
            completed: vec![0; n],
            cmin: 0,
            rule: opts.apply,
            staleness: opts.staleness,
            dyn_state: DynState { version: vec![0; n], ..Default::default() },
            queued: BTreeMap::new(),
            reads: Vec::new(),
            snapshots: BTreeMap::new(),
            max_live_versions: 0,
        });
        Ok(StaleSynchronous {
            post: Postbox::new(ctx.comm),
            rank,
            staleness: opts.staleness,
            wait_timeout: ctx.wait_timeout,
            stop_sending_after: ctx.stop_sending_after,
            awaiting: vec![false; n],
            base: init.to_vec(),
            shards,
            local_offsets,
            server,
            inbox: Vec::new(),
            last_round: 0,
            stats: CommStats::default(),
            staleness_histogram: vec![0; opts.staleness as usize + 2],
            blocked_reads: 0,
        })
    }

    fn sending(&self, round: u64) -> bool {
        !matches!(self.stop_sending_after, Some((r, last)) if r == self.rank && round > last)
    }

    /// Takes every waiting message: pushes are applied (server), rows are kept for the worker;
    /// answers the reads that became answerable.
    fn serve(&mut self) -> anyhow::Result<()> {
        let mut changed = false;
        while let Some((src, bytes)) = self.post.try_receive(TAG_PUSH) {
            let server = self.server.as_mut().ok_or_else(|| anyhow::anyhow!("rank {src} pushed to rank {} which serves no rows", self.rank))?;
            let (rows, values) = decode_rows(&bytes, 16, &server.offsets)?;
            let clock = u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes"));
            let want = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
            server.queued.insert((clock, src), (rows, values));
            server.reads.push((src, want));
            changed = true;
        }
        while let Some((src, bytes)) = self.post.try_receive(TAG_ROWS) {
            let (rows, values) = decode_rows(&bytes, 8, &self.local_offsets[src])?;
            let cmin = u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes"));
            self.inbox.push((src, cmin, rows, values));
        }
        if changed {
            let t = Instant::now();
            let server = self.server.as_mut().expect("checked above");
            server.apply_queued()?;
            for (m, msg) in server.answerable() {
                self.post.send(m, TAG_ROWS, msg)?;
            }
            self.stats.comm_seconds += t.elapsed().as_secs_f64();
        }
        self.post.progress_sends()?;
        self.stats.bytes_sent = self.post.bytes_sent();
        self.stats.bytes_received = self.post.bytes_received();
        Ok(())
    }

    /// Serves until `done(self)` holds, counting the time as waiting; after `--wait-timeout`
    /// fails with `what(self)` (said at that moment, naming whom it still waits for) and, when
    /// this rank's shard holds reads back, the ranks whose updates it lacks.
    fn wait_until(&mut self, what: impl Fn(&Self) -> String, done: impl Fn(&Self) -> bool) -> anyhow::Result<()> {
        let start = Instant::now();
        // Yield (not sleep) for a while: the answer usually comes from a rank that only needs
        // the CPU for one step, and sleeping 1 ms per clock made S = 0 take 2.1 s instead of
        // 0.75 s for 938 clocks at 4 ranks on 2 cores.
        let mut backoff = Backoff::with_yield_window(Duration::from_millis(20));
        self.serve()?;
        while !done(self) {
            if start.elapsed() > self.wait_timeout {
                let behind = match &self.server {
                    Some(s) if !s.reads.is_empty() || !s.queued.is_empty() => format!(
                        "; this rank's shard has every update of clocks < {} and waits for the updates of rank(s) {:?} \
                         (clocks pushed per rank {:?}, reads deferred {:?}, pushes queued {:?})",
                        s.cmin,
                        s.laggards(),
                        s.completed,
                        s.reads,
                        s.queued.keys().collect::<Vec<_>>()
                    ),
                    _ => String::new(),
                };
                bail!(
                    "rank {}: waited {:.1} s (--wait-timeout) for {}{behind}: those ranks are stuck, dead or far too slow",
                    self.rank,
                    start.elapsed().as_secs_f64(),
                    what(self)
                );
            }
            backoff.pause();
            self.serve()?;
        }
        self.stats.wait_seconds += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Ranks that have not pushed `clock` clocks to this rank's shard.
    fn behind(&self, clock: u64) -> Vec<usize> {
        self.server.as_ref().map_or(Vec::new(), |s| (0..s.workers()).filter(|&m| s.completed[m] < clock).collect())
    }

    /// Waits for the answers to this rank's reads and puts the rows into the replica.
    fn complete_reads(&mut self, params: &mut [f32], clock: u64) -> anyhow::Result<()> {
        if !self.awaiting.iter().any(|&a| a) {
            return Ok(());
        }
        let missing = |s: &Self| -> Vec<usize> {
            let mut m: Vec<usize> = (0..s.awaiting.len()).filter(|&r| s.awaiting[r]).collect();
            m.retain(|r| !s.inbox.iter().any(|(src, ..)| src == r));
            m
        };
        if !missing(self).is_empty() {
            self.blocked_reads += 1;
            self.wait_until(
                |s| format!("the rows of clock {clock} from the shard server(s) on rank(s) {:?}", missing(s)),
                |s| missing(s).is_empty(),
            )?;
        }
        for (src, cmin, rows, values) in std::mem::take(&mut self.inbox) {
            let (start, offsets) = (self.shards[src].start, &self.local_offsets[src]);
            let mut at = 0;
            for &r in &rows {
                let range = start + offsets[r as usize]..start + offsets[r as usize + 1];
                let n = range.len();
                params[range.clone()].copy_from_slice(&values[at..at + n]);
                self.base[range].copy_from_slice(&values[at..at + n]);
                at += n;
            }
            self.awaiting[src] = false;
            let st = clock.saturating_sub(cmin) as usize;
            let bucket = st.min(self.staleness as usize + 1);
            self.staleness_histogram[bucket] += 1;
        }
        Ok(())
    }

    /// Waits until this rank's shard holds every update of clocks < `clock` and every message
    /// this rank sent is delivered.
    fn drain(&mut self, params: &mut [f32], clock: u64) -> anyhow::Result<()> {
        self.complete_reads(params, clock)?;
        if self.server.is_some() {
            self.wait_until(|s| format!("the updates up to clock {} of rank(s) {:?}", clock.saturating_sub(1), s.behind(clock)), |s| {
                s.server.as_ref().is_some_and(|sv| sv.cmin >= clock)
            })?;
        }
        let timeout = self.wait_timeout;
        let start = Instant::now();
        self.post.flush_sends(timeout, |_| Ok(()))?;
        self.stats.wait_seconds += start.elapsed().as_secs_f64();
        Ok(())
    }
}

fn decode_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}

impl SyncMode for StaleSynchronous {
    fn name(&self) -> &'static str {
        "ssp"
    }

    fn lockstep(&self) -> bool {
        self.staleness == 0
    }

    fn round_lead(&self) -> u64 {
        self.staleness + 1
    }

    fn before_step(&mut self, params: &mut [f32], clock: u64) -> anyhow::Result<()> {
        self.complete_reads(params, clock)
    }

    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let t = Instant::now();
        let clock = round - 1;
        if self.sending(round) {
            let want = round.saturating_sub(self.staleness);
            let mut delta = Vec::new();
            for s in (0..self.shards.len()).filter(|&s| !self.shards[s].is_empty()) {
                // The rows this worker changed since it last read them, as updates.
                let (range, offsets) = (self.shards[s].clone(), &self.local_offsets[s]);
                delta.clear();
                delta.extend(params[range.clone()].iter().zip(&self.base[range]).map(|(p, b)| p - b));
                let changed: Vec<u32> = (0..offsets.len() - 1)
                    .filter(|&r| delta[offsets[r]..offsets[r + 1]].iter().any(|&d| d != 0.0))
                    .map(|r| r as u32)
                    .collect();
                let mut msg = Vec::new();
                msg.extend_from_slice(&clock.to_le_bytes());
                msg.extend_from_slice(&want.to_le_bytes());
                encode_rows(&mut msg, offsets, &changed, &delta);
                self.post.send(s, TAG_PUSH, msg)?;
                self.awaiting[s] = true;
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
            let snap = (s.cmin >= round).then(|| s.rows.clone());
            s.snapshots.insert(round, snap);
        }
    }

    fn evaluated_model(&mut self, round: u64) -> anyhow::Result<Option<Vec<f32>>> {
        let n_params = self.base.len();
        let mut part = vec![0f32; n_params];
        if self.server.is_some() {
            self.wait_until(|s| format!("the updates up to clock {} of rank(s) {:?} (evaluation)", round.saturating_sub(1), s.behind(round)), |s| {
                s.server.as_ref().is_some_and(|sv| sv.snapshots.get(&round).is_some_and(|x| x.is_some()))
            })?;
            let s = self.server.as_mut().expect("checked");
            let rows = s.snapshots.remove(&round).flatten().expect("waited for it");
            part[s.range.clone()].copy_from_slice(&rows);
        }
        Ok(Some(part))
    }

    fn quiesce(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        self.drain(params, round)
    }

    fn save_state(&self) -> ModeState {
        let mut st: ModeState = vec![
            ("awaiting".into(), self.awaiting.iter().map(|&a| a as u8 as f64).collect()),
        ];
        if let Some(s) = &self.server {
            st.push(("shard_rows".into(), s.rows.iter().map(|&x| x as f64).collect()));
            st.push(("shard_completed".into(), s.completed.iter().map(|&c| c as f64).collect()));
            st.push(("shard_stamp".into(), s.stamp.iter().map(|&c| c as f64).collect()));
            st.push(("shard_seen".into(), s.seen.iter().map(|&c| c as f64).collect()));
            st.push(("shard_seq".into(), vec![s.seq as f64]));
            let d = &s.dyn_state;
            st.push(("dyn_version".into(), d.version.iter().map(|&v| v as f64).collect()));
            st.push(("dyn_cmax".into(), vec![d.cmax as f64]));
            st.push(("dyn_live".into(), d.updates.iter().flat_map(|(&v, (sv, _))| [v as f64, *sv as f64]).collect()));
            st.push(("dyn_updates".into(), d.updates.values().flat_map(|(_, u)| u.iter().map(|&x| x as f64)).collect()));
        }
        st
    }

    fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        let get = |name: &str| -> anyhow::Result<&Vec<f64>> {
            state.iter().find(|(k, _)| k == name).map(|(_, v)| v).ok_or_else(|| anyhow::anyhow!("the checkpoint lacks ssp state {name:?}"))
        };
        anyhow::ensure!(get("awaiting")?.iter().all(|&a| a == 0.0), "the checkpoint was taken with reads in flight");
        if let Some(s) = self.server.as_mut() {
            let rows = get("shard_rows")?;
            anyhow::ensure!(rows.len() == s.rows.len(), "the checkpoint's shard has {} values, this run's {}", rows.len(), s.rows.len());
            s.rows = rows.iter().map(|&x| x as f32).collect();
            s.completed = get("shard_completed")?.iter().map(|&c| c as u64).collect();
            s.cmin = *s.completed.iter().min().unwrap_or(&0);
            s.stamp = get("shard_stamp")?.iter().map(|&c| c as u64).collect();
            s.seen = get("shard_seen")?.iter().map(|&c| c as u64).collect();
            s.seq = get("shard_seq")?.first().map_or(0, |&c| c as u64);
            anyhow::ensure!(s.stamp.len() == s.offsets.len() - 1, "the checkpoint's shard has another row count");
            let d = &mut s.dyn_state;
            d.version = get("dyn_version")?.iter().map(|&v| v as u64).collect();
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
        }
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.stats
    }

    fn metrics(&self) -> Vec<ModeMetric> {
        let reads: u64 = self.staleness_histogram.iter().sum();
        let max_seen = self.staleness_histogram.iter().rposition(|&c| c > 0).unwrap_or(0);
        let mean = if reads > 0 {
            self.staleness_histogram.iter().enumerate().map(|(k, &c)| (k as u64 * c) as f64).sum::<f64>() / reads as f64
        } else {
            0.0
        };
        vec![
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
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_row_once_and_balance_parameters() {
        let layout = RowLayout::uniform(10, 785);
        let s = shard_ranges(&layout, 8);
        assert_eq!(s.len(), 8);
        assert_eq!(s[0].start, 0);
        assert_eq!(s[7].end, 7850);
        for w in s.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert!(s.iter().all(|r| !r.is_empty() && r.len() % 785 == 0));
        // More ranks than rows: some shards are empty, none is split inside a row.
        let s = shard_ranges(&RowLayout::uniform(3, 4), 5);
        assert_eq!(s.iter().map(|r| r.len()).sum::<usize>(), 12);
        assert!(s.iter().all(|r| r.len() % 4 == 0));
        assert_eq!(s.iter().filter(|r| r.is_empty()).count(), 2);
    }

    fn server(rule: ApplyRule, n: usize, staleness: u64) -> ShardServer {
        ShardServer {
            range: 0..1,
            rows: vec![0.0],
            offsets: vec![0, 1],
            stamp: vec![0],
            seq: 0,
            seen: vec![0; n],
            completed: vec![0; n],
            cmin: 0,
            rule,
            staleness,
            dyn_state: DynState { version: vec![0; n], ..Default::default() },
            queued: BTreeMap::new(),
            reads: Vec::new(),
            snapshots: BTreeMap::new(),
            max_live_versions: 0,
        }
    }

    #[test]
    fn consgd_and_dynsgd_average_a_bsp_clock_and_plain_adds() {
        for (rule, want) in [(ApplyRule::Plain, 6.0), (ApplyRule::Consgd, 2.0), (ApplyRule::Dynsgd, 2.0)] {
            let mut s = server(rule, 3, 0);
            for (m, u) in [(2, 3.0), (0, 1.0), (1, 2.0)] {
                s.queued.insert((0, m), (vec![0], vec![u]));
                s.apply_queued().unwrap();
            }
            assert_eq!(s.rows, vec![want], "{rule:?}");
            assert_eq!(s.cmin, 1);
        }
    }

    /// The paper's Appendix C example, first steps: W1 pushes a (version 0), W2 pushes b, then W3
    /// c, W4 d: u(PS,0) is the running mean; W1 pulls (V(1) = cmax = 1) and pushes e (version 1,
    /// staleness 1); W4 ... here with scalars.
    #[test]
    fn dynsgd_scales_by_staleness_per_version() {
        let mut s = server(ApplyRule::Dynsgd, 4, 3);
        let push = |s: &mut ShardServer, m: usize, c: u64, u: f32| {
            s.queued.insert((c, m), (vec![0], vec![u]));
            s.apply_queued().unwrap();
        };
        push(&mut s, 0, 0, 4.0); // d = 1: w = 4
        assert_eq!(s.rows[0], 4.0);
        push(&mut s, 1, 0, 8.0); // d = 2: w = (4 + 8) / 2
        assert_eq!(s.rows[0], 6.0);
        // Worker 0 reads: its next update has version cmax = 1.
        s.reads.push((0, 0));
        assert_eq!(s.answerable().len(), 1);
        assert_eq!(s.dyn_state.version[0], 1);
        push(&mut s, 0, 1, 2.0); // version 1, d = 1: w = 6 + 2
        assert_eq!(s.rows[0], 8.0);
        push(&mut s, 2, 0, 12.0); // version 0, d = 3: u(PS,0) = (4 + 8 + 12) / 3 = 8, w = 8 + 2
        assert_eq!(s.rows[0], 10.0);
        push(&mut s, 3, 0, 0.0); // version 0, d = 4: u(PS,0) = 6, w = 6 + 2
        assert_eq!(s.rows[0], 8.0);
        // Workers 1..3 are at version 1 now, worker 0 at 2: version 0 is freed.
        assert!(!s.dyn_state.updates.contains_key(&0));
        assert_eq!(s.cmin, 1);
    }

    #[test]
    fn sparse_rows_round_trip_and_reject_malformed_messages() {
        let offsets = [0, 2, 3, 6];
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut msg = 7u64.to_le_bytes().to_vec();
        encode_rows(&mut msg, &offsets, &[0, 2], &values);
        let (rows, vals) = decode_rows(&msg, 8, &offsets).unwrap();
        assert_eq!((rows, vals), (vec![0, 2], vec![1.0, 2.0, 4.0, 5.0, 6.0]));
        assert!(decode_rows(&msg[..msg.len() - 1], 8, &offsets).is_err(), "truncated");
        assert!(decode_rows(&msg, 8, &[0, 2]).is_err(), "row 2 outside a one-row shard");
    }

    /// An answer carries only the rows that changed since the worker's previous answer.
    #[test]
    fn answers_carry_only_rows_changed_since_the_last_read() {
        let mut s = server(ApplyRule::Plain, 2, 1);
        s.rows = vec![0.0; 3];
        s.offsets = vec![0, 1, 2, 3];
        s.stamp = vec![0; 3];
        s.queued.insert((0, 0), (vec![1], vec![5.0]));
        s.apply_queued().unwrap();
        s.reads.push((1, 0));
        let a = s.answerable();
        let (rows, vals) = decode_rows(&a[0].1, 8, &s.offsets).unwrap();
        assert_eq!((rows, vals), (vec![1], vec![5.0]));
        s.reads.push((1, 0));
        let (rows, _) = decode_rows(&s.answerable()[0].1, 8, &s.offsets).unwrap();
        assert!(rows.is_empty(), "nothing new since the last answer");
    }

    #[test]
    fn reads_wait_for_the_staleness_bound() {
        let mut s = server(ApplyRule::Plain, 2, 1);
        s.reads.push((0, 1));
        assert!(s.answerable().is_empty(), "cmin 0 < want 1");
        s.queued.insert((0, 0), (vec![0], vec![1.0]));
        s.apply_queued().unwrap();
        assert!(s.answerable().is_empty(), "rank 1 has not pushed clock 0");
        s.queued.insert((0, 1), (vec![0], vec![1.0]));
        s.apply_queued().unwrap();
        let a = s.answerable();
        assert_eq!(a.len(), 1);
        assert_eq!(u64::from_le_bytes(a[0].1[0..8].try_into().unwrap()), 1);
    }
}
