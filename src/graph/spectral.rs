//! Spectral analysis of a communication graph (ASAP Appendix A). With A the adjacency matrix
//! plus self-loops (A_ij = 1 if j sends to i, A_ii = 1) and P = diag(d_in)^-1 A (d_in counting
//! the self-loop), the spectral gap is 1 - sigma_2(P).
//!
//! Three methods, chosen by `Method::Auto`:
//! - dense SVD (LAPACK) up to 256 nodes;
//! - Fourier, for the generated Cayley graphs of abelian groups (ring, exponential, root
//!   expander, torus, hypercube): P is then a group convolution, normal, and diagonalised by the
//!   group's characters, so its singular values are the moduli |(1 + sum_s chi(s)) / (d + 1)|,
//!   computed exactly in O(nodes * degree). This is the only way to resolve a ring's gap at a
//!   million nodes (pi^2 / 2n^2 = 4.7e-12): a Krylov method needs on the order of n iterations;
//! - Lanczos on P^T P for everything else (random graphs, files), with these design choices,
//!   each from a measurement (`perf record` of the old code on a 16,384-node random 4-out graph:
//!   7.2 s, 80 % in `Graph::distances`, 11 % in the Lanczos loop):
//!   * that 80 % was the exact diameter (a BFS from every node, O(n * edges)); the diameter is now exact only when that is cheap (or one BFS for Cayley
//!     graphs, which are vertex-transitive), and otherwise bounded from a few BFS;
//!   * the old Lanczos kept every basis vector and re-orthogonalised twice against all of them,
//!     O(n k^2), and tested convergence by the change of both values between checks. Now it is
//!     the plain three-term recurrence (O(n) memory, O(edges) per step) with the known top
//!     singular pair deflated: for a doubly stochastic P, sigma_1 = 1 with singular vectors
//!     1/sqrt(n), so the largest eigenvalue of P^T P on the complement of 1 is sigma_2^2 and no
//!     second eigenvalue, hence no re-orthogonalisation, is needed (lost orthogonality only
//!     makes copies of the converged top value). Otherwise the top pair is found first (its
//!     Ritz vector from a second, bit-identical pass) and deflated. Convergence is the Ritz
//!     residual beta_k |s_k| < 1e-10, so the value is exact to ~1e-10;
//!   * sparse products run on the graph's CSR rows, parallel over rows with rayon; dot products
//!     add fixed-size chunks in a fixed order so every run (and the second pass) is identical.

use std::time::Instant;

use ndarray::Array2;
use ndarray_linalg::{EigVals, SVD};
use rayon::prelude::*;
use serde::Serialize;

use super::{Cayley, Graph};
use crate::rng::Rng;

/// Up to this many nodes the dense SVD is used by default.
pub const DENSE_LIMIT: usize = 256;

/// The exact diameter (bit-parallel BFS from every node, about nodes/64 * (nodes + edges) *
/// (levels) word operations) is computed when that estimate is at most this (4,096-node random
/// 4-out graph: ~2e7, ~10 ms); above it a few BFS bound it. Cayley graphs need one BFS.
pub const DIAMETER_WORK: usize = 50_000_000;

/// Lanczos stops when its error estimate of the top eigenvalue of P^T P is below this: the Ritz
/// residual r, or r^2 / (distance to the next Ritz value) once r < LANCZOS_RESIDUAL (the usual
/// a-posteriori bound for an isolated eigenvalue). An error e in sigma_2^2 is e / (2 sigma_2) in
/// the gap: <= 1e-6 for sigma_2 >= 0.05, 1.25e-7 at a typical sigma_2 of 0.4 or more (for a tiny
/// sigma_2 the gap is near 1 and the error irrelevant). The estimate
/// is pessimistic: on a 262,144-node random 4-out graph it said 1.2e-7 where the value was
/// within 1.7e-9 of the converged one.
pub const LANCZOS_TOL: f64 = 1e-7;

/// See LANCZOS_TOL.
pub const LANCZOS_RESIDUAL: f64 = 1e-5;

/// Lanczos gives up (and says so in the report) after this many steps.
pub const LANCZOS_MAX_STEPS: usize = 20_000;

/// Everything `asap-train graph gap` reports.
#[derive(Clone, Debug, Serialize)]
pub struct GraphReport {
    pub name: String,
    pub nodes: usize,
    pub edges: usize,
    pub min_in_degree: usize,
    pub max_in_degree: usize,
    pub min_out_degree: usize,
    pub max_out_degree: usize,
    /// Every node has the same in- and out-degree.
    pub regular: bool,
    /// Every node has the same in-degree (equal-weight averaging is unbiased).
    pub regular_in_degree: bool,
    /// P's columns also sum to 1 (the average of the replicas is preserved).
    pub doubly_stochastic: bool,
    pub strongly_connected: bool,
    /// Longest shortest path; None when not strongly connected or not computed exactly
    /// (then `diameter_bounds` holds bounds).
    pub diameter: Option<usize>,
    /// Lower and upper bounds on the diameter when it was too costly to compute exactly.
    pub diameter_bounds: Option<(usize, usize)>,
    pub sigma_1: f64,
    pub sigma_2: f64,
    /// 1 - sigma_2 (0 for a disconnected graph; a weakly connected one, such as the open chain,
    /// has a small positive gap but is still refused for training).
    pub spectral_gap: f64,
    /// Second-largest eigenvalue modulus of P (dense graphs only: None above 1,024 nodes).
    pub slem: Option<f64>,
    /// Rounds t until sigma_2^t < epsilon (None when the gap is 0).
    pub mixing_rounds: Option<u64>,
    pub epsilon: f64,
    /// Model bytes per round over all edges (when --model-bytes is given).
    pub bytes_per_round: Option<u64>,
    /// "dense-svd", "fourier" or "lanczos".
    pub method: String,
    /// Lanczos steps (all passes) and the final Ritz residual; whether it met LANCZOS_TOL.
    pub iterations: Option<usize>,
    pub residual: Option<f64>,
    pub converged: bool,
    pub seconds: f64,
}

