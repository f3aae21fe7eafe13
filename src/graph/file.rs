//! The plain-text graph format (see graphs/README.md):
//!
//! ```text
//! # comments start with '#'
//! nodes 8
//! 0 1        # edge: rank 0 sends to rank 1
//! 0 3
//! ```

use std::fmt::Write;

use anyhow::{bail, Context};

use super::Graph;

/// Parses graph text; `path` names it in errors. `expect_nodes` (the number of ranks) must match
/// the header when given.
///
/// Duplicate edges are found from the graph's sorted rows (a duplicate makes it smaller than
/// the edge list), and only then located by a second scan with a hash set: checking every edge
/// in a hash set, and a Vec of fields per line, took about a third of `graph gap` on a
/// 4,194,304-edge file (1.7 s of 8.1 s, `perf record`).
pub fn parse(text: &str, path: &str, expect_nodes: Option<usize>) -> anyhow::Result<Graph> {
    let mut n: Option<usize> = None;
    // u32 pairs: half the memory of usize pairs (graphs have fewer than 2^32 nodes).
    let mut edges: Vec<(u32, u32)> = Vec::with_capacity(text.len() / 12);
    for (k, raw) in text.lines().enumerate() {
        let line_no = k + 1;
        let line = match raw.find('#') {
            Some(c) => &raw[..c],
            None => raw,
        }
        .trim();
        if line.is_empty() {
            continue;
        }
        let mut f = line.split_whitespace();
        let (first, second, third) = (f.next().unwrap_or(""), f.next(), f.next());
        if first == "nodes" {
            if n.is_some() {
                bail!("{path}:{line_no}: a second `nodes` line");
            }
            let v = second.and_then(|s| s.parse::<usize>().ok()).filter(|&v| v > 0 && v < u32::MAX as usize && third.is_none());
            n = Some(v.with_context(|| format!("{path}:{line_no}: expected `nodes N` with 1 <= N < 2^32, found {line:?}"))?);
            if let (Some(want), Some(have)) = (expect_nodes, n) {
                if want != have {
                    bail!("{path}:{line_no}: the graph declares {have} nodes but the job has {want} ranks; use a graph for {want} nodes");
                }
            }
            continue;
        }
        let Some(nodes) = n else {
            bail!("{path}:{line_no}: expected the header `nodes N` before the first edge");
        };
        let (Some(second), None) = (second, third) else {
            bail!("{path}:{line_no}: expected an edge `SRC DST`, found {line:?}");
        };
        let node = |s: &str| -> anyhow::Result<usize> {
            let v: usize = s.parse().with_context(|| format!("{path}:{line_no}: {s:?} is not a node number"))?;
            if v >= nodes {
                bail!("{path}:{line_no}: node {v} does not exist (nodes are 0..{})", nodes - 1);
            }
            Ok(v)
        };
        let (a, b) = (node(first)?, node(second)?);
        if a == b {
            bail!("{path}:{line_no}: self-edge {a} -> {a} (every rank already includes itself in its average)");
        }
        edges.push((a as u32, b as u32));
    }
    let Some(nodes) = n else {
        bail!("{path}: empty graph file: expected a `nodes N` line and `SRC DST` edges");
    };
    let listed = edges.len();
    // Every node of a usable graph sends and receives (strongly connected: at least N edges for
    // N > 1). Checked before anything is sized by N: the header alone could otherwise ask for
    // billions of nodes (`nodes 4294967294` wanted 64 GiB of offsets; found by tests/parsers_fuzz.rs).
    if nodes > 1 && listed < nodes {
        let line_no = text.lines().position(|l| l.split('#').next().unwrap_or("").trim().starts_with("nodes")).map_or(1, |k| k + 1);
        bail!(
            "{path}:{line_no}: the graph declares {nodes} nodes but lists {listed} edge(s): every node needs an edge in and out \
             (a strongly connected graph on {nodes} nodes has at least {nodes} edges)"
        );
    }
    let g = Graph::from_edges(nodes, edges.into_iter().map(|(a, b)| (a as usize, b as usize)), &format!("file:{path}"));
    if g.edges() < listed {
        // Every line is valid (checked above), so the first repeated pair names the line.
        let mut seen = std::collections::HashSet::new();
        for (k, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            let mut f = line.split_whitespace();
            if let (Some(a), Some(b)) = (f.next().and_then(|s| s.parse::<usize>().ok()), f.next().and_then(|s| s.parse::<usize>().ok())) {
                if !seen.insert((a, b)) {
                    bail!("{}:{}: duplicate edge {a} -> {b}", path, k + 1);
                }
            }
        }
        bail!("{path}: {} duplicate edge(s)", listed - g.edges());
    }
    Ok(g)
}

/// Reads a graph file.
pub fn read(path: &str, expect_nodes: Option<usize>) -> anyhow::Result<Graph> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read graph file {path}"))?;
    parse(&text, path, expect_nodes)
}

/// Formats a graph in the file format.
pub fn format(g: &Graph, comment: &str) -> String {
    let mut s = String::new();
    for l in comment.lines() {
        s.push_str(&format!("# {l}\n"));
    }
    s.push_str(&format!("nodes {}\n", g.nodes()));
    for (a, b) in g.edge_list() {
        writeln!(s, "{a} {b}").expect("writing to a String");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str, n: Option<usize>) -> String {
        parse(text, "g.txt", n).unwrap_err().to_string()
    }

    #[test]
    fn round_trip_and_errors_with_line_numbers() {
        let g = super::super::generate("root-expander", 8, 1).unwrap();
        let back = parse(&format(&g, "test"), "x", Some(8)).unwrap();
        assert_eq!(back.edge_list().collect::<Vec<_>>(), g.edge_list().collect::<Vec<_>>());
        assert!(err("", None).contains("empty graph file"));
        assert!(err("# only\n\n", None).contains("empty graph file"));
        assert!(err("nodes 3\n0 1\n1 x\n", None).starts_with("g.txt:3:"));
        assert!(err("nodes 3\n0 5\n", None).contains("g.txt:2: node 5 does not exist"));
        assert!(err("nodes 3\n0 1\n1 2\n2 0\n0 1\n", None).contains("g.txt:5: duplicate edge 0 -> 1"));
        assert!(err("# c\nnodes 3\n0 1\n0 1\n", None).contains("g.txt:2: the graph declares 3 nodes but lists 2 edge(s)"));
        assert!(err("nodes 4294967294\n0 1\n", None).starts_with("g.txt:1: the graph declares 4294967294 nodes"));
        assert!(err("nodes 3\n2 2\n", None).contains("g.txt:2: self-edge"));
        assert!(err("nodes 4\n0 1\n", Some(3)).contains("g.txt:1: the graph declares 4 nodes but the job has 3 ranks"));
        assert!(err("0 1\n", None).contains("g.txt:1: expected the header"));
        assert!(err("nodes 3\n0 1 2\n", None).contains("g.txt:2: expected an edge"));
    }
}
