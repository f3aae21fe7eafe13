//! `asap-train graph mix`: simulate the averaging x_{t+1} = W_t x_t of ASAP's stochastic reduce
//! in one process (no MPI) from a seeded random start, and count the rounds until the consensus
//! distance ||x_t - mean(x_t)|| has fallen by a factor epsilon. Next to it the spectral-gap
//! prediction: for a doubly stochastic W, ||W (x - mean)|| <= sigma_2 ||x - mean||, so at most
//! ceil(ln epsilon / ln sigma_2) rounds (a bound: a random start usually needs fewer).
//!
//! Static graphs use W = P every round. The one-peer exponential graph is time-varying: in round
//! k node i sends to i + 2^(k mod tau), tau = ceil(log2 n), and averages itself with its single
//! in-neighbour; its prediction is tau times the rounds of the product over one period.

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::spectral::{analyse_with, mixing_rounds, one_peer_period, one_peer_period_sigma_2, GraphReport, Method, SparseP};
use super::Graph;
use crate::rng::Rng;

/// An averaging schedule: the same graph every round, or one that changes with the round.
pub enum Schedule<'a> {
    Static(&'a Graph),
    /// One-peer exponential graph on n nodes.
    OnePeerExponential(usize),
}

impl Schedule<'_> {
    fn nodes(&self) -> usize {
        match self {
            Schedule::Static(g) => g.nodes(),
            Schedule::OnePeerExponential(n) => *n,
        }
    }
}

/// One simulated family next to its prediction.
#[derive(Clone, Debug, Serialize)]
pub struct MixReport {
    pub graph: String,
    pub nodes: usize,
    /// Models each rank sends per round (largest out-degree).
    pub sends_per_round: usize,
    /// Spectral gap of W (static) or of the product over one period (time-varying).
    pub spectral_gap: f64,
    /// Rounds per period (1 for a static graph).
    pub period: usize,
    /// Rounds the spectral gap predicts (an upper bound for doubly stochastic W; None: gap 0).
    pub predicted_rounds: Option<u64>,
    /// Rounds until the consensus distance fell by epsilon (None: not within the limits).
    pub measured_rounds: Option<u64>,
    /// Rounds simulated (equals measured when reached).
    pub simulated_rounds: u64,
    /// Consensus distance relative to the start after the last simulated round.
    pub final_distance: f64,
    pub epsilon: f64,
    pub analysis_seconds: f64,
    pub simulation_seconds: f64,
}

/// ||x - mean(x)||.
fn consensus_distance(x: &[f64]) -> f64 {
    let mean = x.par_iter().sum::<f64>() / x.len() as f64;
    x.par_iter().map(|v| (v - mean) * (v - mean)).sum::<f64>().sqrt()
}

/// Simulates `schedule` from a seeded standard normal start until the consensus distance fell by
/// `epsilon`, or `max_rounds` rounds, or `max_seconds` passed. Returns (rounds reached,
/// rounds simulated, final relative distance).
pub fn simulate(schedule: &Schedule, epsilon: f64, max_rounds: u64, max_seconds: f64, seed: u64) -> (Option<u64>, u64, f64) {
    let n = schedule.nodes();
    let mut rng = Rng::new(seed);
    let mut x: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let mut y = vec![0.0; n];
    let d0 = consensus_distance(&x);
    if n == 1 || d0 == 0.0 {
        return (Some(0), 0, 0.0);
    }
    let t0 = Instant::now();
    let sparse = match schedule {
        Schedule::Static(g) => Some(SparseP::new(g)),
        Schedule::OnePeerExponential(_) => None,
    };
    let tau = one_peer_period(n);
    let mut rel = 1.0;
    for t in 0..max_rounds {
        match &sparse {
            Some(p) => p.mul(&x, &mut y),
            None => {
                // In round t node i hears from i - 2^(t mod tau).
                let shift = (1usize << (t as usize % tau)) % n;
                let xs = &x;
                y.par_iter_mut().enumerate().with_min_len(1 << 12).for_each(|(i, yi)| *yi = 0.5 * (xs[i] + xs[(i + n - shift) % n]));
            }
        }
        std::mem::swap(&mut x, &mut y);
        rel = consensus_distance(&x) / d0;
        if rel <= epsilon {
            return (Some(t + 1), t + 1, rel);
        }
        if t0.elapsed().as_secs_f64() > max_seconds {
            return (None, t + 1, rel);
        }
    }
    (None, max_rounds, rel)
}

