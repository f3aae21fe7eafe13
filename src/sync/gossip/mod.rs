//! The gossip engine: ASAP stochastic reduce (ASAP §3-4) over one-sided MPI mailboxes (or, across
//! hosts on TCP, two-sided messages: `--transport`, gossip/p2p.rs), which
//! `--sync asap` runs (sync/asap.rs: its options and declaration) and `--sync gaia --gaia-inner
//! asap` runs inside each data centre. Like [`super::ps`] for the parameter-server modes, it reads
//! no mode's options: a mode hands it [`GossipSettings`].
//!
//! Each round a rank sends its model to its out-neighbours and replaces it by the equal-weight
//! average of itself and the consistent in-neighbour models it reduced:
//! `w_i <- (w_i + sum_j w_j) / (1 + used)`. How a rank decides what to reduce is [`NotifyMode`]:
//! - `notify-ack`: wait for every in-neighbour's NOTIFY, reduce all, ACK (ASAP §4); a sender
//!   waits for the ACK of its previous message before overwriting the slot;
//! - `barrier`: BSP: put, MPI_Barrier, reduce the slots that hold this round intact;
//! - `none`: fully asynchronous: put, reduce whatever intact buffers are there, never block;
//! - `push-sum`: asynchronous push-sum ([`push_sum`]): push (share of x, share of w) as
//!   running totals, fold in what arrived, never block; mass is conserved;
//! - `deadline`: NOTIFY-ACK that waits for new messages only until a deadline.
//!
//! The per-reduce count of consistent inputs is kept as a histogram (ASAP Fig. 8).
//!
//! With a bandwidth budget (`--bandwidth-mbps`, NOTIFY-ACK only) each message carries only the
//! rows that fit the rank's budget, most significant first, and the rest stays in per-edge
//! residuals: see [`edge_budget`].
//!
//! With compression (`--compress`, NOTIFY-ACK at staleness 0 only, on a static graph or the
//! one-peer one) each message is the compressed change of a public copy of the sender's model,
//! CHOCO-GOSSIP: see [`choco`].
//!
//! Layout, after Bluefog's split of topology, communication primitive and algorithm: the graph
//! comes from [`crate::graph`]; the transport every variant shares is `Neighbourhood`
//! (gossip/neighbourhood.rs: the mailboxes, the pacing, the fault injection, the counters every
//! variant reports, and the one NOTIFY-ACK, for f32 models and byte messages alike); each
//! variant is one type implementing `Gossip` (gossip/variant.rs) that holds only its own state.
//! The variants import `Gossip` and `Neighbourhood` from their files, never this one:
//!
//! | variant | type | file |
//! | --- | --- | --- |
//! | notify-ack | `NotifyAck` | gossip/notify_ack.rs |
//! | notify-ack `--overlap` | `Overlap` | gossip/notify_ack.rs |
//! | notify-ack, `--graph one-peer-exponential` | `OnePeer` | gossip/notify_ack.rs |
//! | notify-ack `--staleness S` | `BoundedStaleness` | gossip/bounded.rs |
//! | notify-ack `--bandwidth-mbps` | `BudgetedEdges` | gossip/edge_budget.rs |
//! | notify-ack `--compress` (static or one-peer graph) | `Choco` | gossip/choco.rs |
//! | barrier, none | `Barrier`, `Unsynchronised` | gossip/unacked.rs |
//! | push-sum | `PushSumGossip` | gossip/push_sum.rs |
//! | deadline | `Deadline` | gossip/deadline.rs |
//!
//! `--transport p2p` puts the NOTIFY-ACK steps of `Neighbourhood` on two-sided links
//! (gossip/p2p.rs) instead of the window's slots: notify-ack, `--overlap` and the one-peer graph
//! and the budgeted and compressed edges run on it unchanged; the variants that read the slots
//! themselves (barrier, none, push-sum, deadline, bounded staleness) have a two-sided path in
//! their files with the same semantics (messages queue where slots are overwritten: the newest
//! queued one stands for the slot), and settle the links at a cut or the end
//! (`Neighbourhood::settle_links`).
//!
//! [`StochasticReduce`] is the engine as a [`SyncMode`]: it picks the variant from the settings
//! (`gossip_for`), and does what is the same for all of them (argument checks, byte and round
//! counts, the end's flush and barrier).

mod bounded;
pub mod choco;
mod deadline;
pub mod edge_budget;
mod neighbourhood;
mod notify_ack;
mod p2p;
pub mod push_sum;
mod unacked;
mod variant;

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mpi::topology::{Communicator, SimpleCommunicator};

