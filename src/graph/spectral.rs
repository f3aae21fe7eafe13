//! Spectral analysis of a communication graph (ASAP Appendix A). With A the adjacency matrix
//! plus self-loops (A_ij = 1 if j sends to i, A_ii = 1) and P = diag(d_in)^-1 A (d_in counting
//! the self-loop), the spectral gap is 1 - sigma_2(P).
//!
//! The methods, chosen by `Method::Auto`:
//! - dense SVD (LAPACK) up to 256 nodes;
//! - Fourier, for the generated Cayley graphs of abelian groups (ring, exponential, root
//!   expander, torus, hypercube): P is then a group convolution, normal, and diagonalised by the
//!   group's characters, so its singular values are the moduli |(1 + sum_s chi(s)) / (d + 1)|,
//!   computed exactly in O(nodes * degree). This is the only way to resolve a ring's gap at a
//!   million nodes (pi^2 / 2n^2 = 4.7e-12): a Krylov method needs on the order of n iterations;
//! - bidiagonal, for the one-way chain (P^T P tridiagonal, Sturm bisection), and a closed form
//!   for the complete graph (`complete_report`, never built above 256 nodes);
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
//!     Ritz vector from a second, bit-identical pass) and deflated. Convergence: see LANCZOS_TOL;
//!   * the step count is the spectrum's, not the code's: a random 4-out graph's top singular
//!     values crowd together (at 1,048,576 nodes the top two Ritz values of P^T P are 1.2e-5
//!     apart, and at step 300 Lanczos still sat on the second one, 1.1e-5 too low), so ~650
//!     steps are needed there and the cost per step is what can be cut. `perf record` at a
//!     million nodes (graph file, 12.9 s in benches/graph-scale.md): 74 % in the two sparse
//!     products, 20-30 % in the vector passes, 5-10 % in parsing the file. Hence: products over
//!     rows of a fixed degree unrolled at compile time (`gather`: 2-3x faster per product),
//!     two vector passes per step instead of five with sums in independent lanes (the single
//!     accumulators were add-latency bound), the ones vector kept implicit, and a parser without
//!     a hash set. After: 5-7 s for the same file on the same shared machine;
//!   * sparse products and dot products run in fixed-size chunks in parallel with rayon and
//!     add the chunks in a fixed order, so every run (and the second pass) is identical.

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
    /// Second-largest eigenvalue modulus of P (Cayley graphs at any size, others up to 256
    /// nodes; None above).
    pub slem: Option<f64>,
    /// Rounds t until sigma_2^t < epsilon (None when the gap is 0).
    pub mixing_rounds: Option<u64>,
    pub epsilon: f64,
    /// Model bytes per round over all edges (when --model-bytes is given).
    pub bytes_per_round: Option<u64>,
    /// "dense-svd", "fourier", "bidiagonal", "lanczos" or "closed-form" (complete graph).
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

/// The rows of one side of the graph (in- or out-neighbours) with u32 indices, half the memory
/// traffic of usize: the products are bound by it and by the gathers of x.
enum Rows {
    /// Every row has `degree` entries: no offsets, and a kernel unrolled for the degree.
    Regular {
        degree: usize,
        idx: Vec<u32>,
    },
    Irregular {
        off: Vec<usize>,
        idx: Vec<u32>,
    },
}

impl Rows {
    fn new(g: &Graph, out: bool) -> Self {
        let n = g.nodes();
        let row = |i: usize| if out { g.out_neighbours(i) } else { g.in_neighbours(i) };
        let mut idx = Vec::with_capacity(g.edges());
        let degree = row(0).len();
        let regular = (0..n).all(|i| row(i).len() == degree);
        let mut off = Vec::with_capacity(if regular { 0 } else { n + 1 });
        off.push(0);
        for i in 0..n {
            idx.extend(row(i).iter().map(|&j| j as u32));
            if !regular {
                off.push(idx.len());
            }
        }
        if regular {
            Rows::Regular { degree, idx }
        } else {
            Rows::Irregular { off, idx }
        }
    }
}

/// The factor of row i in a product: one constant (regular in-degree) or one per row.
enum Scale<'a> {
    Const(f64),
    Rows(&'a [f64]),
}

