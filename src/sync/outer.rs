//! The outer optimizer (`--outer-optimizer`): at every sync of a mode that averages replicas, a
//! step on the pseudo-gradient instead of taking the average as it is.
//!
//! - DiLoCo (Douillard et al., arXiv 2311.08105, Algorithm 1): each replica runs H inner steps
//!   from the outer model x; the pseudo-gradient is x minus the average of the replicas, and an
//!   outer Nesterov step on it gives the next x. Here: `--sync allreduce --sync-every H
//!   --outer-optimizer nesterov`.
//! - NoLoCo (Kolehmainen et al., arXiv 2506.10911): no all-reduce; each replica averages with a
//!   few peers, and the outer step pulls its weights towards theirs. Here: the gossip modes
//!   (`--sync asap`, every variant), in one of two forms (`--outer-pseudo-gradient`):
//!   - own (the default): each rank steps on its own pseudo-gradient `anchor - x` *before* the
//!     exchange and sends the stepped model; the neighbourhood's average of the stepped models
//!     is the next anchor. The mixing is doubly stochastic, so the replicas' mean moves by the
//!     mean of the ranks' outer steps, which is DiLoCo's step on the mean pseudo-gradient (the
//!     velocities are linear in it); the pull towards the neighbours is a plain average, which
//!     momentum never amplifies. Without inner steps (`--consensus-only`) it is plain gossip.
//!   - neighbourhood: the step on `anchor - avg_N(x)` after the exchange, NoLoCo's group outer
//!     gradient and its pull term with equal weights in one average (the neighbours send one
//!     model; a separate weight for the pull would need their outer weights too, twice the
//!     bytes). It feeds the replicas' differences into the momentum, and it diverged: 64 ranks
//!     of MLR on one-peer exponential at k 4 (`benches/emulated-cluster.sh scale`) grew the
//!     consensus distance from 1.6 to 92,138 in 112 rounds, the ranks' own models falling to
//!     4-11 %; a simulation of consensus with weak inner steps diverged the same way at 32 and
//!     64 ranks, on one-peer exponential and hypercube pairs alike. It is the better form on 8
//!     ranks with label-skewed shards (88.39 % against own's 85.95 % at k 1, benches/low-comm.md),
//!     where the over-relaxed pull (1.33 times the distance to the average) mixes faster.
//!   - Both send one model a round (docs/low-communication.md).
//! - gaia's groups take the step on the exchange's average, as allreduce does.
//!
//! The step, per coordinate, with `d = anchor - x` (`anchor`: this rank's model after the last
//! sync, where this round's inner steps started; `x`: the average after the exchange, or this
//! rank's own model before it), step size `lr` and momentum `mu`:
//! - sgd: `x = anchor - lr d`;
//! - nesterov (torch's `SGD(nesterov=True)`, as DiLoCo runs it): `v = mu v + d`,
//!   `x = anchor - lr (d + mu v)`.
//!
//! Both are computed as `x + (1 - lr) d - lr mu v`, which is `x` bit for bit when `lr` is 1 and
//! there is no momentum: `--outer-optimizer sgd --outer-lr 1` is the mode without an outer
//! optimizer, exactly (tests/outer.rs checks the saved models). The outer state (the anchor and
//! the velocity) is each rank's own; it is saved with the mode's state in a checkpoint, so a
//! resume continues bit-identically, and its options enter the run identity.

use std::time::Duration;

use super::groups::{OuterKind, OuterOptions, OuterPseudoGradient};
use super::{CommStats, HistoryDelta, ModeMetric, ModeState, SyncMode};

/// A mode that averages replicas, with an outer step after each of its syncs.
pub struct Outer {
    inner: Box<dyn SyncMode>,
    kind: OuterKind,
    lr: f32,
    momentum: f32,
    /// This rank's model after the last sync (the start of the round's inner steps).
    anchor: Vec<f32>,
    /// Nesterov's velocity (empty for sgd).
    velocity: Vec<f32>,
    /// The step is this rank's own, before the exchange (gossip), not on its average.
    before_exchange: bool,
}

/// The names of the outer state in a checkpoint's mode state.
const ANCHOR: &str = "outer_anchor";
const VELOCITY: &str = "outer_velocity";

