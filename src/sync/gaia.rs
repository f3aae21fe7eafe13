//! `--sync gaia`: groups of ranks as data centres (Gaia, Hsieh et al., NSDI'17, §3.3-4.4).
//! Inside a group the replicas are averaged every clock (BSP allreduce over the group's own
//! communicator: the LAN; or ASAP's stochastic reduce, `--gaia-inner asap`, below); between
//! groups only significant updates travel (Approximate Synchronous Parallel over the WAN).
//!
//! - **Groups** (`--groups`): consecutive blocks of ranks, one group per host, or a file mapping
//!   ranks to groups ([`parse_groups`]).
//! - **Mirror shards**: the parameter vector is split into P contiguous shards, P the size of the
//!   smallest group; the rank with local index i < P of every group is the mirror server of shard
//!   i, and talks only to the ranks with the same local index in the other groups (Gaia §3.2: a
//!   server mirrors the servers of the same parameters in other data centres).
//! - **A clock** (`sync(t)`): (1) the group averages its replicas; the group's update u is the
//!   average minus the model the clock started from; its contribution to the global model is
//!   s u with s = (ranks of the group) / (all ranks), so with every update exchanged the model is
//!   exactly what allreduce over all ranks computes (the tests check that at `--significance 0`);
//!   (2) each mirror server adds s u to its shard's accumulated update and sends the other groups
//!   only the entries whose significance |acc / value| exceeds V / sqrt(t) (the codec's
//!   [`Significance`] filter, sent as a [`sparse`] message); the rest stays accumulated
//!   (residuals), so nothing is lost; (3) it waits (serving) until every other
//!   group's updates of clocks <= t - DS have arrived (the mirror clock, [`MirrorClocks`]) and
//!   until the data of every selective barrier it has received are there; (4) the group sums what
//!   its mirror servers received into the model (a second allreduce over the group).
//! - **Selective barrier**: when a mirror server's previous updates have not left its link yet
//!   (the significant updates arrive faster than the WAN carries them), it first sends the
//!   indexes of the new significant updates as a small control message that is not queued behind
//!   the data; the receiver's group does not start its next clock before those values have
//!   arrived (our steps read every parameter of the replica, so blocking reads of those
//!   parameters is blocking the clock).
//! - **End**: every residual is sent (threshold 0), so every group ends with every update of
//!   every group; then the replicas are averaged over all ranks.
//!
//! - **`--gaia-inner asap`**: step (1) is [`StochasticReduce`] (`--sync asap`'s NOTIFY-ACK
//!   reduce, built by its own `build` on the group's communicator, `--graph` on the group's
//!   ranks) instead of the allreduce, so the group's replicas differ. The group's model is their
//!   mean, which the reduce keeps only on a graph with equal in- and out-degrees (checked; else
//!   refused). A mirror server's u is its own replica minus its own base: it differs from the
//!   mean's change by the change in how far its replica is from the mean, so summed over clocks
//!   the error telescopes to that distance now; it does not accumulate. At the end the group
//!   averages its bases exactly and each mirror server adds (mean - own base) of its shard to
//!   its residuals before the flush, so every group still ends with every group's exact update
//!   (`final_group_disagreement`; tested). Step (4) is not a collective either: a mirror server
//!   adds what it received to its replica and forwards it (TAG_FORWARD) to its group's other
//!   ranks, which add it to replica and base when it arrives (so it never counts as their own
//!   update); cuts and the end wait for every forward.
//!
//! - **Counts** (`--model lda`, [`Gaia::for_counts`]): step (1) sums the group's count deltas
//!   instead of averaging its replicas, and the group's sum enters the model unscaled (s = 1);
//!   the filter, the messages, the mirror clocks and the end's flush are the same, and the end
//!   leaves every replica holding the exact counts instead of averaging them.
//!
//! `--emulate-bandwidth` paces only the WAN messages here (the real set-up, `netlab/`, shapes
//! only the links between groups).

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::Context;
use mpi::topology::{Color, Communicator, Key, SimpleCommunicator};

use super::groups::OUTER_USES;
use super::gossip::{GossipSettings, NotifyMode, StochasticReduce};
use super::groups::GraphOptions;
use super::codec::significance::Significance;
use super::codec::{sparse, Sparsifier};
use super::ps::serve::serve_until;
use super::{average_replicas, ring_allreduce_bytes, Aggregate, CommStats, ModeMetric, ModeState, SyncContext, SyncMode};
use crate::comm::collectives;
use crate::comm::backoff::Backoff;
use crate::comm::grouplink::group_of;
use crate::comm::deadline::WaitDeadline;
use crate::comm::pace::{Fabric, Pacer};
use crate::comm::postbox::Postbox;

/// Options of `--sync gaia`.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "Gaia across data centres (--sync gaia)")]
pub struct GaiaOptions {
    /// Groups of ranks ("data centres"): G (consecutive blocks of ranks), host (one group per
    /// host name), auto (by host when the ranks run on several hosts, else 2 blocks), or a file
    /// of `RANK GROUP` lines (groups numbered from 0).
    #[arg(long, value_name = "G|host|auto|FILE", default_value = "auto")]
    pub groups: String,
    /// Initial significance threshold V (a fraction: 0.01 = 1 %): an accumulated update is sent
    /// to the other groups when |update / value| exceeds V / sqrt(t) at clock t. 0 sends every
    /// non-zero update.
    #[arg(long, value_name = "V", default_value_t = 0.01, value_parser = significance_value)]
    pub significance: f64,
    /// Clocks per step of the threshold's decay: at clock c the threshold is V / sqrt(t) with
    /// t = 1 + (c - 1) / N. 0 (the default): the clocks of one epoch, the paper's "iteration t of
    /// the ML algorithm" (a pass over the data in the parameter servers Gaia is built on); 1:
    /// every clock.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub significance_decay_every: u64,
    /// Soft significance threshold S (Gaia §4.4, "speed up convergence"): when this rank's link
    /// to the other groups is idle at the end of a clock (nothing of earlier clocks still queued
    /// or in flight), entries above S / sqrt(t) are sent too, best-effort; above V they are
    /// always sent. 0 (the default): off, the paper's "minimise WAN cost" goal. Must be below V.
    #[arg(long, value_name = "S", default_value_t = 0.0, value_parser = crate::values::finite_f64)]
    pub soft_significance: f64,
    /// Data-centre staleness DS (the mirror clock): a group starts clock t+1 only with every
    /// other group's significant updates of clocks <= t - DS. 0 makes the groups meet every clock.
    #[arg(long, value_name = "DS", default_value_t = 2)]
    pub dc_staleness: u64,
    /// Do not send selective barriers (the indexes of significant updates sent ahead of their
    /// values when the link is backlogged).
    #[arg(long)]
    pub no_selective_barrier: bool,
    /// How the replicas inside a group are averaged every clock: allreduce (MPI_Allreduce over
    /// the group: its replicas stay equal) or asap (ASAP's NOTIFY-ACK stochastic reduce over
    /// --graph built on each group's ranks, on the group's communicator; the graph must keep the
    /// group's mean: every rank the same in- and out-degree). See docs/gaia.md for what a group's
    /// update is then.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = GaiaInner::Allreduce)]
    pub gaia_inner: GaiaInner,
}

/// `--gaia-inner`: how a group averages its replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GaiaInner {
    /// MPI_Allreduce over the group every clock.
    Allreduce,
    /// ASAP's NOTIFY-ACK stochastic reduce on --graph among the group's ranks.
    Asap,
}

/// `--significance`: a finite fraction >= 0, at most 1e6 (its one check, where it is parsed).
fn significance_value(s: &str) -> Result<f64, String> {
    let v = crate::values::finite_f64(s)?;
    if (0.0..=1e6).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be a fraction >= 0 (0.01 = 1 %), at most 1e6, got {s}"))
    }
}

impl Default for GaiaOptions {
    fn default() -> Self {
        super::option_defaults()
    }
}

