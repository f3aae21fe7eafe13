//! Asynchronous push-sum (`--sync asap --notify push-sum`; Kempe et al., as used by SGP and
//! Bluefog's one-sided mode): its arithmetic ([`PushSum`], testable without MPI) and the
//! variant over asap's mailboxes (`PushSumGossip`).
//!
//! Each rank holds a numerator x and a weight w; its model (the estimate) is z = x / w.
//! - **Update:** the loop's local steps change z, and the change goes into x unscaled (SGP:
//!   x <- x - lr * grad f(z)).
//! - **Push:** every round the rank keeps 1/(d+1) of (x, w) and sends the same share to each of
//!   its d out-neighbours, without waiting for anybody.
//! - **Fold:** a receiver adds whatever arrived since it last looked.
//!
//! Shares travel as *running totals*: per out-edge the sum of every share sent so far, which the
//! sender overwrites in its slot at the receiver. The receiver adds the difference from the total
//! it folded last. A message that is overwritten before it is read is not lost, because the next
//! total contains it. A torn read is skipped and retried next round. Nothing is counted twice,
//! because only differences are added. So mass is conserved:
//! `sum_i x_i + in flight = sum_i x_i(0) + every update`, and `sum_i w_i + in flight = N`.
//! Totals are f64, so their differences keep float precision over long runs (an f32 total would
//! lose the share's low bits once it is large); this doubles the bytes of a message. A last total
//! counts the shares sent on the edge, so a receiver knows how many messages a total stands for
//! (those overwritten before it looked included): what its received-bytes counter counts.

use std::time::Instant;

use anyhow::ensure;
use mpi::topology::Communicator;

use super::neighbourhood::Neighbourhood;
use super::variant::Gossip;
use crate::comm::mailbox::SlotRead;
use crate::sync::{Aggregate, ModeMetric, ModeState};

/// One rank's push-sum state.
#[derive(Clone, Debug, Default)]
pub struct PushSum {
    x: Vec<f64>,
    w: f64,
    /// The estimate last handed to the training loop (its steps since are the update).
    z_prev: Vec<f32>,
    /// Running totals `[x..., w, shares]` of what was sent on each out-edge (all edges get the
    /// same): the numerator's and the weight's shares, and how many shares.
    sent: Vec<f64>,
    /// Per in-neighbour: the running totals folded so far.
    seen: Vec<Vec<f64>>,
}

impl PushSum {
    /// State for `in_degree` in-neighbours; x and w are set at the first [`PushSum::take_update`]
    /// from the model the loop starts with (weight 1).
    pub fn new(in_degree: usize) -> Self {
        PushSum { seen: vec![Vec::new(); in_degree], ..Default::default() }
    }

    /// Moves the loop's steps since the last estimate into x (the first call starts x at the
    /// model, w at 1).
    pub fn take_update(&mut self, params: &[f32]) {
        if self.x.is_empty() {
            self.x = params.iter().map(|&p| p as f64).collect();
            self.w = 1.0;
            self.z_prev = params.to_vec();
            self.sent = vec![0.0; params.len() + 2];
            return;
        }
        for ((x, &p), &z) in self.x.iter_mut().zip(params).zip(&self.z_prev) {
            *x += (p - z) as f64;
        }
    }

    /// Whether this rank may push a share now: only while it holds at least its fair mass
    /// (w >= 1, the mean weight; a relative 1e-9 absorbs the rounding of shares that should
    /// sum back to exactly 1). Pushing keeps half, so w never falls below 1/2 and the step on
    /// x / w is at most doubled. A rank below 1 keeps its mass until its in-neighbours' shares
    /// bring it back; someone always holds at least 1 once what is in flight is folded (the
    /// weights sum to N), so pushing never stops everywhere.
    ///
    /// Measured reason (8 ranks on 2 cores, `--notify push-sum`): with a push every round and
    /// 1/(d+1) kept, a rank whose in-neighbours were descheduled kept dividing its weight, and MLR
    /// at lr 0.3 diverged within an epoch; holding the push until every out-neighbour had folded
    /// the last one fixed MLR but held 95 % of the pushes, and MLP (hidden 128) still diverged by
    /// round 50.
    pub fn may_push(&self) -> bool {
        self.w >= 1.0 - 1e-9
    }

    /// Keeps half of (x, w) and adds an equal part of the other half to the running totals sent
    /// to each of the `out_degree` out-neighbours; returns the totals to put in their slots.
    pub fn share(&mut self, out_degree: usize) -> &[f64] {
        if out_degree == 0 {
            return &self.sent;
        }
        let part = 0.5 / out_degree as f64;
        let n = self.x.len();
        for (x, t) in self.x.iter_mut().zip(&mut self.sent[..n]) {
            *t += *x * part;
            *x *= 0.5;
        }
        self.sent[n] += self.w * part;
        self.sent[n + 1] += 1.0;
        self.w *= 0.5;
        &self.sent
    }