use super::{Aggregate, CommStats, ModeMetric, ModeState, SyncContext, SyncMode};
use crate::comm::mailbox::Mailboxes;
use crate::comm::postbox::Postbox;
use choco::{Choco, ChocoOptions};
use edge_budget::{BudgetedEdges, EdgeBudgetOptions};
use neighbourhood::Neighbourhood;
use p2p::P2pLinks;
use push_sum::PushSumGossip;
use variant::Gossip;

/// How a receiver decides which in-neighbour models to reduce (`--notify`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyMode {
    /// Fine-grained NOTIFY-ACK: wait for all in-neighbours, always consistent.
    NotifyAck,
    /// Global barrier after the puts; reduce what is consistent for this round.
    Barrier,
    /// No synchronisation; reduce whatever intact buffers are present.
    None,
    /// Asynchronous push-sum: mass-conserving, never blocks.
    PushSum,
    /// NOTIFY-ACK with a deadline: send where the slot is free (a slow link or a slow receiver
    /// is skipped while its last message is unread), wait up to --deadline for new messages,
    /// reduce what arrived; nobody is paced by a slow rank or link.
    Deadline,
}

/// How the NOTIFY-ACK messages travel (`--transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// p2p where the ranks span hosts without an RDMA device (TCP), rma otherwise.
    Auto,
    /// One-sided puts into the receivers' windows (MPI RMA).
    Rma,
    /// Two-sided non-blocking messages (every --notify variant, --staleness, --overlap, the
    /// one-peer graph, the budgeted edges and --compress).
    P2p,
}

impl Transport {
    /// Whether the messages go point to point, and why (for the start line: "asked", or auto's
    /// reason). Collective (counts the hosts).
    fn resolve(self, comm: &SimpleCommunicator) -> (bool, String) {
        match self {
            Transport::Rma => (false, "asked".into()),
            Transport::P2p => (true, "asked".into()),
            Transport::Auto => {
                let hosts = crate::comm::collectives::host_count(comm);
                // An RDMA-capable device (InfiniBand, RoCE, iWARP) shows under this directory. Every
                // rank must choose alike (p2p's set-up is collective): RDMA only where all have it.
                let here = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
                let rdma = crate::comm::collectives::min_u64(comm, u64::from(here)) == 1;
                match (hosts > 1, rdma) {
                    (true, false) => {
                        (true, format!("auto: ranks on {hosts} hosts and no RDMA device, so TCP, where one-sided puts cost round trips"))
                    }
                    (true, true) => (false, format!("auto: ranks on {hosts} hosts with an RDMA device")),
                    (false, _) => (false, "auto: every rank on one host, shared memory".into()),
                }
            }
        }
    }
}

/// What a mode asks of the engine: the graph and how receivers decide what to reduce (from
/// `--graph`, `--notify`, `--overlap` and `--deadline` under `--sync asap`; gaia's groups use
/// NOTIFY-ACK without overlap).
#[derive(Clone, Debug)]
pub struct GossipSettings<'a> {
    /// A graph spec (`--graph`: a name, `random:D` or `file:PATH`).
    pub graph: &'a str,
    pub notify: NotifyMode,
    /// Reduce each round at the next sync, keeping the steps made meanwhile.
    pub overlap: bool,
    /// `--notify deadline`: milliseconds a rank waits for new messages after its sends.
    pub deadline_ms: f64,
    /// `--transport`.
    pub transport: Transport,
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
    /// Bounded-staleness NOTIFY-ACK (`--staleness S`, notify-ack only): reduce each
    /// in-neighbour's newest message no older than S rounds; S = 0 is ASAP's protocol.
    pub staleness: u64,
    /// One-peer exponential graph: `in_neighbours` lists every edge of a period, and each round
    /// uses only one in- and one out-edge (see [`crate::graph::one_peer_source`]).
    pub one_peer: bool,
    /// `--overlap`: reduce each round at the next sync, keeping the steps made meanwhile.
    pub overlap: bool,
    /// `--notify deadline`: how long a rank waits for new messages after its sends.
    pub deadline: Duration,
}

