//! The one interface every `--sync asap` variant implements (see the table in `asap.rs`): what a
//! variant does each round and at the ends of a run over the shared [`Neighbourhood`], holding
//! only its own state. In a file of its own so that the variants and the mode that picks them
//! import it from here, and no variant imports the mode's file.

use super::neighbourhood::Neighbourhood;
use crate::sync::{average_replicas, ModeMetric, ModeState};

/// One gossip variant over the shared [`Neighbourhood`]: what it does each round and at the ends
/// of a run, with only its own state. [`super::StochasticReduce`] calls it and keeps the byte and round
/// counts, so a variant never counts them itself (apart from what [`Gossip::drain`] receives).
pub(in crate::sync) trait Gossip {
    /// One round: send this rank's model, take in-neighbours' models, reduce into `params`.
    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()>;

    /// Whether every round makes every rank wait for every other (see [`crate::sync::SyncMode::lockstep`]).
    fn lockstep(&self) -> bool {
        false
    }

    /// Rounds a rank may run ahead of what its receivers have read (see [`crate::sync::SyncMode::round_lead`]).
    fn round_lead(&self) -> u64 {
        0
    }

    /// At the end, before anything is counted: a check that sends outside the byte counts (the
    /// budgeted edges' mirror check).
    fn verify(&mut self, _net: &mut Neighbourhood) -> anyhow::Result<()> {
        Ok(())
    }

    /// Completes a round left open between syncs (`--overlap`), at the end or at a cut.
    fn settle(&mut self, _net: &mut Neighbourhood, _params: &mut [f32]) -> anyhow::Result<()> {
        Ok(())
    }

    /// A consistent cut before a checkpoint (see [`crate::sync::SyncMode::quiesce`]).
    fn quiesce(&mut self, net: &mut Neighbourhood, params: &mut [f32]) -> anyhow::Result<()> {
        self.settle(net, params)
    }

    /// Whether a cut must wait for the two-sided messages the emulated link still holds (a
    /// receiver may wait for them through the collective that follows); not for a variant whose
    /// receivers never wait longer than a deadline.
    fn cut_releases_held(&self) -> bool {
        true
    }

    /// At the end, before the window's last flush and barrier: consumes what the variant's
    /// protocol still owes (NOTIFY-ACK's last ACKs; the deadline's messages on emulated links).
    fn drain(&mut self, _net: &mut Neighbourhood) -> anyhow::Result<()> {
        Ok(())
    }

    /// The final model, every rank the same: the average of the replicas unless the variant
    /// defines it otherwise.
    fn final_model(&mut self, net: &mut Neighbourhood, params: &mut [f32]) -> anyhow::Result<()> {
        average_replicas(&net.comm, params, &mut net.stats);
        Ok(())
    }

    /// The variant's state for a checkpoint (see [`crate::sync::SyncMode::save_state`]).
    fn save_state(&self) -> ModeState {
        Vec::new()
    }

    /// Restores what [`Gossip::save_state`] wrote for a model of `n_params` values.
    fn restore_state(&mut self, state: ModeState, _n_params: usize) -> anyhow::Result<()> {
        anyhow::ensure!(state.is_empty(), "the checkpoint holds per-edge state of a budgeted asap run: resume with its --bandwidth-mbps");
        Ok(())
    }

    /// Appends the variant's own metrics to the ones every variant reports.
    fn metrics(&self, _out: &mut Vec<ModeMetric>) {}

    /// The paced sends of this rank (see [`crate::sync::SyncMode::send_log`]).
    fn send_log(&self, net: &Neighbourhood) -> Vec<(f64, u64)> {
        // Over `--transport p2p` the postbox paces the sends, not the window's mailbox.
        match &net.p2p {
            Some(p) => p.send_log(),
            None => net.mail.pacer().map_or(Vec::new(), |p| p.log().to_vec()),
        }
    }
}
