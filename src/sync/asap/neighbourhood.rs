//! The transport every `--sync asap` variant runs over: this rank's mailboxes on the graph (the
//! one-sided window of `comm::mailbox`, with its pacing and emulated links), the fault injection,
//! and what every variant counts and reports (bytes, rounds, the consistency histogram, torn and
//! stale reads). The NOTIFY-ACK steps that several variants share live here too.

use std::time::{Duration, Instant};

use anyhow::bail;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::AsapConfig;
use crate::comm::mailbox::{Mailboxes, SlotRead};
use crate::sync::CommStats;

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
    /// Seconds inside [`Mailboxes::send_to`] (see `StochasticReduce::transfer_seconds`).
    pub(in crate::sync) transfer_seconds: f64,
}

impl Neighbourhood {
    /// Wraps `mail`, set up over `comm` for `cfg`'s graph, for a model of `n_params` values.
    pub(in crate::sync) fn new(comm: &SimpleCommunicator, cfg: &AsapConfig, n_params: usize, mail: Mailboxes) -> anyhow::Result<Self> {
        if cfg.wait_timeout.is_zero() {
            bail!("--wait-timeout must be positive");
        }
        Ok(Neighbourhood {
            comm: comm.duplicate(),
            rank: comm.rank() as usize,
            n_params,
            wait_timeout: cfg.wait_timeout,
            stop_sending_after: cfg.stop_sending_after,
            stats: CommStats::default(),
            histogram: vec![0; mail.in_neighbours().len() + 1],
            torn: 0,
            stale: 0,
            last_round: 0,
            transfer_seconds: 0.0,
            mail,
        })
    }

    pub(in crate::sync) fn in_degree(&self) -> usize {
        self.mail.in_neighbours().len()
    }

    /// The mailboxes' byte counters now, for [`Neighbourhood::count_since`].
    pub(in crate::sync) fn byte_counts(&self) -> (u64, u64) {
        (self.mail.bytes_sent(), self.mail.bytes_received())
    }

    /// Adds what the mailboxes sent and received since `byte_counts` returned `(sent, received)`
    /// to the training traffic.
    pub(in crate::sync) fn count_since(&mut self, (sent, received): (u64, u64)) {
        self.stats.bytes_sent += self.mail.bytes_sent() - sent;
        self.stats.bytes_received += self.mail.bytes_received() - received;
    }

    /// Whether this rank still sends at `round` (not stopped by `--stop-sending-after`).
    pub(in crate::sync) fn sending(&self, round: u64) -> bool {
        !matches!(self.stop_sending_after, Some((r, last)) if r == self.rank && round > last)
    }

    /// `--emulate-latency` for one-sided puts: the sender cannot hand a put to a slow link and
    /// go on, so instead of delaying every put (which would charge the latency once per
    /// neighbour) each direction of a round (data + NOTIFY, then ACK) waits it once.
    pub(in crate::sync) fn emulated_latency(&self) {
        if let Some(p) = self.mail.pacer() {
            std::thread::sleep(p.latency());
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
        let t = Instant::now();
        self.mail.wait_ack(j, round, self.wait_timeout)?;
        let t2 = Instant::now();
        self.stats.wait_seconds += (t2 - t).as_secs_f64();
        self.mail.send_to(j, round, params)?;
        let put = t2.elapsed().as_secs_f64();
        self.stats.comm_seconds += put;
        self.transfer_seconds += put;
        Ok(())
    }

    /// Sends this round's model to every out-neighbour (unless a fault injection stopped us).
    pub(in crate::sync) fn send_all(&mut self, params: &[f32], round: u64) -> anyhow::Result<()> {
        if self.sending(round) {
            for j in 0..self.mail.out_neighbours().len() {
                self.send_one(j, params, round)?;
            }
        }
        Ok(())
    }

    /// Waits for every in-neighbour's NOTIFY of `round` and adds their models to `acc` straight
    /// from the window (between NOTIFY and ACK nobody writes a slot); an inconsistent slot is an
    /// error. Returns when the waiting ended (for the transfer time).
    pub(in crate::sync) fn add_round(&mut self, round: u64, acc: &mut [f32]) -> anyhow::Result<Instant> {
        let t = Instant::now();
        self.emulated_latency();
        self.mail.wait_notifications(round, self.wait_timeout)?;
        let t2 = Instant::now();
        self.stats.wait_seconds += (t2 - t).as_secs_f64();
        for i in 0..self.in_degree() {
            let read = self.mail.add_notified_slot(i, acc)?;
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
        }
        Ok(t2)
    }

    /// ACKs every in-neighbour's message of the round whose reduce began at `t2`.
    pub(in crate::sync) fn ack_round(&mut self, t2: Instant) -> anyhow::Result<()> {
        for i in 0..self.in_degree() {
            self.mail.ack(i)?;
        }
        self.emulated_latency();
        self.stats.comm_seconds += t2.elapsed().as_secs_f64();
        Ok(())
    }

    /// NOTIFY-ACK's end: every message must be consumed before the window goes away, so wait for
    /// the ACK of every message this rank sent (counted as received training traffic).
    pub(in crate::sync) fn drain_acks(&mut self) -> anyhow::Result<()> {
        let r0 = self.mail.bytes_received();
        self.mail.wait_acks(self.last_round, self.wait_timeout)?;
        self.stats.bytes_received += self.mail.bytes_received() - r0;
        Ok(())
    }
}
