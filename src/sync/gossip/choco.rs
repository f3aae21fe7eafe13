//! Compressed gossip (`--sync asap --compress int8|topk:F`): CHOCO-GOSSIP (Koloskova, Stich and
//! Jaggi 2019, arXiv 1902.00340, Algorithm 1; CHOCO-SGD, Algorithm 2, is it between local steps).
//!
//! Averaging compressed models directly does not converge: the compression error never shrinks.
//! CHOCO keeps *public copies* instead. Every rank i holds x̂_i, the copy of its own model that
//! its out-neighbours know, and x̂_j, its copy of each in-neighbour j's. At a sync:
//! 1. q_i = C(x_i - x̂_i), encoded as int8 or top-k bytes (sync/codec/), and x̂_i += q_i;
//! 2. q_i goes to every out-neighbour over NOTIFY-ACK's byte messages (`Message::Bytes` of
//!    gossip/neighbourhood.rs), and each q_j that arrives updates x̂_j += q_j;
//! 3. x_i += γ sum_j w_ij (x̂_j - x̂_i), over the in-neighbours j, with NOTIFY-ACK's weights
//!    w_ij = 1 / (1 + d) (d: the in-degree), γ the consensus step (`--consensus-step`).
//!
//! What a rank sends is only the compressed difference to what its receivers already hold, so the
//! compression error of one round is sent with the next ones (x - x̂ plays the residual of error
//! feedback), and as the replicas agree the differences, and the errors with them, shrink.
//!
//! - **Copies agree bit for bit.** A sender updates x̂_i by decoding its own bytes with the code
//!   every receiver runs on them, so every holder of x̂_i adds the same floats in the same order.
//!   That needs every message delivered exactly once and in order: NOTIFY-ACK at staleness 0,
//!   which is why `--sync asap` refuses `--compress` with `--notify` other than notify-ack,
//!   `--staleness` > 0, `--overlap` and `--bandwidth-mbps` (see asap.rs's rules). A torn message
//!   is NOTIFY-ACK's one torn-message error, as for every byte message.
//! - **The mean is kept.** Summed over the ranks, the step moves sum_i sum_j w_ij (x̂_j - x̂_i),
//!   which is 0 when every column of W sums to 1 as every row does: a regular graph whose in- and
//!   out-degrees are equal (hypercube, torus, complete, a random regular graph).
//! - **The one-peer exponential graph** (`--graph one-peer-exponential`, NoLoCo's): in round k
//!   rank i sends only to i + o and receives only from i - o, o = 2^((k - 1) mod log2 N) (see
//!   `crate::graph::one_peer_target`), so each out-neighbour hears one round in a period and
//!   would miss the changes sent to the others. Each offset o therefore has its own pair of
//!   copies: x̂_i^(o), what rank i + o holds of rank i, and x̂_{i-o}, rank i's copy of rank
//!   i - o. At a round of offset o: q = C(x_i - x̂_i^(o)), x̂_i^(o) += q, q goes to i + o; the
//!   q of i - o updates x̂_{i-o}; x_i += γ / 2 (x̂_{i-o} - x̂_i^(o)), the weights 1/2 of the
//!   uncompressed one-peer round (x_i <- (x_i + x_{i-o}) / 2, gossip/notify_ack.rs's
//!   `OnePeer`). The offsets 2^k < N are distinct, so an offset's copies pair up one to one:
//!   rank i's x̂_{i-o} is bit for bit rank i - o's x̂_{i-o}^(o), and summed over i the step is
//!   sum_i x̂_{i-o}^(o) - sum_i x̂_i^(o) = 0 (i -> i - o permutes the ranks): the mean is kept.
//!   The copies cost 2 log2 N models a rank.
//! - **Where the copies start.** At the model every rank starts from, when all do (a training
//!   run's seeded model; one collective comparison of its hash at build): the first messages are
//!   then the changes since the start, as allreduce's, and no round is spent filling the copies.
//!   Otherwise (`--consensus-only`, where each rank starts from its own model) at 0, the paper's
//!   start. On the bench of benches/compress.md (asap hypercube, 8 ranks, MLP-256, top-1 %) the
//!   start made no difference to accuracy (53.49 % from 0, 53.39 % from the model, medians of 3
//!   seeds), and no consensus step closed the gap either (the sweep is in benches/compress.md).
//! - **The consensus step γ** trades speed for stability: with exact messages γ = 1 is plain
//!   gossip; the coarser the compression, the smaller the γ that converges (the paper tunes it
//!   per codec). The defaults ([`default_step`]) are measured (see there).
//! - **Bytes** are counted as put: per out-edge and round (one out-edge on the one-peer graph)
//!   the encoded body (int8: n + 4
//!   ceil(n / block); top-k: 8 ceil(F n), or 4 n when shorter) and the mailbox's three words and
//!   NOTIFY word.
//! - **Checkpoints** hold x̂_i and every x̂_j (`choco_public_self`, `choco_public_in_{i}`; on the
//!   one-peer graph x̂_i^(o) per out-edge j, `choco_public_self_{j}`); a
//!   checkpoint is taken between rounds, when every message of the last round has been read, so
//!   a resume continues bit-identically.

