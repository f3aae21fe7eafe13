//! Step-size schedules.

use crate::config::LrSchedule;

/// Step size for mini-batch `t` (0-based, counted on this rank) in `epoch`, with `batch`
/// examples per mini-batch.
pub fn step_size(kind: LrSchedule, eta0: f32, lambda: f32, decay: f32, t: u64, epoch: usize, batch: usize) -> f32 {
    match kind {
        LrSchedule::Constant => eta0,
        LrSchedule::InvSqrt => eta0 / ((1 + t) as f32).sqrt(),
        // Bottou counts examples, so the schedule does not change with the batch size.
        LrSchedule::Bottou => eta0 / (1.0 + lambda * eta0 * (t as f32 * batch as f32)),
        LrSchedule::Decay => eta0 * decay.powi(epoch as i32),
        // The client's steps are converted back to gradients (divided by eta0) by the servers,
        // which choose the step sizes.
        LrSchedule::Adarevision => eta0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules() {
        assert_eq!(step_size(LrSchedule::Constant, 0.5, 0.1, 0.9, 100, 3, 8), 0.5);
        assert!((step_size(LrSchedule::InvSqrt, 1.0, 0.0, 0.9, 3, 0, 8) - 0.5).abs() < 1e-7);
        assert!((step_size(LrSchedule::Bottou, 1.0, 0.1, 0.9, 10, 0, 1) - 0.5).abs() < 1e-7);
        assert!((step_size(LrSchedule::Decay, 1.0, 0.0, 0.5, 0, 2, 1) - 0.25).abs() < 1e-7);
    }
}
