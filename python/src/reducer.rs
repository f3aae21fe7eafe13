//! `asap_train.Reducer`: one of the binary's sync modes (allreduce, asap, none) over a flat
//! float32 numpy array, reduced in place; every rank's sync count is checked, and a rank out of
//! data joins (counts.rs).

use std::cell::RefCell;

use asap_train::comm::collectives;
use asap_train::config::{retired_option_hint, Merged, SyncKind, TrainConfig};
use asap_train::model::RowLayout;
use asap_train::sync::groups::OuterKind;
use asap_train::sync::{Aggregate, ModeMetric, SyncContext, SyncMode};
use asap_train::train::plan::RunPlan;
use clap::parser::ValueSource;
use clap::{Args, FromArgMatches};
use mpi::topology::{Communicator, SimpleCommunicator};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::counts::{self, Call, Guard, JoinRule, Outcome, GUARDS};
use crate::{json_to_py, text, Error, OptionError, SyncCountError};

/// The options a reducer takes (keys as in config files; flags with '-' for '_'). The others of
/// `asap-train train` (data, model, step size ...) belong to the binary's training loop, which a
/// Python user replaces by their own.
const REDUCER_OPTIONS: &[&str] = &[
    "sync",
    "seed",
    "wait_timeout",
    "graph",
    "notify",
    "overlap",
    "deadline",
    "staleness",
    "bandwidth_mbps",
    "priority",
    "emulate_bandwidth",
    "emulate_latency",
    "emulate_fabric",
    "emulate_groups",
    "emulate_lan_bandwidth",
    "emulate_lan_latency",
    "outer_optimizer",
    "outer_lr",
    "outer_momentum",
    "outer_pseudo_gradient",
    "compress",
    "consensus_step",
];

thread_local! {
    /// Every reducer's sync mode, in creation order (the same on every rank), so that the
    /// collective frees at exit (`close_all`) run in the same order everywhere. A slot is None
    /// once closed. The modes hold MPI handles and stay on the thread that made them (the
    /// Reducer class is `unsendable`).
    pub(crate) static MODES: RefCell<Vec<Option<Box<dyn SyncMode>>>> = const { RefCell::new(Vec::new()) };
}

/// Frees a mode's MPI resources (collectively), or leaks them when MPI is already finalised
/// (freeing a window then would be an error; the process is ending).
pub(crate) fn release(mode: Box<dyn SyncMode>) {
    if mpi::environment::is_finalized() {
        std::mem::forget(mode);
    } else {
        drop(mode);
    }
}

/// Closes every open reducer in creation order (collective; `finalize` calls it before
/// MPI_Finalize). Each open Reducer's sync count is checked first (a rank that made more syncs
/// than the others, and left its Reducer open, would otherwise leave them waiting): a mismatch
/// aborts the job with the message that names the ranks.
pub fn close_all() {
    let open: Vec<(usize, Guard)> = GUARDS
        .try_with(|g| g.borrow().iter().map(|(&s, g)| (s, g.clone())).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|(s, g)| g.failed.is_none() && MODES.try_with(|m| m.borrow().get(*s).is_some_and(Option::is_some)).unwrap_or(false))
        .collect();
    for (slot, guard) in open {
        if let Outcome::Mismatch(m) = counts::control(slot, Call::Exit, guard.round) {
            asap_train::comm::abort_job(&format!("asap_train at exit: {m}"), 1);
        }
    }
    let modes: Vec<Box<dyn SyncMode>> =
        MODES.try_with(|m| m.borrow_mut().iter_mut().filter_map(Option::take).collect()).unwrap_or_default();
    modes.into_iter().for_each(release);
}

