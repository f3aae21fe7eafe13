//! `--sync local-sgd`: local SGD (Stich 2019; "periodic averaging"): every rank takes
//! `--local-steps` rounds of local steps, then all replicas are averaged with `MPI_Allreduce`.
//! An example of a mode added as one file plus one registry line (docs/sync-modes.md).

use std::time::Instant;

use mpi::topology::{Communicator, SimpleCommunicator};

use super::{average_replicas, ring_allreduce_bytes, CommStats, SyncMode};
use crate::comm::collectives;

/// Options of `--sync local-sgd`.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "Local SGD (--sync local-sgd)")]
pub struct LocalSgdOptions {
    /// Rounds of local steps between two averages of all replicas (1: --sync allreduce).
    #[arg(long, value_name = "K", default_value_t = 4, value_parser = crate::values::at_least_one)]
    pub local_steps: usize,
}

impl Default for LocalSgdOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// `--sync local-sgd`'s declaration.
pub const MODE: super::ModeSpec = super::ModeSpec {
    uses: &[(&[], &["LocalSgdOptions"])],
    ..super::ModeSpec::new(
        "local-sgd",
        "Local SGD: average all replicas with MPI_Allreduce every --local-steps rounds",
        |ctx, run, _| {
            let k = run.opts.local_sgd.local_steps;
            Ok((Box::new(LocalSgd { comm: ctx.comm.duplicate(), every: k as u64, scratch: Vec::new(), stats: CommStats::default() }), serde_json::json!({"local_steps": k})))
        },
    )
};

/// Replicas averaged every `every` rounds.
pub struct LocalSgd {
    comm: SimpleCommunicator,
    every: u64,
    scratch: Vec<f32>,
    stats: CommStats,
}

impl SyncMode for LocalSgd {
    fn name(&self) -> &'static str {
        "local-sgd"
    }

    fn lockstep(&self) -> bool {
        self.every == 1
    }

    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        self.stats.rounds += 1;
        if round % self.every == 0 {
            let t = Instant::now();
            collectives::sum_f32(&self.comm, params, &mut self.scratch);
            let inv = 1.0 / self.comm.size() as f32;
            params.iter_mut().for_each(|w| *w *= inv);
            let bytes = ring_allreduce_bytes(self.comm.size() as usize, params.len());
            self.stats.bytes_sent += bytes;
            self.stats.bytes_received += bytes;
            self.stats.comm_seconds += t.elapsed().as_secs_f64();
        }
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