    /// Folds in-neighbour `i`'s running totals `[x..., w, shares]`: adds what arrived since the
    /// last fold. Returns how many shares (messages) the difference holds: 0 when nothing new
    /// arrived, more than 1 when newer totals overwrote older ones before this fold.
    pub fn fold(&mut self, i: usize, totals: &[f64]) -> anyhow::Result<u64> {
        let n = self.x.len();
        ensure!(totals.len() == n + 2, "push-sum totals of {} values for a model of {n}", totals.len());
        let seen = &mut self.seen[i];
        if seen.is_empty() {
            seen.resize(n + 2, 0.0);
        }
        if seen.as_slice() == totals {
            return Ok(0);
        }
        let shares = (totals[n + 1] - seen[n + 1]).max(0.0) as u64;
        for ((x, &t), s) in self.x.iter_mut().zip(&totals[..n]).zip(&seen[..n]) {
            *x += t - s;
        }
        self.w += totals[n] - seen[n];
        seen.copy_from_slice(totals);
        Ok(shares)
    }

    /// Writes the estimate x / w into `params` and remembers it.
    pub fn estimate(&mut self, params: &mut [f32]) {
        let inv = 1.0 / self.w;
        for (p, &x) in params.iter_mut().zip(&self.x) {
            *p = (x * inv) as f32;
        }
        self.z_prev.copy_from_slice(params);
    }

    /// The weight w.
    pub fn weight(&self) -> f64 {
        self.w
    }

    /// The numerator x.
    pub fn numerator(&self) -> &[f64] {
        &self.x
    }

    /// x and w, for a checkpoint taken after a drain (nothing in flight): the running totals
    /// start again at zero with the fresh mailboxes of the resumed run.
    pub fn save_state(&self) -> ModeState {
        vec![("push_sum_x".into(), self.x.clone()), ("push_sum_w".into(), vec![self.w])]
    }

    /// Restores what [`PushSum::save_state`] wrote; `params` is the model the checkpoint holds.
    pub fn restore_state(&mut self, state: ModeState, params_len: usize) -> anyhow::Result<()> {
        let mut x = None;
        let mut w = None;
        for (name, v) in state {
            match name.as_str() {
                "push_sum_x" => x = Some(v),
                "push_sum_w" => w = v.first().copied(),
                other => anyhow::bail!("the checkpoint holds {other}, which --notify push-sum does not use"),
            }
        }
        let (x, w) = x.zip(w).ok_or_else(|| anyhow::anyhow!("the checkpoint has no push-sum state: resume with --notify push-sum"))?;
        if x.is_empty() {
            // Saved before the first round (a fresh mode's state, which a resize at another rank
            // count restores): the numerator starts from the model at the first round, as fresh.
            return Ok(());
        }
        ensure!(x.len() == params_len, "the checkpoint's push-sum numerator has {} values, the model {params_len}", x.len());
        self.z_prev = x.iter().map(|&v| (v / w) as f32).collect();
        self.sent = vec![0.0; x.len() + 2];
        self.seen.iter_mut().for_each(Vec::clear);
        self.x = x;
        self.w = w;
        Ok(())
    }
}

/// `--sync asap --notify push-sum`: the protocol over the asap mailboxes. Push: the loop's steps
/// into x, keep a share, put the running totals to every out-neighbour (header, payload, footer
/// as ordered steps, so a read that overlaps shows as torn), fold in every intact total that
/// changed, and hand back x / w. Nothing waits.
///
/// On `--transport p2p` the running totals travel as two-sided messages (the weight in each, as
/// on rma) and queue instead of overwriting: a fold takes the newest queued, which holds the
/// older ones. A cut settles the links (every total sent is queued at its receiver) before the
/// fold.
///
/// Flow control: a rank pushes only while it holds at least its fair weight
/// ([`PushSum::may_push`]); otherwise it keeps all its mass this round.
pub(in crate::sync) struct PushSumGossip {
    push: PushSum,
    /// One slot's totals `[x..., w, shares]`.
    totals: Vec<f64>,
    /// The weights' sum over ranks at the end (N when mass is conserved).
    weight_sum: f64,
    /// Rounds that pushed nothing because this rank held less than its fair weight.
    held_pushes: u64,
}

impl PushSumGossip {
    pub(in crate::sync) fn new(in_degree: usize) -> Self {
        PushSumGossip { push: PushSum::new(in_degree), totals: Vec::new(), weight_sum: 0.0, held_pushes: 0 }
    }

    /// f32 words of a slot for a model of `n_params` values: f64 running totals of the model,
    /// the weight and the share count.
    pub(in crate::sync) fn slot_len(n_params: usize) -> usize {
        2 * (n_params + 2)
    }