/// The binary's parse and validation of `flags` (`--sync asap --graph ring ...`), restricted to
/// the options `who` (a Python class) takes: `allowed`, as config-file keys.
pub(crate) fn parse_flags(flags: &[String], allowed: &[&str], who: &str) -> anyhow::Result<Merged> {
    let cmd = TrainConfig::augment_args(clap::Command::new("asap_train").no_binary_name(true).allow_negative_numbers(true));
    let ids: Vec<String> = cmd.get_arguments().map(|a| a.get_id().to_string()).collect();
    let matches = cmd
        .try_get_matches_from(flags)
        .map_err(|e| anyhow::anyhow!(retired_option_hint(&e).map_or_else(|| clap_message(&e), str::to_owned)))?;
    for id in &ids {
        if matches.value_source(id) == Some(ValueSource::CommandLine) && !allowed.contains(&id.as_str()) {
            anyhow::bail!(
                "{id}= (--{}) is an option of the binary's training loop, not of a {who} (which takes {})",
                id.replace('_', "-"),
                allowed.join(", ")
            );
        }
    }
    TrainConfig::merge(None, TrainConfig::from_arg_matches(&matches)?, Some(&matches))
}

/// [`parse_flags`] for a reducer: its options and modes.
fn reducer_config(flags: &[String]) -> anyhow::Result<Merged> {
    let merged = parse_flags(flags, REDUCER_OPTIONS, "Reducer")?;
    let cfg = &merged.options;
    anyhow::ensure!(
        matches!(cfg.sync, SyncKind::Allreduce | SyncKind::Asap | SyncKind::None),
        "sync={:?}: a Reducer runs allreduce, asap or none (ssp and bosen are asap_train.Table; async and gaia are not exposed)",
        serde_json::to_value(cfg.sync)?.as_str().unwrap_or_default()
    );
    Ok(merged)
}

/// A clap error as one message without the "--help" hint (there is no help to ask for here).
pub(crate) fn clap_message(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let lines: Vec<&str> = rendered.lines().filter(|l| !l.contains("--help") && !l.trim().is_empty()).collect();
    lines.join("\n").trim_start_matches("error: ").to_owned()
}

/// Collective: when any rank failed, every rank gets an error: its own, or the lowest failing
/// rank's message (so a rank-dependent option cannot leave the others waiting in a collective).
pub(crate) fn agree<T>(comm: &SimpleCommunicator, r: anyhow::Result<T>) -> Result<T, String> {
    let me = comm.rank() as u64;
    let first = collectives::min_u64(comm, if r.is_err() { me } else { u64::MAX });
    if first == u64::MAX {
        return r.map_err(|e| text(&e));
    }
    let mine = r.as_ref().err().map(text).unwrap_or_default();
    let theirs = collectives::broadcast_string(comm, first as usize, &mine);
    match r {
        Err(_) => Err(mine),
        Ok(_) => Err(format!("rank {first}: {theirs}")),
    }
}