/// The significance threshold at decay step `t` (counting from 1): V / sqrt(t) (Gaia §3.4).
pub fn threshold(v: f64, t: u64) -> f64 {
    v / (t.max(1) as f64).sqrt()
}

/// The decay step of clock `clock` (counting from 1) when the threshold decays every `every`
/// clocks: 1 + (clock - 1) / every.
pub fn decay_step(clock: u64, every: u64) -> u64 {
    1 + clock.saturating_sub(1) / every.max(1)
}

/// Why a group may not start its next clock yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// The group's updates of clock `need` have not arrived (it has sent `have` clocks).
    MirrorClock { group: usize, have: u64, need: u64 },
    /// The group announced significant updates of clock `clock` by a selective barrier and their
    /// values have not arrived.
    Barrier { group: usize, clock: u64 },
}

/// What a mirror server knows of the other groups: the last clock whose updates arrived from
/// each, and the clocks each announced by a selective barrier whose values have not arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorClocks {
    me: usize,
    data: Vec<u64>,
    announced: Vec<Vec<u64>>,
}

impl MirrorClocks {
    /// `groups` groups, this one `me`, every group at clock `clock`.
    pub fn new(groups: usize, me: usize, clock: u64) -> Self {
        MirrorClocks { me, data: vec![clock; groups], announced: vec![Vec::new(); groups] }
    }

    /// The updates of `clock` from `group` arrived (they arrive in clock order).
    pub fn data(&mut self, group: usize, clock: u64) {
        debug_assert!(clock > self.data[group], "mirror data out of order");
        self.data[group] = clock;
        self.announced[group].retain(|&c| c > clock);
    }

    /// `group` announced significant updates of `clock`.
    pub fn barrier(&mut self, group: usize, clock: u64) {
        if clock > self.data[group] {
            self.announced[group].push(clock);
        }
    }

    /// What keeps this group from finishing clock `t` under data-centre staleness `ds`: every
    /// other group must have delivered clocks <= t - ds, and every announced clock <= t (a
    /// group ahead announcing a later clock blocks nobody until they get there).
    pub fn blocking(&self, t: u64, ds: u64) -> Vec<Blocked> {
        let need = t.saturating_sub(ds);
        let mut out = Vec::new();
        for g in (0..self.data.len()).filter(|&g| g != self.me) {
            if self.data[g] < need {
                out.push(Blocked::MirrorClock { group: g, have: self.data[g], need });
            } else if let Some(&clock) = self.announced[g].iter().filter(|&&c| c <= t).max() {
                out.push(Blocked::Barrier { group: g, clock });
            }
        }
        out
    }

    /// The slowest other group's clock (t itself with one group).
    pub fn slowest(&self, t: u64) -> u64 {
        (0..self.data.len()).filter(|&g| g != self.me).map(|g| self.data[g]).min().unwrap_or(t)
    }
}

/// The group of every rank, from `--groups`: a number G (consecutive, balanced blocks), `host`
/// (one group per distinct name in `hosts`, in order of first appearance), `auto` (host when
/// there are several, else 2 blocks, or 1 with one rank), or a file of `RANK GROUP` lines.
pub fn parse_groups(spec: &str, nranks: usize, hosts: &[String]) -> anyhow::Result<Vec<usize>> {
    // the same blocks as the emulated cluster's --emulate-groups (one rule for both)
    let blocks = |g: usize| (0..nranks).map(|r| group_of(r, nranks, g)).collect::<Vec<_>>();
    let by_host = || {
        let mut names: Vec<&String> = Vec::new();
        hosts
            .iter()
            .map(|h| match names.iter().position(|n| *n == h) {
                Some(i) => i,
                None => {
                    names.push(h);
                    names.len() - 1
                }
            })
            .collect::<Vec<_>>()
    };
    let distinct_hosts = by_host().into_iter().max().map_or(0, |m| m + 1);
    match spec {
        "auto" if distinct_hosts > 1 => Ok(by_host()),
        "auto" => Ok(blocks(nranks.min(2))),
        "host" => Ok(by_host()),
        _ if spec.parse::<i64>().is_ok() => {
            let g: i64 = spec.parse().expect("checked");
            anyhow::ensure!(g >= 1 && g as usize <= nranks, "--groups {g}: the number of groups must be between 1 and the number of ranks ({nranks})");
            Ok(blocks(g as usize))
        }
        path => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--groups {path:?} is neither a number, host nor auto, and cannot be read as a group file"))?;
            let mut of = vec![None; nranks];
            for (i, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    continue;
                }
                let bad = || anyhow::anyhow!("{path}:{}: expected `RANK GROUP` (two whole numbers), got {line:?}", i + 1);
                let mut it = line.split_whitespace();
                let (Some(r), Some(g), None) = (it.next(), it.next(), it.next()) else { return Err(bad()) };
                let (r, g): (usize, usize) = (r.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?);
                anyhow::ensure!(r < nranks, "{path}:{}: rank {r} does not exist (the job has {nranks} ranks)", i + 1);
                anyhow::ensure!(of[r].is_none(), "{path}:{}: rank {r} is given a group twice", i + 1);
                of[r] = Some(g);
            }
            let missing: Vec<usize> = (0..nranks).filter(|&r| of[r].is_none()).collect();
            anyhow::ensure!(missing.is_empty(), "{path}: no group for rank(s) {missing:?}");
            let of: Vec<usize> = of.into_iter().map(|g| g.expect("checked")).collect();
            let g = of.iter().max().expect("nranks >= 1") + 1;
            let empty: Vec<usize> = (0..g).filter(|k| !of.contains(k)).collect();
            anyhow::ensure!(empty.is_empty(), "{path}: groups are numbered 0..{}, but group(s) {empty:?} have no rank", g - 1);
            Ok(of)
        }
    }
}

/// Mirror data: the significant entries of the shard's accumulated update, a [`sparse`] message
/// stamped with its clock (indexes within the shard).
const TAG_DATA: i32 = 21;
/// Selective barrier: the indexes of a clock's significant entries, a [`sparse`] index-only
/// message stamped with the clock.
const TAG_BARRIER: i32 = 22;
/// `--gaia-inner asap`: what a mirror server received, forwarded to its group's other ranks; a
/// data message whose clock is the sender's count of merges.
const TAG_FORWARD: i32 = 23;

/// `--gaia-inner asap`: how the other groups' updates reach every rank of the group without a
/// collective: each mirror server adds what it received to its own replica and forwards it to
/// the group's other ranks, which add it when it arrives (to their replica and their base, so it
/// never counts as their own update).
struct Forwards {
    /// Over the group's communicator.
    postbox: Postbox,
    /// Merges this rank has done; every mirror server of the group sends one forward per merge.
    merges: u64,
    /// Forwards received from each mirror server (by local index).
    received: Vec<u64>,
    /// The shard of each mirror server (by local index).
    shards: Vec<Range<usize>>,
}

impl Forwards {
    /// Adds every forward that has arrived into `params` and `base`.
    fn take(&mut self, params: &mut [f32], base: &mut [f32]) -> anyhow::Result<()> {
        while let Some((src, b)) = self.postbox.try_receive(TAG_FORWARD) {
            let sh = self.shards.get(src).cloned().ok_or_else(|| anyhow::anyhow!("gaia: a forward from group rank {src}, which mirrors no shard"))?;
            sparse::check(&b, sh.len()).with_context(|| format!("a gaia forward from group rank {src}"))?;
            sparse::add(&b, &mut params[sh.clone()])?;
            sparse::add(&b, &mut base[sh])?;
            self.received[src] += 1;
        }
        self.postbox.progress_sends()?;
        Ok(())
    }

    /// The mirror servers whose forwards of every merge so far have not all arrived.
    fn missing(&self, me: usize) -> Vec<usize> {
        (0..self.shards.len()).filter(|&k| k != me && self.received[k] < self.merges).collect()
    }
}

