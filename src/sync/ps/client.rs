//! The SSP client of the parameter-server engine (`--sync ssp`, and `--sync bosen` with the managed
//! send policy): stale synchronous parallel on a parameter server whose shards live on the ranks
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
//!   [0, S]). Bosen's managed clients still wait for every answer ([`super::policy`]).
//! - **Apply rules**: plain (w += u), ConSGD (w += u/M) and DynSGD (per-version staleness
//!   scaling with V(m), S(v), u(PS,v), Algorithm 2 of the paper; versions every worker has passed
//!   are freed): the shard server's ([`super::server`]).
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

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::bail;
use mpi::topology::Communicator;

use super::clocks::WorkerClocks;
use super::policy::SendPolicy;
use super::protocol::{EARLY, HALF, PARTIAL, TAG_PUSH, TAG_ROWS, UNSOLICITED, VERSIONS};
use super::resize::{repartition, NewShards, LAID};
use super::serve::serve_until;
use super::server::ShardServer;
use super::settings::PsSettings;
use super::shards::{shard_ranges, shard_rows};
use crate::comm::backoff::Backoff;
use crate::comm::deadline::WaitDeadline;
use crate::comm::postbox::Postbox;
use crate::sync::codec::fp16::F16_HALF_MIN;
use crate::sync::codec::rows::{decode_rows, encode_rows, word_at, RowBlock};
use crate::sync::{assemble_parts, Aggregate, CommStats, ModeMetric, ModeState, SyncContext, SyncMode};

/// The checkpoint entry of a rank's shard of the servers' model: laid end to end over the ranks,
/// the model a resume at another rank count starts from ([`super::resize`]).
pub const SHARD_ROWS: &str = "shard_rows";

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
    /// When and how much this rank sends beyond the clock protocol (plain SSP or Bösen's).
    policy: SendPolicy,
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

impl StaleSynchronous {
    /// Collective set-up: every rank starts from the same initial model `init` (the replicas'
    /// common start), which also initialises the shards; `settings` say how (the staleness
    /// bound, the apply rule and the send policy).
    pub fn new(ctx: &SyncContext, settings: &PsSettings, init: &[f32]) -> anyhow::Result<Self> {
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
        let mut server = (!mine.is_empty()).then(|| {
            ShardServer::new(mine.clone(), &init[mine.clone()], local_offsets[rank].clone(), n, settings.apply, settings.staleness)
        });
        let n_rows = ctx.layout.rows();
        let budget = settings.policy.budget(settings.apply, ctx.emulate.map(|e| e.0))?;
        let policy = SendPolicy::new(&settings.policy, ctx.seed, rank, n, n_rows);
        if let Some(sv) = server.as_mut() {
            policy.prepare_shard(sv);
        }
        Ok(StaleSynchronous {
            post: Postbox::new(ctx.comm).with_pacer(ctx.pacer(budget)).with_ingress(ctx.ingress()),
            rank,
            staleness: settings.staleness,
            wait_timeout: ctx.wait_timeout,
            stop_sending_after: ctx.stop_sending_after,
            awaiting: vec![0; n],
            fresh_cmin: vec![0; n],
            in_flight: vec![VecDeque::new(); n],
            dyn_stamp: vec![Some(0); n],
            base: init.to_vec(),
            pending: settings.policy.adarevision().is_some().then(|| vec![0.0; init.len()]),
            held_version: vec![0; n_rows],
            residual: settings.policy.fp16().then(|| vec![0.0; init.len()]),
            shards,
            row_ranges,
            local_offsets,
            server,
            inbox: Vec::new(),
            last_round: 0,
            policy,
            stats: CommStats::default(),
            staleness_histogram: vec![0; settings.staleness as usize + 2],
            blocked_reads: 0,
        })
    }

    fn sending(&self, round: u64) -> bool {
        !matches!(self.stop_sending_after, Some((r, last)) if r == self.rank && round > last)
    }

