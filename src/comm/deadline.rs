//! Deadlines for collectives: once armed (for a training run), every collective of
//! collectives.rs (named, not linked: that file uses this one, and the link would make a circle) is
//! started non-blocking and polled, and if it does not complete within the timeout the job is
//! aborted with a message naming the ranks that never reached it.
//!
//! Naming them needs no answer from them: each rank keeps, in its own words of a small one-sided
//! window (local stores, no MPI call), the number of collectives it has entered, a heartbeat it
//! bumps while it polls one, and a sign of life bumped every [`LIFE_BEAT`] by a thread of its own
//! (a SIGSTOPped process stops all its threads; a rank that is merely busy elsewhere, or starved
//! of CPU on a loaded machine, keeps it moving). A rank that times out watches every rank's words
//! for [`WATCH`] and names only the ranks whose sign of life stood still (stopped) while its own
//! kept moving (a watcher starved of CPU proves nothing: [`MIN_OWN_BEATS`]) or that do not
//! answer the read. A rank that is alive is not blamed, behind or not (one that completed the
//! collective may be computing its next step, which a stuck one cannot be told from): it is not to blame: under load (two CPU burners beside a 3-rank job) a rank can miss a 3 s
//! deadline while computing its step or evaluating, and blaming it named the wrong ranks. When
//! every rank lives, the wait goes on for another timeout, up to [`MAX_EXTENSIONS`] times while
//! no rank is found stopped; after that the job ends saying that it cannot tell who holds it up.
//!
//! Waits outside the collectives (a parameter server's wait for rows or updates, a postbox's
//! flush, Gaia's wait for other data centres) judge by the same board through [`WaitDeadline`]:
//! what such a wait lacks (the shards that have not answered, say) is not who holds it up. Under
//! ssp with rank 1 stopped, every shard server holds rank 0's read back (none may answer without
//! rank 1's updates), and naming them all blamed live ranks (issue 27).
//!
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;

use super::backoff::Backoff;
use super::window::{RmaResult, Window};

struct Armed {
    board: Window,
    entered: u64,
    timeout: Duration,
    life: Option<LifeBeat>,
}

/// Board words (u64 offsets): collectives entered, polling heartbeat, sign of life.
const ENTERED: usize = 0;
const POLLING: usize = 8;
const LIFE: usize = 16;
/// How often the sign-of-life thread bumps its word (cheap: one atomic store).
const LIFE_BEAT: Duration = Duration::from_millis(20);
/// How long a timed-out rank watches the board. A starved but running process gets the CPU
/// many times a second even beside two nice-0 CPU burners at nice 19 (CFS gives it ~1.5 % in
/// slices of a few ms), so a sign of life that stands still for 1 s means a stopped process.
const WATCH: Duration = Duration::from_secs(1);
/// Beats of its own sign of life a watching rank must see during [`WATCH`] (of the 50 a rank
/// that runs freely makes) before a still rank counts as stopped: beside a benchmark at nice -20
/// a nice-19 rank can get no CPU for seconds, and then every rank of the job stands still
/// alike; a watcher starved like that cannot tell a stopped rank from a starved one and names
/// nobody this time (issue 27: a rank blamed ranks [0, 1] while only rank 1 was stopped).
const MIN_OWN_BEATS: u64 = 10;
/// Extra timeouts waited while every rank lives but the collective does not complete (a
/// mismatch of collectives between ranks would otherwise hang the job).
const MAX_EXTENSIONS: u32 = 10;

/// The thread that bumps this rank's sign-of-life word; stopped (joined) before the window is
/// freed.
struct LifeBeat {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The board's sign-of-life word, handed to the beating thread.
struct LifeWord(*const AtomicU64);
// SAFETY: the pointer is into this rank's window memory, which stays allocated until `LifeBeat`
// is dropped, and that drop joins the thread first (see `Armed`'s field order and `Drop`). The
// word is only touched through atomic operations, so sharing it with the thread is sound.
unsafe impl Send for LifeWord {}

impl LifeBeat {
    fn start(board: &Window) -> LifeBeat {
        let word = LifeWord(board.local_atomic_u64(LIFE));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("deadline-life".into())
            .spawn(move || {
                let word = word;
                while !flag.load(Ordering::Relaxed) {
                    // SAFETY: see `LifeWord`: the window outlives this thread.
                    unsafe { (*word.0).fetch_add(1, Ordering::Release) };
                    std::thread::sleep(LIFE_BEAT);
                }
            })
            .ok();
        LifeBeat { stop, thread }
    }
}

impl Drop for LifeBeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        // The thread writes into the board's memory: stop it before the board is freed.
        self.life.take();
    }
}

