//! Rate limiting of one rank's outgoing bytes: a leaky bucket that drains at a fixed rate.
//!
//! Two users: `--emulate-bandwidth` (every mode: the rank's link is made as slow as a real one of
//! that rate, so bandwidth-bound comparisons can run on one machine) and the bandwidth budget of
//! `--sync bosen` (the rank spends at most that rate). Both are the same model: a message of b
//! bytes occupies the link for b / rate seconds after the link is free, and the next one starts
//! when it is done (Bosen §3.3.1: the bucket leaks at the budget's rate, a send is allowed when
//! it is empty). Optionally every message also arrives `latency` after it left.
//!
//! The bucket only computes times; callers either sleep until then (blocking sends: collectives,
//! one-sided puts) or hold the message back until then ([`super::postbox::Postbox`]). Every send
//! can be logged (time since start, bytes) for checking the rate afterwards.

use std::time::{Duration, Instant};

/// A leaky bucket over one rank's outgoing bytes.
#[derive(Debug, Clone)]
pub struct Pacer {
    bytes_per_second: f64,
    latency: Duration,
    /// When the link has carried everything reserved so far.
    free_at: Instant,
    start: Instant,
    /// (seconds since start when the message entered the link, bytes), if recording.
    log: Option<Vec<(f64, u64)>>,
}

impl Pacer {
    /// A link of `megabits_per_second` (10^6 bits) with a one-way `latency`.
    pub fn new(megabits_per_second: f64, latency: Duration) -> Self {
        assert!(megabits_per_second > 0.0 && megabits_per_second.is_finite(), "rate must be positive");
        let now = Instant::now();
        Pacer { bytes_per_second: megabits_per_second * 1e6 / 8.0, latency, free_at: now, start: now, log: None }
    }

    /// Keeps a log of every reservation (see [`Pacer::log`]).
    pub fn record(mut self) -> Self {
        self.log = Some(Vec::new());
        self
    }

    /// The rate in bytes per second.
    pub fn bytes_per_second(&self) -> f64 {
        self.bytes_per_second
    }

    /// The one-way latency.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// Puts `bytes` on the link as soon as it is free (not before `now`); returns when the link
    /// starts carrying them and when their last byte has left (not counting latency).
    pub fn reserve_at(&mut self, bytes: u64, now: Instant) -> (Instant, Instant) {
        let start = self.free_at.max(now);
        let end = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_second);
        self.free_at = end;
        if let Some(log) = &mut self.log {
            log.push(((start - self.start).as_secs_f64(), bytes));
        }
        (start, end)
    }

    /// [`Pacer::reserve_at`] now.
    pub fn reserve(&mut self, bytes: u64) -> (Instant, Instant) {
        self.reserve_at(bytes, Instant::now())
    }

    /// Blocks (sleeping: the CPU is free for other ranks) until a link of this rate would have
    /// sent `bytes` more, and returns the time slept.
    pub fn send_blocking(&mut self, bytes: u64) -> Duration {
        let (_, end) = self.reserve(bytes);
        sleep_until(end)
    }

    /// True when everything reserved has left (the bucket is empty): a send now starts at once.
    pub fn idle_at(&self, now: Instant) -> bool {
        self.free_at <= now
    }

    /// The reservations so far: (seconds since the pacer was made, bytes).
    pub fn log(&self) -> &[(f64, u64)] {
        self.log.as_deref().unwrap_or(&[])
    }
}

/// A token bucket over one rank's outgoing bytes, for senders that choose what to send from what
/// the budget allows now instead of waiting for it (`--sync asap --bandwidth-mbps`: each round
/// sends only the rows that fit). Credit accrues at the rate up to `capacity`; a send spends it
/// and may overdraw it (the protocol's few mandatory bytes), which later sends then repay. Over
/// any window of T seconds the bytes spent are at most `capacity + rate * T` plus one overdraw.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    bytes_per_second: f64,
    capacity: f64,
    tokens: f64,
    at: Instant,
    start: Instant,
    log: Option<Vec<(f64, u64)>>,
}

impl TokenBucket {
    /// A full bucket of `capacity` bytes refilled at `megabits_per_second` (10^6 bits).
    pub fn new(megabits_per_second: f64, capacity: u64) -> Self {
        assert!(megabits_per_second > 0.0 && megabits_per_second.is_finite(), "rate must be positive");
        let now = Instant::now();
        TokenBucket {
            bytes_per_second: megabits_per_second * 1e6 / 8.0,
            capacity: capacity as f64,
            tokens: capacity as f64,
            at: now,
            start: now,
            log: None,
        }
    }

    /// Keeps a log of every spend (see [`TokenBucket::log`]).
    pub fn record(mut self) -> Self {
        self.log = Some(Vec::new());
        self
    }

    /// The rate in bytes per second.
    pub fn bytes_per_second(&self) -> f64 {
        self.bytes_per_second
    }

    /// Bytes that may be sent at `now` (0 while an overdraw is being repaid).
    pub fn available_at(&mut self, now: Instant) -> u64 {
        if now > self.at {
            let earned = (now - self.at).as_secs_f64() * self.bytes_per_second;
            self.tokens = (self.tokens + earned).min(self.capacity);
            self.at = now;
        }
        self.tokens.max(0.0) as u64
    }

