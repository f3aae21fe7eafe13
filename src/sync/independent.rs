//! `--sync none`: independent replicas that never talk while training; the final model is the
//! one-shot average of all replicas. With one rank this is plain SGD.

use mpi::topology::{Communicator, SimpleCommunicator};

use super::{CommStats, SyncMode};
use crate::comm::collectives;

/// Replicas that train alone and are averaged once at the end.
pub struct Independent {
    comm: SimpleCommunicator,
    stats: CommStats,
}

impl Independent {
    /// Keeps a private duplicate of `comm` for the final average.
    pub fn new(comm: &SimpleCommunicator) -> Self {
        Independent { comm: comm.duplicate(), stats: CommStats::default() }
    }
}

impl SyncMode for Independent {
    fn name(&self) -> &'static str {
        "none"
    }

    fn sync(&mut self, _params: &mut [f32], _round: u64) -> anyhow::Result<()> {
        self.stats.rounds += 1;
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        let mut scratch = Vec::new();
        collectives::sum_f32(&self.comm, params, &mut scratch);
        let inv = 1.0 / self.comm.size() as f32;
        params.iter_mut().for_each(|w| *w *= inv);
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.stats
    }
}