use std::time::Instant;

use anyhow::{ensure, Context};

use super::neighbourhood::{Inbox, Message, Neighbourhood, Outbox, Slot};
use super::variant::Gossip;
use crate::comm::collectives;
use crate::comm::mailbox::Mailboxes;
use crate::sync::codec::mean::Compression;
use crate::sync::{Aggregate, ModeMetric, ModeState, SyncContext};

/// What `--compress` and `--consensus-step` ask of the gossip engine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChocoOptions {
    pub compression: Compression,
    /// γ, in (0, 1].
    pub step: f64,
}

/// The consensus step γ where `--consensus-step` is not given, measured with `--consensus-only`
/// (8 ranks, `--graph hypercube`, the default model of 7,850 values, seed 5, the replicas'
/// distance to their mean after 760 rounds, from about 70 after the first rounds):
/// - int8: γ = 1 reached the rounding floor, 1.0e-6, by round 50; γ = 0.5 needed 90 rounds for
///   3.4e-6. The paper's 8-bit quantisation also takes γ near 1.
/// - top-1 %: γ = 0.02 fell to 1.1e-2, geometrically (x 0.39 every 80 rounds); 0.01 to 0.71;
///   0.05 stalled at 7.3; 0.1 grew again after round 360. top-5 %: γ = 0.1 reached the floor
///   (8.9e-6) by round 280, 0.05 reached 2.9e-5, 0.2 diverged. So γ = 2 F for top-F: the best of
///   the grid at both fractions, half of where it diverged.
///
/// The same defaults hold on `--graph one-peer-exponential` (8 ranks, a copy per edge; the
/// same data, 10,000 examples at batch 16, seed 5, distance after 720 rounds):
/// - int8: γ = 1 reached 0 (the replicas bit-identical) by round 80, the first measured; γ = 0.5
///   stalled at 2.4e-6.
/// - top-1 %: every γ of the grid converged geometrically, none stalled or diverged: 0.01 fell to
///   5.19 (x 0.73 every 80 rounds at the end), 0.02 to 5.79 (x 0.78), 0.05 to 7.98, 0.1 to 19.1,
///   from about 60 at round 80. The default 0.02 is within 12 % of the best of the grid, 0.01.
/// - top-5 %: γ = 0.1 fell to 5.7e-5 (x 0.2 every 80 rounds), 0.2 to 1.9e-3 (x 0.33).
///
/// The one-peer graph converges more slowly under top-1 % than the hypercube (x 0.39 every 80
/// rounds there): each edge's copy is updated once a period of log2 N rounds.
///
/// In training the best step can differ: on the MLP bench of benches/compress.md (by-label:2
/// shards, top-1 %, seed 1) γ = 0.1 gave 63.8 % against 53 % at the default 0.02, and 0.2
/// gave 57.3 %; the default stays the one under which the replicas were measured to agree.
pub fn default_step(c: &Compression) -> f64 {
    match *c {
        // fp16 rounds each value to 11 significant bits, finer than int8's 8 bits under a
        // block's scale, so int8's γ holds (tests/compress.rs runs it to agreement).
        Compression::Int8 { .. } | Compression::Fp16 => INT8_STEP,
        Compression::TopK { fraction } => (TOPK_STEP_PER_FRACTION * fraction).min(1.0),
    }
}

