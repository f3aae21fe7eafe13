//! A bandwidth budget on ASAP's graph edges (`--sync asap --bandwidth-mbps B`): Bosen's managed
//! communication (§3.3) applied to a decentralised graph instead of parameter-server links.
//!
//! Each round a rank still sends one message per out-edge (NOTIFY-ACK needs it), but the message
//! carries only the rows that fit the rank's budget, most significant first. Per out-edge the
//! sender keeps a *mirror*: the values that receiver holds of its model, row by row. A row's
//! residual on that edge is `w - mirror`; sending the row ships its current values and sets the
//! mirror to them, so whatever was not sent stays in the residual and goes out with a later
//! message: every update arrives eventually. The receiver keeps the matching *cache* of each
//! in-neighbour's model and reduces with it, `w <- (w + sum_i cache_i) / (1 + d)`: rows that did
//! not come this round enter the average with the value they had when they last came. Mirror and
//! cache hold the same bits, because a row travels as values, not as a difference.
//!
//! Significance is the row's residual (L1 norm) for `absolute`, relative to the row's L1 norm for
//! `relative` (Bosen's priorities, [`crate::sync::ps::managed::pick`]), multiplied by `1 + age`, age being the
//! rounds since the row last went out on that edge: a row whose residual is small but not zero is
//! still sent within a bounded number of rounds instead of starving behind rows that keep
//! changing. `random` and `round-robin` need no ageing.
//!
//! Consistency stays per message under NOTIFY-ACK (a message is read only after its NOTIFY and
//! never overwritten before its ACK), and per row it is accounted as the age of each cached row
//! that entered a reduce (0: it came this round).
//!
//! [`EdgeBudget`] is the per-edge state and its arithmetic (testable without MPI);
//! `BudgetedEdges` is the asap variant that runs it over the mailboxes, with the token bucket.

use std::time::Instant;

use anyhow::{bail, ensure, Context};
use mpi::topology::Communicator;

use super::neighbourhood::{Inbox, Message, Neighbourhood, Outbox, Slot};
use super::variant::Gossip;
use crate::comm::mailbox::{Mailboxes, WORD};
use crate::comm::pace::TokenBucket;
use crate::model::RowLayout;
use crate::sync::ps::managed::{pick, Picker, Priority};
use crate::sync::{Aggregate, ModeMetric, ModeState, SyncContext};

/// Options of the budget (from `--bandwidth-mbps` and `--priority`). No row cap: bosen's
/// `--queue-size` caps one of many messages per clock, while an edge carries one message per
/// round, so a cap would bound the rows per round whatever the budget (at 100 rows, MF's 2,625
/// rows reached a neighbour once every 26 rounds and the run missed its target).
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeBudgetOptions {
    pub mbps: f64,
    pub priority: Priority,
}

/// Bytes of a message beyond its rows: the row count (4) and the mailbox's round, length and
/// footer words and the NOTIFY word (8 each).
pub const MESSAGE_OVERHEAD: u64 = 4 + 4 * 8;

/// Ages of cached rows entering a reduce are counted in `AGE_BINS` bins, the last for "older".
pub const AGE_BINS: usize = 17;

/// Per-edge mirrors and per-neighbour caches of one rank.
pub struct EdgeBudget {
    layout: RowLayout,
    /// Per out-edge: that receiver's copy of our model, as far as our messages told it.
    mirror: Vec<Vec<f32>>,
    /// Per out-edge, per row: the round the row last went out (0: never).
    sent_at: Vec<Vec<u64>>,
    pickers: Vec<Picker>,
    /// Per in-neighbour: its model as far as its messages told us.
    cache: Vec<Vec<f32>>,
    /// Per in-neighbour, per row: the round the row last arrived (0: the initial model).
    fresh_at: Vec<Vec<u64>>,
    /// Per row: how often it went out (over all edges).
    row_sends: Vec<u64>,
    /// Ages of the cached rows that entered reduces.
    age_histogram: Vec<u64>,
    /// `[k]`: (reduce, row) pairs in which k in-neighbours' row had arrived that round (ASAP's
    /// consistency histogram, per row).
    row_consistency: Vec<u64>,
    rows_sent: u64,
    rows_held: u64,
    /// Rows found different by the end-of-run mirror check.
    pub mismatched: u64,
}

