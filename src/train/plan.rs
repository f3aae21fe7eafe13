//! The run plan: the options as the run uses them, decided once (as ripgrep turns its `LowArgs`
//! into `HiArgs` once), before anything is set up. The merge (`config::TrainConfig::merge`: the
//! defaults, the config file, the flags, a `--cluster` profile) gives the options and which of them
//! were given; [`RunPlan::resolve`], collective over the ranks, fills the defaults that depend on
//! the run, in this order:
//! 1. on the model, the training data and the rank count: `--lr` by a short search, grown with
//!    the ranks' combined batch above 4 ranks where a short run on it allows (step_search.rs
//!    says why);
//! 2. on the rank count: `--lr-decay` scaled above 8 ranks ([`fit_to_ranks`] says why), unless
//!    the step grew with the combined batch (which keeps an epoch's progress: the 32-rank default
//!    reached 84.13 % at 0.8 per epoch and 83.44 % at the scaled 0.946, benches/defaults-sweep.md
//!    Part 7); LDA and Python have only this one;
//! 3. on the rounds of an epoch: the mode's `fit_to_epoch` (ssp and bosen bound their default
//!    staleness: [`crate::sync::ssp::SspOptions::fit_to_epoch`] says why).
//!
//! Rank 0 says what each one changed. Last, the mode's own defaults (its declaration's `resolve`)
//! fill a copy, [`RunPlan::resolved`], which the checkpoints' run identity hashes; the run itself
//! (and its start line and checkpoints) records the options as in [`RunPlan::cfg`]. Every later
//! phase reads the plan, which nothing changes afterwards. The binary's training loop (SGD and
//! LDA) and Python's `Reducer` plan the same way; LDA and Python have no training data here, so
//! only the rank count's defaults apply to them.

use std::time::Duration;

use mpi::topology::{Communicator, SimpleCommunicator};

use crate::comm::collectives;
use crate::comm::grouplink::{check_groups, GroupLink};
use crate::comm::pace::Links;
use crate::config::{Given, LrSchedule, Merged, TrainConfig};
use crate::data::partition::Partition;
use crate::model::{ModelSpec, RowLayout};
use crate::sync::SyncContext;

use super::setup::Shards;
use super::step_search;

/// The options as the run uses them: every default that depends on the run filled in.
#[derive(Clone, Debug)]
pub struct RunPlan {
    pub cfg: TrainConfig,
    /// `cfg` with the mode's own defaults filled in ([`with_mode_defaults`]): what the
    /// checkpoints' run identity hashes (`checkpoint::RunIdentity::new`).
    pub resolved: TrainConfig,
    /// The options this plan chose itself, by key, with why and how to set them instead: a
    /// `--resume` whose checkpoints differ in them says so (issue 43).
    pub chosen: Vec<(String, String)>,
    /// Seconds the step search took (0 without one): reported apart from loading the data.
    pub search_seconds: f64,
}