/// Python kwargs as the binary's flags: `graph="ring"` -> `--graph ring`, `overlap=True` ->
/// `--overlap`; None and False leave an option out.
pub(crate) fn kwargs_to_flags(sync: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<String>> {
    let mut flags = vec!["--sync".to_owned(), sync.to_owned()];
    for (k, v) in options.into_iter().flat_map(|d| d.iter()) {
        let key: String = k.extract()?;
        // `outer="nesterov"` is `--outer-optimizer nesterov` (the short name reads as the
        // Reducer's own: `Reducer(x, sync="allreduce", outer="nesterov")`).
        let key = if key == "outer" { "outer_optimizer".to_owned() } else { key };
        let flag = format!("--{}", key.replace('_', "-"));
        if v.is_none() {
            continue;
        }
        if let Ok(b) = v.cast::<pyo3::types::PyBool>() {
            if b.is_true() {
                flags.push(flag);
            }
            continue;
        }
        flags.push(flag);
        flags.push(v.str()?.to_string());
    }
    Ok(flags)
}

/// A flat float32 array's writable contents, or a TypeError/ValueError that says what to pass.
fn with_params<R>(params: &Bound<'_, PyAny>, n: usize, f: impl FnOnce(&mut [f32]) -> R) -> PyResult<R> {
    let arr = params.cast::<PyArray1<f32>>().map_err(|_| {
        let dtype = params.getattr("dtype").map(|d| d.to_string()).unwrap_or_else(|_| params.get_type().to_string());
        let ndim = params.getattr("ndim").map(|d| d.to_string()).unwrap_or_else(|_| "?".into());
        PyTypeError::new_err(format!("params must be a 1-D numpy float32 array, got {dtype} with ndim {ndim} (np.ascontiguousarray(x, dtype=np.float32).ravel() makes one)"))
    })?;
    let mut rw = arr.try_readwrite().map_err(|e| PyValueError::new_err(format!("params cannot be written in place: {e}")))?;
    let slice =
        rw.as_slice_mut().map_err(|_| PyValueError::new_err("params must be C-contiguous (np.ascontiguousarray makes a copy that is)"))?;
    if slice.len() != n {
        return Err(PyValueError::new_err(format!("params has {} values but this Reducer was made for {n}", slice.len())));
    }
    Ok(f(slice))
}

/// A reducer over a flat float32 array: one of the binary's sync modes, built collectively.
#[pyclass(unsendable, module = "asap_train._native")]
pub struct Reducer {
    slot: usize,
    n: usize,
    sync_kind: String,
    info: serde_json::Value,
    /// The counters when the reducer was closed (stats() still answers after finish()).
    last: Option<Snapshot>,
}

/// A mode's counters and metrics at one moment.
pub(crate) type Snapshot = (asap_train::sync::CommStats, Vec<ModeMetric>);

impl Reducer {
    /// The counters and metrics now, or as they were when the reducer was closed.
    fn snapshot(&self) -> PyResult<Snapshot> {
        match &self.last {
            Some(s) => Ok(s.clone()),
            None => self.with_mode(|m| (m.stats().clone(), m.metrics())),
        }
    }

    /// This reducer's guard (its count and join rule), or the error that stopped it, or that it
    /// is closed: raised on the calling rank before any communication.
    fn guard(&self) -> PyResult<Guard> {
        self.with_mode(|_| ())?;
        let g = GUARDS.with_borrow(|g| g.get(&self.slot).cloned()).ok_or_else(|| Error::new_err("this Reducer has no sync count"))?;
        match &g.failed {
            Some(m) => Err(SyncCountError::new_err(format!("this Reducer stopped at an earlier error: {m}"))),
            None => Ok(g),
        }
    }

    fn set_round(&self, round: u64) {
        GUARDS.with_borrow_mut(|g| {
            if let Some(g) = g.get_mut(&self.slot) {
                g.round = round;
            }
        });
    }

    /// Records the mismatch every rank found (further calls raise it) and returns it to raise.
    fn fail(&self, message: String) -> PyErr {
        GUARDS.with_borrow_mut(|g| {
            if let Some(g) = g.get_mut(&self.slot) {
                g.failed = Some(message.clone());
            }
        });
        SyncCountError::new_err(message)
    }

    /// The mode's own round `round`; a failure inside the protocol aborts the job (the mailboxes
    /// cannot be left half way through a round).
    fn mode_round(&self, p: &mut [f32], round: u64, what: &str) -> PyResult<()> {
        if let Err(e) = self.with_mode(|m| m.sync(p, round))? {
            asap_train::comm::abort_job(&format!("{what} round {round}: {}", text(&e)), 1);
        }
        Ok(())
    }

    /// A round that some ranks make while others have joined (`joined`: this rank has).
    fn join_round(&self, p: &mut [f32], round: u64, joined: bool, rule: JoinRule, what: &str) -> PyResult<()> {
        match rule {
            JoinRule::ActiveMean => {
                active_mean(p, joined);
                Ok(())
            }
            JoinRule::Relay => self.mode_round(p, round, what),
            JoinRule::Nothing => Ok(()),
            JoinRule::Unchecked => unreachable!("join() under check_syncs=False raises before any round"),
            JoinRule::Refused(why) => Err(self.fail(format!(
                "a rank called join() while the others still sync, but join() is not defined for this Reducer: {why}. \
                 Give every rank as many syncs (asap_train.DistributedSampler with drop_last=True), or use plain allreduce or asap"
            ))),
        }
    }

    /// `k` syncs of an active rank, each checked against the other ranks' counts first (modes
    /// that communicate at a sync; see counts.rs).
    fn active_rounds(&self, p: &mut [f32], k: u64, what: &str) -> PyResult<()> {
        for _ in 0..k {
            let g = self.guard()?;
            let round = g.round + 1;
            if g.checks_syncs {
                match counts::control(self.slot, Call::Sync, round) {
                    Outcome::Agreed => self.mode_round(p, round, what)?,
                    Outcome::JoinRound { .. } => self.join_round(p, round, false, g.rule, what)?,
                    Outcome::Mismatch(m) => return Err(self.fail(m)),
                    Outcome::AllJoined { .. } => unreachable!("a syncing rank is not joined"),
                }
            } else {
                self.mode_round(p, round, what)?;
            }
            self.set_round(round);
        }
        Ok(())
    }

    /// Collective: agrees that every rank makes `call` at the same count, or raises the
    /// mismatch on every rank.
    fn agree_on(&self, call: Call) -> PyResult<()> {
        let g = self.guard()?;
        match counts::control(self.slot, call, g.round) {
            Outcome::Agreed => Ok(()),
            Outcome::Mismatch(m) => Err(self.fail(m)),
            other => unreachable!("{call:?} cannot give {other:?}"),
        }
    }

    /// Frees the mode (no check: `finish` checked, or the ranks failed together).
    fn close_now(&mut self) {
        if let Some(mode) = MODES.with_borrow_mut(|m| m.get_mut(self.slot).and_then(Option::take)) {
            self.last = Some((mode.stats().clone(), mode.metrics()));
            release(mode);
        }
    }

    /// Runs `f` on this reducer's mode, or raises when it is closed.
    fn with_mode<R>(&self, f: impl FnOnce(&mut Box<dyn SyncMode>) -> R) -> PyResult<R> {
        MODES
            .with_borrow_mut(|m| m.get_mut(self.slot).and_then(Option::as_mut).map(f))
            .ok_or_else(|| Error::new_err("this Reducer is closed (after finish() or close())"))
    }
}

/// What a joined rank does in the others' rounds under `cfg`'s mode (see counts.rs).
fn join_rule(cfg: &TrainConfig) -> JoinRule {
    match cfg.sync {
        SyncKind::Allreduce if cfg.modes.outer.outer_optimizer != OuterKind::None => {
            JoinRule::Refused("an outer optimizer (outer=) keeps each rank's anchor and momentum, which a rank that contributes nothing would leave behind")
        }
        SyncKind::Allreduce if cfg.modes.compress.compression().is_some() => {
            JoinRule::Refused("compress= keeps each rank's error-feedback residual and the last shared model, which a rank that contributes nothing would leave behind")
        }
        SyncKind::Allreduce => JoinRule::ActiveMean,
        SyncKind::None => JoinRule::Nothing,
        _ => JoinRule::Relay,
    }
}

/// Plain allreduce with joined ranks: every rank's `params` becomes the mean of the active
/// ranks' models (sum over ranks with the joined ones sending zeros, then times 1/active in
/// float32, as the mode averages), the count of active ranks summed beside them.
fn active_mean(params: &mut [f32], joined: bool) {
    let n = params.len();
    let mut buf: Vec<f32> = if joined { vec![0.0; n + 1] } else { params.iter().copied().chain([1.0]).collect() };
    let mut scratch = Vec::new();
    collectives::sum_f32(&SimpleCommunicator::world(), &mut buf, &mut scratch);
    let inv = 1.0 / buf[n];
    params.iter_mut().zip(&buf).for_each(|(p, s)| *p = s * inv);
}

/// Builds the mode `cfg` names, as the binary does: by the mode's declaration.
fn build_mode(cfg: &TrainConfig, ctx: &SyncContext, init: &[f32]) -> anyhow::Result<(Box<dyn SyncMode>, serde_json::Value)> {
    cfg.sync.spec().build_run(ctx, &cfg.mode_run(), init)
}

/// With `bandwidth_mbps` every edge keeps a mirror of what its receiver holds, starting from the
/// model every rank starts from: `params` that differ between ranks would leave the mirrors wrong
/// until `finish` found them out. A checksum (sums of the values and of their squares, in f64)
/// compared over ranks catches that at the start.
fn same_on_every_rank(comm: &SimpleCommunicator, params: &[f32]) -> anyhow::Result<()> {
    let sum: f64 = params.iter().map(|&x| x as f64).sum();
    let sq: f64 = params.iter().map(|&x| (x as f64) * (x as f64)).sum();
    let mut v = [sum, sq, -sum, -sq];
    collectives::max_f64(comm, &mut v);
    anyhow::ensure!(
        v[0] == -v[2] && v[1] == -v[3],
        "bandwidth_mbps (--bandwidth-mbps) needs the same starting params on every rank (each edge mirrors what its receiver holds): broadcast them first"
    );
    Ok(())
}

/// Rows of `row_len` over `n` values (the last may be shorter): what `bandwidth_mbps` sends or
/// holds back as a unit.
fn layout(n: usize, row_len: Option<usize>) -> PyResult<RowLayout> {
    let len = row_len.unwrap_or(n.max(1));
    if len == 0 {
        return Err(OptionError::new_err("row_len must be at least 1"));
    }
    let mut offsets: Vec<usize> = (0..n).step_by(len).collect();
    offsets.push(n);
    Ok(RowLayout { offsets })
}

/// One metric's values as Python numbers: whole numbers (counters, histograms) as int.
pub(crate) fn metric_value<'py>(py: Python<'py>, m: &ModeMetric, values: &[f64]) -> PyResult<Bound<'py, PyAny>> {
    let one = |x: f64| -> PyResult<Bound<'py, PyAny>> {
        if x.fract() == 0.0 && x.abs() < 9.0e15 {
            Ok((x as i64).into_pyobject(py)?.into_any())
        } else {
            Ok(x.into_pyobject(py)?.into_any())
        }
    };
    if m.is_array {
        Ok(PyList::new(py, values.iter().map(|&x| one(x)).collect::<PyResult<Vec<_>>>()?)?.into_any())
    } else {
        one(values.first().copied().unwrap_or(0.0))
    }
}