    /// Spends `bytes` sent at `now` (possibly more than available: an overdraw).
    pub fn spend_at(&mut self, bytes: u64, now: Instant) {
        self.available_at(now);
        self.tokens -= bytes as f64;
        if let Some(log) = &mut self.log {
            log.push(((now - self.start).as_secs_f64(), bytes));
        }
    }

    /// The spends so far: (seconds since the bucket was made, bytes).
    pub fn log(&self) -> &[(f64, u64)] {
        self.log.as_deref().unwrap_or(&[])
    }
}

/// Sleeps until `t` (no-op when it has passed); returns the time slept.
pub fn sleep_until(t: Instant) -> Duration {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
        now.elapsed()
    } else {
        Duration::ZERO
    }
}

/// The most bytes sent in any window of `window` seconds of a send log (sorted by time), as a
/// rate in bytes per second. Windows start at a send (the worst case for a step function).
pub fn peak_rate(log: &[(f64, u64)], window: f64) -> f64 {
    let mut best = 0u64;
    let mut sum = 0u64;
    let mut j = 0;
    for i in 0..log.len() {
        while j < log.len() && log[j].0 < log[i].0 + window {
            sum += log[j].1;
            j += 1;
        }
        best = best.max(sum);
        sum -= log[i].1;
    }
    best as f64 / window
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_drains_at_its_rate_and_never_sends_before_free() {
        // 8 Mbit/s = 1e6 bytes/s: 1000 bytes take 1 ms.
        let mut p = Pacer::new(8.0, Duration::ZERO).record();
        let t0 = Instant::now();
        let (s1, e1) = p.reserve_at(1000, t0);
        assert_eq!(s1, t0);
        assert_eq!(e1 - s1, Duration::from_millis(1));
        // Asked for at once: queued behind the first.
        let (s2, e2) = p.reserve_at(500, t0);
        assert_eq!(s2, e1);
        assert_eq!(e2 - s2, Duration::from_micros(500));
        assert!(!p.idle_at(t0) && p.idle_at(e2));
        // After an idle gap the link starts at the request time, not at free_at.
        let later = e2 + Duration::from_millis(10);
        let (s3, _) = p.reserve_at(10, later);
        assert_eq!(s3, later);
        assert_eq!(p.log().len(), 3);
    }

    #[test]
    fn the_token_bucket_earns_at_its_rate_up_to_its_capacity_and_repays_overdraws() {
        // 8 Mbit/s = 1e6 bytes/s, capacity 5000 bytes.
        let mut b = TokenBucket::new(8.0, 5000).record();
        let t0 = b.at;
        assert_eq!(b.available_at(t0), 5000);
        b.spend_at(4000, t0);
        assert_eq!(b.available_at(t0), 1000);
        // 2 ms earn 2000 bytes.
        assert_eq!(b.available_at(t0 + Duration::from_millis(2)), 3000);
        // Never more than the capacity, however long idle.
        assert_eq!(b.available_at(t0 + Duration::from_secs(10)), 5000);
        // An overdraw leaves nothing until repaid: 5000 + 1000 spent, 1 ms earns the 1000 back.
        let t1 = t0 + Duration::from_secs(10);
        b.spend_at(6000, t1);
        assert_eq!(b.available_at(t1), 0);
        assert_eq!(b.available_at(t1 + Duration::from_micros(500)), 0);
        assert_eq!(b.available_at(t1 + Duration::from_millis(3)), 2000);
        assert_eq!(b.log().len(), 2);
        // Spending everything available as fast as possible stays within rate * T + capacity.
        let mut b = TokenBucket::new(8.0, 5000).record();
        let t0 = b.at;
        for i in 0..20_000u32 {
            let now = t0 + Duration::from_micros(100) * i;
            let a = b.available_at(now);
            if a > 0 {
                b.spend_at(a, now);
            }
        }
        let peak = peak_rate(b.log(), 1.0);
        assert!(peak <= 1e6 + 5000.0 + 1.0, "{peak}");
        assert!(peak >= 1e6 - 1000.0, "{peak}");
    }

    #[test]
    fn peak_rate_is_the_fullest_window() {
        let log = [(0.0, 100), (0.5, 100), (0.99, 100), (1.5, 50), (3.0, 1)];
        assert_eq!(peak_rate(&log, 1.0), 300.0);
        assert_eq!(peak_rate(&log, 0.2), 500.0);
        assert_eq!(peak_rate(&[], 1.0), 0.0);
        // A paced log never exceeds rate + one message per window.
        let mut p = Pacer::new(8.0, Duration::ZERO).record();
        let t0 = Instant::now();
        for _ in 0..5000 {
            p.reserve_at(1000, t0);
        }
        let peak = peak_rate(p.log(), 1.0);
        assert!(peak <= 1e6 + 1000.0, "{peak}");
        assert!(peak >= 1e6 - 1000.0, "{peak}");
    }
}