impl EdgeBudget {
    /// State for `out_degree` out-edges and `in_degree` in-neighbours, every mirror and cache
    /// starting at `init` (every rank starts from the same seeded model).
    pub fn new(layout: RowLayout, init: &[f32], out_degree: usize, in_degree: usize, opts: &EdgeBudgetOptions, seed: u64) -> Self {
        let rows = layout.rows();
        EdgeBudget {
            mirror: vec![init.to_vec(); out_degree],
            sent_at: vec![vec![0; rows]; out_degree],
            pickers: (0..out_degree).map(|j| Picker::new(opts.priority, seed ^ (0x9e37_79b9 + j as u64))).collect(),
            cache: vec![init.to_vec(); in_degree],
            fresh_at: vec![vec![0; rows]; in_degree],
            row_sends: vec![0; rows],
            age_histogram: vec![0; AGE_BINS],
            row_consistency: vec![0; in_degree + 1],
            rows_sent: 0,
            rows_held: 0,
            mismatched: 0,
            layout,
        }
    }

    /// Largest message body for `layout`: every row.
    pub fn max_body_bytes(layout: &RowLayout) -> usize {
        4 + 4 * layout.rows() + 4 * layout.offsets.last().copied().unwrap_or(0)
    }

    /// Bytes of the largest single-row message (the least a budget must allow at once).
    pub fn largest_row_message(&self) -> u64 {
        let longest = (0..self.layout.rows()).map(|r| self.layout.range(r).len()).max().unwrap_or(0);
        MESSAGE_OVERHEAD + 4 + 4 * longest as u64
    }

    /// Chooses the rows for out-edge `j` at `round` that fit in `allowance` bytes (message
    /// overhead included), most significant first, writes them into `body` and records them as
    /// sent. An empty message (no row) still goes out: the receiver's NOTIFY-ACK round needs it.
    pub fn compose(&mut self, j: usize, round: u64, w: &[f32], allowance: u64, body: &mut Vec<u8>) {
        let ageing = matches!(self.pickers[j].priority, Priority::Absolute | Priority::Relative);
        let mirror = &self.mirror[j];
        let candidates: Vec<(u32, f32, f32)> = (0..self.layout.rows())
            .filter_map(|r| {
                let range = self.layout.range(r);
                let (mut resid, mut norm) = (0f32, 0f32);
                for (x, m) in w[range.clone()].iter().zip(&mirror[range]) {
                    resid += (x - m).abs();
                    norm += x.abs();
                }
                // A NaN residual (a diverged model) must go out too, not hide as "not > 0".
                (resid > 0.0 || resid.is_nan()).then(|| {
                    let age = if ageing { 1 + round.saturating_sub(self.sent_at[j][r]) } else { 1 };
                    (r as u32, resid * age as f32, norm)
                })
            })
            .collect();
        let order = pick(&mut self.pickers[j], &candidates, candidates.len(), self.layout.rows());
        let mut budget = allowance.saturating_sub(MESSAGE_OVERHEAD);
        let mut chosen = Vec::new();
        for &r in &order {
            let cost = 4 + 4 * self.layout.range(r as usize).len() as u64;
            if cost > budget {
                break;
            }
            budget -= cost;
            chosen.push(r);
        }
        if self.pickers[j].priority == Priority::RoundRobin && chosen.len() < order.len() {
            // Continue after the last row that really went out.
            self.pickers[j].cursor = chosen.last().map_or(order[0] as usize, |&r| r as usize + 1) % self.layout.rows().max(1);
        }
        self.rows_held += (candidates.len() - chosen.len()) as u64;
        self.rows_sent += chosen.len() as u64;
        body.clear();
        body.extend_from_slice(&(chosen.len() as u32).to_ne_bytes());
        for &r in &chosen {
            body.extend_from_slice(&r.to_ne_bytes());
        }
        for &r in &chosen {
            let range = self.layout.range(r as usize);
            for x in &w[range.clone()] {
                body.extend_from_slice(&x.to_ne_bytes());
            }
            self.mirror[j][range.clone()].copy_from_slice(&w[range]);
            self.sent_at[j][r as usize] = round;
            self.row_sends[r as usize] += 1;
        }
    }