/// The variant `cfg` asks for, for a rank with `in_degree` in-neighbours and a model of
/// `n_params` values (the budgeted one is built by [`StochasticReduce::build`], which owns its
/// mailboxes). `--staleness` comes first, then the one-peer graph, then `--overlap`: the same
/// precedence the options' checks in `build` leave no room to matter.
fn gossip_for(cfg: &AsapConfig, in_degree: usize, n_params: usize) -> Box<dyn Gossip> {
    match cfg.notify {
        NotifyMode::NotifyAck if cfg.staleness > 0 => Box::new(bounded::BoundedStaleness::new(cfg.staleness, n_params)),
        NotifyMode::NotifyAck if cfg.one_peer => Box::new(notify_ack::OnePeer::new(cfg.in_neighbours.len())),
        NotifyMode::NotifyAck if cfg.overlap => Box::new(notify_ack::Overlap::new(n_params)),
        NotifyMode::NotifyAck => Box::new(notify_ack::NotifyAck),
        NotifyMode::Barrier => Box::new(unacked::Barrier::new(n_params)),
        NotifyMode::None => Box::new(unacked::Unsynchronised::new(n_params, in_degree)),
        NotifyMode::PushSum => Box::new(PushSumGossip::new(in_degree)),
        NotifyMode::Deadline => Box::new(deadline::Deadline::new(cfg.deadline)),
    }
}

/// ASAP stochastic reduce over RMA mailboxes. Collective: every rank constructs it with the same
/// graph and calls `sync` with the same rounds. Dropping frees the window collectively, so after
/// an error on one rank abort the job (`comm::abort_job`) instead of dropping and continuing.
pub struct StochasticReduce {
    net: Neighbourhood,
    gossip: Box<dyn Gossip>,
}

impl StochasticReduce {
    /// Builds the mode from the run's options: the graph (its spectral gap computed and logged),
    /// then the mailboxes. Returns the graph report for the metrics' start line too.
    /// With `budget`, every rank's edges spend at most that bandwidth (`init`: the model every
    /// rank starts from, which the per-edge mirrors start at); with `choco`, the messages are
    /// compressed changes of public copies.
    pub fn build(
        ctx: &SyncContext,
        opts: &GossipSettings,
        init: &[f32],
        budget: Option<EdgeBudgetOptions>,
        choco: Option<ChocoOptions>,
        staleness: u64,
    ) -> anyhow::Result<(Self, serde_json::Value)> {
        let n = ctx.comm.size() as usize;
        let one_peer = opts.graph == crate::graph::ONE_PEER_EXPONENTIAL;
        let (in_neighbours, report) = if one_peer {
            if opts.notify != NotifyMode::NotifyAck || budget.is_some() || staleness > 0 {
                bail!(
                    "--graph {} changes every round: it runs with --notify notify-ack, without --bandwidth-mbps and --staleness",
                    crate::graph::ONE_PEER_EXPONENTIAL
                );
            }
            crate::graph::one_peer_for_training(n)
        } else {
            let (graph, report) = crate::graph::graph_for_training(opts.graph, n, ctx.seed)?;
            ((0..n).map(|i| graph.in_neighbours(i).to_vec()).collect(), report)
        };
        let cfg = AsapConfig {
            in_neighbours,
            one_peer,
            overlap: opts.overlap,
            deadline: Duration::from_secs_f64(opts.deadline_ms / 1e3),
            notify: opts.notify,
            wait_timeout: ctx.wait_timeout,
            stop_sending_after: ctx.stop_sending_after,
            staleness,
        };
        if opts.notify == NotifyMode::Deadline && (budget.is_some() || staleness > 0) {
            bail!("--notify deadline runs without --bandwidth-mbps and --staleness (it bounds waiting by time instead)");
        }
        if opts.overlap && (opts.notify != NotifyMode::NotifyAck || budget.is_some() || staleness > 0 || one_peer) {
            bail!("--overlap runs with --notify notify-ack on a static graph, without --bandwidth-mbps and --staleness");
        }
        if staleness > 0 && (opts.notify != NotifyMode::NotifyAck || budget.is_some()) {
            bail!("--staleness on --sync asap needs --notify notify-ack and no --bandwidth-mbps");
        }
        if choco.is_some() && (opts.notify != NotifyMode::NotifyAck || budget.is_some() || staleness > 0 || opts.overlap) {
            bail!("--compress on --sync asap needs every message delivered once, in order: --notify notify-ack, without --overlap, --bandwidth-mbps and --staleness");
        }
        let (p2p, transport) = opts.transport.resolve(ctx.comm);
        let mut info = serde_json::json!({"graph": opts.graph, "notify": opts.notify, "staleness": staleness, "report": report,
            "transport": if p2p { "p2p" } else { "rma" },
            "chosen": format!("{} ({transport})", if p2p { "point-to-point messages" } else { "one-sided RMA" })});
        let fixed_size = budget.is_none() && choco.is_none();
        let mut mode = match (budget, choco) {
            (None, Some(c)) => {
                let (mail, choco) = Choco::build(ctx, &cfg.in_neighbours, &c, init, one_peer, p2p)?;
                info["consensus_step"] = serde_json::json!(c.step);
                let net = Neighbourhood::new(ctx.comm, cfg.wait_timeout, cfg.stop_sending_after, ctx.n_params(), mail)?;
                StochasticReduce { net, gossip: Box::new(choco) }
            }
            (None, None) => StochasticReduce::with_transport(ctx.comm, cfg, ctx.n_params(), p2p)?,
            (Some(b), _) => {
                if opts.notify != NotifyMode::NotifyAck {
                    bail!(
                        "--bandwidth-mbps on --sync asap needs --notify notify-ack: a budgeted edge \
                         sends each row once, and barrier/none can overwrite a message before it is read"
                    );
                }
                let (mail, edges) = BudgetedEdges::build(ctx, &cfg.in_neighbours, init, &b, p2p)?;
                info["budget"] = edges.info(&b);
                let net = Neighbourhood::new(ctx.comm, cfg.wait_timeout, cfg.stop_sending_after, ctx.n_params(), mail)?;
                StochasticReduce { net, gossip: Box::new(edges) }
            }
        };
        if p2p {
            // As on rma, byte messages (budgeted, compressed) do not model the receiver's link.
            let ingress = if fixed_size { ctx.ingress() } else { None };
            let post = Postbox::new(ctx.comm).with_pacer(ctx.pacer(None)).with_ingress(ingress);
            let links = P2pLinks::new(post, mode.net.mail.in_neighbours(), mode.net.mail.out_neighbours())
                .with_depth(bounded::slot_depth(staleness));
            mode.net.p2p = Some(links);
            return Ok((mode, info));
        }
        mode.net.mail.set_pacer(ctx.pacer(None));
        // The receiver's link: several in-neighbours share it (fixed-size models carry the
        // stamp it needs; byte messages, budgeted or compressed, do not model it).
        if fixed_size {
            mode.net.mail.set_ingress(ctx.ingress());
        }
        Ok((mode, info))
    }

