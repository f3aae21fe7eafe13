//! Communication graphs over N ranks (pure maths, no MPI). An edge j -> i means rank j sends its
//! model to rank i; rank i averages itself with its in-neighbours.
//!
//! Graphs are stored as two compressed sparse rows (in- and out-neighbours), built by counting
//! sort, so building and analysing a graph costs time and memory linear in its edges: a
//! 1,048,576-node exponential graph (20,971,520 edges) is built in about a second.

pub mod command;
pub mod file;
pub mod mixing;
pub mod spectral;

use std::collections::VecDeque;

use rayon::prelude::*;

use crate::rng::Rng;
pub use spectral::{analyse, GraphReport};

/// A Cayley graph of an abelian group Z_{m_1} x ... x Z_{m_k}: node index = mixed-radix digits
/// (the last digit varies fastest), and node x sends to x + s for every shift s. Its P is then
/// diagonalised by the group's Fourier transform, so its singular values are known exactly
/// (see `spectral::top_two_fourier`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cayley {
    /// The moduli m_1..m_k (their product is the number of nodes).
    pub moduli: Vec<usize>,
    /// The distinct non-zero shifts, as digit vectors.
    pub shifts: Vec<Vec<usize>>,
}

impl Cayley {
    fn new(moduli: Vec<usize>, shifts: impl IntoIterator<Item = Vec<usize>>) -> Self {
        let mut s: Vec<Vec<usize>> = shifts
            .into_iter()
            .map(|v| v.iter().zip(&moduli).map(|(x, m)| x % m).collect::<Vec<usize>>())
            .filter(|v| v.iter().any(|&x| x != 0))
            .collect();
        s.sort();
        s.dedup();
        Cayley { moduli, shifts: s }
    }

    /// Digits of node `i`.
    pub fn digits(&self, mut i: usize) -> Vec<usize> {
        let mut d = vec![0; self.moduli.len()];
        for (k, &m) in self.moduli.iter().enumerate().rev() {
            d[k] = i % m;
            i /= m;
        }
        d
    }

    /// Each shift as its non-zero digits (position, value): most shifts move one digit, so this
    /// keeps the Fourier sum and the check below O(nodes * degree) instead of O(nodes * degree * k).
    pub(crate) fn sparse_shifts(&self) -> Vec<Vec<(usize, usize)>> {
        self.shifts.iter().map(|s| s.iter().copied().enumerate().filter(|&(_, v)| v != 0).collect()).collect()
    }

    /// True when `g`'s out-neighbours are exactly x + shifts for every node (checked once, in
    /// O(edges), so a generator bug can never make the Fourier method report a wrong gap).
    fn describes(&self, g: &Graph) -> bool {
        let k = self.moduli.len();
        let mut strides = vec![1usize; k];
        for l in (0..k.saturating_sub(1)).rev() {
            strides[l] = strides[l + 1] * self.moduli[l + 1];
        }
        let sparse = self.sparse_shifts();
        g.nodes() == self.moduli.iter().product::<usize>()
            && (0..g.nodes()).into_par_iter().all(|i| {
                let d = self.digits(i);
                let mut want: Vec<usize> = sparse
                    .iter()
                    .map(|s| {
                        s.iter().fold(i, |x, &(l, v)| {
                            let nd = (d[l] + v) % self.moduli[l];
                            x + nd * strides[l] - d[l] * strides[l]
                        })
                    })
                    .collect();
                want.sort_unstable();
                want == g.out_neighbours(i)
            })
    }
}

/// A directed graph without self-edges or duplicate edges (self-loops are implied by averaging).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    n: usize,
    /// In-neighbours of i: in_idx[in_off[i]..in_off[i + 1]], sorted.
    in_off: Vec<usize>,
    in_idx: Vec<usize>,
    /// Out-neighbours of i: out_idx[out_off[i]..out_off[i + 1]], sorted.
    out_off: Vec<usize>,
    out_idx: Vec<usize>,
    /// Group structure, when a generator made a verified Cayley graph.
    cayley: Option<Cayley>,
    /// What it is, for reports ("root-expander", "file:graphs/x.txt" ...).
    pub name: String,
}