    /// Applies in-neighbour `i`'s message of `round` to its cache.
    pub fn absorb(&mut self, i: usize, round: u64, body: &[u8]) -> anyhow::Result<()> {
        let word = |k: usize| -> anyhow::Result<u32> {
            let b = body.get(4 * k..4 * k + 4).ok_or_else(|| anyhow::anyhow!("message of {} bytes ends inside word {k}", body.len()))?;
            Ok(u32::from_ne_bytes(b.try_into().expect("4 bytes")))
        };
        let n = word(0)? as usize;
        let mut at = 1 + n;
        for k in 0..n {
            let r = word(1 + k)? as usize;
            ensure!(r < self.layout.rows(), "message names row {r} of {}", self.layout.rows());
            let range = self.layout.range(r);
            for p in range {
                self.cache[i][p] = f32::from_bits(word(at)?);
                at += 1;
            }
            self.fresh_at[i][r] = round;
        }
        if 4 * at != body.len() {
            bail!("message of {} bytes holds {} bytes of rows", body.len(), 4 * at);
        }
        Ok(())
    }

    /// Adds every in-neighbour's cached model to `acc`, counting the age of each row at `round`.
    pub fn add_caches(&mut self, acc: &mut [f32], round: u64) {
        for (cache, fresh) in self.cache.iter().zip(&self.fresh_at) {
            for (a, x) in acc.iter_mut().zip(cache) {
                *a += *x;
            }
            for &f in fresh {
                let age = round.saturating_sub(f) as usize;
                self.age_histogram[age.min(AGE_BINS - 1)] += 1;
            }
        }
        for r in 0..self.layout.rows() {
            let k = self.fresh_at.iter().filter(|f| f[r] == round).count();
            self.row_consistency[k] += 1;
        }
    }

    /// `[k]`: (reduce, row) pairs in which k in-neighbours' row had arrived that round.
    pub fn row_consistency(&self) -> &[u64] {
        &self.row_consistency
    }

    /// A message of every row of out-edge `j`'s mirror (what that receiver should hold of us),
    /// for checking the protocol's invariant with [`EdgeBudget::mismatched_rows`].
    pub fn mirror_message(&self, j: usize, body: &mut Vec<u8>) {
        let rows = self.layout.rows();
        body.clear();
        body.extend_from_slice(&(rows as u32).to_ne_bytes());
        (0..rows as u32).for_each(|r| body.extend_from_slice(&r.to_ne_bytes()));
        self.mirror[j].iter().for_each(|x| body.extend_from_slice(&x.to_ne_bytes()));
    }

    /// Rows in which in-neighbour `i`'s mirror message differs (bit for bit) from our cache of it:
    /// 0 unless a message was lost or a checkpoint restored mismatched state.
    pub fn mismatched_rows(&self, i: usize, body: &[u8]) -> anyhow::Result<u64> {
        let p = self.layout.offsets.last().copied().unwrap_or(0);
        let rows = self.layout.rows();
        ensure!(body.len() == 4 * (1 + rows + p), "mirror message of {} bytes, expected {}", body.len(), 4 * (1 + rows + p));
        let at = 4 * (1 + rows);
        let value = |k: usize| u32::from_ne_bytes(body[at + 4 * k..at + 4 * k + 4].try_into().expect("4 bytes"));
        Ok((0..rows).filter(|&r| self.layout.range(r).any(|k| value(k) != self.cache[i][k].to_bits())).count() as u64)
    }

    /// Per row, how often it went out.
    pub fn row_sends(&self) -> &[u64] {
        &self.row_sends
    }

