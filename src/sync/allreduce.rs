//! `--sync allreduce`: BSP model averaging with `MPI_Allreduce` (what Horovod-style data
//! parallelism does with models instead of gradients). The baseline every other mode is measured
//! against.
//!
//! With `--compress int8|topk:F` a sync averages each rank's change since the last sync instead
//! of its model, exchanged compressed with error feedback ([`super::codec::mean`]: an all-to-all
//! of encoded chunks, then an all-gather of each chunk's encoded mean): the model is the last
//! sync's minus the decoded mean change, the same bits on every rank, so the replicas still
//! agree. Its state (that model and both residuals) goes into checkpoints.

use std::time::{Duration, Instant};

use mpi::topology::{Communicator, SimpleCommunicator};

use super::groups::OUTER_USES;
use super::codec::mean::{Compression, CompressedMean};
use super::{average_replicas, ring_allreduce_bytes, CommStats, ModeState, SyncContext, SyncMode};
use crate::comm::collectives;
use crate::comm::pace::{Fabric, Pacer, TcpWindow};

/// Options of `--sync allreduce`.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "All-reduce (--sync allreduce)")]
pub struct AllreduceOptions {
    /// How each sync sums the models: mpi (MPI_Allreduce; MPI_Iallreduce, polled, under
    /// --wait-timeout), ring (the program's own ring of point-to-point messages: reduce-scatter,
    /// then all-gather; every rank moves 2 (N-1)/N of the model each way), or auto: the ring when
    /// the ranks span more than one host and either the model is at least 256 KiB or there are
    /// at most 3 ranks; mpi otherwise. Over TCP, Open MPI's allreduce of a 3.3 MB model used 46 %
    /// of a 100 Mbit/s link at 2 ranks, the ring 88 % (docs/sync-modes.md).
    #[arg(long, value_enum, default_value_t = AllreduceAlgorithm::Auto)]
    pub allreduce_algorithm: AllreduceAlgorithm,
}

impl Default for AllreduceOptions {
    fn default() -> Self {
        crate::values::option_defaults()
    }
}

/// `--allreduce-algorithm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AllreduceAlgorithm {
    /// The ring across hosts for models of at least 256 KiB or up to 3 ranks, MPI otherwise.
    Auto,
    /// MPI's own allreduce.
    Mpi,
    /// The program's ring of point-to-point messages.
    Ring,
}

/// `auto` takes the ring across hosts from this many bytes of model up, at any rank count.
/// Measured over netlab's real links (100 Mbit/s per host, benches/allreduce-link.sh, median of
/// 3, docs/sync-modes.md): the ring won at 0.2 MB on 2 hosts (30 ms against 47), at 0.81 MB on
/// 4 (139 against 178) and at 3.3 MB on 2 and 4 (297 against 563, 472 against 652); MPI won a
/// 25 KB model on 8 hosts (42 ms against 54: the ring's 2 (N-1) steps each pay a latency,
/// libnbc's tree 2 log2 N).
const RING_MIN_BYTES: usize = 256 << 10;

/// Up to this many ranks `auto` takes the ring across hosts at any size: there Open MPI's
/// non-blocking allreduce is a reduce to one rank then a broadcast, as many latencies as the
/// ring's 2 (N-1) steps and twice the bytes on one link.
const RING_ALWAYS_UP_TO: i32 = 3;

impl AllreduceAlgorithm {
    /// Whether a sum of `len` f32s over `comm` goes round the ring, and why (for the start line).
    fn ring(self, comm: &SimpleCommunicator, len: usize) -> (bool, String) {
        let bytes = 4 * len;
        match self {
            AllreduceAlgorithm::Mpi => (false, "MPI's allreduce (asked)".into()),
            AllreduceAlgorithm::Ring => (comm.size() > 1, "the ring allreduce (asked)".into()),
            AllreduceAlgorithm::Auto => {
                let hosts = collectives::host_count(comm);
                let ring = hosts > 1 && (bytes >= RING_MIN_BYTES || comm.size() <= RING_ALWAYS_UP_TO);
                let what = if ring { "the ring allreduce" } else { "MPI's allreduce" };
                let why = format!("auto: a {:.2} MB model, {} ranks on {hosts} host{}", bytes as f64 / 1e6, comm.size(), if hosts == 1 { "" } else { "s" });
                (ring, format!("{what} ({why})"))
            }
        }
    }
}

