//! Small typed wrappers over the MPI collectives the trainer needs (safe rsmpi calls), and the
//! "agree on failure" pattern that turns an error on some ranks into a clean exit on all of them.
//!
//! While a [`deadline`](super::deadline) is armed (during training), every collective here is
//! started non-blocking and polled, so a stopped or dead rank ends the job within
//! `--wait-timeout` with its rank named, instead of hanging it.

use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::{Equivalence, Partition, PartitionMut};
use mpi::topology::{Communicator, SimpleCommunicator};

use super::deadline;

/// `recv = op(send over all ranks)`, under the deadline when one is armed.
fn all_reduce<T: Equivalence>(comm: &SimpleCommunicator, send: &[T], recv: &mut [T], op: SystemOperation) {
    if !deadline::armed() {
        comm.all_reduce_into(send, recv, op);
        return;
    }
    deadline::enter();
    mpi::request::scope(|sc| deadline::wait(comm.immediate_all_reduce_into(sc, send, recv, op), "an allreduce"));
}

/// Element-wise sum over all ranks, in place.
pub fn sum_f64(comm: &SimpleCommunicator, v: &mut [f64]) {
    let send = v.to_vec();
    all_reduce(comm, &send, v, SystemOperation::sum());
}

/// Element-wise sum over all ranks, in place.
pub fn sum_f32(comm: &SimpleCommunicator, v: &mut [f32], scratch: &mut Vec<f32>) {
    scratch.clear();
    scratch.extend_from_slice(v);
    all_reduce(comm, scratch, v, SystemOperation::sum());
}

/// Element-wise sum over all ranks, in place, by a ring of non-blocking point-to-point messages:
/// a reduce-scatter (n - 1 steps, each sending one n-th of the vector to the next rank and
/// adding the one received from the previous), then an all-gather of the summed n-ths (n - 1
/// steps). Every rank moves 2 (n - 1)/n of the vector each way, the bandwidth optimum, and every
/// n-th is summed on one rank and copied to the others, so all ranks end with the same bits.
/// Polled under the deadline when one is armed, like every collective here. `comm` must carry no
/// other point-to-point traffic on [`RING_TAG`] meanwhile (the callers use a private duplicate).
///
/// Why a ring of our own: the deadline polls non-blocking collectives, and Open MPI 4.1's
/// MPI_Iallreduce (coll/libnbc) takes its binomial tree below 4 ranks, a reduce to one rank then
/// a broadcast, which moves the whole vector twice over one link. Measured over netlab's real
/// 100 Mbit/s links (benches/allreduce-link.sh, 3.26 MB, median of 3): 563 ms a sync at 2 hosts
/// (46 % of the link), this ring 297 ms (88 %); at 4 hosts 652 against 472 ms.
pub fn ring_sum_f32(comm: &SimpleCommunicator, v: &mut [f32], scratch: &mut Vec<f32>) {
    let n = comm.size() as usize;
    if n == 1 {
        return;
    }
    let me = comm.rank() as usize;
    let len = v.len();
    let chunk = |i: usize| (i * len / n)..((i + 1) * len / n);
    let widest = (0..n).map(|i| chunk(i).len()).max().unwrap_or(0);
    scratch.clear();
    scratch.resize(2 * widest, 0.0);
    let (out, inbox) = scratch.split_at_mut(widest);
    let right = comm.process_at_rank(((me + 1) % n) as i32);
    let left = comm.process_at_rank(((me + n - 1) % n) as i32);
    deadline::enter();
    // Step s sends the n-th this rank summed last (its own at s = 0) and receives the previous
    // rank's; after n - 1 steps, n-th (me + 1) holds every rank's sum.
    for s in 0..n - 1 {
        let (send, recv) = (chunk((me + n - s) % n), chunk((me + n - s - 1) % n));
        out[..send.len()].copy_from_slice(&v[send.clone()]);
        exchange(&right, &out[..send.len()], &left, &mut inbox[..recv.len()]);
        v[recv].iter_mut().zip(inbox.iter()).for_each(|(x, y)| *x += y);
    }
    // Step s passes on the summed n-th received last (its own at s = 0).
    for s in 0..n - 1 {
        let (send, recv) = (chunk((me + 1 + n - s) % n), chunk((me + n - s) % n));
        out[..send.len()].copy_from_slice(&v[send.clone()]);
        exchange(&right, &out[..send.len()], &left, &mut v[recv]);
    }
}

