//! Per-neighbour mailboxes in one RMA window, and the NOTIFY-ACK protocol on them (ASAP §4).
//!
//! Rank r's window holds, in this order (all u64-aligned):
//! - one notify word per in-neighbour: that sender's message count, put after its data is
//!   remotely complete,
//! - one ack word per out-neighbour: that receiver's count of our messages it consumed,
//! - `depth` receive slots per in-neighbour: `[header round u64 | payload f32 x len | footer round
//!   u64]` (payload padded to 8 bytes); message number m of a sender goes to its slot
//!   `(m - 1) mod depth`. Depth 1 is ASAP's protocol; deeper mailboxes let a sender run messages
//!   ahead of what its receiver has read (bounded-staleness NOTIFY-ACK).
//!
//! In-neighbour and out-neighbour lists are sorted and deduplicated, and self-loops dropped, so
//! every rank derives every other rank's layout (and its own slot index there) from the same
//! adjacency without talking to it.
//!
//! Notify and ack words are single-writer counters published by `MPI_Put` + flush ("versioned
//! put") and read locally after `MPI_Win_sync`, not atomic increments: with Open MPI 4.1 osc/ucx
//! on this machine remote `MPI_Fetch_and_op` needs the target to progress, and a NOTIFY-ACK round
//! on 8 oversubscribed ranks (complete graph) took ~31 ms with atomics against ~40 us with puts.
//! Puts suffice because every word has exactly one writer and is written only after what it
//! announces is complete, so any change a reader observes (even a torn one) implies the event.
//!
//! A reader copies a slot as footer, payload, header and calls it consistent only if both rounds
//! match. When the sender writes header, then payload, then footer, each remotely complete before
//! the next ([`Mailboxes::post`] with `ordered`), this is a seqlock: any overlap with a write shows
//! as a mismatch (a torn read).

use std::time::{Duration, Instant};

use mpi::topology::{Communicator, SimpleCommunicator};

use mpi::collective::CommunicatorCollectives;

use super::backoff::Backoff;
use super::pace::{self, Ingress, Pacer};
use super::window::{RmaElement, RmaError, Window};

/// Bytes of one protocol word (header, footer, notify or ack counter).
pub const WORD: u64 = 8;

/// Errors of the mailbox layer.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// An MPI one-sided call failed.
    #[error(transparent)]
    Rma(#[from] RmaError),
    /// The neighbour lists do not describe a graph over this communicator.
    #[error("invalid communication graph: {0}")]
    Graph(String),
    /// Some neighbours did not notify or acknowledge in time.
    #[error(
        "rank {rank}: round {round}: waited {waited:.1?} for {what} from rank(s) {missing:?}, which \
         never arrived; a peer may have failed or stopped sending. If they are only slow \
         (oversubscribed, stragglers), raise --wait-timeout (now {timeout:?})"
    )]
    Timeout {
        /// This rank.
        rank: usize,
        /// The round being waited for.
        round: u64,
        /// "NOTIFY", "ACK" or "barrier arrival".
        what: &'static str,
        /// The neighbours that never answered (for a barrier: all other ranks, as MPI cannot
        /// tell which one is missing).
        missing: Vec<usize>,
        /// How long we waited.
        waited: Duration,
        /// The configured limit.
        timeout: Duration,
    },
}

/// Result of the mailbox layer.
pub type MailboxResult<T> = Result<T, MailboxError>;

/// What a slot held when read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotRead {
    /// Header == footer == this round; the payload was copied out intact.
    Consistent(u64),
    /// Header and footer differed (a write overlapped the read): `(header, footer)`.
    Torn(u64, u64),
    /// Never written (round 0).
    Empty,
}

/// Where a fixed-size message's payload starts in its slot: one cache line after the header, so
/// the payload of every slot is 64-byte aligned (slots and the slot region start on 64 bytes).
/// Measured reason (2 ranks, 8 MiB, osc/ucx shared memory, `rma-check` raw put+flush with the
/// target offset changed, two runs each): offset 0 took 422-823 us, offset 8 1,343-1,456 us,
/// offset 64 566-655 us. With the payload at header + 8, NOTIFY-ACK transfers ran at 0.60-0.68 of
/// the raw put.
const PAYLOAD_AT: usize = 64;

/// Byte offsets of one rank's window.
#[derive(Clone, Copy, Debug)]
struct Layout {
    in_degree: usize,
    out_degree: usize,
    /// Bytes from one slot to the next: [`PAYLOAD_AT`] + the payload padded to 8 bytes + the
    /// footer word, rounded up to 64.
    slot_stride: usize,
    /// The payload padded to 8 bytes: what a message carries besides its header and footer.
    payload_bytes: usize,
    depth: usize,
}

