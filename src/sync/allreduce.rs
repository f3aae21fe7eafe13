//! `--sync allreduce`: BSP model averaging with `MPI_Allreduce` (what Horovod-style data
//! parallelism does with models instead of gradients). The baseline every other mode is measured
//! against.

use std::time::Instant;

use mpi::topology::{Communicator, SimpleCommunicator};

use super::{average_replicas, ring_allreduce_bytes, CommStats, SyncContext, SyncMode};
use crate::comm::collectives;

/// Averages all replicas every round.
pub struct ModelAverage {
    comm: SimpleCommunicator,
    scratch: Vec<f32>,
    stats: CommStats,
}

impl ModelAverage {
    /// Uses a private duplicate of the communicator so its traffic never mixes with other
    /// collectives.
    pub fn new(ctx: &SyncContext) -> Self {
        ModelAverage { comm: ctx.comm.duplicate(), scratch: Vec::new(), stats: CommStats::default() }
    }
}

impl SyncMode for ModelAverage {
    fn name(&self) -> &'static str {
        "allreduce"
    }

    fn lockstep(&self) -> bool {
        true
    }

    fn sync(&mut self, params: &mut [f32], _round: u64) -> anyhow::Result<()> {
        // No barrier to split waiting from transfer: it would cost a second synchronisation per
        // round that no user of allreduce pays, so waiting is inside comm_seconds here.
        let t = Instant::now();
        collectives::sum_f32(&self.comm, params, &mut self.scratch);
        let inv = 1.0 / self.comm.size() as f32;
        params.iter_mut().for_each(|w| *w *= inv);
        self.stats.comm_seconds += t.elapsed().as_secs_f64();
        // MPI does not tell us what it sent; a bandwidth-optimal (ring) allreduce moves
        // 2 (N-1)/N of the vector out of and into every rank, which we report.
        let bytes = ring_allreduce_bytes(self.comm.size() as usize, params.len());
        self.stats.bytes_sent += bytes;
        self.stats.bytes_received += bytes;
        self.stats.rounds += 1;
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        // Steps after the last round (when the step count is not a multiple of --sync-every)
        // still have to reach the final model.
        average_replicas(&self.comm, params, &mut self.stats);
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.stats
    }
}