/// γ under int8 (see [`default_step`]).
const INT8_STEP: f64 = 1.0;

/// γ under top-k, per unit of the fraction sent (see [`default_step`]).
const TOPK_STEP_PER_FRACTION: f64 = 2.0;

/// The names of the public copies in a checkpoint's mode state (on the one-peer graph
/// `choco_public_self_{j}`, one per out-edge j).
const PUBLIC_SELF: &str = "choco_public_self";
const PUBLIC_IN: &str = "choco_public_in_";

/// `--sync asap --compress`: NOTIFY-ACK whose messages are the compressed changes of the public
/// copies.
pub(in crate::sync) struct Choco {
    compression: Compression,
    step: f32,
    /// x̂_i, what the out-neighbours hold of this rank's model: one copy on a static graph
    /// (every out-neighbour gets every message), one per out-edge (in `out_neighbours()` order)
    /// on the one-peer graph (each out-neighbour gets one round of a period).
    public_self: Vec<Vec<f32>>,
    /// x̂_j of each in-neighbour j (in `in_neighbours()` order).
    public_in: Vec<Vec<f32>>,
    /// `--graph one-peer-exponential`: its number of ranks (each round uses one out- and one
    /// in-edge).
    one_peer: Option<usize>,
    /// The encoder's scratch: -x̂_i, then what the encoding left out.
    left_out: Vec<f32>,
    /// One message's body, sent or received.
    body: Vec<u8>,
    /// Body bytes this rank put (its messages' encoded sizes, summed over out-edges).
    encoded_sent: u64,
}