impl Layout {
    fn new(in_degree: usize, out_degree: usize, payload_len: usize, depth: usize) -> Self {
        let payload_bytes = (4 * payload_len).div_ceil(8) * 8;
        let slot_stride = (PAYLOAD_AT + payload_bytes + 8).div_ceil(64) * 64;
        Layout { in_degree, out_degree, slot_stride, payload_bytes, depth }
    }
    /// Bytes a fixed-size message puts: header, payload (padded) and footer.
    fn message_bytes(&self) -> usize {
        16 + self.payload_bytes
    }
    fn payload(&self, slot: usize) -> usize {
        slot + PAYLOAD_AT
    }
    fn footer(&self, slot: usize) -> usize {
        slot + self.slot_stride - 8
    }
    fn notify(&self, i: usize) -> usize {
        8 * i
    }
    fn ack(&self, j: usize) -> usize {
        8 * (self.in_degree + j)
    }
    /// Slot `k` (of `depth`) of in-neighbour `i`.
    fn slot(&self, i: usize, k: usize) -> usize {
        (8 * (self.in_degree + self.out_degree)).div_ceil(64) * 64 + (i * self.depth + k) * self.slot_stride
    }
    /// Slot of message number `m` (from 1) of in-neighbour `i`.
    fn message(&self, i: usize, m: u64) -> usize {
        self.slot(i, ((m.max(1) - 1) % self.depth as u64) as usize)
    }
    fn bytes(&self) -> usize {
        self.slot(self.in_degree, 0)
    }
}