impl GraphReport {
    /// The diameter for people: exact, bounded, or infinite.
    pub fn diameter_text(&self) -> String {
        match (self.diameter, self.diameter_bounds) {
            (Some(d), _) => d.to_string(),
            (None, Some((lo, hi))) => format!("{lo}..{hi} (bounds from a few BFS)"),
            (None, None) => "infinite".into(),
        }
    }
}

/// Which singular value method to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Method {
    /// Dense SVD up to 256 nodes, Fourier for generated Cayley graphs, Lanczos otherwise.
    Auto,
    /// Dense SVD through LAPACK (O(n^3)).
    Dense,
    /// Lanczos on P^T P (sparse products, O(edges) per step, O(n) memory).
    Lanczos,
    /// Exact Fourier diagonalisation (generated ring, exponential, root-expander, torus,
    /// hypercube only; other graphs fall back to Lanczos).
    Fourier,
}

fn in_weights(g: &Graph) -> Vec<f64> {
    (0..g.nodes()).map(|i| 1.0 / (g.in_neighbours(i).len() + 1) as f64).collect()
}

/// Dense P.
pub fn p_matrix(g: &Graph) -> Array2<f64> {
    let n = g.nodes();
    let w = in_weights(g);
    let mut p = Array2::<f64>::zeros((n, n));
    for i in 0..n {
        p[[i, i]] = w[i];
        for &j in g.in_neighbours(i) {
            p[[i, j]] = w[i];
        }
    }
    p
}

/// The two largest singular values of P by dense SVD.
pub fn top_two_dense(g: &Graph) -> (f64, f64) {
    let (_, s, _) = p_matrix(g).svd(false, false).expect("LAPACK SVD of a finite matrix");
    (s[0], s.get(1).copied().unwrap_or(0.0))
}

/// Rows per rayon task in sparse products and chunk length of dot products.
const CHUNK: usize = 1 << 12;

/// P as a sparse operator: its own copy of the graph's rows with u32 indices (half the memory
/// traffic of usize; the products are bound by it and by the gathers of x).
pub struct SparseP {
    w: Vec<f64>,
    w2: Vec<f64>,
    in_off: Vec<usize>,
    ins: Vec<u32>,
    out_off: Vec<usize>,
    outs: Vec<u32>,
}

impl SparseP {
    pub fn new(g: &Graph) -> Self {
        let n = g.nodes();
        let csr = |out: bool| {
            let f = |i: usize| if out { g.out_neighbours(i) } else { g.in_neighbours(i) };
            let mut off = Vec::with_capacity(n + 1);
            let mut idx = Vec::with_capacity(g.edges());
            off.push(0);
            for i in 0..n {
                idx.extend(f(i).iter().map(|&j| j as u32));
                off.push(idx.len());
            }
            (off, idx)
        };
        let (in_off, ins) = csr(false);
        let (out_off, outs) = csr(true);
        let w = in_weights(g);
        let w2 = w.iter().map(|x| x * x).collect();
        SparseP { w, w2, in_off, ins, out_off, outs }
    }

    /// y = P x: y_i = (x_i + sum of x over i's in-neighbours) / (1 + in-degree).
    pub fn mul(&self, x: &[f64], y: &mut [f64]) {
        self.mul_scaled(x, y, false);
    }

    /// y_i = w_i (or w_i^2 when `squared`) times (x_i + sum over in-neighbours of x_j).
    fn mul_scaled(&self, x: &[f64], y: &mut [f64], squared: bool) {
        let (w, off, ins) = (if squared { &self.w2 } else { &self.w }, &self.in_off, &self.ins);
        y.par_iter_mut().enumerate().with_min_len(CHUNK).for_each(|(i, yi)| {
            let s = x[i] + ins[off[i]..off[i + 1]].iter().map(|&j| x[j as usize]).sum::<f64>();
            *yi = w[i] * s;
        });
    }

    /// y = P^T P x, using `tmp` (n): tmp = w * (P x), then y_j = tmp_j + sum over out(j) of tmp_i.
    pub fn mul_ptp(&self, x: &[f64], tmp: &mut [f64], y: &mut [f64]) {
        self.mul_scaled(x, tmp, true);
        let (off, outs, tmp) = (&self.out_off, &self.outs, &*tmp);
        y.par_iter_mut().enumerate().with_min_len(CHUNK).for_each(|(j, yj)| {
            *yj = tmp[j] + outs[off[j]..off[j + 1]].iter().map(|&i| tmp[i as usize]).sum::<f64>();
        });
    }
}

