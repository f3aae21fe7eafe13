//! Equal sync counts and `Reducer.join()` (issue 43 item 5): every rank of a Reducer must make
//! the same number of syncs, or the ranks that run out of data must call `join()`, as under
//! DDP's and Horovod's join.
//!
//! Without a check, a rank that called `sync` once more than the others matched their
//! `finish()` with its round (the allreduce mode's finish is the same allreduce: ranks 1-3 got a
//! silently wrong model, `[1.5 1.5 1.5]`, and rank 0 hung in its finish), or under asap waited
//! `wait_timeout` for neighbours that had stopped and then aborted the job blaming them.
//!
//! The protocol: before each round of a mode that communicates at `sync` (allreduce, asap),
//! and before `join`, `finish`, `close` and the close at interpreter exit, every rank states
//! what it is doing ([`Call`]) in one allreduce (MAX) of 10 doubles on MPI_COMM_WORLD: which
//! reducer (its creation index), which calls are present, and the range of the sync counts. No
//! rank enters a mode's round, or its finish, until every rank is known to enter the same one,
//! so a mismatch is found at once and raised on every rank (each is inside the same control
//! allreduce), with an allgather of every rank's (call, count) to name them. `sync="none"`
//! communicates nothing at `sync`, so its counts are compared at `join`/`finish`/`close`/exit
//! only (no per-sync cost). The allreduce is a blocking one: a check that does not wait (an
//! `MPI_Iallreduce` completed at the next call) would let a rank that syncs past the others
//! enter the mode's round before knowing, and under allreduce that round never returns. Its
//! cost, measured in docs/python.md: one small allreduce per sync, and under asap a global
//! rendezvous per round (the ranks can no longer drift apart by more than a round).
//!
//! A rank in `join()` answers every later round of the others: under plain allreduce it sends
//! nothing (zeros and a count of 0) and every rank gets the mean of the ACTIVE ranks' models,
//! the joined ones included, so that all end equal; under asap it runs the mode's round on its
//! model with no local steps (a relay: the graph and its weights stay as they were, push-sum's
//! mass is kept); allreduce with an outer optimizer or compression keeps per-rank state that a
//! rank contributing nothing would corrupt, so a join there is an error on every rank.

use std::cell::RefCell;
use std::collections::BTreeMap;

use asap_train::comm::collectives;
use mpi::topology::{Communicator, SimpleCommunicator};

/// What a rank is doing at a control point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call {
    Sync,
    Join,
    Finish,
    Close,
    Exit,
}

const CALLS: [Call; 5] = [Call::Sync, Call::Join, Call::Finish, Call::Close, Call::Exit];

impl Call {
    /// How an error message names the call, and what its count means.
    fn describe(self, count: u64, ranks: &str) -> String {
        let s = |n: u64| if n == 1 { "" } else { "s" };
        match self {
            Call::Sync => format!("{ranks} called sync {count}"),
            Call::Join => format!("{ranks} called join() after {count} sync{}", s(count)),
            Call::Finish => format!("{ranks} called finish() after {count} sync{}", s(count)),
            Call::Close => format!("{ranks} called close() after {count} sync{}", s(count)),
            Call::Exit => format!("{ranks} reached the end of the script (the Reducer still open) after {count} sync{}", s(count)),
        }
    }
}

/// What a joined rank does in the rounds the others still make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinRule {
    /// Plain allreduce: every rank gets the mean of the active ranks' models.
    ActiveMean,
    /// asap: the joined rank runs the mode's round with no local steps.
    Relay,
    /// sync="none": nothing is exchanged at a sync.
    Nothing,
    /// allreduce with an outer optimizer or compression: a join is an error (the reason).
    Refused(&'static str),
    /// asap with `check_syncs=False`: the ranks do not meet at a sync, so a joined rank cannot
    /// learn when the others are done; `join()` raises at once on the rank that calls it.
    Unchecked,
}

