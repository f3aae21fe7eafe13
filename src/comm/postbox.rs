//! Two-sided tagged messages between ranks that never block the sender: [`Postbox::send`] starts
//! an `MPI_Isend` of an owned buffer and keeps the buffer until MPI reports the send complete;
//! [`Postbox::try_receive`] takes one waiting message, if any (matched probe + receive, so a
//! message can never be taken by another receive in between).
//!
//! This is the transport of the parameter-server modes, where every rank is client and server in
//! one thread: a rank waiting for rows keeps serving others' requests by polling, and no rank ever
//! sits in a blocking `MPI_Send` while its peer does the same (large messages use a rendezvous
//! protocol, so two blocking sends towards each other would deadlock). Knows nothing of ML.
//!
//! With a [`Pacer`] ([`Postbox::with_pacer`]) messages to other ranks leave at the pacer's rate:
//! `send` queues them and they are handed to MPI when the link would have carried them (plus its
//! latency), in order, as the owner keeps calling [`Postbox::progress_sends`]. The sender never
//! blocks, as with a real NIC whose queue drains at line rate.
//!
//! With an [`Ingress`] as well ([`Postbox::with_ingress`], on every rank alike) the receiver's
//! own link is modelled: every message to another rank carries, in 8 trailing bytes, the wall
//! clock time it would have arrived on a free link; the receiver takes every message MPI has for
//! it into a queue and delivers each when its inbound link would have carried it in after the
//! ones before it. Several senders to one rank then share that rank's rate, as they would share
//! its port. The clock is the machine's (the emulation runs on one machine). On a TCP fabric a
//! message that came in while this rank's own link was sending arrives later
//! ([`Ingress::deliver_beside`]: its acknowledgements waited behind that data).

use std::collections::VecDeque;
use std::ffi::c_int;
use std::time::{Duration, Instant};

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::backoff::Backoff;
use super::pace::{instant_of, wall_seconds, Fabric, Ingress, Pacer};

/// An MPI call that failed in the postbox.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed with MPI error code {code}")]
pub struct PostboxError {
    pub call: &'static str,
    pub code: i32,
}

/// One send in flight: MPI reads `buf` until the request completes.
/// A paced message not yet handed to MPI: it takes the link from `start` and is handed over at
/// `arrival` (its last byte out plus the path's latency).
struct Held {
    start: Instant,
    arrival: Instant,
    dest: usize,
    tag: i32,
    /// The message, with its arrival stamp when an [`Ingress`] is modelled.
    buf: Vec<u8>,
}

struct InFlight {
    request: ffi::MPI_Request,
    buf: Vec<u8>,
}

/// Non-blocking tagged messages over a private duplicate of a communicator.
pub struct Postbox {
    comm: SimpleCommunicator,
    rank: usize,
    in_flight: Vec<InFlight>,
    /// Paced messages not handed to MPI yet: (when, dest, tag, buf), in release order.
    held: VecDeque<Held>,
    pacer: Option<Pacer>,
    ingress: Option<Ingress>,
    /// With `ingress`: messages taken from MPI, (when delivered, source, tag, payload), in the
    /// order the inbound link carries them (delivery times only grow).
    arrived: VecDeque<(Instant, usize, i32, Vec<u8>)>,
    bytes_sent: u64,
    bytes_received: u64,
}

/// Bytes of the arrival time a message carries when the receiver's link is modelled.
const STAMP: usize = 8;

impl Postbox {
    /// A postbox over a duplicate of `comm` (collective: every rank must create it).
    pub fn new(comm: &SimpleCommunicator) -> Self {
        let comm = comm.duplicate();
        let rank = comm.rank() as usize;
        Postbox {
            comm,
            rank,
            in_flight: Vec::new(),
            held: VecDeque::new(),
            pacer: None,
            ingress: None,
            arrived: VecDeque::new(),
            bytes_sent: 0,
            bytes_received: 0,
        }
    }

    /// Paces messages to other ranks through `pacer` (see the module documentation).
    pub fn with_pacer(mut self, pacer: Option<Pacer>) -> Self {
        self.pacer = pacer;
        self
    }

