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
//!   That needs every message delivered exactly once and in order: NOTIFY-ACK on a static graph
//!   at staleness 0, which is why `--sync asap` refuses `--compress` with `--notify` other than
//!   notify-ack, `--staleness` > 0, `--overlap`, `--bandwidth-mbps` and the one-peer graph (see
//!   asap.rs's rules). A torn message is NOTIFY-ACK's one torn-message error, as for every byte
//!   message.
//! - **The mean is kept.** Summed over the ranks, the step moves sum_i sum_j w_ij (x̂_j - x̂_i),
//!   which is 0 when every column of W sums to 1 as every row does: a regular graph whose in- and
//!   out-degrees are equal (hypercube, torus, complete, a random regular graph).
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
//! - **Bytes** are counted as put: per out-edge and round the encoded body (int8: n + 4
//!   ceil(n / block); top-k: 8 ceil(F n), or 4 n when shorter) and the mailbox's three words and
//!   NOTIFY word.
//! - **Checkpoints** hold x̂_i and every x̂_j (`choco_public_self`, `choco_public_in_{i}`); a
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

/// The names of the public copies in a checkpoint's mode state.
const PUBLIC_SELF: &str = "choco_public_self";
const PUBLIC_IN: &str = "choco_public_in_";

/// `--sync asap --compress`: NOTIFY-ACK whose messages are the compressed changes of the public
/// copies.
pub(in crate::sync) struct Choco {
    compression: Compression,
    step: f32,
    /// x̂_i: what the out-neighbours hold of this rank's model.
    public_self: Vec<f32>,
    /// x̂_j of each in-neighbour j (in `in_neighbours()` order).
    public_in: Vec<Vec<f32>>,
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
    pub(in crate::sync) fn build(
        ctx: &SyncContext,
        in_neighbours: &[Vec<usize>],
        o: &ChocoOptions,
        init: &[f32],
    ) -> anyhow::Result<(Mailboxes, Self)> {
        o.compression.check()?;
        ensure!(o.step > 0.0 && o.step <= 1.0, "--consensus-step must be in (0, 1], got {}", o.step);
        let n = ctx.n_params();
        ensure!(init.len() == n, "--compress under --sync asap: a starting model of {} values for a model of {n}", init.len());
        let mail = Mailboxes::for_bytes(ctx.comm, in_neighbours, o.compression.encoded_len(n))
            .context("setting up the ASAP mailboxes (one-sided MPI window)")?;
        let hash = init.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ x.to_bits() as u64).wrapping_mul(0x0100_0000_01b3));
        let shared = collectives::max_u64(ctx.comm, hash) == collectives::min_u64(ctx.comm, hash);
        let start = if shared { init.to_vec() } else { vec![0.0; n] };
        let d = mail.in_neighbours().len();
        Ok((mail, Choco::new(o, start, d)))
    }

    /// A rank's state for `in_degree` in-neighbours, every copy at `start` (one value a
    /// parameter).
    fn new(o: &ChocoOptions, start: Vec<f32>, in_degree: usize) -> Self {
        let n = start.len();
        Choco {
            compression: o.compression,
            step: o.step as f32,
            public_in: vec![start.clone(); in_degree],
            public_self: start,
            left_out: vec![0.0; n],
            body: Vec::new(),
            encoded_sent: 0,
        }
    }

    /// q = C(x - x̂_i) into `body`, and x̂_i += q through the receivers' decoding.
    fn compose(&mut self, params: &[f32]) -> anyhow::Result<()> {
        // encode(x, -x̂) encodes x + (-x̂), which is x - x̂ exactly as a subtraction rounds it.
        self.left_out.iter_mut().zip(&self.public_self).for_each(|(l, p)| *l = -p);
        self.body.clear();
        self.compression.encode(params, &mut self.left_out, &mut self.body);
        self.compression.add_decoded(&self.body, &mut self.public_self).context("decoding this rank's own message")
    }

    /// x_i += γ / (1 + d) sum_j (x̂_j - x̂_i).
    fn mix(&self, params: &mut [f32]) {
        let weight = self.step / (1 + self.public_in.len()) as f32;
        for (k, (x, own)) in params.iter_mut().zip(&self.public_self).enumerate() {
            let pull: f32 = self.public_in.iter().map(|p| p[k] - own).sum();
            *x += weight * pull;
        }
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
        // A rank stopped by fault injection sends nothing, so its copy must not move either.
        if net.sending(round) {
            self.compose(params)?;
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
        let mut s = vec![(PUBLIC_SELF.to_owned(), f64s(&self.public_self))];
        s.extend(self.public_in.iter().enumerate().map(|(i, p)| (format!("{PUBLIC_IN}{i}"), f64s(p))));
        s
    }

    fn restore_state(&mut self, state: ModeState, n_params: usize) -> anyhow::Result<()> {
        let d = self.public_in.len();
        ensure!(
            state.len() == 1 + d,
            "the checkpoint holds {} arrays of sync-mode state; --compress under --sync asap keeps {} (its own public copy and one per in-neighbour): resume with the --graph and --compress of the run that wrote it",
            state.len(),
            1 + d
        );
        for (name, values) in state {
            let target = match name.strip_prefix(PUBLIC_IN).and_then(|i| i.parse::<usize>().ok()) {
                Some(i) if i < d => &mut self.public_in[i],
                _ if name == PUBLIC_SELF => &mut self.public_self,
                _ => anyhow::bail!("the checkpoint holds {name}, which --compress under --sync asap does not keep (another graph?)"),
            };
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
        let mut ranks: Vec<Choco> = (0..3).map(|_| Choco::new(&o, vec![0.0; n], 2)).collect();
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
                    c.compose(x).unwrap();
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
                assert!(ranks[i].public_in[slot].iter().zip(&ranks[j].public_self).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
        let moved = before.iter().zip(sum(&x)).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
        assert!(moved < 1e-4, "{compression:?}: the sum moved by {moved}");
        let left = spread(&x);
        assert!(left < 1e-3 * apart, "{compression:?}: the models are {left} apart, from {apart}");
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
