//! Wait-loop pacing shared by every polled wait (mailboxes, postboxes, deadlines, preemption and
//! the parameter-server loops): spin, then yield, then sleep.

use std::time::{Duration, Instant};

/// Wait-loop pacing: spin briefly, then yield the CPU (cheap when oversubscribed ranks share a
/// core: the peer we wait for gets to run), and only after ~0.2 ms of waiting sleep with pauses
/// growing to 1 ms, so idle waits do not burn a core that others need.
#[derive(Debug)]
pub struct Backoff {
    start: Instant,
    step: u32,
    sleep: Duration,
    yield_window: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::with_yield_window(Duration::from_micros(200))
    }
}

impl Backoff {
    /// A back-off that yields (instead of sleeping) for `yield_window` after the spins: longer
    /// for waits that only complete while this rank keeps calling into MPI (a polled barrier).
    pub fn with_yield_window(yield_window: Duration) -> Self {
        Backoff { start: Instant::now(), step: 0, sleep: Duration::ZERO, yield_window }
    }

    /// Pauses a little longer each call.
    pub fn pause(&mut self) {
        self.step = self.step.saturating_add(1);
        if self.step < 16 {
            std::hint::spin_loop();
        } else if self.start.elapsed() < self.yield_window {
            std::thread::yield_now();
        } else {
            self.sleep = (self.sleep * 2).clamp(Duration::from_micros(20), Duration::from_millis(1));
            std::thread::sleep(self.sleep);
        }
    }
}