impl Choco {
    /// Collectively sets up the mailboxes for `in_neighbours` (each slot holds one encoded
    /// message) and this rank's public copies: at `init` when every rank starts from it (the
    /// seeded model of a training run), at 0 otherwise (`--consensus-only`'s own models).
    /// `one_peer`: the graph is the one-peer exponential one (`in_neighbours` lists a period's
    /// edges).
    pub(in crate::sync) fn build(
        ctx: &SyncContext,
        in_neighbours: &[Vec<usize>],
        o: &ChocoOptions,
        init: &[f32],
        one_peer: bool,
        p2p: bool,
    ) -> anyhow::Result<(Mailboxes, Self)> {
        o.compression.check()?;
        ensure!(o.step > 0.0 && o.step <= 1.0, "--consensus-step must be in (0, 1], got {}", o.step);
        let n = ctx.n_params();
        ensure!(init.len() == n, "--compress under --sync asap: a starting model of {} values for a model of {n}", init.len());
        // With `p2p` the messages go two-sided: the window holds no slots.
        let body = if p2p { 0 } else { o.compression.encoded_len(n) };
        let mail = Mailboxes::for_bytes(ctx.comm, in_neighbours, body).context("setting up the ASAP mailboxes (one-sided MPI window)")?;
        let hash = init.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ x.to_bits() as u64).wrapping_mul(0x0100_0000_01b3));
        let shared = collectives::max_u64(ctx.comm, hash) == collectives::min_u64(ctx.comm, hash);
        let start = if shared { init.to_vec() } else { vec![0.0; n] };
        let (d_in, d_out) = (mail.in_neighbours().len(), mail.out_neighbours().len());
        let one_peer = one_peer.then_some(in_neighbours.len());
        Ok((mail, Choco::new(o, start, d_in, one_peer.map_or(1, |_| d_out), one_peer)))
    }

    /// A rank's state for `in_degree` in-neighbours and `own_copies` copies of its own model,
    /// every copy at `start` (one value a parameter).
    fn new(o: &ChocoOptions, start: Vec<f32>, in_degree: usize, own_copies: usize, one_peer: Option<usize>) -> Self {
        let n = start.len();
        Choco {
            compression: o.compression,
            step: o.step as f32,
            public_in: vec![start.clone(); in_degree],
            public_self: vec![start; own_copies],
            one_peer,
            left_out: vec![0.0; n],
            body: Vec::new(),
            encoded_sent: 0,
        }
    }

    /// q = C(x - x̂) into `body`, and x̂ += q through the receivers' decoding, for this rank's
    /// copy `copy` (0 on a static graph, the out-edge on the one-peer graph).
    fn compose(&mut self, copy: usize, params: &[f32]) -> anyhow::Result<()> {
        let public = &mut self.public_self[copy];
        // encode(x, -x̂) encodes x + (-x̂), which is x - x̂ exactly as a subtraction rounds it.
        self.left_out.iter_mut().zip(public.iter()).for_each(|(l, p)| *l = -p);
        self.body.clear();
        self.compression.encode(params, &mut self.left_out, &mut self.body);
        self.compression.add_decoded(&self.body, public).context("decoding this rank's own message")
    }

    /// x_i += γ / (1 + d) sum_j (x̂_j - x̂_i), over every in-neighbour (a static graph).
    fn mix(&self, params: &mut [f32]) {
        let weight = self.step / (1 + self.public_in.len()) as f32;
        for (k, (x, own)) in params.iter_mut().zip(&self.public_self[0]).enumerate() {
            let pull: f32 = self.public_in.iter().map(|p| p[k] - own).sum();
            *x += weight * pull;
        }
    }

    /// x_i += γ / 2 (x̂_{i-o} - x̂_i^(o)): the copy of in-edge `in_edge` (the rank at -o) and
    /// this rank's copy for out-edge `out_edge` (the rank at +o), both of the round's offset o
    /// (the one-peer graph's weights: 1/2 each).
    fn mix_pair(&self, in_edge: usize, out_edge: usize, params: &mut [f32]) {
        let weight = self.step / 2.0;
        for ((x, theirs), own) in params.iter_mut().zip(&self.public_in[in_edge]).zip(&self.public_self[out_edge]) {
            *x += weight * (theirs - own);
        }
    }

    /// A round on the one-peer graph of `size` ranks: compose for and send to this round's one
    /// out-neighbour, update the copy of this round's one in-neighbour, mix the pair.
    fn one_peer_round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64, size: usize) -> anyhow::Result<()> {
        if size == 1 {
            net.histogram[0] += 1;
            return Ok(());
        }
        let to = crate::graph::one_peer_target(net.rank, size, round);
        let from = crate::graph::one_peer_source(net.rank, size, round);
        let j = net.mail.out_neighbours().binary_search(&to).expect("a period's edges are all in the mailboxes");
        let i = net.mail.in_neighbours().binary_search(&from).expect("a period's edges are all in the mailboxes");
        if net.sending(round) {
            self.compose(j, params)?;
            self.encoded_sent += self.body.len() as u64;
            let body = std::mem::take(&mut self.body);
            net.send_message(j, round, &mut Broadcast(&body))?;
            self.body = body;
        }
        let t2 = net.receive_one(i, round, self)?;
        self.mix_pair(i, j, params);
        net.histogram[1] += 1;
        net.ack_one(i, t2)
    }

    /// The checkpoint names of the public copies, this rank's own first, then the in-neighbours'.
    fn copy_names(&self) -> Vec<String> {
        let own = |j: usize| if self.one_peer.is_some() { format!("{PUBLIC_SELF}_{j}") } else { PUBLIC_SELF.to_owned() };
        let ins = (0..self.public_in.len()).map(|i| format!("{PUBLIC_IN}{i}"));
        (0..self.public_self.len()).map(own).chain(ins).collect()
    }
}

/// Every out-edge gets the one encoded message of the round.
struct Broadcast<'a>(&'a [u8]);

impl Outbox for Broadcast<'_> {
    fn message(&mut self, _j: usize, _round: u64, _acked: Instant) -> Message<'_> {
        Message::Bytes(self.0)
    }
}

/// Each in-neighbour's message updates this rank's copy of it.
impl Inbox for Choco {
    fn slot(&mut self) -> Slot<'_> {
        Slot::Bytes(&mut self.body)
    }

    fn received(&mut self, i: usize, _round: u64) -> anyhow::Result<()> {
        self.compression.add_decoded(&self.body, &mut self.public_in[i])
    }
}

