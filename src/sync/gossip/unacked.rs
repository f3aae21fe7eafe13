//! The variants without NOTIFY-ACK, which put their model and reduce whatever intact slots hold:
//! `--notify barrier` (BSP: put, MPI_Barrier, reduce the slots that hold this round) and
//! `--notify none` (fully asynchronous: reduce every intact message not older than the last one
//! used, never block). A slot may be overwritten while it is read, so reads can be torn.
//!
//! On `--transport p2p` the same semantics over two-sided messages, which queue instead of
//! overwriting: barrier waits for every in-neighbour's message of the round (a per-edge barrier;
//! the messages of a round already begun are what the global barrier waits for on rma) and reduces
//! those; none takes each in-neighbour's newest queued message (the older ones, which a slot
//! would have overwritten unread, count as stale) and reduces it, or the newest one taken before
//! when nothing new came, as a slot still holds it. A complete message cannot be torn.

use std::time::Instant;

use super::neighbourhood::Neighbourhood;
use super::variant::Gossip;
use crate::comm::mailbox::SlotRead;

/// Verdict on a consistent buffer's round.
enum Accept {
    Use,
    Stale,
    Torn,
}

/// The buffers of a reduce that reads slots into a copy (a slot may change under the read).
struct Slots {
    acc: Vec<f32>,
    incoming: Vec<f32>,
}

impl Slots {
    fn new(n_params: usize) -> Self {
        Slots { acc: vec![0.0; n_params], incoming: vec![0.0; n_params] }
    }

    /// Adds in-neighbour slot `i` to the accumulator if `accept` says its round is usable;
    /// returns the round it used. An empty slot counts as stale when `empty_is_stale`.
    fn take(
        &mut self,
        net: &mut Neighbourhood,
        i: usize,
        empty_is_stale: bool,
        accept: impl Fn(u64) -> Accept,
    ) -> anyhow::Result<Option<u64>> {
        match net.mail.read_slot(i, &mut self.incoming)? {
            SlotRead::Consistent(h) => match accept(h) {
                Accept::Use => {
                    for (a, x) in self.acc.iter_mut().zip(&self.incoming) {
                        *a += *x;
                    }
                    return Ok(Some(h));
                }
                Accept::Stale => net.stale += 1,
                Accept::Torn => net.torn += 1,
            },
            SlotRead::Torn(..) => net.torn += 1,
            SlotRead::Empty => net.stale += u64::from(empty_is_stale),
        }
        Ok(None)
    }
}

/// `--notify barrier`: every rank waits for every other each round.
pub(super) struct Barrier {
    slots: Slots,
}

impl Barrier {
    pub(super) fn new(n_params: usize) -> Self {
        Barrier { slots: Slots::new(n_params) }
    }
}

impl Gossip for Barrier {
    fn lockstep(&self) -> bool {
        true
    }

    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        if net.p2p.is_some() {
            return self.round_p2p(net, params, round);
        }
        let t = Instant::now();
        if net.sending(round) {
            net.mail.post(round, params, true)?;
        }
        let t2 = Instant::now();
        net.mail.barrier(round, net.wait_timeout)?;
        // The barrier says every put was issued; the data is in only when this round's inbound
        // links have carried it (waiting, as NOTIFY-ACK's wait for a NOTIFY behind its link is).
        net.mail.wait_inbound_of_round(round)?;
        let t3 = Instant::now();
        self.slots.acc.copy_from_slice(params);
        let mut used = 0;
        for i in 0..net.in_degree() {
            let taken = self.slots.take(net, i, true, |h| match h.cmp(&round) {
                std::cmp::Ordering::Equal => Accept::Use,
                std::cmp::Ordering::Less => Accept::Stale,
                // A fast sender already wrote the next round: a mixed-version buffer.
                std::cmp::Ordering::Greater => Accept::Torn,
            })?;
            used += taken.is_some() as usize;
        }
        net.reduce_into(params, &self.slots.acc, used);
        net.stats.comm_seconds += (t2 - t).as_secs_f64() + t3.elapsed().as_secs_f64();
        net.stats.wait_seconds += (t3 - t2).as_secs_f64();
        Ok(())
    }

    /// Every message sent must be in its receiver's queue before the end's barrier.
    fn drain(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        net.settle_links_counted()
    }
}

