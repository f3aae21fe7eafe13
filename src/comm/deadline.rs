//! Deadlines for collectives: once armed (for a training run), every collective of
//! [`super::collectives`] is started non-blocking and polled, and if it does not complete within
//! the timeout the job is aborted with a message naming the ranks that never reached it.
//!
//! Naming them needs no answer from them: each rank keeps, in its own words of a small one-sided
//! window (local stores, no MPI call), the number of collectives it has entered and a heartbeat
//! it bumps while it polls one. A rank that times out reads every rank's words, twice, 100 ms
//! apart. Ranks whose count is below its own never arrived; ranks that arrived but whose
//! heartbeat stands still are stopped or hung inside the collective (a collective can complete
//! on some ranks and not on others, so "arrived" alone does not clear a rank).
//!
//! How to read depends on the MPI (both measured with a SIGSTOPped rank, tests/deadline.rs):
//! Open MPI's osc/ucx completes `MPI_Get` + `MPI_Win_flush` without the target's help, so a
//! stopped rank is read and found standing still (its `MPI_Rget` requests, by contrast, often
//! did not complete within 0.5 s even from live ranks). MPICH 4.0.2 (ch4:ucx) completes a get
//! only while the target calls into MPI, and a flush towards a stopped rank never returns; there
//! each read is an `MPI_Rget` polled for at most [`READ_LIMIT`], and a rank that does not answer
//! is named as unreadable (stopped or hung).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;

use super::mailbox::Backoff;
use super::window::{RmaResult, Window};

struct Armed {
    board: Window,
    entered: u64,
    timeout: Duration,
}

thread_local! {
    // MPI is used from one thread (MPI_THREAD_FUNNELED), so the state is that thread's.
    static ARMED: RefCell<Option<Armed>> = const { RefCell::new(None) };
}

/// Collective: from now on collectives time out after `timeout`. Replaces an earlier arming.
pub fn arm(comm: &SimpleCommunicator, timeout: Duration) -> RmaResult<()> {
    let board = Window::allocate(comm, 16)?;
    ARMED.with(|a| *a.borrow_mut() = Some(Armed { board, entered: 0, timeout }));
    Ok(())
}

/// Collective: collectives block without a deadline again (frees the window).
pub fn disarm() {
    ARMED.with(|a| a.borrow_mut().take());
}

/// True when collectives have a deadline.
pub fn armed() -> bool {
    ARMED.with(|a| a.borrow().is_some())
}

/// Counts one more collective entered by this rank (published in its board word).
pub fn enter() {
    ARMED.with(|a| {
        if let Some(a) = a.borrow_mut().as_mut() {
            a.entered += 1;
            a.board.store_u64(0, a.entered);
        }
    });
}

/// Polls `req` until it completes; past the deadline aborts the job naming the ranks that have
/// not entered this collective. `what` names the collective for the message.
pub fn wait<'a, D: ?Sized, S: Scope<'a>>(mut req: Request<'a, D, S>, what: &str) {
    let timeout = ARMED.with(|a| a.borrow().as_ref().map(|a| a.timeout)).unwrap_or(Duration::MAX);
    let start = Instant::now();
    // Collectives advance only while ranks call into MPI: yield rather than sleep for a while.
    let mut backoff = Backoff::with_yield_window(Duration::from_millis(20));
    loop {
        match req.test() {
            Ok(_) => return,
            Err(r) => req = r,
        }
        beat();
        if start.elapsed() > timeout {
            // rsmpi panics when an unfinished request is dropped; the job ends right here.
            std::mem::forget(req);
            super::abort_job(&missing_ranks_message(what, start.elapsed()), 4);
        }
        backoff.pause();
    }
}

/// Bumps this rank's heartbeat word (it is alive and polling).
fn beat() {
    ARMED.with(|a| {
        if let Some(a) = a.borrow().as_ref() {
            a.board.store_u64(8, a.board.load_u64(8).wrapping_add(1));
        }
    });
}

/// How long a diagnostic read of one rank's board may take. Live ranks answer in microseconds
/// (they are polling MPI themselves); only a stopped or hung rank under an MPI that needs the
/// target's progress for a get (MPICH) uses it up.
const READ_LIMIT: Duration = Duration::from_millis(500);

/// Every rank's (collectives entered, heartbeat), or None where the read failed or did not
/// complete within [`READ_LIMIT`].
fn read_board(board: &Window) -> Vec<Option<[u64; 2]>> {
    let polled = super::library() == super::MpiLibrary::Mpich;
    (0..board.size())
        .map(|r| {
            if polled {
                board.get_within::<u64>(r, 0, 2, READ_LIMIT).ok().flatten().map(|w| [w[0], w[1]])
            } else {
                let mut words = [0u64; 2];
                board.get(r, 0, &mut words).ok().map(|_| words)
            }
        })
        .collect()
}

fn missing_ranks_message(what: &str, waited: Duration) -> String {
    ARMED.with(|a| {
        let a = a.borrow();
        let Some(a) = a.as_ref() else { return format!("{what} did not complete") };
        let first = read_board(&a.board);
        // Keep beating while we watch the others, so we do not look stopped to them.
        let t = Instant::now();
        // Calling into MPI meanwhile serves the others' reads of our board where the MPI needs
        // the target's help for them (MPICH).
        while t.elapsed() < Duration::from_millis(100) {
            a.board.store_u64(8, a.board.load_u64(8).wrapping_add(1));
            let _ = a.board.progress();
            std::thread::sleep(Duration::from_millis(5));
        }
        let second = read_board(&a.board);
        let mut named = Vec::new();
        let mut how = Vec::new();
        for (r, (x, y)) in first.iter().zip(&second).enumerate() {
            match (x, y) {
                (Some([n, _]), _) if *n < a.entered => {
                    named.push(r);
                    how.push(format!("rank {r} never reached it (at collective {n} of {})", a.entered));
                }
                (Some([_, b1]), Some([_, b2])) if b1 == b2 && r as i32 != a.board.rank() => {
                    named.push(r);
                    how.push(format!("rank {r} reached it but stands still (stopped or hung)"));
                }
                (None, _) | (_, None) => {
                    named.push(r);
                    how.push(format!("rank {r} does not answer a one-sided read within {:.1} s (stopped or hung)", READ_LIMIT.as_secs_f64()));
                }
                _ => {}
            }
        }
        format!(
            "{what} did not complete within {:.1} s (--wait-timeout): rank(s) {named:?} hold it up: {}",
            waited.as_secs_f64(),
            if how.is_empty() { "no rank found behind or standing still".to_owned() } else { how.join("; ") }
        )
    })
}