    /// Models this rank's inbound link (see the module documentation). Every rank of the
    /// communicator must get one, or none: the stamp is part of every message between ranks.
    pub fn with_ingress(mut self, ingress: Option<Ingress>) -> Self {
        self.ingress = ingress;
        self
    }

    /// The inbound link, if modelled (its log records every message from another rank).
    pub fn ingress(&self) -> Option<&Ingress> {
        self.ingress.as_ref()
    }

    /// The pacer, if any (its log records every message to another rank).
    pub fn pacer(&self) -> Option<&Pacer> {
        self.pacer.as_ref()
    }

    /// True when a message sent now would leave at once: nothing is held back and the pacer's
    /// bucket is empty (always true without a pacer).
    pub fn link_idle(&self) -> bool {
        self.held.is_empty() && self.pacer.as_ref().is_none_or(|p| p.idle_at(Instant::now()))
    }

    /// Bytes a paced link can still carry by `horizon` from now (see [`Pacer::room_within`]);
    /// None without a pacer (no budget: unlimited).
    pub fn room_within(&self, horizon: Duration) -> Option<f64> {
        self.pacer.as_ref().map(|p| p.room_within(Instant::now(), horizon))
    }

    /// Messages handed to MPI whose send has not completed (a sign the network is overused).
    pub fn unacknowledged(&self) -> usize {
        self.in_flight.len()
    }

    /// Paced messages not yet handed to MPI (the emulated link is still carrying earlier ones).
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The postbox's private communicator (for collectives of the same group of ranks).
    pub fn comm(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.comm.size() as usize
    }

    /// Bytes sent to other ranks (messages to self are not network traffic and not counted).
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// Bytes received from other ranks.
    pub fn bytes_received(&self) -> u64 {
        self.bytes_received
    }

    /// Starts sending `buf` to `dest` with `tag`; returns at once. Messages from one rank to
    /// another with the same tag arrive in the order they were sent (MPI's non-overtaking rule).
    pub fn send(&mut self, dest: usize, tag: i32, mut buf: Vec<u8>) -> Result<(), PostboxError> {
        if let (Some(p), true) = (self.pacer.as_mut(), dest != self.rank) {
            let (start, end) = p.reserve_to(dest, buf.len() as u64);
            let arrival = end + p.latency_to(dest);
            if self.ingress.is_some() {
                buf.extend_from_slice(&wall_seconds(arrival).to_le_bytes());
            }
            self.held.push_back(Held { start, arrival, dest, tag, buf });
            return self.release_due();
        }
        if self.ingress.is_some() && dest != self.rank {
            buf.extend_from_slice(&wall_seconds(Instant::now()).to_le_bytes());
        }
        self.isend(dest, tag, buf)
    }