impl Graph {
    /// A graph from edges (src, dst); self-edges and duplicates are dropped (generators may
    /// produce them for small N); files are checked strictly before this.
    pub fn from_edges(n: usize, edges: impl IntoIterator<Item = (usize, usize)>, name: &str) -> Self {
        assert!(n < u32::MAX as usize, "graphs are limited to 2^32 - 1 nodes");
        // u32 pairs halve the transient memory of the edge list.
        let pairs: Vec<(u32, u32)> = edges
            .into_iter()
            .inspect(|&(s, d)| assert!(s < n && d < n, "edge {s} -> {d} outside 0..{n}"))
            .filter(|&(s, d)| s != d)
            .map(|(s, d)| (s as u32, d as u32))
            .collect();
        // Out-rows by counting sort on the source, then sorted and deduplicated in place.
        let mut out_off = vec![0usize; n + 1];
        for &(s, _) in &pairs {
            out_off[s as usize + 1] += 1;
        }
        for i in 0..n {
            out_off[i + 1] += out_off[i];
        }
        let mut out_idx = vec![0usize; pairs.len()];
        let mut fill = out_off.clone();
        for &(s, d) in &pairs {
            out_idx[fill[s as usize]] = d as usize;
            fill[s as usize] += 1;
        }
        drop(pairs);
        let mut w = 0;
        let mut start = 0;
        for i in 0..n {
            let end = out_off[i + 1];
            out_idx[start..end].sort_unstable();
            out_off[i] = w;
            let mut last = usize::MAX;
            for k in start..end {
                if out_idx[k] != last {
                    last = out_idx[k];
                    out_idx[w] = last;
                    w += 1;
                }
            }
            start = end;
        }
        out_off[n] = w;
        out_idx.truncate(w);
        out_idx.shrink_to_fit();
        // In-rows from the out-rows: sources are visited in increasing order, so every in-row
        // comes out sorted and (the out-rows being unique) without duplicates.
        let mut in_off = vec![0usize; n + 1];
        for &d in &out_idx {
            in_off[d + 1] += 1;
        }
        for i in 0..n {
            in_off[i + 1] += in_off[i];
        }
        let mut in_idx = vec![0usize; out_idx.len()];
        let mut fill = in_off.clone();
        for s in 0..n {
            for &d in &out_idx[out_off[s]..out_off[s + 1]] {
                in_idx[fill[d]] = s;
                fill[d] += 1;
            }
        }
        Graph { n, in_off, in_idx, out_off, out_idx, cayley: None, name: name.to_string() }
    }

    /// Attaches a group structure after checking that it describes this graph exactly.
    fn with_cayley(mut self, c: Cayley) -> Self {
        if c.describes(&self) {
            self.cayley = Some(c);
        } else {
            debug_assert!(false, "{}: the Cayley description does not match the edges", self.name);
        }
        self
    }

    /// The verified group structure, if a generator made this graph as a Cayley graph.
    pub fn cayley(&self) -> Option<&Cayley> {
        self.cayley.as_ref()
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.n
    }
    /// Ranks that send to `i`, sorted.
    pub fn in_neighbours(&self, i: usize) -> &[usize] {
        &self.in_idx[self.in_off[i]..self.in_off[i + 1]]
    }
    /// Ranks `i` sends to, sorted.
    pub fn out_neighbours(&self, i: usize) -> &[usize] {
        &self.out_idx[self.out_off[i]..self.out_off[i + 1]]
    }
    /// Number of edges.
    pub fn edges(&self) -> usize {
        self.out_idx.len()
    }
    /// All edges (src, dst).
    pub fn edge_list(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.n).flat_map(move |s| self.out_neighbours(s).iter().map(move |&d| (s, d)))
    }

    /// BFS distances from `src` along out-edges (`forward`) or in-edges; usize::MAX = unreachable.
    pub fn distances(&self, src: usize, forward: bool) -> Vec<usize> {
        let mut dist = vec![usize::MAX; self.n];
        let mut q = VecDeque::from([src]);
        dist[src] = 0;
        while let Some(u) = q.pop_front() {
            let next = if forward { self.out_neighbours(u) } else { self.in_neighbours(u) };
            for &v in next {
                if dist[v] == usize::MAX {
                    dist[v] = dist[u] + 1;
                    q.push_back(v);
                }
            }
        }
        dist
    }

    /// Longest distance from `src` (forward or backward); usize::MAX if some node is unreachable.
    pub fn eccentricity(&self, src: usize, forward: bool) -> usize {
        self.distances(src, forward).into_iter().max().unwrap_or(0)
    }

    /// Every node reaches every other.
    pub fn strongly_connected(&self) -> bool {
        self.n <= 1 || (self.eccentricity(0, true) != usize::MAX && self.eccentricity(0, false) != usize::MAX)
    }

    /// Graphviz DOT.
    pub fn to_dot(&self) -> String {
        let mut s = format!("digraph \"{}\" {{\n", self.name.replace('"', "'"));
        for i in 0..self.n {
            s.push_str(&format!("  {i};\n"));
        }
        for (a, b) in self.edge_list() {
            s.push_str(&format!("  {a} -> {b};\n"));
        }
        s.push_str("}\n");
        s
    }
}

