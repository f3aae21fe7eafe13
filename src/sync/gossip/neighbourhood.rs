//! The transport every `--sync asap` variant runs over: this rank's mailboxes on the graph (the
//! one-sided window of `comm::mailbox`, with its pacing and emulated links), the fault injection,
//! and what every variant counts and reports (bytes, rounds, the consistency histogram, torn and
//! stale reads). The NOTIFY-ACK steps that several variants share live here too.
//!
//! NOTIFY-ACK is written once, here: wait for the ACK of the previous message on an out-edge,
//! put the message and NOTIFY; wait for the in-neighbours' notifications, read each message (an
//! inconsistent one is the single torn-message error); ACK. A message is a model of f32 values
//! ([`Message::Model`], added straight from the window into the reduce) or bytes a variant
//! encoded ([`Message::Bytes`], the budgeted edges' rows), through the [`Outbox`] and [`Inbox`]
//! hooks: the outbox composes each out-edge's message once that edge's ACK came (the budgeted
//! edges size it by the token bucket's allowance at that moment) and hears what the put cost.
//! No NOTIFY-ACK variant touches `mail` for these steps (bounded staleness reads the newest of
//! several slots and ACKs up to it, its own protocol), so a second transport (point-to-point
//! links, in a later issue) can fit under this same `Neighbourhood`, the variants unchanged.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mpi::topology::{Communicator, SimpleCommunicator};

use super::p2p::P2pLinks;
use crate::comm::mailbox::{Mailboxes, SlotRead};
use crate::sync::CommStats;

