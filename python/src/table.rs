//! `asap_train.Table`: a parameter-server table with bounded staleness, Bösen's client API
//! (`get`, `inc`, `clock`) over the binary's `--sync ssp` / `--sync bosen` mode.
//!
//! The mode sees a replica of the whole table (a flat f32 vector, one row per table row): `inc`
//! adds to the replica, `clock` is the mode's `sync` (it pushes what changed since the last read,
//! per shard, with the read request of the next clock), and `get`/`inc` first pass the mode's
//! read gate (`before_step`), which waits until the rows hold every update of clocks <= c-S-1
//! and puts them into the replica. So what a Python loop reads obeys the same SSP guarantee as
//! the binary's training loop.

use asap_train::config::{Merged, SyncKind};
use asap_train::model::RowLayout;
use asap_train::sync::SyncMode;
use asap_train::train::plan::RunPlan;
use mpi::topology::SimpleCommunicator;
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::reducer::{agree, global_stats_dict, kwargs_to_flags, parse_flags, release, stats_dict, Snapshot, MODES};
use crate::{json_to_py, text, Error, OptionError};

/// The options a table takes: ssp's and bosen's (keys as in config files).
const TABLE_OPTIONS: &[&str] = &[
    "sync",
    "seed",
    "wait_timeout",
    "staleness",
    "apply",
    "bandwidth_mbps",
    "priority",
    "queue_size",
    "compress",
    "max_snapshots",
    "emulate_bandwidth",
    "emulate_latency",
    "emulate_fabric",
    "emulate_groups",
    "emulate_lan_bandwidth",
    "emulate_lan_latency",
];

/// A table of `rows` x `row_len` float32 values sharded over the ranks (each rank serves a block
/// of rows), read and updated under bounded staleness.
#[pyclass(unsendable, module = "asap_train._native")]
pub struct Table {
    slot: usize,
    rows: usize,
    row_len: usize,
    /// This rank's replica of the whole table (what the mode reads into and pushes from).
    replica: Vec<f32>,
    /// Clocks completed by this rank.
    clock: u64,
    info: serde_json::Value,
    last: Option<Snapshot>,
}

impl Table {
    /// The read gate of the current clock, then `f` on the mode and the replica.
    fn gated<R>(&mut self, f: impl FnOnce(&mut Box<dyn SyncMode>, &mut Vec<f32>) -> R) -> PyResult<R> {
        let clock = self.clock;
        let replica = &mut self.replica;
        let r = MODES.with_borrow_mut(|m| {
            m.get_mut(self.slot).and_then(Option::as_mut).map(|mode| {
                if let Err(e) = mode.before_step(replica, clock) {
                    asap_train::comm::abort_job(&format!("Table read at clock {clock}: {}", text(&e)), 1);
                }
                f(mode, replica)
            })
        });
        r.ok_or_else(|| Error::new_err("this Table is closed (after finish() or close())"))
    }

    /// Row indices as usize, each checked against the table.
    fn row_indices(&self, rows: Vec<i64>) -> PyResult<Vec<usize>> {
        rows.into_iter()
            .map(|r| {
                usize::try_from(r)
                    .ok()
                    .filter(|&r| r < self.rows)
                    .ok_or_else(|| PyValueError::new_err(format!("row {r} is outside the table's 0..{}", self.rows)))
            })
            .collect()
    }

    fn snapshot(&self) -> PyResult<Snapshot> {
        match &self.last {
            Some(s) => Ok(s.clone()),
            None => MODES
                .with_borrow(|m| m.get(self.slot).and_then(Option::as_ref).map(|mode| (mode.stats().clone(), mode.metrics())))
                .ok_or_else(|| Error::new_err("this Table is closed")),
        }
    }
}

/// [`parse_flags`] for a table: its options, and ssp or bosen.
fn table_config(flags: &[String]) -> anyhow::Result<Merged> {
    let merged = parse_flags(flags, TABLE_OPTIONS, "Table")?;
    let cfg = &merged.options;
    anyhow::ensure!(
        matches!(cfg.sync, SyncKind::Ssp | SyncKind::Bosen),
        "sync={:?}: a Table runs ssp or bosen (allreduce, asap and none are asap_train.Reducer)",
        serde_json::to_value(cfg.sync)?.as_str().unwrap_or_default()
    );
    Ok(merged)
}