impl RunPlan {
    /// Fills the defaults that depend on the run (module doc) into the merged options, where they
    /// were not given; `training` is the model and this rank's shards, None where there are none
    /// (LDA, Python). Collective: every rank calls it.
    pub fn resolve(merged: Merged, comm: &SimpleCommunicator, training: Option<(&Shards, &ModelSpec)>) -> anyhow::Result<Self> {
        let Merged { options: mut cfg, given } = merged;
        let rank0 = comm.rank() == 0;
        let mut chosen = Vec::new();
        let plan = |cfg: TrainConfig, chosen, search_seconds| Ok(Self { resolved: with_mode_defaults(&cfg), cfg, chosen, search_seconds });
        let Some((shards, spec)) = training else {
            fit_lr_decay_to_ranks(&mut cfg, given, comm, &mut chosen);
            return plan(cfg, chosen, 0.0);
        };
        // Before the step search, which can take seconds: a run that would never sync is refused.
        // The search changes neither the shards nor the batch size: one count serves both uses.
        let steps = steps_per_epoch(&cfg, shards, comm);
        refuse_never_syncing(&cfg, steps, comm.size() as usize)?;
        // --lr not given: the step is chosen for this model and data (step_search.rs).
        let search_start = std::time::Instant::now();
        let searched = if given.lr { None } else { step_search::default_lr(&cfg, shards, spec, comm)? };
        if let Some(found) = searched {
            cfg.lr = found.lr;
            if rank0 {
                let n = comm.size();
                let how = if found.rank_factor == 1.0 {
                    "a search on a sample".to_owned()
                } else {
                    let full = n as f32 / step_search::REFERENCE_RANKS as f32;
                    let factor = if found.rank_factor == full {
                        format!("{n}/{}", step_search::REFERENCE_RANKS)
                    } else {
                        format!("{} ({n}/{} halved until a short run allowed it)", found.rank_factor, step_search::REFERENCE_RANKS)
                    };
                    format!(
                        "a search on a sample, {} x {factor}: the step grows with the {n} ranks' combined batch, where a short \
                         run on it allows",
                        found.lr / found.rank_factor,
                    )
                };
                eprintln!("asap-train: --lr not given: step size {} chosen for this model and data ({how}; --lr sets it)", found.lr);
            }
            let why = "chosen by this run's step search, on its data and rank count; --lr sets it";
            chosen.push(("lr".to_owned(), why.to_owned()));
        }
        // A step scaled to the combined batch already makes an epoch's progress the 4-rank one's:
        // the per-epoch decay stays (fit_to_ranks says why it is scaled otherwise).
        if searched.is_none_or(|found| found.rank_factor == 1.0) {
            fit_lr_decay_to_ranks(&mut cfg, given, comm, &mut chosen);
        } else if rank0 && fit_to_ranks(&mut cfg.clone(), given, comm.size() as usize).is_some() {
            log::info!(
                "--lr-decay not given: {} per epoch on {} ranks, not scaled to the rank count (the step grew with the ranks' \
                 combined batch instead, which keeps an epoch's progress the 4-rank run's)",
                cfg.lr_decay,
                comm.size()
            );
        }
        if let (Some(why), true) = (decayed_to_nothing(&cfg), rank0) {
            eprintln!("asap-train: warning: {why}");
        }
        let search_seconds = search_start.elapsed().as_secs_f64();
        // The rounds of an epoch, as in set-up (train::set_up).
        if let Some(why) = (cfg.sync.spec().fit_to_epoch)(&mut cfg.modes, ((steps / cfg.sync_every) as u64).max(1)) {
            if rank0 {
                eprintln!("asap-train: {why}");
            }
        }
        plan(cfg, chosen, search_seconds)
    }

    /// What every sync mode is built from: the model's `layout` on `comm`, with `rounds_per_epoch`
    /// (the training loop's, LDA's clocks per sweep, 1 for Python), and the plan's options.
    pub fn sync_context<'a>(
        &self,
        comm: &'a SimpleCommunicator,
        layout: RowLayout,
        rounds_per_epoch: u64,
    ) -> anyhow::Result<SyncContext<'a>> {
        let cfg = &self.cfg;
        let (rank, n) = (comm.rank() as usize, comm.size() as usize);
        let stop_sending_after =
            cfg.stop_sending_after.as_deref().map(|s| crate::config::parse_rank_round("--stop-sending-after", s, n)).transpose()?;
        let links = emulated_links(cfg, n)?;
        let group_link = match links.as_ref().and_then(|l| l.groups.as_ref()) {
            Some(g) => Some(std::rc::Rc::new(GroupLink::allocate(comm, g.count, cfg.send_log.is_some())?)),
            None => None,
        };
        Ok(SyncContext {
            comm,
            layout,
            wait_timeout: Duration::from_secs_f64(cfg.wait_timeout),
            stop_sending_after,
            seed: cfg.seed,
            emulate: links.as_ref().map(|l| (l.bytes_per_second[rank] * 8.0 / 1e6, l.latency[rank])),
            links,
            record_sends: cfg.send_log.is_some(),
            rounds_per_epoch,
            group_link,
        })
    }
}

/// Mini-batch steps per epoch, the same on every rank (a sync is a collective: ranks that took
/// different step counts would wait for each other at the end). Collective: every rank calls it.
/// - `--partition iid`: the smallest shard's `ceil(shard / --batch-size)`. The shards differ by
///   at most one example (the readers split by example counts), or by the held-out draw of
///   `--test-fraction` (about 1 % at 5,000 examples a rank), so an epoch is a pass over the data,
///   and every iid run takes the steps it always took; a larger shard leaves a few examples out
///   of an epoch, a different few each epoch.
/// - a label-skewed `--partition` (by-label, dirichlet): the mean shard's, `ceil(floor(total /
///   ranks) / --batch-size)`, so an epoch is a pass over the data whatever the shard sizes. A
///   shard smaller than that cycles, reshuffled each pass (`Replica::new_pass`), as federated
///   averaging does; a larger one sees a fresh random part of itself each epoch. The smallest
///   shard's count made an epoch a sliver of the data: `dirichlet:0.1` at 8 ranks on
///   Fashion-MNIST (a 56-example shard) gave 2 steps an epoch instead of 235, so `--epochs 10`
///   was 20 steps; the MLP (`--hidden 128`) ended at 59.40/79.75/79.33 % (seeds 1-3) against
///   85.04/85.42/85.15 % with the mean (benches/dirichlet-epochs.md). The floor keeps the mean's
///   count equal to the smallest shard's on shards that differ by at most one example; under iid
///   with `--test-fraction 0.2` the mean's would differ (t10k, 4 ranks: 63 steps against 62).
pub fn steps_per_epoch(cfg: &TrainConfig, shards: &Shards, comm: &SimpleCommunicator) -> usize {
    let b = cfg.batch_size;
    if cfg.partition.parse() == Ok(Partition::Iid) {
        return collectives::min_u64(comm, shards.train.len().div_ceil(b) as u64) as usize;
    }
    // Set-up refused empty shards, so the total is at least the rank count and this at least 1.
    (shards.total_train as usize / comm.size() as usize).div_ceil(b)
}