    /// Folds every in-neighbour's intact running totals into the push-sum state; returns how many
    /// brought something new. Torn reads are counted and retried next time.
    fn fold_all(&mut self, net: &mut Neighbourhood) -> anyhow::Result<usize> {
        let p = &mut self.push;
        self.totals.resize(p.numerator().len() + 2, 0.0);
        let mut folded = 0;
        if let Some(links) = &mut net.p2p {
            // Two-sided: the newest queued total holds every older one (each was received, its
            // bytes counted, so nothing is counted as superseded).
            links.poll()?;
            for i in 0..net.mail.in_neighbours().len() {
                if links.take_newest(i) == 0 {
                    continue;
                }
                match links.copy_latest_f64(i, &mut self.totals) {
                    SlotRead::Consistent(_) => folded += usize::from(p.fold(i, &self.totals)? > 0),
                    _ => net.torn += 1,
                }
            }
            return Ok(folded);
        }
        for i in 0..net.in_degree() {
            match net.mail.read_slot(i, &mut self.totals)? {
                SlotRead::Consistent(_) => {
                    // The read counted the newest message; the ones it overwrote arrived in it.
                    let shares = p.fold(i, &self.totals)?;
                    net.mail.count_superseded(shares.saturating_sub(1));
                    folded += usize::from(shares > 0);
                }
                SlotRead::Torn(..) => net.torn += 1,
                SlotRead::Empty => {}
            }
        }
        Ok(folded)
    }
}

impl Gossip for PushSumGossip {
    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let t = Instant::now();
        self.push.take_update(params);
        let d_out = net.mail.out_neighbours().len();
        if self.push.may_push() && net.sending(round) {
            let totals = self.push.share(d_out);
            match &mut net.p2p {
                Some(links) => (0..d_out).try_for_each(|j| links.send_f64_to(j, round, totals))?,
                None => net.mail.post(round, totals, true)?,
            }
        } else {
            self.held_pushes += 1;
        }
        let folded = self.fold_all(net)?;
        net.histogram[folded] += 1;
        self.push.estimate(params);
        net.stats.comm_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Nothing in flight at a checkpoint: every total put is folded before the cut.
    fn quiesce(&mut self, net: &mut Neighbourhood, params: &mut [f32]) -> anyhow::Result<()> {
        if net.p2p.is_some() {
            net.settle_links()?;
            self.fold_all(net)?;
            self.push.estimate(params);
            let (round, timeout) = (net.last_round, net.wait_timeout);
            return net.p2p.as_mut().expect("checked").barrier(round, timeout);
        }
        net.mail.window().flush_all()?;
        net.mail.barrier(net.last_round, net.wait_timeout)?;
        self.fold_all(net)?;
        self.push.estimate(params);
        // Nobody may put a new total before every rank has read the last ones.
        net.mail.barrier(net.last_round, net.wait_timeout)?;
        Ok(())
    }

