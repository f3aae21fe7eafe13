//! ASAP's NOTIFY-ACK (§4) on a static graph, with `--overlap`, and on the one-peer exponential
//! graph: every round reduces every in-neighbour's message of that round, so a run is
//! deterministic for a given seed and number of ranks.

use super::neighbourhood::Neighbourhood;
use super::variant::Gossip;

/// `--notify notify-ack`: send to every out-neighbour, wait for every in-neighbour's NOTIFY,
/// reduce all, ACK. No state of its own.
pub(super) struct NotifyAck;

impl Gossip for NotifyAck {
    /// The in-neighbours' models are added into `params` itself, then divided: the same
    /// arithmetic, in the same order, as adding into a copy (so results are bit for bit those of
    /// `w <- (w + sum_j w_j) / (1 + d)`), without the copy. `params` is free to change: every put
    /// of it completed remotely inside `send_all`. Measured reason (`rma-check --probe`, 2 ranks,
    /// benches/rma-transfer.md, 6 runs): the reduce of an 8 MiB model took 1,255-2,027 us of CPU
    /// through the accumulator and 786-971 us in place; at 1 MiB 92-145 us against 67-91 us.
    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        net.send_all(params, round)?;
        let t = net.add_round(round, params)?;
        let d = net.in_degree();
        net.divide(params, d);
        net.ack_round(t)
    }

    fn drain(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        net.drain_acks()
    }
}

/// `--overlap`: a round's models are sent, the next local steps run while they travel, and the
/// round is reduced at the next sync (or at the end, or at a cut).
pub(super) struct Overlap {
    /// The round sent but not yet reduced.
    pending: Option<u64>,
    /// The model as sent in the pending round.
    sent_model: Vec<f32>,
    acc: Vec<f32>,
}

impl Overlap {
    pub(super) fn new(n_params: usize) -> Self {
        Overlap { pending: None, sent_model: Vec::new(), acc: vec![0.0; n_params] }
    }
}

impl Gossip for Overlap {
    /// Completes the pending round's reduce with the models its senders sent, keeping the steps
    /// made since (SGP's overlap: w <- avg(w_sent, in-neighbours) + (w - w_sent)), then sends
    /// this round's model and returns at once; the next sync (or `finish`) reduces it.
    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        self.settle(net, params)?;
        net.send_all(params, round)?;
        self.sent_model.clear();
        self.sent_model.extend_from_slice(params);
        self.pending = Some(round);
        Ok(())
    }

    /// Reduces the pending overlapped round into `params` (no-op when none is pending): a
    /// checkpoint or the final model holds no half-done round.
    fn settle(&mut self, net: &mut Neighbourhood, params: &mut [f32]) -> anyhow::Result<()> {
        let Some(round) = self.pending.take() else { return Ok(()) };
        self.acc.copy_from_slice(&self.sent_model);
        let t = net.add_round(round, &mut self.acc)?;
        let d = net.in_degree();
        let denom = (1 + d) as f32;
        for ((p, a), s) in params.iter_mut().zip(&self.acc).zip(&self.sent_model) {
            *p = *a / denom + (*p - *s);
        }
        net.histogram[d] += 1;
        net.ack_round(t)
    }

    fn drain(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        net.drain_acks()
    }
}

/// NOTIFY-ACK on the one-peer exponential graph: the mailboxes hold every edge of a period, and
/// each round uses only this round's single out-edge and in-edge (see
/// [`crate::graph::one_peer_source`]); each edge's messages are counted on their own (an edge
/// is used once per period).
pub(super) struct OnePeer {
    /// Ranks on the graph.
    size: usize,
}

impl OnePeer {
    pub(super) fn new(size: usize) -> Self {
        OnePeer { size }
    }
}

impl Gossip for OnePeer {
    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let n = self.size;
        if n == 1 {
            net.histogram[0] += 1;
            return Ok(());
        }
        let to = crate::graph::one_peer_target(net.rank, n, round);
        let from = crate::graph::one_peer_source(net.rank, n, round);
        let j = net.mail.out_neighbours().binary_search(&to).expect("a period's edges are all in the mailboxes");
        let i = net.mail.in_neighbours().binary_search(&from).expect("a period's edges are all in the mailboxes");
        if net.sending(round) {
            net.send_one(j, params, round)?;
        }
        // In place, as in `NotifyAck::round`.
        let t2 = net.add_one(i, round, params)?;
        net.divide(params, 1);
        net.ack_one(i, t2)
    }

    fn drain(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        net.drain_acks()
    }
}