/// What one NOTIFY-ACK message carries.
pub(in crate::sync) enum Message<'a> {
    /// A model's f32 values (a fixed-size slot).
    Model(&'a [f32]),
    /// A variable-length body a variant encoded (mailboxes made with `Mailboxes::for_bytes`).
    Bytes(&'a [u8]),
}

/// Where the messages of a NOTIFY-ACK round are read to.
pub(in crate::sync) enum Slot<'a> {
    /// Added into a sum of models.
    Sum(&'a mut [f32]),
    /// Copied out as bytes, each handed to [`Inbox::received`] before the next is read.
    Bytes(&'a mut Vec<u8>),
}

/// The sending side of a NOTIFY-ACK round: the message of each out-edge.
pub(in crate::sync) trait Outbox {
    /// Out-edge `j`'s message of `round`, composed once the ACK of its previous message came
    /// (at `acked`): the slot at the receiver is free from then on.
    fn message(&mut self, j: usize, round: u64, acked: Instant) -> Message<'_>;

    /// After the message went out: `bytes` put (NOTIFY included), at `put_end`.
    fn sent(&mut self, _bytes: u64, _put_end: Instant) {}
}

/// A model sends itself on every out-edge.
impl Outbox for &[f32] {
    fn message(&mut self, _j: usize, _round: u64, _acked: Instant) -> Message<'_> {
        Message::Model(self)
    }
}

/// The receiving side of a NOTIFY-ACK round.
pub(in crate::sync) trait Inbox {
    /// Where the next message is read to.
    fn slot(&mut self) -> Slot<'_>;

    /// After in-neighbour `i`'s consistent message of `round` was read into the slot.
    fn received(&mut self, _i: usize, _round: u64) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A sum of models: every message is added into it.
impl Inbox for [f32] {
    fn slot(&mut self) -> Slot<'_> {
        Slot::Sum(self)
    }
}

/// One rank's end of the graph: its mailboxes and the counters of every variant.
pub(in crate::sync) struct Neighbourhood {
    pub(in crate::sync) mail: Mailboxes,
    pub(in crate::sync) comm: SimpleCommunicator,
    pub(in crate::sync) rank: usize,
    pub(in crate::sync) n_params: usize,
    /// Longest wait for a NOTIFY or ACK before failing (`--wait-timeout`).
    pub(in crate::sync) wait_timeout: Duration,
    /// Fault injection for tests: `(rank, round)`: that rank sends nothing after that round.
    stop_sending_after: Option<(usize, u64)>,
    pub(in crate::sync) stats: CommStats,
    /// `histogram[k]`: reduces that used k consistent in-neighbour models.
    pub(in crate::sync) histogram: Vec<u64>,
    /// Reads skipped as torn (header and footer differ, or another round under barrier).
    pub(in crate::sync) torn: u64,
    /// Reads skipped as older than the round needed (or empty, under barrier).
    pub(in crate::sync) stale: u64,
    pub(in crate::sync) last_round: u64,
    /// Seconds from each ACK to the end of the put that follows it (the message's composing,
    /// data, flush and NOTIFY; see `StochasticReduce::transfer_seconds`).
    pub(in crate::sync) transfer_seconds: f64,
    /// `--transport p2p`: the NOTIFY-ACK steps go over two-sided messages ([`P2pLinks`]); the
    /// mailboxes then hold no model slots and serve only the graph and the final barrier.
    pub(in crate::sync) p2p: Option<P2pLinks>,
}

impl Neighbourhood {
    /// Wraps `mail`, set up over `comm` for the graph, for a model of `n_params` values, with
    /// the run's `--wait-timeout` and fault injection (see `AsapConfig`).
    pub(in crate::sync) fn new(
        comm: &SimpleCommunicator,
        wait_timeout: Duration,
        stop_sending_after: Option<(usize, u64)>,
        n_params: usize,
        mail: Mailboxes,
    ) -> anyhow::Result<Self> {
        if wait_timeout.is_zero() {
            bail!("--wait-timeout must be positive");
        }
        Ok(Neighbourhood {
            comm: comm.duplicate(),
            rank: comm.rank() as usize,
            n_params,
            wait_timeout,
            stop_sending_after,
            stats: CommStats::default(),
            histogram: vec![0; mail.in_neighbours().len() + 1],
            torn: 0,
            stale: 0,
            last_round: 0,
            transfer_seconds: 0.0,
            mail,
            p2p: None,
        })
    }

    pub(in crate::sync) fn in_degree(&self) -> usize {
        self.mail.in_neighbours().len()
    }

    /// The mailboxes' byte counters now, for [`Neighbourhood::count_since`].
    pub(in crate::sync) fn byte_counts(&self) -> (u64, u64) {
        let (s, r) = self.p2p.as_ref().map_or((0, 0), |p| (p.bytes_sent(), p.bytes_received()));
        (self.mail.bytes_sent() + s, self.mail.bytes_received() + r)
    }

    /// Adds what the mailboxes sent and received since `byte_counts` returned `(sent, received)`
    /// to the training traffic.
    pub(in crate::sync) fn count_since(&mut self, (sent, received): (u64, u64)) {
        let (s, r) = self.byte_counts();
        self.stats.bytes_sent += s - sent;
        self.stats.bytes_received += r - received;
    }

    /// Whether this rank still sends at `round` (not stopped by `--stop-sending-after`).
    pub(in crate::sync) fn sending(&self, round: u64) -> bool {
        !matches!(self.stop_sending_after, Some((r, last)) if r == self.rank && round > last)
    }

    /// `--emulate-latency` for one-sided puts: the sender cannot hand a put to a slow link and
    /// go on, so instead of delaying every put (which would charge the latency once per
    /// neighbour) each direction of a round (data + NOTIFY, then ACK) waits it once.
    pub(in crate::sync) fn emulated_latency(&self) {
        // Two-sided messages carry their latency in the postbox's pacing.
        if let (Some(p), None) = (self.mail.pacer(), &self.p2p) {
            std::thread::sleep(p.round_latency(self.mail.out_neighbours()));
        }
    }

    /// `params /= 1 + used`, the end of an equal-weight reduce whose sum is already in
    /// `params`, counted in the histogram.
    pub(in crate::sync) fn divide(&mut self, params: &mut [f32], used: usize) {
        let denom = (1 + used) as f32;
        params.iter_mut().for_each(|p| *p /= denom);
        self.histogram[used] += 1;
    }

    /// `params <- acc / (1 + used)`, counted in the histogram.
    pub(in crate::sync) fn reduce_into(&mut self, params: &mut [f32], acc: &[f32], used: usize) {
        let denom = (1 + used) as f32;
        for (p, a) in params.iter_mut().zip(acc) {
            *p = *a / denom;
        }
        self.histogram[used] += 1;
    }

    /// Sends this round's model to out-neighbour `j` once its ACK frees the slot there.
    pub(in crate::sync) fn send_one(&mut self, j: usize, params: &[f32], round: u64) -> anyhow::Result<()> {
        self.send_message(j, round, &mut { params })
    }

    /// Sends `out`'s message of this round to out-neighbour `j` once its ACK frees the slot
    /// there: the wait counts as waiting, the composing and the put as communication.
    pub(in crate::sync) fn send_message(&mut self, j: usize, round: u64, out: &mut impl Outbox) -> anyhow::Result<()> {
        let t = Instant::now();
        let t2 = self.put_when_acked(j, round, out)?;
        self.stats.wait_seconds += (t2 - t).as_secs_f64();
        let put = t2.elapsed().as_secs_f64();
        self.stats.comm_seconds += put;
        self.transfer_seconds += put;
        Ok(())
    }

    /// NOTIFY-ACK's send on out-edge `j`: waits for the ACK of the previous message, then puts
    /// `out`'s message and NOTIFY. Returns when the ACK came.
    fn put_when_acked(&mut self, j: usize, round: u64, out: &mut impl Outbox) -> anyhow::Result<Instant> {
        if let Some(p) = &mut self.p2p {
            p.wait_ack(j, round, self.wait_timeout)?;
            let acked = Instant::now();
            let before = p.bytes_sent();
            match out.message(j, round, acked) {
                Message::Model(values) => p.send_to(j, round, values)?,
                Message::Bytes(body) => p.send_bytes_to(j, round, body)?,
            }
            out.sent(p.bytes_sent() - before, Instant::now());
            return Ok(acked);
        }
        self.mail.wait_ack(j, round, self.wait_timeout)?;
        let acked = Instant::now();
        let before = self.mail.bytes_sent();
        match out.message(j, round, acked) {
            Message::Model(values) => self.mail.send_to(j, round, values)?,
            Message::Bytes(body) => {
                self.mail.send_bytes_to(j, round, body)?;
            }
        }
        out.sent(self.mail.bytes_sent() - before, Instant::now());
        Ok(acked)
    }

    /// Sends this round's model to every out-neighbour (unless a fault injection stopped us).
    pub(in crate::sync) fn send_all(&mut self, params: &[f32], round: u64) -> anyhow::Result<()> {
        self.send_each(round, &mut { params })
    }

    /// Sends `out`'s message to every out-neighbour, in order (unless a fault injection stopped
    /// us).
    pub(in crate::sync) fn send_each(&mut self, round: u64, out: &mut impl Outbox) -> anyhow::Result<()> {
        if self.sending(round) {
            for j in 0..self.mail.out_neighbours().len() {
                self.send_message(j, round, out)?;
            }
        }
        Ok(())
    }

    /// Waits for every in-neighbour's NOTIFY of `round` and adds their models to `acc` straight
    /// from the window (between NOTIFY and ACK nobody writes a slot); an inconsistent slot is an
    /// error. Returns when the waiting ended (for the transfer time).
    pub(in crate::sync) fn add_round(&mut self, round: u64, acc: &mut [f32]) -> anyhow::Result<Instant> {
        self.receive_round(round, acc)
    }

    /// Waits for every in-neighbour's NOTIFY of `round` and reads their messages into `inbox`
    /// (see [`Neighbourhood::add_round`]). Returns when the waiting ended.
    pub(in crate::sync) fn receive_round(&mut self, round: u64, inbox: &mut (impl Inbox + ?Sized)) -> anyhow::Result<Instant> {
        let t = Instant::now();
        self.emulated_latency();
        self.wait_all_notified(round)?;
        let t2 = Instant::now();
        self.stats.wait_seconds += (t2 - t).as_secs_f64();
        self.read_notified(round, inbox)?;
        Ok(t2)
    }

    /// Waits for every in-neighbour's NOTIFY of `round`, on whichever transport carries them.
    fn wait_all_notified(&mut self, round: u64) -> anyhow::Result<()> {
        match &mut self.p2p {
            Some(p) => p.wait_notifications(round, self.wait_timeout),
            None => Ok(self.mail.wait_notifications(round, self.wait_timeout)?),
        }
    }

    /// ACKs in-neighbour `i`'s message just read, on whichever transport carried it.
    fn ack_message(&mut self, i: usize) -> anyhow::Result<()> {
        match &mut self.p2p {
            Some(p) => p.ack(i),
            None => Ok(self.mail.ack(i)?),
        }
    }

    /// Reads every in-neighbour's notified message of `round` into `inbox`, in order.
    fn read_notified(&mut self, round: u64, inbox: &mut (impl Inbox + ?Sized)) -> anyhow::Result<()> {
        for i in 0..self.in_degree() {
            self.read_one(i, round, inbox)?;
        }
        Ok(())
    }

    /// Reads in-neighbour `i`'s notified message of `round` into `inbox`; an inconsistent one is
    /// an error (and counted as torn).
    fn read_one(&mut self, i: usize, round: u64, inbox: &mut (impl Inbox + ?Sized)) -> anyhow::Result<()> {
        let read = match (inbox.slot(), &mut self.p2p) {
            (Slot::Sum(acc), Some(p)) => p.add_next(i, acc),
            (Slot::Sum(acc), None) => self.mail.add_notified_slot(i, acc)?,
            (Slot::Bytes(body), Some(p)) => p.read_bytes(i, body),
            (Slot::Bytes(body), None) => self.mail.read_bytes(i, body)?,
        };
        if read != SlotRead::Consistent(round) {
            self.torn += 1;
            bail!(
                "rank {}: round {round}: the buffer from rank {} was inconsistent after its \
                 NOTIFY ({read:?}); NOTIFY-ACK must never see this, so the MPI one-sided \
                 transport does not order the data before the notification (try another \
                 osc component, e.g. OMPI_MCA_osc=ucx)",
                self.rank,
                self.mail.in_neighbours()[i]
            );
        }
        inbox
            .received(i, round)
            .with_context(|| format!("rank {}: round {round}: message from rank {}", self.rank, self.mail.in_neighbours()[i]))
    }

    /// Time-varying graphs: waits for the NOTIFY of `round` from in-neighbour `i` alone and
    /// adds its model to `acc` (see [`Neighbourhood::add_round`]). Returns when the waiting ended.
    pub(in crate::sync) fn add_one(&mut self, i: usize, round: u64, acc: &mut [f32]) -> anyhow::Result<Instant> {
        self.receive_one(i, round, acc)
    }

    /// Time-varying graphs: waits for the NOTIFY of `round` from in-neighbour `i` alone and
    /// reads its message into `inbox` (see [`Neighbourhood::add_one`]). Returns when the waiting
    /// ended.
    pub(in crate::sync) fn receive_one(&mut self, i: usize, round: u64, inbox: &mut (impl Inbox + ?Sized)) -> anyhow::Result<Instant> {
        let t = Instant::now();
        self.emulated_latency();
        match &mut self.p2p {
            Some(p) => p.wait_one(i, round, self.wait_timeout)?,
            None => self.mail.wait_one(i, round, self.wait_timeout)?,
        }
        let t2 = Instant::now();
        self.stats.wait_seconds += (t2 - t).as_secs_f64();
        self.read_one(i, round, inbox)?;
        Ok(t2)
    }

    /// ACKs every in-neighbour's message of the round whose reduce began at `t2`.
    pub(in crate::sync) fn ack_round(&mut self, t2: Instant) -> anyhow::Result<()> {
        self.ack_round_then(t2, |_| ())
    }

    /// [`Neighbourhood::ack_round`], calling `after_ack` with the moment each ACK went out.
    pub(in crate::sync) fn ack_round_then(&mut self, t2: Instant, after_ack: impl FnMut(Instant)) -> anyhow::Result<()> {
        self.ack(0..self.in_degree(), t2, after_ack)
    }

    /// ACKs in-neighbour `i`'s message of the round whose reduce began at `t2` (time-varying
    /// graphs: the round's only in-neighbour).
    pub(in crate::sync) fn ack_one(&mut self, i: usize, t2: Instant) -> anyhow::Result<()> {
        self.ack(i..i + 1, t2, |_| ())
    }

    /// ACKs the messages of in-neighbours `ins`, then the emulated latency of the way back; the
    /// time since `t2` counts as communication.
    fn ack(&mut self, ins: std::ops::Range<usize>, t2: Instant, mut after_ack: impl FnMut(Instant)) -> anyhow::Result<()> {
        for i in ins {
            self.ack_message(i)?;
            after_ack(Instant::now());
        }
        self.emulated_latency();
        self.stats.comm_seconds += t2.elapsed().as_secs_f64();
        Ok(())
    }

    /// One NOTIFY-ACK round of `round` outside the training's timings and pacing (the budgeted
    /// edges' end-of-run mirror check): `exchange`'s message to every out-neighbour, then every
    /// in-neighbour's into it, then the ACKs.
    pub(in crate::sync) fn exchange_untimed(&mut self, round: u64, exchange: &mut (impl Outbox + Inbox)) -> anyhow::Result<()> {
        for j in 0..self.mail.out_neighbours().len() {
            self.put_when_acked(j, round, exchange)?;
        }
        self.wait_all_notified(round)?;
        self.read_notified(round, exchange)?;
        for i in 0..self.in_degree() {
            self.ack_message(i)?;
        }
        Ok(())
    }

    /// NOTIFY-ACK's end: every message must be consumed before the window goes away, so wait for
    /// the ACK of every message this rank sent (counted as received training traffic).
    pub(in crate::sync) fn drain_acks(&mut self) -> anyhow::Result<()> {
        let r0 = self.byte_counts().1;
        match &mut self.p2p {
            Some(p) => {
                p.wait_acks(self.last_round, self.wait_timeout)?;
                p.flush(self.wait_timeout)?;
            }
            None => self.mail.wait_acks(self.last_round, self.wait_timeout)?,
        }
        self.stats.bytes_received += self.byte_counts().1 - r0;
        Ok(())
    }

    /// Between local steps: two-sided messages move only while their owner calls into MPI, so
    /// a rank polls its links after every step (a no-op on the one-sided transport).
    /// What moves meanwhile is training traffic, counted (the asynchronous variants receive
    /// most of their messages here: without it, `--notify none` on p2p counted half the bytes
    /// its in-neighbours sent).
    pub(in crate::sync) fn between_steps(&mut self) -> anyhow::Result<()> {
        let counted = self.byte_counts();
        self.p2p.as_mut().map_or(Ok(()), P2pLinks::poll)?;
        self.count_since(counted);
        Ok(())
    }

    /// The end or a cut of the variants whose messages are not all ACKed (barrier, none,
    /// push-sum, deadline) on the two-sided transport: settles the links ([`P2pLinks::settle`]),
    /// so every message sent is queued at its receiver and nothing is left travelling. A no-op
    /// on the one-sided transport, whose puts complete at the window's flush.
    pub(in crate::sync) fn settle_links(&mut self) -> anyhow::Result<()> {
        let (round, timeout) = (self.last_round, self.wait_timeout);
        self.p2p.as_mut().map_or(Ok(()), |p| p.settle(round, timeout))
    }

    /// [`Neighbourhood::settle_links`] at the end of a run, its traffic counted as training's.
    pub(in crate::sync) fn settle_links_counted(&mut self) -> anyhow::Result<()> {
        let counted = self.byte_counts();
        self.settle_links()?;
        self.count_since(counted);
        Ok(())
    }
}