/// This rank's counters and mode metrics as a dict (the binary's names).
pub(crate) fn stats_dict<'py>(py: Python<'py>, snap: &Snapshot) -> PyResult<Bound<'py, PyDict>> {
    let (counters, metrics) = snap;
    let d = PyDict::new(py);
    let v = serde_json::to_value(counters).map_err(|e| Error::new_err(e.to_string()))?;
    for (k, x) in v.as_object().into_iter().flatten() {
        d.set_item(k, json_to_py(py, x)?)?;
    }
    for m in metrics {
        d.set_item(m.name, metric_value(py, m, &m.values)?)?;
    }
    Ok(d)
}

/// Collective: counters as mean and max over ranks, mode metrics combined by their aggregate.
pub(crate) fn global_stats_dict<'py>(py: Python<'py>, snap: &Snapshot) -> PyResult<Bound<'py, PyDict>> {
    let (counters, metrics) = snap;
    let v = serde_json::to_value(counters).map_err(|e| Error::new_err(e.to_string()))?;
    let names: Vec<&String> = v.as_object().into_iter().flat_map(|o| o.keys()).collect();
    let values: Vec<f64> = v.as_object().into_iter().flat_map(|o| o.values()).map(|x| x.as_f64().unwrap_or(0.0)).collect();
    // MPI_COMM_WORLD, not a duplicate held by the object: a communicator freed after
    // MPI_Finalize (an object collected at interpreter exit) would be an MPI error.
    let comm = SimpleCommunicator::world();
    let (mean, max) = collectives::mean_max(&comm, &values);
    let d = PyDict::new(py);
    for (i, k) in names.iter().enumerate() {
        d.set_item(format!("{k}_mean"), mean[i])?;
        d.set_item(format!("{k}_max"), max[i])?;
    }
    let size = comm.size() as f64;
    for m in metrics {
        // Histograms may differ in length between ranks (in-degrees differ): pad to the longest.
        let len = collectives::max_u64(&comm, m.values.len() as u64) as usize;
        let mut x = m.values.clone();
        x.resize(len, 0.0);
        match m.aggregate {
            Aggregate::Sum => collectives::sum_f64(&comm, &mut x),
            Aggregate::Mean => {
                collectives::sum_f64(&comm, &mut x);
                x.iter_mut().for_each(|v| *v /= size);
            }
            Aggregate::Max => collectives::max_f64(&comm, &mut x),
        }
        d.set_item(m.name, metric_value(py, m, &x)?)?;
    }
    Ok(d)
}