    /// Collectively sets up the mailboxes for `cfg.in_neighbours` over `comm` for a model of
    /// `n_params` f32s, and the variant `cfg` asks for (never the budgeted one: see `build`).
    pub fn new(comm: &SimpleCommunicator, cfg: AsapConfig, n_params: usize) -> anyhow::Result<Self> {
        Self::with_transport(comm, cfg, n_params, false)
    }

    /// [`StochasticReduce::new`]; with `p2p`, the window holds no model slots (the caller hands
    /// the neighbourhood its two-sided links).
    fn with_transport(comm: &SimpleCommunicator, cfg: AsapConfig, n_params: usize, p2p: bool) -> anyhow::Result<Self> {
        // Each variant's slots: bounded staleness keeps several per edge, push-sum's hold f64
        // running totals (see their files).
        let depth = bounded::slot_depth(cfg.staleness);
        let slot_len = match cfg.notify {
            _ if p2p => 0,
            NotifyMode::PushSum => PushSumGossip::slot_len(n_params),
            _ => n_params,
        };
        let mail = Mailboxes::with_depth(comm, &cfg.in_neighbours, slot_len, depth)
            .context("setting up the ASAP mailboxes (one-sided MPI window)")?;
        let net = Neighbourhood::new(comm, cfg.wait_timeout, cfg.stop_sending_after, n_params, mail)?;
        let gossip = gossip_for(&cfg, net.in_degree(), n_params);
        Ok(StochasticReduce { net, gossip })
    }

    /// Ranks this rank receives from (sorted, self-loops removed).
    pub fn in_neighbours(&self) -> &[usize] {
        self.net.mail.in_neighbours()
    }

    /// `histogram[k]` = reduces that used k consistent in-neighbour models.
    pub fn consistency_histogram(&self) -> &[u64] {
        &self.net.histogram
    }

    /// Buffers skipped because header and footer differed (or held another round under barrier).
    pub fn torn(&self) -> u64 {
        self.net.torn
    }

    /// Buffers skipped because they were older than the round needed or already used.
    pub fn stale(&self) -> u64 {
        self.net.stale
    }

    /// Seconds spent putting models to out-neighbours (data, flush and NOTIFY; no waiting and
    /// no reduce): what `rma-check` sets against a raw put + flush of the same size.
    pub fn transfer_seconds(&self) -> f64 {
        self.net.transfer_seconds
    }
}

