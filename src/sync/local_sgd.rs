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
    /// How far each replica moves towards the average at an averaging round (1: all the way).
    #[arg(long, value_name = "W", default_value_t = 1.0, value_parser = average_weight)]
    pub average_weight: f32,
}

/// `--average-weight`: a finite number in (0, 1].
fn average_weight(s: &str) -> Result<f32, String> {
    let w = crate::values::finite_f32(s)?;
    if w > 0.0 && w <= 1.0 {
        Ok(w)
    } else {
        Err(format!("must be in (0, 1], got {s}"))
    }
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
            let (k, weight) = (run.opts.local_sgd.local_steps, run.opts.local_sgd.average_weight);
            let mode = LocalSgd { comm: ctx.comm.duplicate(), every: k as u64, weight, scratch: Vec::new(), stats: CommStats::default() };
            Ok((Box::new(mode), serde_json::json!({"local_steps": k, "average_weight": weight})))
        },
    )
};

/// Replicas averaged every `every` rounds.
pub struct LocalSgd {
    comm: SimpleCommunicator,
    every: u64,
    weight: f32,
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
            let mut avg = params.to_vec();
            collectives::sum_f32(&self.comm, &mut avg, &mut self.scratch);
            let inv = 1.0 / self.comm.size() as f32;
            params.iter_mut().zip(&avg).for_each(|(w, a)| *w += self.weight * (a * inv - *w));
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
