//! The send policy the parameter-server engine is given (Bosen §3.3): when and how much a rank
//! sends beyond SSP's mandatory end-of-clock pushes and answers. Two strategies:
//! - plain SSP (`--sync ssp`): nothing between clocks, lazy reads (a worker waits only for the
//!   shards whose rows are too stale), full-precision pushes, whole answers;
//! - Bösen's managed communication (`--sync bosen`, [`super::managed`]): spare budget spent
//!   between steps on the most significant rows (client pushes and server pushes), optional fp16
//!   pushes, messages of at most `--queue-size` rows, and clients that wait for every answer.
//!
//! The engine (client.rs) calls the policy at its hook points and never asks which one
//! it has; the mode's name comes from the policy.

use super::managed::Managed;
use super::server::ShardServer;
use super::settings::PolicySettings;
use crate::comm::postbox::Postbox;
use crate::sync::ModeMetric;

/// How a rank of the engine sends: plain SSP, or Bösen's managed communication.
pub enum SendPolicy {
    Plain,
    Managed(Box<Managed>),
}

impl SendPolicy {
    /// The policy `settings` ask for, on `rank` of `n` ranks with `rows` model rows (`seed`: the
    /// run's, for the random priority).
    pub fn new(settings: &PolicySettings, seed: u64, rank: usize, n: usize, rows: usize) -> Self {
        match settings {
            PolicySettings::Plain => SendPolicy::Plain,
            PolicySettings::Managed(m) => SendPolicy::Managed(Box::new(Managed::new(m, seed, rank, n, rows))),
        }
    }

    /// The `--sync` mode this policy makes of the engine.
    pub fn mode_name(&self) -> &'static str {
        match self {
            SendPolicy::Plain => "ssp",
            SendPolicy::Managed(_) => "bosen",
        }
    }

    /// Sends between clocks (early pushes and server pushes): a clock's update may be partly
    /// sent before its end (the client's `base` is then part of its checkpoint state), the
    /// clients wait for every answer, and a consistent cut waits until every rank is quiet.
    pub fn sends_between_clocks(&self) -> bool {
        matches!(self, SendPolicy::Managed(_))
    }

    /// Updates go out as binary16 (`--compress fp16`).
    pub fn fp16(&self) -> bool {
        match self {
            SendPolicy::Plain => false,
            SendPolicy::Managed(m) => m.fp16,
        }
    }

    /// Most rows in one message (`--queue-size`); None: no cap.
    pub fn message_rows(&self) -> Option<usize> {
        match self {
            SendPolicy::Plain => None,
            SendPolicy::Managed(m) => Some(m.queue_size),
        }
    }

    /// This rank's shard `sv` keeps what the policy needs.
    pub(crate) fn prepare_shard(&self, sv: &mut ShardServer) {
        if let SendPolicy::Managed(m) = self {
            m.prepare_shard(sv);
        }
    }

    /// A local step begins (the horizon of the early sends).
    pub fn begin_step(&mut self) {
        if let SendPolicy::Managed(m) = self {
            m.begin_step();
        }
    }

    /// Early sends stop (`true`: the ranks are brought to a consistent cut) or may go on.
    pub fn set_quiet(&mut self, quiet: bool) {
        if let SendPolicy::Managed(m) = self {
            m.quiet = quiet;
        }
    }

    /// The server side's sends between clocks, from shard `sv` (served by `rank` from global row
    /// `row0`); `sending`: this rank has not been told to stop sending.
    pub(crate) fn serve_fresh_rows(
        &mut self,
        sv: &mut ShardServer,
        post: &mut Postbox,
        sending: bool,
        rank: usize,
        row0: usize,
    ) -> anyhow::Result<()> {
        match self {
            SendPolicy::Plain => Ok(()),
            SendPolicy::Managed(m) => m.serve_fresh_rows(sv, post, sending, rank, row0),
        }
    }

    /// Bytes a client may push early now; None: no early push.
    pub fn early_room(&mut self, post: &Postbox, sending: bool) -> Option<f64> {
        match self {
            SendPolicy::Plain => None,
            SendPolicy::Managed(m) => m.early_room(post, sending),
        }
    }

    /// The rows of an early push that `room` bytes carry, among `cands` (see
    /// [`Managed::choose_early`]); none under plain SSP.
    pub fn choose_early(&mut self, room: f64, cands: &[(u32, f32, f32)], values: usize, rows: usize) -> Vec<u32> {
        match self {
            SendPolicy::Plain => Vec::new(),
            SendPolicy::Managed(m) => m.choose_early(room, cands, values, rows),
        }
    }

    /// A push of global row `row` (`values` values) left this client.
    pub fn note_pushed_row(&mut self, row: usize, values: usize) {
        if let SendPolicy::Managed(m) = self {
            m.note_pushed_row(row, values);
        }
    }

    /// A server's early message of fresh `rows` (global) was taken back.
    pub fn note_serve_withdrawn(&mut self, rows: &[usize]) {
        if let SendPolicy::Managed(m) = self {
            m.note_serve_withdrawn(rows);
        }
    }

    /// An early push message of `bytes` with `rows` (global row, values) was taken back.
    pub fn note_withdrawn(&mut self, bytes: usize, rows: &[(usize, usize)]) {
        if let SendPolicy::Managed(m) = self {
            m.note_withdrawn(bytes, rows);
        }
    }

    /// A push message of `bytes` left this client.
    pub fn note_push_bytes(&mut self, bytes: usize) {
        if let SendPolicy::Managed(m) = self {
            m.push_bytes += bytes as u64;
        }
    }

    /// The policy's metrics; `ada`: this rank's shard's AdaRevision snapshots (peak, misses).
    pub fn metrics(&self, out: &mut Vec<ModeMetric>, ada: Option<(usize, u64)>) {
        if let SendPolicy::Managed(m) = self {
            m.metrics(out, ada);
        }
    }
}
