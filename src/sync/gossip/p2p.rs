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
}

impl P2pLinks {
    /// Links over `post` (a private communicator with its pacing) to the sorted, deduplicated
    /// `ins` and `outs` of this rank.
    pub(in crate::sync) fn new(post: Postbox, ins: &[usize], outs: &[usize]) -> Self {
        P2pLinks {
            rank: post.rank(),
            inbox: vec![VecDeque::new(); ins.len()],
            read: vec![0; ins.len()],
            sent: vec![0; outs.len()],
            acked: vec![0; outs.len()],
            ins: ins.to_vec(),
            outs: outs.to_vec(),
            post,
        }
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
        }
        while let Some((src, buf)) = self.post.try_receive(ACK) {
            let Some(j) = self.outs.iter().position(|&r| r == src) else {
                bail!("rank {}: an ACK from rank {src}, which is not an out-neighbour", self.rank)
            };
            let count = buf.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
            self.acked[j] = self.acked[j].max(count);
        }
        Ok(())
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

    /// Waits until out-neighbour `j` has read every message sent to it (its ACK came).
    pub(in crate::sync) fn wait_ack(&mut self, j: usize, round: u64, timeout: Duration) -> anyhow::Result<()> {
        self.wait(round, timeout, "the ACK", |s| s.acked[j] >= s.sent[j], |s| vec![s.outs[j]])
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
        self.read[i] += 1;
        self.post.send(self.ins[i], ACK, self.read[i].to_le_bytes().to_vec())?;
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
}