/// Sorted, deduplicated neighbour lists without self-loops.
fn clean(list: &[usize], me: usize) -> Vec<usize> {
    let mut v: Vec<usize> = list.iter().copied().filter(|&r| r != me).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Neighbour lists indexed by rank.
pub type Adjacency = Vec<Vec<usize>>;

/// Cleans every in-neighbour list (sorted, deduplicated, no self-loops), checks ranks are in
/// range, and derives the sorted out-neighbour lists: `(ins, outs)`, indexed by rank.
pub fn derive_graph(in_neighbours: &[Vec<usize>]) -> MailboxResult<(Adjacency, Adjacency)> {
    let n = in_neighbours.len();
    let ins: Vec<Vec<usize>> = in_neighbours.iter().enumerate().map(|(r, l)| clean(l, r)).collect();
    if let Some((r, bad)) = ins.iter().enumerate().find_map(|(r, l)| l.iter().find(|&&j| j >= n).map(|&j| (r, j))) {
        return Err(MailboxError::Graph(format!("rank {r} lists in-neighbour {bad}, but the job has only ranks 0..{n}")));
    }
    let mut outs: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (r, l) in ins.iter().enumerate() {
        for &j in l {
            outs[j].push(r); // r ascending, so each list comes out sorted
        }
    }
    Ok((ins, outs))
}

/// The mailboxes of this rank plus what it knows of its neighbours' windows.
pub struct Mailboxes {
    win: Window,
    me: usize,
    len: usize,
    layouts: Vec<Layout>,
    in_nb: Vec<usize>,
    out_nb: Vec<usize>,
    /// Per out-neighbour: our slot (= notify counter) index in its window.
    slot_at: Vec<usize>,
    /// Per in-neighbour: our ack counter index in its window.
    ack_at: Vec<usize>,
    /// Per out-neighbour: sends so far (so an ACK count below it means unconsumed data).
    sends: Vec<u64>,
    /// Per out-neighbour: acks already counted as received.
    acks_seen: Vec<u64>,
    /// Per in-neighbour: notifications consumed (acknowledged) so far.
    consumed: Vec<u64>,
    /// Per in-neighbour: the round of the last consistent [`Mailboxes::read_slot`] (0: none), so
    /// that reading an unchanged slot again receives nothing.
    last_read: Vec<u64>,
    bytes_sent: u64,
    bytes_received: u64,
    /// `--emulate-bandwidth`: every put waits until a link of that rate would have carried it.
    pacer: Option<Pacer>,
    /// See [`Mailboxes::link_overruns`].
    link_overruns: u64,
    /// Deferred NOTIFYs (`send_deferred`): (when the emulated link delivers, out-neighbour), in
    /// delivery order.
    deferred: std::collections::VecDeque<(Instant, usize)>,
    /// This rank's inbound link, when modelled ([`Mailboxes::set_ingress`]): a notified message
    /// counts as delivered only once the link would have carried it in after the ones before.
    ingress: Option<Ingress>,
    /// Per in-neighbour: the newest notified message already put through the inbound link, the
    /// newest delivered, and the ones in between with their delivery times.
    gated: Vec<u64>,
    delivered: Vec<u64>,
    pending: Vec<std::collections::VecDeque<(Instant, u64)>>,
    /// Seconds of [`Mailboxes::send_to`] by part: the puts (each locally complete), the flush
    /// that makes them remotely complete (also counted for [`Mailboxes::post`]), and the NOTIFY
    /// (put + flush).
    transfer_parts: [f64; 3],
}

impl Mailboxes {
    /// Collectively allocates the mailboxes. `in_neighbours[r]` lists the ranks r receives from,
    /// for every rank r of `comm` (all ranks must pass the same lists); `payload_len` is the f32
    /// count per message.
    pub fn new(comm: &SimpleCommunicator, in_neighbours: &[Vec<usize>], payload_len: usize) -> MailboxResult<Mailboxes> {
        Mailboxes::with_depth(comm, in_neighbours, payload_len, 1)
    }

    /// [`Mailboxes::new`] with `depth` slots per in-neighbour (at least 1).
    pub fn with_depth(
        comm: &SimpleCommunicator,
        in_neighbours: &[Vec<usize>],
        payload_len: usize,
        depth: usize,
    ) -> MailboxResult<Mailboxes> {
        let depth = depth.max(1);
        let n = comm.size() as usize;
        let me = comm.rank() as usize;
        if in_neighbours.len() != n {
            return Err(MailboxError::Graph(format!("{} in-neighbour lists given for {n} ranks", in_neighbours.len())));
        }
        let (ins, outs) = derive_graph(in_neighbours)?;
        let layouts: Vec<Layout> = (0..n).map(|r| Layout::new(ins[r].len(), outs[r].len(), payload_len, depth)).collect();
        let in_nb = ins[me].clone();
        let out_nb = outs[me].clone();
        let position = |list: &[usize], x: usize| list.binary_search(&x).expect("derived lists");
        let slot_at = out_nb.iter().map(|&t| position(&ins[t], me)).collect();
        let ack_at = in_nb.iter().map(|&s| position(&outs[s], me)).collect();
        let win = Window::allocate(comm, layouts[me].bytes())?;
        let n_in = in_nb.len();
        Ok(Mailboxes {
            win,
            me,
            len: payload_len,
            sends: vec![0; out_nb.len()],
            acks_seen: vec![0; out_nb.len()],
            consumed: vec![0; in_nb.len()],
            last_read: vec![0; in_nb.len()],
            layouts,
            in_nb,
            out_nb,
            slot_at,
            ack_at,
            bytes_sent: 0,
            bytes_received: 0,
            pacer: None,
            link_overruns: 0,
            deferred: std::collections::VecDeque::new(),
            transfer_parts: [0.0; 3],
            ingress: None,
            gated: vec![0; n_in],
            delivered: vec![0; n_in],
            pending: vec![std::collections::VecDeque::new(); n_in],
        })
    }

    /// Paces every put of this rank through `pacer` (bandwidth emulation): a put is issued only
    /// when a link of that rate would have sent it, so receivers see data at the emulated time.
    pub fn set_pacer(&mut self, pacer: Option<Pacer>) {
        self.pacer = pacer;
    }

    /// Models this rank's inbound link (fixed-size messages only, not [`Mailboxes::for_bytes`]):
    /// every sender stamps its message with the time it would have arrived on a free link (the
    /// header's second word, inside the header's cache line); a notified message becomes visible
    /// to the waits and [`Mailboxes::fresh`] when the inbound link has carried it in after the
    /// ones before it. Every rank must get one or none (the stamp is read from every message).
    pub fn set_ingress(&mut self, ingress: Option<Ingress>) {
        self.ingress = ingress;
    }

    /// The inbound link, if modelled.
    pub fn ingress(&self) -> Option<&Ingress> {
        self.ingress.as_ref()
    }

    /// Newest message of in-neighbour `i` that is delivered: notified (read after `win.sync()`)
    /// and, with the inbound link modelled, carried in.
    fn visible(&mut self, i: usize) -> u64 {
        let raw = self.notifications(i);
        let Some(ingress) = self.ingress.as_mut() else { return raw };
        let lay = self.layouts[self.me];
        for m in self.gated[i] + 1..=raw {
            // Message m is notified and not yet acknowledged by us: its slot holds it still.
            let stamp = f64::from_bits(self.win.load_u64(lay.message(i, m) + WORD as usize));
            let at = ingress.deliver_at(pace::instant_of(stamp), lay.message_bytes() as u64);
            self.pending[i].push_back((at, m));
        }
        self.gated[i] = self.gated[i].max(raw);
        let now = Instant::now();
        while let Some(&(at, m)) = self.pending[i].front() {
            if at > now {
                break;
            }
            self.delivered[i] = m;
            self.pending[i].pop_front();
        }
        self.delivered[i]
    }

    /// The pacer, if any.
    pub fn pacer(&self) -> Option<&Pacer> {
        self.pacer.as_ref()
    }

    /// Puts `bytes` on the emulated link to `target`; returns when the link would have delivered
    /// them: their last byte out, plus the path's one-way latency (None without emulation).
    fn reserve(&mut self, target: usize, bytes: u64) -> Option<Instant> {
        self.pacer.as_mut().map(|p| p.put_to(target, bytes))
    }

    /// After the real transfer of a message the link would carry until `end`: waits for the rest
    /// of the emulated time, or counts a link overrun when the real transfer took longer (by more
    /// than 5 % of the emulated time, at least 0.5 ms).
    fn finish_transfer(&mut self, started: Instant, end: Option<Instant>) {
        let Some(end) = end else { return };
        let now = Instant::now();
        if now > end {
            let emulated = end.saturating_duration_since(started).as_secs_f64();
            if (now - end).as_secs_f64() > (0.05 * emulated).max(5e-4) {
                self.link_overruns += 1;
            }
        } else {
            std::thread::sleep(end - now);
        }
    }

    /// Messages whose real transfer took longer than their emulated link time (see
    /// [`Mailboxes::finish_transfer`]): the emulation did not hold for them.
    pub fn link_overruns(&self) -> u64 {
        self.link_overruns
    }

    /// Ranks this rank receives from (sorted; slot i belongs to `in_neighbours()[i]`).
    pub fn in_neighbours(&self) -> &[usize] {
        &self.in_nb
    }

    /// Ranks this rank sends to (sorted).
    pub fn out_neighbours(&self) -> &[usize] {
        &self.out_nb
    }

    /// Payload length in f32s.
    pub fn payload_len(&self) -> usize {
        self.len
    }

    /// The underlying window (e.g. for its communicator).
    pub fn window(&self) -> &Window {
        &self.win
    }

    /// Bytes this rank has put or atomically updated at others (payload, rounds, notify, ack).
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// Bytes of others' data this rank consumed: each message once (read consistent, or added,
    /// or carried by a newer one: [`Mailboxes::count_superseded`]; a slot read again unchanged
    /// adds nothing), each notification and ack once.
    pub fn bytes_received(&self) -> u64 {
        self.bytes_received
    }

    /// Bytes of one message: header, payload (padded), footer.
    pub fn message_bytes(&self) -> u64 {
        self.layouts[self.me].message_bytes() as u64
    }

    /// Writes `[round | payload | round]` into our slot at every out-neighbour and completes it
    /// remotely, WITHOUT waiting for acks (the caller decides: [`Mailboxes::wait_acks`]).
    /// `ordered` writes header, payload, footer as three remotely completed steps, so that readers
    /// detect any overlap (needed when no ACK protects the slot); otherwise one put.
    pub fn post<T: RmaElement>(&mut self, round: u64, payload: &[T], ordered: bool) -> MailboxResult<()> {
        for j in 0..self.out_nb.len() {
            self.post_to(j, round, payload, ordered)?;
        }
        Ok(())
    }

    fn post_to<T: RmaElement>(&mut self, j: usize, round: u64, payload: &[T], ordered: bool) -> MailboxResult<()> {
        let t = self.out_nb[j];
        // Without a NOTIFY the data is visible as soon as it lands: wait for the link first.
        let end = self.reserve(t, self.layouts[t].message_bytes() as u64);
        if let Some(end) = end {
            pace::sleep_until(end);
        }
        self.put_message(j, round, payload, ordered, end)
    }

    /// The puts of one message to out-neighbour `j`, remotely complete on return.
    fn put_message<T: RmaElement>(
        &mut self,
        j: usize,
        round: u64,
        payload: &[T],
        ordered: bool,
        arrival: Option<Instant>,
    ) -> MailboxResult<()> {
        assert_eq!(std::mem::size_of_val(payload), 4 * self.len, "payload size differs from the mailbox's");
        let t = self.out_nb[j];
        let lay = self.layouts[t];
        let base = lay.message(self.slot_at[j], self.sends[j] + 1);
        let target = t as i32;
        // Straight from the caller's slice: no staging copy. (Copying the payload byte by byte
        // into a buffer once per neighbour made a 1 MiB round at 2 ranks spend ~0.5 ms where a
        // raw put + flush takes ~30 us: the raw baseline `rma-check` prints; docs/asap.md.)
        // The padding after the payload is never written: readers ignore it.
        if self.ingress.is_some() {
            // The receiver's inbound link reads when this message would have arrived.
            let stamp = pace::wall_seconds(arrival.unwrap_or_else(Instant::now));
            self.win.put(target, base + WORD as usize, &[stamp.to_bits()])?;
        }
        if ordered {
            self.win.put(target, base, &[round])?;
            self.win.flush(target)?;
            self.win.put(target, lay.payload(base), payload)?;
            self.win.flush(target)?;
        } else {
            self.win.put(target, base, &[round])?;
            self.win.put(target, lay.payload(base), payload)?;
        }
        self.win.put(target, lay.footer(base), &[round])?;
        let t = Instant::now();
        self.win.flush(target)?;
        self.transfer_parts[1] += t.elapsed().as_secs_f64();
        self.sends[j] += 1;
        self.bytes_sent += lay.message_bytes() as u64;
        Ok(())
    }

    /// Publishes our message count in our notify word at out-neighbour `j` (index into
    /// `out_neighbours()`) and completes it. Call only after the data is remotely complete (post
    /// flushes), so any change of the word the receiver sees implies the data is there.
    fn notify(&mut self, j: usize) -> MailboxResult<()> {
        let t = self.out_nb[j] as i32;
        let off = self.layouts[self.out_nb[j]].notify(self.slot_at[j]);
        self.win.put(t, off, &[self.sends[j]])?;
        self.win.flush(t)?;
        self.bytes_sent += WORD;
        Ok(())
    }

    /// The NOTIFY half for one out-neighbour `j` (index into `out_neighbours()`): puts the
    /// message in one step, flushes it, then notifies. Call [`Mailboxes::wait_ack`] first.
    pub fn send_to(&mut self, j: usize, round: u64, payload: &[f32]) -> MailboxResult<()> {
        let t = Instant::now();
        let flush_before = self.transfer_parts[1];
        // With an emulated link the receiver learns of the message (NOTIFY) only when the link
        // would have delivered it; the real put runs inside that time instead of before it.
        let end = self.reserve(self.out_nb[j], self.layouts[self.out_nb[j]].message_bytes() as u64);
        self.put_message(j, round, payload, false, end)?;
        self.finish_transfer(t, end);
        let t2 = Instant::now();
        self.transfer_parts[0] += (t2 - t).as_secs_f64() - (self.transfer_parts[1] - flush_before);
        self.notify(j)?;
        self.transfer_parts[2] += t2.elapsed().as_secs_f64();
        Ok(())
    }

    /// Seconds spent in [`Mailboxes::send_to`] so far, by part: `[puts, flush, notify]`. The
    /// puts are header, payload and footer, each locally complete on return (MPI_Put +
    /// MPI_Win_flush_local); the flush makes them remotely complete; the notify is a put + flush
    /// of one word. For `rma-check --probe`, which sets them against a raw put + flush.
    pub fn transfer_parts(&self) -> [f64; 3] {
        self.transfer_parts
    }

    /// Mailboxes for variable-length byte messages of at most `max_body` bytes
    /// ([`Mailboxes::send_bytes_to`], [`Mailboxes::read_bytes`]): the slot holds
    /// `[round | length | body ... | round]`, the footer at the slot's fixed end.
    pub fn for_bytes(comm: &SimpleCommunicator, in_neighbours: &[Vec<usize>], max_body: usize) -> MailboxResult<Mailboxes> {
        Mailboxes::new(comm, in_neighbours, (WORD as usize + max_body).div_ceil(4))
    }

    /// Largest body [`Mailboxes::send_bytes_to`] takes.
    pub fn max_body_bytes(&self) -> usize {
        self.layouts[self.me].payload_bytes - WORD as usize
    }

    /// The NOTIFY half for a variable-length message to out-neighbour `j`: puts
    /// `[round | body.len() | body]` at the start of our slot there and `round` as the footer at
    /// the slot's end, completes both, then notifies. Only the body and three words travel, so a
    /// short message costs little however large the slot. Call [`Mailboxes::wait_ack`] first.
    /// Returns the bytes put (notify word included).
    pub fn send_bytes_to(&mut self, j: usize, round: u64, body: &[u8]) -> MailboxResult<u64> {
        assert!(body.len() <= self.max_body_bytes(), "message of {} bytes exceeds the slot's {}", body.len(), self.max_body_bytes());
        let t = self.out_nb[j];
        let lay = self.layouts[t];
        let base = lay.message(self.slot_at[j], self.sends[j] + 1);
        let target = t as i32;
        let bytes = 3 * WORD + body.len() as u64;
        let started = Instant::now();
        let end = self.reserve(t, bytes);
        self.win.put(target, base, &[round, body.len() as u64])?;
        self.win.put(target, base + 2 * WORD as usize, body)?;
        self.win.put(target, lay.footer(base), &[round])?;
        self.win.flush(target)?;
        self.finish_transfer(started, end);
        self.sends[j] += 1;
        self.bytes_sent += bytes;
        self.notify(j)?;
        Ok(bytes + WORD)
    }

    /// Reads the variable-length message in slot `i` (of `in_neighbours()[i]`) into `out` as
    /// footer, length, body, header, and reports whether it was consistent (`out` is meaningful
    /// only then).
    pub fn read_bytes(&mut self, i: usize, out: &mut Vec<u8>) -> MailboxResult<SlotRead> {
        let lay = self.layouts[self.me];
        let base = lay.message(i, self.consumed[i] + 1);
        self.win.sync()?;
        let footer = self.win.load_u64(lay.footer(base));
        let len = self.win.load_u64(base + WORD as usize) as usize;
        if len > self.max_body_bytes() {
            // Only a write in progress can show a length the sender could not have put.
            return Ok(SlotRead::Torn(self.win.load_u64(base), footer));
        }
        out.resize(len, 0);
        self.win.read_local(base + 2 * WORD as usize, out);
        let header = self.win.load_u64(base);
        Ok(if header == 0 && footer == 0 {
            SlotRead::Empty
        } else if header == footer {
            self.bytes_received += 3 * WORD + len as u64;
            SlotRead::Consistent(header)
        } else {
            SlotRead::Torn(header, footer)
        })
    }

    /// Reads the ack word of out-neighbour `j`, counting newly seen acks as received bytes.
    fn acks(&mut self, j: usize) -> MailboxResult<u64> {
        let off = self.layouts[self.me].ack(j);
        self.win.sync()?;
        let acks = self.win.load_u64(off);
        self.bytes_received += WORD * acks.saturating_sub(self.acks_seen[j]);
        self.acks_seen[j] = self.acks_seen[j].max(acks);
        Ok(acks)
    }

    /// Reads the notify word of in-neighbour `i` (call `win.sync()` first).
    fn notifications(&self, i: usize) -> u64 {
        self.win.load_u64(self.layouts[self.me].notify(i))
    }

    /// Waits until out-neighbour `j` (index into `out_neighbours()`) acknowledged enough of our
    /// messages that the slot of the next one is free: all of them at depth 1, all but the last
    /// `depth - 1` otherwise. `round` labels the error.
    pub fn wait_ack(&mut self, j: usize, round: u64, timeout: Duration) -> MailboxResult<()> {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        let need = (self.sends[j] + 1).saturating_sub(self.layouts[self.me].depth as u64);
        loop {
            let acks = self.acks(j)?;
            if acks >= need {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(self.timeout(round, "ACK", vec![self.out_nb[j]], start, timeout));
            }
            self.win.progress()?;
            backoff.pause();
        }
    }

    /// Waits until every out-neighbour acknowledged every message we sent it (drain before
    /// shutdown). `round` only labels the error.
    pub fn wait_acks(&mut self, round: u64, timeout: Duration) -> MailboxResult<()> {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            let mut missing = Vec::new();
            for j in 0..self.out_nb.len() {
                if self.acks(j)? < self.sends[j] {
                    missing.push(self.out_nb[j]);
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(self.timeout(round, "ACK", missing, start, timeout));
            }
            self.win.progress()?;
            backoff.pause();
        }
    }

    /// Waits until every in-neighbour has sent one more NOTIFY than we consumed (i.e. its message
    /// for `round` under NOTIFY-ACK is complete in our window).
    pub fn wait_notifications(&mut self, round: u64, timeout: Duration) -> MailboxResult<()> {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        let mut ready = vec![false; self.in_nb.len()];
        loop {
            self.win.sync()?;
            for (i, is_ready) in ready.iter_mut().enumerate() {
                if !*is_ready && self.visible(i) > self.consumed[i] {
                    *is_ready = true;
                    self.bytes_received += WORD;
                }
            }
            if ready.iter().all(|&r| r) {
                return Ok(());
            }
            if start.elapsed() > timeout {
                let missing = self.in_nb.iter().zip(&ready).filter(|(_, &r)| !r).map(|(&s, _)| s).collect();
                return Err(self.timeout(round, "NOTIFY", missing, start, timeout));
            }
            self.win.progress()?;
            backoff.pause();
        }
    }

    fn timeout(&self, round: u64, what: &'static str, missing: Vec<usize>, start: Instant, timeout: Duration) -> MailboxError {
        MailboxError::Timeout { rank: self.me, round, what, missing, waited: start.elapsed(), timeout }
    }

    /// A barrier over the window's communicator that gives up after `timeout` (MPI_Ibarrier
    /// polled with back-off), so a dead or stuck rank yields an error instead of a hang.
    /// `round` labels the error. After a timeout the job must be aborted: the barrier request is
    /// abandoned, and this rank is no longer in step with the others.
    pub fn barrier(&self, round: u64, timeout: Duration) -> MailboxResult<()> {
        let start = Instant::now();
        // MPI_Ibarrier advances only inside MPI_Test here, so sleeping early would delay every
        // rank: yield for a while first.
        let mut backoff = Backoff::with_yield_window(Duration::from_millis(20));
        let mut request = self.win.comm().immediate_barrier();
        loop {
            match request.test() {
                Ok(_) => return Ok(()),
                Err(pending) => request = pending,
            }
            if start.elapsed() > timeout {
                // rsmpi panics when an incomplete request is dropped; the job is about to be
                // aborted by the caller, so leaking this one handle is the lesser evil.
                std::mem::forget(request);
                let others = (0..self.layouts.len()).filter(|&r| r != self.me).collect();
                return Err(self.timeout(round, "barrier arrival", others, start, timeout));
            }
            backoff.pause();
        }
    }

    /// The end of a BSP round's transfers with the inbound links modelled ([`Mailboxes::set_ingress`]),
    /// for puts read without a NOTIFY (`--notify barrier`). Collective: call on every rank right
    /// after [`Mailboxes::barrier`] of `round`, before anyone puts the next round.
    ///
    /// [`Mailboxes::post`] waits only for the sender's own link, so without this a rank whose
    /// in-neighbours all sent at once would read their models as soon as each sender's link was
    /// done, as if its own inbound link carried them all in parallel: on the root expander at 8
    /// ranks (MLP-256, 1 GbE at dilation 8) barrier rounds took 119 ms against NOTIFY-ACK's 145
    /// ms, whose NOTIFYs wait for the inbound link. Here each rank puts this round's messages
    /// (those its slots hold, in the order they would have arrived on a free link) through its
    /// inbound link, and every rank waits until the latest of those deliveries on any rank: a
    /// real barrier after remotely complete puts ends only once the last of them has landed.
    /// Without a modelled inbound link it does nothing.
    pub fn wait_inbound_of_round(&mut self, round: u64) -> MailboxResult<()> {
        if self.ingress.is_none() {
            return Ok(());
        }
        self.win.sync()?;
        let lay = self.layouts[self.me];
        let mut stamps = Vec::new();
        for i in 0..self.in_nb.len() {
            for k in 0..lay.depth {
                let base = lay.slot(i, k);
                if self.win.load_u64(base) == round {
                    stamps.push(f64::from_bits(self.win.load_u64(base + WORD as usize)));
                }
            }
        }
        stamps.sort_by(f64::total_cmp);
        let ingress = self.ingress.as_mut().expect("checked above");
        let bytes = lay.message_bytes() as u64;
        let mut done = Instant::now();
        for s in stamps {
            done = done.max(ingress.deliver_at(pace::instant_of(s), bytes));
        }
        // One clock on one machine: the latest delivery anywhere is one tiny max-reduction, as
        // allreduce's latest entry time is.
        let mut latest = [pace::wall_seconds(done)];
        super::collectives::max_f64(self.win.comm(), &mut latest);
        pace::sleep_until(pace::instant_of(latest[0]));
        Ok(())
    }

    /// Copies slot `i` (of `in_neighbours()[i]`) into `out` as footer, payload, header and reports
    /// whether it was consistent. `out` is only meaningful for [`SlotRead::Consistent`].
    pub fn read_slot<T: RmaElement>(&mut self, i: usize, out: &mut [T]) -> MailboxResult<SlotRead> {
        assert_eq!(std::mem::size_of_val(out), 4 * self.len, "output size differs from the mailbox's");
        let lay = self.layouts[self.me];
        let base = lay.slot(i, 0);
        // Make remote writes completed so far visible to local loads (MPI unified model).
        self.win.sync()?;
        let footer = self.win.load_u64(lay.footer(base));
        self.win.read_local(lay.payload(base), out);
        let header = self.win.load_u64(base);
        Ok(if header == 0 && footer == 0 {
            SlotRead::Empty
        } else if header == footer {
            if header != self.last_read[i] {
                self.last_read[i] = header;
                self.bytes_received += lay.message_bytes() as u64;
            }
            SlotRead::Consistent(header)
        } else {
            SlotRead::Torn(header, footer)
        })
    }

    /// Counts `messages` messages of an in-neighbour as received that a newer message overwrote
    /// in its slot before this rank read them, for protocols whose messages are running totals
    /// (push-sum): the newer message carries their data, so it was delivered and used.
    pub fn count_superseded(&mut self, messages: u64) {
        self.bytes_received += messages * self.layouts[self.me].message_bytes() as u64;
    }

    /// Adds the payload of in-neighbour `i`'s message number `m` to `acc` in place (no copy) and
    /// returns what its slot held (the payload is added only when consistent). Only for a message
    /// that has been notified and not yet acknowledged (`consumed < m <= notified`): the sender
    /// writes its slot again only with message `m + depth`, which needs our ACK of `m`, so the
    /// payload can be read as plain memory.
    pub fn add_message(&mut self, i: usize, m: u64, acc: &mut [f32]) -> MailboxResult<SlotRead> {
        assert_eq!(acc.len(), self.len, "accumulator length differs from the mailbox's");
        self.win.sync()?;
        assert!(
            self.consumed[i] < m && m <= self.notifications(i),
            "add_message: message {m} of slot {i} is not notified and unacknowledged"
        );
        let lay = self.layouts[self.me];
        let base = lay.message(i, m);
        let header = self.win.load_u64(base);
        let footer = self.win.load_u64(lay.footer(base));
        if header != footer {
            return Ok(SlotRead::Torn(header, footer));
        }
        // SAFETY (of the protocol, which `quiescent_local` relies on): message m was notified
        // after its data was remotely complete, and its slot is not written again before our
        // ACK of m, which comes after this call.
        self.win.quiescent_local(lay.payload(base), self.len, |slot: &[f32]| {
            for (a, x) in acc.iter_mut().zip(slot) {
                *a += *x;
            }
        });
        self.bytes_received += lay.message_bytes() as u64;
        Ok(SlotRead::Consistent(header))
    }

    /// [`Mailboxes::add_message`] for the next message of in-neighbour `i` (depth 1, after
    /// [`Mailboxes::wait_notifications`]).
    pub fn add_notified_slot(&mut self, i: usize, acc: &mut [f32]) -> MailboxResult<SlotRead> {
        self.add_message(i, self.consumed[i] + 1, acc)
    }

    /// Newest message number in-neighbour `i` has notified (after `win.sync()` in a wait).
    pub fn notified(&mut self, i: usize) -> u64 {
        self.visible(i)
    }

    /// Waits until in-neighbour `i` has sent one more NOTIFY than we consumed (time-varying
    /// graphs: only this round's in-neighbour). `round` labels the error.
    pub fn wait_one(&mut self, i: usize, round: u64, timeout: Duration) -> MailboxResult<()> {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            self.win.sync()?;
            if self.visible(i) > self.consumed[i] {
                self.bytes_received += WORD;
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(self.timeout(round, "NOTIFY", vec![self.in_nb[i]], start, timeout));
            }
            self.win.progress()?;
            backoff.pause();
        }
    }

    /// Waits until every in-neighbour has notified at least `count` messages. `round` labels the
    /// error.
    pub fn wait_notified(&mut self, count: u64, round: u64, timeout: Duration) -> MailboxResult<()> {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            self.win.sync()?;
            let visible: Vec<u64> = (0..self.in_nb.len()).map(|i| self.visible(i)).collect();
            let missing: Vec<usize> = (0..self.in_nb.len()).filter(|&i| visible[i] < count).map(|i| self.in_nb[i]).collect();
            if missing.is_empty() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(self.timeout(round, "NOTIFY", missing, start, timeout));
            }
            self.win.progress()?;
            backoff.pause();
        }
    }

    /// True when out-neighbour `j`'s slot for our next message is free (every message we sent it
    /// acknowledged, at depth 1) and no NOTIFY to it is still on the emulated link: a send now
    /// would not wait.
    pub fn slot_free(&mut self, j: usize) -> MailboxResult<bool> {
        if self.deferred.iter().any(|&(_, k)| k == j) {
            return Ok(false);
        }
        let need = (self.sends[j] + 1).saturating_sub(self.layouts[self.me].depth as u64);
        Ok(self.acks(j)? >= need)
    }

    /// Sends a message to out-neighbour `j` without waiting for the emulated link: the data is
    /// put now, and its NOTIFY is published when the link would have delivered it (egress queue
    /// at the path's rate, plus latency), by [`Mailboxes::progress_deferred`]. The receiver cannot
    /// read it before, and we cannot write the slot again before its ACK, so the message is
    /// "on the wire" meanwhile while this rank computes, as with a real NIC. Call only when
    /// [`Mailboxes::slot_free`].
    pub fn send_deferred(&mut self, j: usize, round: u64, payload: &[f32]) -> MailboxResult<()> {
        let t = self.out_nb[j];
        let end = self.reserve(t, self.layouts[t].message_bytes() as u64);
        self.put_message(j, round, payload, false, end)?;
        match end {
            Some(due) => {
                self.deferred.push_back((due, j));
                self.progress_deferred()
            }
            None => self.notify(j),
        }
    }

    /// Publishes the deferred NOTIFYs whose time has come.
    pub fn progress_deferred(&mut self) -> MailboxResult<()> {
        let now = Instant::now();
        while let Some(&(due, j)) = self.deferred.front() {
            if due > now {
                break;
            }
            self.deferred.pop_front();
            self.notify(j)?;
        }
        Ok(())
    }

    /// Publishes every deferred NOTIFY, sleeping until each is due (before shutdown).
    pub fn drain_deferred(&mut self) -> MailboxResult<()> {
        while let Some(&(due, _)) = self.deferred.front() {
            pace::sleep_until(due);
            self.progress_deferred()?;
        }
        Ok(())
    }

    /// Per in-neighbour: whether a message we have not consumed is notified (read now).
    pub fn fresh(&mut self) -> MailboxResult<Vec<bool>> {
        self.win.sync()?;
        Ok((0..self.in_nb.len()).map(|i| self.visible(i) > self.consumed[i]).collect())
    }

    /// Waits until every in-neighbour has a fresh message or `until` passes, publishing our
    /// deferred NOTIFYs meanwhile; returns which in-neighbours have one.
    pub fn wait_fresh_until(&mut self, until: Instant) -> MailboxResult<Vec<bool>> {
        let mut backoff = Backoff::default();
        loop {
            self.progress_deferred()?;
            let fresh = self.fresh()?;
            if fresh.iter().all(|&f| f) || Instant::now() >= until {
                return Ok(fresh);
            }
            self.win.progress()?;
            backoff.pause();
        }
    }

    /// Acknowledges in-neighbour `i`'s messages up to number `m` (cumulative: a receiver that
    /// skips older messages acknowledges them with the newer one). Never moves backwards.
    pub fn ack_upto(&mut self, i: usize, m: u64) -> MailboxResult<()> {
        if m <= self.consumed[i] {
            return Ok(());
        }
        let s = self.in_nb[i];
        let off = self.layouts[s].ack(self.ack_at[i]);
        self.bytes_received += WORD * (m - self.consumed[i] - 1); // the skipped NOTIFYs
        self.consumed[i] = m;
        self.win.put(s as i32, off, &[m])?;
        self.win.flush(s as i32)?;
        self.bytes_sent += WORD;
        Ok(())
    }

    /// ACKs in-neighbour `i`: its message is consumed, it may overwrite the slot. Publishes our
    /// consumed count in our ack word at the sender (we are its only writer).
    pub fn ack(&mut self, i: usize) -> MailboxResult<()> {
        self.ack_upto(i, self.consumed[i] + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_is_cleaned_and_inverted() {
        // 0 <- {2, 1, 1, 0}, 1 <- {0}, 2 <- {1}
        let (ins, outs) = derive_graph(&[vec![2, 1, 1, 0], vec![0], vec![1]]).unwrap();
        assert_eq!(ins, vec![vec![1, 2], vec![0], vec![1]]);
        assert_eq!(outs, vec![vec![1], vec![0, 2], vec![0]]);
    }

    #[test]
    fn out_of_range_neighbour_is_refused_with_the_rank() {
        let err = derive_graph(&[vec![1], vec![5]]).unwrap_err().to_string();
        assert!(err.contains("rank 1 lists in-neighbour 5"), "{err}");
    }

    #[test]
    fn layout_regions_do_not_overlap_and_stay_aligned() {
        let lay = Layout::new(3, 2, 7, 1);
        assert_eq!(lay.notify(2) + 8, lay.ack(0));
        assert!(lay.ack(1) + 8 <= lay.slot(0, 0), "words before slots");
        assert_eq!(lay.slot(0, 0), 64, "5 words padded to a cache line");
        // 64 to the payload + 28 payload bytes padded to 32 + 8 footer = 104, rounded to 128.
        assert_eq!((lay.payload_bytes, lay.slot_stride, lay.message_bytes()), (32, 128, 48));
        assert!((0..=3).all(|i| lay.slot(i, 0).is_multiple_of(64) && lay.payload(lay.slot(i, 0)).is_multiple_of(64)));
        assert!(lay.payload(0) + lay.payload_bytes <= lay.footer(0) && lay.footer(0) + 8 == lay.slot_stride);
        assert_eq!(lay.bytes(), lay.slot(3, 0));
        // Depth 3: message m of in-neighbour i lands in slot (m - 1) mod 3, slots back to back.
        let deep = Layout { depth: 3, ..lay };
        assert_eq!(deep.message(1, 1), deep.slot(1, 0));
        assert_eq!(deep.message(1, 5), deep.slot(1, 1));
        assert_eq!(deep.slot(0, 2) + 128, deep.slot(1, 0));
        assert_eq!(deep.bytes(), deep.slot(2, 2) + 128);
    }
}