    /// Takes every waiting message: pushes are applied (server), rows are kept for the worker;
    /// answers the reads that became answerable; then the send policy's sends between clocks
    /// (Bosen: spare budget spent on pushing fresh rows to a client).
    fn serve(&mut self) -> anyhow::Result<()> {
        let mut changed = false;
        let half_ok = self.policy.fp16();
        while let Some((src, bytes)) = self.post.try_receive(TAG_PUSH) {
            let server =
                self.server.as_mut().ok_or_else(|| anyhow::anyhow!("rank {src} pushed to rank {} which serves no rows", self.rank))?;
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
            let chunk = self.policy.message_rows();
            let server = self.server.as_mut().expect("checked above");
            server.apply_queued()?;
            let answers = server.answerable(chunk);
            if !answers.is_empty() {
                // Reads' answers are the mandatory traffic: they do not wait behind fresh rows.
                self.withdraw_early(None)?;
            }
            for (m, msg) in answers {
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

    /// The send policy's sends from this rank's shard between clocks (Bosen's server pushes).
    fn push_fresh_rows(&mut self) -> anyhow::Result<()> {
        let sending = self.sending(self.last_round + 1);
        let row0 = self.row_ranges[self.rank].start;
        match self.server.as_mut() {
            Some(sv) => self.policy.serve_fresh_rows(sv, &mut self.post, sending, self.rank, row0),
            None => Ok(()),
        }
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
        let half = self.policy.fp16();
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
            self.policy.note_pushed_row(self.row_ranges[s].start + r as usize, local.len());
        }
        self.policy.note_push_bytes(msg.len());
        self.post.send(s, TAG_PUSH, msg)?;
        Ok(())
    }

    /// The send policy's early push (Bosen's client side): when the budget allows, pushes the
    /// most significant rows of the update not yet sent: as many as the budget carries by the
    /// horizon (at least --queue-size rows when the bucket is empty), in messages of at most
    /// --queue-size rows per shard.
    fn push_early(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        let sending = self.sending(self.last_round + 1);
        let Some(room) = self.policy.early_room(&self.post, sending) else { return Ok(()) };
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
        let chosen = self.policy.choose_early(room, &cands, cand_values, self.base.len().max(1));
        if chosen.is_empty() {
            return Ok(());
        }
        let chunk = self.policy.message_rows().unwrap_or(usize::MAX);
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

    /// Bösen's mandatory traffic goes first. At a clock's end (`clock`), the early pushes of that
    /// clock that the budget's link has not begun to carry are taken back and their rows returned
    /// to the unsent update, which the clock's push then carries; at a clock's end and before a
    /// read's answer, so are this rank's server's early messages of fresh rows, whose rows then
    /// count as not sent to that worker (its next answer carries them). Sent first-come
    /// first-served they were queued ahead: benches/claim-bosen.md measured clocks of 0.58-0.67 s
    /// against ssp's 0.45-0.52 s at equal clocks (issue 44 item 3). Early pushes of an earlier
    /// clock stay (a server completes a clock when its last push arrives), and so does every
    /// other message, in its order.
    fn withdraw_early(&mut self, clock: Option<u64>) -> anyhow::Result<()> {
        if !self.policy.sends_between_clocks() {
            return Ok(());
        }
        let flag = |m: &[u8], at: usize, bit: u64| word_at(m, at).is_ok_and(|f| f & bit != 0);
        let early = |_: usize, tag: i32, m: &[u8]| match tag {
            TAG_PUSH => clock.is_some() && word_at(m, 0).ok() == clock && flag(m, 16, PARTIAL),
            TAG_ROWS => flag(m, 8, EARLY),
            _ => false,
        };
        for (dest, tag, msg) in self.post.withdraw_waiting(early) {
            if tag == TAG_ROWS {
                let server = self.server.as_mut().expect("only a server sends rows");
                let block = decode_rows(&msg, 32, &server.offsets, word_at(&msg, 8)? & VERSIONS != 0, false)?;
                server.unsend(dest, &block.rows);
                let row0 = self.row_ranges[self.rank].start;
                self.policy.note_serve_withdrawn(&block.rows.iter().map(|&r| row0 + r as usize).collect::<Vec<_>>());
                continue;
            }
            let flags = word_at(&msg, 16)?;
            let block = decode_rows(&msg, 32, &self.local_offsets[dest], flags & VERSIONS != 0, flags & HALF != 0)?;
            let rows = self.unsend(dest, &block);
            self.policy.note_withdrawn(msg.len(), &rows);
        }
        Ok(())
    }

    /// Returns the update values of `block` (rows local to shard `s`, as pushed) to the unsent
    /// update, undoing [`StaleSynchronous::push_rows`]'s accounting; returns (global row, values)
    /// of each.
    fn unsend(&mut self, s: usize, block: &RowBlock) -> Vec<(usize, usize)> {
        let offsets = &self.local_offsets[s];
        let start = self.shards[s].start;
        let mut at = 0;
        let mut rows = Vec::with_capacity(block.rows.len());
        for &r in &block.rows {
            let local = offsets[r as usize]..offsets[r as usize + 1];
            let global = start + local.start..start + local.end;
            let values = &block.values[at..at + local.len()];
            // fp16's residual stays the rounding error the withdrawn push left: the unsent update
            // now differs from it by the values returned, so the row counts as touched.
            match &mut self.pending {
                Some(p) => p[global].iter_mut().zip(values).for_each(|(x, v)| *x += v),
                None => self.base[global].iter_mut().zip(values).for_each(|(b, v)| *b -= v),
            }
            at += local.len();
            rows.push((self.row_ranges[s].start + r as usize, local.len()));
        }
        rows
    }

    /// Serves until `done(self)` holds, counting the time as waiting; past `--wait-timeout` fails
    /// with `what(self)` (said at that moment: what it still waits for), what this rank's shard
    /// lacks, and the verdict of the sign-of-life board (see [`serve_until`]).
    fn wait_until(&mut self, what: impl Fn(&Self) -> String, done: impl Fn(&Self) -> bool) -> anyhow::Result<()> {
        // Yield (not sleep) for a while: the answer usually comes from a rank that only needs
        // the CPU for one step, and sleeping 1 ms per clock made S = 0 take 2.1 s instead of
        // 0.75 s for 938 clocks at 4 ranks on 2 cores.
        let backoff = Backoff::with_yield_window(Duration::from_millis(20));
        let limit = self.wait_timeout;
        let waited = serve_until(self, limit, backoff, Self::serve, done, |s, waited, why| s.waited_too_long(waited, &what(s), why))?;
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
                for (j, ((w, b), &v)) in
                    params[range.clone()].iter_mut().zip(&mut self.base[range]).zip(&a.block.values[at..at + n]).enumerate()
                {
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
        self.staleness > 0 && !self.policy.sends_between_clocks()
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
        self.policy.set_quiet(true);
        self.complete_reads(params, clock, true)?;
        if self.server.is_some() {
            self.wait_until(
                |s| format!("the updates up to clock {} of ranks {:?}", clock.saturating_sub(1), s.behind(clock)),
                |s| s.server.as_ref().is_some_and(|sv| sv.clocks.min() >= clock),
            )?;
        }
        let timeout = self.wait_timeout;
        let start = Instant::now();
        if self.policy.sends_between_clocks() {
            // Every message of this rank handed to MPI and delivered (paced ones are held back
            // until their time), while serving; then the barrier, still serving.
            self.wait_until(
                |s| format!("{} message(s) of this rank to be delivered", s.post.unacknowledged()),
                |s| s.post.link_idle() && s.post.unacknowledged() == 0,
            )?;
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
                        bail!(
                            "rank {}: waited {:.1} s (--wait-timeout) for every rank to finish its clock {clock}: {why}",
                            self.rank,
                            deadline.waited().as_secs_f64()
                        );
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

fn floats<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

fn counts(v: &[u64]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

impl SyncMode for StaleSynchronous {
    fn name(&self) -> &'static str {
        self.policy.mode_name()
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
        if self.policy.sends_between_clocks() {
            self.policy.begin_step();
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
        self.policy.set_quiet(false);
        self.take_local_changes(params);
        self.withdraw_early(Some(clock))?;
        if self.sending(round) {
            let want = round.saturating_sub(self.staleness);
            let chunk = self.policy.message_rows().unwrap_or(usize::MAX);
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
        assemble_parts(self.post.comm(), params, &mut self.stats, |p| {
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
            self.wait_until(
                |s| format!("the updates up to clock {} of rank(s) {:?} (evaluation)", round.saturating_sub(1), s.behind(round)),
                |s| s.server.as_ref().is_some_and(|sv| sv.snapshots.ready(round)),
            )?;
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
        if self.policy.sends_between_clocks() {
            st.push(("base".into(), floats(&self.base)));
            st.push(("held_version".into(), counts(&self.held_version)));
            if let Some(p) = &self.pending {
                st.push(("pending".into(), floats(p)));
            }
        }
        if let Some(s) = &self.server {
            st.push((SHARD_ROWS.into(), floats(&s.rows)));
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

    fn laid_on_resize(&self, name: &str) -> bool {
        LAID.contains(&name)
    }

    fn repartition(&self, state: ModeState, laid: &ModeState, ranks_before: usize) -> anyhow::Result<ModeState> {
        let own = self.server.as_ref().map(|s| (s.range.clone(), self.row_ranges[self.rank].clone(), s.offsets.clone()));
        let new = NewShards { workers: self.shards.len(), workers_before: ranks_before, rows: self.held_version.len(), own };
        repartition(state, laid, &new)
    }

    fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        let mode = self.name();
        let get = |name: &str| -> anyhow::Result<&Vec<f64>> {
            state
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v)
                .ok_or_else(|| anyhow::anyhow!("the checkpoint lacks {mode} state {name:?}"))
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
        if self.policy.sends_between_clocks() {
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
            let rows = get(SHARD_ROWS)?;
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
            ModeMetric::number("dynsgd_live_versions_max", Aggregate::Max, self.server.as_ref().map_or(0, |s| s.max_live_versions) as f64),
        ];
        let ada = self.server.as_ref().and_then(|s| s.ada.as_ref()).map(|a| (a.snapshots_peak, a.snapshot_misses));
        self.policy.metrics(&mut out, ada);
        out
    }
}
