//! The emulated cluster's compute: every local step takes a declared wall time (`--emulate-compute
//! MS` at nominal speed, times the rank's `--straggler` factor for that round), of which the real
//! step (real data, real gradients) is the first part and a sleep the rest. The CPU then no longer
//! decides a comparison of sync modes: 8 ranks on 2 cores behave like 8 machines as long as the
//! real steps fit in the declared time, which every run checks and reports.
//!
//! Why a sleep and not a spin: a spinning rank holds a core that another rank's real step needs
//! (2 cores, 8 ranks). Why compensate oversleeping: `thread::sleep` wakes 50-100 us late here;
//! over 1,000 steps of 20 ms that is 0.3-0.5 % drift per rank, so each step's lateness is taken
//! off the next one (up to half a step) instead of accumulating.
//!
//! A step is *broken* when its own work (the real compute) took longer than its declared time:
//! there was nothing left to sleep, so the emulated machine was slower than declared. A late
//! wake-up from the sleep (the OS gave the core back late: measured here at load 11, 2 ranks,
//! 20 ms steps: 0.03-0.13 ms typically, 1-2.6 ms in about 1 of 20 steps) is made up by the next
//! step and counted apart; the drift that remains is the steps' wall time against their declared
//! time. A run is invalid when a rank broke more than 1 % of its steps or drifted more than 1 %;
//! it says so in its summary and in the metrics (`emulation.valid`).

use std::time::{Duration, Instant};

use crate::config::StragglerWait;
use crate::train::jitter::{Jitter, JitterDraws};
use crate::train::schedule::StragglerPlan;

/// Largest share of a rank's steps that may break before its run is invalid.
pub const MAX_BROKEN_FRACTION: f64 = 0.01;

/// Counters of one rank's emulated compute.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EmulationStats {
    /// Local steps taken under emulation.
    pub steps: u64,
    /// Steps whose own work (the real compute and whatever ran since it began) took longer than
    /// the time declared for them (less the last step's overrun being made up).
    pub broken: u64,
    /// Steps that woke from their sleep later than 5 % of the step (at least 0.5 ms): the OS
    /// did not give the rank a core back in time. Made up by the next step, so they shift one
    /// step, not the pace; `actual_seconds` against `declared_seconds` shows what is left.
    pub late_wakeups: u64,
    /// Wall seconds the steps lasted (compute + sleep), against `declared_seconds`.
    pub actual_seconds: f64,
    /// Of those, steps whose real compute alone exceeded the declared time.
    pub compute_overruns: u64,
    /// Seconds by which broken steps ran over (what the emulated cluster did not model).
    pub overrun_seconds: f64,
    /// Declared seconds of all steps (the emulated compute time).
    pub declared_seconds: f64,
    /// Seconds slept to fill the steps.
    pub slept_seconds: f64,
}

/// Paces one rank's local steps: the straggler emulation with or without declared step times.
pub struct StepPacer {
    /// `--emulate-compute`, in seconds per step at nominal speed.
    declared: Option<f64>,
    plan: StragglerPlan,
    rank: usize,
    wait: StragglerWait,
    /// Without declared times: the measured-time slow-down still owed (slept in >= 1 ms chunks).
    debt: f64,
    /// With declared times: how much later than declared the steps so far ended (taken off the
    /// next one; never below 0, never more than half a step at once).
    carry: f64,
    pub stats: EmulationStats,
    /// Seconds slept or spun to slow this rank down (the `straggler_sleep_seconds` counter).
    pub straggle_seconds: f64,
    /// `--emulate-jitter`: each declared step's factor, drawn.
    pub jitter: Option<JitterDraws>,
}

impl StepPacer {
    pub fn new(declared_ms: Option<f64>, plan: StragglerPlan, rank: usize, wait: StragglerWait) -> Self {
        StepPacer {
            declared: declared_ms.map(|m| m / 1e3),
            plan,
            rank,
            wait,
            debt: 0.0,
            carry: 0.0,
            stats: EmulationStats::default(),
            straggle_seconds: 0.0,
            jitter: None,
        }
    }

    /// With `--emulate-jitter`: every declared step's time is multiplied by a factor drawn from
    /// `jitter` (this rank's stream of `seed`).
    pub fn with_jitter(mut self, jitter: Option<&Jitter>, seed: u64) -> Self {
        self.jitter = jitter.map(|j| JitterDraws::new(j.clone(), seed, self.rank));
        self
    }

    /// True when steps have a declared time.
    pub fn emulated(&self) -> bool {
        self.declared.is_some()
    }

    /// This rank's slow-down in `round`.
    pub fn factor(&self, round: u64) -> f64 {
        self.plan.factor(self.rank, round)
    }

    /// `--balance`: the examples this rank takes in a step of `round` so that the step costs what
    /// a full one costs a rank at nominal speed (at least 1).
    pub fn balanced_batch(&self, batch: usize, round: u64) -> usize {
        ((batch as f64 / self.factor(round)).round() as usize).clamp(1, batch)
    }

    /// Called right after a step that began at `t0` and computed for `compute` seconds, in
    /// `round`, over `share` of a full mini-batch (1 unless `--balance` shrank it): sleeps what
    /// the step still owes.
    pub fn after_step(&mut self, t0: Instant, compute: f64, round: u64, share: f64) {
        self.after_step_idle(t0, compute, round, share, &mut std::thread::sleep);
    }