/// The generator kinds, as spelled on the command line.
pub const KINDS: &str = "auto, complete, star, root-expander, chain, line, ring, hypercube, exponential, torus, random:D, file:PATH";

/// The time-varying family `graph mix` and `graph gap` understand (not a training graph).
pub const ONE_PEER_EXPONENTIAL: &str = "one-peer-exponential";

/// Builds a graph from a spec string for `n` nodes.
pub fn generate(spec: &str, n: usize, seed: u64) -> anyhow::Result<Graph> {
    anyhow::ensure!(n >= 1, "a graph needs at least one node");
    let circulant = |shifts: Vec<usize>| {
        let edges = (0..n).flat_map(|i| shifts.iter().map(move |&s| (i, (i + s) % n)));
        Graph::from_edges(n, edges, spec).with_cayley(Cayley::new(vec![n], shifts.iter().map(|&s| vec![s])))
    };
    let edges: Vec<(usize, usize)> = match spec {
        "auto" => {
            let (kind, _) = auto_kind(n);
            let mut g = generate(&kind, n, seed)?;
            g.name = format!("auto ({kind})");
            return Ok(g);
        }
        "complete" | "all-reduce" | "allreduce" => (0..n).flat_map(|i| (0..n).map(move |j| (i, j))).collect(),
        "star" | "parameter-server" => (1..n).flat_map(|i| [(0, i), (i, 0)]).collect(),
        "root-expander" | "expander" => return Ok(circulant(vec![1, (n as f64).sqrt().floor() as usize])),
        // ASAP Fig. 2(d): updates flow one way and need N steps to reach the last node. Not
        // strongly connected, so training refuses it; `line` is the two-way version.
        "chain" => (1..n).map(|i| (i - 1, i)).collect(),
        "line" => (1..n).flat_map(|i| [(i - 1, i), (i, i - 1)]).collect(),
        "ring" => return Ok(circulant(vec![1])),
        "hypercube" => {
            anyhow::ensure!(n.is_power_of_two(), "hypercube needs a power-of-two number of nodes, not {n}");
            let dims = n.trailing_zeros() as usize;
            let edges = (0..n).flat_map(|i| (0..dims).map(move |k| (i, i ^ (1 << k))));
            let unit = (0..dims).map(|l| (0..dims).map(|k| usize::from(k == l)).collect());
            return Ok(Graph::from_edges(n, edges, spec).with_cayley(Cayley::new(vec![2; dims], unit)));
        }
        "exponential" => return Ok(circulant((0..).map(|k| 1usize << k).take_while(|&s| s < n).collect())),
        "torus" => {
            let rows = (1..=(n as f64).sqrt() as usize).rev().find(|r| n.is_multiple_of(*r)).unwrap_or(1);
            let cols = n / rows;
            let id = |r: usize, c: usize| (r % rows) * cols + (c % cols);
            let edges = (0..n).flat_map(|i| {
                let (r, c) = (i / cols, i % cols);
                [(i, id(r + 1, c)), (i, id(r + rows - 1, c)), (i, id(r, c + 1)), (i, id(r, c + cols - 1))]
            });
            let shifts = [vec![1, 0], vec![rows - 1, 0], vec![0, 1], vec![0, cols - 1]];
            return Ok(Graph::from_edges(n, edges, spec).with_cayley(Cayley::new(vec![rows, cols], shifts)));
        }
        ONE_PEER_EXPONENTIAL => anyhow::bail!(
            "{ONE_PEER_EXPONENTIAL} changes every round: `asap-train graph mix` simulates it, \
             `asap-train graph gap` reports the gap of one period, and `train --sync asap --graph \
             {ONE_PEER_EXPONENTIAL}` trains on it (with --notify notify-ack), but this command \
             needs a static graph"
        ),
        s if s.starts_with("random:") => {
            let d: usize = s[7..].parse().map_err(|_| anyhow::anyhow!("random:D needs an out-degree D, got {s:?}"))?;
            return random_regular(n, d, seed);
        }
        s if s.starts_with("file:") => return file::read(&s[5..], Some(n)),
        other => anyhow::bail!("unknown graph {other:?}: use one of {KINDS}"),
    };
    Ok(Graph::from_edges(n, edges, spec))
}