    /// Ages (rounds, last bin: older) of the cached rows that entered reduces.
    pub fn age_histogram(&self) -> &[u64] {
        &self.age_histogram
    }

    /// Rows sent, and rows with a residual that the budget held back (summed over rounds).
    pub fn rows_sent_and_held(&self) -> (u64, u64) {
        (self.rows_sent, self.rows_held)
    }

    /// Mirrors, caches and their round stamps, for a checkpoint taken after every rank finished
    /// the same round (then every message sent has been absorbed, so mirrors equal caches).
    pub fn save_state(&self) -> ModeState {
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let u = |v: &[u64]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let mut s = ModeState::new();
        for (j, (m, t)) in self.mirror.iter().zip(&self.sent_at).enumerate() {
            s.push((format!("edge_mirror_{j}"), f(m)));
            s.push((format!("edge_sent_at_{j}"), u(t)));
        }
        for (i, (c, t)) in self.cache.iter().zip(&self.fresh_at).enumerate() {
            s.push((format!("edge_cache_{i}"), f(c)));
            s.push((format!("edge_fresh_at_{i}"), u(t)));
        }
        s.push(("edge_row_sends".into(), u(&self.row_sends)));
        s
    }

    /// Restores what [`EdgeBudget::save_state`] wrote.
    pub fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        let mut map: std::collections::HashMap<String, Vec<f64>> = state.into_iter().collect();
        let mut take = |name: String, len: usize| -> anyhow::Result<Vec<f64>> {
            let v = map.remove(&name).ok_or_else(|| {
                anyhow::anyhow!("the checkpoint has no {name}: resume with the --bandwidth-mbps and graph of the run that wrote it")
            })?;
            ensure!(v.len() == len, "the checkpoint's {name} has {} values, expected {len}", v.len());
            Ok(v)
        };
        let (p, rows) = (self.layout.offsets.last().copied().unwrap_or(0), self.layout.rows());
        for j in 0..self.mirror.len() {
            self.mirror[j] = take(format!("edge_mirror_{j}"), p)?.iter().map(|&x| x as f32).collect();
            self.sent_at[j] = take(format!("edge_sent_at_{j}"), rows)?.iter().map(|&x| x as u64).collect();
        }
        for i in 0..self.cache.len() {
            self.cache[i] = take(format!("edge_cache_{i}"), p)?.iter().map(|&x| x as f32).collect();
            self.fresh_at[i] = take(format!("edge_fresh_at_{i}"), rows)?.iter().map(|&x| x as u64).collect();
        }
        self.row_sends = take("edge_row_sends".into(), rows)?.iter().map(|&x| x as u64).collect();
        if let Some(extra) = map.keys().next() {
            bail!("the checkpoint holds {extra}, which this run's asap edges do not use (another graph?)");
        }
        Ok(())
    }
}

/// Share of a second's budget the bucket may hold: over any 1 s window a rank then sends at most
/// 4 % above its budget (plus the few protocol bytes of one overdraw), inside the 5 % the budget
/// test allows. At least one row must fit, or the largest row could never go out.
const BUCKET_SECONDS: f64 = 0.04;

/// `--sync asap --bandwidth-mbps`: NOTIFY-ACK whose messages carry the rows the budget lets
/// through, over asap's mailboxes (variable-length messages).
pub(in crate::sync) struct BudgetedEdges {
    bucket: TokenBucket,
    /// Bytes the bucket holds at most.
    capacity: u64,
    edges: EdgeBudget,
    /// One message's body, sent or received.
    body: Vec<u8>,
    acc: Vec<f32>,
}