    /// The end of push-sum, after the barrier that follows every rank's last put: fold the last
    /// totals (nothing is in flight any more), then the model is sum_i x_i / sum_i w_i, the
    /// average of the initial models and every update (one allreduce of x and w, counted as
    /// final-model traffic like every mode's). The weight sum is kept for the metrics: N when
    /// no mass was lost.
    fn final_model(&mut self, net: &mut Neighbourhood, params: &mut [f32]) -> anyhow::Result<()> {
        let t = Instant::now();
        let r0 = net.byte_counts().1;
        self.fold_all(net)?;
        net.stats.bytes_received += net.byte_counts().1 - r0;
        let p = &self.push;
        let mut sums: Vec<f64> = p.numerator().to_vec();
        sums.push(p.weight());
        crate::comm::collectives::sum_f64(&net.comm, &mut sums);
        let w = *sums.last().expect("the weight");
        for (q, x) in params.iter_mut().zip(&sums) {
            *q = (x / w) as f32;
        }
        self.weight_sum = w;
        net.stats.final_bytes += crate::sync::ring_allreduce_bytes(net.comm.size() as usize, 2 * sums.len());
        net.stats.final_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// On p2p: every total sent is queued at its receiver before the end's barrier (the last
    /// fold, in [`Gossip::final_model`], takes it).
    fn drain(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        net.settle_links_counted()
    }

    fn save_state(&self) -> ModeState {
        self.push.save_state()
    }

    fn restore_state(&mut self, state: ModeState, n_params: usize) -> anyhow::Result<()> {
        self.push.restore_state(state, n_params)
    }

    fn metrics(&self, out: &mut Vec<ModeMetric>) {
        out.extend([
            ModeMetric::number("push_sum_weight_sum", Aggregate::Max, self.weight_sum),
            ModeMetric::number("push_sum_held_pushes", Aggregate::Sum, self.held_pushes as f64),
            ModeMetric::number("push_sum_weight", Aggregate::Max, self.push.weight()),
        ]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Three ranks on a directed ring with updates every round, a random half of the reads
    /// missed (a late or torn message) and every total overwritten before it is read: after a
    /// last fold of everything, the numerators add up to the initial models plus every update
    /// and the weights to N, to float precision.
    #[test]
    fn mass_is_conserved_whatever_is_read_late() {
        let n = 3;
        let mut ranks: Vec<PushSum> = (0..n).map(|_| PushSum::new(1)).collect();
        let mut params: Vec<Vec<f32>> = (0..n).map(|r| vec![r as f32, 1.0 + r as f32]).collect();
        let mut slots: Vec<Vec<f64>> = vec![vec![0.0; 4]; n]; // slot r: what rank r - 1 last put
        let (mut pushed, mut folded) = (0u64, 0u64);
        let mut updates = [0f64; 2];
        let mut rng = Rng::new(5);
        for round in 0..500 {
            for r in 0..n {
                // A local step: rank r moves its model by a small known amount.
                let u = [0.01 * (r as f32 + 1.0), -0.003 * round as f32 / 100.0];
                for k in 0..2 {
                    let before = params[r][k];
                    params[r][k] += u[k];
                    // The update is what the f32 step really changed.
                    updates[k] += (params[r][k] - before) as f64;
                }
                ranks[r].take_update(&params[r]);
                slots[(r + 1) % n] = ranks[r].share(1).to_vec();
                pushed += 1;
            }
            for r in 0..n {
                if rng.below(2) == 0 {
                    folded += ranks[r].fold(0, &slots[r].clone()).unwrap();
                }
                ranks[r].estimate(&mut params[r]);
            }
        }
        for r in 0..n {
            folded += ranks[r].fold(0, &slots[r].clone()).unwrap();
        }
        assert_eq!(folded, pushed, "every share is counted once by its receiver");
        let w: f64 = ranks.iter().map(|p| p.weight()).sum();
        assert!((w - n as f64).abs() < 1e-12, "weights sum to {w}");
        for (k, update) in updates.iter().enumerate() {
            let x: f64 = ranks.iter().map(|p| p.numerator()[k]).sum();
            let want = (0..n).map(|r| r as f64 + k as f64).sum::<f64>() + update;
            assert!((x - want).abs() < 1e-9, "coordinate {k}: mass {x}, expected {want}");
        }
        // And every rank's estimate is close to the common average.
        let mean = |k: usize| ranks.iter().map(|p| p.numerator()[k]).sum::<f64>() / n as f64;
        for p in &ranks {
            assert!(
                (p.numerator()[0] / p.weight() - mean(0)).abs() < 0.5,
                "estimate {} (x {} w {}) mean {}",
                p.numerator()[0] / p.weight(),
                p.numerator()[0],
                p.weight(),
                mean(0)
            );
        }
    }

    #[test]
    fn a_fold_of_unchanged_totals_adds_nothing_and_state_round_trips() {
        let mut p = PushSum::new(1);
        p.take_update(&[1.0, 2.0]);
        let totals = vec![0.5, 1.0, 0.5, 3.0];
        assert_eq!(p.fold(0, &totals).unwrap(), 3, "a total of three shares");
        assert_eq!(p.fold(0, &totals).unwrap(), 0, "nothing new");
        assert_eq!((p.numerator(), p.weight()), (&[1.5, 3.0][..], 1.5));
        let mut q = PushSum::new(1);
        q.restore_state(p.save_state(), 2).unwrap();
        assert_eq!((q.numerator(), q.weight()), (p.numerator(), p.weight()));
        assert!(q.fold(0, &[1.0, 1.0]).is_err(), "a total of the wrong length is refused");
        assert!(PushSum::new(1).restore_state(vec![], 2).is_err());
    }

    #[test]
    fn a_push_keeps_half_splits_the_rest_and_waits_for_fair_weight() {
        let mut p = PushSum::new(1);
        p.take_update(&[4.0, -2.0]);
        assert!(p.may_push(), "a rank starts at weight 1");
        let sent = p.share(2).to_vec();
        // Kept half, and a quarter on each of the 2 out-edges: 4 * 0.25 = 1, weight 0.25.
        assert_eq!(sent, vec![1.0, -0.5, 0.25, 1.0]);
        assert_eq!((p.numerator(), p.weight()), (&[2.0, -1.0][..], 0.5));
        assert!(!p.may_push(), "below its fair weight a rank keeps its mass");
        // Shares worth half a weight come back: fair again.
        p.fold(0, &[1.0, -0.5, 0.5, 2.0]).unwrap();
        assert!(p.may_push());
        let mut z = [0.0; 2];
        p.estimate(&mut z);
        assert_eq!(z, [3.0, -1.5]);
    }
}