/// A random d-regular digraph (every node sends to d and receives from d), as the union of d
/// random permutations without fixed points or repeated edges; retried until strongly connected.
///
/// Each permutation is a seeded shuffle whose few bad positions (a fixed point, or an edge an
/// earlier permutation already made; about d of them expected) are repaired by swapping with
/// random positions. Rejecting whole shuffles instead succeeds with probability ~e^-d per
/// permutation and needed a hash set of all edges: it did not finish at a million nodes. With
/// repairs the cost is O(n d) expected. The graphs are not exactly uniform among d-regular ones;
/// their spectral gaps match rejection sampling's (checked in the tests below).
pub fn random_regular(n: usize, d: usize, seed: u64) -> anyhow::Result<Graph> {
    if n == 1 {
        return Ok(Graph::from_edges(1, [], "random"));
    }
    anyhow::ensure!(d >= 1 && d < n, "random:{d} needs 1 <= D < nodes ({n})");
    if d == n - 1 {
        // The only (n-1)-regular digraph; random permutations rarely complete a Latin square.
        return Ok(Graph::from_edges(n, (0..n).flat_map(|i| (0..n).map(move |j| (i, j))), &format!("random:{d}")));
    }
    let mut rng = Rng::new(seed);
    'attempt: for _ in 0..10_000 {
        // outs[k * n + i]: the target of node i in permutation k.
        let mut outs: Vec<usize> = Vec::with_capacity(n * d);
        for k in 0..d {
            let mut p: Vec<usize> = (0..n).collect();
            rng.shuffle(&mut p);
            let earlier = &outs;
            let bad = |p: &[usize], i: usize| p[i] == i || (0..k).any(|e| earlier[e * n + i] == p[i]);
            let mut todo: Vec<usize> = (0..n).filter(|&i| bad(&p, i)).collect();
            let mut tries = 0usize;
            while let Some(i) = todo.pop() {
                if !bad(&p, i) {
                    continue;
                }
                loop {
                    tries += 1;
                    if tries > 100 * (n + 10) {
                        continue 'attempt;
                    }
                    let j = rng.below(n);
                    p.swap(i, j);
                    if !bad(&p, i) && !bad(&p, j) {
                        break;
                    }
                    p.swap(i, j);
                }
            }
            outs.extend_from_slice(&p);
        }
        let edges = (0..d).flat_map(|k| (0..n).map(move |i| (i, k)));
        let g = Graph::from_edges(n, edges.map(|(i, k)| (i, outs[k * n + i])), &format!("random:{d}"));
        if g.strongly_connected() {
            return Ok(g);
        }
    }
    anyhow::bail!("found no strongly connected random {d}-regular graph on {n} nodes")
}

/// `--graph auto` keeps the root expander while it mixes within this many rounds (to 1e-3).
pub const AUTO_MAX_ROUNDS: u64 = 32;

