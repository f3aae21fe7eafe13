//! AdaRevision's arithmetic (McMahan and Streeter, NIPS 2014), as Bosen §3.4 runs it on the
//! shard servers of `--sync bosen --lr-schedule adarevision`: a per-coordinate step whose
//! denominator grows with the gradients applied since the client read the row (its backlog), and
//! the steps those were given revised to the new, smaller step size. The server's bookkeeping of
//! versions and snapshots is the shard server's (server.rs).

/// AdaRevision's per-coordinate state on a shard server (McMahan and Streeter, NIPS 2014, as
/// used by Bosen §3.4): the accumulated gradient, and the adaptive denominators z and z' = max z.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaRevision {
    /// alpha: the initial step size (`--lr`).
    pub alpha: f32,
    pub g_sum: Vec<f32>,
    pub z: Vec<f32>,
    pub z_max: Vec<f32>,
}

impl AdaRevision {
    /// State for `len` coordinates. z starts at 1 (as Bosen's implementation does), so the first
    /// step is alpha * g rather than alpha * sign(g).
    pub fn new(alpha: f32, len: usize) -> Self {
        AdaRevision { alpha, g_sum: vec![0.0; len], z: vec![1.0; len], z_max: vec![1.0; len] }
    }

    /// Applies gradient `g` to coordinates `at..at + g.len()` of `x`, computed by a client that
    /// read those coordinates when the accumulated gradient was `g_old` (its snapshot): the
    /// gradients applied since (the backlog g_bck = g_sum - g_old) enlarge the denominator, and
    /// the steps they were given are revised to the new, smaller step size:
    ///   eta_old = alpha / sqrt(z'),  z += g^2 + 2 g g_bck,  z' = max(z', z),  eta = alpha / sqrt(z'),
    ///   x += -eta g + (eta_old - eta) g_bck,  g_sum += g.
    pub fn apply(&mut self, x: &mut [f32], at: usize, g: &[f32], g_old: &[f32]) {
        for (i, (&gi, &old)) in g.iter().zip(g_old).enumerate() {
            let j = at + i;
            let bck = self.g_sum[j] - old;
            let eta_old = self.alpha / self.z_max[j].sqrt();
            self.z[j] += gi * gi + 2.0 * gi * bck;
            self.z_max[j] = self.z_max[j].max(self.z[j]);
            let eta = self.alpha / self.z_max[j].sqrt();
            x[i] += -eta * gi + (eta_old - eta) * bck;
            self.g_sum[j] += gi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-computed example: alpha = 1, z starts at 1.
    #[test]
    fn adarevision_revises_the_backlog() {
        let mut a = AdaRevision::new(1.0, 1);
        let mut x = [0.0f32];
        // Client A read at g_sum = 0 and pushes g = 1: no backlog. z = 1 + 1 = 2, eta = 1/sqrt 2.
        a.apply(&mut x, 0, &[1.0], &[0.0]);
        let e1 = 1.0 / 2f32.sqrt();
        assert!((x[0] + e1).abs() < 1e-6);
        // Client B also read at g_sum = 0 and pushes g = 1: backlog 1.
        // eta_old = 1/sqrt 2; z = 2 + 1 + 2 = 5; eta = 1/sqrt 5;
        // x = -e1 - eta * 1 + (eta_old - eta) * 1 = -2 eta.
        a.apply(&mut x, 0, &[1.0], &[0.0]);
        let eta = 1.0 / 5f32.sqrt();
        assert!((x[0] + 2.0 * eta).abs() < 1e-6, "{}", x[0]);
        assert_eq!(a.g_sum[0], 2.0);
        assert_eq!(a.z_max[0], 5.0);
        // A fresh read (g_old = g_sum) has no backlog: plain AdaGrad-like step.
        a.apply(&mut x, 0, &[-1.0], &[2.0]);
        let eta3 = 1.0 / 6f32.sqrt();
        assert!((x[0] - (-2.0 * eta + eta3)).abs() < 1e-6);
    }
}