/// Collective: how many hosts (shared-memory nodes, as MPI sees them) the ranks of `comm` span.
pub fn host_count(comm: &SimpleCommunicator) -> usize {
    let local = comm.split_shared(comm.rank());
    sum_u64(comm, u64::from(local.rank() == 0)) as usize
}

/// The tag of [`ring_sum_f32`]'s messages.
pub const RING_TAG: i32 = 0x5249;

/// Sends `out` to `to` while receiving `into` from `from`, both non-blocking, polled.
fn exchange(to: &mpi::topology::Process<'_>, out: &[f32], from: &mpi::topology::Process<'_>, into: &mut [f32]) {
    use mpi::point_to_point::{Destination, Source};
    mpi::request::scope(|sc| {
        let recv = from.immediate_receive_into_with_tag(sc, into, RING_TAG);
        let send = to.immediate_send_with_tag(sc, out, RING_TAG);
        deadline::wait_then_go_on(send, "a ring allreduce's send");
        deadline::wait(recv, "a ring allreduce's receive");
    });
}

/// [`sum_f32`], always started non-blocking and polled (under the deadline when one is armed),
/// calling `serve` between polls: for a rank that must keep handing over data its peers wait
/// for while it sits in the collective (see `sync::gaia`'s group allreduce).
pub fn sum_f32_serving(comm: &SimpleCommunicator, v: &mut [f32], scratch: &mut Vec<f32>, serve: &mut dyn FnMut()) {
    scratch.clear();
    scratch.extend_from_slice(v);
    deadline::enter();
    let send: &[f32] = scratch;
    mpi::request::scope(|sc| {
        deadline::wait_serving(comm.immediate_all_reduce_into(sc, send, v, SystemOperation::sum()), "an allreduce", serve)
    });
}

/// Element-wise maximum over all ranks, in place.
pub fn max_f64(comm: &SimpleCommunicator, v: &mut [f64]) {
    let send = v.to_vec();
    all_reduce(comm, &send, v, SystemOperation::max());
}

/// Element-wise maximum over all ranks, in place.
pub fn max_f32(comm: &SimpleCommunicator, v: &mut [f32]) {
    let send = v.to_vec();
    all_reduce(comm, &send, v, SystemOperation::max());
}

/// Minimum or maximum of one `u64` over all ranks, reduced as a signed `i64`.
///
/// MPI's own MIN/MAX on unsigned types cannot be trusted: Debian's MPICH 4.0.2 compares every
/// unsigned type as signed (measured here at 2 ranks: MIN(0, u64::MAX) = u64::MAX, and likewise
/// for MPI_UINT8_T and MPI_UINT32_T; pmodels/mpich#6083, fixed after 4.0.2), and Open MPI
/// 4.1.2-4.1.4 does the same for MPI_UNSIGNED_LONG (open-mpi/ompi#10276, #10525). `agree` uses
/// u64::MAX for "no failure", so under MPICH a read error on one rank was reduced away: the
/// failing rank returned its error while the others went on into the next collective, and the
/// job hung until --wait-timeout. Flipping the top bit maps u64 order onto i64 order exactly,
/// and signed MIN/MAX are right in both MPIs.
fn min_max_u64(comm: &SimpleCommunicator, x: u64, op: SystemOperation) -> u64 {
    const TOP: u64 = 1 << 63;
    let mut out = [0i64];
    all_reduce(comm, &[(x ^ TOP) as i64], &mut out, op);
    out[0] as u64 ^ TOP
}

