//! `--sync allreduce`: BSP model averaging with `MPI_Allreduce` (what Horovod-style data
//! parallelism does with models instead of gradients). The baseline every other mode is measured
//! against.

use std::time::Instant;

use mpi::collective::CommunicatorCollectives;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::{CommStats, SyncMode};
use crate::comm::collectives;

/// Averages all replicas every round.
pub struct ModelAverage {
    comm: SimpleCommunicator,
    scratch: Vec<f32>,
    stats: CommStats,
}

impl ModelAverage {
    /// Uses a private duplicate of `comm` so its traffic never mixes with other collectives.
    pub fn new(comm: &SimpleCommunicator) -> Self {
        ModelAverage { comm: comm.duplicate(), scratch: Vec::new(), stats: CommStats::default() }
    }

    fn average(&mut self, params: &mut [f32]) {
        // A barrier first separates waiting for the slowest rank from moving data, so the
        // metrics can tell a straggler problem from a bandwidth problem.
        let t0 = Instant::now();
        self.comm.barrier();
        let t1 = Instant::now();
        collectives::sum_f32(&self.comm, params, &mut self.scratch);
        let inv = 1.0 / self.comm.size() as f32;
        params.iter_mut().for_each(|w| *w *= inv);
        self.stats.wait_seconds += (t1 - t0).as_secs_f64();
        self.stats.comm_seconds += t1.elapsed().as_secs_f64();
        // MPI does not tell us what it sent; a bandwidth-optimal (ring) allreduce moves
        // 2 (N-1)/N of the vector out of and into every rank, which we report.
        let n = self.comm.size() as f64;
        let bytes = (2.0 * (n - 1.0) / n * (params.len() * 4) as f64) as u64;
        self.stats.bytes_sent += bytes;
        self.stats.bytes_received += bytes;
    }
}

impl SyncMode for ModelAverage {
    fn name(&self) -> &'static str {
        "allreduce"
    }

    fn sync(&mut self, params: &mut [f32], _round: u64) -> anyhow::Result<()> {
        self.average(params);
        self.stats.rounds += 1;
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        // Steps after the last round (when the step count is not a multiple of --sync-every)
        // still have to reach the final model.
        self.average(params);
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.stats
    }
}