impl Scale<'_> {
    #[inline(always)]
    fn at(&self, i: usize) -> f64 {
        match self {
            Scale::Const(c) => *c,
            Scale::Rows(w) => w[i],
        }
    }
}

/// y_i = scale_i (x_i + sum over row i of x_j), parallel over blocks of CHUNK rows.
///
/// Measured on a 1,048,576-node random 4-out graph (one product, 5.2 M gathers, 1 thread, from
/// an example run alternating the variants): a per-row closure over `off[i]..off[i+1]` with an
/// iterator sum took 12.9-14.9 ms; the same over blocks of rows with `chunks_exact(4)` 6.5 ms;
/// rows of a compile-time degree (no offsets, the gathers unrolled) 4.2-4.3 ms. So regular rows
/// of degree 1..=16 get a kernel generated for their degree, the others the blocked loop.
fn gather(rows: &Rows, x: &[f64], scale: Scale, y: &mut [f64]) {
    fn fixed<const D: usize>(idx: &[u32], x: &[f64], scale: &Scale, y: &mut [f64]) {
        y.par_chunks_mut(CHUNK).zip(idx.par_chunks(CHUNK * D)).enumerate().for_each(|(c, (yc, ic))| {
            let base = c * CHUNK;
            for (k, (yi, nb)) in yc.iter_mut().zip(ic.chunks_exact(D)).enumerate() {
                let nb: &[u32; D] = nb.try_into().expect("chunks_exact(D)");
                let mut s = 0.0;
                for &j in nb {
                    s += x[j as usize];
                }
                *yi = scale.at(base + k) * (x[base + k] + s);
            }
        });
    }
    match rows {
        Rows::Regular { degree, idx } => {
            macro_rules! by_degree {
                ($($d:literal)*) => {
                    match degree {
                        0 => y.par_iter_mut().enumerate().with_min_len(CHUNK).for_each(|(i, yi)| *yi = scale.at(i) * x[i]),
                        $($d => fixed::<$d>(idx, x, &scale, y),)*
                        &d => y.par_chunks_mut(CHUNK).zip(idx.par_chunks(CHUNK * d)).enumerate().for_each(|(c, (yc, ic))| {
                            for (k, (yi, nb)) in yc.iter_mut().zip(ic.chunks_exact(d)).enumerate() {
                                let i = c * CHUNK + k;
                                *yi = scale.at(i) * (x[i] + nb.iter().map(|&j| x[j as usize]).sum::<f64>());
                            }
                        }),
                    }
                };
            }
            by_degree!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
        }
        Rows::Irregular { off, idx } => y.par_chunks_mut(CHUNK).enumerate().for_each(|(c, yc)| {
            for (k, yi) in yc.iter_mut().enumerate() {
                let i = c * CHUNK + k;
                let row = &idx[off[i]..off[i + 1]];
                let mut quads = row.chunks_exact(4);
                let (mut a, mut b) = (0.0, 0.0);
                for q in &mut quads {
                    a += x[q[0] as usize] + x[q[1] as usize];
                    b += x[q[2] as usize] + x[q[3] as usize];
                }
                for &j in quads.remainder() {
                    a += x[j as usize];
                }
                *yi = scale.at(i) * (x[i] + (a + b));
            }
        }),
    }
}

/// P as a sparse operator over its own copy of the graph's rows (see [`gather`]).
pub struct SparseP {
    /// 1 / (1 + in-degree) per node, or None when every in-degree is the same (`w_const`).
    w: Option<Vec<f64>>,
    w2: Option<Vec<f64>>,
    w_const: f64,
    ins: Rows,
    outs: Rows,
}

impl SparseP {
    pub fn new(g: &Graph) -> Self {
        let ins = Rows::new(g, false);
        let outs = Rows::new(g, true);
        let (w, w2, w_const) = match ins {
            Rows::Regular { degree, .. } => (None, None, 1.0 / (degree + 1) as f64),
            Rows::Irregular { .. } => {
                let w = in_weights(g);
                let w2 = w.iter().map(|x| x * x).collect();
                (Some(w), Some(w2), 0.0)
            }
        };
        SparseP { w, w2, w_const, ins, outs }
    }