thread_local! {
    // MPI is used from one thread (MPI_THREAD_FUNNELED), so the state is that thread's.
    static ARMED: RefCell<Option<Armed>> = const { RefCell::new(None) };
}

/// Collective: from now on collectives time out after `timeout`. Replaces an earlier arming.
pub fn arm(comm: &SimpleCommunicator, timeout: Duration) -> RmaResult<()> {
    let board = Window::allocate(comm, 24)?;
    let life = Some(LifeBeat::start(&board));
    ARMED.with(|a| *a.borrow_mut() = Some(Armed { board, entered: 0, timeout, life }));
    Ok(())
}

/// Collective: collectives block without a deadline again (frees the window).
pub fn disarm() {
    ARMED.with(|a| a.borrow_mut().take());
}

/// After a lost rank (src/comm/ulfm.rs): stops the sign-of-life thread and leaks the board,
/// whose window cannot be freed (a collective over a communicator with a dead rank). The next
/// [`arm`] makes a new one over the survivors.
pub fn abandon() {
    if let Some(mut a) = ARMED.with(|a| a.borrow_mut().take()) {
        a.life.take();
        std::mem::forget(a);
    }
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
            a.board.store_u64(ENTERED, a.entered);
        }
    });
}

/// Polls `req` until it completes; past the deadline aborts the job naming the ranks that hold
/// it up (see the module comment for when it waits longer). `what` names the collective.
pub fn wait<'a, D: ?Sized, S: Scope<'a>>(req: Request<'a, D, S>, what: &str) {
    wait_serving(req, what, &mut || {});
}

/// [`wait`], calling `serve` between polls: a caller whose peers may be waiting for something
/// only this rank can hand over meanwhile (gaia's paced mirror data, held until the emulated
/// link would have carried it) keeps handing it over while the collective is in flight.
///
/// Under `--on-rank-loss continue` (src/comm/ulfm.rs), a collective that a lost rank ended (it
/// completes in error once the communicator is revoked) unwinds to the training loop when it
/// completes, so no caller goes on with what it received: every caller's scope holds this one
/// request alone ([`wait_then_go_on`] is for the one that holds two).
pub fn wait_serving<'a, D: ?Sized, S: Scope<'a>>(req: Request<'a, D, S>, what: &str, serve: &mut dyn FnMut()) {
    wait_for(req, what, serve);
    super::ulfm::unwind_if_lost();
}

/// [`wait`] that does not unwind when a rank was lost: for the first of two requests of one
/// scope (rsmpi aborts the process if a scope is left with a request unfinished); the wait for
/// the second unwinds.
pub fn wait_then_go_on<'a, D: ?Sized, S: Scope<'a>>(req: Request<'a, D, S>, what: &str) {
    wait_for(req, what, &mut || {});
}

fn wait_for<'a, D: ?Sized, S: Scope<'a>>(mut req: Request<'a, D, S>, what: &str, serve: &mut dyn FnMut()) {
    let timeout = ARMED.with(|a| a.borrow().as_ref().map(|a| a.timeout)).unwrap_or(Duration::MAX);
    let start = Instant::now();
    let mut deadline = timeout;
    let mut extensions = 0;
    // Collectives advance only while ranks call into MPI: yield rather than sleep for a while.
    let mut backoff = Backoff::with_yield_window(Duration::from_millis(20));
    loop {
        match req.test() {
            Ok(_) => return,
            Err(r) => req = r,
        }
        serve();
        beat();
        if start.elapsed() > deadline && super::ulfm::lost() {
            // A revoked communicator completes every request at once; one that did not is a bug
            // in the recovery, and the board may hold a dead rank's words (no reads of it).
            std::mem::forget(req);
            super::abort_now(&format!("{what} did not complete within {timeout:?} after a rank was lost"), 4);
        }
        if start.elapsed() > deadline {
            let verdict = diagnose(what, start.elapsed());
            if verdict.blamed || extensions >= MAX_EXTENSIONS {
                // rsmpi panics when an unfinished request is dropped; the job ends right here.
                std::mem::forget(req);
                super::abort_now(&verdict.message, 4);
            }
            extensions += 1;
            deadline = start.elapsed() + timeout;
        }
        backoff.pause();
    }
}

