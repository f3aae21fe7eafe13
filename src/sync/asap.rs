//! `--sync asap`: ASAP stochastic reduce (ASAP §3-4) over one-sided MPI mailboxes.
//!
//! Each round a rank sends its model to its out-neighbours and replaces it by the equal-weight
//! average of itself and the consistent in-neighbour models it reduced:
//! `w_i <- (w_i + sum_j w_j) / (1 + used)`. How a rank decides what to reduce is [`NotifyMode`]:
//! - `notify-ack`: wait for every in-neighbour's NOTIFY, reduce all, ACK (ASAP §4); a sender
//!   waits for the ACK of its previous message before overwriting the slot;
//! - `barrier`: BSP: put, MPI_Barrier, reduce the slots that hold this round intact;
//! - `none`: fully asynchronous: put, reduce whatever intact buffers are there, never block.
//!
//! The per-reduce count of consistent inputs is kept as a histogram (ASAP Fig. 8).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mpi::topology::{Communicator, SimpleCommunicator};

use super::{average_replicas, Aggregate, CommStats, ModeMetric, SyncContext, SyncMode};
use crate::comm::mailbox::{Mailboxes, SlotRead};

/// Options of `--sync asap`.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "ASAP (--sync asap)")]
pub struct AsapOptions {
    /// Communication graph: auto (root-expander while it mixes within 32 rounds, about 16 ranks
    /// or fewer; a seeded random 4-regular graph above; the choice and reason are logged),
    /// root-expander, exponential, ring, complete, chain, line, star, hypercube, torus, random:D
    /// (D-regular, seeded) or file:PATH (see graphs/).
    #[arg(long, value_name = "GRAPH", default_value = "auto")]
    pub graph: String,
    /// Synchronisation: notify-ack (one-sided NOTIFY-ACK), barrier (put, MPI_Barrier, reduce
    /// what is consistent) or none (fully asynchronous).
    #[arg(long, value_enum, default_value_t = NotifyMode::NotifyAck)]
    pub notify: NotifyMode,
}

impl Default for AsapOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// How a receiver decides which in-neighbour models to reduce (`--notify`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyMode {
    /// Fine-grained NOTIFY-ACK: wait for all in-neighbours, always consistent.
    NotifyAck,
    /// Global barrier after the puts; reduce what is consistent for this round.
    Barrier,
    /// No synchronisation; reduce whatever intact buffers are present.
    None,
}

/// Configuration of [`StochasticReduce`].
#[derive(Clone, Debug)]
pub struct AsapConfig {
    /// For every rank r of the communicator, the ranks r receives from (self-loops ignored).
    pub in_neighbours: Vec<Vec<usize>>,
    /// Synchronisation variant.
    pub notify: NotifyMode,
    /// Longest wait for a NOTIFY or ACK before failing (`--wait-timeout`).
    pub wait_timeout: Duration,
    /// Fault injection for tests: `(rank, round)`: that rank sends nothing after that round.
    pub stop_sending_after: Option<(usize, u64)>,
}

/// ASAP stochastic reduce over RMA mailboxes. Collective: every rank constructs it with the same
/// graph and calls `sync` with the same rounds. Dropping frees the window collectively, so after
/// an error on one rank abort the job (`comm::abort_job`) instead of dropping and continuing.
pub struct StochasticReduce {
    mail: Mailboxes,
    comm: SimpleCommunicator,
    cfg: AsapConfig,
    rank: usize,
    n_params: usize,
    stats: CommStats,
    /// `histogram[k]`: reduces that used k consistent in-neighbour models.
    histogram: Vec<u64>,
    torn: u64,
    stale: u64,
    /// Per in-neighbour: newest round already reduced (for `none`).
    last_used: Vec<u64>,
    last_round: u64,
    acc: Vec<f32>,
    incoming: Vec<f32>,
}

impl StochasticReduce {
    /// Builds the mode from the run's options: the graph (its spectral gap computed and logged),
    /// then the mailboxes. Returns the graph report for the metrics' start line too.
    pub fn build(ctx: &SyncContext, opts: &AsapOptions) -> anyhow::Result<(Self, serde_json::Value)> {
        let n = ctx.comm.size() as usize;
        let (graph, report) = crate::graph::graph_for_training(&opts.graph, n, ctx.seed)?;
        let cfg = AsapConfig {
            in_neighbours: (0..n).map(|i| graph.in_neighbours(i).to_vec()).collect(),
            notify: opts.notify,
            wait_timeout: ctx.wait_timeout,
            stop_sending_after: ctx.stop_sending_after,
        };
        let info = serde_json::json!({"graph": opts.graph, "notify": opts.notify, "report": report});
        let mut mode = StochasticReduce::new(ctx.comm, cfg, ctx.n_params())?;
        mode.mail.set_pacer(ctx.pacer(None));
        Ok((mode, info))
    }