/// This rank's part in the exchange between groups (ranks with local index < P).
struct Mirror {
    /// One rank per group (its rank = the group), all with this rank's local index.
    postbox: Postbox,
    /// The parameters this rank mirrors.
    shard: Range<usize>,
    /// Accumulated update not sent yet (the residuals), over `shard`.
    acc: Vec<f32>,
    /// Updates received from other groups and not yet summed into the model, over `shard`.
    incoming: Vec<f32>,
    clocks: MirrorClocks,
    /// `--emulate-bandwidth`: data messages wait here until the link would have sent them.
    pacer: Option<Pacer>,
    /// The pacer's rank (the world's) of each mirror rank (a group's).
    world: Vec<usize>,
    /// Paced data not handed to MPI yet: (due, clock, dest, bytes).
    held: VecDeque<(Instant, u64, usize, Vec<u8>)>,
    /// Data of clocks after the current one (from groups ahead of this one): (clock, group,
    /// message), summed in when this group reaches that clock.
    early: Vec<(u64, usize, Vec<u8>)>,
}

/// Counters of the mode (this rank's).
#[derive(Clone, Debug, Default)]
struct Counts {
    updates: u64,
    significant: u64,
    wan_bytes: u64,
    lan_bytes: u64,
    barriers_sent: u64,
    barriers_received: u64,
    mirror_wait: f64,
    barrier_wait: f64,
    lag_max: u64,
    final_disagreement: f64,
    /// Gaia §3.3's study, on this rank's own updates: per clock and parameter with a non-zero
    /// update, the change it makes to the global model (its update / the number of ranks, as a
    /// parameter server summing the workers' updates would apply it) against the value; how
    /// many are below 1 % and 5 % of it (fixed thresholds, no decay, as in the paper's Figure 5).
    worker_updates: u64,
    worker_below_1pct: u64,
    worker_below_5pct: u64,
    /// Entries sent only because they passed the soft threshold on an idle link.
    soft_sent: u64,
    /// `--gaia-inner asap`: the largest |group mean - own replica| the end's correction added
    /// to this mirror server's residuals (0 where the group's replicas agreed).
    inner_correction: f64,
    /// Per clock, the accumulated entries the filter kept back (non-zero after it ran), summed
    /// over clocks; and the entries the end's flush sent (reported for `--model lda`).
    held: u64,
    flushed: u64,
}

/// Groups averaging inside, exchanging significant updates between (see the module docs).
pub struct Gaia {
    opts: GaiaOptions,
    world: SimpleCommunicator,
    local: SimpleCommunicator,
    group: usize,
    local_index: usize,
    groups: usize,
    group_sizes: Vec<usize>,
    /// World rank of local index i in group g: `members[g][i]`.
    members: Vec<Vec<usize>>,
    mirror: Option<Mirror>,
    /// The group's model at the start of the clock (equal on every rank of the group).
    base: Vec<f32>,
    scratch: Vec<f32>,
    sum: Vec<f32>,
    stats: CommStats,
    counts: Counts,
    wait_timeout: Duration,
    /// Clocks done.
    clock: u64,
    /// Clocks per decay step of the threshold.
    decay_every: u64,
    /// `--gaia-inner asap`: the stochastic reduce among the group's ranks (None: allreduce).
    inner: Option<StochasticReduce>,
    /// `--gaia-inner asap`: the other groups' updates passed on inside the group.
    forwards: Option<Forwards>,
    /// `--model lda` ([`Gaia::for_counts`]): the replicas hold counts, so a group sums its
    /// ranks' deltas (each token counted once) instead of averaging replicas, and its update
    /// enters the global model unscaled.
    sums: bool,
}

impl Gaia {
    /// Collective over the world: splits it into groups and mirror communicators. Returns the
    /// mode and what the metrics' start line records about it.
    pub fn build(ctx: &SyncContext, opts: &GaiaOptions, graph: &GraphOptions, init: &[f32]) -> anyhow::Result<(Self, serde_json::Value)> {
        let world = ctx.comm.duplicate();
        let n = world.size() as usize;
        let rank = world.rank() as usize;
        // Every rank learns every rank's host name (for --groups host/auto).
        let me = mpi::environment::processor_name().unwrap_or_default();
        let mut name = [0u8; 256];
        let len = me.len().min(256);
        name[..len].copy_from_slice(&me.as_bytes()[..len]);
        let mut all = collectives::gather(&world, 0, &name[..]);
        all.resize(256 * n, 0);
        collectives::broadcast(&world, 0, &mut all);
        let hosts: Vec<String> =
            all.chunks(256).map(|c| String::from_utf8_lossy(c).trim_end_matches('\0').to_string()).collect();
        let of = collectives::agree(&world, parse_groups(&opts.groups, n, &hosts))?;
        let groups = of.iter().max().expect("ranks") + 1;
        let mut members = vec![Vec::new(); groups];
        for (r, &g) in of.iter().enumerate() {
            members[g].push(r);
        }
        let group = of[rank];
        let local_index = members[group].iter().position(|&r| r == rank).expect("in its group");
        let local = world.split_by_color_with_key(Color::with_value(group as i32), Key::from(rank as i32)).expect("every rank has a group");
        let group_sizes: Vec<usize> = members.iter().map(|m| m.len()).collect();
        let p = *group_sizes.iter().min().expect("groups");
        let len = init.len();
        let shard = |i: usize| (i * len / p)..((i + 1) * len / p);
        let color = if local_index < p { Color::with_value(local_index as i32) } else { Color::undefined() };
        let mirror_comm = world.split_by_color_with_key(color, Key::from(group as i32));
        // On a TCP fabric the mirror's inbound link, so that what comes in while it sends moves
        // at the two-way share (`Ingress::deliver_beside`); the ideal pipe's tables were
        // measured without one (one mirror sends to each, already at the path's rate).
        let tcp = ctx.links.as_ref().is_some_and(|l| l.fabric == Fabric::Tcp);
        let ingress = ctx.ingress().filter(|_| tcp);
        let mirror = mirror_comm.map(|c| {
            debug_assert_eq!(c.rank() as usize, group);
            let s = shard(local_index);
            Mirror {
                postbox: Postbox::new(&c).with_ingress(ingress),
                acc: vec![0.0; s.len()],
                incoming: vec![0.0; s.len()],
                shard: s,
                clocks: MirrorClocks::new(groups, group, 0),
                pacer: ctx.pacer(None),
                world: members.iter().map(|m| m[local_index]).collect(),
                held: VecDeque::new(),
                early: Vec::new(),
            }
        });
        let inner = match opts.gaia_inner {
            GaiaInner::Allreduce => Ok(None),
            GaiaInner::Asap => build_inner(ctx, &local, graph, init).map(Some).with_context(|| {
                format!("--gaia-inner asap: group {group} ({} ranks: {:?})", members[group].len(), members[group])
            }),
        };
        let inner = collectives::agree(&world, inner)?;
        let mut info = serde_json::json!({
            "gaia_inner": opts.gaia_inner,
            "groups": members, "mirror_shards": p, "significance": opts.significance, "soft_significance": opts.soft_significance,
            "dc_staleness": opts.dc_staleness, "selective_barrier": !opts.no_selective_barrier,
            "significance_decay_every": if opts.significance_decay_every == 0 { ctx.rounds_per_epoch.max(1) } else { opts.significance_decay_every },
        });
        if let Some((_, i)) = &inner {
            info["inner"] = i.clone();
        }
        if rank == 0 {
            let sizes: Vec<String> = group_sizes.iter().map(|s| s.to_string()).collect();
            eprintln!(
                "asap-train: gaia: {groups} group(s) of {} ranks ({} inside); {p} mirror shard(s) per group",
                sizes.join(", "),
                if inner.is_some() { "asap" } else { "allreduce" }
            );
        }
        let forwards = inner.as_ref().map(|_| Forwards {
            postbox: Postbox::new(&local),
            merges: 0,
            received: vec![0; p],
            shards: (0..p).map(shard).collect(),
        });
        let mode = Gaia {
            opts: opts.clone(),
            world,
            local,
            group,
            local_index,
            groups,
            group_sizes,
            members,
            mirror,
            base: init.to_vec(),
            scratch: Vec::new(),
            sum: vec![0.0; len],
            stats: CommStats::default(),
            counts: Counts::default(),
            wait_timeout: ctx.wait_timeout,
            clock: 0,
            decay_every: if opts.significance_decay_every == 0 { ctx.rounds_per_epoch.max(1) } else { opts.significance_decay_every },
            forwards,
            inner: inner.map(|(r, _)| r),
            sums: false,
        };
        Ok((mode, info))
    }