impl SyncMode for StochasticReduce {
    fn name(&self) -> &'static str {
        "asap"
    }

    fn lockstep(&self) -> bool {
        // Only the barrier variant makes every rank wait for every other each round.
        self.gossip.lockstep()
    }

    fn round_lead(&self) -> u64 {
        // Bounded staleness: a rank may run up to S messages ahead of what its receivers have read.
        self.gossip.round_lead()
    }

    /// Two-sided messages move only while their owner calls into MPI: polled between steps.
    fn before_step(&mut self, _params: &mut [f32], _clock: u64) -> anyhow::Result<()> {
        self.net.between_steps()
    }

    /// An emulated step's rest: polled every millisecond on the two-sided transport.
    fn idle(&mut self, d: Duration) -> anyhow::Result<()> {
        if self.net.p2p.is_none() {
            std::thread::sleep(d);
            return Ok(());
        }
        let end = Instant::now() + d;
        loop {
            self.net.between_steps()?;
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            std::thread::sleep((end - now).min(Duration::from_millis(1)));
        }
    }

    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let net = &mut self.net;
        if params.len() != net.n_params {
            bail!("asap sync got {} parameters but was set up for {}", params.len(), net.n_params);
        }
        if round <= net.last_round {
            bail!("asap sync rounds must increase (got {round} after {})", net.last_round);
        }
        let counted = net.byte_counts();
        self.gossip.round(net, params, round)?;
        net.count_since(counted);
        net.last_round = round;
        net.stats.rounds += 1;
        Ok(())
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        let net = &mut self.net;
        if params.len() != net.n_params {
            bail!("asap finish got {} parameters, expected {}", params.len(), net.n_params);
        }
        self.gossip.verify(net)?;
        let counted = net.byte_counts();
        self.gossip.settle(net, params)?;
        net.count_since(counted);
        let t = Instant::now();
        self.gossip.drain(net)?;
        net.mail.window().flush_all()?;
        net.mail.barrier(net.last_round, net.wait_timeout)?;
        net.stats.wait_seconds += t.elapsed().as_secs_f64();
        self.gossip.final_model(net, params)
    }

    fn quiesce(&mut self, params: &mut [f32], _round: u64) -> anyhow::Result<()> {
        // What the cut sends and receives is training traffic too (push-sum's last folds).
        let counted = self.net.byte_counts();
        self.gossip.quiesce(&mut self.net, params)?;
        // A collective follows the cut: two-sided messages the emulated link still holds must
        // reach MPI first (found with --emulate-bandwidth: the last round's message, held, left
        // its receiver waiting while the sender sat in the stop vote's collective).
        let timeout = self.net.wait_timeout;
        if let (Some(p), true) = (&mut self.net.p2p, self.gossip.cut_releases_held()) {
            p.release_held(timeout)?;
        }
        self.net.count_since(counted);
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.net.stats
    }

    fn send_log(&self) -> Vec<(f64, u64)> {
        self.gossip.send_log(&self.net)
    }

    fn receive_log(&self) -> Vec<(f64, u64)> {
        self.net.mail.ingress().map_or(Vec::new(), |i| i.log().to_vec())
    }

    fn save_state(&self) -> ModeState {
        self.gossip.save_state()
    }

    fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        self.gossip.restore_state(state, self.net.n_params)
    }

    fn metrics(&self) -> Vec<ModeMetric> {
        let net = &self.net;
        let mut m = vec![
            ModeMetric::array("consistency_histogram", Aggregate::Sum, net.histogram.iter().map(|&c| c as f64)),
            ModeMetric::number("torn", Aggregate::Sum, net.torn as f64),
            ModeMetric::number("stale", Aggregate::Sum, net.stale as f64),
            ModeMetric::number("in_degree", Aggregate::Max, net.in_degree() as f64),
        ];
        if net.mail.pacer().is_some() {
            m.push(ModeMetric::number("link_overruns", Aggregate::Sum, net.mail.link_overruns() as f64));
        }
        self.gossip.metrics(&mut m);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::NotifyMode;
    use clap::ValueEnum;

    #[test]
    fn notify_mode_names_match_the_command_line_and_config_files() {
        for (name, mode) in [("notify-ack", NotifyMode::NotifyAck), ("barrier", NotifyMode::Barrier), ("none", NotifyMode::None)] {
            assert_eq!(NotifyMode::from_str(name, false), Ok(mode));
            assert_eq!(serde_json::to_string(&mode).unwrap(), format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<NotifyMode>(&format!("\"{name}\"")).unwrap(), mode);
        }
    }
}