/// Analyses and simulates one family: `kind` is a generator spec (built for `n` nodes with
/// `seed`), `file:PATH`, or `one-peer-exponential`.
pub fn mix(kind: &str, n: usize, seed: u64, epsilon: f64, max_rounds: u64, max_seconds: f64) -> anyhow::Result<MixReport> {
    let t0 = Instant::now();
    let one_peer = kind == super::ONE_PEER_EXPONENTIAL;
    let graph = if one_peer { None } else { Some(super::generate(kind, n, seed)?) };
    let (gap, period, predicted, sends, name, n) = match &graph {
        None => {
            let tau = one_peer_period(n);
            let s2 = one_peer_period_sigma_2(n);
            let per_period = mixing_rounds(s2, epsilon);
            (1.0 - s2, tau, per_period.map(|r| r * tau as u64), 1, format!("{kind} (period {tau})"), n)
        }
        Some(g) => {
            let r: GraphReport = analyse_with(g, 0, Method::Auto, epsilon);
            (r.spectral_gap, 1, r.mixing_rounds, r.max_out_degree, g.name.clone(), g.nodes())
        }
    };
    let analysis_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let schedule = match &graph {
        Some(g) => Schedule::Static(g),
        None => Schedule::OnePeerExponential(n),
    };
    let (measured, simulated, final_distance) = simulate(&schedule, epsilon, max_rounds, max_seconds, seed);
    Ok(MixReport {
        graph: name,
        nodes: n,
        sends_per_round: sends,
        spectral_gap: gap,
        period,
        predicted_rounds: predicted,
        measured_rounds: measured,
        simulated_rounds: simulated,
        final_distance,
        epsilon,
        analysis_seconds,
        simulation_seconds: t1.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::generate;

    #[test]
    fn one_peer_exponential_averages_exactly_in_one_period_on_powers_of_two() {
        for k in 1..=10 {
            let n = 1usize << k;
            assert!(one_peer_period_sigma_2(n) < 1e-12, "n {n}");
            let (reached, _, rel) = simulate(&Schedule::OnePeerExponential(n), 1e-9, 100, 10.0, 3);
            assert_eq!(reached, Some(k as u64), "n {n}: rel {rel}");
        }
        // Not a power of two: one period is not exact, the product's sigma_2 is in (0, 1).
        let s = one_peer_period_sigma_2(100);
        assert!(s > 0.01 && s < 1.0, "{s}");
    }

    #[test]
    fn one_peer_period_gap_matches_the_dense_product() {
        // Build each round's P densely, multiply one period, and compare sigma_2.
        use ndarray::Array2;
        use ndarray_linalg::SVD;
        for n in [3usize, 5, 6, 12, 16, 20] {
            let tau = one_peer_period(n);
            let mut prod = Array2::<f64>::eye(n);
            for k in 0..tau {
                let mut w = Array2::<f64>::zeros((n, n));
                for i in 0..n {
                    w[[i, i]] += 0.5;
                    w[[i, (i + n - (1 << k) % n) % n]] += 0.5;
                }
                prod = w.dot(&prod);
            }
            let (_, s, _) = prod.svd(false, false).unwrap();
            assert!((s[1] - one_peer_period_sigma_2(n)).abs() < 1e-9, "n {n}: dense {} fourier {}", s[1], one_peer_period_sigma_2(n));
        }
    }

    #[test]
    fn measured_rounds_never_exceed_the_spectral_bound_on_doubly_stochastic_graphs() {
        for (kind, n) in
            [("ring", 64), ("root-expander", 300), ("exponential", 1000), ("hypercube", 512), ("random:3", 500), ("torus", 400)]
        {
            let r = mix(kind, n, 5, 1e-3, 100_000, 30.0).unwrap();
            let (p, m) = (r.predicted_rounds.unwrap(), r.measured_rounds.unwrap());
            assert!(m <= p, "{kind} {n}: measured {m} > predicted {p}");
            // ... and the bound is not loose by orders of magnitude: the slowest mode dominates.
            assert!(m * 3 >= p, "{kind} {n}: measured {m} vs predicted {p}");
        }
        // The ring on n nodes: sigma_2 = cos(pi / n).
        let r = mix("ring", 64, 5, 1e-3, 100_000, 30.0).unwrap();
        assert!((r.spectral_gap - (1.0 - (std::f64::consts::PI / 64.0).cos())).abs() < 1e-12);
        assert!(generate("one-peer-exponential", 8, 1).is_err());
    }
}