#[pymethods]
impl Table {
    /// Collective: every rank makes the same table. `init` (rows x row_len float32, the same on
    /// every rank) is the starting table; zeros when None.
    #[new]
    #[pyo3(signature = (rows, row_len, init=None, sync="ssp", **options))]
    fn new(
        rows: usize,
        row_len: usize,
        init: Option<PyReadonlyArray2<'_, f32>>,
        sync: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        if !crate::mpi_active() {
            return Err(Error::new_err("MPI is not active"));
        }
        if rows == 0 || row_len == 0 {
            return Err(OptionError::new_err(format!("a table needs rows >= 1 and row_len >= 1, got {rows} x {row_len}")));
        }
        let replica = match &init {
            None => vec![0.0; rows * row_len],
            Some(a) => {
                if a.shape() != [rows, row_len] {
                    return Err(PyValueError::new_err(format!("init has shape {:?}, the table {rows} x {row_len}", a.shape())));
                }
                a.as_array().iter().copied().collect()
            }
        };
        let comm = SimpleCommunicator::world();
        let flags = kwargs_to_flags(sync, options)?;
        let merged = agree(&comm, table_config(&flags)).map_err(OptionError::new_err)?;
        // The binary's plan (train/plan.rs), as a Reducer's: no training data, so only the rank
        // count's defaults apply; one clock is one round.
        let plan = agree(&comm, RunPlan::resolve(merged, &comm, None)).map_err(OptionError::new_err)?;
        let cfg = &plan.cfg;
        let ctx = agree(&comm, plan.sync_context(&comm, RowLayout::uniform(rows, row_len), 1)).map_err(OptionError::new_err)?;
        // Built by the mode's declaration, as the binary builds it; the table's info keeps what
        // concerns a table (not the parameters per shard).
        let built = cfg.sync.spec().build_run(&ctx, &cfg.mode_run(), &replica);
        let (mode, built_info) = agree(&comm, built).map_err(OptionError::new_err)?;
        let info = serde_json::json!({"staleness": built_info["staleness"], "apply": built_info["apply"],
                                      "bosen": built_info.get("bosen").cloned().unwrap_or_default()});
        let slot = MODES.with_borrow_mut(|m| {
            m.push(Some(mode));
            m.len() - 1
        });
        Ok(Table { slot, rows, row_len, replica, clock: 0, info, last: None })
    }

    /// Rows `rows` (all when None) as a (len(rows), row_len) array, as fresh as the staleness
    /// bound requires at this clock (waits for the shard servers otherwise), with this rank's
    /// own `inc`s of the current clock included.
    #[pyo3(signature = (rows=None))]
    fn get<'py>(&mut self, py: Python<'py>, rows: Option<Vec<i64>>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let idx = match rows {
            Some(r) => self.row_indices(r)?,
            None => (0..self.rows).collect(),
        };
        let w = self.row_len;
        let out = self.gated(|_, replica| idx.iter().flat_map(|&r| replica[r * w..(r + 1) * w].iter().copied()).collect::<Vec<f32>>())?;
        PyArray1::from_vec(py, out).reshape([idx.len(), w])
    }

    /// Adds `deltas` (len(rows) x row_len) to rows `rows`; the updates reach the shard servers
    /// at the next `clock()` (bosen: possibly earlier, most significant first).
    fn inc(&mut self, rows: Vec<i64>, deltas: PyReadonlyArray2<'_, f32>) -> PyResult<()> {
        let idx = self.row_indices(rows)?;
        if deltas.shape() != [idx.len(), self.row_len] {
            return Err(PyValueError::new_err(format!(
                "deltas has shape {:?}, expected ({}, {})",
                deltas.shape(),
                idx.len(),
                self.row_len
            )));
        }
        let d = deltas.as_array();
        let w = self.row_len;
        self.gated(|_, replica| {
            for (i, &r) in idx.iter().enumerate() {
                for (x, dx) in replica[r * w..(r + 1) * w].iter_mut().zip(d.row(i)) {
                    *x += dx;
                }
            }
        })
    }

    /// Ends this rank's clock: pushes its updates to the shard servers and asks for the rows of
    /// the next clock.
    fn clock(&mut self) -> PyResult<()> {
        let round = self.clock + 1;
        let r = self.gated(|mode, replica| mode.sync(replica, round))?;
        if let Err(e) = r {
            asap_train::comm::abort_job(&format!("Table.clock {round}: {}", text(&e)), 1);
        }
        self.clock = round;
        Ok(())
    }

    /// Collective end: every update applied, the servers' table on every rank (returned as a
    /// rows x row_len array); the table closes.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let r = self.gated(|mode, replica| mode.finish(replica))?;
        if let Err(e) = r {
            asap_train::comm::abort_job(&format!("Table.finish: {}", text(&e)), 1);
        }
        self.close();
        PyArray1::from_slice(py, &self.replica).reshape([self.rows, self.row_len])
    }

    /// Collective: frees the table's MPI state. Idempotent.
    fn close(&mut self) {
        if let Some(mode) = MODES.with_borrow_mut(|m| m.get_mut(self.slot).and_then(Option::take)) {
            self.last = Some((mode.stats().clone(), mode.metrics()));
            release(mode);
        }
    }

    /// This rank's counters (the binary's names): bytes, waits, and ssp's reads, blocked_reads,
    /// staleness_histogram (reads by how many clocks behind they were), max_staleness,
    /// staleness_bound ...
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.snapshot()?)
    }

    /// Collective, after finish(): the counters over all ranks (see Reducer.global_stats).
    /// While the table is open a rank may still wait for another's shard server, which a
    /// blocking collective would stop from answering: the job would hang.
    fn global_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match &self.last {
            Some(snap) => global_stats_dict(py, snap),
            None => Err(Error::new_err(
                "Table.global_stats() is collective: call it after finish() (while the table is open another rank may still wait for this rank's shard server)",
            )),
        }
    }

    /// Staleness bound, apply rule and bosen's options, as the metrics' start line records them.
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.info)
    }

    /// Clocks this rank completed.
    #[getter]
    fn clocks(&self) -> u64 {
        self.clock
    }

    /// (rows, row_len).
    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.row_len)
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        let mode = MODES.try_with(|m| m.borrow_mut().get_mut(self.slot).and_then(Option::take)).ok().flatten();
        if let Some(mode) = mode {
            release(mode);
        }
    }
}