/// Averages all replicas every round.
pub struct ModelAverage {
    comm: SimpleCommunicator,
    /// `--allreduce-algorithm` resolved: sum round the program's own ring.
    ring_sum: bool,
    scratch: Vec<f32>,
    stats: CommStats,
    /// `--emulate-bandwidth`: the link each round's bytes must go through.
    pacer: Option<Pacer>,
    /// Per-rank links (`--emulate-bandwidth` in any form): a ring or tree all-reduce moves in
    /// steps that each wait for their slowest link, so the whole collective runs at the slowest
    /// rank's rate, from the moment the last rank entered it.
    ring: Option<(f64, Duration)>,
    /// What carries the emulated links (`--emulate-fabric`).
    fabric: Fabric,
    /// On a TCP fabric: the congestion window of this rank's path to its ring successor, kept
    /// from one sync to the next ([`ring_slow_start_seconds`]).
    ring_window: TcpWindow,
    /// Rounds whose real all-reduce took longer than the emulated one.
    link_overruns: u64,
    /// `--compress`: the exchange of changes, and the model of the last sync they start from.
    compressed: Option<CompressedChanges>,
}

/// `--compress`'s state: the model every rank held after the last sync, and the compressed mean
/// with its residuals.
struct CompressedChanges {
    mean: CompressedMean,
    last: Vec<f32>,
    change: Vec<f32>,
}

/// The names of the compressed exchange's state in a checkpoint's mode state.
const LAST: &str = "compress_last_sync";
const WORKER: &str = "compress_worker_residual";
const SERVER: &str = "compress_server_residual";

impl ModelAverage {
    /// Uses a private duplicate of the communicator so its traffic never mixes with other
    /// collectives.
    /// With `compression`, the syncs exchange compressed changes from `init`, the model every
    /// rank starts from.
    pub fn new(ctx: &SyncContext, compression: Option<Compression>, ring_sum: bool, init: &[f32]) -> anyhow::Result<Self> {
        let ring = ctx.links.as_ref().map(|l| l.slowest());
        let fabric = ctx.links.as_ref().map_or(Fabric::Ideal, |l| l.fabric);
        let pacer = if ring.is_some() { None } else { ctx.pacer(None) };
        let comm = ctx.comm.duplicate();
        let compressed = match compression {
            None => None,
            Some(c) => Some(CompressedChanges { mean: CompressedMean::new(c, init.len(), &comm)?, last: init.to_vec(), change: Vec::new() }),
        };
        let stats = CommStats::default();
        Ok(ModelAverage { comm, ring_sum, scratch: Vec::new(), stats, pacer, ring, fabric, ring_window: TcpWindow::new(), link_overruns: 0, compressed })
    }

    /// Replaces `params` by the average, exactly (MPI_Allreduce) or from compressed changes;
    /// returns the bytes this rank sent and received.
    fn average(&mut self, params: &mut [f32]) -> anyhow::Result<(u64, u64)> {
        let Some(c) = &mut self.compressed else {
            if self.ring_sum {
                collectives::ring_sum_f32(&self.comm, params, &mut self.scratch);
            } else {
                collectives::sum_f32(&self.comm, params, &mut self.scratch);
            }
            let inv = 1.0 / self.comm.size() as f32;
            params.iter_mut().for_each(|w| *w *= inv);
            // MPI does not tell us what it sent; a bandwidth-optimal (ring) allreduce moves
            // 2 (N-1)/N of the vector out of and into every rank, which we report.
            let bytes = ring_allreduce_bytes(self.comm.size() as usize, params.len());
            return Ok((bytes, bytes));
        };
        anyhow::ensure!(params.len() == c.last.len(), "allreduce got {} parameters, set up for {}", params.len(), c.last.len());
        c.change.clear();
        c.change.extend(c.last.iter().zip(params.iter()).map(|(l, x)| l - x));
        let bytes = c.mean.mean(&self.comm, &mut c.change)?;
        for ((x, l), d) in params.iter_mut().zip(&mut c.last).zip(&c.change) {
            *x = *l - d;
            *l = *x;
        }
        Ok((bytes.sent, bytes.received))
    }