/// Maximum of one `u64` over all ranks.
pub fn max_u64(comm: &SimpleCommunicator, x: u64) -> u64 {
    min_max_u64(comm, x, SystemOperation::max())
}

/// Minimum of one `u64` over all ranks.
pub fn min_u64(comm: &SimpleCommunicator, x: u64) -> u64 {
    min_max_u64(comm, x, SystemOperation::min())
}

/// Sum of one `u64` over all ranks (wrapping; addition is the same for signed and unsigned).
pub fn sum_u64(comm: &SimpleCommunicator, x: u64) -> u64 {
    let mut out = [0u64];
    all_reduce(comm, &[x], &mut out, SystemOperation::sum());
    out[0]
}

/// Mean and maximum over ranks of each value.
pub fn mean_max(comm: &SimpleCommunicator, v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut sum = v.to_vec();
    sum_f64(comm, &mut sum);
    let n = comm.size() as f64;
    sum.iter_mut().for_each(|x| *x /= n);
    let mut max = v.to_vec();
    max_f64(comm, &mut max);
    (sum, max)
}

/// Broadcasts `buf` from `root` to every rank.
pub fn broadcast<T: Equivalence>(comm: &SimpleCommunicator, root: usize, buf: &mut [T]) {
    let p = comm.process_at_rank(root as i32);
    if !deadline::armed() {
        p.broadcast_into(buf);
        return;
    }
    deadline::enter();
    mpi::request::scope(|sc| deadline::wait(p.immediate_broadcast_into(sc, buf), "a broadcast"));
}

/// Broadcasts `buf` from `root` to every rank.
pub fn broadcast_f32(comm: &SimpleCommunicator, root: usize, buf: &mut [f32]) {
    broadcast(comm, root, buf);
}

/// Broadcasts a string known only at `root` (others pass anything) to every rank.
pub fn broadcast_string(comm: &SimpleCommunicator, root: usize, text: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let mut len = [bytes.len() as u64];
    broadcast(comm, root, &mut len);
    bytes.resize(len[0] as usize, 0);
    broadcast(comm, root, &mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Error returned on ranks that were fine when another rank failed; the failing rank has already
/// printed the real cause.
#[derive(Debug)]
pub struct OtherRankFailed {
    /// Lowest failing rank.
    pub rank: usize,
}

impl std::fmt::Display for OtherRankFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} reported an error (see its message above); stopping", self.rank)
    }
}

impl std::error::Error for OtherRankFailed {}

/// Collective: every rank passes its own result; if any rank failed, the lowest failing rank
/// prints every failing rank's error, each kind once ([`said_once`]), and every rank gets an
/// error back, so all exit non-zero and none hangs in a later collective. Must be called by all
/// ranks. (Each failing rank printed its own before: 32 ranks of one bad file said the same
/// thing 32 times; issue 43.)
pub fn agree<T>(comm: &SimpleCommunicator, r: anyhow::Result<T>) -> anyhow::Result<T> {
    let me = comm.rank() as u64;
    let failed_rank = if r.is_err() { me } else { u64::MAX };
    let mine = r.as_ref().err().map(|e| format!("{e:#}"));
    crate::comm::hold_unsaid(mine.as_ref().map(|m| format!("asap-train: error on rank {me}: {m}")));
    let first = min_u64(comm, failed_rank);
    if first != u64::MAX {
        let all = gather_text(comm, first as usize, mine.as_deref().unwrap_or(""));
        if me == first {
            crate::comm::say(&said_once(&all));
        }
    }
    crate::comm::hold_unsaid(None);
    match r {
        Err(e) => Err(e.context(crate::comm::collectives::REPORTED)),
        Ok(_) if first != u64::MAX => Err(OtherRankFailed { rank: first as usize }.into()),
        Ok(v) => Ok(v),
    }
}