/// The graph `--graph auto` picks for `n` ranks, and why.
///
/// Measured with `asap-train graph gap` (rounds until sigma_2^t < 1e-3): the root expander
/// (2 sends per rank) mixes in 32 rounds at 8 ranks, 30 at 16, 76 at 32, 231 at 128, 1,662 at
/// 1,024 and 15,904 at 10,000, because its gap shrinks like 1/N. A random 4-regular graph (4
/// sends) keeps a gap near 0.2 at every size: 28-31 rounds from 64 to 10,000 ranks (random:3:
/// 41-48, exponential: 25 at 128 rising to 49 at 10,000 for 7-14 sends). So: the root expander
/// while it mixes within AUTO_MAX_ROUNDS, a random 4-regular graph (seeded by --seed) above.
pub fn auto_kind(n: usize) -> (String, String) {
    let root = generate("root-expander", n, 0).expect("the root expander exists for every n >= 1");
    let rounds = spectral::mixing_rounds(spectral::sigma_2(&root), 1e-3);
    match rounds {
        _ if n <= 1 => ("root-expander".into(), "a single rank has nobody to exchange with".into()),
        Some(r) if r <= AUTO_MAX_ROUNDS || n <= 5 => (
            "root-expander".into(),
            format!("the root expander mixes within {r} rounds at {n} ranks"),
        ),
        _ => (
            "random:4".into(),
            format!(
                "the root expander would need {} rounds at {n} ranks (its gap shrinks like 1/N); a random 4-regular graph keeps a gap near 0.2 at any size for 4 sends per rank",
                rounds.map_or("infinitely many".into(), |r| r.to_string())
            ),
        ),
    }
}

/// The one-peer exponential graph for training on `n` ranks: in round k (from 1) rank i sends
/// only to i + 2^((k - 1) mod tau) and receives only from i - 2^((k - 1) mod tau),
/// tau = ceil(log2 n). Returns every rank's in-neighbours over a whole period (the mailboxes
/// need a slot per edge ever used), and the report of the product over one period.
pub fn one_peer_for_training(n: usize) -> (Vec<Vec<usize>>, GraphReport) {
    let tau = spectral::one_peer_period(n);
    let ins = (0..n).map(|i| if n > 1 { (0..tau).map(|k| (i + n - (1 << k) % n) % n).collect() } else { Vec::new() }).collect();
    let r = spectral::one_peer_report(n, 1e-3);
    log::info!(
        "communication graph {ONE_PEER_EXPONENTIAL} on {n} ranks: one send per rank per round, period {tau} rounds, \
         spectral gap of one period's product {:.5} (exact averaging every period when {n} is a power of two)",
        r.spectral_gap
    );
    (ins, r)
}

/// The in-neighbour of `rank` in round `round` (from 1) of the one-peer exponential graph.
pub fn one_peer_source(rank: usize, n: usize, round: u64) -> usize {
    let k = ((round - 1) % spectral::one_peer_period(n) as u64) as u32;
    (rank + n - (1usize << k) % n) % n
}

/// The out-neighbour of `rank` in round `round` of the one-peer exponential graph.
pub fn one_peer_target(rank: usize, n: usize, round: u64) -> usize {
    let k = ((round - 1) % spectral::one_peer_period(n) as u64) as u32;
    (rank + (1usize << k)) % n
}