#[pymethods]
impl Reducer {
    /// Collective: every rank passes its own `params` (the model it starts from; with
    /// `bandwidth_mbps` it must be the same on every rank) and the same options.
    #[new]
    #[pyo3(signature = (params, sync="asap", row_len=None, check_syncs=true, **options))]
    fn new(
        params: &Bound<'_, PyAny>,
        sync: &str,
        row_len: Option<usize>,
        check_syncs: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        if !crate::mpi_active() {
            return Err(Error::new_err("MPI is not active (asap_train.init() was not called, or MPI was finalised)"));
        }
        let comm = SimpleCommunicator::world();
        let init: Vec<f32> = with_params(params, params.len().unwrap_or(0), |p| p.to_vec())?;
        let flags = kwargs_to_flags(sync, options)?;
        let merged = agree(&comm, reducer_config(&flags)).map_err(OptionError::new_err)?;
        // The binary's plan (train/plan.rs); a Reducer has no training data, so only the rank
        // count's defaults apply.
        let plan = agree(&comm, RunPlan::resolve(merged, &comm, None)).map_err(OptionError::new_err)?;
        let cfg = &plan.cfg;
        let layout = layout(init.len(), row_len)?;
        let ctx = agree(&comm, plan.sync_context(&comm, layout, 1)).map_err(OptionError::new_err)?;
        if cfg.modes.budget.bandwidth_mbps.is_some() {
            let same = same_on_every_rank(&comm, &init);
            agree(&comm, same).map_err(OptionError::new_err)?;
        }
        let built = build_mode(cfg, &ctx, &init);
        let (mode, info) = agree(&comm, built).map_err(OptionError::new_err)?;
        let slot = MODES.with_borrow_mut(|m| {
            m.push(Some(mode));
            m.len() - 1
        });
        let sync_kind = serde_json::to_value(cfg.sync).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        if !check_syncs && cfg.sync != SyncKind::Asap {
            return Err(OptionError::new_err(format!(
                "check_syncs=False applies to sync=\"asap\" only: under {sync_kind:?} the check is {} (docs/python.md)",
                if cfg.sync == SyncKind::None {
                    "made at join/finish/close only, at no cost per sync"
                } else {
                    "one small allreduce beside a round that is a collective of every rank anyway"
                }
            )));
        }
        let rule = if check_syncs { join_rule(cfg) } else { JoinRule::Unchecked };
        let guard = Guard { round: 0, rule, checks_syncs: check_syncs && cfg.sync != SyncKind::None, failed: None };
        GUARDS.with_borrow_mut(|g| g.insert(slot, guard));
        Ok(Reducer { slot, n: init.len(), sync_kind, info, last: None })
    }

