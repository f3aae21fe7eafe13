//! BSP summing of updates: every round each rank's change since the last round (`params -
//! base`) is summed over ranks with `MPI_Allreduce` and added to the common model. This is
//! `--sync allreduce` for models whose replicas hold counts (`--model lda`): averaging replicas
//! of counts would divide every rank's tokens by N, summing deltas counts each exactly once.
//! Deltas of integer counts stay integers, and f32 adds them exactly while every partial sum is
//! below 2^24 (the LDA driver checks the corpus against that bound).

use std::time::Instant;

use mpi::topology::{Communicator, SimpleCommunicator};

use super::{ring_allreduce_bytes, CommStats, SyncContext, SyncMode};
use crate::comm::collectives;

/// Sums every rank's update each round.
pub struct DeltaSum {
    comm: SimpleCommunicator,
    /// `--allreduce-algorithm` resolved: sum round the program's own ring.
    ring_sum: bool,
    /// The common model after the last round.
    base: Vec<f32>,
    scratch: Vec<f32>,
    delta: Vec<f32>,
    stats: CommStats,
}

impl DeltaSum {
    /// Every rank starts from the same model `init`. Uses a private duplicate of the communicator.
    /// With `ring_sum`, the deltas are summed by [`collectives::ring_sum_f32`]: integer counts
    /// add exactly in any order, so the sum is MPI's, bit for bit.
    pub fn new(ctx: &SyncContext, init: &[f32], ring_sum: bool) -> Self {
        let comm = ctx.comm.duplicate();
        DeltaSum { comm, ring_sum, base: init.to_vec(), scratch: Vec::new(), delta: Vec::new(), stats: CommStats::default() }
    }

    fn exchange(&mut self, params: &mut [f32]) {
        let t = Instant::now();
        self.delta.clear();
        self.delta.extend(params.iter().zip(&self.base).map(|(p, b)| p - b));
        if self.ring_sum {
            collectives::ring_sum_f32(&self.comm, &mut self.delta, &mut self.scratch);
        } else {
            collectives::sum_f32(&self.comm, &mut self.delta, &mut self.scratch);
        }
        for ((p, b), d) in params.iter_mut().zip(self.base.iter_mut()).zip(&self.delta) {
            *b += d;
            *p = *b;
        }
        self.stats.comm_seconds += t.elapsed().as_secs_f64();
    }
}

impl SyncMode for DeltaSum {
    fn name(&self) -> &'static str {
        "allreduce"
    }

    fn lockstep(&self) -> bool {
        true
    }

    fn sync(&mut self, params: &mut [f32], _round: u64) -> anyhow::Result<()> {
        self.exchange(params);
        let bytes = ring_allreduce_bytes(self.comm.size() as usize, params.len());
        self.stats.bytes_sent += bytes;
        self.stats.bytes_received += bytes;
        self.stats.rounds += 1;
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        // Changes after the last round (none when every clock ended in a round) still count.
        let t = Instant::now();
        self.exchange(params);
        self.stats.final_bytes += ring_allreduce_bytes(self.comm.size() as usize, params.len());
        self.stats.final_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.stats
    }
}