    /// y = P x: y_i = (x_i + sum of x over i's in-neighbours) / (1 + in-degree).
    pub fn mul(&self, x: &[f64], y: &mut [f64]) {
        let scale = match &self.w {
            Some(w) => Scale::Rows(w),
            None => Scale::Const(self.w_const),
        };
        gather(&self.ins, x, scale, y);
    }

    /// y = P^T P x, using `tmp` (n): tmp = w * (P x), then y_j = tmp_j + sum over out(j) of tmp_i.
    pub fn mul_ptp(&self, x: &[f64], tmp: &mut [f64], y: &mut [f64]) {
        let scale = match &self.w2 {
            Some(w2) => Scale::Rows(w2),
            None => Scale::Const(self.w_const * self.w_const),
        };
        gather(&self.ins, x, scale, tmp);
        gather(&self.outs, tmp, Scale::Const(1.0), y);
    }
}

/// Dot product, summed in fixed chunks in a fixed order (deterministic under rayon).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let parts: Vec<f64> = a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)).map(|(x, y)| dot_serial(x, y)).collect();
    parts.iter().sum()
}

/// Lanes of independent partial sums: a single f64 accumulator is a chain of dependent adds
/// (~4 cycles each), which made the dot products of Lanczos latency-bound (three passes of 1M
/// elements took ~3 ms, as long as the sparse product).
const LANES: usize = 4;

/// a.b over slices of equal length, in LANES partial sums (deterministic).
fn dot_serial(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f64>() + ra.iter().zip(rb).map(|(x, y)| x * y).sum::<f64>()
}

/// The sum of `x` in LANES partial sums (deterministic).
fn sum_serial(x: &[f64]) -> f64 {
    let mut acc = [0.0; LANES];
    let c = x.chunks_exact(LANES);
    let r = c.remainder();
    for v in c {
        for l in 0..LANES {
            acc[l] += v[l];
        }
    }
    acc.iter().sum::<f64>() + r.iter().sum::<f64>()
}

/// [y.y, q.y, p.y, q.q, p.p, q.p, sum y, sum q, sum p] in one pass, LANES partial sums each.
fn sums9(y: &[f64], q: &[f64], p: &[f64]) -> [f64; 9] {
    let mut acc = [[0.0; LANES]; 9];
    let one = |acc: &mut [[f64; LANES]; 9], l: usize, y: f64, q: f64, p: f64| {
        for (k, v) in [y * y, q * y, p * y, q * q, p * p, q * p, y, q, p].into_iter().enumerate() {
            acc[k][l] += v;
        }
    };
    let whole = y.len() / LANES * LANES;
    for i in (0..whole).step_by(LANES) {
        for l in 0..LANES {
            one(&mut acc, l, y[i + l], q[i + l], p[i + l]);
        }
    }
    for i in whole..y.len() {
        one(&mut acc, 0, y[i], q[i], p[i]);
    }
    acc.map(|a| a.iter().sum())
}

/// v -= c u.
fn axpy(v: &mut [f64], c: f64, u: &[f64]) {
    v.par_iter_mut().zip(u.par_iter()).with_min_len(CHUNK).for_each(|(a, b)| *a -= c * b);
}

/// A unit vector Lanczos works orthogonally to.
pub enum Unit {
    /// 1 / sqrt(n) everywhere (sigma_1's singular vector of a doubly stochastic P), kept
    /// implicit: its dot with y is a sum of y, and it costs no memory traffic.
    Ones,
    Vector(Vec<f64>),
}

impl Unit {
    /// Entries start..start + len of the unit vector in R^n.
    fn part(&self, n: usize, start: usize, len: usize) -> UnitPart<'_> {
        match self {
            Unit::Ones => UnitPart::Const(1.0 / (n as f64).sqrt()),
            Unit::Vector(v) => UnitPart::Slice(&v[start..start + len]),
        }
    }
}

enum UnitPart<'a> {
    Const(f64),
    Slice(&'a [f64]),
}

impl UnitPart<'_> {
    /// The dot product with `x`.
    fn dot(&self, x: &[f64]) -> f64 {
        match self {
            UnitPart::Const(c) => c * sum_serial(x),
            UnitPart::Slice(u) => dot_serial(u, x),
        }
    }
    /// x -= c u.
    fn sub_from(&self, c: f64, x: &mut [f64]) {
        match self {
            UnitPart::Const(u) => x.iter_mut().for_each(|v| *v -= c * u),
            UnitPart::Slice(u) => x.iter_mut().zip(*u).for_each(|(v, ui)| *v -= c * ui),
        }
    }
}