/// A Reducer's count and its state in the protocol.
#[derive(Clone, Debug)]
pub struct Guard {
    /// Syncs made (a joined rank: the count the others reached when all had joined).
    pub round: u64,
    pub rule: JoinRule,
    /// Whether a sync is checked (false for sync="none").
    pub checks_syncs: bool,
    /// A mismatch was found: every rank knows it; further calls raise, and the close at exit
    /// makes no check.
    pub failed: Option<String>,
}

thread_local! {
    /// Each open Reducer's guard, by its slot in `reducer::MODES` (tables have none).
    pub static GUARDS: RefCell<BTreeMap<usize, Guard>> = const { RefCell::new(BTreeMap::new()) };
}

/// What the ranks are doing, found by one control allreduce.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Every rank makes the same call at the same count.
    Agreed,
    /// Some ranks sync (at this count, the same for all of them), the others have joined.
    JoinRound { round: u64 },
    /// Every rank has joined; the most syncs any of them made.
    AllJoined { round: u64 },
    /// Anything else: the error every rank raises.
    Mismatch(String),
}

/// Collective on MPI_COMM_WORLD: this rank makes `call` on reducer `slot` at sync count `count`
/// (a sync: the number of the sync it starts). Every rank gets the same outcome.
pub fn control(slot: usize, call: Call, count: u64) -> Outcome {
    let comm = SimpleCommunicator::world();
    let joined = call == Call::Join;
    let none = f64::NEG_INFINITY;
    let mut v = [none; 10];
    v[0] = slot as f64;
    v[1] = -(slot as f64);
    v[2 + CALLS.iter().position(|&c| c == call).unwrap_or(0)] = 1.0;
    if joined {
        v[9] = count as f64;
    } else {
        v[7] = count as f64;
        v[8] = -(count as f64);
    }
    collectives::max_f64(&comm, &mut v);
    let present: Vec<Call> = CALLS.iter().enumerate().filter(|(i, _)| v[2 + i] > 0.0).map(|(_, &c)| c).collect();
    let same_reducer = v[0] == -v[1];
    let counts_agree = v[7] == -v[8];
    match present.as_slice() {
        [only] if same_reducer && *only == Call::Join => Outcome::AllJoined { round: v[9] as u64 },
        [only] if same_reducer && counts_agree && *only != Call::Join => Outcome::Agreed,
        [Call::Sync, Call::Join] if same_reducer && counts_agree => Outcome::JoinRound { round: v[7] as u64 },
        _ => Outcome::Mismatch(name_the_ranks(&comm, slot, call, count, same_reducer)),
    }
}

/// Collective (every rank found the mismatch in the same control): every rank's (reducer,
/// call, count), grouped into one message that names them and says the fix.
fn name_the_ranks(comm: &SimpleCommunicator, slot: usize, call: Call, count: u64, same_reducer: bool) -> String {
    let mine = [slot as f64, CALLS.iter().position(|&c| c == call).unwrap_or(0) as f64, count as f64];
    let all = collectives::all_gather_varcount(comm, &mine, &vec![3; comm.size() as usize]);
    let mut groups: BTreeMap<(u64, Call, u64), Vec<usize>> = BTreeMap::new();
    for (rank, r) in all.chunks(3).enumerate() {
        groups.entry((r[0] as u64, CALLS[r[1] as usize], r[2] as u64)).or_default().push(rank);
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(&(s, c, n), ranks)| {
            let said = c.describe(n, &rank_list(ranks));
            if same_reducer {
                said
            } else {
                format!("{said} on Reducer #{s} (in creation order)")
            }
        })
        .collect();
    format!(
        "unequal sync counts: {}. Every rank must make the same number of syncs: a rank that runs out of data calls \
         reducer.join() (the others' further syncs then go on without it; docs/python.md), or give every rank as many \
         batches (asap_train.DistributedSampler with drop_last=True)",
        parts.join("; ")
    )
}

/// "rank 3", "ranks 0-2", "ranks 0, 2, 5-7".
fn rank_list(ranks: &[usize]) -> String {
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, collectives::rank_ranges(ranks))
}