    /// Collectively sets up the mailboxes for `cfg.in_neighbours` over `comm` for a model of
    /// `n_params` f32s.
    pub fn new(comm: &SimpleCommunicator, cfg: AsapConfig, n_params: usize) -> anyhow::Result<Self> {
        if cfg.wait_timeout.is_zero() {
            bail!("--wait-timeout must be positive");
        }
        let mail = Mailboxes::new(comm, &cfg.in_neighbours, n_params)
            .context("setting up the ASAP mailboxes (one-sided MPI window)")?;
        let in_degree = mail.in_neighbours().len();
        Ok(StochasticReduce {
            comm: comm.duplicate(),
            rank: comm.rank() as usize,
            n_params,
            stats: CommStats::default(),
            histogram: vec![0; in_degree + 1],
            torn: 0,
            stale: 0,
            last_used: vec![0; in_degree],
            last_round: 0,
            acc: vec![0.0; n_params],
            incoming: vec![0.0; n_params],
            mail,
            cfg,
        })
    }

    /// Ranks this rank receives from (sorted, self-loops removed).
    pub fn in_neighbours(&self) -> &[usize] {
        self.mail.in_neighbours()
    }

    /// `histogram[k]` = reduces that used k consistent in-neighbour models.
    pub fn consistency_histogram(&self) -> &[u64] {
        &self.histogram
    }

    /// Buffers skipped because header and footer differed (or held another round under barrier).
    pub fn torn(&self) -> u64 {
        self.torn
    }

    /// Buffers skipped because they were older than the round needed or already used.
    pub fn stale(&self) -> u64 {
        self.stale
    }

    /// `--emulate-latency` for one-sided puts: the sender cannot hand a put to a slow link and
    /// go on, so instead of delaying every put (which would charge the latency once per
    /// neighbour) each direction of a round (data + NOTIFY, then ACK) waits it once.
    fn emulated_latency(&self) {
        if let Some(p) = self.mail.pacer() {
            std::thread::sleep(p.latency());
        }
    }

    fn sending(&self, round: u64) -> bool {
        !matches!(self.cfg.stop_sending_after, Some((r, last)) if r == self.rank && round > last)
    }

    /// Adds in-neighbour slot `i` to the accumulator if `accept` says its round is usable;
    /// returns whether it was used.
    fn take(&mut self, i: usize, accept: impl Fn(u64) -> Accept) -> anyhow::Result<bool> {
        let read = self.mail.read_slot(i, &mut self.incoming)?;
        match read {
            SlotRead::Consistent(h) => match accept(h) {
                Accept::Use => {
                    for (a, x) in self.acc.iter_mut().zip(&self.incoming) {
                        *a += *x;
                    }
                    self.last_used[i] = h;
                    Ok(true)
                }
                Accept::Stale => {
                    self.stale += 1;
                    Ok(false)
                }
                Accept::Torn => {
                    self.torn += 1;
                    Ok(false)
                }
            },
            SlotRead::Torn(..) => {
                self.torn += 1;
                Ok(false)
            }
            SlotRead::Empty => {
                if !matches!(self.cfg.notify, NotifyMode::None) {
                    self.stale += 1;
                }
                Ok(false)
            }
        }
    }

    fn reduce_into(&mut self, params: &mut [f32], used: usize) {
        let denom = (1 + used) as f32;
        for (p, a) in params.iter_mut().zip(&self.acc) {
            *p = *a / denom;
        }
        self.histogram[used] += 1;
    }

    fn sync_notify_ack(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let timeout = self.cfg.wait_timeout;
        if self.sending(round) {
            for j in 0..self.mail.out_neighbours().len() {
                let t = Instant::now();
                self.mail.wait_ack(j, round, timeout)?;
                let t2 = Instant::now();
                self.stats.wait_seconds += (t2 - t).as_secs_f64();
                self.mail.send_to(j, round, params)?;
                self.stats.comm_seconds += t2.elapsed().as_secs_f64();
            }
        }
        let t = Instant::now();
        self.emulated_latency();
        self.mail.wait_notifications(round, timeout)?;
        let t2 = Instant::now();
        self.stats.wait_seconds += (t2 - t).as_secs_f64();
        self.acc.copy_from_slice(params);
        let d = self.mail.in_neighbours().len();
        for i in 0..d {
            let read = self.mail.read_slot(i, &mut self.incoming)?;
            if read != SlotRead::Consistent(round) {
                self.torn += 1;
                bail!(
                    "rank {}: round {round}: the buffer from rank {} was inconsistent after its \
                     NOTIFY ({read:?}); NOTIFY-ACK must never see this, so the MPI one-sided \
                     transport does not order the data before the notification (try another \
                     osc component, e.g. OMPI_MCA_osc=ucx)",
                    self.rank,
                    self.mail.in_neighbours()[i]
                );
            }
            for (a, x) in self.acc.iter_mut().zip(&self.incoming) {
                *a += *x;
            }
            self.last_used[i] = round;
        }
        self.reduce_into(params, d);
        for i in 0..d {
            self.mail.ack(i)?;
        }
        self.emulated_latency();
        self.stats.comm_seconds += t2.elapsed().as_secs_f64();
        Ok(())
    }