/// Projects `v` onto the orthogonal complement of the orthonormal `deflate` vectors.
fn project(v: &mut [f64], deflate: &[Unit]) {
    let n = v.len();
    for u in deflate {
        let parts: Vec<f64> = v.par_chunks(CHUNK).enumerate().map(|(c, x)| u.part(n, c * CHUNK, x.len()).dot(x)).collect();
        let coef: f64 = parts.iter().sum();
        v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, x)| u.part(n, c * CHUNK, x.len()).sub_from(coef, x));
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

/// One step of the Lanczos recurrence on the orthogonal complement of `deflate`: from the unit
/// q, q_prev (= p) and beta_prev, computes alpha and beta and leaves the next unit vector in
/// y = A q. Lanczos without the product is two passes over the vectors (it was five, ~0.6 ms
/// each at a million nodes, 30 % of `graph gap`, against ~5 ms for the product):
/// 1. every dot product of y, q, p and the deflated u_k ([`LanczosStep::dots`]). With
///    c_k = u_k.y, alpha = q.(y - sum c_k u_k) and z = y - sum c_k u_k - alpha q - beta_prev p,
///    the local re-orthogonalisation c = q.z (alpha + c is the exact alpha for a q that is not
///    quite unit or orthogonal to p) and beta^2 = z.z - c^2 follow from those dots;
/// 2. y = (z - c q) / beta.
///
/// z.z comes from a difference of dots: when that cancels (z.z below 1e-4 of y.y, so fewer than
/// ~12 correct digits, near a breakdown) z is formed and measured explicitly instead
/// ([`LanczosStep::explicit`]).
struct LanczosStep<'a> {
    n: usize,
    deflate: &'a [Unit],
}

