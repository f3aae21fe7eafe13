//! Bösen's managed communication as a send policy of the parameter-server engine (Bosen §3.3):
//! the engine calls it at its hook points (between steps, while serving, at a clock's end).
//! - which buffered rows go first when spare bandwidth allows a send ([`Priority`], [`pick`];
//!   asap's edge budget uses the same priorities);
//! - how many rows a client's early push takes ([`early_rows`]) and how far ahead the budget is
//!   filled ([`MAX_HORIZON`]);
//! - the server side: sending clients the rows of its shard that changed most
//!   ([`Managed::serve_fresh_rows`]);
//! - half-precision pushes of updates (encoded by the row codec, [`crate::sync::codec::fp16::f16_bits`]),
//!   whose rounding error stays in the client's buffer; AdaRevision's client side (versions held,
//!   updates kept pending: [`super::client`]).
//!
//! The budget itself is a [`crate::comm::pace::Pacer`] on the rank's postbox: every message (the
//! mandatory end-of-clock ones too) leaves at no more than `--bandwidth-mbps`, and between clocks
//! a client or server sends its most significant buffered rows whenever the bucket is empty.

use std::time::{Duration, Instant};

use super::protocol::{EARLY, TAG_ROWS, UNSOLICITED};
use super::server::ShardServer;
use crate::comm::postbox::Postbox;
use crate::rng::Rng;
use crate::sync::{Aggregate, ModeMetric};

/// Which buffered rows spare bandwidth sends first (`--priority`, Bosen §3.3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    /// Rows in a random (seeded) order.
    Random,
    /// Rows in a fixed cyclic order, continuing where the last send stopped.
    RoundRobin,
    /// Largest accumulated change |delta| (L1 norm of the row's change) first.
    Absolute,
    /// Largest relative change |delta|/|a| first (a: the row's current value; |delta| where a = 0).
    Relative,
}

/// What Bösen's managed communication was asked for (`--sync bosen`'s options, and the
/// AdaRevision step of `--lr-schedule adarevision`).
#[derive(Clone, Debug, PartialEq)]
pub struct ManagedSettings {
    /// `--bandwidth-mbps`; None: the emulated link's rate (`--emulate-bandwidth`).
    pub bandwidth_mbps: Option<f64>,
    /// `--queue-size`: most rows in one message.
    pub queue_size: usize,
    pub priority: Priority,
    /// `--compress fp16`: updates pushed as binary16.
    pub fp16: bool,
    /// `--max-snapshots`: AdaRevision snapshots a shard keeps at most.
    pub max_snapshots: usize,
    /// `--lr-schedule adarevision`: the servers apply AdaRevision steps with this alpha (`--lr`).
    pub adarevision: Option<f32>,
}

/// Longest look-ahead of the early sends' budget: a step interval that includes a long wait
/// (the end of a clock, an evaluation) must not let one call queue seconds of early sends
/// ahead of the next clock's mandatory push.
pub const MAX_HORIZON: Duration = Duration::from_millis(200);

/// What `--sync bosen` adds on the client and server side of a rank.
pub struct Managed {
    pub queue_size: usize,
    pub fp16: bool,
    max_snapshots: usize,
    /// AdaRevision on the servers: alpha (`--lr`).
    adarevision: Option<f32>,
    pub client: Picker,
    server: Picker,
    /// The next worker a server push goes to (cycling, so every client gets fresh rows).
    next_worker: usize,
    /// Sends not yet completed above which no early send is made (Bosen §3.3.1: the network is
    /// overused when messages are not acknowledged).
    unacked_limit: usize,
    /// No early sends while the ranks are brought to a consistent cut.
    pub quiet: bool,
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
    /// Early push messages taken back at the clock's end before they left ([`Managed::note_withdrawn`]).
    withdrawn_pushes: u64,
    early_serves: u64,
    /// Early server messages of fresh rows taken back at a clock's end or before a read's answer.
    withdrawn_serves: u64,
    backoffs: u64,
    /// Bytes of this client's push messages and the update values they carried.
    pub push_bytes: u64,
    pushed_values: u64,
}

