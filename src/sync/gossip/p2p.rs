//! NOTIFY-ACK over two-sided messages (`--transport p2p`): the same protocol as the one-sided
//! mailboxes, on [`Postbox`]'s non-blocking `MPI_Isend`s and matched receives.
//!
//! - A message is `[round u64 | the model's f32 values]` (or a variant's encoded bytes: the
//!   budgeted and compressed edges), sent with tag [`DATA`] once the
//!   receiver's ACK of the previous message on that edge came: a sender never has more than one
//!   message in flight per edge, as with a mailbox slot, so no message overtakes or replaces an
//!   unread one.
//! - The receiver takes every message MPI has for it into a queue per in-neighbour (MPI keeps
//!   the order of one sender's messages) and reads them in order; it ACKs each with its count
//!   (tag [`ACK`]). A message is complete when it is received, so a read cannot be torn; the
//!   round in its header is still checked against the round being reduced, and a mismatch is
//!   counted as torn and is an error, as on the mailboxes (0 expected).
//!
//! Why (issue 41): over TCP, Open MPI's one-sided layer (osc/ucx on UCX's TCP transport) turns
//! each put, flush, NOTIFY and ACK into software round trips: a round over a real 10 ms link cost
//! about 18 one-way latencies (docs/emulation.md). Two-sided messages cost one latency each way:
//! the data and its NOTIFY are one message, and the ACK is another.
//!
//! Messages progress while the owner calls in: every wait here polls, and the engine polls
//! between local steps too ([`P2pLinks::poll`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::comm::backoff::Backoff;
use crate::comm::mailbox::SlotRead;
use crate::comm::postbox::Postbox;

/// Tag of a model message.
const DATA: i32 = 0x4e41;
/// Tag of an ACK (the receiver's count of the messages it read on that edge).
const ACK: i32 = 0x4e42;
/// Tag of a settling count to an out-neighbour: the model messages sent to it so far.
const DATA_COUNT: i32 = 0x4e43;
/// Tag of a settling count to an in-neighbour: the ACK messages sent to it so far.
const ACK_COUNT: i32 = 0x4e44;
/// Bytes of a message's header (its round).
const HEADER: usize = 8;

/// One rank's edges as two-sided links.
pub(in crate::sync) struct P2pLinks {
    post: Postbox,
    rank: usize,
    ins: Vec<usize>,
    outs: Vec<usize>,
    /// Per in-neighbour: messages received and not yet read, in order.
    inbox: Vec<VecDeque<Vec<u8>>>,
    /// Per in-neighbour: messages read (and ACKed).
    read: Vec<u64>,
    /// Per out-neighbour: messages sent, and the receiver's ACK count.
    sent: Vec<u64>,
    acked: Vec<u64>,
    /// Messages a sender may have unacknowledged per edge (bounded staleness: S + 2; 1 else).
    depth: u64,
    /// Per in-neighbour: model messages received, the newest one taken out of the queue (what
    /// the one-sided slot would hold now), and ACK messages sent.
    got: Vec<u64>,
    latest: Vec<Option<Vec<u8>>>,
    acks_sent: Vec<u64>,
    /// Per out-neighbour: ACK messages received.
    acks_got: Vec<u64>,
    /// Settling counts received, oldest first: per in-neighbour (model messages it sent us) and
    /// per out-neighbour (ACK messages it sent us).
    data_due: Vec<VecDeque<u64>>,
    acks_due: Vec<VecDeque<u64>>,
}

impl P2pLinks {
    /// Links over `post` (a private communicator with its pacing) to the sorted, deduplicated
    /// `ins` and `outs` of this rank.
    /// The paced sends of this rank's postbox (`--send-log`).
    pub(in crate::sync) fn send_log(&self) -> Vec<(f64, u64)> {
        self.post.pacer().map_or(Vec::new(), |p| p.log().to_vec())
    }

    pub(in crate::sync) fn new(post: Postbox, ins: &[usize], outs: &[usize]) -> Self {
        P2pLinks {
            rank: post.rank(),
            inbox: vec![VecDeque::new(); ins.len()],
            read: vec![0; ins.len()],
            sent: vec![0; outs.len()],
            acked: vec![0; outs.len()],
            depth: 1,
            got: vec![0; ins.len()],
            latest: vec![None; ins.len()],
            acks_sent: vec![0; ins.len()],
            acks_got: vec![0; outs.len()],
            data_due: vec![VecDeque::new(); ins.len()],
            acks_due: vec![VecDeque::new(); outs.len()],
            ins: ins.to_vec(),
            outs: outs.to_vec(),
            post,
        }
    }