    /// The mode for count replicas (`--model lda`): a group sums its ranks' count deltas every
    /// clock (as `DeltaSum` does over all ranks) and its mirror servers send the other groups
    /// the accumulated deltas that pass the significance filter, cell by cell (|delta| / |count|
    /// above V / sqrt(t)); the rest stays in the residuals until it passes or the end flushes
    /// it, so every replica ends with the exact global counts. Collective over the world.
    pub fn for_counts(ctx: &SyncContext, opts: &GaiaOptions, graph: &GraphOptions, init: &[f32]) -> anyhow::Result<Self> {
        anyhow::ensure!(
            opts.gaia_inner == GaiaInner::Allreduce,
            "--gaia-inner asap with --model lda: ASAP's stochastic reduce averages replicas, which counts no token exactly once; use --gaia-inner allreduce (the default)"
        );
        let (mut mode, _) = Self::build(ctx, opts, graph, init)?;
        mode.sums = true;
        Ok(mode)
    }

    /// Averages the group's replicas (step (1) of a clock); returns the factor that turns the
    /// result into the average (1/n after a sum, 1 after the stochastic reduce).
    fn group_average(&mut self, params: &mut [f32], t: u64) -> anyhow::Result<f32> {
        let Some(r) = self.inner.as_mut() else {
            self.group_allreduce(params)?;
            return Ok(1.0 / self.local.size() as f32);
        };
        let before = r.stats().clone();
        r.sync(params, t)?;
        let after = r.stats();
        // Asap's bytes are the LAN's. The caller counts the step's time as communication; the
        // part asap knew it was waiting (NOTIFY, ACK) moves to waiting.
        self.counts.lan_bytes += after.bytes_sent - before.bytes_sent;
        let waited = after.wait_seconds - before.wait_seconds;
        self.stats.wait_seconds += waited;
        self.stats.comm_seconds -= waited;
        Ok(1.0)
    }

    /// Step (1) for SGD: the group's average and its update u (the average minus the base),
    /// which enters the global model as s u (see the module docs). Under `--gaia-inner asap` the
    /// "average" is this rank's replica after the stochastic reduce, and a mirror server's update
    /// is its own replica's change. Returns the mirror shard's non-zero updates.
    fn average_group(&mut self, params: &mut [f32], t: u64) -> anyhow::Result<u64> {
        let inv = self.group_average(params, t)?;
        let s = self.group_sizes[self.group] as f32 / self.world.size() as f32;
        let shard = self.mirror.as_ref().map_or(0..0, |m| m.shard.clone());
        let mut updates = 0;
        for (j, (w, b)) in params.iter_mut().zip(&self.base).enumerate() {
            let u = *w * inv - b;
            *w = b + s * u;
            if shard.contains(&j) && u != 0.0 {
                updates += 1;
                let m = self.mirror.as_mut().expect("a shard");
                m.acc[j - shard.start] += s * u;
            }
        }
        Ok(updates)
    }

    /// Step (1) for counts: the group sums its ranks' deltas (replica minus base) and every
    /// replica of the group becomes base + that sum; the mirror servers accumulate the sum. All
    /// in f32 and exact: the deltas and counts are integers, and the LDA driver checks that no
    /// count reaches 2^24. Returns the mirror shard's non-zero updates.
    fn sum_group_deltas(&mut self, params: &mut [f32]) -> anyhow::Result<u64> {
        let mut d = std::mem::take(&mut self.sum);
        d.iter_mut().zip(params.iter().zip(&self.base)).for_each(|(d, (w, b))| *d = w - b);
        self.group_allreduce(&mut d)?;
        let shard = self.mirror.as_ref().map_or(0..0, |m| m.shard.clone());
        let mut updates = 0;
        for (j, ((w, b), &u)) in params.iter_mut().zip(&self.base).zip(&d).enumerate() {
            *w = b + u;
            if shard.contains(&j) && u != 0.0 {
                updates += 1;
                let m = self.mirror.as_mut().expect("a shard");
                m.acc[j - shard.start] += u;
            }
        }
        self.sum = d;
        Ok(updates)
    }

    /// The group's sum, in place. While it is in flight this rank keeps releasing its paced
    /// mirror data as they come due: a receiver may be blocked on them (a selective barrier
    /// announces a clock newer than the mirror clock guarantees) while its group's other ranks
    /// wait for it in their own collective. Released only at this rank's next exchange, that
    /// was a deadlock: 8 ranks, 2 groups, MLR, a clock = 29 steps of 9.16 ms, 10 Mbit/s and
    /// 500 ms one way, hung at clock 5 with ranks 1-3 in this allreduce behind rank 0, which
    /// waited for rank 4's data, rank 4 in its group's allreduce behind ranks 5-7, which waited
    /// for ranks 1-3's announced values (tests/gaia.rs: `paced_data_flow_during_group_allreduce`).
    fn group_allreduce(&mut self, v: &mut [f32]) -> anyhow::Result<()> {
        let mut failed = None;
        let mirror = &mut self.mirror;
        let mut serve = || {
            if let (None, Some(m)) = (&failed, mirror.as_mut()) {
                failed = release_due(m).err();
            }
        };
        collectives::sum_f32_serving(&self.local, v, &mut self.scratch, &mut serve);
        let b = ring_allreduce_bytes(self.local.size() as usize, v.len());
        self.counts.lan_bytes += b;
        self.stats.bytes_sent += b;
        self.stats.bytes_received += b;
        failed.map_or(Ok(()), Err)
    }