/// Dot product, summed in fixed chunks in a fixed order (deterministic under rayon).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let parts: Vec<f64> = a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)).map(|(x, y)| x.iter().zip(y).map(|(p, q)| p * q).sum::<f64>()).collect();
    parts.iter().sum()
}

/// v -= c u.
fn axpy(v: &mut [f64], c: f64, u: &[f64]) {
    v.par_iter_mut().zip(u.par_iter()).with_min_len(CHUNK).for_each(|(a, b)| *a -= c * b);
}

/// Projects `v` onto the orthogonal complement of the orthonormal `deflate` vectors.
fn project(v: &mut [f64], deflate: &[Vec<f64>]) {
    for u in deflate {
        let c = dot(v, u);
        axpy(v, c, u);
    }
}

/// The largest eigenvalue of a symmetric tridiagonal matrix (diagonal `a`, off-diagonal `b`,
/// b.len() == a.len() - 1) by Sturm-sequence bisection, as an upper bracket: no eigenvalue lies
/// above the returned value, and one lies within ~1e-15 relative below it.
fn tridiagonal_top(a: &[f64], b: &[f64]) -> f64 {
    let k = a.len();
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for i in 0..k {
        let r = if i > 0 { b[i - 1].abs() } else { 0.0 } + if i + 1 < k { b[i].abs() } else { 0.0 };
        lo = lo.min(a[i] - r);
        hi = hi.max(a[i] + r);
    }
    let below = |x: f64| sturm_count(a, b, x);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi || hi - lo <= 1e-15 * hi.abs().max(1e-300) {
            break;
        }
        if below(mid) == k {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Number of eigenvalues of the symmetric tridiagonal (diagonal `a`, off-diagonal `b`) below `x`:
/// the negative pivots of T - xI (Sturm sequence).
fn sturm_count(a: &[f64], b: &[f64], x: f64) -> usize {
    let mut count = 0;
    let mut d = 1.0;
    for i in 0..a.len() {
        d = a[i] - x - if i > 0 { b[i - 1] * b[i - 1] / d } else { 0.0 };
        if d == 0.0 {
            d = -f64::MIN_POSITIVE.sqrt();
        }
        if d < 0.0 {
            count += 1;
        }
    }
    count
}

/// The second-largest eigenvalue of the tridiagonal (a, b) whose largest is `top`, by Sturm
/// bisection (the point where the count of eigenvalues below x reaches k - 1).
fn tridiagonal_second(a: &[f64], b: &[f64], top: f64) -> f64 {
    let k = a.len();
    if k < 2 {
        return f64::NEG_INFINITY;
    }
    let below = |x: f64| sturm_count(a, b, x);
    let lo0 = a.iter().zip(b.iter().chain([&0.0])).fold(f64::INFINITY, |m, (x, y)| m.min(x - 2.0 * y.abs())) - 1.0;
    let (mut lo, mut hi) = (lo0, top);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi || hi - lo <= 1e-15 * hi.abs().max(1e-300) {
            break;
        }
        if below(mid) >= k - 1 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The unit eigenvector of the tridiagonal (a, b) for its top eigenvalue `top` (an upper
/// bracket from `tridiagonal_top`), by inverse iteration with (sigma I - T), which is positive
/// definite for sigma above `top`, so the elimination needs no pivoting.
fn tridiagonal_top_vector(a: &[f64], b: &[f64], top: f64) -> Vec<f64> {
    let k = a.len();
    let sigma = top + 1e-12 * top.abs().max(1e-12);
    let mut s = vec![1.0; k];
    for _ in 0..4 {
        // Solve (sigma I - T) x = s by the Thomas algorithm.
        let mut c = vec![0.0; k];
        let mut d = vec![0.0; k];
        for i in 0..k {
            let diag = sigma - a[i] - if i > 0 { -b[i - 1] * c[i - 1] } else { 0.0 };
            let diag = if diag.abs() < f64::MIN_POSITIVE.sqrt() { f64::MIN_POSITIVE.sqrt() } else { diag };
            c[i] = if i + 1 < k { -b[i] / diag } else { 0.0 };
            d[i] = (s[i] - if i > 0 { -b[i - 1] * d[i - 1] } else { 0.0 }) / diag;
        }
        for i in (0..k.saturating_sub(1)).rev() {
            let next = d[i + 1];
            d[i] -= c[i] * next;
        }
        let norm = d.iter().map(|x| x * x).sum::<f64>().sqrt();
        s = d.iter().map(|x| x / norm).collect();
    }
    s
}

/// What one Lanczos run found.
#[derive(Clone, Debug)]
pub struct Ritz {
    /// The top Ritz value (a lower bound on the top eigenvalue, close to it when converged).
    pub value: f64,
    /// beta_k |s_k|: the norm of A v - value v for the Ritz vector v.
    pub residual: f64,
    pub steps: usize,
    pub converged: bool,
    /// The Ritz vector (when asked for).
    pub vector: Option<Vec<f64>>,
}

/// The largest eigenvalue of the symmetric positive semi-definite operator `op` (y = A x) on
/// the orthogonal complement of the orthonormal vectors `deflate`, by the Lanczos three-term
/// recurrence from a seeded random start. With `want_vector` the recurrence is run a second
/// time, identically, to accumulate the Ritz vector without storing the basis.
pub fn lanczos_top(n: usize, op: &mut dyn FnMut(&[f64], &mut [f64]), deflate: &[Vec<f64>], seed: u64, want_vector: bool) -> Ritz {
    let start = || {
        let mut rng = Rng::new(seed);
        let mut q: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
        project(&mut q, deflate);
        project(&mut q, deflate);
        let norm = dot(&q, &q).sqrt();
        (norm > 1e-10 * (n as f64).sqrt()).then(|| q.iter().map(|x| x / norm).collect::<Vec<f64>>())
    };
    let Some(q0) = start() else {
        // The complement is empty (n <= number of deflated vectors).
        return Ritz { value: 0.0, residual: 0.0, steps: 0, converged: true, vector: want_vector.then(|| vec![0.0; n]) };
    };
    // One step: from the unit q, q_prev and beta_prev, computes alpha and beta and leaves the
    // next unit vector in y. Apart from the product, three passes over the vectors: the
    // deflation, alpha = q.y, and one fused pass for y -= alpha q + beta_prev q_prev with the
    // sums q.y and y.y (which give one local re-orthogonalisation against q for free: alpha is
    // corrected by c = q.y and beta^2 = y.y - c^2), then the normalisation.
    let step = |op: &mut dyn FnMut(&[f64], &mut [f64]), q: &[f64], q_prev: &[f64], beta_prev: f64, y: &mut Vec<f64>| -> (f64, f64) {
        op(q, y);
        project(y, deflate);
        let alpha = dot(q, y);
        let sums: Vec<(f64, f64)> = y
            .par_chunks_mut(CHUNK)
            .zip(q.par_chunks(CHUNK))
            .zip(q_prev.par_chunks(CHUNK))
            .map(|((y, q), p)| {
                let (mut qy, mut yy) = (0.0, 0.0);
                for ((yi, qi), pi) in y.iter_mut().zip(q).zip(p) {
                    *yi -= alpha * qi + beta_prev * pi;
                    qy += qi * *yi;
                    yy += *yi * *yi;
                }
                (qy, yy)
            })
            .collect();
        let (c, yy) = sums.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        let beta = (yy - c * c).max(0.0).sqrt();
        if beta > 0.0 {
            y.par_iter_mut().zip(q.par_iter()).with_min_len(CHUNK).for_each(|(yi, qi)| *yi = (*yi - c * qi) / beta);
        }
        (alpha + c, beta)
    };
    let (mut alpha, mut beta) = (Vec::<f64>::new(), Vec::<f64>::new());
    let (mut q, mut q_prev, mut y) = (q0.clone(), vec![0.0; n], vec![0.0; n]);
    let (value, residual, converged) = loop {
        let (a, b) = step(op, &q, &q_prev, beta.last().copied().unwrap_or(0.0), &mut y);
        alpha.push(a);
        let k = alpha.len();
        let breakdown = b <= 1e-12 * alpha.iter().fold(1e-300f64, |m, x| m.max(x.abs()));
        if breakdown || k % 10 == 0 || k >= LANCZOS_MAX_STEPS || k >= 10 * n + 10 {
            let value = tridiagonal_top(&alpha, &beta);
            let s = tridiagonal_top_vector(&alpha, &beta, value);
            let residual = if breakdown { 0.0 } else { b * s[k - 1].abs() };
            let spacing = value - tridiagonal_second(&alpha, &beta, value);
            let error = residual.min(residual * residual / spacing.max(1e-300));
            log::trace!("lanczos step {k}: value {value:.12} residual {residual:.2e} spacing {spacing:.2e} error {error:.2e}");
            let converged = residual <= LANCZOS_TOL || (residual <= LANCZOS_RESIDUAL && error <= LANCZOS_TOL);
            if converged || k >= LANCZOS_MAX_STEPS || k >= 10 * n + 10 {
                break (value, residual, converged);
            }
        }
        beta.push(b);
        std::mem::swap(&mut q_prev, &mut q);
        std::mem::swap(&mut q, &mut y);
    };
    let steps = alpha.len();
    let vector = want_vector.then(|| {
        let s = tridiagonal_top_vector(&alpha, &beta, value);
        let (mut q, mut q_prev) = (q0, vec![0.0; n]);
        let mut v = vec![0.0; n];
        for k in 0..steps {
            axpy(&mut v, -s[k], &q);
            if k + 1 == steps {
                break;
            }
            step(op, &q, &q_prev, if k > 0 { beta[k - 1] } else { 0.0 }, &mut y);
            std::mem::swap(&mut q_prev, &mut q);
            std::mem::swap(&mut q, &mut y);
        }
        project(&mut v, deflate);
        let norm = dot(&v, &v).sqrt();
        v.iter_mut().for_each(|x| *x /= norm);
        v
    });
    Ritz { value, residual, steps: steps * if want_vector { 2 } else { 1 }, converged, vector }
}

/// sigma_1, sigma_2 of P and how Lanczos got them.
#[derive(Clone, Debug)]
pub struct TopTwo {
    pub sigma_1: f64,
    pub sigma_2: f64,
    pub steps: usize,
    pub residual: f64,
    pub converged: bool,
}

/// The two largest singular values of P by Lanczos on P^T P (see the module comment).
pub fn top_two_sparse(g: &Graph, seed: u64) -> TopTwo {
    let n = g.nodes();
    if n == 1 {
        return TopTwo { sigma_1: 1.0, sigma_2: 0.0, steps: 0, residual: 0.0, converged: true };
    }
    let p = SparseP::new(g);
    let mut tmp = vec![0.0; n];
    let mut ptp = |x: &[f64], y: &mut [f64]| p.mul_ptp(x, &mut tmp, y);
    let sq = |v: f64| v.max(0.0).sqrt();
    if doubly_stochastic(g) {
        let one = vec![1.0 / (n as f64).sqrt(); n];
        let r = lanczos_top(n, &mut ptp, &[one], seed, false);
        TopTwo { sigma_1: 1.0, sigma_2: sq(r.value), steps: r.steps, residual: r.residual, converged: r.converged }
    } else {
        let r1 = lanczos_top(n, &mut ptp, &[], seed, true);
        let v1 = r1.vector.clone().expect("asked for the Ritz vector");
        let r2 = lanczos_top(n, &mut ptp, &[v1], seed.wrapping_add(1), false);
        TopTwo {
            sigma_1: sq(r1.value),
            sigma_2: sq(r2.value),
            steps: r1.steps + r2.steps,
            residual: r1.residual.max(r2.residual),
            converged: r1.converged && r2.converged,
        }
    }
}

/// The two largest singular values of P by Lanczos.
pub fn top_two_lanczos(g: &Graph, seed: u64) -> (f64, f64) {
    let t = top_two_sparse(g, seed);
    (t.sigma_1, t.sigma_2)
}

/// Phase (in turns, [0, 1)) of the character `t` (digits) at the shift `s` (sparse digits).
fn turns(moduli: &[usize], t: &[usize], s: &[(usize, usize)]) -> f64 {
    let x: f64 = s.iter().map(|&(l, v)| ((t[l] as u128 * v as u128) % moduli[l] as u128) as f64 / moduli[l] as f64).sum();
    x - x.floor()
}

/// The two largest singular values of P for a Cayley graph of an abelian group: P is normal with
/// eigenvalues (1 + sum_s e^{2 pi i <t, s>}) / (d + 1) over the characters t, so its singular
/// values are their moduli; t = 0 gives sigma_1 = 1. O(nodes * degree), exact.
pub fn top_two_fourier(c: &Cayley) -> (f64, f64) {
    let n: usize = c.moduli.iter().product();
    let d = c.shifts.len() as f64;
    let shifts = c.sparse_shifts();
    let s2 = (1..n)
        .into_par_iter()
        .with_min_len(CHUNK)
        .map(|i| {
            let t = c.digits(i);
            let (mut re, mut im) = (1.0f64, 0.0f64);
            for s in &shifts {
                let (sin, cos) = (2.0 * std::f64::consts::PI * turns(&c.moduli, &t, s)).sin_cos();
                re += cos;
                im += sin;
            }
            re.hypot(im) / (d + 1.0)
        })
        .reduce(|| 0.0, f64::max);
    (1.0, s2)
}

/// sigma_2 of the product of one period of the one-peer exponential graph on n nodes (round k:
/// i sends to i + 2^k, and averages itself with its one in-neighbour, for k < ceil(log2 n)). Every
/// round is circulant, so the product's singular values are prod_k |cos(pi t 2^k / n)|; for n a
/// power of two the product is the exact average (sigma_2 = 0).
pub fn one_peer_period_sigma_2(n: usize) -> f64 {
    let tau = one_peer_period(n);
    (1..n)
        .into_par_iter()
        .with_min_len(CHUNK)
        .map(|t| {
            (0..tau)
                .map(|k| {
                    let f = ((t as u128 * (1u128 << k)) % n as u128) as f64 / n as f64;
                    (std::f64::consts::PI * f).cos().abs()
                })
                .product::<f64>()
        })
        .reduce(|| 0.0, f64::max)
}

/// Rounds in one period of the one-peer exponential graph: ceil(log2 n) (at least 1).
pub fn one_peer_period(n: usize) -> usize {
    (n.max(2) - 1).ilog2() as usize + 1
}

/// sigma_2 of P alone, by the cheapest exact method (Fourier for Cayley graphs, dense SVD up to
/// DENSE_LIMIT nodes, else Lanczos): what `graph search` ranks its candidates by.
pub fn sigma_2(g: &Graph) -> f64 {
    match g.cayley() {
        Some(c) => top_two_fourier(c).1,
        None if g.nodes() <= DENSE_LIMIT => top_two_dense(g).1,
        None => top_two_sparse(g, 1).sigma_2,
    }
}

/// The report of `graph gap` for the time-varying one-peer exponential graph on n nodes: the
/// spectral values are those of the product over one period (tau = ceil(log2 n) rounds), edges
/// and degrees those of one round, the diameter the rounds until every rank has heard from
/// every other (tau), and the mixing rounds tau times the periods needed.
pub fn one_peer_report(n: usize, epsilon: f64) -> GraphReport {
    let t0 = Instant::now();
    let tau = one_peer_period(n);
    let s2 = if n == 1 { 0.0 } else { one_peer_period_sigma_2(n) };
    let deg = usize::from(n > 1);
    GraphReport {
        name: format!("{} (period {tau} rounds; values for the product over one period)", super::ONE_PEER_EXPONENTIAL),
        nodes: n,
        edges: n * deg,
        min_in_degree: deg,
        max_in_degree: deg,
        min_out_degree: deg,
        max_out_degree: deg,
        regular: true,
        regular_in_degree: true,
        doubly_stochastic: true,
        strongly_connected: true,
        diameter: Some(if n > 1 { tau } else { 0 }),
        diameter_bounds: None,
        sigma_1: 1.0,
        sigma_2: s2,
        spectral_gap: 1.0 - s2,
        slem: None,
        mixing_rounds: mixing_rounds(s2, epsilon).map(|p| p * tau as u64),
        epsilon,
        bytes_per_round: None,
        method: "fourier".into(),
        iterations: None,
        residual: None,
        converged: true,
        seconds: t0.elapsed().as_secs_f64(),
    }
}

/// P's columns also sum to 1.
fn doubly_stochastic(g: &Graph) -> bool {
    let w = in_weights(g);
    (0..g.nodes()).into_par_iter().all(|j| (w[j] + g.out_neighbours(j).iter().map(|&i| w[i]).sum::<f64>() - 1.0).abs() < 1e-9)
}

/// Analyses `g` (with `model_bytes` > 0 also the bytes per round).
pub fn analyse(g: &Graph, model_bytes: u64) -> GraphReport {
    analyse_with(g, model_bytes, Method::Auto, 1e-3)
}

/// Rounds until sigma_2^t < epsilon.
pub fn mixing_rounds(sigma_2: f64, epsilon: f64) -> Option<u64> {
    let gap = 1.0 - sigma_2;
    if gap <= 0.0 {
        None
    } else if sigma_2 <= 0.0 {
        Some(1)
    } else {
        Some((epsilon.ln() / sigma_2.ln()).ceil().max(1.0) as u64)
    }
}

/// Strong connectivity and the diameter (exact, or bounds from a few BFS).
fn connectivity(g: &Graph) -> (bool, Option<usize>, Option<(usize, usize)>) {
    let n = g.nodes();
    let (from0, to0) = (g.distances(0, true), g.distances(0, false));
    let (ecc_out0, ecc_in0) = (*from0.iter().max().unwrap(), *to0.iter().max().unwrap());
    if ecc_out0 == usize::MAX || ecc_in0 == usize::MAX {
        return (false, None, None);
    }
    if g.cayley().is_some() {
        // Vertex-transitive: every node has the same eccentricity.
        return (true, Some(ecc_out0), None);
    }
    if n.div_ceil(64).saturating_mul(n + g.edges()).saturating_mul(ecc_out0 + ecc_in0 + 1) <= DIAMETER_WORK {
        return (true, Some(diameter_bit_parallel(g)), None);
    }
    // Lower bound: the largest eccentricity seen, from 0 and from the node farthest from 0
    // (a double sweep). Upper bound: d(a, b) <= d(a, v) + d(v, b) <= ecc_in(v) + ecc_out(v).
    let far = (0..n).max_by_key(|&i| from0[i]).unwrap_or(0);
    let (ecc_out_far, ecc_in_far) = rayon::join(|| g.eccentricity(far, true), || g.eccentricity(far, false));
    let lo = ecc_out0.max(ecc_in0).max(ecc_out_far).max(ecc_in_far);
    let hi = (ecc_out0 + ecc_in0).min(ecc_out_far + ecc_in_far);
    if lo == hi {
        (true, Some(lo), None)
    } else {
        (true, None, Some((lo, hi)))
    }
}

/// The exact diameter of a strongly connected graph by BFS from every node, 64 sources at a
/// time: bit s of seen[v] says source s has reached v, and each level is one pass over the
/// in-edges with 64-bit ORs. The old BFS per node took 80 % of `graph gap` at 16,384 nodes.
fn diameter_bit_parallel(g: &Graph) -> usize {
    let n = g.nodes();
    (0..n.div_ceil(64))
        .into_par_iter()
        .map(|batch| {
            let (mut seen, mut front, mut next) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
            for k in 0..64 {
                let s = batch * 64 + k;
                if s < n {
                    seen[s] |= 1 << k;
                    front[s] |= 1 << k;
                }
            }
            let mut level = 0;
            loop {
                let mut any = 0u64;
                for v in 0..n {
                    let reach = g.in_neighbours(v).iter().fold(0u64, |acc, &u| acc | front[u]) & !seen[v];
                    next[v] = reach;
                    seen[v] |= reach;
                    any |= reach;
                }
                if any == 0 {
                    break level;
                }
                level += 1;
                std::mem::swap(&mut front, &mut next);
            }
        })
        .max()
        .unwrap_or(0)
}

/// Analyses `g` with a chosen method and mixing tolerance.
pub fn analyse_with(g: &Graph, model_bytes: u64, method: Method, epsilon: f64) -> GraphReport {
    let t0 = Instant::now();
    let n = g.nodes();
    let indeg: Vec<usize> = (0..n).map(|i| g.in_neighbours(i).len()).collect();
    let outdeg: Vec<usize> = (0..n).map(|i| g.out_neighbours(i).len()).collect();
    let (min_in, max_in) = (*indeg.iter().min().unwrap(), *indeg.iter().max().unwrap());
    let (min_out, max_out) = (*outdeg.iter().min().unwrap(), *outdeg.iter().max().unwrap());
    let doubly = doubly_stochastic(g);
    let (sc, diameter, diameter_bounds) = connectivity(g);
    let chosen = match (method, g.cayley()) {
        (Method::Dense, _) => "dense-svd",
        (Method::Auto, _) if n <= DENSE_LIMIT => "dense-svd",
        (Method::Auto | Method::Fourier, Some(_)) => "fourier",
        _ => "lanczos",
    };
    let (mut iterations, mut residual, mut converged) = (None, None, true);
    let (s1, s2) = match chosen {
        "dense-svd" => top_two_dense(g),
        "fourier" => top_two_fourier(g.cayley().expect("checked above")),
        _ => {
            let t = top_two_sparse(g, 1);
            (iterations, residual, converged) = (Some(t.steps), Some(t.residual), t.converged);
            if !t.converged {
                log::warn!(
                    "Lanczos stopped after {} steps with residual {:.1e} (> {LANCZOS_TOL:.0e}): sigma_2 {:.8} is a lower bound",
                    t.steps, t.residual, t.sigma_2
                );
            }
            (t.sigma_1, t.sigma_2)
        }
    };
    let gap = (1.0 - s2).max(0.0);
    let slem = (n <= 1024).then(|| {
        let mut m: Vec<f64> = p_matrix(g).eigvals().expect("LAPACK eigenvalues").iter().map(|c| c.norm()).collect();
        m.sort_by(|a, b| b.total_cmp(a));
        m.get(1).copied().unwrap_or(0.0)
    });
    GraphReport {
        name: g.name.clone(),
        nodes: n,
        edges: g.edges(),
        min_in_degree: min_in,
        max_in_degree: max_in,
        min_out_degree: min_out,
        max_out_degree: max_out,
        regular: min_in == max_in && min_out == max_out && min_in == min_out,
        regular_in_degree: min_in == max_in,
        doubly_stochastic: doubly,
        strongly_connected: sc,
        diameter,
        diameter_bounds,
        sigma_1: s1,
        sigma_2: s2,
        spectral_gap: gap,
        slem,
        mixing_rounds: mixing_rounds(s2, epsilon),
        epsilon,
        bytes_per_round: (model_bytes > 0).then(|| model_bytes * g.edges() as u64),
        method: chosen.into(),
        iterations,
        residual,
        converged,
        seconds: t0.elapsed().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{generate, Graph};
    use super::*;

    fn gap(kind: &str, n: usize) -> f64 {
        analyse(&generate(kind, n, 1).unwrap(), 0).spectral_gap
    }

    #[test]
    fn closed_forms() {
        assert!((gap("complete", 25) - 1.0).abs() < 1e-9);
        for n in [5, 25, 40] {
            let want = 1.0 - (std::f64::consts::PI / n as f64).cos();
            assert!((gap("ring", n) - want).abs() < 1e-9, "ring {n}");
        }
        assert!((gap("ring", 25) - 0.00788).abs() < 1e-5, "the value SPEC.md quotes, to its 3 digits");
        // The open chain i -> i+1 of ASAP Fig. 2(d); SPEC.md quotes ~0.002 at 25 nodes.
        let chain = gap("chain", 25);
        assert!((0.0019..0.0023).contains(&chain), "chain 25: {chain}");
        assert!(!generate("chain", 25, 1).unwrap().strongly_connected());
        // Hypercube on 2^k nodes: P = (I + sum of k commuting flips)/(k+1); its singular values are
        // |k+1-2m|/(k+1), so sigma_2 = (k-1)/(k+1) and the gap is 2/(k+1).
        for k in 1..=6 {
            assert!((gap("hypercube", 1 << k) - 2.0 / (k as f64 + 1.0)).abs() < 1e-9, "hypercube 2^{k}");
        }
        let disconnected = Graph::from_edges(4, [(0, 1), (1, 0), (2, 3), (3, 2)], "two pairs");
        let r = analyse(&disconnected, 0);
        assert!(!r.strongly_connected && r.spectral_gap == 0.0 && r.diameter.is_none());
    }

    #[test]
    fn dense_and_lanczos_agree_on_random_graphs() {
        let mut rng = Rng::new(4);
        for &n in &[2usize, 3, 7, 16, 33, 64, 128, 256, 512] {
            for d in [1usize, 2, 3] {
                if d >= n {
                    continue;
                }
                let g = super::super::random_regular(n, d, rng.next_u64()).unwrap();
                let (a1, a2) = top_two_dense(&g);
                let (b1, b2) = top_two_lanczos(&g, 7);
                assert!((a1 - b1).abs() < 1e-6 && (a2 - b2).abs() < 1e-6, "n {n} d {d}: dense {a1} {a2} lanczos {b1} {b2}");
            }
            // Irregular graphs too: random out-edges.
            let edges: Vec<(usize, usize)> = (0..n).flat_map(|i| [(i, (i + 1) % n), (i, rng.below(n))]).collect();
            let g = Graph::from_edges(n, edges, "irregular");
            let (a1, a2) = top_two_dense(&g);
            let (b1, b2) = top_two_lanczos(&g, 3);
            assert!((a1 - b1).abs() < 1e-6 && (a2 - b2).abs() < 1e-6, "irregular n {n}: {a1} {a2} vs {b1} {b2}");
        }
    }

    #[test]
    fn fourier_matches_dense_on_every_cayley_family() {
        for n in [1usize, 2, 3, 4, 5, 8, 12, 16, 25, 30, 64, 100, 128, 200, 256] {
            for kind in ["ring", "exponential", "root-expander", "torus", "hypercube"] {
                let Ok(g) = generate(kind, n, 1) else { continue };
                let (a1, a2) = top_two_dense(&g);
                let (f1, f2) = top_two_fourier(g.cayley().unwrap());
                assert!((a1 - f1).abs() < 1e-9 && (a2 - f2).abs() < 1e-9, "{kind} {n}: dense {a1} {a2} fourier {f1} {f2}");
            }
        }
    }

    #[test]
    fn closed_forms_at_scale_with_every_sparse_method() {
        let pi = std::f64::consts::PI;
        // Ring: sigma_2 = cos(pi / n), by Fourier at a million nodes and by Lanczos at 400.
        let n = 1 << 20;
        let r = analyse(&generate("ring", n, 1).unwrap(), 0);
        assert_eq!(r.method, "fourier");
        assert!((r.sigma_2 - (pi / n as f64).cos()).abs() < 1e-12 && r.diameter == Some(n - 1));
        let g = generate("ring", 400, 1).unwrap();
        let t = top_two_sparse(&g, 2);
        assert!(t.converged && (t.sigma_2 - (pi / 400.0).cos()).abs() < 1e-6, "ring 400 lanczos {:?}", t);
        // Hypercube 2^k: gap 2 / (k + 1), by Lanczos at 4,096 nodes and Fourier at 2^16.
        let t = top_two_sparse(&generate("hypercube", 1 << 12, 1).unwrap(), 1);
        assert!((1.0 - t.sigma_2 - 2.0 / 13.0).abs() < 1e-6, "{t:?}");
        let r = analyse(&generate("hypercube", 1 << 16, 1).unwrap(), 0);
        assert!((r.spectral_gap - 2.0 / 17.0).abs() < 1e-12 && r.diameter == Some(16));
        // Complete graph: gap 1 (Lanczos breaks down at once: P^T P = J / n).
        let t = top_two_sparse(&generate("complete", 300, 1).unwrap(), 1);
        assert!(t.converged && t.sigma_2.abs() < 1e-6 && (t.sigma_1 - 1.0).abs() < 1e-12, "{t:?}");
    }

    #[test]
    fn bit_parallel_diameter_matches_one_bfs_per_node() {
        let mut rng = Rng::new(11);
        for &n in &[2usize, 5, 63, 64, 65, 200, 700] {
            let edges: Vec<(usize, usize)> = (0..n).flat_map(|i| [(i, (i + 1) % n), (i, rng.below(n))]).collect();
            let g = Graph::from_edges(n, edges, "irregular");
            let slow = (0..n).map(|s| g.eccentricity(s, true)).max().unwrap();
            assert_eq!(diameter_bit_parallel(&g), slow, "n {n}");
        }
        // Above DIAMETER_WORK the bounds bracket the truth.
        let g = super::super::random_regular(30_000, 3, 5).unwrap();
        let (sc, d, b) = connectivity(&g);
        let (lo, hi) = b.unwrap_or_else(|| (d.unwrap(), d.unwrap()));
        assert!(sc && lo <= hi && lo >= 8 && hi <= 2 * lo + 2, "{lo}..{hi}");
    }

    #[test]
    fn lanczos_residual_controls_the_error_of_large_random_graphs() {
        // Against a run to a 100x tighter residual: the default stop is within 1e-7 in the gap.
        let g = super::super::random_regular(20_000, 4, 9).unwrap();
        let t = top_two_sparse(&g, 1);
        assert!(t.converged);
        let p = SparseP::new(&g);
        let mut tmp = vec![0.0; g.nodes()];
        let mut op = |x: &[f64], y: &mut [f64]| p.mul_ptp(x, &mut tmp, y);
        let one = vec![1.0 / (g.nodes() as f64).sqrt(); g.nodes()];
        // Many more steps from another start: the values agree.
        let r = lanczos_top(g.nodes(), &mut op, &[one], 99, false);
        assert!((r.value.sqrt() - t.sigma_2).abs() < 1e-7, "{} vs {}", r.value.sqrt(), t.sigma_2);
    }

    #[test]
    fn degrees_and_stochasticity() {
        let r = analyse(&generate("star", 6, 1).unwrap(), 100);
        assert!(!r.regular_in_degree && !r.doubly_stochastic && r.strongly_connected);
        assert_eq!((r.max_in_degree, r.min_in_degree, r.edges, r.bytes_per_round), (5, 1, 10, Some(1000)));
        let e = analyse(&generate("root-expander", 25, 1).unwrap(), 0);
        assert!(e.regular && e.doubly_stochastic && e.diameter.is_some());
        assert_eq!(e.mixing_rounds, Some((1e-3f64.ln() / e.sigma_2.ln()).ceil() as u64));
    }
}
