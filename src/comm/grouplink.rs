//! The shared WAN links of an emulated cluster of groups (`--emulate-groups G`): the ranks split
//! into G groups of contiguous ranks (data centres), and every ordered pair of groups has one
//! link that the sending group's ranks share, as a data centre's hosts share its one uplink to
//! the other (netlab's `wan.sh up 2 4`: two groups of 4 hosts joined by one link each way).
//!
//! A link is a FIFO at the WAN rate: a message across takes it for its bytes over the rate, from
//! when both the link and the message are ready. Its "free at" time (u64 nanoseconds of the wall
//! clock, which the ranks of one machine share) lives in a one-sided window on the sending
//! group's first rank, one slot per receiving group, and is reserved with an atomic read and a
//! compare-and-swap loop, so any rank of the group can take the link next without a message to a
//! coordinator. The pacer (`pace.rs`, which uses this module) decides what a message waits for;
//! this file only keeps the shared clocks and, with `--send-log`, a log of every message.

use std::cell::RefCell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mpi::topology::{Communicator, SimpleCommunicator};

use super::collectives;
use super::window::Window;

/// One message a rank's pacer reserved, for `--send-log` (every time in wall-clock nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkRecord {
    /// When the sender handed it to its link.
    pub requested: u64,
    /// When the sender's own link (its NIC) started carrying it.
    pub start: u64,
    /// When its last byte had left (before the path's latency).
    pub end: u64,
    pub bytes: u64,
    /// The receiving rank.
    pub dest: usize,
    /// For a message across groups: its time on the group link, (start, end).
    pub group_link: Option<(u64, u64)>,
}

/// One reservation of a group link: (start, end) in wall-clock nanoseconds, bytes, receiving
/// group.
type Taken = (u64, u64, u64, usize);

/// This rank's handle on the group links of the job (collective to make: every rank holds one).
pub struct GroupLink {
    window: Window,
    groups: usize,
    ranks: usize,
    rank: usize,
    /// The wall clock and this process's monotonic clock at one instant: times convert between
    /// them by this one offset, so a process's own times keep their order.
    base: (Instant, u64),
    log: Option<RefCell<Vec<LinkRecord>>>,
    /// With the log: every reservation this rank made.
    taken: Option<RefCell<Vec<Taken>>>,
}

impl std::fmt::Debug for GroupLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupLink {{ groups: {}, ranks: {}, rank: {} }}", self.groups, self.ranks, self.rank)
    }
}

/// Nanoseconds since the Unix epoch now.
fn wall_ns_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

/// The group of `rank` among `ranks` in `groups` equal groups of contiguous ranks (gaia's
/// `--groups G` splits the same way).
pub fn group_of(rank: usize, ranks: usize, groups: usize) -> usize {
    rank * groups / ranks
}

/// Checks that `groups` split `ranks` into equal groups of at least one rank; the error names
/// the option and the fix.
pub fn check_groups(groups: usize, ranks: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        groups >= 2 && groups <= ranks && ranks.is_multiple_of(groups),
        "--emulate-groups {groups}: {ranks} ranks do not split into {groups} equal groups of contiguous ranks: give a number of \
         groups from 2 up that divides the rank count (e.g. 2 for two data centres), or --emulate-groups off for one link per rank"
    );
    Ok(())
}

impl GroupLink {
    /// Collective over `comm`: the group links of `groups` groups, with a log of every message
    /// when `record`. Refuses a job whose ranks span more than one machine (the links' times are
    /// on the wall clock, which only one machine's ranks share).
    pub fn allocate(comm: &SimpleCommunicator, groups: usize, record: bool) -> anyhow::Result<GroupLink> {
        let ranks = comm.size() as usize;
        check_groups(groups, ranks)?;
        let hosts = collectives::host_count(comm);
        anyhow::ensure!(
            hosts == 1,
            "--emulate-groups {groups}: the job's ranks span {hosts} machines; the emulated group links keep their times on \
             the wall clock, which only the ranks of one machine share: run the emulated cluster on one node, or drop \
             --emulate-groups (real links between machines need no emulation)"
        );
        let window = Window::allocate(comm, 8 * groups).map_err(|e| anyhow::anyhow!("--emulate-groups: the group links' window: {e}"))?;
        let base = (Instant::now(), wall_ns_now());
        let log = record.then(|| RefCell::new(Vec::new()));
        let taken = record.then(|| RefCell::new(Vec::new()));
        Ok(GroupLink { window, groups, ranks, rank: comm.rank() as usize, base, log, taken })
    }