    /// Emulated time of one all-reduce of `bytes` per rank over the slowest link, with the
    /// latency of Rabenseifner's algorithm (the one whose volume we report): 2 log2(N) steps.
    /// On a TCP fabric each step's message (a ring's chunk, `bytes` / (2 (N - 1))) also waits
    /// its rendezvous ([`Fabric::rendezvous`]).
    fn emulated_seconds(&self, bytes: u64, rate: f64, latency: Duration) -> f64 {
        emulated_allreduce_seconds(self.fabric, self.comm.size() as u32, bytes, rate, latency)
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
        // The emulated collective starts when the last rank enters it: the ranks share one
        // clock (one machine), so the latest entry time is one more (tiny) reduction.
        let entered = self.ring.map(|_| {
            let mut latest = [wall_seconds()];
            collectives::max_f64(&self.comm, &mut latest);
            latest[0]
        });
        let (bytes, received) = self.average(params)?;
        self.stats.comm_seconds += t.elapsed().as_secs_f64();
        if let (Some((rate, latency)), Some(entered)) = (self.ring, entered) {
            let mut end = entered + self.emulated_seconds(bytes, rate, latency);
            if self.fabric == Fabric::Tcp {
                end += ring_slow_start_seconds(&mut self.ring_window, self.comm.size() as u32, entered, bytes, rate, latency);
            }
            let left = end - wall_seconds();
            if left > 0.0 {
                std::thread::sleep(Duration::from_secs_f64(left));
            } else if -left > (0.05 * (end - entered)).max(5e-4) {
                self.link_overruns += 1;
            }
            self.stats.comm_seconds += t.elapsed().as_secs_f64();
        } else if let Some(p) = &mut self.pacer {
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
        self.stats.bytes_received += received;
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

    fn save_state(&self) -> ModeState {
        let Some(c) = &self.compressed else { return Vec::new() };
        let (worker, server) = c.mean.residuals();
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect();
        vec![(LAST.to_owned(), f64s(&c.last)), (WORKER.to_owned(), f64s(worker)), (SERVER.to_owned(), f64s(server))]
    }

    fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        let Some(c) = &mut self.compressed else {
            anyhow::ensure!(state.is_empty(), "the checkpoint holds sync-mode state that allreduce without --compress does not use");
            return Ok(());
        };
        let take = |name: &str| -> anyhow::Result<Vec<f32>> {
            let (_, v) = state.iter().find(|(n, _)| n == name).ok_or_else(|| anyhow::anyhow!("the checkpoint lacks {name} (--compress's state)"))?;
            Ok(v.iter().map(|&x| x as f32).collect())
        };
        let (last, worker, server) = (take(LAST)?, take(WORKER)?, take(SERVER)?);
        anyhow::ensure!(last.len() == c.last.len(), "the checkpoint's {LAST} holds {} values, the model {}", last.len(), c.last.len());
        c.last = last;
        c.mean.restore(worker, server)
    }

    fn send_log(&self) -> Vec<(f64, u64)> {
        self.pacer.as_ref().map_or(Vec::new(), |p| p.log().to_vec())
    }

    fn metrics(&self) -> Vec<super::ModeMetric> {
        if self.ring.is_none() {
            return Vec::new();
        }
        vec![super::ModeMetric::number("link_overruns", super::Aggregate::Sum, self.link_overruns as f64)]
    }
}

/// [`ModelAverage`]'s emulated time of one all-reduce over `n` ranks of `bytes` sent per rank
/// (2 (N - 1) / N of the model) at `rate` payload bytes per second, `latency` one way. Every
/// rank sends and receives at once in every step, so on a TCP fabric the bytes move at the
/// two-way share of the rate ([`Fabric::two_way_share`]: each rank's acknowledgements wait
/// behind its own chunk).
pub fn emulated_allreduce_seconds(fabric: Fabric, n: u32, bytes: u64, rate: f64, latency: Duration) -> f64 {
    let steps = 2 * n.next_power_of_two().trailing_zeros();
    let chunk = bytes / (2 * u64::from(n.max(2) - 1));
    bytes as f64 / (rate * fabric.two_way_share(latency)) + (latency + fabric.rendezvous(chunk, rate, latency)).as_secs_f64() * steps as f64
}

/// What TCP's slow start adds to one emulated all-reduce of `bytes` sent per rank that starts
/// at `at` (seconds on any one clock) over `n` ranks, `rate` payload bytes per second and
/// `latency` one way: the ring's 2 (N - 1) steps each send one chunk (`bytes` / (2 (N - 1)))
/// to the ring successor on one TCP connection, whose `window` ([`TcpWindow`]) carries over
/// from step to step (a step waits one latency for the predecessor's chunk, under an RTO: no
/// restart) and from sync to sync (restarted after the compute phase between them). Returns the
/// seconds beyond the chunks' bytes over the rate; 0 once the window is full. Measured on
/// netlab's WAN (docs/emulation.md, issue 41 item 6): a ring sync of a 3.3 MB model took
/// 9.4-9.9 s at k 64 against the ideal model's 6.1 s.
pub fn ring_slow_start_seconds(window: &mut TcpWindow, n: u32, at: f64, bytes: u64, rate: f64, latency: Duration) -> f64 {
    let steps = 2 * u64::from(n.max(2) - 1);
    let chunk = bytes / steps;
    let (lat, mut t, mut extra) = (latency.as_secs_f64(), at, 0.0);
    for _ in 0..steps {
        let took = window.send(t, chunk, rate, 2.0 * lat);
        extra += took - chunk as f64 / rate;
        t += took + lat;
    }
    extra
}

/// Seconds since the Unix epoch: one clock for every rank of a job on one machine (what the
/// emulated collective's start is agreed on).
fn wall_seconds() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// `--sync allreduce`'s declaration (see [`super::ModeSpec`]).
pub const MODE: super::ModeSpec = super::ModeSpec {
    elastic: true,
    survives_rank_loss: true,
    // Every round averages all replicas: they are equal, and the averaged model stands for them.
    replicas_agree: true,
    uses: &[(&[], &["AllreduceOptions", "compress_group"]), OUTER_USES[0], OUTER_USES[1], OUTER_USES[2]],
    // Replicas of counts are summed as deltas, not averaged.
    build_counts: Some(sum_counts),
    ..super::ModeSpec::new(
        "allreduce",
        "BSP model averaging by allreduce (MPI's, or a ring of its own across hosts) every --sync-every mini-batches (the baseline)",
        build_allreduce,
    )
};

fn build_allreduce(ctx: &SyncContext, run: &super::RunSpec, init: &[f32]) -> super::Built {
    let compression = run.opts.compress.compression();
    // The compressed exchange is an all-to-all and an all-gather of encoded chunks, no sum.
    let (ring_sum, why) = match compression {
        None => run.opts.allreduce.allreduce_algorithm.ring(ctx.comm, init.len()),
        Some(_) => (false, "an all-to-all and an all-gather of encoded changes (--compress)".into()),
    };
    let algorithm = if compression.is_some() { "compressed" } else if ring_sum { "ring" } else { "mpi" };
    let mut info = serde_json::json!({"allreduce_algorithm": algorithm, "chosen": why});
    if compression.is_some() {
        info["compress"] = serde_json::json!(run.opts.compress.compress);
    }
    Ok((Box::new(ModelAverage::new(ctx, compression, ring_sum, init)?), info))
}

fn sum_counts(ctx: &SyncContext, run: &super::RunSpec, init: &[f32]) -> anyhow::Result<Box<dyn SyncMode>> {
    let (ring_sum, _) = run.opts.allreduce.allreduce_algorithm.ring(ctx.comm, init.len());
    Ok(Box::new(super::delta_sum::DeltaSum::new(ctx, init, ring_sum)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::pace::{TCP_INITIAL_WINDOW_SEGMENTS, TCP_MSS};

    #[test]
    fn the_rings_window_grows_across_its_steps_and_restarts_after_a_long_compute_phase() {
        let iw = TCP_INITIAL_WINDOW_SEGMENTS * TCP_MSS;
        // 2 ranks: 2 steps of one chunk each; a chunk of 7 initial windows on a path that holds
        // far more (1 GB/s x 100 ms). Step 1 on a new connection: rounds of 1, 2 and 4 windows,
        // the last at the rate: 2 round trips beyond its bytes less the 3 windows they carried
        // (2 RTT - 3 IW / rate). Step 2 starts 50 ms after (under the RTO) with a window of 8:
        // at the rate.
        let (rate, lat) = (1e9, Duration::from_millis(50));
        let bytes = (2.0 * 7.0 * iw) as u64;
        let mut w = TcpWindow::new();
        let extra = ring_slow_start_seconds(&mut w, 2, 0.0, bytes, rate, lat);
        let want = 2.0 * 0.1 - 3.0 * iw / rate;
        assert!((extra - want).abs() < 1e-9, "{extra} against {want}");
        // The next sync at 0.4 s, 0.15 s after the last byte (under the RTO of 0.3 s): the
        // window (15 windows) holds a chunk, nothing added.
        assert!(ring_slow_start_seconds(&mut w, 2, 0.4, bytes, rate, lat).abs() < 1e-9);
        // After 100 s of compute (hundreds of RTOs) the window is the initial one again.
        let again = ring_slow_start_seconds(&mut w, 2, 101.0, bytes, rate, lat);
        assert!((again - want).abs() < 1e-9, "{again} against {want}");
        // No latency: no slow start, the closed form alone.
        assert_eq!(ring_slow_start_seconds(&mut TcpWindow::new(), 8, 0.0, 3_300_000, 1e6, Duration::ZERO), 0.0);
    }
}