/// Refuses, on every rank alike, a run of several ranks whose steps end before the first sync
/// (`--epochs` x steps per epoch < `--sync-every`): it would train independent replicas, send 0
/// bytes and say nothing (issue 43: 20 steps under `--sync-every 32`, 41.6 %). `--sync none` asks
/// for exactly that and is exempt, as is one rank (nothing to sync).
fn refuse_never_syncing(cfg: &TrainConfig, steps_per_epoch: usize, ranks: usize) -> anyhow::Result<()> {
    let steps = cfg.epochs * steps_per_epoch;
    if ranks == 1 || cfg.sync.spec().name == "none" || steps >= cfg.sync_every {
        return Ok(());
    }
    anyhow::bail!(
        "--epochs {} x {steps_per_epoch} steps per epoch = {steps} steps per rank, fewer than --sync-every {}: the run would end \
         before its first sync, and its {ranks} replicas would never be averaged (--sync {} syncs every --sync-every steps, as \
         every mode but none does: {}); use --sync-every {steps} or less, --epochs {} or more, or --sync none for independent \
         replicas averaged once at the end",
        cfg.epochs,
        cfg.sync_every,
        cfg.sync.spec().name,
        crate::sync::SyncKind::names_where(|m| m.name != "none"),
        cfg.sync_every.div_ceil(steps_per_epoch),
    )
}

/// The options as the run uses them: defaults that depend on the mode filled in (its declaration's
/// `resolve`), so that a default and the same value given explicitly are the same run (see
/// [`crate::config::TRAJECTORY_FREE`]).
pub fn with_mode_defaults(cfg: &TrainConfig) -> TrainConfig {
    let mut c = cfg.clone();
    (cfg.sync.spec().resolve)(&mut c.modes);
    c
}

/// `--emulate-groups`' LAN rate when neither the option nor a profile gives one: 10 GbE, the
/// data centres' network of clusters/wan-2dc.toml (and clusters/10gbe.toml's).
pub const LAN_MBPS: f64 = 10_000.0;

/// Every rank's emulated link of `cfg` over `n` ranks (`--emulate-bandwidth`, `--emulate-latency`),
/// or None without emulated links.
pub fn emulated_links(cfg: &TrainConfig, n: usize) -> anyhow::Result<Option<Links>> {
    let Some(b) = &cfg.emulate_bandwidth else { return Ok(None) };
    let links = Links::on(cfg.emulate_fabric, &b.resolve(n, "--emulate-bandwidth")?, &cfg.emulate_latency.resolve(n, "--emulate-latency")?);
    match cfg.emulate_groups.filter(|&g| g > 0) {
        Some(g) => {
            check_groups(g, n)?;
            Ok(Some(links.with_groups(g, cfg.emulate_lan_bandwidth.unwrap_or(LAN_MBPS), cfg.emulate_lan_latency.unwrap_or(0.0))))
        }
        None => Ok(Some(links)),
    }
}

/// Below this share of `--lr` a step changes the model little: a schedule that gets there before
/// the last epoch is said (issue 43: breast_cancer ended at the same objective, 0.485769, after
/// 50 epochs and after 200 under the default decay of 0.8 per epoch, which is under 1 % after
/// 21 epochs).
const NOTHING: f32 = 0.01;