impl LanczosStep<'_> {
    /// One step: (alpha, beta), and the next unit vector in `y`.
    fn run(&self, op: &mut dyn FnMut(&[f64], &mut [f64]), q: &[f64], q_prev: &[f64], beta_prev: f64, y: &mut [f64]) -> (f64, f64) {
        let (n, m, deflate) = (self.n, self.deflate.len(), self.deflate);
        op(q, y);
        let d = self.dots(y, q, q_prev);
        let (yy, qy, py, qq, pp, qp) = (d[0], d[1], d[2], d[3], d[4], d[5]);
        let (uy, uq, up) = (&d[6..6 + m], &d[6 + m..6 + 2 * m], &d[6 + 2 * m..]);
        let b = beta_prev;
        let alpha = qy - (0..m).map(|k| uy[k] * uq[k]).sum::<f64>();
        // z.z with z = y - sum c_k u_k - alpha q - b p, c_k = uy[k], the u_k orthonormal.
        let sum = |f: &dyn Fn(usize) -> f64| (0..m).map(f).sum::<f64>();
        let zz = yy + sum(&|k| uy[k] * uy[k]) + alpha * alpha * qq + b * b * pp
            - 2.0 * sum(&|k| uy[k] * uy[k])
            - 2.0 * alpha * qy
            - 2.0 * b * py
            + 2.0 * alpha * sum(&|k| uy[k] * uq[k])
            + 2.0 * b * sum(&|k| uy[k] * up[k])
            + 2.0 * alpha * b * qp;
        let c = qy - sum(&|k| uy[k] * uq[k]) - alpha * qq - b * qp;
        let beta2 = zz - c * c;
        if beta2 > 1e-4 * yy {
            let beta = beta2.sqrt();
            let (a_q, inv) = (alpha + c, 1.0 / beta);
            y.par_chunks_mut(CHUNK).zip(q.par_chunks(CHUNK)).zip(q_prev.par_chunks(CHUNK)).enumerate().for_each(|(ch, ((y, q), p))| {
                for (k, u) in deflate.iter().enumerate() {
                    u.part(n, ch * CHUNK, y.len()).sub_from(uy[k], y);
                }
                for ((yi, qi), pi) in y.iter_mut().zip(q).zip(p) {
                    *yi = (*yi - a_q * qi - b * pi) * inv;
                }
            });
            return (alpha + c, beta);
        }
        self.explicit(y, q, q_prev, uy, alpha, b)
    }

    /// `[yy, qy, py, qq, pp, qp, u_k.y.., u_k.q.., u_k.p..]`, per chunk, summed in chunk order.
    fn dots(&self, y: &[f64], q: &[f64], q_prev: &[f64]) -> Vec<f64> {
        let (n, m, deflate) = (self.n, self.deflate.len(), self.deflate);
        let parts: Vec<Vec<f64>> = y
            .par_chunks(CHUNK)
            .zip(q.par_chunks(CHUNK))
            .zip(q_prev.par_chunks(CHUNK))
            .enumerate()
            .map(|(c, ((y, q), p))| {
                // yy qy py qq pp qp, sum y, sum q, sum p
                let a = sums9(y, q, p);
                let mut d = vec![0.0; 6 + 3 * m];
                d[..6].copy_from_slice(&a[..6]);
                for (k, u) in deflate.iter().enumerate() {
                    match u.part(n, c * CHUNK, y.len()) {
                        UnitPart::Const(u) => (d[6 + k], d[6 + m + k], d[6 + 2 * m + k]) = (u * a[6], u * a[7], u * a[8]),
                        UnitPart::Slice(u) => {
                            (d[6 + k], d[6 + m + k], d[6 + 2 * m + k]) = (dot_serial(u, y), dot_serial(u, q), dot_serial(u, p))
                        }
                    }
                }
                d
            })
            .collect();
        parts.iter().fold(vec![0.0; 6 + 3 * m], |mut acc, p| {
            acc.iter_mut().zip(p).for_each(|(a, b)| *a += b);
            acc
        })
    }

    /// The step's second half formed explicitly (near a breakdown): z, then c = q.z and z.z,
    /// then the normalisation.
    fn explicit(&self, y: &mut [f64], q: &[f64], q_prev: &[f64], uy: &[f64], alpha: f64, b: f64) -> (f64, f64) {
        let (n, deflate) = (self.n, self.deflate);
        let sums: Vec<(f64, f64)> = y
            .par_chunks_mut(CHUNK)
            .zip(q.par_chunks(CHUNK))
            .zip(q_prev.par_chunks(CHUNK))
            .enumerate()
            .map(|(ch, ((y, q), p))| {
                for (k, u) in deflate.iter().enumerate() {
                    u.part(n, ch * CHUNK, y.len()).sub_from(uy[k], y);
                }
                let (mut qz, mut zz) = (0.0, 0.0);
                for ((yi, qi), pi) in y.iter_mut().zip(q).zip(p) {
                    *yi -= alpha * qi + b * pi;
                    qz += qi * *yi;
                    zz += *yi * *yi;
                }
                (qz, zz)
            })
            .collect();
        let (c, zz) = sums.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        let beta = (zz - c * c).max(0.0).sqrt();
        if beta > 0.0 {
            y.par_iter_mut().zip(q.par_iter()).with_min_len(CHUNK).for_each(|(yi, qi)| *yi = (*yi - c * qi) / beta);
        }
        (alpha + c, beta)
    }
}

