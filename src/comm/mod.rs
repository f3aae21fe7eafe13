//! The MPI layer: start-up environment, job-wide abort, and (in submodules) one-sided RMA.
//! Knows nothing of machine learning.

pub mod collectives;
pub mod deadline;

use mpi::topology::{Communicator, SimpleCommunicator};

/// The MPI library this binary runs on (it matters where the two behave differently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MpiLibrary {
    OpenMpi,
    Mpich,
    Other,
}

/// Which MPI library is linked, from `MPI_Get_library_version` (callable before `MPI_Init`).
pub fn library() -> MpiLibrary {
    static LIB: std::sync::OnceLock<MpiLibrary> = std::sync::OnceLock::new();
    *LIB.get_or_init(|| {
        let v = mpi::environment::library_version().unwrap_or_default();
        if v.contains("Open MPI") {
            MpiLibrary::OpenMpi
        } else if v.contains("MPICH") {
            MpiLibrary::Mpich
        } else {
            MpiLibrary::Other
        }
    })
}

/// Sets the Open MPI variables this program needs before `MPI_Init`, unless the user set them:
/// - `osc=ucx`: Debian's default one-sided components crash on 64-bit compare-and-swap and fail
///   window creation at one rank (Open MPI 4.1.4 osc/rdma over btl/vader; upstream
///   open-mpi/ompi#7967 and #11349);
/// - `mpi_yield_when_idle=1`: with more ranks than cores, ranks blocked in MPI must give up the CPU.
///
/// Open MPI reads `OMPI_MCA_*` from the process environment inside `MPI_Init`, so setting them
/// here (before [`init`]) is honoured even under `mpirun`/`srun`.
pub fn prepare_environment() {
    for (k, v) in [("OMPI_MCA_osc", "ucx"), ("OMPI_MCA_mpi_yield_when_idle", "1")] {
        if std::env::var_os(k).is_none() {
            std::env::set_var(k, v);
        }
    }
    single_threaded_blas();
}

extern "C" {
    /// OpenBLAS's run-time thread setting (libopenblas, linked through ndarray-linalg).
    fn openblas_set_num_threads(n: std::os::raw::c_int);
}

/// One MPI rank per core is the process model, so BLAS inside a rank must not start its own
/// threads: with 4 ranks on 2 cores, OpenBLAS's default pool made evaluation 5x slower. OpenBLAS
/// reads OPENBLAS_NUM_THREADS when the library loads, before `main`, so the setting is made
/// through its API; a user's explicit OPENBLAS_NUM_THREADS is respected.
pub fn single_threaded_blas() {
    if std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        // SAFETY: a plain setter in libopenblas with no pointers; called before any BLAS use.
        unsafe { openblas_set_num_threads(1) };
    }
}

/// Initialises MPI (after [`prepare_environment`]) and installs a panic hook that aborts the whole
/// job, so a panic on one rank can never leave the others hung in a collective.
pub fn init() -> anyhow::Result<mpi::environment::Universe> {
    prepare_environment();
    let (universe, _threading) = mpi::initialize_with_threading(mpi::Threading::Funneled)
        .ok_or_else(|| anyhow::anyhow!("MPI was already initialised"))?;
    install_abort_on_panic();
    Ok(universe)
}

/// Replaces the panic hook by one that prints the panic (with the rank) and calls `MPI_Abort`.
pub fn install_abort_on_panic() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let world = SimpleCommunicator::world();
        eprintln!("asap-train: rank {} panicked; aborting the whole job", world.rank());
        default_hook(info);
        world.abort(101);
    }));
}

/// Prints `message` prefixed by the rank and aborts every rank of the job with `code`.
/// For errors found by one rank alone in the middle of training, where the others cannot be told.
pub fn abort_job(message: &str, code: i32) -> ! {
    let world = SimpleCommunicator::world();
    eprintln!("asap-train: error on rank {}: {message}", world.rank());
    world.abort(code)
}

pub mod mailbox;
pub mod pace;
pub mod postbox;
pub mod preempt;
pub mod window;