/// Every rank's `text` at `root` (by rank; other ranks get an empty vector).
fn gather_text(comm: &SimpleCommunicator, root: usize, text: &str) -> Vec<String> {
    let width = max_u64(comm, text.len() as u64) as usize;
    let lens = gather(comm, root, &[text.len() as u64]);
    let mut padded = text.as_bytes().to_vec();
    padded.resize(width, 0);
    let all = gather(comm, root, &padded);
    lens.iter().enumerate().map(|(r, &n)| String::from_utf8_lossy(&all[r * width..r * width + n as usize]).into_owned()).collect()
}

/// The failing ranks' errors (`errors` by rank, empty for a rank without one) as lines to print,
/// each kind once: the lowest rank's in full, and after it the ranks whose error differs from it
/// only in its numbers (the same fault at other lines of their shards) or not at all.
fn said_once(errors: &[String]) -> String {
    let shape = |s: &str| -> String {
        let mut out = String::with_capacity(s.len());
        for c in s.chars() {
            if !c.is_ascii_digit() {
                out.push(c);
            } else if !out.ends_with('#') {
                out.push('#');
            }
        }
        out
    };
    // (shape, the first rank's message and rank, the other ranks of that shape)
    let mut kinds: Vec<(String, usize, Vec<usize>)> = Vec::new();
    for (r, e) in errors.iter().enumerate().filter(|(_, e)| !e.is_empty()) {
        let s = shape(e);
        match kinds.iter_mut().find(|k| k.0 == s) {
            Some(k) => k.2.push(r),
            None => kinds.push((s, r, Vec::new())),
        }
    }
    let mut lines = Vec::new();
    for (_, first, others) in &kinds {
        lines.push(format!("asap-train: error on rank {first}: {}", errors[*first]));
        if !others.is_empty() {
            let same = others.iter().all(|&r| errors[r] == errors[*first]);
            let how = if same { "the same error" } else { "the same error at other places" };
            let s = if others.len() == 1 { "" } else { "s" };
            lines.push(format!("asap-train: and on rank{s} {}: {how}", rank_ranges(others)));
        }
    }
    lines.join("\n")
}

/// Ranks as ranges: `[1, 2, 3, 5]` -> "1-3, 5" (sorted ranks).
pub fn rank_ranges(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(if j == i { ranks[i].to_string() } else { format!("{}-{}", ranks[i], ranks[j]) });
        i = j + 1;
    }
    parts.join(", ")
}

/// Context attached to errors [`agree`] has already printed, so `main` does not print them twice.
pub const REPORTED: &str = "(already reported)";

/// Gathers equal-length slices at `root` (rank-major); other ranks get an empty vector.
pub fn gather<T: Equivalence + Default + Clone>(comm: &SimpleCommunicator, root: usize, v: &[T]) -> Vec<T> {
    let p = comm.process_at_rank(root as i32);
    let armed = deadline::armed();
    if armed {
        deadline::enter();
    }
    if comm.rank() as usize == root {
        let mut out = vec![T::default(); v.len() * comm.size() as usize];
        if armed {
            mpi::request::scope(|sc| deadline::wait(p.immediate_gather_into_root(sc, v, &mut out[..]), "a gather"));
        } else {
            p.gather_into_root(v, &mut out[..]);
        }
        out
    } else {
        if armed {
            mpi::request::scope(|sc| deadline::wait(p.immediate_gather_into(sc, v), "a gather"));
        } else {
            p.gather_into(v);
        }
        Vec::new()
    }
}

/// Scatters rank-major equal chunks of `all` (significant at `root` only) into `mine`.
pub fn scatter<T: Equivalence>(comm: &SimpleCommunicator, root: usize, all: &[T], mine: &mut [T]) {
    let p = comm.process_at_rank(root as i32);
    let armed = deadline::armed();
    if armed {
        deadline::enter();
    }
    match (comm.rank() as usize == root, armed) {
        (true, false) => p.scatter_into_root(all, mine),
        (false, false) => p.scatter_into(mine),
        (true, true) => mpi::request::scope(|sc| deadline::wait(p.immediate_scatter_into_root(sc, all, mine), "a scatter")),
        (false, true) => mpi::request::scope(|sc| deadline::wait(p.immediate_scatter_into(sc, mine), "a scatter")),
    }
}