    /// [`StepPacer::after_step`], spending the rest of the step in `idle(d)` instead of a plain
    /// sleep (with `--straggler-wait sleep`): a rank that also serves others (the async
    /// coordinator) answers them meanwhile, as its own server process would on the cluster
    /// being emulated. `idle` must return after about `d`.
    pub fn after_step_idle(&mut self, t0: Instant, compute: f64, round: u64, share: f64, idle: &mut dyn FnMut(Duration)) {
        let factor = self.factor(round);
        match self.declared {
            Some(d) => {
                let jitter = self.jitter.as_mut().map_or(1.0, JitterDraws::draw);
                self.fill_declared(t0, compute, d * factor * share * jitter, idle)
            }
            None if factor > 1.0 => self.slow_measured(compute, factor, idle),
            None => {}
        }
    }

    /// Emulated: the step lasts `target` seconds from `t0`, less what the last one overran.
    fn fill_declared(&mut self, t0: Instant, compute: f64, target: f64, idle: &mut dyn FnMut(Duration)) {
        self.stats.steps += 1;
        self.stats.declared_seconds += target;
        let intended = t0 + Duration::from_secs_f64((target - self.carry).max(0.0));
        let now = Instant::now();
        // Broken: the step's own work (compute and what ran since t0) left no time to sleep,
        // so this step could not be made to last its declared time.
        let broken = now >= intended;
        if !broken {
            self.pause(intended - now, idle);
        }
        let end = Instant::now();
        let took = end.saturating_duration_since(t0).as_secs_f64();
        self.stats.actual_seconds += took;
        let late = took - target;
        // The debt carries over: a wake-up late by L every step is made up every step (a carry
        // of only the last step's lateness made up every other one: 3.6-6.6 % drift measured at
        // load 10 with 20 ms steps, 8 ranks).
        self.carry = (self.carry + late).clamp(0.0, target / 2.0);
        log::trace!("emulated step, rank {}: compute {:.3} ms, late {:.3} ms", self.rank, compute * 1e3, late * 1e3);
        let s = &mut self.stats;
        if late > (0.05 * target).max(5e-4) {
            s.late_wakeups += u64::from(!broken);
        }
        if broken && late > 0.0 {
            s.broken += 1;
            s.overrun_seconds += late;
            s.compute_overruns += u64::from(compute > target);
        }
    }

    /// Without declared times (the older form): the step's measured time is stretched by the
    /// factor; the extra is paid in chunks of >= 1 ms (the OS cannot sleep for microseconds), or
    /// spun after every step.
    fn slow_measured(&mut self, compute: f64, factor: f64, idle: &mut dyn FnMut(Duration)) {
        self.debt += (factor - 1.0) * compute;
        if self.wait == StragglerWait::Busy || self.debt > 1e-3 {
            self.pause(Duration::from_secs_f64(self.debt), idle);
            self.debt = 0.0;
        }
    }

    fn pause(&mut self, d: Duration, idle: &mut dyn FnMut(Duration)) {
        let t = Instant::now();
        match self.wait {
            StragglerWait::Sleep => idle(d),
            StragglerWait::Busy => {
                while t.elapsed() < d {
                    std::hint::spin_loop();
                }
            }
        }
        let slept = t.elapsed().as_secs_f64();
        self.stats.slept_seconds += slept;
        // Declared steps count what was slept; the older form what it asked for (its factor x
        // compute), as `straggler_sleep_seconds` always has (the OS's late wake-up is not the
        // straggler's sleep).
        self.straggle_seconds += if self.declared.is_some() { slept } else { d.as_secs_f64() };
    }
}

impl StepPacer {
    /// How much longer the emulated steps lasted than declared (0.01 = 1 %); 0 without them.
    pub fn drift(&self) -> f64 {
        if self.stats.declared_seconds > 0.0 {
            self.stats.actual_seconds / self.stats.declared_seconds - 1.0
        } else {
            0.0
        }
    }
}

/// CPUs this machine has online (not the ones this process is bound to, which is what
/// `available_parallelism` reports under `mpirun --bind-to core`), from /sys; 1 if unknown.
pub fn online_cores() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let n: usize = text
        .trim()
        .split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<usize>().ok()? - a.parse::<usize>().ok()? + 1),
            None => r.parse::<usize>().ok().map(|_| 1),
        })
        .sum();
    n.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_steps_last_their_declared_time_and_count_what_breaks() {
        let plan = StragglerPlan::Fixed(vec![1.0, 2.0]);
        let mut p = StepPacer::new(Some(4.0), plan, 1, StragglerWait::Sleep);
        let t = Instant::now();
        for round in 1..=10 {
            let t0 = Instant::now();
            p.after_step(t0, 0.0, round, 1.0);
        }
        // 10 steps of 2 x 4 ms never take less than 80 ms (compensation only makes up lateness);
        // how much more depends on the OS waking the thread, so no upper bound is asserted.
        let e = t.elapsed().as_secs_f64();
        assert!(e >= 0.0795 && p.stats.actual_seconds >= 0.0795 && p.stats.actual_seconds <= e, "{e} {:?}", p.stats);
        assert_eq!(p.stats.steps, 10);
        assert!((p.stats.declared_seconds - 0.08).abs() < 1e-9);
        // A step whose real compute took longer than declared is broken, and counted as such.
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(12));
        p.after_step(t0, 0.012, 11, 1.0);
        assert_eq!((p.stats.broken, p.stats.compute_overruns), (1, 1));
        assert!(p.stats.overrun_seconds >= 0.0039, "{}", p.stats.overrun_seconds);
        // --balance: half the examples, half the declared time.
        assert_eq!(p.balanced_batch(256, 1), 128);
        assert_eq!(p.balanced_batch(1, 1), 1);
    }
}
