//! Preemption: SIGTERM or SIGUSR1 (what Slurm sends with `--signal`, and what `mpirun` forwards to
//! the ranks) asks the job to stop at the next safe point, and every rank must pick the same one.
//!
//! A signal only sets a flag. Every `period` rounds each rank starts a non-blocking allreduce
//! (MAX) of its flag; the vote started at round jK is waited for at round (j+1)K, before the next
//! one starts. If it says some rank had the signal, every rank stops at that round (j+1)K: the
//! same round on all of them, and the vote costs no waiting in lockstep modes and at most one
//! loose meeting every `period` rounds in asynchronous ones. Knows nothing of ML.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::backoff::Backoff;

static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNALLED.store(true, Ordering::SeqCst);
}

/// Routes SIGTERM and SIGUSR1 to the stop flag (instead of ending the process).
pub fn install_handlers() {
    for sig in [libc::SIGTERM, libc::SIGUSR1] {
        // SAFETY: `on_signal` is an `extern "C" fn(c_int)` that only stores to an atomic, which
        // is async-signal-safe; installing a handler has no other precondition.
        unsafe {
            libc::signal(sig, on_signal as extern "C" fn(c_int) as libc::sighandler_t);
        }
    }
}

/// True once this process received SIGTERM or SIGUSR1.
pub fn signalled() -> bool {
    SIGNALLED.load(Ordering::SeqCst)
}

/// One vote in flight: MPI reads `send` and writes `recv` until the request completes, so both
/// live on the heap where moving the `Vote` does not move them.
struct Vote {
    request: ffi::MPI_Request,
    send: Box<u64>,
    recv: Box<u64>,
}

/// The rounds at which all ranks agree whether to stop (see the module doc).
pub struct StopVote {
    comm: SimpleCommunicator,
    period: u64,
    pending: Option<Vote>,
    timeout: Duration,
}

impl StopVote {
    /// Collective (duplicates `comm`). `period` >= 1 rounds between votes.
    pub fn new(comm: &SimpleCommunicator, period: u64, timeout: Duration) -> Self {
        StopVote { comm: comm.duplicate(), period: period.max(1), pending: None, timeout }
    }

    /// Called by every rank after every round: true when all ranks stop after this round.
    pub fn stop_after(&mut self, round: u64) -> anyhow::Result<bool> {
        self.stop_after_serving(round, &mut || Ok(()))
    }

    /// [`StopVote::stop_after`], calling `serve` while it waits for the vote: a rank that others
    /// need to make progress (the async coordinator) keeps answering them, so it need not be
    /// kept from running ahead into a vote.
    pub fn stop_after_serving(&mut self, round: u64, serve: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<bool> {
        if !round.is_multiple_of(self.period) {
            return Ok(false);
        }
        let stop = match self.pending.take() {
            Some(v) => self.finish(v, round, serve)? != 0,
            None => false,
        };
        if !stop {
            self.start()?;
        }
        Ok(stop)
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let send = Box::new(signalled() as u64);
        let mut recv = Box::new(0u64);
        // SAFETY: rsmpi's handle statics are immutable after MPI_Init.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `send` and `recv` are boxed u64s that stay alive and unmoved (heap) inside the
        // `Vote` until MPI_Test reports completion; on drop of an unfinished vote they are
        // leaked. The communicator outlives the request.
        let code = unsafe {
            ffi::MPI_Iallreduce(
                (&*send as *const u64).cast(),
                (&mut *recv as *mut u64).cast(),
                1,
                // Flags are 0 or 1: unsigned MAX is right even where MPI compares it as signed
                // (MPICH 4.0.2; see collectives::max_u64).
                ffi::RSMPI_UINT64_T,
                ffi::RSMPI_MAX,
                self.comm.as_raw(),
                &mut request,
            )
        };
        anyhow::ensure!(code == ffi::MPI_SUCCESS as c_int, "MPI_Iallreduce failed (code {code})");
        self.pending = Some(Vote { request, send, recv });
        Ok(())
    }

    fn finish(&mut self, mut v: Vote, round: u64, serve: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<u64> {
        // Past --wait-timeout the sign-of-life board judges the wait: only ranks without a sign
        // of life are named, and the wait goes on while every rank lives (see comm::deadline).
        let mut deadline = super::deadline::WaitDeadline::new(self.timeout);
        let mut backoff = Backoff::with_yield_window(Duration::from_millis(20));
        let mut verdict: Option<String> = None;
        loop {
            let mut flag: c_int = 0;
            // SAFETY: the request came from MPI_Iallreduce and has not completed yet.
            let code = unsafe { ffi::MPI_Test(&mut v.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            anyhow::ensure!(code == ffi::MPI_SUCCESS as c_int, "MPI_Test failed (code {code})");
            if flag != 0 {
                return Ok(*v.recv);
            }
            if let Some(why) = verdict {
                let Vote { send, recv, .. } = v;
                std::mem::forget((send, recv));
                anyhow::bail!(
                    "rank {}: the stop vote of round {} did not complete within {:.1} s (--wait-timeout): {why}",
                    self.comm.rank(),
                    round - self.period,
                    deadline.waited().as_secs_f64()
                );
            }
            verdict = deadline.check(|| {});
            serve()?;
            backoff.pause();
        }
    }

    /// Completes a vote still in flight (collective: every rank calls it at the end of training,
    /// so no request outlives the run).
    pub fn close(&mut self) -> anyhow::Result<()> {
        if let Some(v) = self.pending.take() {
            self.finish(v, u64::MAX / 2, &mut || Ok(()))?;
        }
        Ok(())
    }
}

impl Drop for StopVote {
    fn drop(&mut self) {
        if let Some(v) = self.pending.take() {
            // MPI may still write `recv`: leak the buffers (only on the way to an abort).
            std::mem::forget((v.send, v.recv));
        }
    }
}