impl Gossip for Choco {
    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        if let Some(size) = self.one_peer {
            return self.one_peer_round(net, params, round, size);
        }
        // A rank stopped by fault injection sends nothing, so its copy must not move either.
        if net.sending(round) {
            self.compose(0, params)?;
            self.encoded_sent += (self.body.len() * net.mail.out_neighbours().len()) as u64;
            let body = std::mem::take(&mut self.body);
            net.send_each(round, &mut Broadcast(&body))?;
            self.body = body;
        }
        let t2 = net.receive_round(round, self)?;
        self.mix(params);
        net.histogram[self.public_in.len()] += 1;
        net.ack_round(t2)
    }

    fn drain(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        net.drain_acks()
    }

    fn save_state(&self) -> ModeState {
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let copies = self.public_self.iter().chain(&self.public_in);
        self.copy_names().into_iter().zip(copies).map(|(name, p)| (name, f64s(p))).collect()
    }

    fn restore_state(&mut self, state: ModeState, n_params: usize) -> anyhow::Result<()> {
        let kept = self.public_self.len() + self.public_in.len();
        ensure!(
            state.len() == kept,
            "the checkpoint holds {} arrays of sync-mode state; --compress under --sync asap keeps {kept} (its own public copies and one per in-neighbour): resume with the --graph and --compress of the run that wrote it",
            state.len(),
        );
        let mut state: std::collections::HashMap<String, Vec<f64>> = state.into_iter().collect();
        let names = self.copy_names();
        for (name, target) in names.into_iter().zip(self.public_self.iter_mut().chain(&mut self.public_in)) {
            let values = state.remove(&name).with_context(|| {
                format!("the checkpoint lacks {name}, which --compress under --sync asap keeps: resume with the --graph and --compress of the run that wrote it")
            })?;
            ensure!(values.len() == n_params, "the checkpoint's {name} holds {} values, the model {n_params}", values.len());
            *target = values.into_iter().map(|x| x as f32).collect();
        }
        Ok(())
    }

    fn metrics(&self, out: &mut Vec<ModeMetric>) {
        out.push(ModeMetric::number("compressed_bytes_sent", Aggregate::Sum, self.encoded_sent as f64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Three ranks on the complete graph, in one process: every round each composes its message,
    /// every other one receives it, then each mixes (the steps of `Choco::round` without the
    /// mailboxes). Each copy of a rank's model agrees bit for bit with the rank's own, the sum of
    /// the models stays put up to rounding, and the models agree in the end.
    fn three_ranks(compression: Compression, rounds: usize) {
        let n = 500;
        let o = ChocoOptions { compression, step: default_step(&compression) };
        let mut ranks: Vec<Choco> = (0..3).map(|_| Choco::new(&o, vec![0.0; n], 2, 1, None)).collect();
        let mut r = Rng::new(3);
        let mut x: Vec<Vec<f32>> = (0..3).map(|_| (0..n).map(|_| r.normal() as f32).collect()).collect();
        let sum = |x: &[Vec<f32>]| (0..n).map(|k| x.iter().map(|v| v[k] as f64).sum::<f64>()).collect::<Vec<f64>>();
        let spread = |x: &[Vec<f32>]| (0..n).map(|k| (x[0][k] - x[1][k]).abs().max((x[0][k] - x[2][k]).abs())).fold(0f32, f32::max);
        let (before, apart) = (sum(&x), spread(&x));
        for _ in 0..rounds {
            let bodies: Vec<Vec<u8>> = ranks
                .iter_mut()
                .zip(&x)
                .map(|(c, x)| {
                    c.compose(0, x).unwrap();
                    c.body.clone()
                })
                .collect();
            for (i, c) in ranks.iter_mut().enumerate() {
                // In-neighbours in rank order, as `in_neighbours()` lists them.
                for (slot, j) in (0..3).filter(|&j| j != i).enumerate() {
                    c.body.clone_from(&bodies[j]);
                    c.received(slot, 0).unwrap();
                }
            }
            for (c, x) in ranks.iter().zip(&mut x) {
                c.mix(x);
            }
        }
        for i in 0..3 {
            for (slot, j) in (0..3).filter(|&j| j != i).enumerate() {
                assert!(ranks[i].public_in[slot].iter().zip(&ranks[j].public_self[0]).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
        let moved = before.iter().zip(sum(&x)).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
        assert!(moved < 1e-4, "{compression:?}: the sum moved by {moved}");
        let left = spread(&x);
        assert!(left < 1e-3 * apart, "{compression:?}: the models are {left} apart, from {apart}");
    }

    /// Eight ranks on the one-peer exponential graph, in one process: each round every rank
    /// composes for its one out-neighbour's copy, that neighbour updates its copy of it, each
    /// mixes the pair. Every offset's copies agree bit for bit, the sum stays up to rounding and
    /// the models agree in the end.
    fn eight_ranks_one_peer(compression: Compression, rounds: u64) {
        let (n, size) = (500, 8);
        let o = ChocoOptions { compression, step: default_step(&compression) };
        let mut ranks: Vec<Choco> = (0..size).map(|_| Choco::new(&o, vec![0.0; n], 3, 3, Some(size))).collect();
        // The mailboxes' order: the period's neighbours, sorted.
        let sorted = |mut v: Vec<usize>| {
            v.sort_unstable();
            v
        };
        let outs: Vec<Vec<usize>> = (0..size).map(|r| sorted([1, 2, 4].iter().map(|o| (r + o) % size).collect())).collect();
        let ins: Vec<Vec<usize>> = (0..size).map(|r| sorted([1, 2, 4].iter().map(|o| (r + size - o) % size).collect())).collect();
        let edge = |r: usize, round: u64| {
            let (to, from) = (crate::graph::one_peer_target(r, size, round), crate::graph::one_peer_source(r, size, round));
            (outs[r].binary_search(&to).unwrap(), ins[r].binary_search(&from).unwrap(), from)
        };
        let mut rng = Rng::new(3);
        let mut x: Vec<Vec<f32>> = (0..size).map(|_| (0..n).map(|_| rng.normal() as f32).collect()).collect();
        let sum = |x: &[Vec<f32>]| (0..n).map(|k| x.iter().map(|v| v[k] as f64).sum::<f64>()).collect::<Vec<f64>>();
        let spread = |x: &[Vec<f32>]| (0..n).map(|k| x.iter().map(|v| (v[k] - x[0][k]).abs()).fold(0f32, f32::max)).fold(0f32, f32::max);
        let (before, apart) = (sum(&x), spread(&x));
        for round in 1..=rounds {
            let bodies: Vec<Vec<u8>> = (0..size)
                .map(|r| {
                    ranks[r].compose(edge(r, round).0, &x[r]).unwrap();
                    ranks[r].body.clone()
                })
                .collect();
            for r in 0..size {
                let (j, i, from) = edge(r, round);
                ranks[r].body.clone_from(&bodies[from]);
                ranks[r].received(i, round).unwrap();
                ranks[r].mix_pair(i, j, &mut x[r]);
            }
        }
        for r in 0..size {
            for (i, &from) in ins[r].iter().enumerate() {
                let j = outs[from].binary_search(&r).unwrap();
                assert!(ranks[r].public_in[i].iter().zip(&ranks[from].public_self[j]).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
        let moved = before.iter().zip(sum(&x)).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
        assert!(moved < 1e-4, "{compression:?}: the sum moved by {moved}");
        let left = spread(&x);
        assert!(left < 1e-3 * apart, "{compression:?}: the models are {left} apart, from {apart}");
    }

    #[test]
    fn one_peer_copies_agree_the_mean_stays_and_the_models_agree() {
        eight_ranks_one_peer(Compression::Int8 { block: 64 }, 60);
        eight_ranks_one_peer(Compression::TopK { fraction: 0.1 }, 600);
    }

    #[test]
    fn copies_agree_the_mean_stays_and_the_models_agree_under_int8() {
        three_ranks(Compression::Int8 { block: 64 }, 40);
    }

    #[test]
    fn copies_agree_the_mean_stays_and_the_models_agree_under_top_k() {
        three_ranks(Compression::TopK { fraction: 0.1 }, 400);
    }
}
