//! `asap_train._native`: the Python face of asap-train's sync layer and graph analysis (PyO3).
//!
//! A thin binding: every reduce runs the binary's own `asap_train::sync` modes, every option goes
//! through the binary's own parser and validation (`TrainConfig::merge`), and the graph functions
//! return the binary's own reports. Python-facing conveniences live in `asap_train/__init__.py`.

use std::sync::Mutex;

use mpi::topology::{Communicator, SimpleCommunicator};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

mod counts;
mod files;
mod graph;
mod reducer;
mod table;

create_exception!(asap_train, Error, PyRuntimeError, "An error of asap-train's sync layer or MPI set-up.");
create_exception!(
    asap_train,
    OptionError,
    PyValueError,
    "An option the binary would refuse (same message as `asap-train train`), raised on every rank."
);

create_exception!(
    asap_train,
    SyncCountError,
    Error,
    "The ranks made different numbers of syncs on a Reducer (raised on every rank, naming them): call join() on a rank out of data."
);

/// The MPI universe when this module initialised MPI (dropping it calls MPI_Finalize); None when
/// MPI was initialised by someone else (mpi4py), who then finalises it.
static UNIVERSE: Mutex<Option<mpi::environment::Universe>> = Mutex::new(None);

/// Initialises MPI once for the process, or adopts the MPI another module (mpi4py) initialised.
/// Returns (rank, size, initialised_here).
///
/// Before initialising, the binary's start-up environment is set (`comm::prepare_environment`:
/// Open MPI's one-sided component osc=ucx, yield when idle, one BLAS thread): Debian's default
/// one-sided component crashes on the mailboxes' 64-bit compare-and-swap, so MPI must not be
/// initialised before this module sets it, unless OMPI_MCA_osc=ucx is exported.
#[pyfunction]
fn init() -> PyResult<(i32, i32, bool)> {
    if mpi::environment::is_finalized() {
        return Err(Error::new_err("MPI was already finalised in this process; asap_train cannot use it again"));
    }
    let mut here = false;
    if !mpi::environment::is_initialized() {
        asap_train::comm::prepare_environment();
        let (universe, _threading) =
            mpi::initialize_with_threading(mpi::Threading::Funneled).ok_or_else(|| Error::new_err("MPI_Init_thread failed"))?;
        *UNIVERSE.lock().map_err(|_| Error::new_err("MPI state lock poisoned"))? = Some(universe);
        here = true;
        // A panic in the sync layer on one rank must not leave the others waiting for it.
        asap_train::comm::install_abort_on_panic();
        init_logging();
    } else {
        asap_train::comm::single_threaded_blas();
    }
    let world = SimpleCommunicator::world();
    Ok((world.rank(), world.size(), here))
}

/// Warnings of the sync layer (a graph whose in-degrees differ ...) on rank 0 only, as the
/// binary prints them; `RUST_LOG` overrides.
fn init_logging() {
    let rank = SimpleCommunicator::world().rank();
    let default = if rank == 0 { "warn" } else { "error" };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format(move |buf, rec| {
            use std::io::Write;
            writeln!(buf, "[asap_train {} rank {rank}] {}", rec.level(), rec.args())
        })
        .try_init();
}

/// Whether MPI is initialised and not yet finalised.
#[pyfunction]
fn mpi_active() -> bool {
    mpi::environment::is_initialized() && !mpi::environment::is_finalized()
}

/// Whether Open MPI's one-sided component was set to ucx in this process's environment (what the
/// asap reducer needs under Debian's Open MPI; see `init`).
#[pyfunction]
fn osc_ok() -> bool {
    if asap_train::comm::library() != asap_train::comm::MpiLibrary::OpenMpi {
        return true;
    }
    std::env::var("OMPI_MCA_osc").is_ok_and(|v| v.split(',').any(|c| c.trim() == "ucx"))
}

/// Collective end: frees every open reducer (in creation order, the same on every rank), then
/// calls MPI_Finalize when this module initialised MPI. Registered with `atexit`.
#[pyfunction]
fn finalize() {
    reducer::close_all();
    if let Ok(mut u) = UNIVERSE.lock() {
        // Dropping the universe calls MPI_Finalize (unless someone else already did).
        if let Some(universe) = u.take() {
            if mpi::environment::is_finalized() {
                std::mem::forget(universe);
            } else {
                drop(universe);
            }
        }
    }
}

