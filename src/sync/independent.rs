//! `--sync none`: independent replicas that never talk while training; the final model is the
//! one-shot average of all replicas. With one rank this is plain SGD.

use mpi::topology::{Communicator, SimpleCommunicator};

use super::{average_replicas, CommStats, SyncContext, SyncMode};

/// Replicas that train alone and are averaged once at the end.
pub struct Independent {
    comm: SimpleCommunicator,
    stats: CommStats,
}

impl Independent {
    /// Keeps a private duplicate of the communicator for the final average.
    pub fn new(ctx: &SyncContext) -> Self {
        Independent { comm: ctx.comm.duplicate(), stats: CommStats::default() }
    }
}

impl SyncMode for Independent {
    fn name(&self) -> &'static str {
        "none"
    }

    fn lockstep(&self) -> bool {
        false
    }

    fn sync(&mut self, _params: &mut [f32], _round: u64) -> anyhow::Result<()> {
        self.stats.rounds += 1;
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        average_replicas(&self.comm, params, &mut self.stats);
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.stats
    }
}

/// `--sync none`'s declaration (see [`super::ModeSpec`]).
pub const MODE: super::ModeSpec = super::ModeSpec {
    elastic: true,
    survives_rank_loss: true,
    ..super::ModeSpec::new(
        "none",
        "No exchange: independent replicas, averaged once at the end (with one rank, plain SGD)",
        |ctx, _, _| Ok((Box::new(Independent::new(ctx)), serde_json::Value::Null)),
    )
};