    /// Lets a sender have `depth` messages unacknowledged per edge (bounded staleness keeps the
    /// newest unacknowledged for reuse: `bounded::slot_depth`).
    pub(in crate::sync) fn with_depth(mut self, depth: usize) -> Self {
        self.depth = depth.max(1) as u64;
        self
    }

    pub(in crate::sync) fn bytes_sent(&self) -> u64 {
        self.post.bytes_sent()
    }

    pub(in crate::sync) fn bytes_received(&self) -> u64 {
        self.post.bytes_received()
    }

    /// Hands queued sends to MPI and takes in every message and ACK that arrived.
    pub(in crate::sync) fn poll(&mut self) -> anyhow::Result<()> {
        self.post.progress_sends()?;
        while let Some((src, buf)) = self.post.try_receive(DATA) {
            let Some(i) = self.ins.iter().position(|&r| r == src) else {
                bail!("rank {}: a model message from rank {src}, which is not an in-neighbour", self.rank)
            };
            self.inbox[i].push_back(buf);
            self.got[i] += 1;
        }
        while let Some((src, buf)) = self.post.try_receive(ACK) {
            let j = self.out_index(src, "an ACK")?;
            self.acked[j] = self.acked[j].max(count_of(&buf));
            self.acks_got[j] += 1;
        }
        while let Some((src, buf)) = self.post.try_receive(DATA_COUNT) {
            let i = self.in_index(src, "a message count")?;
            self.data_due[i].push_back(count_of(&buf));
        }
        while let Some((src, buf)) = self.post.try_receive(ACK_COUNT) {
            let j = self.out_index(src, "an ACK count")?;
            self.acks_due[j].push_back(count_of(&buf));
        }
        Ok(())
    }

    fn in_index(&self, src: usize, what: &str) -> anyhow::Result<usize> {
        match self.ins.iter().position(|&r| r == src) {
            Some(i) => Ok(i),
            None => bail!("rank {}: {what} from rank {src}, which is not an in-neighbour", self.rank),
        }
    }

    fn out_index(&self, src: usize, what: &str) -> anyhow::Result<usize> {
        match self.outs.iter().position(|&r| r == src) {
            Some(j) => Ok(j),
            None => bail!("rank {}: {what} from rank {src}, which is not an out-neighbour", self.rank),
        }
    }