    /// The mirror server's side of clock `t`: filter with `thr` and send (None: send nothing),
    /// then wait until the mirror clock (staleness `ds`) and the selective barriers allow the
    /// clock to end.
    fn exchange(&mut self, params: &[f32], t: u64, thr: Option<f64>, ds: u64) -> anyhow::Result<()> {
        let groups = self.groups;
        let me = self.group;
        let barriers = !self.opts.no_selective_barrier;
        let Some(m) = self.mirror.as_mut() else { return Ok(()) };
        let mut sig = Vec::new();
        if let Some(thr) = thr {
            Significance { reference: &params[m.shard.clone()], threshold: thr }.select(&mut m.acc, &mut sig);
            self.counts.significant += sig.len() as u64;
            self.counts.held += m.acc.iter().filter(|a| **a != 0.0).count() as u64;
        }
        if groups > 1 && thr.is_some() {
            let tc = Instant::now();
            release_due(m)?;
            // Backlogged link: the values of this clock will be late; announce their indexes
            // first, ahead of the queued data (a control message is never paced). Backlog is
            // data still queued for the link's rate (its last byte not yet out), not data
            // whose last byte is out and that only travels the latency: for those a barrier
            // arrives no earlier than the values would on the real link, and it blocked the
            // receiver at every clock >= the announced one, which undid the mirror clock's DS.
            // Measured (benches/claim-gaia.md): 8 ranks, 2 groups, MLR, a clock 27.5 ms, 100
            // Mbit/s and 50 ms, dilated x10: barriers at 221 of 296 rank-clocks while the WAN
            // carried 3.8 MB in 17.3 s (under 18 % of one rank's link), 0.47 s a clock against
            // 0.29 s for allreduce on a LAN.
            // With --emulate-bandwidth the pacer is the link: MPI moves a message only once the
            // emulated link has delivered it, so an MPI send still pending then (a rendezvous
            // waiting for the receiver to poll) is no WAN backlog. On a real link (netlab) the
            // pending MPI sends are the backlog.
            let now = Instant::now();
            let pending = m.postbox.progress_sends()?;
            let backlogged = match m.pacer.as_ref() {
                Some(p) => m.held.iter().any(|h| h.0 > now + p.latency_to(self.members[h.2][self.local_index])),
                None => pending > 0,
            };
            // §4.4's soft threshold: an idle link also carries what passes S / sqrt(t).
            let soft = thr.map_or(0.0, |h| h * self.opts.soft_significance / self.opts.significance.max(f64::MIN_POSITIVE));
            if !backlogged && soft > 0.0 {
                let before = sig.len();
                Significance { reference: &params[m.shard.clone()], threshold: soft }.select(&mut m.acc, &mut sig);
                self.counts.soft_sent += (sig.len() - before) as u64;
            }
            if barriers && backlogged && !sig.is_empty() {
                let msg = sparse::encode_indexes(t, &sig);
                for g in (0..groups).filter(|&g| g != me) {
                    m.postbox.send(g, TAG_BARRIER, msg.clone())?;
                }
                self.counts.barriers_sent += 1;
            }
            let data = sparse::encode(t, &sig, m.acc.len());
            for g in (0..groups).filter(|&g| g != me) {
                match m.pacer.as_mut() {
                    Some(p) => {
                        // Its path (a TCP window per pair) and any --emulate-groups link.
                        let dest = self.members[g][self.local_index];
                        let (_, end) = p.reserve_to(dest, data.len() as u64);
                        m.held.push_back((end + p.latency_to(dest), t, g, data.clone()));
                    }
                    None => m.postbox.send(g, TAG_DATA, data.clone())?,
                }
            }
            release_due(m)?;
            self.stats.comm_seconds += tc.elapsed().as_secs_f64();
        }
        // Wait: the mirror clock and the barriers; and our own data older than DS clocks must be
        // on its way (a receiver waits for it, possibly while we sit in a collective).
        let start = Instant::now();
        let mut backoff = Backoff::default();
        let mut barrier_blocked = 0.0;
        // Past --wait-timeout the sign-of-life board judges the wait (comm::deadline); its
        // verdict is given with what is still blocked once the wait was served meanwhile.
        let mut deadline = WaitDeadline::new(self.wait_timeout);
        let mut verdict: Option<String> = None;
        loop {
            let t0 = Instant::now();
            serve_mirror(m, &mut self.counts, t)?;
            let blocked = m.clocks.blocking(t, ds);
            let own_late = m.held.front().is_some_and(|h| h.1 + ds <= t);
            if blocked.is_empty() && !own_late {
                break;
            }
            if blocked.iter().all(|b| matches!(b, Blocked::Barrier { .. })) && !blocked.is_empty() {
                barrier_blocked += t0.elapsed().as_secs_f64();
            }
            if let Some(why) = verdict {
                let who: Vec<String> = blocked
                    .iter()
                    .map(|b| match *b {
                        Blocked::MirrorClock { group, have, need } => format!(
                            "group {group} (its mirror, rank {}) has delivered clock {have}, clock {need} is needed",
                            self.members[group][self.local_index]
                        ),
                        Blocked::Barrier { group, clock } => format!("group {group} announced clock {clock} by a selective barrier, its values never came"),
                    })
                    .collect();
                anyhow::bail!(
                    "gaia: waited {:.1} s (--wait-timeout) at clock {t} for other data centres: {}{}: {why}",
                    start.elapsed().as_secs_f64(),
                    if who.is_empty() { "none".to_string() } else { who.join("; ") },
                    if own_late { "; and this rank's own updates are still queued on its link" } else { "" }
                );
            }
            let mut failed = None;
            verdict = deadline.check(|| {
                if failed.is_none() {
                    failed = serve_mirror(m, &mut self.counts, t).err();
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            backoff.pause();
        }
        let waited = start.elapsed().as_secs_f64();
        self.counts.mirror_wait += waited;
        self.counts.barrier_wait += barrier_blocked;
        self.stats.wait_seconds += waited;
        self.counts.lag_max = self.counts.lag_max.max(t.saturating_sub(m.clocks.slowest(t)));
        self.counts.wan_bytes = m.postbox.bytes_sent();
        Ok(())
    }

    /// `--gaia-inner asap`, at the end (collective over the group): drains the stochastic
    /// reduce, averages the group's bases (the models its mirror servers' updates were taken
    /// from) exactly, and adds to each mirror server's residuals what its replica's view of its
    /// shard still differs from that mean, so the flush that follows makes the updates the other
    /// groups received sum exactly to the group's mean update. Every replica of the group then
    /// holds the mean (plus its own steps after the last clock, if any).
    fn settle_inner(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        if self.inner.is_none() {
            return Ok(());
        }
        // Every replica must hold the same updates of the other groups before the mean is taken.
        self.await_forwards(params)?;
        let r = self.inner.as_mut().expect("checked");
        let mut mean = self.base.clone();
        let before = r.stats().clone();
        r.finish(&mut mean)?;
        let after = r.stats();
        self.counts.lan_bytes += after.bytes_sent - before.bytes_sent + after.final_bytes - before.final_bytes;
        if let Some(m) = self.mirror.as_mut() {
            let sh = m.shard.clone();
            for ((a, &mu), &b) in m.acc.iter_mut().zip(&mean[sh.clone()]).zip(&self.base[sh]) {
                *a += mu - b;
                self.counts.inner_correction = self.counts.inner_correction.max((mu - b).abs() as f64);
            }
        }
        for ((w, &mu), b) in params.iter_mut().zip(&mean).zip(self.base.iter_mut()) {
            *w = mu + (*w - *b);
            *b = mu;
        }
        Ok(())
    }

    /// Sums what the group's mirror servers received into `params`: an allreduce over the group,
    /// or, with asap inside, this rank's own at once and the others' forwards as they arrive.
    fn merge_incoming(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        if let Some(f) = self.forwards.as_mut() {
            // Asap inside: no collective. This rank's own received updates at once, then forwarded;
            // the other mirror servers' as their forwards arrive.
            f.merges += 1;
            if let Some(m) = self.mirror.as_mut() {
                let sig: Vec<(u32, f32)> =
                    m.incoming.iter().enumerate().filter(|(_, x)| **x != 0.0).map(|(j, &x)| (j as u32, x)).collect();
                params[m.shard.clone()].iter_mut().zip(&m.incoming).for_each(|(w, d)| *w += d);
                let msg = sparse::encode(f.merges, &sig, m.incoming.len());
                for j in (0..self.local.size() as usize).filter(|&j| j != self.local_index) {
                    self.counts.lan_bytes += msg.len() as u64;
                    f.postbox.send(j, TAG_FORWARD, msg.clone())?;
                }
                m.incoming.iter_mut().for_each(|x| *x = 0.0);
            }
            self.base.copy_from_slice(params);
            return f.take(params, &mut self.base);
        }
        self.sum.iter_mut().for_each(|x| *x = 0.0);
        if let Some(m) = self.mirror.as_mut() {
            self.sum[m.shard.clone()].copy_from_slice(&m.incoming);
            m.incoming.iter_mut().for_each(|x| *x = 0.0);
        }
        let mut sum = std::mem::take(&mut self.sum);
        self.group_allreduce(&mut sum)?;
        params.iter_mut().zip(&sum).for_each(|(w, d)| *w += d);
        self.sum = sum;
        self.base.copy_from_slice(params);
        Ok(())
    }

    /// `--gaia-inner asap`: waits until the forwards of every merge so far have arrived from
    /// every mirror server of the group and adds them (at a cut and at the end, when every rank
    /// of the group has done the same merges).
    fn await_forwards(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        if self.forwards.is_none() {
            return Ok(());
        }
        fn forwards(g: &Gaia) -> &Forwards {
            g.forwards.as_ref().expect("checked above")
        }
        let limit = self.wait_timeout;
        let serve = |g: &mut Gaia| g.forwards.as_mut().expect("checked above").take(params, &mut g.base);
        let waited = serve_until(self, limit, Backoff::default(), serve, |g| forwards(g).missing(g.local_index).is_empty(), |g, waited, why| {
            let missing = forwards(g).missing(g.local_index);
            anyhow::anyhow!(
                "gaia: waited {:.1} s (--wait-timeout) for the forwarded updates of merge {} from the group's mirror servers {:?} (ranks {:?}): {why}",
                waited.as_secs_f64(),
                forwards(g).merges,
                missing,
                missing.iter().map(|&k| g.members[g.group][k]).collect::<Vec<_>>()
            )
        })?;
        self.stats.wait_seconds += waited.as_secs_f64();
        Ok(())
    }

    fn wan_received(&self) -> u64 {
        self.mirror.as_ref().map_or(0, |m| m.postbox.bytes_received())
    }

    /// Every update of clocks <= `t` delivered and summed in (collective, at the same `t` on
    /// every rank); with `thr` = 0 the residuals are sent first.
    fn cut(&mut self, params: &mut [f32], t: u64, flush_residuals: bool) -> anyhow::Result<()> {
        if flush_residuals {
            // One more message per pair, at the clock after the last: the residuals.
            self.exchange(params, t + 1, Some(0.0), 0)?;
        } else {
            self.exchange(params, t, None, 0)?;
        }
        if let Some(m) = self.mirror.as_mut() {
            let tw = Instant::now();
            let mut backoff = Backoff::default();
            let mut deadline = WaitDeadline::new(self.wait_timeout);
            while !m.held.is_empty() || m.postbox.progress_sends()? > 0 {
                serve_mirror(m, &mut self.counts, t)?;
                let mut failed = None;
                let verdict = deadline.check(|| {
                    if failed.is_none() {
                        failed = serve_mirror(m, &mut self.counts, t).err();
                    }
                });
                if let Some(e) = failed {
                    return Err(e);
                }
                let undelivered = !m.held.is_empty() || m.postbox.progress_sends()? > 0;
                if let Some(why) = verdict.filter(|_| undelivered) {
                    anyhow::bail!("gaia: this rank's updates to the other groups were not delivered within {:.1} s (--wait-timeout): {why}", tw.elapsed().as_secs_f64());
                }
                backoff.pause();
            }
            self.stats.wait_seconds += tw.elapsed().as_secs_f64();
        }
        self.merge_incoming(params)?;
        self.await_forwards(params)?;
        self.stats.bytes_sent = self.counts.lan_bytes + self.counts.wan_bytes;
        Ok(())
    }
}

/// `--gaia-inner asap`: the stochastic reduce on the group's communicator `local`, built as
/// `--sync asap` builds it, over the group's ranks: NOTIFY-ACK only (a clock's update needs
/// every in-neighbour's model of that clock), unpaced (only the WAN is emulated), and on a graph
/// whose averaging keeps the group's mean (else the group's update would not be the sum of its
/// ranks' steps; see docs/gaia.md). Returns the mode and its start-line report.
fn build_inner(
    ctx: &SyncContext,
    local: &SimpleCommunicator,
    graph: &GraphOptions,
    init: &[f32],
) -> anyhow::Result<(StochasticReduce, serde_json::Value)> {
    // NOTIFY-ACK without overlap: a clock's group update needs every in-neighbour's model of it
    // (asap's --notify and --overlap do not apply to gaia: its declaration does not list them).
    // Inside a group (a data centre's LAN) `--transport` as under --sync asap, auto deciding by
    // the group's own hosts.
    let settings =
        GossipSettings { graph: &graph.graph, notify: NotifyMode::NotifyAck, overlap: false, deadline_ms: 0.0, transport: graph.transport };
    let inner_ctx = ctx.on_group(local);
    // Every rank of a group builds the same graph, so the group fails or succeeds as one (and
    // drops the mailboxes together when the check below refuses the graph).
    let (mode, info) = StochasticReduce::build(&inner_ctx, &settings, init, None, None, 0)?;
    let r = &info["report"];
    let deg = |k: &str| r[k].as_u64().unwrap_or(0);
    anyhow::ensure!(
        r["doubly_stochastic"].as_bool() == Some(true),
        "--graph {} on {} ranks averages with unequal weights (in-degrees {}..{}, out-degrees {}..{}), so it would not keep the group's mean and the group's update would not be its ranks' steps; use a graph where every rank has the same in- and out-degree (ring, complete, root-expander, exponential, hypercube, torus, random:D)",
        graph.graph,
        local.size(),
        deg("min_in_degree"),
        deg("max_in_degree"),
        deg("min_out_degree"),
        deg("max_out_degree")
    );
    Ok((mode, info))
}

/// Hands the paced data whose time has come to MPI.
/// Serves the mirror link while a mirror server waits: takes what arrived, hands due messages to
/// MPI and completes sends.
fn serve_mirror(m: &mut Mirror, counts: &mut Counts, t: u64) -> anyhow::Result<()> {
    receive(m, counts, t)?;
    release_due(m)?;
    m.postbox.progress_sends()?;
    Ok(())
}

fn release_due(m: &mut Mirror) -> anyhow::Result<()> {
    let now = Instant::now();
    while m.held.front().is_some_and(|h| h.0 <= now) {
        let (_, _, dest, buf) = m.held.pop_front().expect("checked");
        m.postbox.send(dest, TAG_DATA, buf)?;
    }
    Ok(())
}

/// Takes every waiting mirror message: barriers into the clocks; data of clocks <= `t` into
/// `incoming` and the clocks, later ones kept until this group reaches their clock (so at
/// `--dc-staleness 0` every group sums the same updates at the same clock).
///
/// Data first, then barriers: a sender sends a clock's barrier before its data, and MPI matches
/// one sender's messages in the order sent, so once a clock's data is taken its barrier can be
/// taken too, in the same call. Barriers first left a window: a barrier and its data that
/// arrived between the two loops gave the data and not the barrier. A cut then ended on the
/// data, and the barrier stayed in MPI, never received, until the next exchange; a barrier of
/// more than Open MPI's eager limit (4 KiB, some 1,000 indexes) is a rendezvous, so its sender
/// sat in the cut's wait for its own sends while the receiver sat in the checkpoint's collective
/// (a deadlock). Found under load 6-13: the first job of tests/gaia.rs
/// `asap_inside_resumes_and_still_ends_with_equal_copies` (6 ranks, 2 groups, --gaia-inner asap)
/// hung in 2 of 45 runs at a checkpoint's cut; gdb showed rank 3 in `Gaia::cut`'s wait for its
/// own sends to group 0 (data or barriers, the only mirror messages; its data had all been
/// taken, or group 0 would not have left the cut), ranks 4-5 in `await_forwards` behind it and
/// ranks 0-2 in the checkpoint's collectives, for minutes.
fn receive(m: &mut Mirror, counts: &mut Counts, t: u64) -> anyhow::Result<()> {
    while let Some((g, b)) = m.postbox.try_receive_beside(TAG_DATA, m.pacer.as_ref(), &m.world) {
        let (clock, _) = sparse::header(&b)?;
        sparse::check(&b, m.incoming.len()).with_context(|| format!("a gaia data message from group {g}"))?;
        m.early.push((clock, g, b));
    }
    while let Some((g, b)) = m.postbox.try_receive_beside(TAG_BARRIER, m.pacer.as_ref(), &m.world) {
        let (clock, _) = sparse::header(&b)?;
        m.clocks.barrier(g, clock);
        counts.barriers_received += 1;
    }
    // Messages of one group arrive in clock order; apply in that order.
    let mut i = 0;
    while i < m.early.len() {
        if m.early[i].0 > t {
            i += 1;
            continue;
        }
        let (clock, g, b) = m.early.remove(i);
        sparse::add(&b, &mut m.incoming).with_context(|| format!("a gaia data message from group {g}"))?;
        m.clocks.data(g, clock);
    }
    Ok(())
}

impl SyncMode for Gaia {
    fn name(&self) -> &'static str {
        "gaia"
    }

    fn lockstep(&self) -> bool {
        false
    }

    fn round_lead(&self) -> u64 {
        self.opts.dc_staleness + 1
    }

    fn sync(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let t = round;
        let tc = Instant::now();
        // §3.3's study of this rank's own updates (before they are averaged into the group's).
        // Summed counts enter the global model as they are, not divided among the ranks.
        let n = if self.sums { 1.0 } else { self.world.size() as f32 };
        let c = &mut self.counts;
        for (w, b) in params.iter().zip(&self.base) {
            let d = ((w - b) / n).abs();
            if d != 0.0 {
                c.worker_updates += 1;
                c.worker_below_1pct += (d < 0.01 * b.abs()) as u64;
                c.worker_below_5pct += (d < 0.05 * b.abs()) as u64;
            }
        }
        // (1) the group's update (its average's, or for counts its summed deltas).
        self.counts.updates += if self.sums { self.sum_group_deltas(params)? } else { self.average_group(params, t)? };
        self.stats.comm_seconds += tc.elapsed().as_secs_f64();
        // (2)-(3) filter, send, wait for the mirror clock.
        let thr = threshold(self.opts.significance, decay_step(t, self.decay_every));
        self.exchange(params, t, Some(thr), self.opts.dc_staleness)?;
        // (4) what the other groups sent.
        let tm = Instant::now();
        self.merge_incoming(params)?;
        self.stats.comm_seconds += tm.elapsed().as_secs_f64();
        self.clock = t;
        self.stats.rounds += 1;
        self.stats.bytes_sent = self.counts.lan_bytes + self.counts.wan_bytes;
        self.stats.bytes_received = self.counts.lan_bytes + self.wan_received();
        Ok(())
    }

    /// `--gaia-inner asap` on `--transport p2p`: the group's two-sided messages move between
    /// steps too (NOTIFY-ACK's waits poll them anyway).
    fn before_step(&mut self, params: &mut [f32], clock: u64) -> anyhow::Result<()> {
        self.inner.as_mut().map_or(Ok(()), |r| r.before_step(params, clock))
    }

    fn quiesce(&mut self, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        if let Some(r) = self.inner.as_mut() {
            r.quiesce(params, round)?;
        }
        self.cut(params, round, false)
    }

    fn finish(&mut self, params: &mut [f32]) -> anyhow::Result<()> {
        // The residuals' flush is final-model traffic, like every mode's final average.
        let t = Instant::now();
        let (sent, received, wait) = (self.stats.bytes_sent, self.stats.bytes_received, self.stats.wait_seconds);
        let (lan, wan, significant) = (self.counts.lan_bytes, self.counts.wan_bytes, self.counts.significant);
        self.settle_inner(params)?;
        self.cut(params, self.clock, true)?;
        if let Some(f) = self.forwards.as_mut() {
            // Every rank of the group has taken every forward in the cut; let ours complete.
            f.postbox.flush_sends(self.wait_timeout, |_| Ok(()))?;
        }
        self.counts.flushed = self.counts.significant - significant;
        self.counts.significant = significant;
        self.stats.final_bytes += self.counts.lan_bytes + self.counts.wan_bytes - lan - wan;
        (self.stats.bytes_sent, self.stats.bytes_received, self.stats.wait_seconds) = (sent, received, wait);
        (self.counts.lan_bytes, self.counts.wan_bytes) = (lan, wan);
        self.stats.final_seconds += t.elapsed().as_secs_f64();
        // Every group now holds every update: how far apart the copies still are (float order).
        let mut hi = params.to_vec();
        collectives::max_f32(&self.world, &mut hi);
        let mut lo: Vec<f32> = params.iter().map(|w| -w).collect();
        collectives::max_f32(&self.world, &mut lo);
        self.counts.final_disagreement = hi.iter().zip(&lo).map(|(h, l)| (h + l) as f64).fold(0.0, f64::max);
        if self.sums {
            // Every group now holds every group's deltas, so each replica is the global counts;
            // averaging N copies in f32 could round a count whose N-fold sum passes 2^24. The
            // LDA driver checks every replica against the ranks' recount.
            anyhow::ensure!(
                self.counts.final_disagreement == 0.0,
                "gaia: after the final flush the groups' count replicas differ by up to {} (a bug: an update was lost)",
                self.counts.final_disagreement
            );
            return Ok(());
        }
        average_replicas(&self.world, params, &mut self.stats);
        Ok(())
    }

    fn save_state(&self) -> ModeState {
        let c = &self.counts;
        let mut st: ModeState = vec![
            ("clock".into(), vec![self.clock as f64]),
            ("counts".into(), vec![
                c.updates as f64, c.significant as f64, c.lan_bytes as f64, c.barriers_sent as f64,
                c.worker_updates as f64, c.worker_below_1pct as f64, c.worker_below_5pct as f64, c.soft_sent as f64,
            ]),
        ];
        if let Some(m) = &self.mirror {
            st.push(("residual".into(), m.acc.iter().map(|&x| x as f64).collect()));
        }
        st
    }

    fn averaged_on_resize(&self, name: &str) -> bool {
        // The clock is the round, the same on every rank.
        name == "clock"
    }

    fn restore_state(&mut self, state: ModeState) -> anyhow::Result<()> {
        let get = |name: &str| -> anyhow::Result<&Vec<f64>> {
            state.iter().find(|(k, _)| k == name).map(|(_, v)| v).ok_or_else(|| anyhow::anyhow!("the checkpoint lacks gaia state {name:?}"))
        };
        self.clock = get("clock")?[0] as u64;
        let c = get("counts")?;
        anyhow::ensure!(c.len() == 8, "the checkpoint's gaia counts have {} values, expected 8", c.len());
        (self.counts.updates, self.counts.significant, self.counts.lan_bytes, self.counts.barriers_sent) =
            (c[0] as u64, c[1] as u64, c[2] as u64, c[3] as u64);
        (self.counts.worker_updates, self.counts.worker_below_1pct, self.counts.worker_below_5pct) = (c[4] as u64, c[5] as u64, c[6] as u64);
        self.counts.soft_sent = c[7] as u64;
        let groups = self.groups;
        let (group, clock) = (self.group, self.clock);
        if let Some(m) = self.mirror.as_mut() {
            let r = get("residual")?;
            anyhow::ensure!(r.len() == m.acc.len(), "the checkpoint's gaia residual has {} values, this run needs {} (another model, rank count or --groups?)", r.len(), m.acc.len());
            m.acc = r.iter().map(|&x| x as f32).collect();
            m.clocks = MirrorClocks::new(groups, group, clock);
        }
        Ok(())
    }

    fn stats(&self) -> &CommStats {
        &self.stats
    }

    fn send_log(&self) -> Vec<(f64, u64)> {
        self.mirror.as_ref().and_then(|m| m.pacer.as_ref()).map_or(Vec::new(), |p| p.log().to_vec())
    }

    fn metrics(&self) -> Vec<ModeMetric> {
        let c = &self.counts;
        let thr = threshold(self.opts.significance, decay_step(self.clock, self.decay_every));
        let mut out = vec![
            ModeMetric::number("groups", Aggregate::Max, self.groups as f64),
            ModeMetric::number("updates", Aggregate::Sum, c.updates as f64),
            ModeMetric::number("significant_updates", Aggregate::Sum, c.significant as f64),
            ModeMetric::number("threshold", Aggregate::Max, thr),
            ModeMetric::number("wan_bytes_sent", Aggregate::Sum, c.wan_bytes as f64),
            ModeMetric::number("lan_bytes_sent", Aggregate::Sum, c.lan_bytes as f64),
            ModeMetric::number("barriers_sent", Aggregate::Sum, c.barriers_sent as f64),
            ModeMetric::number("barriers_received", Aggregate::Sum, c.barriers_received as f64),
            ModeMetric::number("mirror_wait_seconds", Aggregate::Max, c.mirror_wait),
            ModeMetric::number("barrier_wait_seconds", Aggregate::Max, c.barrier_wait),
            ModeMetric::number("mirror_lag_max", Aggregate::Max, c.lag_max as f64),
            ModeMetric::number("final_group_disagreement", Aggregate::Max, c.final_disagreement),
            ModeMetric::number("worker_updates", Aggregate::Sum, c.worker_updates as f64),
            ModeMetric::number("worker_updates_below_1pct", Aggregate::Sum, c.worker_below_1pct as f64),
            ModeMetric::number("worker_updates_below_5pct", Aggregate::Sum, c.worker_below_5pct as f64),
            ModeMetric::number("soft_updates_sent", Aggregate::Sum, c.soft_sent as f64),
        ];
        if self.sums {
            out.push(ModeMetric::number("residual_entries_held", Aggregate::Sum, c.held as f64));
            out.push(ModeMetric::number("residual_entries_flushed", Aggregate::Sum, c.flushed as f64));
        }
        if let Some(r) = &self.inner {
            // Asap's own counters, renamed: every reduce's count of consistent in-neighbour
            // models (NOTIFY-ACK: always the in-degree) and the torn reads (always 0).
            out.push(ModeMetric::number("inner_rounds", Aggregate::Sum, r.stats().rounds as f64));
            out.push(ModeMetric::number("inner_correction_max", Aggregate::Max, c.inner_correction));
            for m in r.metrics() {
                let name = match m.name {
                    "consistency_histogram" => "inner_consistency_histogram",
                    "torn" => "inner_torn",
                    "stale" => "inner_stale",
                    "in_degree" => "inner_in_degree",
                    _ => continue,
                };
                out.push(ModeMetric { name, ..m });
            }
        }
        out
    }
}

/// `--sync gaia`'s declaration (see [`super::ModeSpec`]). With `--gaia-inner asap` it also reads
/// `--graph` (the shared graph group, [`super::groups::GraphOptions`]).
pub const MODE: super::ModeSpec = super::ModeSpec {
    elastic: true,
    build_counts: Some(gaia_counts),
    uses: &[(&[], &["GaiaOptions"]), (&[("gaia_inner", "asap")], &["graph_group"]), OUTER_USES[0], OUTER_USES[1], OUTER_USES[2]],
    validate: validate_gaia,
    ..super::ModeSpec::new(
        "gaia",
        "Groups of ranks as data centres (--groups): allreduce inside a group (or, --gaia-inner asap, ASAP's stochastic reduce), only significant updates between groups (--significance), bounded by the mirror clock (--dc-staleness)",
        |ctx, run, init| {
            let (mode, info) = Gaia::build(ctx, &run.opts.gaia, &run.opts.graph, init)?;
            Ok((Box::new(mode), info))
        },
    )
};

/// `--model lda`: groups sum count deltas (see [`Gaia::for_counts`]).
fn gaia_counts(ctx: &SyncContext, run: &super::RunSpec, init: &[f32]) -> anyhow::Result<Box<dyn SyncMode>> {
    Ok(Box::new(Gaia::for_counts(ctx, &run.opts.gaia, &run.opts.graph, init)?))
}

fn validate_gaia(run: &super::RunSpec) -> anyhow::Result<()> {
    let o = &run.opts.gaia;
    anyhow::ensure!(o.dc_staleness <= 1_000_000, "--dc-staleness must be at most 1000000 clocks, got {}", o.dc_staleness);
    anyhow::ensure!(
        o.soft_significance == 0.0 || (o.soft_significance > 0.0 && o.soft_significance < o.significance),
        "--soft-significance must be 0 (off) or between 0 and --significance ({}), got {}",
        o.significance,
        o.soft_significance
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_decays_as_v_over_sqrt_t() {
        assert_eq!(threshold(0.01, 1), 0.01);
        assert!((threshold(0.01, 4) - 0.005).abs() < 1e-15);
        assert!((threshold(0.05, 100) - 0.005).abs() < 1e-15);
        assert_eq!(threshold(0.0, 7), 0.0);
        // Clock 0 (before any) is treated as clock 1.
        assert_eq!(threshold(0.02, 0), 0.02);
        // Decaying every 10 clocks: clocks 1-10 are step 1, 11-20 step 2, ...
        assert_eq!([1, 10, 11, 20, 21].map(|c| decay_step(c, 10)), [1, 1, 2, 2, 3]);
        assert_eq!([1, 2, 3].map(|c| decay_step(c, 1)), [1, 2, 3]);
        assert_eq!(decay_step(0, 5), 1);
        assert!((threshold(0.01, decay_step(31, 10)) - 0.005).abs() < 1e-15);
    }

    #[test]
    fn mirror_clock_and_selective_barrier_block_what_they_should() {
        let mut c = MirrorClocks::new(3, 1, 0);
        // DS = 2: clocks 1 and 2 need nothing yet; clock 3 needs clock 1 of groups 0 and 2.
        assert!(c.blocking(2, 2).is_empty());
        assert_eq!(c.blocking(3, 2), vec![
            Blocked::MirrorClock { group: 0, have: 0, need: 1 },
            Blocked::MirrorClock { group: 2, have: 0, need: 1 },
        ]);
        c.data(0, 1);
        c.data(2, 1);
        assert!(c.blocking(3, 2).is_empty());
        assert_eq!(c.slowest(3), 1);
        // A barrier for clock 3 of group 2 blocks even though DS would allow it.
        c.barrier(2, 3);
        assert_eq!(c.blocking(3, 2), vec![Blocked::Barrier { group: 2, clock: 3 }]);
        c.data(2, 2);
        assert_eq!(c.blocking(3, 2), vec![Blocked::Barrier { group: 2, clock: 3 }]);
        c.data(2, 3);
        assert!(c.blocking(3, 2).is_empty());
        // A barrier of a clock this group has not reached blocks nothing yet.
        c.barrier(0, 6);
        assert!(c.blocking(3, 2).is_empty());
        assert_eq!(c.blocking(6, 5), vec![Blocked::Barrier { group: 0, clock: 6 }]);
        // DS = 0: every clock needs the others' same clock.
        assert_eq!(c.blocking(2, 0), vec![Blocked::MirrorClock { group: 0, have: 1, need: 2 }]);
        // One group never waits.
        assert!(MirrorClocks::new(1, 0, 0).blocking(10, 0).is_empty());
    }

    #[test]
    fn groups_from_numbers_hosts_and_files() {
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let one = h(&["a"; 8]);
        assert_eq!(parse_groups("2", 8, &one).unwrap(), vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(parse_groups("3", 7, &h(&["a"; 7])).unwrap(), vec![0, 0, 0, 1, 1, 2, 2]);
        assert_eq!(parse_groups("auto", 8, &one).unwrap(), vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(parse_groups("auto", 1, &h(&["a"])).unwrap(), vec![0]);
        let mixed = h(&["x", "y", "x", "y"]);
        assert_eq!(parse_groups("auto", 4, &mixed).unwrap(), vec![0, 1, 0, 1]);
        assert_eq!(parse_groups("host", 4, &mixed).unwrap(), vec![0, 1, 0, 1]);
        assert!(parse_groups("0", 4, &mixed).unwrap_err().to_string().contains("--groups 0"));
        assert!(parse_groups("5", 4, &mixed).is_err());
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("g.txt");
        std::fs::write(&f, "# rank group\n0 1\n1 0\n2 1\n3 0\n").unwrap();
        assert_eq!(parse_groups(f.to_str().unwrap(), 4, &mixed).unwrap(), vec![1, 0, 1, 0]);
        std::fs::write(&f, "0 0\n1 2\n").unwrap();
        let e = parse_groups(f.to_str().unwrap(), 2, &mixed).unwrap_err().to_string();
        assert!(e.contains("group(s) [1] have no rank"), "{e}");
        std::fs::write(&f, "0 0\n0 1\n").unwrap();
        assert!(parse_groups(f.to_str().unwrap(), 2, &mixed).unwrap_err().to_string().contains(":2: rank 0 is given a group twice"));
        std::fs::write(&f, "0 x\n").unwrap();
        assert!(parse_groups(f.to_str().unwrap(), 1, &mixed).unwrap_err().to_string().contains(":1: expected `RANK GROUP`"));
        let e = parse_groups("/no/such/file", 2, &mixed).unwrap_err();
        assert!(format!("{e:#}").contains("--groups \"/no/such/file\""), "{e:#}");
    }
}