impl Managed {
    /// The state of a rank's client and server under `settings` (`n` ranks, `rows` model rows).
    pub fn new(settings: &ManagedSettings, seed: u64, rank: usize, n: usize, rows: usize) -> Self {
        Managed {
            queue_size: settings.queue_size.max(1),
            fp16: settings.fp16,
            max_snapshots: settings.max_snapshots,
            adarevision: settings.adarevision,
            client: Picker::new(settings.priority, seed ^ (rank as u64).wrapping_mul(0x9E37_79B9)),
            server: Picker::new(settings.priority, seed ^ ((rank as u64 + 1) << 32)),
            next_worker: 0,
            unacked_limit: 2 * n,
            quiet: false,
            horizon: Duration::ZERO,
            last_step: None,
            row_pushes: vec![0; rows],
            row_serves: vec![0; rows],
            early_pushes: 0,
            withdrawn_pushes: 0,
            early_serves: 0,
            withdrawn_serves: 0,
            backoffs: 0,
            push_bytes: 0,
            pushed_values: 0,
        }
    }

    /// This rank's shard `sv` keeps what managed communication needs (priorities, AdaRevision).
    pub(crate) fn prepare_shard(&self, sv: &mut ShardServer) {
        sv.manage(self.adarevision);
    }

    /// A local step begins: the horizon of the early sends is the time since the last one began.
    pub fn begin_step(&mut self) {
        let now = Instant::now();
        self.horizon = self.last_step.map_or(Duration::ZERO, |t| (now - t).min(MAX_HORIZON));
        self.last_step = Some(now);
    }

    /// Bytes that may be sent early now: what the budget carries by the horizon (the next local
    /// step), and at least one message when the bucket is empty; None when it may not send
    /// (quiet, stopped: `sending` false, the bucket full to the horizon, or sends not
    /// completing: that counts a back-off).
    pub fn early_room(&mut self, post: &Postbox, sending: bool) -> Option<f64> {
        let idle = post.link_idle();
        let unacked = post.unacknowledged();
        let room = post.room_within(self.horizon).unwrap_or(f64::INFINITY);
        if self.quiet || !sending || !(idle || room > 0.0) {
            return None;
        }
        if unacked > self.unacked_limit {
            self.backoffs += 1;
            return None;
        }
        Some(room)
    }

