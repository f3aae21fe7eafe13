//! Bounded-staleness NOTIFY-ACK (`--sync asap --staleness S`, S > 0): each round reduces every
//! in-neighbour's newest message no older than S rounds.

use std::time::Instant;

use anyhow::bail;

use super::neighbourhood::Neighbourhood;
use super::variant::Gossip;
use crate::comm::mailbox::SlotRead;
use crate::sync::{Aggregate, ModeMetric};

/// Slots per edge for `--staleness s`. 1 for S = 0 (a message is acknowledged as soon as it is
/// reduced). For S > 0 the receiver keeps its newest message unacknowledged for reuse, so S + 1
/// slots would leave a sender only S - 1 messages of slack beyond that one: S = 1 then coupled
/// ranks exactly as tightly as S = 0 while reducing stale messages 69 % of the time, and trained
/// 1.8x slower to a worse model (8 ranks, root expander, 2 epochs: 0.23 s and 81.9 % against
/// 0.13 s and 83.2 % at S = 0). S + 2 slots give S messages of slack.
pub(super) fn slot_depth(s: u64) -> usize {
    if s == 0 {
        1
    } else {
        s as usize + 2
    }
}

/// Bounded-staleness NOTIFY-ACK, with S + 2 slots per edge:
/// - a sender writes its message k into slot (k - 1) mod (S + 2) once the receiver has
///   acknowledged message k - S - 2, the one that slot held;
/// - at its k-th round a receiver waits until every in-neighbour has notified at least
///   k - S messages, reduces each one's newest, and acknowledges the older ones. It keeps the
///   newest unacknowledged, since the next round may reduce it again; that is also what
///   keeps its slot from being overwritten while it may be read.
///
/// So a sender runs at most S + 1 messages ahead of the newest its receiver has reduced (the
/// kept one plus S in flight, S more than at S = 0), and no reduce uses a message older than
/// S rounds.
pub(super) struct BoundedStaleness {
    s: u64,
    acc: Vec<f32>,
    /// `[a]`: messages reduced `a` rounds after they were sent (a <= S).
    staleness_used: Vec<u64>,
    /// Messages reduced that were from a round ahead of the receiver's.
    ahead: u64,
}

impl BoundedStaleness {
    pub(super) fn new(s: u64, n_params: usize) -> Self {
        BoundedStaleness { s, acc: vec![0.0; n_params], staleness_used: vec![0; s as usize + 1], ahead: 0 }
    }
}

impl Gossip for BoundedStaleness {
    fn round_lead(&self) -> u64 {
        self.s
    }

    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let timeout = net.wait_timeout;
        let s = self.s;
        let k = net.stats.rounds + 1;
        net.send_all(params, round)?;
        if net.p2p.is_some() {
            return self.reduce_p2p(net, params, round, k);
        }
        let t = Instant::now();
        net.emulated_latency();
        net.mail.wait_notified(k.saturating_sub(s).max(1), round, timeout)?;
        let t2 = Instant::now();
        net.stats.wait_seconds += (t2 - t).as_secs_f64();
        self.acc.copy_from_slice(params);
        let d = net.in_degree();
        for i in 0..d {
            let m = net.mail.notified(i);
            let read = net.mail.add_message(i, m, &mut self.acc)?;
            let SlotRead::Consistent(h) = read else {
                net.torn += 1;
                bail!(
                    "rank {}: round {round}: message {m} from rank {} was inconsistent after its \
                     NOTIFY ({read:?}); bounded-staleness NOTIFY-ACK must never see this",
                    net.rank,
                    net.mail.in_neighbours()[i]
                );
            };
            self.count_age(net.rank, net.mail.in_neighbours()[i], round, h)?;
            net.mail.ack_upto(i, m - 1)?;
        }
        net.reduce_into(params, &self.acc, d);
        net.emulated_latency();
        net.stats.comm_seconds += t2.elapsed().as_secs_f64();
        Ok(())
    }

    /// Every rank sent one message per round: acknowledge what the reduces skipped or kept for
    /// reuse, then wait for the ACKs of ours as plain NOTIFY-ACK does.
    fn drain(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        let k = net.stats.rounds;
        if let Some(p) = &mut net.p2p {
            let r0 = p.bytes_received();
            p.wait_received(k, net.last_round, net.wait_timeout)?;
            for i in 0..net.mail.in_neighbours().len() {
                p.ack_upto(i, k)?;
            }
            net.stats.bytes_received += p.bytes_received() - r0;
            return net.drain_acks();
        }
        let r0 = net.mail.bytes_received();
        net.mail.wait_notified(k, net.last_round, net.wait_timeout)?;
        for i in 0..net.in_degree() {
            net.mail.ack_upto(i, k)?;
        }
        net.stats.bytes_received += net.mail.bytes_received() - r0;
        net.drain_acks()
    }

    fn metrics(&self, out: &mut Vec<ModeMetric>) {
        out.extend([
            ModeMetric::array("staleness_histogram", Aggregate::Sum, self.staleness_used.iter().map(|&c| c as f64)),
            ModeMetric::number("messages_from_ahead", Aggregate::Sum, self.ahead as f64),
        ]);
    }
}

impl BoundedStaleness {
    /// Checks the age of the message of round `h` that `from` sent, reduced at `round`, against
    /// the bound, and counts it in the histogram (or as ahead of this rank). Both transports'
    /// reduces call it.
    fn count_age(&mut self, rank: usize, from: usize, round: u64, h: u64) -> anyhow::Result<()> {
        let s = self.s;
        if round.saturating_sub(h) > s {
            bail!("rank {rank}: round {round}: the newest message of rank {from} is from round {h}, older than --staleness {s}");
        }
        self.staleness_used[round.saturating_sub(h) as usize] += 1;
        self.ahead += u64::from(h > round);
        Ok(())
    }

    /// The receiving half of [`Gossip::round`] on the two-sided transport, the same protocol:
    /// the links let a sender have S + 2 messages unACKed per edge ([`P2pLinks::with_depth`]);
    /// at its k-th round a receiver waits until every in-neighbour's k - S-th message came,
    /// reduces each one's newest (kept, unACKed, for reuse as the slot keeps it) and ACKs the
    /// older ones.
    ///
    /// [`P2pLinks::with_depth`]: super::p2p::P2pLinks::with_depth
    fn reduce_p2p(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64, k: u64) -> anyhow::Result<()> {
        let (s, d) = (self.s, net.in_degree());
        let t = Instant::now();
        let p = net.p2p.as_mut().expect("checked by the caller");
        p.wait_received(k.saturating_sub(s).max(1), round, net.wait_timeout)?;
        let t2 = Instant::now();
        net.stats.wait_seconds += (t2 - t).as_secs_f64();
        self.acc.copy_from_slice(params);
        for i in 0..d {
            p.take_newest(i);
            let read = p.add_latest(i, &mut self.acc);
            let SlotRead::Consistent(h) = read else {
                net.torn += 1;
                bail!(
                    "rank {}: round {round}: the newest message from rank {} was {read:?}; a complete MPI message must never be",
                    net.rank,
                    net.mail.in_neighbours()[i]
                );
            };
            self.count_age(net.rank, net.mail.in_neighbours()[i], round, h)?;
            let m = p.received(i);
            p.ack_upto(i, m - 1)?;
        }
        net.reduce_into(params, &self.acc, d);
        net.stats.comm_seconds += t2.elapsed().as_secs_f64();
        Ok(())
    }
}