/// Gathers slices of any length at `root`: every rank's slice, in rank order (empty vectors on
/// the other ranks).
pub fn gather_varcount<T: Equivalence + Default + Clone>(comm: &SimpleCommunicator, root: usize, v: &[T]) -> Vec<Vec<T>> {
    // MPI_Gatherv rejects an empty receive buffer (Open MPI: MPI_ERR_ARG), so nothing at all is
    // agreed on first.
    if max_u64(comm, v.len() as u64) == 0 {
        let n = if comm.rank() as usize == root { comm.size() as usize } else { 0 };
        return vec![Vec::new(); n];
    }
    let counts: Vec<i32> = gather(comm, root, &[v.len() as i32]);
    let p = comm.process_at_rank(root as i32);
    let armed = deadline::armed();
    if armed {
        deadline::enter();
    }
    if comm.rank() as usize != root {
        if armed {
            mpi::request::scope(|sc| deadline::wait(p.immediate_gather_varcount_into(sc, v), "a gather"));
        } else {
            p.gather_varcount_into(v);
        }
        return Vec::new();
    }
    let displs = displacements(&counts);
    let mut all = vec![T::default(); counts.iter().map(|&c| c as usize).sum()];
    {
        let mut part = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
        if armed {
            mpi::request::scope(|sc| deadline::wait(p.immediate_gather_varcount_into_root(sc, v, &mut part), "a gather"));
        } else {
            p.gather_varcount_into_root(v, &mut part);
        }
    }
    let mut out = Vec::with_capacity(counts.len());
    let mut rest = &all[..];
    for &c in &counts {
        let (head, tail) = rest.split_at(c as usize);
        out.push(head.to_vec());
        rest = tail;
    }
    out
}

/// Sends `out[r]` to rank r and returns what every rank sent this one, in rank order (an
/// all-to-all of byte buffers of any length; counts are exchanged first). Errors when a buffer
/// exceeds what one MPI count can address.
pub fn all_to_all_bytes(comm: &SimpleCommunicator, out: &[Vec<u8>]) -> anyhow::Result<Vec<Vec<u8>>> {
    let n = comm.size() as usize;
    assert_eq!(out.len(), n, "one buffer per rank");
    let total: usize = out.iter().map(Vec::len).sum();
    let fits = max_u64(comm, u64::from(total > i32::MAX as usize)) == 0;
    anyhow::ensure!(fits, "an all-to-all of more than 2 GiB per rank: use more ranks");
    let send_counts: Vec<i32> = out.iter().map(|b| b.len() as i32).collect();
    let mut recv_counts = vec![0i32; n];
    let armed = deadline::armed();
    if armed {
        deadline::enter();
        mpi::request::scope(|sc| {
            deadline::wait(comm.immediate_all_to_all_into(sc, &send_counts[..], &mut recv_counts[..]), "an all-to-all")
        });
    } else {
        comm.all_to_all_into(&send_counts[..], &mut recv_counts[..]);
    }
    let recv_total: i64 = recv_counts.iter().map(|&c| c as i64).sum();
    anyhow::ensure!(recv_total <= i32::MAX as i64, "an all-to-all receiving more than 2 GiB on one rank: use more ranks");
    // Capacity at least 1: an empty Vec's pointer is dangling (0x1 for bytes), and 0x1 is Open
    // MPI's MPI_IN_PLACE, so a rank with nothing to send would have its receive buffer sent.
    let mut send: Vec<u8> = Vec::with_capacity(total.max(1));
    out.iter().for_each(|b| send.extend_from_slice(b));
    let mut recv = vec![0u8; recv_total as usize];
    {
        let (sd, rd) = (displacements(&send_counts), displacements(&recv_counts));
        let part = mpi::datatype::Partition::new(&send[..], &send_counts[..], &sd[..]);
        let mut part_mut = PartitionMut::new(&mut recv[..], &recv_counts[..], &rd[..]);
        if armed {
            deadline::enter();
            mpi::request::scope(|sc| deadline::wait(comm.immediate_all_to_all_varcount_into(sc, &part, &mut part_mut), "an all-to-all"));
        } else {
            comm.all_to_all_varcount_into(&part, &mut part_mut);
        }
    }
    let mut res = Vec::with_capacity(n);
    let mut rest = &recv[..];
    for &c in &recv_counts {
        let (head, tail) = rest.split_at(c as usize);
        res.push(head.to_vec());
        rest = tail;
    }
    Ok(res)
}