/// Bumps this rank's heartbeat word (it is alive and polling).
fn beat() {
    ARMED.with(|a| {
        if let Some(a) = a.borrow().as_ref() {
            a.board.store_u64(POLLING, a.board.load_u64(POLLING).wrapping_add(1));
        }
    });
}

/// How long a diagnostic read of one rank's board may take. Live ranks answer in microseconds
/// (they are polling MPI themselves); only a stopped or hung rank under an MPI that needs the
/// target's progress for a get (MPICH) uses it up.
const READ_LIMIT: Duration = Duration::from_millis(500);

/// Every rank's (collectives entered, polling heartbeat, sign of life), or None where the read failed or did not
/// complete within [`READ_LIMIT`].
fn read_board(board: &Window) -> Vec<Option<[u64; 3]>> {
    let polled = super::library() == super::MpiLibrary::Mpich;
    (0..board.size())
        .map(|r| {
            if polled {
                board.get_within::<u64>(r, 0, 3, READ_LIMIT).ok().flatten().map(|w| [w[0], w[1], w[2]])
            } else {
                let mut words = [0u64; 3];
                board.get(r, 0, &mut words).ok().map(|_| words)
            }
        })
        .collect()
}

/// What a timed-out rank saw on the board during one watch.
struct Seen {
    /// Ranks found stopped, hung or unreadable, and how each was found.
    named: Vec<usize>,
    how: Vec<String>,
    /// What else was seen (live ranks behind, a watcher starved of CPU).
    notes: Vec<String>,
}

impl Seen {
    /// "rank(s) [..] hold it up: how", or None when no rank was found stopped.
    fn blame(&self) -> Option<String> {
        (!self.named.is_empty()).then(|| format!("rank(s) {:?} hold it up: {}", self.named, self.how.join("; ")))
    }

    /// What was seen when no rank could be blamed.
    fn seen(&self) -> String {
        if self.notes.is_empty() {
            "every rank runs and polls".to_owned()
        } else {
            self.notes.join("; ")
        }
    }
}

/// Reads the board, watches it for [`WATCH`] while bumping this rank's polling word and calling
/// `keep` (the waiting code's own serving, so that this rank still answers the others), and
/// judges the two reads; None when no board is armed. The board is borrowed only for each read,
/// never across `keep`.
fn watch(entered: Option<u64>, mut keep: impl FnMut()) -> Option<Seen> {
    let (me, first) = ARMED.with(|a| a.borrow().as_ref().map(|a| (a.board.rank() as usize, read_board(&a.board))))?;
    let t = Instant::now();
    while t.elapsed() < WATCH {
        // Calling into MPI meanwhile serves the others' reads of our board where the MPI needs
        // the target's help for them (MPICH).
        ARMED.with(|a| {
            if let Some(a) = a.borrow().as_ref() {
                a.board.store_u64(POLLING, a.board.load_u64(POLLING).wrapping_add(1));
                let _ = a.board.progress();
            }
        });
        keep();
        std::thread::sleep(Duration::from_millis(5));
    }
    let second = ARMED.with(|a| a.borrow().as_ref().map(|a| read_board(&a.board)))?;
    Some(judge(entered, me, &first, &second))
}

/// What a timed-out collective found on the board.
struct Verdict {
    /// Some rank was found stopped, hung or unreadable (named in `message`).
    blamed: bool,
    message: String,
}

/// Watches every rank's board words for [`WATCH`] and says which ranks hold `what` up.
fn diagnose(what: &str, waited: Duration) -> Verdict {
    let entered = ARMED.with(|a| a.borrow().as_ref().map(|a| a.entered));
    let Some(seen) = entered.and_then(|e| watch(Some(e), || {})) else {
        return Verdict { blamed: true, message: format!("{what} did not complete") };
    };
    collective_verdict(what, waited, &seen)
}

/// The message of a collective that timed out, from what the watch saw.
fn collective_verdict(what: &str, waited: Duration, seen: &Seen) -> Verdict {
    let message = match seen.blame() {
        Some(blame) => format!("{what} did not complete within {:.1} s (--wait-timeout): {blame}", waited.as_secs_f64()),
        None => format!(
            "{what} did not complete within {:.1} s (--wait-timeout and {MAX_EXTENSIONS} extensions while every rank showed signs of life): cannot tell which rank holds it up: {}",
            waited.as_secs_f64(),
            seen.seen()
        ),
    };
    Verdict { blamed: seen.blame().is_some(), message }
}