impl BudgetedEdges {
    /// Collectively sets up the mailboxes for `in_neighbours` (each slot holds a message of every
    /// row; none with `p2p`, whose messages go two-sided) and this rank's edges, every mirror and
    /// cache at `init`.
    pub(in crate::sync) fn build(
        ctx: &SyncContext,
        in_neighbours: &[Vec<usize>],
        init: &[f32],
        b: &EdgeBudgetOptions,
        p2p: bool,
    ) -> anyhow::Result<(Mailboxes, Self)> {
        let body = if p2p { 0 } else { EdgeBudget::max_body_bytes(&ctx.layout) };
        let mail = Mailboxes::for_bytes(ctx.comm, in_neighbours, body).context("setting up the ASAP mailboxes (one-sided MPI window)")?;
        let (d_out, d_in) = (mail.out_neighbours().len(), mail.in_neighbours().len());
        let edges = EdgeBudget::new(ctx.layout.clone(), init, d_out, d_in, b, ctx.seed ^ ctx.comm.rank() as u64);
        let rate = b.mbps * 1e6 / 8.0;
        let capacity = ((rate * BUCKET_SECONDS) as u64).max(edges.largest_row_message());
        let bucket = TokenBucket::new(b.mbps, capacity);
        let bucket = if ctx.record_sends { bucket.record() } else { bucket };
        Ok((mail, BudgetedEdges { bucket, capacity, edges, body: Vec::new(), acc: vec![0.0; ctx.n_params()] }))
    }

    /// What the metrics' start line records about the budget.
    pub(in crate::sync) fn info(&self, b: &EdgeBudgetOptions) -> serde_json::Value {
        serde_json::json!({"mbps": b.mbps, "priority": b.priority, "bucket_bytes": self.capacity})
    }
}

/// One round's sending side of the budgeted edges: each out-edge gets an equal share of what the
/// bucket holds when its turn comes (once its ACK came), and its message carries the rows that
/// fit; what the put cost is spent from the bucket.
struct BudgetedSend<'a> {
    edges: &'a mut BudgetedEdges,
    params: &'a [f32],
    out_degree: usize,
}

impl Outbox for BudgetedSend<'_> {
    fn message(&mut self, j: usize, round: u64, acked: Instant) -> Message<'_> {
        let e = &mut *self.edges;
        let share = e.bucket.available_at(acked) / (self.out_degree - j) as u64;
        e.edges.compose(j, round, self.params, share, &mut e.body);
        Message::Bytes(&e.body)
    }

    fn sent(&mut self, bytes: u64, put_end: Instant) {
        self.edges.bucket.spend_at(bytes, put_end);
    }
}

/// The receiving side: each message's rows go into the sender's cache.
impl Inbox for BudgetedEdges {
    fn slot(&mut self) -> Slot<'_> {
        Slot::Bytes(&mut self.body)
    }

    fn received(&mut self, i: usize, round: u64) -> anyhow::Result<()> {
        self.edges.absorb(i, round, &self.body)
    }
}

/// The end-of-run mirror check's round: each out-neighbour gets our mirror of it, and each
/// in-neighbour's mirror of us is set against our cache of it.
struct MirrorCheck<'a>(&'a mut BudgetedEdges);

impl Outbox for MirrorCheck<'_> {
    fn message(&mut self, j: usize, _round: u64, _acked: Instant) -> Message<'_> {
        self.0.edges.mirror_message(j, &mut self.0.body);
        Message::Bytes(&self.0.body)
    }
}

impl Inbox for MirrorCheck<'_> {
    fn slot(&mut self) -> Slot<'_> {
        Slot::Bytes(&mut self.0.body)
    }

    fn received(&mut self, i: usize, _round: u64) -> anyhow::Result<()> {
        let e = &mut self.0.edges;
        e.mismatched += e.mismatched_rows(i, &self.0.body)?;
        Ok(())
    }
}