    /// Server side: while the budget allows (up to the horizon), sends clients in turn the rows
    /// of this shard (`sv`, served by `rank` from global row `row0`) that changed most since they
    /// last got them (at most --queue-size rows a message, one message per client per call).
    pub(crate) fn serve_fresh_rows(
        &mut self,
        sv: &mut ShardServer,
        post: &mut Postbox,
        sending: bool,
        rank: usize,
        row0: usize,
    ) -> anyhow::Result<()> {
        let Some(mut room) = self.early_room(post, sending) else { return Ok(()) };
        if sv.ada.as_ref().is_some_and(|a| a.snapshots.len() >= self.max_snapshots) {
            // Bosen: bandwidth-triggered sends stop while the snapshot store is full.
            return Ok(());
        }
        let n = sv.workers();
        let start = self.next_worker;
        for k in 0..n {
            let w = (start + k) % n;
            if w == rank {
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
            let chosen = pick(&mut self.server, &cands, self.queue_size, sv.stamp.len());
            chosen.iter().for_each(|&r| self.row_serves[row0 + r as usize] += 1);
            let msg = sv.rows_message(w, [sv.clocks.min(), sv.clocks.of(w), sv.dyn_state.cmax], UNSOLICITED | EARLY, &chosen);
            self.next_worker = (w + 1) % n;
            self.early_serves += 1;
            room -= msg.len() as f64;
            post.send(w, TAG_ROWS, msg)?;
        }
        Ok(())
    }

    /// Client side: the rows of an early push, in increasing order: the most significant of the
    /// `cands` (global row, |delta|, |a|; `values` values between them) that `room` bytes carry
    /// (at least --queue-size rows); `rows`: the rows the round-robin cursor cycles over.
    pub fn choose_early(&mut self, room: f64, cands: &[(u32, f32, f32)], values: usize, rows: usize) -> Vec<u32> {
        let k = early_rows(room, self.queue_size, cands.len(), values, if self.fp16 { 2 } else { 4 });
        let mut chosen = pick(&mut self.client, cands, k, rows);
        if !chosen.is_empty() {
            self.early_pushes += 1;
            chosen.sort_unstable();
        }
        chosen
    }

    /// A push of global row `row` (`values` values) left this client.
    pub fn note_pushed_row(&mut self, row: usize, values: usize) {
        self.row_pushes[row] += 1;
        self.pushed_values += values as u64;
    }

    /// A server's early message of fresh `rows` (global) was taken back before it left.
    pub fn note_serve_withdrawn(&mut self, rows: &[usize]) {
        self.withdrawn_serves += 1;
        rows.iter().for_each(|&r| self.row_serves[r] -= 1);
    }

    /// An early push message of `bytes` with `rows` (global row, values) was taken back before it
    /// left: it is no longer counted as pushed (its rows go out again with the clock's push).
    pub fn note_withdrawn(&mut self, bytes: usize, rows: &[(usize, usize)]) {
        self.withdrawn_pushes += 1;
        self.push_bytes -= bytes as u64;
        for &(row, values) in rows {
            self.row_pushes[row] -= 1;
            self.pushed_values -= values as u64;
        }
    }

    /// The metrics of managed communication; `ada`: this rank's shard's AdaRevision snapshots
    /// (peak, misses), when it has a shard.
    pub fn metrics(&self, out: &mut Vec<ModeMetric>, ada: Option<(usize, u64)>) {
        let counts = |v: &[u64]| -> Vec<f64> { v.iter().map(|&x| x as f64).collect() };
        out.push(ModeMetric::number("early_pushes", Aggregate::Sum, self.early_pushes as f64));
        out.push(ModeMetric::number("early_push_messages_withdrawn", Aggregate::Sum, self.withdrawn_pushes as f64));
        out.push(ModeMetric::number("early_row_serves", Aggregate::Sum, self.early_serves as f64));
        out.push(ModeMetric::number("early_row_serve_messages_withdrawn", Aggregate::Sum, self.withdrawn_serves as f64));
        out.push(ModeMetric::number("backoffs", Aggregate::Sum, self.backoffs as f64));
        out.push(ModeMetric::number("push_bytes", Aggregate::Sum, self.push_bytes as f64));
        out.push(ModeMetric::number("pushed_values", Aggregate::Sum, self.pushed_values as f64));
        // Bosen Figure 5a as data: how often each row went out (client pushes, server pushes).
        out.push(ModeMetric::array("row_pushes", Aggregate::Sum, counts(&self.row_pushes)));
        out.push(ModeMetric::array("row_serves", Aggregate::Sum, counts(&self.row_serves)));
        if self.adarevision.is_some() {
            out.push(ModeMetric::number("adarevision_snapshots_max", Aggregate::Max, ada.map_or(0, |a| a.0) as f64));
            out.push(ModeMetric::number("adarevision_snapshot_misses", Aggregate::Sum, ada.map_or(0, |a| a.1) as f64));
        }
    }
}

/// Cyclic position of the round-robin strategy, and the random strategy's generator.
#[derive(Clone, Debug)]
pub struct Picker {
    pub priority: Priority,
    pub cursor: usize,
    pub rng: Rng,
}

impl Picker {
    pub fn new(priority: Priority, seed: u64) -> Self {
        Picker { priority, cursor: 0, rng: Rng::new(seed) }
    }
}

/// Chooses at most `k` rows to send among `candidates`: (row, |delta|, |a|) with |delta| > 0,
/// in increasing row order; `rows` is the number of rows the cursor cycles over. Returns the rows
/// in the order they go out.
pub fn pick(picker: &mut Picker, candidates: &[(u32, f32, f32)], k: usize, rows: usize) -> Vec<u32> {
    if k == 0 || candidates.is_empty() {
        return Vec::new();
    }
    match picker.priority {
        Priority::Random => {
            let mut all: Vec<u32> = candidates.iter().map(|c| c.0).collect();
            // Partial Fisher-Yates: the first k of a uniform permutation.
            let k = k.min(all.len());
            for i in 0..k {
                let j = i + picker.rng.below(all.len() - i);
                all.swap(i, j);
            }
            all.truncate(k);
            all
        }
        Priority::RoundRobin => {
            let start = candidates.partition_point(|c| (c.0 as usize) < picker.cursor);
            let out: Vec<u32> = candidates[start..].iter().chain(&candidates[..start]).take(k).map(|c| c.0).collect();
            let last = *out.last().expect("k >= 1 and candidates");
            picker.cursor = (last as usize + 1) % rows.max(1);
            out
        }
        Priority::Absolute | Priority::Relative => {
            let relative = picker.priority == Priority::Relative;
            let score = |c: &(u32, f32, f32)| if relative && c.2 > 0.0 { c.1 / c.2 } else { c.1 };
            let mut scored: Vec<(f32, u32)> = candidates.iter().map(|c| (score(c), c.0)).collect();
            let k = k.min(scored.len());
            // Largest first; ties by row so the order is deterministic.
            let cmp = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
            if k < scored.len() {
                scored.select_nth_unstable_by(k - 1, cmp);
                scored.truncate(k);
            }
            scored.sort_unstable_by(cmp);
            scored.into_iter().map(|s| s.1).collect()
        }
    }
}

/// Rows a client's early push takes: as many of the `cands` candidate rows (`values` values
/// between them, `value_bytes` each on the wire, plus a 4-byte row index) as `room` bytes hold,
/// and at least `queue_size` (the one message a bucket that is empty now may always take).
pub fn early_rows(room: f64, queue_size: usize, cands: usize, values: usize, value_bytes: usize) -> usize {
    if cands == 0 {
        return 0;
    }
    let per_row = 4.0 + (values * value_bytes) as f64 / cands as f64;
    let fit = if room.is_finite() { (room / per_row) as usize } else { cands };
    fit.max(queue_size).min(cands)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands() -> Vec<(u32, f32, f32)> {
        // (row, |delta|, |a|)
        vec![(0, 1.0, 100.0), (2, 0.5, 0.0), (3, 3.0, 30.0), (5, 2.0, 1.0), (7, 0.1, 0.01)]
    }

    #[test]
    fn absolute_and_relative_order_by_significance() {
        let mut p = Picker::new(Priority::Absolute, 1);
        assert_eq!(pick(&mut p, &cands(), 3, 8), vec![3, 5, 0]);
        // Relative: 0.01, 0.5 (a = 0: absolute), 0.1, 2.0, 10.0.
        let mut p = Picker::new(Priority::Relative, 1);
        assert_eq!(pick(&mut p, &cands(), 5, 8), vec![7, 5, 2, 3, 0]);
        assert_eq!(pick(&mut p, &cands(), 2, 8), vec![7, 5]);
    }

    #[test]
    fn round_robin_continues_where_it_stopped_and_wraps() {
        let mut p = Picker::new(Priority::RoundRobin, 1);
        assert_eq!(pick(&mut p, &cands(), 2, 8), vec![0, 2]);
        assert_eq!(pick(&mut p, &cands(), 2, 8), vec![3, 5]);
        assert_eq!(pick(&mut p, &cands(), 2, 8), vec![7, 0]);
        assert_eq!(p.cursor, 1);
    }

    #[test]
    fn random_takes_distinct_rows_and_covers_all_over_time() {
        let mut p = Picker::new(Priority::Random, 7);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let out = pick(&mut p, &cands(), 2, 8);
            assert_eq!(out.len(), 2);
            assert_ne!(out[0], out[1]);
            seen.extend(out);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 2, 3, 5, 7]);
    }
}