/// Why the epochs after some epoch can hardly change the model under `--lr-schedule decay`, or
/// None when the step stays above [`NOTHING`] of `--lr` to the last epoch.
fn decayed_to_nothing(cfg: &TrainConfig) -> Option<String> {
    let d = cfg.lr_decay as f64;
    if cfg.lr_schedule != LrSchedule::Decay || d >= 1.0 {
        return None;
    }
    let frozen = (NOTHING as f64).ln() / d.ln();
    let from = frozen.ceil() as usize;
    if cfg.epochs <= from {
        return None;
    }
    // The steps' sum (how far SGD can travel) in the epochs from `from` on, of the whole run's.
    let n = cfg.epochs as i32;
    let share = (d.powi(from as i32) - d.powi(n)) / (1.0 - d.powi(n));
    Some(format!(
        "--lr-schedule decay at {d} per epoch puts the step under {:.0} % of its first after {from} epochs: the last {} of \
         {} epochs hold {:.1} % of the steps' sum and can change the model little; --lr-schedule constant or inv-sqrt, \
         or a --lr-decay closer to 1, keeps learning",
        NOTHING * 100.0,
        cfg.epochs - from,
        cfg.epochs,
        100.0 * share
    ))
}

/// [`fit_to_ranks`], said by rank 0 and recorded among the plan's choices.
fn fit_lr_decay_to_ranks(cfg: &mut TrainConfig, given: Given, comm: &SimpleCommunicator, chosen: &mut Vec<(String, String)>) {
    if let Some(why) = fit_to_ranks(cfg, given, comm.size() as usize) {
        if comm.rank() == 0 {
            log::info!("{why}");
        }
        chosen.push(("lr_decay".to_owned(), "scaled to this run's rank count; --lr-decay sets it".to_owned()));
    }
}

/// Size-dependent defaults, applied once the number of ranks is known; returns what was
/// changed and why, for the start line (`--lr-decay` given: `given.lr_decay`).
///
/// `--lr-decay` (when not given, with `--lr-schedule decay`, more than 8 ranks, and a step that did
/// not grow with the ranks' combined batch: `--lr` given, or the check of step_search.rs refused
/// it): an epoch is a pass over the shard, so with N ranks it holds N/8 times fewer steps than at
/// 8 ranks, and a fixed 0.8 per epoch spends the step size N/8 times faster per example seen. A
/// 128-rank run with the 8-rank default's examples per rank (160 epochs) would end at 0.3 *
/// 0.8^160 ~ 1e-16 and have learnt nothing in its last ~130 epochs; the sum of its step sizes
/// (what SGD can travel) is 1/16 of the 8-rank run's. Scaling the factor to 0.8^(8/N) per epoch gives every
/// rank the 8-rank schedule per example seen. Up to 8 ranks nothing changes.
fn fit_to_ranks(cfg: &mut TrainConfig, given: Given, nranks: usize) -> Option<String> {
    if given.lr_decay || cfg.lr_schedule != LrSchedule::Decay || nranks <= 8 {
        return None;
    }
    let per_8 = cfg.lr_decay;
    cfg.lr_decay = per_8.powf(8.0 / nranks as f32);
    Some(format!(
        "--lr-decay not given: {:.5} per epoch on {nranks} ranks ({per_8} per {} epochs: shards {}x smaller than at 8 ranks, so the step decays per example seen as at 8 ranks)",
        cfg.lr_decay,
        nranks as f64 / 8.0,
        nranks as f64 / 8.0
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The --lr-decay default is scaled above 8 ranks so that the step after the same examples
    /// per rank is the 8-rank one; a given value (flag or file) is never changed.
    #[test]
    fn lr_decay_default_follows_the_examples_per_rank_unless_given() {
        use clap::{CommandFactory, FromArgMatches, Parser};
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            c: TrainConfig,
        }
        let parse = |args: &[&str]| {
            let m = Cmd::command().get_matches_from(args);
            TrainConfig::merge(None, Cmd::from_arg_matches(&m).unwrap().c, Some(&m)).unwrap()
        };
        // The default schedule (cosine) anneals over the run's steps, whatever the rank count.
        let Merged { options: mut c, given } = parse(&["x"]);
        assert!(fit_to_ranks(&mut c, given, 128).is_none());
        let Merged { options: mut c, given } = parse(&["x", "--lr-schedule", "decay"]);
        assert!(fit_to_ranks(&mut c, given, 8).is_none());
        assert_eq!(c.lr_decay, 0.8);
        assert!(fit_to_ranks(&mut c, given, 128).is_some());
        // 160 epochs at 128 ranks (the examples per rank of 10 epochs at 8) end where 10 do at 8.
        let end = c.lr_decay.powi(160) as f64;
        assert!((end - 0.8f64.powi(10)).abs() < 1e-4, "{end}");
        let Merged { options: mut c, given } = parse(&["x", "--lr-schedule", "decay", "--lr-decay", "0.8"]);
        assert!(fit_to_ranks(&mut c, given, 256).is_none());
        assert_eq!(c.lr_decay, 0.8);
        let Merged { options: mut c, given } = parse(&["x", "--lr-schedule", "constant"]);
        assert!(fit_to_ranks(&mut c, given, 256).is_none());
    }
}