impl Gossip for BudgetedEdges {
    /// Sends (see [`BudgetedSend`]), then the reduce uses every in-neighbour's cached model,
    /// fresh rows and old ones. Every ACK word is spent from the bucket as it goes out.
    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let out_degree = net.mail.out_neighbours().len();
        net.send_each(round, &mut BudgetedSend { edges: self, params, out_degree })?;
        let t2 = net.receive_round(round, self)?;
        let d = net.in_degree();
        self.acc.copy_from_slice(params);
        self.edges.add_caches(&mut self.acc, round);
        net.reduce_into(params, &self.acc, d);
        net.ack_round_then(t2, |at| self.bucket.spend_at(WORD, at))
    }

    /// One more NOTIFY-ACK round after training, outside the budget and the byte counts: each
    /// rank sends every out-neighbour its mirror, and each receiver counts the rows in which its
    /// cache differs (`edge_mismatched_rows`, 0 unless the protocol lost an update).
    fn verify(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        let round = net.last_round + 1;
        net.exchange_untimed(round, &mut MirrorCheck(self)).context("the budgeted edges' end-of-run mirror check")
    }

    fn drain(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        net.drain_acks()
    }

    fn save_state(&self) -> ModeState {
        self.edges.save_state()
    }

    fn restore_state(&mut self, state: ModeState, _n_params: usize) -> anyhow::Result<()> {
        self.edges.restore_state(state)
    }

    fn metrics(&self, out: &mut Vec<ModeMetric>) {
        let e = &self.edges;
        let (sent, held) = e.rows_sent_and_held();
        out.extend([
            ModeMetric::array("row_pushes", Aggregate::Sum, e.row_sends().iter().map(|&c| c as f64)),
            ModeMetric::array("row_consistency_histogram", Aggregate::Sum, e.row_consistency().iter().map(|&c| c as f64)),
            ModeMetric::array("row_age_histogram", Aggregate::Sum, e.age_histogram().iter().map(|&c| c as f64)),
            ModeMetric::number("rows_sent", Aggregate::Sum, sent as f64),
            ModeMetric::number("rows_held", Aggregate::Sum, held as f64),
            ModeMetric::number("edge_mismatched_rows", Aggregate::Sum, e.mismatched as f64),
        ]);
    }

    /// Everything this rank puts goes through the bucket (messages, NOTIFY and ACK words).
    fn send_log(&self, _net: &Neighbourhood) -> Vec<(f64, u64)> {
        self.bucket.log().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(priority: Priority) -> EdgeBudgetOptions {
        EdgeBudgetOptions { mbps: 1.0, priority }
    }

    /// 4 rows of 3 parameters, one out-edge and one in-neighbour.
    fn budget(priority: Priority) -> EdgeBudget {
        EdgeBudget::new(RowLayout::uniform(4, 3), &[0.0; 12], 1, 1, &opts(priority), 7)
    }

    const ROW: u64 = 4 + 12;

    #[test]
    fn the_most_significant_rows_that_fit_go_first_and_arrive_bit_for_bit() {
        let mut b = budget(Priority::Absolute);
        // Residual L1 per row: 0.3, 3, 0 (not a candidate), 30.
        let w = [0.1, 0.1, 0.1, 1., 1., 1., 0., 0., 0., 10., 10., 10.];
        let mut body = Vec::new();
        b.compose(0, 1, &w, MESSAGE_OVERHEAD + 2 * ROW, &mut body);
        assert_eq!(body.len() as u64, 4 + 2 * ROW);
        // The receiver side (the same struct's in-neighbour cache) sees rows 3 and 1 only.
        b.absorb(0, 1, &body).unwrap();
        assert_eq!(b.cache[0], [0., 0., 0., 1., 1., 1., 0., 0., 0., 10., 10., 10.]);
        assert_eq!(b.row_sends(), [0, 1, 0, 1]);
        assert_eq!(b.rows_sent_and_held(), (2, 1));
        // The mirror says what the receiver holds: exactly the cache.
        assert_eq!(b.mirror[0], b.cache[0]);
        // Next round, with nothing changed, only row 0's residual is left: it goes out.
        b.compose(0, 2, &w, MESSAGE_OVERHEAD + 2 * ROW, &mut body);
        b.absorb(0, 2, &body).unwrap();
        assert_eq!(b.cache[0].to_vec(), w.to_vec());
        // Nothing left: an empty message (the row count only).
        b.compose(0, 3, &w, u64::MAX, &mut body);
        assert_eq!(body, 0u32.to_ne_bytes());
        // Too little allowance for the overhead: still an empty message, nothing lost.
        let w2 = [5.0; 12];
        b.compose(0, 4, &w2, 3, &mut body);
        assert_eq!(body.len(), 4);
        assert_eq!(b.mirror[0].to_vec(), w.to_vec());
    }

    #[test]
    fn ageing_sends_a_small_residual_within_bounded_rounds() {
        // Row 0 changes a little once; rows 1-3 keep changing a lot; one row fits per round.
        // (Under `absolute` the wait grows as the residual shrinks: bounded, but long.)
        let mut b = budget(Priority::Relative);
        let mut w = [0f32; 12];
        w[0] = 1e-3;
        let mut body = Vec::new();
        let mut sent_row0 = None;
        for round in 1..=200u64 {
            for x in &mut w[3..] {
                *x += 1.0;
            }
            b.compose(0, round, &w, MESSAGE_OVERHEAD + ROW, &mut body);
            b.absorb(0, round, &body).unwrap();
            if b.cache[0][0] == 1e-3 {
                sent_row0 = Some(round);
                break;
            }
        }
        let r = sent_row0.expect("row 0 starved");
        assert!(r < 100, "row 0 waited {r} rounds");
    }

    #[test]
    fn round_robin_continues_after_the_last_row_sent() {
        let mut b = budget(Priority::RoundRobin);
        let w = [1.0; 12];
        let mut body = Vec::new();
        let mut order = Vec::new();
        for round in 1..=4 {
            let before = b.row_sends().to_vec();
            b.compose(0, round, &w.map(|x| x * round as f32), MESSAGE_OVERHEAD + ROW, &mut body);
            order.push(b.row_sends().iter().zip(&before).position(|(a, b)| a != b).unwrap());
        }
        assert_eq!(order, [0, 1, 2, 3]);
    }

    #[test]
    fn the_mirror_check_finds_rows_a_receiver_never_got() {
        let mut b = budget(Priority::Absolute);
        let w: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let mut body = Vec::new();
        b.compose(0, 1, &w, u64::MAX, &mut body);
        b.absorb(0, 1, &body).unwrap();
        b.mirror_message(0, &mut body);
        assert_eq!(b.mismatched_rows(0, &body).unwrap(), 0);
        // A message the receiver never absorbed: its rows now differ.
        let w2: Vec<f32> = w.iter().map(|x| x + if *x >= 6.0 { 1.0 } else { 0.0 }).collect();
        b.compose(0, 2, &w2, u64::MAX, &mut body);
        b.mirror_message(0, &mut body);
        assert_eq!(b.mismatched_rows(0, &body).unwrap(), 2);
    }

    #[test]
    fn malformed_messages_are_refused() {
        let mut b = budget(Priority::Random);
        let mut bad = 1u32.to_ne_bytes().to_vec();
        bad.extend_from_slice(&9u32.to_ne_bytes());
        bad.extend_from_slice(&[0; 12]);
        assert!(b.absorb(0, 1, &bad).unwrap_err().to_string().contains("row 9 of 4"));
        let mut short = 1u32.to_ne_bytes().to_vec();
        short.extend_from_slice(&2u32.to_ne_bytes());
        assert!(b.absorb(0, 1, &short).is_err());
    }

    #[test]
    fn state_round_trips_and_a_different_graph_is_refused() {
        let mut b = budget(Priority::Absolute);
        let w: Vec<f32> = (0..12).map(|x| x as f32 * 0.5).collect();
        let mut body = Vec::new();
        b.compose(0, 1, &w, MESSAGE_OVERHEAD + 2 * ROW, &mut body);
        b.absorb(0, 1, &body).unwrap();
        let s = b.save_state();
        let mut c = budget(Priority::Absolute);
        c.restore_state(s.clone()).unwrap();
        assert_eq!((&c.mirror, &c.cache, &c.sent_at, &c.fresh_at), (&b.mirror, &b.cache, &b.sent_at, &b.fresh_at));
        let mut two_edges = EdgeBudget::new(RowLayout::uniform(4, 3), &[0.0; 12], 2, 1, &opts(Priority::Absolute), 7);
        assert!(two_edges.restore_state(s).unwrap_err().to_string().contains("edge_mirror_1"));
    }
}
