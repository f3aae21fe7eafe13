//! Sync modes: how ranks exchange what they learned. One file per mode, all behind [`SyncMode`].
//! A mode sees the model only as a flat `f32` parameter slice (plus its row layout).

pub mod asap;

/// Communication counters a mode keeps; the training loop reads them for metrics.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CommStats {
    /// Bytes this rank sent (payload + protocol) for training.
    pub bytes_sent: u64,
    /// Bytes this rank received for training.
    pub bytes_received: u64,
    /// Seconds spent moving data (puts, reductions).
    pub comm_seconds: f64,
    /// Seconds spent waiting for other ranks (notifications, barriers, clocks).
    pub wait_seconds: f64,
    /// Number of sync rounds done.
    pub rounds: u64,
}

/// The interface every sync mode implements.
pub trait SyncMode {
    /// Short name for logs and metrics (e.g. "allreduce").
    fn name(&self) -> &'static str;
    /// Exchange after a block of local steps. `round` counts from 1. On return `params` holds the
    /// rank's new model.
    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()>;
    /// Called once after training; leaves every rank's `params` as the final model the mode
    /// defines (e.g. the average of all replicas).
    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()>;
    /// Counters so far.
    fn stats(&self) -> &CommStats;
    /// Mode-specific metrics for the JSON lines (consistency histogram, staleness ...).
    fn extra_metrics(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}

pub mod allreduce;
pub mod independent;
