//! Communication graphs over N ranks (pure maths, no MPI). An edge j -> i means rank j sends its
//! model to rank i; rank i averages itself with its in-neighbours.

pub mod command;
pub mod file;
pub mod spectral;

use std::collections::VecDeque;

use crate::rng::Rng;
pub use spectral::{analyse, GraphReport};

/// A directed graph without self-edges or duplicate edges (self-loops are implied by averaging).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    n: usize,
    ins: Vec<Vec<usize>>,
    outs: Vec<Vec<usize>>,
    /// What it is, for reports ("root-expander", "file:graphs/x.txt" ...).
    pub name: String,
}

impl Graph {
    /// A graph from edges (src, dst); self-edges and duplicates are dropped (generators may
    /// produce them for small N); files are checked strictly before this.
    pub fn from_edges(n: usize, edges: impl IntoIterator<Item = (usize, usize)>, name: &str) -> Self {
        let mut ins = vec![Vec::new(); n];
        let mut outs = vec![Vec::new(); n];
        for (s, d) in edges {
            assert!(s < n && d < n, "edge {s} -> {d} outside 0..{n}");
            if s != d {
                ins[d].push(s);
                outs[s].push(d);
            }
        }
        for v in ins.iter_mut().chain(outs.iter_mut()) {
            v.sort_unstable();
            v.dedup();
        }
        Graph { n, ins, outs, name: name.to_string() }
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.n
    }
    /// Ranks that send to `i`, sorted.
    pub fn in_neighbours(&self, i: usize) -> &[usize] {
        &self.ins[i]
    }
    /// Ranks `i` sends to, sorted.
    pub fn out_neighbours(&self, i: usize) -> &[usize] {
        &self.outs[i]
    }
    /// Number of edges.
    pub fn edges(&self) -> usize {
        self.outs.iter().map(Vec::len).sum()
    }
    /// All edges (src, dst).
    pub fn edge_list(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.outs.iter().enumerate().flat_map(|(s, o)| o.iter().map(move |&d| (s, d)))
    }

    /// BFS distances from `src` along out-edges (`forward`) or in-edges; usize::MAX = unreachable.
    pub fn distances(&self, src: usize, forward: bool) -> Vec<usize> {
        let adj = if forward { &self.outs } else { &self.ins };
        let mut dist = vec![usize::MAX; self.n];
        let mut q = VecDeque::from([src]);
        dist[src] = 0;
        while let Some(u) = q.pop_front() {
            for &v in &adj[u] {
                if dist[v] == usize::MAX {
                    dist[v] = dist[u] + 1;
                    q.push_back(v);
                }
            }
        }
        dist
    }

    /// Every node reaches every other.
    pub fn strongly_connected(&self) -> bool {
        self.n <= 1 || (self.distances(0, true).iter().all(|&d| d != usize::MAX) && self.distances(0, false).iter().all(|&d| d != usize::MAX))
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
pub const KINDS: &str = "complete, star, root-expander, chain, line, ring, hypercube, exponential, torus, random:D, file:PATH";

/// Builds a graph from a spec string for `n` nodes.
pub fn generate(spec: &str, n: usize, seed: u64) -> anyhow::Result<Graph> {
    anyhow::ensure!(n >= 1, "a graph needs at least one node");
    let edges: Vec<(usize, usize)> = match spec {
        "complete" | "all-reduce" | "allreduce" => (0..n).flat_map(|i| (0..n).map(move |j| (i, j))).collect(),
        "star" | "parameter-server" => (1..n).flat_map(|i| [(0, i), (i, 0)]).collect(),
        "root-expander" | "expander" => {
            let r = (n as f64).sqrt().floor() as usize;
            (0..n).flat_map(|i| [(i, (i + 1) % n), (i, (i + r) % n)]).collect()
        }
        // ASAP Fig. 2(d): updates flow one way and need N steps to reach the last node. Not
        // strongly connected, so training refuses it; `line` is the two-way version.
        "chain" => (1..n).map(|i| (i - 1, i)).collect(),
        "line" => (1..n).flat_map(|i| [(i - 1, i), (i, i - 1)]).collect(),
        "ring" => (0..n).map(|i| (i, (i + 1) % n)).collect(),
        "hypercube" => {
            anyhow::ensure!(n.is_power_of_two(), "hypercube needs a power-of-two number of nodes, not {n}");
            let dims = n.trailing_zeros();
            (0..n).flat_map(|i| (0..dims).map(move |k| (i, i ^ (1 << k)))).collect()
        }
        "exponential" => (0..n).flat_map(|i| (0..).map(|k| 1usize << k).take_while(|&s| s < n).map(move |s| (i, (i + s) % n))).collect(),
        "torus" => {
            let rows = (1..=(n as f64).sqrt() as usize).rev().find(|r| n % r == 0).unwrap_or(1);
            let cols = n / rows;
            let id = |r: usize, c: usize| (r % rows) * cols + (c % cols);
            (0..n)
                .flat_map(|i| {
                    let (r, c) = (i / cols, i % cols);
                    [(i, id(r + 1, c)), (i, id(r + rows - 1, c)), (i, id(r, c + 1)), (i, id(r, c + cols - 1))]
                })
                .collect()
        }
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
pub fn random_regular(n: usize, d: usize, seed: u64) -> anyhow::Result<Graph> {
    if n == 1 {
        return Ok(Graph::from_edges(1, [], "random"));
    }
    anyhow::ensure!(d >= 1 && d < n, "random:{d} needs 1 <= D < nodes ({n})");
    let mut rng = Rng::new(seed);
    for _ in 0..10_000 {
        let mut edges = std::collections::HashSet::new();
        let mut ok = true;
        'perm: for _ in 0..d {
            for _ in 0..100 {
                let mut p: Vec<usize> = (0..n).collect();
                rng.shuffle(&mut p);
                if p.iter().enumerate().all(|(i, &j)| i != j && !edges.contains(&(i, j))) {
                    edges.extend(p.into_iter().enumerate());
                    continue 'perm;
                }
            }
            ok = false;
            break;
        }
        if ok {
            let g = Graph::from_edges(n, edges, &format!("random:{d}"));
            if g.strongly_connected() {
                return Ok(g);
            }
        }
    }
    anyhow::bail!("found no strongly connected random {d}-regular graph on {n} nodes")
}

/// The graph training uses: built for the actual number of ranks, analysed and logged; refused
/// when not strongly connected; a warning when in-degrees differ.
pub fn graph_for_training(spec: &str, nranks: usize, seed: u64) -> anyhow::Result<(Graph, GraphReport)> {
    let g = generate(spec, nranks, seed)?;
    let r = analyse(&g, 0);
    log::info!(
        "communication graph {} on {} ranks: {} edges, in-degree {}..{}, spectral gap {:.5} (sigma_2 {:.5}), diameter {}",
        spec, nranks, r.edges, r.min_in_degree, r.max_in_degree, r.spectral_gap, r.sigma_2,
        r.diameter.map_or("inf".into(), |d| d.to_string())
    );
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
            r.min_in_degree, r.max_in_degree
        );
    }
    Ok((g, r))
}