    /// Hands the held messages whose time has come to MPI, in the order they were sent. Not
    /// only the first ones: with `--emulate-groups` a message within a group arrives before a
    /// message across sent ahead of it (and must not wait on the WAN). To one destination the
    /// arrivals only grow (a path's messages leave one after another), so MPI's order per
    /// destination and tag is the order they were sent in.
    fn release_due(&mut self) -> Result<(), PostboxError> {
        let now = Instant::now();
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].arrival <= now {
                let m = self.held.remove(i).expect("in range");
                self.isend(m.dest, m.tag, m.buf)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Takes back the paced messages that have not begun to leave (the link is still busy with
    /// earlier ones) and for which `take(dest, tag, message)` holds, as a NIC's driver can drop
    /// what is still in its queue: returns them `(dest, tag, message)` in the order they were
    /// sent. The messages that stay keep their order and move up into the link time freed, so
    /// that what is sent next is not queued behind what was taken. Nothing without a pacer.
    pub fn withdraw_waiting(&mut self, mut take: impl FnMut(usize, i32, &[u8]) -> bool) -> Vec<(usize, i32, Vec<u8>)> {
        let stamp = if self.ingress.is_some() { STAMP } else { 0 };
        let (Some(p), now) = (self.pacer.as_mut(), Instant::now()) else { return Vec::new() };
        // Reservations are made in order, so the waiting messages are the last ones held and the
        // first of them starts where the one before it ended.
        let first = self.held.iter().position(|m| m.start > now).unwrap_or(self.held.len());
        let Some(free_from) = self.held.get(first).map(|m| m.start) else { return Vec::new() };
        let waiting: Vec<Held> = self.held.drain(first..).collect();
        p.rewind(free_from, waiting.len());
        let mut taken = Vec::new();
        for mut m in waiting {
            let body = m.buf.len() - stamp;
            if take(m.dest, m.tag, &m.buf[..body]) {
                m.buf.truncate(body);
                taken.push((m.dest, m.tag, m.buf));
                continue;
            }
            let (start, end) = p.reserve_to(m.dest, body as u64);
            m.start = start;
            m.arrival = end + p.latency_to(m.dest);
            if stamp > 0 {
                m.buf[body..].copy_from_slice(&wall_seconds(m.arrival).to_le_bytes());
            }
            self.held.push_back(m);
        }
        taken
    }

    fn isend(&mut self, dest: usize, tag: i32, buf: Vec<u8>) -> Result<(), PostboxError> {
        let mut request = request_null();
        // SAFETY: `buf` is a live heap allocation of `buf.len()` bytes; it is moved into
        // `in_flight` right after and neither read, written nor freed until MPI_Test reports the
        // request complete (or, on drop with the send unfinished, it is leaked). Moving the Vec
        // value does not move its heap buffer. The communicator is live for self's lifetime.
        let code = unsafe {
            ffi::MPI_Isend(
                buf.as_ptr().cast(),
                buf.len() as c_int,
                ffi::RSMPI_UINT8_T,
                dest as c_int,
                tag,
                self.comm.as_raw(),
                &mut request,
            )
        };
        check("MPI_Isend", code)?;
        if dest != self.rank {
            let stamp = if self.ingress.is_some() { STAMP } else { 0 };
            self.bytes_sent += (buf.len() - stamp) as u64;
        }
        self.in_flight.push(InFlight { request, buf });
        Ok(())
    }

    /// Lets finished sends go and hands due paced messages to MPI; returns how many messages are
    /// still in flight or held back.
    pub fn progress_sends(&mut self) -> Result<usize, PostboxError> {
        self.release_due()?;
        let mut i = 0;
        while i < self.in_flight.len() {
            let mut flag: c_int = 0;
            // SAFETY: the request came from MPI_Isend and was not completed yet (completed ones
            // are removed below); MPI_Test sets it to MPI_REQUEST_NULL when it completes.
            let code = unsafe { ffi::MPI_Test(&mut self.in_flight[i].request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            check("MPI_Test", code)?;
            if flag != 0 {
                self.in_flight.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(self.in_flight.len() + self.held.len())
    }

    /// Takes one waiting message with `tag` from any rank: `(source, bytes)`, or None.
    pub fn try_receive(&mut self, tag: i32) -> Option<(usize, Vec<u8>)> {
        if self.ingress.is_some() {
            return self.try_receive_through_ingress(tag, None);
        }
        let (source, _, bytes) = probe_receive(&self.comm, None, Some(tag))?;
        if source != self.rank {
            self.bytes_received += bytes.len() as u64;
        }
        Some((source, bytes))
    }

    /// [`Postbox::try_receive`] for an owner that paces its sends itself, outside the postbox
    /// (gaia's mirrors hold their data until the link has carried it): with an inbound link, a
    /// message is taken in beside `pacer`'s sends ([`Ingress::deliver_beside`]); `ranks[i]` is
    /// the pacer's rank of this postbox's rank `i`.
    pub fn try_receive_beside(&mut self, tag: i32, pacer: Option<&Pacer>, ranks: &[usize]) -> Option<(usize, Vec<u8>)> {
        match (self.ingress.is_some(), pacer) {
            (true, Some(p)) => self.try_receive_through_ingress(tag, Some((p, ranks))),
            _ => self.try_receive(tag),
        }
    }

    /// [`Postbox::try_receive`] with the inbound link modelled: every message MPI has (any tag)
    /// goes into the arrival queue at its delivery time; the first one of `tag` that is due is
    /// taken. Messages of one source and tag keep their order: the queue's times only grow.
    /// On a TCP fabric, while the inbound link is still taking in earlier messages, those from
    /// other ranks stay in MPI (their senders' sends stay incomplete, as a real receiver's full
    /// buffer holds a TCP sender back: its two-way share slows the link without the senders'
    /// pacers knowing, [`Ingress::deliver_beside`]); this rank's own come in at once. On the
    /// ideal pipe every message is taken at once, as the emulated tables were measured.
    /// `outside`: the owner's own pacer and its ranks ([`Postbox::try_receive_beside`]).
    fn try_receive_through_ingress(&mut self, tag: i32, outside: Option<(&Pacer, &[usize])>) -> Option<(usize, Vec<u8>)> {
        let ingress = self.ingress.as_mut().expect("checked by the caller");
        let gate = self.pacer.as_ref().is_some_and(|p| p.fabric() == Fabric::Tcp);
        let own = outside.map(|(p, _)| p).or(self.pacer.as_ref());
        let pacer_rank = |r: usize| outside.and_then(|(_, ranks)| ranks.get(r).copied()).unwrap_or(r);
        loop {
            let from = if gate && ingress.busy_at(Instant::now()) { Some(self.rank) } else { None };
            let Some((source, t, mut bytes)) = probe_receive(&self.comm, from, None) else { break };
            let at = if source != self.rank && bytes.len() >= STAMP {
                let stamp = bytes.split_off(bytes.len() - STAMP);
                let arrival = instant_of(f64::from_le_bytes(stamp.try_into().expect("8 bytes")));
                self.bytes_received += bytes.len() as u64;
                ingress.deliver_beside(arrival, bytes.len() as u64, own, pacer_rank(source))
            } else {
                Instant::now()
            };
            self.arrived.push_back((at, source, t, bytes));
        }
        let now = Instant::now();
        let i = self.arrived.iter().position(|m| m.2 == tag && m.0 <= now)?;
        self.arrived.remove(i).map(|(_, source, _, bytes)| (source, bytes))
    }

    /// With the inbound link modelled: when the last message taken from MPI is delivered (None
    /// when nothing waits in the arrival queue).
    pub fn arrivals_due(&self) -> Option<Instant> {
        self.arrived.back().map(|m| m.0)
    }

    /// Waits (polling with back-off, calling `serve` between polls so this rank keeps answering
    /// others) until every send of this rank has completed; past `timeout` the sign-of-life board
    /// judges the wait ([`super::deadline::WaitDeadline`]: only ranks without a sign of life are
    /// named as holding it up, and the wait goes on while every rank lives).
    pub fn flush_sends(&mut self, timeout: Duration, mut serve: impl FnMut(&mut Self) -> anyhow::Result<()>) -> anyhow::Result<()> {
        let mut deadline = super::deadline::WaitDeadline::new(timeout);
        let mut backoff = Backoff::default();
        while self.progress_sends()? > 0 || self.arrivals_due().is_some_and(|t| t > Instant::now()) {
            serve(self)?;
            let mut failed = None;
            let verdict = deadline.check(|| {
                if failed.is_none() {
                    failed = serve(self).err();
                }
                if failed.is_none() {
                    failed = self.progress_sends().err().map(anyhow::Error::from);
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            if let Some(why) = verdict.filter(|_| !self.in_flight.is_empty() || !self.held.is_empty()) {
                anyhow::bail!(
                    "rank {}: {} message(s) not delivered after {:.1} s (--wait-timeout): {why}",
                    self.rank,
                    self.in_flight.len() + self.held.len(),
                    deadline.waited().as_secs_f64()
                );
            }
            backoff.pause();
        }
        Ok(())
    }
}

/// A non-blocking barrier over the postbox's communicator ([`Postbox::start_barrier`]).
pub struct Barrier {
    request: ffi::MPI_Request,
    done: bool,
}

impl Postbox {
    /// Starts a non-blocking barrier (`MPI_Ibarrier`): the owner keeps serving messages while it
    /// waits, which a blocking barrier would not let it do.
    pub fn start_barrier(&self) -> Result<Barrier, PostboxError> {
        let mut request = request_null();
        // SAFETY: the communicator is live for self's lifetime; MPI writes the request handle.
        let code = unsafe { ffi::MPI_Ibarrier(self.comm.as_raw(), &mut request) };
        check("MPI_Ibarrier", code)?;
        Ok(Barrier { request, done: false })
    }

    /// True once every rank has entered the barrier.
    pub fn barrier_done(&self, b: &mut Barrier) -> Result<bool, PostboxError> {
        if !b.done {
            let mut flag: c_int = 0;
            // SAFETY: the request came from MPI_Ibarrier and has not completed yet (`done` is set
            // below when MPI_Test reports completion, after which it is never tested again).
            let code = unsafe { ffi::MPI_Test(&mut b.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            check("MPI_Test", code)?;
            b.done = flag != 0;
        }
        Ok(b.done)
    }
}

impl Drop for Postbox {
    fn drop(&mut self) {
        // A send still in flight may be read by MPI later: its buffer must outlive it. This only
        // happens when the job is being aborted, so leaking is harmless.
        for f in self.in_flight.drain(..) {
            std::mem::forget(f.buf);
        }
    }
}

/// Takes one waiting message from any rank with `tag` (None: any tag): `(source, tag, bytes)`,
/// or None when there is none or the probe failed. Raw calls, not rsmpi's matched probe: rsmpi
/// ignores MPI_Improbe's return code and reads its flag even when the call failed without
/// setting it, and under ULFM (src/comm/ulfm.rs) a probe after a rank was lost fails, so rsmpi
/// went on to receive a message that was never matched (a segfault in `mca_pml_ob1_mrecv`,
/// every survivor of a `kill -9`, Open MPI 5.0.11).
fn probe_receive(comm: &SimpleCommunicator, source: Option<usize>, tag: Option<i32>) -> Option<(usize, i32, Vec<u8>)> {
    let mut flag: c_int = 0;
    // SAFETY: the MESSAGE_NULL/ANY_* values are immutable statics of rsmpi's C shim; a zeroed
    // MPI_Status is a valid value of the plain C struct for MPI to overwrite.
    let (mut msg, mut status, any_source, any_tag) =
        unsafe { (ffi::RSMPI_MESSAGE_NULL, std::mem::zeroed::<ffi::MPI_Status>(), ffi::RSMPI_ANY_SOURCE, ffi::RSMPI_ANY_TAG) };
    // SAFETY: `comm` is live; flag, msg and status are valid writable locals for the call.
    let from = source.map_or(any_source, |r| r as c_int);
    let rc = unsafe { ffi::MPI_Improbe(from, tag.unwrap_or(any_tag), comm.as_raw(), &mut flag, &mut msg, &mut status) };
    if rc != ffi::MPI_SUCCESS as c_int || flag == 0 {
        return None;
    }
    let mut count: c_int = 0;
    // SAFETY: `status` was filled by the successful probe; UINT8 is rsmpi's static handle.
    let rc = unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
    let mut buf = vec![0u8; if rc == ffi::MPI_SUCCESS as c_int { count.max(0) as usize } else { 0 }];
    // SAFETY: `msg` is the message just matched, received exactly once into `buf`, which holds
    // its `count` bytes.
    let rc = unsafe { ffi::MPI_Mrecv(buf.as_mut_ptr().cast(), buf.len() as c_int, ffi::RSMPI_UINT8_T, &mut msg, &mut status) };
    (rc == ffi::MPI_SUCCESS as c_int).then_some((status.MPI_SOURCE as usize, status.MPI_TAG, buf))
}

fn request_null() -> ffi::MPI_Request {
    // SAFETY: reading an immutable extern static initialised by rsmpi's C shim.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn check(call: &'static str, code: c_int) -> Result<(), PostboxError> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(PostboxError { call, code })
    }
}