impl Barrier {
    /// [`Gossip::round`] on the two-sided transport: send, wait for every in-neighbour's message
    /// of this round, reduce them.
    fn round_p2p(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let t = Instant::now();
        let (sending, timeout) = (net.sending(round), net.wait_timeout);
        let d = net.in_degree();
        let p = net.p2p.as_mut().expect("checked by the caller");
        if sending {
            for j in 0..net.mail.out_neighbours().len() {
                p.send_to(j, round, params)?;
            }
        }
        let t2 = Instant::now();
        net.stale += p.wait_round(round, timeout)?;
        // Lockstep: the loop evaluates after a round without a cut, in collectives, so this
        // rank's messages of the round must have left the emulated link before it goes on (a
        // message still held there left its receiver waiting through the evaluation: found with
        // --emulate-bandwidth and --eval-every). rma's barrier waits for its inbound links alike.
        p.release_held(timeout)?;
        let t3 = Instant::now();
        self.slots.acc.copy_from_slice(params);
        let mut used = 0;
        for i in 0..d {
            // The queue holds this round's message first, or (a sender's rounds skipping this
            // one) a later one, kept for its own round.
            if p.next_round(i) != Some(round) {
                net.stale += 1;
                continue;
            }
            match p.add_next(i, &mut self.slots.acc) {
                SlotRead::Consistent(_) => used += 1,
                _ => net.torn += 1,
            }
        }
        net.reduce_into(params, &self.slots.acc, used);
        net.stats.comm_seconds += (t2 - t).as_secs_f64() + t3.elapsed().as_secs_f64();
        net.stats.wait_seconds += (t3 - t2).as_secs_f64();
        Ok(())
    }
}

/// `--notify none`: put, reduce whatever intact buffers are there, never block.
pub(super) struct Unsynchronised {
    slots: Slots,
    /// Per in-neighbour: newest round already reduced.
    last_used: Vec<u64>,
}

impl Unsynchronised {
    pub(super) fn new(n_params: usize, in_degree: usize) -> Self {
        Unsynchronised { slots: Slots::new(n_params), last_used: vec![0; in_degree] }
    }
}

impl Gossip for Unsynchronised {
    fn round(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let t = Instant::now();
        if net.p2p.is_some() {
            self.round_p2p(net, params, round)?;
            net.stats.comm_seconds += t.elapsed().as_secs_f64();
            return Ok(());
        }
        if net.sending(round) {
            net.mail.post(round, params, true)?;
        }
        self.slots.acc.copy_from_slice(params);
        let mut used = 0;
        for i in 0..net.in_degree() {
            let last = self.last_used[i];
            let taken = self.slots.take(net, i, false, |h| if h >= last { Accept::Use } else { Accept::Stale })?;
            if let Some(h) = taken {
                self.last_used[i] = h;
                used += 1;
            }
        }
        net.reduce_into(params, &self.slots.acc, used);
        net.stats.comm_seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Every message sent must be in its receiver's queue before the end's barrier.
    fn drain(&mut self, net: &mut Neighbourhood) -> anyhow::Result<()> {
        net.settle_links_counted()
    }
}

impl Unsynchronised {
    /// [`Gossip::round`] on the two-sided transport: send without waiting, take each
    /// in-neighbour's newest message (the older ones queued count as stale, overwritten unread on
    /// rma), reduce the newest of each that ever came.
    fn round_p2p(&mut self, net: &mut Neighbourhood, params: &mut [f32], round: u64) -> anyhow::Result<()> {
        let sending = net.sending(round);
        let d = net.in_degree();
        let p = net.p2p.as_mut().expect("checked by the caller");
        if sending {
            for j in 0..net.mail.out_neighbours().len() {
                p.send_to(j, round, params)?;
            }
        }
        p.poll()?;
        self.slots.acc.copy_from_slice(params);
        let mut used = 0;
        for i in 0..d {
            net.stale += p.take_newest(i).saturating_sub(1);
            match p.add_latest(i, &mut self.slots.acc) {
                SlotRead::Consistent(h) => {
                    self.last_used[i] = h;
                    used += 1;
                }
                SlotRead::Torn(..) => net.torn += 1,
                SlotRead::Empty => {}
            }
        }
        net.reduce_into(params, &self.slots.acc, used);
        Ok(())
    }
}