    /// One round, in place: `params` becomes this rank's model after the exchange. Collective in
    /// the mode's sense (allreduce: all ranks; asap: the graph's neighbours), after a check that
    /// every rank makes this sync (counts.rs): a rank that makes more syncs than the others, or
    /// fewer, raises `SyncCountError` on every rank. A communication failure (a neighbour silent
    /// beyond `wait_timeout`) aborts the whole job, as in the binary: the mailboxes cannot be left
    /// half way through a round.
    fn sync(&mut self, params: &Bound<'_, PyAny>) -> PyResult<()> {
        with_params(params, self.n, |p| self.active_rounds(p, 1, "Reducer.sync"))?
    }

    /// `k` rounds in a row with no Python between them (consensus only: nothing changes
    /// `params` between the rounds), each checked as `sync` checks it. The overhead bench times
    /// it against `k` calls of `sync`.
    fn sync_rounds(&mut self, params: &Bound<'_, PyAny>, k: u64) -> PyResult<()> {
        with_params(params, self.n, |p| self.active_rounds(p, k, "Reducer.sync_rounds"))?
    }

    /// Collective: this rank has no more data. Until every rank has joined, it answers the
    /// others' syncs (allreduce: contributing nothing, and receiving the mean of the active ranks'
    /// models; asap: running the mode's round on `params` with no local steps); returns on every
    /// rank once all have joined, with `params` this rank's model then. A join under an allreduce
    /// with outer= or compress= raises on every rank when another rank syncs past it.
    fn join(&mut self, params: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.guard()?.rule == JoinRule::Unchecked {
            return Err(OptionError::new_err(
                "join() needs the ranks to meet at each sync, and this Reducer was made with check_syncs=False: \
                 make it without (the default), or give every rank as many syncs (asap_train.DistributedSampler with drop_last=True)",
            ));
        }
        with_params(params, self.n, |p| loop {
            let g = self.guard()?;
            match counts::control(self.slot, Call::Join, g.round) {
                Outcome::AllJoined { round } => {
                    self.set_round(round.max(g.round));
                    return Ok(());
                }
                Outcome::JoinRound { round } => self.join_round(p, round, true, g.rule, "Reducer.join")?,
                Outcome::Mismatch(m) => return Err(self.fail(m)),
                Outcome::Agreed => unreachable!("a join agreed on by all is AllJoined"),
            }
        })?
    }