impl Outer {
    /// Wraps `inner` (built from `init`, the model every rank starts from) when `opts` asks for
    /// an outer step; returns it as it is otherwise. `info` (the start line's record of the mode)
    /// gains the outer optimizer's settings. The step is taken before the exchange when
    /// `--outer-pseudo-gradient own` (asap's default), on the exchange's average otherwise.
    pub fn wrap(inner: Box<dyn SyncMode>, info: &mut serde_json::Value, opts: &OuterOptions, init: &[f32]) -> Box<dyn SyncMode> {
        if opts.outer_optimizer == OuterKind::None {
            return inner;
        }
        let nesterov = opts.outer_optimizer == OuterKind::Nesterov;
        let before_exchange = opts.outer_pseudo_gradient == Some(OuterPseudoGradient::Own);
        let record = serde_json::json!({
            "optimizer": opts.outer_optimizer,
            "lr": opts.outer_lr,
            "momentum": if nesterov { opts.outer_momentum } else { 0.0 },
            "step": if before_exchange { "own pseudo-gradient, before the exchange" } else { "on the exchange's average" },
        });
        if !info.is_object() {
            *info = serde_json::json!({});
        }
        info["outer"] = record;
        Box::new(Outer {
            inner,
            kind: opts.outer_optimizer,
            lr: opts.outer_lr as f32,
            momentum: if nesterov { opts.outer_momentum as f32 } else { 0.0 },
            anchor: init.to_vec(),
            velocity: if nesterov { vec![0.0; init.len()] } else { Vec::new() },
            before_exchange,
        })
    }

    /// The outer step on `params` (the average, or this rank's model before the exchange), from
    /// the anchor; the anchor itself is set by the caller.
    fn step(&mut self, params: &mut [f32]) {
        let (lr, mu) = (self.lr, self.momentum);
        if lr == 1.0 && mu == 0.0 {
            // `params` as it is (the arithmetic below would turn -0 into +0).
            return;
        }
        if self.kind == OuterKind::Nesterov {
            for ((x, a), v) in params.iter_mut().zip(&self.anchor).zip(&mut self.velocity) {
                let d = *a - *x;
                *v = mu * *v + d;
                *x += (1.0 - lr) * d - lr * mu * *v;
            }
        } else {
            for (x, a) in params.iter_mut().zip(&self.anchor) {
                let d = *a - *x;
                *x += (1.0 - lr) * d;
            }
        }
    }
}

impl SyncMode for Outer {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn lockstep(&self) -> bool {
        self.inner.lockstep()
    }

    fn round_lead(&self) -> u64 {
        self.inner.round_lead()
    }

    fn before_step(&mut self, params: &mut [f32], clock: u64) -> anyhow::Result<()> {
        self.inner.before_step(params, clock)
    }

    fn idle(&mut self, d: Duration) -> anyhow::Result<()> {
        self.inner.idle(d)
    }