/// Exclusive prefix sums of `counts`: where each rank's part starts.
fn displacements(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

/// Every rank's `v`, concatenated in rank order, on every rank, where every rank knows every
/// rank's length (`counts[r]`; this rank's is `v.len()`, and any may be 0).
pub fn all_gather_varcount<T: Equivalence + Default + Clone>(comm: &SimpleCommunicator, v: &[T], counts: &[i32]) -> Vec<T> {
    debug_assert_eq!(counts[comm.rank() as usize] as usize, v.len());
    let mut all = vec![T::default(); counts.iter().map(|&c| c as usize).sum()];
    let displs = displacements(counts);
    // An empty slice's pointer is dangling, and for a 1-byte `T` it is 0x1, Open MPI's
    // MPI_IN_PLACE: send from a real (empty) allocation instead.
    let allocated: Vec<T> = Vec::with_capacity(1);
    let v = if v.is_empty() { &allocated[..] } else { v };
    {
        let mut part = PartitionMut::new(&mut all[..], counts, &displs[..]);
        if deadline::armed() {
            deadline::enter();
            mpi::request::scope(|sc| deadline::wait(comm.immediate_all_gather_varcount_into(sc, v, &mut part), "an allgather"));
        } else {
            comm.all_gather_varcount_into(v, &mut part);
        }
    }
    all
}

/// Scatters `all` (significant at `root` only: every rank's part in rank order, of the lengths
/// `counts` that every rank knows) into `mine` (`counts[rank]` long).
pub fn scatter_varcount<T: Equivalence>(comm: &SimpleCommunicator, root: usize, all: &[T], counts: &[i32], mine: &mut [T]) {
    let p = comm.process_at_rank(root as i32);
    let armed = deadline::armed();
    if armed {
        deadline::enter();
    }
    if comm.rank() as usize == root {
        let displs = displacements(counts);
        let part = Partition::new(all, counts, &displs[..]);
        if armed {
            mpi::request::scope(|sc| deadline::wait(p.immediate_scatter_varcount_into_root(sc, &part, mine), "a scatter"));
        } else {
            p.scatter_varcount_into_root(&part, mine);
        }
    } else if armed {
        mpi::request::scope(|sc| deadline::wait(p.immediate_scatter_varcount_into(sc, mine), "a scatter"));
    } else {
        p.scatter_varcount_into(mine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pure functions only: MPI is never initialised in a unit test.
    #[test]
    fn each_kind_of_error_is_said_once() {
        let bad = |line: usize| format!("d.svm:{line}:4: feature index 0 in \"0:1\": indices are 1-based");
        let errors = vec![bad(1), bad(3), String::new(), bad(7), "--metrics m.jsonl: cannot open".to_owned(), bad(9)];
        let said = said_once(&errors);
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(
            lines,
            [
                format!("asap-train: error on rank 0: {}", bad(1)).as_str(),
                "asap-train: and on ranks 1, 3, 5: the same error at other places",
                "asap-train: error on rank 4: --metrics m.jsonl: cannot open",
            ]
        );
        let same = vec![String::new(), "x".to_owned(), "x".to_owned()];
        assert_eq!(said_once(&same), "asap-train: error on rank 1: x\nasap-train: and on rank 2: the same error");
        assert_eq!(rank_ranges(&[0, 1, 2, 4, 6, 7]), "0-2, 4, 6-7");
    }
}