    /// Collective end: every rank's `params` becomes the final model the mode defines (the
    /// average of the replicas; push-sum: sum x / sum w), then the reducer is closed. Raises
    /// `SyncCountError` on every rank when the ranks made different numbers of syncs.
    fn finish(&mut self, params: &Bound<'_, PyAny>) -> PyResult<()> {
        with_params(params, self.n, |_| ())?;
        self.agree_on(Call::Finish)?;
        let r = with_params(params, self.n, |p| self.with_mode(|m| m.finish(p)))??;
        if let Err(e) = r {
            asap_train::comm::abort_job(&format!("Reducer.finish: {}", text(&e)), 1);
        }
        self.close_now();
        Ok(())
    }

    /// Collective: frees the mode's MPI window and communicators, after checking that every
    /// rank closes at the same sync count (else `SyncCountError` on every rank). Idempotent.
    fn close(&mut self) -> PyResult<()> {
        if self.closed() {
            return Ok(());
        }
        let checked = match GUARDS.with_borrow(|g| g.get(&self.slot).and_then(|g| g.failed.clone())) {
            Some(_) => Ok(()),
            None => self.agree_on(Call::Close),
        };
        self.close_now();
        checked
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }

    /// This rank's counters: bytes_sent, bytes_received, comm_seconds, wait_seconds, rounds,
    /// final_bytes, final_seconds, and the mode's own metrics under the binary's names (asap:
    /// torn, stale, consistency_histogram, in_degree; staleness_histogram with staleness;
    /// push_sum_weight, push_sum_weight_sum after finish, push_sum_held_pushes ...).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.snapshot()?)
    }

    /// Collective: the counters over all ranks as the binary's metrics report them: each
    /// counter's mean and max (`bytes_sent_mean`, `bytes_sent_max` ...), and each mode metric
    /// combined as the binary combines it (sum, mean or max; histograms element by element).
    fn global_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        global_stats_dict(py, &self.snapshot()?)
    }

    /// What the binary's metrics start line records about the mode (asap: the graph, notify,
    /// staleness and the graph's report), as a dict (None for allreduce and none).
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.info)
    }

    /// The mode's name: "allreduce", "asap" or "none".
    #[getter]
    fn sync_mode(&self) -> String {
        self.sync_kind.clone()
    }

    /// Syncs made so far (after a join: the most any rank made).
    #[getter]
    fn rounds(&self) -> u64 {
        GUARDS.with_borrow(|g| g.get(&self.slot).map_or(0, |g| g.round))
    }

    /// Length of the arrays this reducer takes.
    #[getter]
    fn size(&self) -> usize {
        self.n
    }

    /// Whether finish() or close() ran.
    #[getter]
    fn closed(&self) -> bool {
        MODES.with_borrow(|m| m.get(self.slot).is_none_or(Option::is_none))
    }
}

impl Drop for Reducer {
    fn drop(&mut self) {
        // Python dropped the reducer without close(): free it now (collective; every rank drops
        // the same reducers in the same order in an SPMD script). At interpreter exit,
        // `finalize` has closed them already.
        let mode = MODES.try_with(|m| m.borrow_mut().get_mut(self.slot).and_then(Option::take)).ok().flatten();
        if let Some(mode) = mode {
            release(mode);
        }
    }
}