    /// Polls until `done` holds; past `timeout` an error naming `what` and the ranks in `missing`.
    fn wait(
        &mut self,
        round: u64,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Self) -> bool,
        missing: impl Fn(&Self) -> Vec<usize>,
    ) -> anyhow::Result<()> {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            self.poll()?;
            if done(self) {
                return Ok(());
            }
            // A rank was lost (src/comm/ulfm.rs): what is waited for may never come.
            if crate::comm::ulfm::lost() {
                bail!("rank {}: round {round}: a rank was lost while waiting for {what}", self.rank);
            }
            if start.elapsed() > timeout {
                bail!(
                    "rank {}: round {round}: waited {:.1?} for {what} from rank(s) {:?}, which never arrived; a peer may have \
                     failed or stopped sending. If they are only slow (oversubscribed, stragglers), raise --wait-timeout (now {timeout:?})",
                    self.rank,
                    start.elapsed(),
                    missing(self)
                );
            }
            backoff.pause();
        }
    }

    /// Waits until out-neighbour `j` has read every message sent to it (its ACK came), all but
    /// `depth - 1` of them with bounded staleness: a send now would overwrite no unread message.
    pub(in crate::sync) fn wait_ack(&mut self, j: usize, round: u64, timeout: Duration) -> anyhow::Result<()> {
        self.wait(round, timeout, "the ACK", |s| s.slot_free(j), |s| vec![s.outs[j]])
    }

    /// Whether a message to out-neighbour `j` may go now (see [`P2pLinks::wait_ack`]); does not
    /// poll.
    pub(in crate::sync) fn slot_free(&self, j: usize) -> bool {
        self.acked[j] + self.depth > self.sent[j]
    }

    /// Waits until every out-neighbour has read every message sent to it.
    pub(in crate::sync) fn wait_acks(&mut self, round: u64, timeout: Duration) -> anyhow::Result<()> {
        let missing = |s: &Self| (0..s.outs.len()).filter(|&j| s.acked[j] < s.sent[j]).map(|j| s.outs[j]).collect();
        self.wait(round, timeout, "the ACK", |s| (0..s.outs.len()).all(|j| s.acked[j] >= s.sent[j]), missing)
    }

    /// Sends `values` of `round` to out-neighbour `j` (after [`P2pLinks::wait_ack`]).
    pub(in crate::sync) fn send_to(&mut self, j: usize, round: u64, values: &[f32]) -> anyhow::Result<()> {
        let mut buf = Vec::with_capacity(HEADER + 4 * values.len());
        buf.extend_from_slice(&round.to_le_bytes());
        values.iter().for_each(|v| buf.extend_from_slice(&v.to_le_bytes()));
        self.post.send(self.outs[j], DATA, buf)?;
        self.sent[j] += 1;
        Ok(())
    }

    /// Sends an encoded `body` of `round` to out-neighbour `j` (after [`P2pLinks::wait_ack`]).
    pub(in crate::sync) fn send_bytes_to(&mut self, j: usize, round: u64, body: &[u8]) -> anyhow::Result<()> {
        let mut buf = Vec::with_capacity(HEADER + body.len());
        buf.extend_from_slice(&round.to_le_bytes());
        buf.extend_from_slice(body);
        self.post.send(self.outs[j], DATA, buf)?;
        self.sent[j] += 1;
        Ok(())
    }

    /// Copies in-neighbour `i`'s oldest unread encoded message into `out` and says which round it
    /// held.
    pub(in crate::sync) fn read_bytes(&mut self, i: usize, out: &mut Vec<u8>) -> SlotRead {
        let Some(buf) = self.inbox[i].pop_front() else { return SlotRead::Empty };
        let Some(header) = buf.get(..HEADER) else { return SlotRead::Torn(0, buf.len() as u64) };
        out.clear();
        out.extend_from_slice(&buf[HEADER..]);
        SlotRead::Consistent(u64::from_le_bytes(header.try_into().expect("8 bytes")))
    }

    /// Waits until a message is there from every in-neighbour.
    pub(in crate::sync) fn wait_notifications(&mut self, round: u64, timeout: Duration) -> anyhow::Result<()> {
        let missing = |s: &Self| (0..s.ins.len()).filter(|&i| s.inbox[i].is_empty()).map(|i| s.ins[i]).collect();
        self.wait(round, timeout, "NOTIFY (a model message)", |s| s.inbox.iter().all(|q| !q.is_empty()), missing)
    }

    /// Waits until a message is there from in-neighbour `i`.
    pub(in crate::sync) fn wait_one(&mut self, i: usize, round: u64, timeout: Duration) -> anyhow::Result<()> {
        self.wait(round, timeout, "NOTIFY (a model message)", |s| !s.inbox[i].is_empty(), |s| vec![s.ins[i]])
    }

    /// Adds in-neighbour `i`'s oldest unread message into `acc` and says which round it held
    /// (`Torn(round, bytes)` where its length is not the model's: never, for a complete MPI
    /// message).
    pub(in crate::sync) fn add_next(&mut self, i: usize, acc: &mut [f32]) -> SlotRead {
        let Some(buf) = self.inbox[i].pop_front() else { return SlotRead::Empty };
        let round = buf.get(..HEADER).map_or(0, |h| u64::from_le_bytes(h.try_into().expect("8 bytes")));
        if buf.len() != HEADER + 4 * acc.len() {
            return SlotRead::Torn(round, buf.len() as u64);
        }
        for (a, v) in acc.iter_mut().zip(buf[HEADER..].chunks_exact(4)) {
            *a += f32::from_le_bytes(v.try_into().expect("4 bytes"));
        }
        SlotRead::Consistent(round)
    }

    /// ACKs in-neighbour `i`'s message just read.
    pub(in crate::sync) fn ack(&mut self, i: usize) -> anyhow::Result<()> {
        self.ack_upto(i, self.read[i] + 1)
    }

    /// ACKs in-neighbour `i`'s messages up to its `m`-th (nothing when they are already).
    pub(in crate::sync) fn ack_upto(&mut self, i: usize, m: u64) -> anyhow::Result<()> {
        if m <= self.read[i] {
            return Ok(());
        }
        self.read[i] = m;
        self.acks_sent[i] += 1;
        self.post.send(self.ins[i], ACK, m.to_le_bytes().to_vec())?;
        Ok(())
    }

    /// Polls until every paced message has been handed to MPI (the emulated link carried it):
    /// before a collective, where this rank stops polling, no message of its may still wait in
    /// the pacer's queue, or a receiver waiting for it would wait through the collective.
    pub(in crate::sync) fn release_held(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let rank = self.rank;
        self.wait(0, timeout, "the emulated link to carry this rank's messages", |s| s.post.held() == 0, |_| vec![rank])
    }

    /// Hands every queued send to MPI and waits until MPI has taken them (the end of a run).
    pub(in crate::sync) fn flush(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.post.flush_sends(timeout, |_| Ok(()))
    }

    /// Messages received from in-neighbour `i` so far (read or queued; the `notified` count).
    pub(in crate::sync) fn received(&self, i: usize) -> u64 {
        self.got[i]
    }

    /// Waits until every in-neighbour has sent at least `count` messages.
    pub(in crate::sync) fn wait_received(&mut self, count: u64, round: u64, timeout: Duration) -> anyhow::Result<()> {
        let missing = |s: &Self| (0..s.ins.len()).filter(|&i| s.got[i] < count).map(|i| s.ins[i]).collect();
        self.wait(round, timeout, "NOTIFY (a model message)", |s| s.got.iter().all(|&g| g >= count), missing)
    }

    /// Polls until a message is queued from every in-neighbour or `until` passes (the deadline
    /// variant); returns, per in-neighbour, whether one is.
    pub(in crate::sync) fn wait_queued_until(&mut self, until: Instant) -> anyhow::Result<Vec<bool>> {
        let mut backoff = Backoff::default();
        loop {
            self.poll()?;
            if self.inbox.iter().all(|q| !q.is_empty()) || Instant::now() >= until {
                return Ok(self.inbox.iter().map(|q| !q.is_empty()).collect());
            }
            backoff.pause();
        }
    }

    /// The round of in-neighbour `i`'s oldest queued message, if any.
    pub(in crate::sync) fn next_round(&self, i: usize) -> Option<u64> {
        self.inbox[i].front().map(|b| round_of(b))
    }

    /// The barrier variant's wait: polls until every in-neighbour has queued a message of
    /// `round` or later, then drops the older ones unread (returns how many: stale).
    pub(in crate::sync) fn wait_round(&mut self, round: u64, timeout: Duration) -> anyhow::Result<u64> {
        let has = |s: &Self, i: usize| s.inbox[i].iter().any(|b| round_of(b) >= round);
        let missing = |s: &Self| (0..s.ins.len()).filter(|&i| !has(s, i)).map(|i| s.ins[i]).collect();
        self.wait(round, timeout, "this round's model message", |s| (0..s.ins.len()).all(|i| has(s, i)), missing)?;
        let mut dropped = 0;
        for q in &mut self.inbox {
            while q.front().is_some_and(|b| round_of(b) < round) {
                q.pop_front();
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    /// Takes every queued message of in-neighbour `i` and keeps the newest as its latest (what a
    /// one-sided slot would hold after the older ones were overwritten): returns how many
    /// messages were taken (0: the latest is unchanged).
    pub(in crate::sync) fn take_newest(&mut self, i: usize) -> u64 {
        let mut taken = 0;
        while let Some(buf) = self.inbox[i].pop_front() {
            self.latest[i] = Some(buf);
            taken += 1;
        }
        taken
    }

    /// Adds in-neighbour `i`'s latest message (see [`P2pLinks::take_newest`]) into `acc`: its
    /// round, `Empty` before any came, `Torn` where its length is not the model's (never, for a
    /// complete MPI message).
    pub(in crate::sync) fn add_latest(&self, i: usize, acc: &mut [f32]) -> SlotRead {
        let Some(buf) = &self.latest[i] else { return SlotRead::Empty };
        let round = buf.get(..HEADER).map_or(0, |h| u64::from_le_bytes(h.try_into().expect("8 bytes")));
        if buf.len() != HEADER + 4 * acc.len() {
            return SlotRead::Torn(round, buf.len() as u64);
        }
        for (a, v) in acc.iter_mut().zip(buf[HEADER..].chunks_exact(4)) {
            *a += f32::from_le_bytes(v.try_into().expect("4 bytes"));
        }
        SlotRead::Consistent(round)
    }

    /// Copies in-neighbour `i`'s latest message, f64 values (push-sum's running totals), into
    /// `out` (see [`P2pLinks::add_latest`]).
    pub(in crate::sync) fn copy_latest_f64(&self, i: usize, out: &mut [f64]) -> SlotRead {
        let Some(buf) = &self.latest[i] else { return SlotRead::Empty };
        let round = buf.get(..HEADER).map_or(0, |h| u64::from_le_bytes(h.try_into().expect("8 bytes")));
        if buf.len() != HEADER + 8 * out.len() {
            return SlotRead::Torn(round, buf.len() as u64);
        }
        for (o, v) in out.iter_mut().zip(buf[HEADER..].chunks_exact(8)) {
            *o = f64::from_le_bytes(v.try_into().expect("8 bytes"));
        }
        SlotRead::Consistent(round)
    }

    /// Sends f64 `values` of `round` to out-neighbour `j` (push-sum's running totals, sent
    /// without waiting for an ACK: a newer total contains an older one).
    pub(in crate::sync) fn send_f64_to(&mut self, j: usize, round: u64, values: &[f64]) -> anyhow::Result<()> {
        let mut buf = Vec::with_capacity(HEADER + 8 * values.len());
        buf.extend_from_slice(&round.to_le_bytes());
        values.iter().for_each(|v| buf.extend_from_slice(&v.to_le_bytes()));
        self.post.send(self.outs[j], DATA, buf)?;
        self.sent[j] += 1;
        Ok(())
    }

    /// Settles the links for a cut or the end, for the variants whose messages are not all
    /// ACKed (barrier, none, push-sum, deadline): every rank tells each out-neighbour how many
    /// model messages it sent it and each in-neighbour how many ACKs, then polls until it has
    /// received what it was told and MPI has taken its own sends. Afterwards every message sent
    /// before the settle is in its receiver's queue (what later reads take) and nothing of this
    /// rank's is still travelling. Collective over the graph's edges.
    pub(in crate::sync) fn settle(&mut self, round: u64, timeout: Duration) -> anyhow::Result<()> {
        for j in 0..self.outs.len() {
            self.post.send(self.outs[j], DATA_COUNT, self.sent[j].to_le_bytes().to_vec())?;
        }
        for i in 0..self.ins.len() {
            self.post.send(self.ins[i], ACK_COUNT, self.acks_sent[i].to_le_bytes().to_vec())?;
        }
        // Told and received: in-neighbour i's model messages, out-neighbour j's ACKs.
        let ins_done = |s: &Self, i: usize| s.data_due[i].front().is_some_and(|&c| s.got[i] >= c);
        let outs_done = |s: &Self, j: usize| s.acks_due[j].front().is_some_and(|&c| s.acks_got[j] >= c);
        let complete = |s: &Self| (0..s.ins.len()).all(|i| ins_done(s, i)) && (0..s.outs.len()).all(|j| outs_done(s, j));
        let missing = |s: &Self| {
            let ins = (0..s.ins.len()).filter(|&i| !ins_done(s, i)).map(|i| s.ins[i]);
            ins.chain((0..s.outs.len()).filter(|&j| !outs_done(s, j)).map(|j| s.outs[j])).collect()
        };
        self.wait(round, timeout, "the last messages (settling the links)", complete, missing)?;
        for q in self.data_due.iter_mut().chain(&mut self.acks_due) {
            q.pop_front();
        }
        self.flush(timeout)
    }

    /// A barrier over the links' communicator that keeps taking messages in while it waits.
    pub(in crate::sync) fn barrier(&mut self, round: u64, timeout: Duration) -> anyhow::Result<()> {
        let mut b = self.post.start_barrier()?;
        let rank = self.rank;
        let start = Instant::now();
        let mut backoff = Backoff::default();
        while !self.post.barrier_done(&mut b)? {
            self.poll()?;
            if start.elapsed() > timeout {
                bail!("rank {rank}: round {round}: waited {:.1?} in a barrier that not every rank reached: raise --wait-timeout (now {timeout:?}) if they are only slow", start.elapsed());
            }
            backoff.pause();
        }
        Ok(())
    }
}

/// The count an ACK or settling message carries.
fn count_of(buf: &[u8]) -> u64 {
    buf.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// The round in a model message's header (0 for one too short to hold it).
fn round_of(buf: &[u8]) -> u64 {
    buf.get(..HEADER).map_or(0, |h| u64::from_le_bytes(h.try_into().expect("8 bytes")))
}