    fn sync_barrier(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let t = Instant::now();
        if self.sending(round) {
            self.mail.post(round, params, true)?;
        }
        let t2 = Instant::now();
        self.mail.barrier(round, self.cfg.wait_timeout)?;
        let t3 = Instant::now();
        self.acc.copy_from_slice(params);
        let mut used = 0;
        for i in 0..self.mail.in_neighbours().len() {
            let ok = self.take(i, |h| match h.cmp(&round) {
                std::cmp::Ordering::Equal => Accept::Use,
                std::cmp::Ordering::Less => Accept::Stale,
                // A fast sender already wrote the next round: a mixed-version buffer.
                std::cmp::Ordering::Greater => Accept::Torn,
            })?;
            used += ok as usize;
        }
        self.reduce_into(params, used);
        self.stats.comm_seconds += (t2 - t).as_secs_f64() + t3.elapsed().as_secs_f64();
        self.stats.wait_seconds += (t3 - t2).as_secs_f64();
        Ok(())
    }

    fn sync_none(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let t = Instant::now();
        if self.sending(round) {
            self.mail.post(round, params, true)?;
        }
        self.acc.copy_from_slice(params);
        let mut used = 0;
        for i in 0..self.mail.in_neighbours().len() {
            let last = self.last_used[i];
            let ok = self.take(i, |h| {
                if h >= last {
                    Accept::Use
                } else {
                    Accept::Stale
                }
            })?;
            used += ok as usize;
        }
        self.reduce_into(params, used);
        self.stats.comm_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }
}

/// Verdict on a consistent buffer's round.
enum Accept {
    Use,
    Stale,
    Torn,
}

impl SyncMode for StochasticReduce {
    fn name(&self) -> &'static str {
        "asap"
    }

    fn lockstep(&self) -> bool {
        // Only the barrier variant makes every rank wait for every other each round.
        self.cfg.notify == NotifyMode::Barrier
    }

    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        if params.len() != self.n_params {
            bail!(
                "asap sync got {} parameters but was set up for {}",
                params.len(),
                self.n_params
            );
        }
        if round <= self.last_round {
            bail!(
                "asap sync rounds must increase (got {round} after {})",
                self.last_round
            );
        }
        let (sent0, recv0) = (self.mail.bytes_sent(), self.mail.bytes_received());
        match self.cfg.notify {
            NotifyMode::NotifyAck => self.sync_notify_ack(params, round)?,
            NotifyMode::Barrier => self.sync_barrier(params, round)?,
            NotifyMode::None => self.sync_none(params, round)?,
        }
        self.stats.bytes_sent += self.mail.bytes_sent() - sent0;
        self.stats.bytes_received += self.mail.bytes_received() - recv0;
        self.last_round = round;
        self.stats.rounds += 1;
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        if params.len() != self.n_params {
            bail!(
                "asap finish got {} parameters, expected {}",
                params.len(),
                self.n_params
            );
        }
        let t = Instant::now();
        // Drain: under NOTIFY-ACK every message must be consumed before the window goes away.
        if self.cfg.notify == NotifyMode::NotifyAck {
            let r0 = self.mail.bytes_received();
            self.mail.wait_acks(self.last_round, self.cfg.wait_timeout)?;
            self.stats.bytes_received += self.mail.bytes_received() - r0;
        }
        self.mail.window().flush_all()?;
        self.mail.barrier(self.last_round, self.cfg.wait_timeout)?;
        self.stats.wait_seconds += t.elapsed().as_secs_f64();
        average_replicas(&self.comm, params, &mut self.stats);
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.stats
    }

    fn send_log(&self) -> Vec<(f64, u64)> {
        self.mail.pacer().map_or(Vec::new(), |p| p.log().to_vec())
    }

    fn metrics(&self) -> Vec<ModeMetric> {
        vec![
            ModeMetric::array("consistency_histogram", Aggregate::Sum, self.histogram.iter().map(|&c| c as f64)),
            ModeMetric::number("torn", Aggregate::Sum, self.torn as f64),
            ModeMetric::number("stale", Aggregate::Sum, self.stale as f64),
            ModeMetric::number("in_degree", Aggregate::Max, self.mail.in_neighbours().len() as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::NotifyMode;
    use clap::ValueEnum;

    #[test]
    fn notify_mode_names_match_the_command_line_and_config_files() {
        for (name, mode) in [
            ("notify-ack", NotifyMode::NotifyAck),
            ("barrier", NotifyMode::Barrier),
            ("none", NotifyMode::None),
        ] {
            assert_eq!(NotifyMode::from_str(name, false), Ok(mode));
            assert_eq!(serde_json::to_string(&mode).unwrap(), format!("\"{name}\""));
            assert_eq!(
                serde_json::from_str::<NotifyMode>(&format!("\"{name}\"")).unwrap(),
                mode
            );
        }
    }
}