    fn history(&mut self, h: HistoryDelta<'_>) -> anyhow::Result<()> {
        self.inner.history(h)
    }

    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        anyhow::ensure!(
            params.len() == self.anchor.len(),
            "the outer optimizer got {} parameters but was set up for {}",
            params.len(),
            self.anchor.len()
        );
        if self.before_exchange {
            self.step(params);
            self.inner.sync(params, round)?;
        } else {
            self.inner.sync(params, round)?;
            self.step(params);
        }
        self.anchor.copy_from_slice(params);
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        self.inner.finish(params)
    }

    fn mark_evaluation(&mut self, round: u64) {
        self.inner.mark_evaluation(round)
    }

    fn evaluated_model(&mut self, round: u64) -> anyhow::Result<Option<Vec<f32>>> {
        self.inner.evaluated_model(round)
    }

    fn quiesce(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        self.inner.quiesce(params, round)
    }

    fn save_state(&self) -> ModeState {
        let mut state = self.inner.save_state();
        state.push((ANCHOR.to_owned(), self.anchor.iter().map(|&x| x as f64).collect()));
        if self.kind == OuterKind::Nesterov {
            state.push((VELOCITY.to_owned(), self.velocity.iter().map(|&x| x as f64).collect()));
        }
        state
    }

    fn averaged_on_resize(&self, name: &str) -> bool {
        name == ANCHOR || name == VELOCITY || self.inner.averaged_on_resize(name)
    }

    fn laid_on_resize(&self, name: &str) -> bool {
        self.inner.laid_on_resize(name)
    }

    fn repartition(&self, state: ModeState, laid: &ModeState, ranks_before: usize) -> anyhow::Result<ModeState> {
        self.inner.repartition(state, laid, ranks_before)
    }

    fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        let (outer, inner): (ModeState, ModeState) = state.into_iter().partition(|(name, _)| name == ANCHOR || name == VELOCITY);
        let n = self.anchor.len();
        let mut found = (false, self.kind != OuterKind::Nesterov);
        for (name, values) in outer {
            anyhow::ensure!(values.len() == n, "the checkpoint's {name} holds {} values, the model {n}", values.len());
            let into = if name == ANCHOR {
                found.0 = true;
                &mut self.anchor
            } else {
                anyhow::ensure!(
                    self.kind == OuterKind::Nesterov,
                    "the checkpoint holds an outer velocity, which --outer-optimizer sgd does not use"
                );
                found.1 = true;
                &mut self.velocity
            };
            into.iter_mut().zip(values).for_each(|(x, v)| *x = v as f32);
        }
        anyhow::ensure!(found == (true, true), "the checkpoint lacks the outer optimizer's state ({ANCHOR}, {VELOCITY} for nesterov)");
        self.inner.restore_state(inner)
    }

    fn stats(&self) -> &CommStats {
        self.inner.stats()
    }

    fn send_log(&self) -> Vec<(f64, u64)> {
        self.inner.send_log()
    }

    fn receive_log(&self) -> Vec<(f64, u64)> {
        self.inner.receive_log()
    }

    fn metrics(&self) -> Vec<ModeMetric> {
        self.inner.metrics()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mode whose sync replaces the model by a fixed "average".
    struct FixedAverage(Vec<f32>, CommStats);

    impl SyncMode for FixedAverage {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn lockstep(&self) -> bool {
            true
        }
        fn sync(&mut self, params: &mut [f32], _: u64) -> anyhow::Result<()> {
            params.copy_from_slice(&self.0);
            Ok(())
        }
        fn finish(&mut self, _: &mut [f32]) -> anyhow::Result<()> {
            Ok(())
        }
        fn stats(&self) -> &CommStats {
            &self.1
        }
    }

    fn outer(kind: OuterKind, lr: f64, momentum: f64, init: &[f32], average: &[f32]) -> Box<dyn SyncMode> {
        let opts = OuterOptions { outer_optimizer: kind, outer_lr: lr, outer_momentum: momentum, outer_pseudo_gradient: None };
        Outer::wrap(Box::new(FixedAverage(average.to_vec(), CommStats::default())), &mut serde_json::Value::Null, &opts, init)
    }

    #[test]
    fn sgd_with_step_one_is_the_average_bit_for_bit() {
        let (init, avg) = ([0.1f32, -3.7, 1e-8, 12345.678], [0.3f32, 2.2, -1e-9, -0.0]);
        let mut m = outer(OuterKind::Sgd, 1.0, 0.9, &init, &avg);
        let mut x = [9.0f32; 4];
        m.sync(&mut x, 1).unwrap();
        assert_eq!(x.map(f32::to_bits), avg.map(f32::to_bits));
    }

    /// Nesterov against its textbook form in f64 (torch's SGD with nesterov=True on the
    /// pseudo-gradient), over three rounds with a moving average.
    #[test]
    fn nesterov_matches_the_textbook_update() {
        let (lr, mu) = (0.7f64, 0.9f64);
        let init = [1.0f32, -2.0];
        let averages = [[0.5f32, -1.0], [0.25, -0.5], [0.2, -0.1]];
        let (mut x_ref, mut v_ref) = ([1.0f64, -2.0], [0.0f64; 2]);
        let mut x = init;
        let mut m = outer(OuterKind::Nesterov, lr, mu, &init, &averages[0]);
        for (round, avg) in averages.iter().enumerate() {
            if round > 0 {
                // A new average for this round: rebuild the fixed mode's answer, keep the state.
                let state = m.save_state();
                m = outer(OuterKind::Nesterov, lr, mu, &init, avg);
                m.restore_state(state).unwrap();
            }
            m.sync(&mut x, round as u64 + 1).unwrap();
            for i in 0..2 {
                let d = x_ref[i] - avg[i] as f64;
                v_ref[i] = mu * v_ref[i] + d;
                x_ref[i] -= lr * (d + mu * v_ref[i]);
                assert!((x[i] as f64 - x_ref[i]).abs() < 1e-5, "round {round}, {i}: {} vs {}", x[i], x_ref[i]);
            }
        }
    }

    /// A gossip round with one peer whose model is fixed: the exchange returns (x + peer) / 2.
    struct PairAverage(Vec<f32>, CommStats);

    impl SyncMode for PairAverage {
        fn name(&self) -> &'static str {
            "pair"
        }
        fn lockstep(&self) -> bool {
            true
        }
        fn sync(&mut self, params: &mut [f32], _: u64) -> anyhow::Result<()> {
            params.iter_mut().zip(&self.0).for_each(|(x, p)| *x = (*x + p) / 2.0);
            Ok(())
        }
        fn finish(&mut self, _: &mut [f32]) -> anyhow::Result<()> {
            Ok(())
        }
        fn stats(&self) -> &CommStats {
            &self.1
        }
    }

    /// Before the exchange (gossip): the rank's own Nesterov step from the anchor, then the
    /// average of the stepped model with the peer's, against the textbook form in f64 over three
    /// rounds of inner progress. And a round without inner steps (the model still at the
    /// anchor) is the plain average, bit for bit: the outer step never acts on the differences
    /// between replicas.
    #[test]
    fn before_the_exchange_the_step_is_the_ranks_own_and_without_inner_steps_it_is_plain_gossip() {
        let (lr, mu) = (0.7f64, 0.9f64);
        let opts = OuterOptions {
            outer_optimizer: OuterKind::Nesterov,
            outer_lr: lr,
            outer_momentum: mu,
            outer_pseudo_gradient: Some(OuterPseudoGradient::Own),
        };
        let (init, peer) = ([1.0f32, -2.0], [0.5f32, 4.0]);
        let mut m = Outer::wrap(Box::new(PairAverage(peer.to_vec(), CommStats::default())), &mut serde_json::Value::Null, &opts, &init);
        let (mut a_ref, mut v_ref) = ([1.0f64, -2.0], [0.0f64; 2]);
        let mut x = init;
        for (round, progress) in [[-0.1f32, 0.3], [0.2, 0.2], [0.05, -0.4]].iter().enumerate() {
            x.iter_mut().zip(progress).for_each(|(x, p)| *x += p); // the inner steps
            let inner = x.map(f64::from);
            m.sync(&mut x, round as u64 + 1).unwrap();
            for i in 0..2 {
                let d = a_ref[i] - inner[i];
                v_ref[i] = mu * v_ref[i] + d;
                a_ref[i] = (a_ref[i] - lr * (d + mu * v_ref[i]) + peer[i] as f64) / 2.0;
                assert!((x[i] as f64 - a_ref[i]).abs() < 1e-5, "round {round}, {i}: {} vs {}", x[i], a_ref[i]);
            }
        }
        let mut still = Outer::wrap(Box::new(PairAverage(peer.to_vec(), CommStats::default())), &mut serde_json::Value::Null, &opts, &init);
        let mut x = init;
        still.sync(&mut x, 1).unwrap();
        let plain = [0, 1].map(|i| (init[i] + peer[i]) / 2.0);
        assert_eq!(x.map(f32::to_bits), plain.map(f32::to_bits));
    }

    #[test]
    fn a_restored_state_continues_bit_identically_and_a_wrong_one_is_refused() {
        let (init, avg) = ([1.0f32, 2.0, 3.0], [0.0f32, 1.0, 1.5]);
        let mut a = outer(OuterKind::Nesterov, 0.5, 0.8, &init, &avg);
        let mut xa = init;
        a.sync(&mut xa, 1).unwrap();
        let mut b = outer(OuterKind::Nesterov, 0.5, 0.8, &init, &avg);
        b.restore_state(a.save_state()).unwrap();
        let mut xb = xa;
        a.sync(&mut xa, 2).unwrap();
        b.sync(&mut xb, 2).unwrap();
        assert_eq!(xa.map(f32::to_bits), xb.map(f32::to_bits));
        let mut c = outer(OuterKind::Sgd, 0.5, 0.8, &init, &avg);
        let e = c.restore_state(a.save_state()).unwrap_err().to_string();
        assert!(e.contains("velocity"), "{e}");
        let mut d = outer(OuterKind::Nesterov, 0.5, 0.8, &init, &avg);
        let e = d.restore_state(Vec::new()).unwrap_err().to_string();
        assert!(e.contains("lacks"), "{e}");
    }
}