/// The largest eigenvalue of the symmetric positive semi-definite operator `op` (y = A x) on
/// the orthogonal complement of the orthonormal vectors `deflate`, by the Lanczos three-term
/// recurrence from a seeded random start. With `want_vector` the recurrence is run a second
/// time, identically, to accumulate the Ritz vector without storing the basis.
pub fn lanczos_top(n: usize, op: &mut dyn FnMut(&[f64], &mut [f64]), deflate: &[Unit], seed: u64, want_vector: bool) -> Ritz {
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
    let step = LanczosStep { n, deflate };
    let (mut alpha, mut beta) = (Vec::<f64>::new(), Vec::<f64>::new());
    let (mut q, mut q_prev, mut y) = (q0.clone(), vec![0.0; n], vec![0.0; n]);
    let (value, residual, converged) = loop {
        let (a, b) = step.run(op, &q, &q_prev, beta.last().copied().unwrap_or(0.0), &mut y);
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
            step.run(op, &q, &q_prev, if k > 0 { beta[k - 1] } else { 0.0 }, &mut y);
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
        let r = lanczos_top(n, &mut ptp, &[Unit::Ones], seed, false);
        TopTwo { sigma_1: 1.0, sigma_2: sq(r.value), steps: r.steps, residual: r.residual, converged: r.converged }
    } else {
        let r1 = lanczos_top(n, &mut ptp, &[], seed, true);
        let v1 = r1.vector.clone().expect("asked for the Ritz vector");
        let r2 = lanczos_top(n, &mut ptp, &[Unit::Vector(v1)], seed.wrapping_add(1), false);
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

/// Every edge goes from i - 1 to i (the one-way chain of ASAP Fig. 2(d), or parts of it): P is
/// lower bidiagonal, so P^T P is tridiagonal and its eigenvalues come from Sturm bisection in
/// O(nodes) per step, exactly. Lanczos cannot resolve the chain's sigma_2 (1 - O(1/n^2)) at
/// scale: at 1,048,576 nodes it had not finished after 120 s.
fn is_bidiagonal(g: &Graph) -> bool {
    (0..g.nodes()).into_par_iter().all(|i| g.in_neighbours(i).iter().all(|&j| j + 1 == i))
}

/// The two largest singular values of a lower bidiagonal P (see [`is_bidiagonal`]):
/// (P^T P)_jj = P_jj^2 + P_{j+1,j}^2 and (P^T P)_{j,j+1} = P_{j+1,j} P_{j+1,j+1}.
pub fn top_two_bidiagonal(g: &Graph) -> (f64, f64) {
    let n = g.nodes();
    let w = in_weights(g);
    let sub = |j: usize| if j + 1 < n && !g.in_neighbours(j + 1).is_empty() { w[j + 1] } else { 0.0 };
    let a: Vec<f64> = (0..n).map(|j| w[j] * w[j] + sub(j) * sub(j)).collect();
    let b: Vec<f64> = (0..n.saturating_sub(1)).map(|j| sub(j) * w[j + 1]).collect();
    let top = tridiagonal_top(&a, &b);
    let second = if n > 1 { tridiagonal_second(&a, &b, top) } else { 0.0 };
    (top.max(0.0).sqrt(), second.max(0.0).sqrt())
}

/// The report of the complete graph on n nodes without building its n(n - 1) edges: P = J / n,
/// so sigma_1 = 1, every other singular value and eigenvalue is 0, and one round averages
/// exactly. `graph gap` and `graph compare` use it above DENSE_LIMIT nodes (a million nodes
/// would be 10^12 edges).
pub fn complete_report(n: usize, model_bytes: u64, epsilon: f64) -> GraphReport {
    let d = n - 1;
    let edges = n * d;
    GraphReport {
        name: "complete".into(),
        nodes: n,
        edges,
        min_in_degree: d,
        max_in_degree: d,
        min_out_degree: d,
        max_out_degree: d,
        regular: true,
        regular_in_degree: true,
        doubly_stochastic: true,
        strongly_connected: true,
        diameter: Some(usize::from(n > 1)),
        diameter_bounds: None,
        sigma_1: 1.0,
        sigma_2: 0.0,
        spectral_gap: 1.0,
        slem: (n <= 1024).then_some(0.0),
        mixing_rounds: mixing_rounds(0.0, epsilon),
        epsilon,
        bytes_per_round: (model_bytes > 0).then(|| model_bytes * edges as u64),
        method: "closed-form".into(),
        iterations: None,
        residual: None,
        converged: true,
        seconds: 0.0,
    }
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
    let t_degrees = t0.elapsed().as_secs_f64();
    let (sc, diameter, diameter_bounds) = connectivity(g);
    let t_connectivity = t0.elapsed().as_secs_f64();
    let chosen = match (method, g.cayley()) {
        (Method::Dense, _) => "dense-svd",
        (Method::Auto, _) if n <= DENSE_LIMIT => "dense-svd",
        (Method::Auto | Method::Fourier, Some(_)) => "fourier",
        (Method::Auto, None) if is_bidiagonal(g) => "bidiagonal",
        _ => "lanczos",
    };
    let (mut iterations, mut residual, mut converged) = (None, None, true);
    let (s1, s2) = match chosen {
        "dense-svd" => top_two_dense(g),
        "fourier" => top_two_fourier(g.cayley().expect("checked above")),
        "bidiagonal" => top_two_bidiagonal(g),
        _ => {
            let t = top_two_sparse(g, 1);
            (iterations, residual, converged) = (Some(t.steps), Some(t.residual), t.converged);
            if !t.converged {
                log::warn!(
                    "Lanczos stopped after {} steps with residual {:.1e} (> {LANCZOS_TOL:.0e}): sigma_2 {:.8} is a lower bound",
                    t.steps,
                    t.residual,
                    t.sigma_2
                );
            }
            (t.sigma_1, t.sigma_2)
        }
    };
    let t_spectrum = t0.elapsed().as_secs_f64();
    log::debug!(
        "graph analysis of {} nodes: degrees and stochasticity {t_degrees:.3} s, connectivity and diameter {:.3} s, {chosen} {:.3} s",
        n,
        t_connectivity - t_degrees,
        t_spectrum - t_connectivity
    );
    let gap = (1.0 - s2).max(0.0);
    let slem = slem(g, chosen, s2);
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

/// How [`slem`] finds the second-largest eigenvalue modulus of P.
#[derive(Debug, PartialEq, Eq)]
enum SlemMethod {
    /// A Cayley graph of an abelian group: P is normal, so its eigenvalue moduli are its singular
    /// values and the SLEM is sigma_2, exact by Fourier in O(nodes * degree).
    Fourier,
    /// Dense eigenvalues (LAPACK, O(n^3)): only where the dense SVD runs anyway.
    Dense,
    /// Not computed.
    None,
}

/// The fast path wherever it applies. The dense eigenvalues used to run for every graph up to
/// 1,024 nodes: `graph gap` took 2.2 s for a ring of 1,024 nodes and 1.06 s at 1,023, 0.63 s
/// for the exponential graph at 1,024, against 0.00-0.01 s at 2,048 (no SLEM there); the cost
/// is now never above the dense SVD's own (<= 256 nodes) for any graph.
fn slem_method(g: &Graph) -> SlemMethod {
    match g.cayley() {
        Some(_) => SlemMethod::Fourier,
        None if g.nodes() <= DENSE_LIMIT => SlemMethod::Dense,
        None => SlemMethod::None,
    }
}

/// Second-largest eigenvalue modulus of P (`chosen`/`s2`: the spectrum method's result, reused
/// when it is already the exact Fourier value).
fn slem(g: &Graph, chosen: &str, s2: f64) -> Option<f64> {
    match slem_method(g) {
        SlemMethod::Fourier if chosen == "fourier" => Some(s2),
        SlemMethod::Fourier => g.cayley().map(|c| top_two_fourier(c).1),
        SlemMethod::Dense => {
            let mut m: Vec<f64> = p_matrix(g).eigvals().expect("LAPACK eigenvalues").iter().map(|c| c.norm()).collect();
            m.sort_by(|a, b| b.total_cmp(a));
            Some(m.get(1).copied().unwrap_or(0.0))
        }
        SlemMethod::None => None,
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

    /// `graph gap`'s slow spots (issue 27): at every size, a Cayley graph's SLEM comes from the
    /// Fourier path and nothing O(n^3) runs above the dense SVD's limit, so no size costs more
    /// than twice its size; the Fourier SLEM equals the dense eigenvalues' where both run.
    #[test]
    fn slem_takes_the_fast_path_at_every_size() {
        for n in [2usize, 3, 100, 255, 256, 257, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 2048, 4096] {
            for kind in ["ring", "exponential", "root-expander", "torus", "hypercube"] {
                let Ok(g) = generate(kind, n, 1) else { continue };
                assert_eq!(slem_method(&g), SlemMethod::Fourier, "{kind} {n}");
            }
            let edges: Vec<(usize, usize)> = (0..n).flat_map(|i| [(i, (i + 1) % n), (i, (i * 7 + 3) % n)]).collect();
            let g = Graph::from_edges(n, edges, "irregular");
            let want = if n <= DENSE_LIMIT { SlemMethod::Dense } else { SlemMethod::None };
            assert_eq!(slem_method(&g), want, "irregular {n}");
        }
        for n in [2usize, 5, 16, 30, 64, 100, 128] {
            for kind in ["ring", "exponential", "root-expander", "torus", "hypercube"] {
                let Ok(g) = generate(kind, n, 1) else { continue };
                let mut m: Vec<f64> = p_matrix(&g).eigvals().unwrap().iter().map(|c| c.norm()).collect();
                m.sort_by(|a, b| b.total_cmp(a));
                let r = analyse(&g, 0);
                assert!((r.slem.unwrap() - m[1]).abs() < 1e-9, "{kind} {n}: {:?} vs {}", r.slem, m[1]);
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
        // Many more steps from another start, with the ones vector deflated explicitly (the
        // other code path): the values agree.
        let one = vec![1.0 / (g.nodes() as f64).sqrt(); g.nodes()];
        let r = lanczos_top(g.nodes(), &mut op, &[Unit::Vector(one)], 99, false);
        assert!((r.value.sqrt() - t.sigma_2).abs() < 1e-7, "{} vs {}", r.value.sqrt(), t.sigma_2);
    }

    #[test]
    fn sparse_products_equal_the_dense_matrix_for_every_row_kernel() {
        let mut rng = Rng::new(21);
        // Regular rows of an unrolled degree (3), of the generic fixed-degree loop (20),
        // irregular rows, and the degree-0 single node.
        let irregular =
            Graph::from_edges(300, (0..300).flat_map(|i| [(i, (i + 1) % 300), (i, (i * 7 + 3) % 300), (i, i / 2)]), "irregular");
        let graphs = [
            super::super::random_regular(300, 3, 1).unwrap(),
            super::super::random_regular(300, 20, 2).unwrap(),
            irregular,
            Graph::from_edges(1, [], "one"),
        ];
        for g in &graphs {
            let n = g.nodes();
            let p = p_matrix(g);
            let x: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
            let xa = ndarray::Array1::from(x.clone());
            let want_px = p.dot(&xa);
            let want_ptp = p.t().dot(&want_px);
            let sp = SparseP::new(g);
            let (mut y, mut tmp) = (vec![0.0; n], vec![0.0; n]);
            sp.mul(&x, &mut y);
            assert!(y.iter().zip(&want_px).all(|(a, b)| (a - b).abs() < 1e-12), "{} P x", g.name);
            sp.mul_ptp(&x, &mut tmp, &mut y);
            assert!(y.iter().zip(&want_ptp).all(|(a, b)| (a - b).abs() < 1e-12), "{} P^T P x", g.name);
        }
    }

    #[test]
    fn bidiagonal_chains_and_the_closed_form_complete_graph() {
        // The one-way chain and a chain with a missing link (two pieces), against dense SVD.
        for n in [2usize, 3, 25, 100, 256] {
            for g in
                [generate("chain", n, 1).unwrap(), Graph::from_edges(n, (1..n).filter(|&i| i != n / 2).map(|i| (i - 1, i)), "cut chain")]
            {
                assert!(is_bidiagonal(&g));
                let (a1, a2) = top_two_dense(&g);
                let (b1, b2) = top_two_bidiagonal(&g);
                assert!((a1 - b1).abs() < 1e-10 && (a2 - b2).abs() < 1e-10, "{} {n}: dense {a1} {a2} bidiagonal {b1} {b2}", g.name);
            }
        }
        assert!(!is_bidiagonal(&generate("line", 10, 1).unwrap()));
        // Above DENSE_LIMIT Auto picks it; at a million nodes it takes about a second.
        let r = analyse(&generate("chain", 1000, 1).unwrap(), 0);
        assert_eq!(r.method, "bidiagonal");
        let n = 300;
        let built = analyse(&generate("complete", n, 1).unwrap(), 8);
        let closed = complete_report(n, 8, 1e-3);
        assert_eq!(
            (closed.edges, closed.diameter, closed.mixing_rounds, closed.bytes_per_round),
            (built.edges, built.diameter, built.mixing_rounds, built.bytes_per_round)
        );
        assert!((closed.spectral_gap - built.spectral_gap).abs() < 1e-6 && (closed.sigma_1 - built.sigma_1).abs() < 1e-9);
        assert!(closed.regular && closed.doubly_stochastic && closed.strongly_connected);
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