/// Aborts every rank of the job with `code` after printing `message` with this rank's number:
/// what an uncaught exception on one rank does (the others would wait for it forever).
#[pyfunction]
fn abort(message: &str, code: i32) {
    asap_train::comm::abort_job(message, code)
}

/// A barrier on MPI_COMM_WORLD (for tests and examples that must not need mpi4py).
#[pyfunction]
fn barrier() {
    use mpi::collective::CommunicatorCollectives;
    SimpleCommunicator::world().barrier();
}

/// Sum over ranks of a float (for examples without mpi4py: a global loss or accuracy).
#[pyfunction]
fn allreduce_sum(x: f64) -> f64 {
    let mut v = [x];
    asap_train::comm::collectives::sum_f64(&SimpleCommunicator::world(), &mut v);
    v[0]
}

/// In-place element-wise sum over ranks of a float64 array (examples and tests without mpi4py).
#[pyfunction]
fn allreduce_sum_array(x: &Bound<'_, numpy::PyArray1<f64>>) -> PyResult<()> {
    use numpy::PyArrayMethods;
    let mut rw = x.try_readwrite().map_err(|e| PyValueError::new_err(e.to_string()))?;
    let v = rw.as_slice_mut().map_err(|_| PyValueError::new_err("the array must be C-contiguous"))?;
    asap_train::comm::collectives::sum_f64(&SimpleCommunicator::world(), v);
    Ok(())
}

/// Collective: `root`'s bytes into every rank's `bytes` (a C-contiguous numpy array of any
/// dtype, seen as uint8 by the caller), bit for bit. The lengths and the root are compared over
/// the ranks first, so a mismatch raises on every rank instead of truncating or hanging.
#[pyfunction]
#[pyo3(signature = (bytes, root=0))]
fn broadcast_bytes(bytes: &Bound<'_, numpy::PyArray1<u8>>, root: i64) -> PyResult<()> {
    use numpy::PyArrayMethods;
    let world = SimpleCommunicator::world();
    let mut rw = bytes.try_readwrite().map_err(|e| PyValueError::new_err(format!("the array cannot be written in place: {e}")))?;
    let v = rw.as_slice_mut().map_err(|_| PyValueError::new_err("the array must be C-contiguous"))?;
    let (len, size) = (v.len() as f64, world.size() as i64);
    let mut both = [len, -len, root as f64, -(root as f64)];
    asap_train::comm::collectives::max_f64(&world, &mut both);
    if both[0] != -both[1] || both[2] != -both[3] {
        return Err(OptionError::new_err(format!(
            "broadcast_parameters: the ranks passed different sizes ({} to {} bytes) or roots ({} to {}); every rank passes \
             the same structure and root",
            -both[1], both[0], -both[3], both[2]
        )));
    }
    if !(0..size).contains(&root) {
        return Err(OptionError::new_err(format!("broadcast_parameters: root={root}, but the ranks are 0..{}", size - 1)));
    }
    // An empty slice's pointer would read as MPI_IN_PLACE for bytes: nothing to send anyway.
    if !v.is_empty() {
        asap_train::comm::collectives::broadcast(&world, root as usize, v);
    }
    Ok(())
}

/// A serde_json value as the Python object `json.loads` would make of it.
pub(crate) fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i)) => i.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(a) => {
            let items = a.iter().map(|x| json_to_py(py, x)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// An anyhow error's whole chain as one line (what the binary prints after "error:").
pub(crate) fn text(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

/// The native half of the `asap_train` package.
#[pymodule]
mod _native {
    #[pymodule_export]
    use super::files::read_model;
    #[pymodule_export]
    use super::graph::{graph_gap, graph_gap_edges, graph_mix, graph_search};
    #[pymodule_export]
    use super::reducer::Reducer;
    #[pymodule_export]
    use super::table::Table;
    #[pymodule_export]
    use super::{
        abort, allreduce_sum, allreduce_sum_array, barrier, broadcast_bytes, finalize, init, mpi_active, osc_ok, Error, OptionError,
        SyncCountError,
    };
}