/// What two reads of the board [`WATCH`] apart show (`me` watching). `entered`: the collectives
/// `me` entered, when it waits in one (then live ranks still before it are noted); None for a
/// wait outside the collectives.
fn judge(entered: Option<u64>, me: usize, first: &[Option<[u64; 3]>], second: &[Option<[u64; 3]>]) -> Seen {
    let (mut named, mut how, mut notes) = (Vec::new(), Vec::new(), Vec::new());
    let watch = WATCH.as_secs_f64();
    let own = match (first.get(me).copied().flatten(), second.get(me).copied().flatten()) {
        (Some(a), Some(b)) => b[2].wrapping_sub(a[2]),
        _ => u64::MAX,
    };
    let starved = own < MIN_OWN_BEATS;
    if starved {
        notes.push(format!(
            "this rank itself beat {own} times in {watch:.1} s (the machine starves it: a still rank may be starved too, not stopped)"
        ));
    }
    for (r, (x, y)) in first.iter().zip(second).enumerate() {
        if r == me {
            continue;
        }
        let (Some([_, _, l1]), Some([n2, _, l2])) = (x, y) else {
            named.push(r);
            how.push(format!("rank {r} does not answer a one-sided read within {:.1} s (stopped or hung)", READ_LIMIT.as_secs_f64()));
            continue;
        };
        if l1 == l2 && starved {
            notes.push(format!("rank {r} showed no sign of life either"));
        } else if l1 == l2 {
            named.push(r);
            let at = match entered {
                Some(e) if *n2 < e => format!(", before it, at collective {n2} of {e}"),
                Some(_) => ", inside it".to_owned(),
                None => String::new(),
            };
            how.push(format!("rank {r} shows no sign of life for {watch:.1} s{at} (stopped)"));
        } else if entered.is_some_and(|e| *n2 < e) {
            notes.push(format!("rank {r} runs but is still before it (collective {n2} of {})", entered.unwrap_or(0)));
        }
    }
    Seen { named, how, notes }
}

/// The deadline of a wait outside the collectives (parameter servers' waits for rows or updates,
/// a postbox's flush, Gaia's wait for other data centres), judged like a collective's: past
/// `timeout`, [`WaitDeadline::check`] watches the board and names only the ranks without a sign
/// of life; while every rank lives the wait goes on for another timeout, up to
/// [`MAX_EXTENSIONS`] times, and then says that it cannot tell. What the wait lacks (which
/// shards have not answered) is the caller's to say: those ranks may be alive and waiting for the
/// stopped one themselves.
pub struct WaitDeadline {
    start: Instant,
    timeout: Duration,
    due: Duration,
    extensions: u32,
}

impl WaitDeadline {
    /// Starts the clock of a wait that may last `timeout` (`--wait-timeout`) before it is judged.
    pub fn new(timeout: Duration) -> Self {
        WaitDeadline { start: Instant::now(), timeout, due: timeout, extensions: 0 }
    }

    /// Time since the wait began.
    pub fn waited(&self) -> Duration {
        self.start.elapsed()
    }

