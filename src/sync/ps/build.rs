//! Building the parameter-server engine for a mode declaration (`--sync ssp`, `--sync bosen`):
//! the engine with its settings, and the start line's information about it.

use mpi::topology::Communicator;

use super::client::StaleSynchronous;
use super::server::ApplyRule;
use super::settings::PsSettings;
use super::shards::shard_ranges;
use crate::sync::{Built, SyncContext, SyncMode};

/// The engine under `settings`, with the information of the start line (staleness, apply rule,
/// parameters per shard).
pub fn build(ctx: &SyncContext, settings: &PsSettings, init: &[f32]) -> Built {
    let shards = shard_ranges(&ctx.layout, ctx.comm.size() as usize);
    let info = serde_json::json!({"staleness": settings.staleness, "apply": settings.apply,
                                  "shard_params": shards.iter().map(|r| r.len()).collect::<Vec<_>>()});
    Ok((Box::new(StaleSynchronous::new(ctx, settings, init)?), info))
}

/// The engine for `--model lda`'s count deltas, which the servers must add as they are
/// (`--apply plain`), exactly; `given`: the `--apply` given.
pub fn build_counts(ctx: &SyncContext, settings: PsSettings, given: Option<ApplyRule>, init: &[f32]) -> anyhow::Result<Box<dyn SyncMode>> {
    let settings = settings.for_counts(given)?;
    Ok(Box::new(StaleSynchronous::new(ctx, &settings, init)?))
}