    /// The number of groups.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// The group of `rank`.
    pub fn group(&self, rank: usize) -> usize {
        group_of(rank, self.ranks, self.groups)
    }

    /// Wall-clock nanoseconds of `t` (this process's offset, [`GroupLink`]'s `base`).
    pub fn ns_of(&self, t: Instant) -> u64 {
        let (i0, w0) = self.base;
        if t >= i0 {
            w0 + (t - i0).as_nanos() as u64
        } else {
            w0.saturating_sub((i0 - t).as_nanos() as u64)
        }
    }

    /// The `Instant` of wall-clock nanoseconds `ns`.
    pub fn instant_of(&self, ns: u64) -> Instant {
        let (i0, w0) = self.base;
        if ns >= w0 {
            i0 + Duration::from_nanos(ns - w0)
        } else {
            i0.checked_sub(Duration::from_nanos(w0 - ns)).unwrap_or(i0)
        }
    }

    /// Takes the link from this rank's group to `to_group` for `seconds`, from `earliest` on or
    /// when the link is free, whichever is later; returns the link's (start, end). Every rank of
    /// the group reserves in the same slot (on the group's first rank), so their reservations
    /// never overlap: a compare-and-swap that finds the slot changed reads it again.
    /// `bytes` is what the reservation carries, for the log.
    pub fn reserve(&self, to_group: usize, earliest: Instant, bytes: u64, seconds: f64) -> anyhow::Result<(Instant, Instant)> {
        let (start, end) = self.reserve_ns(to_group, self.ns_of(earliest), seconds)?;
        if let Some(log) = &self.taken {
            log.borrow_mut().push((start, end, bytes, to_group));
        }
        Ok((self.instant_of(start), self.instant_of(end)))
    }

    /// [`GroupLink::reserve`] in wall-clock nanoseconds.
    fn reserve_ns(&self, to_group: usize, earliest: u64, seconds: f64) -> anyhow::Result<(u64, u64)> {
        let from = self.group(self.rank);
        anyhow::ensure!(to_group < self.groups && to_group != from, "a group link from group {from} to group {to_group} does not exist");
        let owner = (from * self.ranks / self.groups) as i32;
        let offset = 8 * to_group;
        let took = (seconds.max(0.0) * 1e9).round() as u64;
        let rma = |e| anyhow::anyhow!("--emulate-groups: the link from group {from} to group {to_group}: {e}");
        let mut free = self.window.atomic_read_u64(owner, offset).map_err(rma)?;
        loop {
            let start = free.max(earliest);
            let end = start + took;
            let seen = self.window.compare_and_swap_u64(owner, offset, free, end).map_err(rma)?;
            if seen == free {
                return Ok((start, end));
            }
            free = seen;
        }
    }

    /// Records one message (with `--send-log`; nothing otherwise).
    pub fn record(
        &self,
        requested: Instant,
        start: Instant,
        end: Instant,
        bytes: u64,
        dest: usize,
        group_link: Option<(Instant, Instant)>,
    ) {
        if let Some(log) = &self.log {
            let rec = LinkRecord {
                requested: self.ns_of(requested),
                start: self.ns_of(start),
                end: self.ns_of(end),
                bytes,
                dest,
                group_link: group_link.map(|(s, e)| (self.ns_of(s), self.ns_of(e))),
            };
            log.borrow_mut().push(rec);
        }
    }

    /// The group link's reservations as CSV: `start_ns,end_ns,bytes,to_group`.
    pub fn taken_csv(&self) -> String {
        let mut text = String::from("start_ns,end_ns,bytes,to_group\n");
        for (s, e, b, g) in self.taken.as_ref().map_or(Vec::new(), |t| t.borrow().clone()) {
            text.push_str(&format!("{s},{e},{b},{g}\n"));
        }
        text
    }

    /// The messages recorded so far.
    pub fn log(&self) -> Vec<LinkRecord> {
        self.log.as_ref().map_or(Vec::new(), |l| l.borrow().clone())
    }

    /// The log as CSV: `requested_ns,start_ns,end_ns,bytes,dest,group_start_ns,group_end_ns`
    /// (the last two empty for a message within a group).
    pub fn log_csv(&self) -> String {
        let mut text = String::from("requested_ns,start_ns,end_ns,bytes,dest,group_start_ns,group_end_ns\n");
        for r in self.log() {
            let (gs, ge) = r.group_link.map_or((String::new(), String::new()), |(s, e)| (s.to_string(), e.to_string()));
            text.push_str(&format!("{},{},{},{},{},{gs},{ge}\n", r.requested, r.start, r.end, r.bytes, r.dest));
        }
        text
    }
}
