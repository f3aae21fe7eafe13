//! `--sync allreduce`: BSP model averaging with `MPI_Allreduce` (what Horovod-style data
//! parallelism does with models instead of gradients). The baseline every other mode is measured
//! against.

use std::time::Instant;

use mpi::topology::{Communicator, SimpleCommunicator};

use super::{average_replicas, ring_allreduce_bytes, CommStats, SyncContext, SyncMode};
use crate::comm::collectives;
use crate::comm::pace::Pacer;

/// Averages all replicas every round.
pub struct ModelAverage {
    comm: SimpleCommunicator,
    scratch: Vec<f32>,
    stats: CommStats,
    /// `--emulate-bandwidth`: the link each round's bytes must go through.
    pacer: Option<Pacer>,
}

impl ModelAverage {
    /// Uses a private duplicate of the communicator so its traffic never mixes with other
    /// collectives.
    pub fn new(ctx: &SyncContext) -> Self {
        ModelAverage { comm: ctx.comm.duplicate(), scratch: Vec::new(), stats: CommStats::default(), pacer: ctx.pacer(None) }
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
        if let Some(p) = &mut self.pacer {
            // Emulation: the reduction is done, but a rank returns only when its link would have
            // carried its share, plus the latency of Rabenseifner's algorithm (the one whose
            // volume we report): 2 log2(N) steps, reduce-scatter then allgather.
            let t = Instant::now();
            p.send_blocking(bytes);
            let steps = 2 * (self.comm.size() as u32).next_power_of_two().trailing_zeros();
            std::thread::sleep(p.latency() * steps);
            self.stats.comm_seconds += t.elapsed().as_secs_f64();
        }
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

    fn send_log(&self) -> Vec<(f64, u64)> {
        self.pacer.as_ref().map_or(Vec::new(), |p| p.log().to_vec())
    }
}