    /// None while the wait may go on. Past the deadline it watches the board for [`WATCH`],
    /// calling `keep` meanwhile (the wait's own serving), and returns why the wait fails: "rank(s)
    /// [..] hold it up: .." naming only ranks without a sign of life; or, after
    /// [`MAX_EXTENSIONS`] timeouts in which every rank lived, that it cannot tell (None and a new
    /// deadline before then). Without an armed board (outside a training run) it cannot tell at
    /// once. The caller says what it waited for, and should check whether the wait completed
    /// during the watch before it fails.
    pub fn check(&mut self, keep: impl FnMut()) -> Option<String> {
        if self.start.elapsed() <= self.due {
            return None;
        }
        let Some(seen) = watch(None, keep) else {
            return Some(
                "cannot tell which rank holds it up (no sign-of-life board outside a training run): it may be stuck, dead or too slow"
                    .to_owned(),
            );
        };
        if let Some(blame) = seen.blame() {
            return Some(blame);
        }
        if self.extensions >= MAX_EXTENSIONS {
            return Some(format!(
                "cannot tell which rank holds it up ({MAX_EXTENSIONS} more timeouts waited while every rank showed signs of life): {}",
                seen.seen()
            ));
        }
        self.extensions += 1;
        self.due = self.start.elapsed() + self.timeout;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a rank without a sign of life (or that does not answer) is named; a live rank that
    /// is behind (busy, or starved by the OS) or past it (computing its next step) is not.
    #[test]
    fn only_stopped_ranks_are_named() {
        let w = Duration::from_secs(3);
        let verdict = |entered, me, first: &[Option<[u64; 3]>], second: &[Option<[u64; 3]>]| {
            collective_verdict("an allreduce", w, &judge(Some(entered), me, first, second))
        };
        // Rank 0 behind but alive, rank 1 stopped inside, rank 2 (me) waiting.
        let first = [Some([4, 10, 100]), Some([5, 7, 50]), Some([5, 1, 1])];
        let second = [Some([4, 10, 140]), Some([5, 7, 50]), Some([5, 1, 51])];
        let v = verdict(5, 2, &first, &second);
        assert!(v.blamed && v.message.contains("rank(s) [1]") && v.message.contains("inside it"), "{}", v.message);
        // Rank 1 stopped before reaching it, rank 2 done with it and computing: only rank 1.
        let first = [Some([5, 10, 100]), Some([4, 7, 50]), Some([5, 1, 1])];
        let second = [Some([5, 12, 140]), Some([4, 7, 50]), Some([5, 1, 9])];
        let v = verdict(5, 0, &first, &second);
        assert!(v.blamed && v.message.contains("rank(s) [1]") && v.message.contains("before it"), "{}", v.message);
        // Everyone alive: nobody is blamed, and the message says it cannot tell.
        let second = [Some([5, 12, 140]), Some([4, 7, 90]), Some([5, 1, 3])];
        let v = verdict(5, 0, &first, &second);
        assert!(
            !v.blamed && v.message.contains("cannot tell") && v.message.contains("rank 1 runs but is still before it"),
            "{}",
            v.message
        );
        // A watcher that itself got no CPU (its own sign of life barely moved) names nobody:
        // rank 1 standing still proves nothing then.
        let first = [Some([5, 10, 100]), Some([4, 7, 50]), Some([5, 1, 1])];
        let second = [Some([5, 12, 103]), Some([4, 7, 50]), Some([5, 1, 1])];
        let v = verdict(5, 0, &first, &second);
        assert!(
            !v.blamed && v.message.contains("starves it") && v.message.contains("rank 1 showed no sign of life either"),
            "{}",
            v.message
        );
        // An unreadable rank is named.
        let v = verdict(5, 0, &[Some([5, 1, 1]), None], &[Some([5, 1, 1]), None]);
        assert!(v.blamed && v.message.contains("rank(s) [1]"), "{}", v.message);
    }

    /// Outside a collective the same board decides, without collective positions: under ssp
    /// with rank 1 stopped, ranks 0 and 2 (alive, their collective counts apart) are not named.
    #[test]
    fn a_wait_outside_the_collectives_names_only_the_still_rank() {
        let first = [Some([3, 0, 100]), Some([4, 0, 50]), Some([2, 0, 7])];
        let second = [Some([3, 0, 150]), Some([4, 0, 50]), Some([2, 0, 40])];
        let seen = judge(None, 2, &first, &second);
        assert_eq!(seen.named, [1]);
        let blame = seen.blame().unwrap();
        assert!(blame.starts_with("rank(s) [1] hold it up: rank 1 shows no sign of life for 1.0 s (stopped)"), "{blame}");
        assert!(!blame.contains("collective"), "{blame}");
        // Every rank alive: nobody is blamed, and nothing is said of collectives.
        let second = [Some([3, 0, 150]), Some([4, 0, 51]), Some([2, 0, 40])];
        let seen = judge(None, 2, &first, &second);
        assert!(seen.blame().is_none() && seen.seen() == "every rank runs and polls", "{}", seen.seen());
    }

    /// Without an armed board (outside a training run) a wait past its deadline cannot tell at
    /// once; before the deadline it goes on.
    #[test]
    fn an_unarmed_wait_fails_at_its_deadline_saying_it_cannot_tell() {
        disarm();
        let mut d = WaitDeadline::new(Duration::from_millis(30));
        let mut kept = 0;
        assert_eq!(d.check(|| kept += 1), None);
        std::thread::sleep(Duration::from_millis(40));
        let why = d.check(|| kept += 1).expect("past the deadline");
        assert!(why.starts_with("cannot tell which rank holds it up") && kept == 0, "{why}");
        assert!(d.waited() >= Duration::from_millis(40));
    }
}