/// The graph training uses: built for the actual number of ranks, analysed and logged; refused
/// when not strongly connected; a warning when in-degrees differ. `auto` picks a family from
/// the number of ranks (see [`auto_kind`]) and logs which and why.
pub fn graph_for_training(spec: &str, nranks: usize, seed: u64) -> anyhow::Result<(Graph, GraphReport)> {
    let g = generate(spec, nranks, seed)?;
    let r = analyse(&g, 0);
    // One line: the choice (for auto) and the graph's facts.
    let chose = if spec == "auto" {
        let (kind, why) = auto_kind(nranks);
        format!("--graph auto chose {kind} ({why}); ")
    } else {
        String::new()
    };
    if nranks <= 1 {
        log::info!("{chose}communication graph {} on 1 rank: no edges, nothing is sent", g.name);
    } else {
        log::info!(
            "{chose}communication graph {} on {} ranks: {} edges, up to {} sends per rank per round, in-degree {}..{}, spectral gap {:.5} (sigma_2 {:.5}), diameter {}, replicas agree to 1e-3 within ~{} rounds",
            g.name, nranks, r.edges, r.max_out_degree, r.min_in_degree, r.max_in_degree, r.spectral_gap, r.sigma_2,
            r.diameter_text(), r.mixing_rounds.map_or("inf".into(), |t| t.to_string())
        );
    }
    if !r.strongly_connected {
        anyhow::bail!(
            "graph {spec} on {nranks} ranks is not strongly connected: some ranks never \
             hear from others, so the replicas cannot agree on the global average; use e.g. \
             --graph root-expander or check the edges (`asap-train graph gap --kind {spec} --nodes {nranks}`)"
        );
    }
    if !r.regular_in_degree {
        log::warn!(
            "graph {spec}: in-degrees differ ({}..{}), so averaging is not doubly stochastic and the \
             consensus is biased towards some ranks",
            r.min_in_degree,
            r.max_in_degree
        );
    }
    Ok((g, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_rows_are_sorted_unique_and_consistent() {
        let g = Graph::from_edges(5, [(0, 1), (0, 1), (2, 2), (4, 0), (3, 0), (0, 3), (1, 4)], "t");
        assert_eq!(g.edges(), 5);
        assert_eq!(g.out_neighbours(0), &[1, 3]);
        assert_eq!(g.in_neighbours(0), &[3, 4]);
        assert_eq!(g.in_neighbours(2), &[] as &[usize]);
        let back: Vec<(usize, usize)> = g.edge_list().collect();
        assert_eq!(back, vec![(0, 1), (0, 3), (1, 4), (3, 0), (4, 0)]);
    }

    #[test]
    fn generated_cayley_graphs_are_recognised() {
        for n in [1usize, 2, 3, 4, 6, 9, 12, 25, 64, 100] {
            for kind in ["ring", "exponential", "root-expander", "torus"] {
                assert!(generate(kind, n, 1).unwrap().cayley().is_some(), "{kind} {n}");
            }
            if n.is_power_of_two() {
                assert!(generate("hypercube", n, 1).unwrap().cayley().is_some(), "hypercube {n}");
            }
        }
        // A wrong description is refused (the graph falls back to the general methods).
        let g = Graph::from_edges(6, (0..6).map(|i| (i, (i + 1) % 6)), "ring");
        assert!(!Cayley::new(vec![6], [vec![2]]).describes(&g));
        assert!(Cayley::new(vec![6], [vec![1]]).describes(&g));
        assert!(generate("complete", 8, 1).unwrap().cayley().is_none());
    }

    #[test]
    fn random_regular_scales_and_stays_regular() {
        let n = 200_000;
        let t = std::time::Instant::now();
        let g = random_regular(n, 4, 3).unwrap();
        assert!((0..n).all(|i| g.in_neighbours(i).len() == 4 && g.out_neighbours(i).len() == 4));
        assert!(g.strongly_connected());
        assert!(t.elapsed().as_secs_f64() < 20.0, "{:?}", t.elapsed());
        // Small and dense cases still work (up to D = n - 1, the complete graph).
        for (n, d) in [(2, 1), (5, 4), (7, 3), (10, 9)] {
            let g = random_regular(n, d, 1).unwrap();
            assert!((0..n).all(|i| g.in_neighbours(i).len() == d && g.out_neighbours(i).len() == d), "{n} {d}");
        }
    }

    #[test]
    fn auto_keeps_the_root_expander_while_it_mixes_then_random_4() {
        assert_eq!(auto_kind(8).0, "root-expander");
        assert_eq!(auto_kind(1).0, "root-expander");
        assert_eq!(auto_kind(128).0, "random:4");
        assert_eq!(auto_kind(10_000).0, "random:4");
        for n in 1..=300 {
            let g = generate("auto", n, 1).unwrap();
            assert!(g.strongly_connected(), "auto {n}");
            let r = analyse(&g, 0);
            assert!(r.mixing_rounds.unwrap() <= AUTO_MAX_ROUNDS + 20, "auto {n}: {:?} rounds", r.mixing_rounds);
        }
    }
}
