//! `asap-train graph gap|compare|search|mix|dot|export`: reason about a communication graph
//! before spending cluster time on it.

use clap::{Args, Subcommand};

use super::mixing::{mix, MixReport};
use super::spectral::{analyse_with, complete_report, one_peer_report, sigma_2, GraphReport, Method, DENSE_LIMIT};
use super::{file, generate, random_regular, Cayley, Graph, ONE_PEER_EXPONENTIAL};
use crate::rng::Rng;

/// Analyse communication graphs.
#[derive(Args, Debug)]
pub struct GraphArgs {
    #[command(subcommand)]
    pub command: GraphCommand,
}

/// Which graph: a generator and a size, or a file.
#[derive(Args, Debug, Clone)]
pub struct Which {
    /// Generator: complete, star, root-expander, chain (one-way, open), line (two-way chain),
    /// ring, hypercube, exponential, torus, random:D (D-regular, seeded), auto (what training
    /// picks for --nodes ranks), file:PATH, or (for `gap` only) one-peer-exponential, the
    /// time-varying graph whose one-period product is reported.
    #[arg(long, default_value = "root-expander")]
    pub kind: String,
    /// Number of nodes (ranks); with --file, checked against the file's header if given.
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Read the graph from a file (see graphs/README.md); overrides --kind.
    #[arg(long)]
    pub file: Option<String>,
    /// Seed for random graphs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl Which {
    fn build(&self) -> anyhow::Result<Graph> {
        match (&self.file, self.nodes) {
            (Some(f), n) => file::read(f, n),
            (None, Some(n)) => generate(&self.kind, n, self.seed),
            (None, None) if self.kind.starts_with("file:") => file::read(&self.kind[5..], None),
            (None, None) => anyhow::bail!("give --nodes N (or --file PATH)"),
        }
    }
}

/// True for the spellings of the complete graph.
fn is_complete(kind: &str) -> bool {
    matches!(kind, "complete" | "all-reduce" | "allreduce")
}

/// The report of generator `kind` on `n` nodes: the complete graph above DENSE_LIMIT nodes by
/// its closed form (it has n(n - 1) edges), everything else built and analysed.
fn generated_report(kind: &str, n: usize, seed: u64, model_bytes: u64, method: Method, epsilon: f64) -> anyhow::Result<GraphReport> {
    if is_complete(kind) && n > DENSE_LIMIT && method == Method::Auto {
        return Ok(complete_report(n, model_bytes, epsilon));
    }
    Ok(analyse_with(&generate(kind, n, seed)?, model_bytes, method, epsilon))
}

/// The `graph` subcommands.
#[derive(Subcommand, Debug)]
pub enum GraphCommand {
    /// Spectral gap and structure of one graph (sparse methods: a million nodes in seconds).
    Gap {
        #[command(flatten)]
        which: Which,
        /// Bytes of one model, to report the traffic of one round over all edges.
        #[arg(long, default_value_t = 0)]
        model_bytes: u64,
        /// Singular value method.
        #[arg(long, value_enum, default_value_t = Method::Auto)]
        method: Method,
        /// Tolerance of the mixing estimate: rounds until sigma_2^t < EPSILON (0 < EPSILON < 1).
        #[arg(long, default_value_t = 1e-3, value_parser = crate::values::open_unit_interval, allow_negative_numbers = true)]
        epsilon: f64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// ASAP Figure 2: all-reduce, parameter server, root expander and chain side by side.
    Compare {
        /// Sizes to compare.
        #[arg(long, value_delimiter = ',', default_value = "6,25,32")]
        nodes: Vec<usize>,
        /// Bytes of one model (default: Fashion-MNIST softmax regression, 7,850 f32).
        #[arg(long, default_value_t = 31_400)]
        model_bytes: u64,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Look for the graph with the largest spectral gap at a given out-degree and write it.
    Search {
        /// Number of nodes.
        #[arg(long)]
        nodes: usize,
        /// Out-degree of every node.
        #[arg(long)]
        out_degree: usize,
        /// Random regular candidates to try (circulants are tried exhaustively when few).
        #[arg(long, default_value_t = 500)]
        candidates: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where to write the best graph (graph file format).
        #[arg(long)]
        out: Option<String>,
    },
    /// Simulate the averaging x_{t+1} = W_t x_t (one process, no MPI) from a seeded random start
    /// and print the rounds until the consensus distance ||x - mean|| fell by EPSILON, next to
    /// the spectral-gap prediction ceil(ln EPSILON / ln sigma_2): how to pick a graph for
    /// thousands of ranks before asking for the allocation.
    Mix {
        /// Graphs to compare, comma-separated: generators as for `gap --kind` (random:D,
        /// file:PATH ...) and one-peer-exponential (round k: i sends to i + 2^(k mod log2 N)).
        #[arg(long, value_delimiter = ',', default_value = "exponential,one-peer-exponential,random:4,hypercube,root-expander,torus")]
        kinds: Vec<String>,
        /// Number of nodes (ranks).
        #[arg(long)]
        nodes: usize,
        /// Stop when the consensus distance is EPSILON times the starting one (0 < EPSILON < 1).
        #[arg(long, default_value_t = 1e-3, value_parser = crate::values::open_unit_interval, allow_negative_numbers = true)]
        epsilon: f64,
        /// Give up on a graph after this many simulated rounds.
        #[arg(long, default_value_t = 100_000)]
        max_rounds: u64,
        /// Give up on a graph after this many seconds of simulation.
        #[arg(long, default_value_t = 60.0)]
        max_seconds: f64,
        /// Seed of random graphs and of the starting vector.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Graphviz DOT of a graph.
    Dot {
        #[command(flatten)]
        which: Which,
    },
    /// Write a generated graph in the graph file format (to edit it or train on it as file:PATH).
    Export {
        #[command(flatten)]
        which: Which,
        /// Output file (default: standard output).
        #[arg(long)]
        out: Option<String>,
    },
}

fn table(r: &GraphReport) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut s = String::new();
    let mut row = |k: &str, v: String| s.push_str(&format!("{k:<22} {v}\n"));
    row("graph", r.name.clone());
    row("nodes", r.nodes.to_string());
    row("edges", r.edges.to_string());
    row("in-degree", format!("{}..{}", r.min_in_degree, r.max_in_degree));
    row("out-degree", format!("{}..{}", r.min_out_degree, r.max_out_degree));
    row("regular", yes(r.regular).into());
    row("doubly stochastic", yes(r.doubly_stochastic).into());
    row("strongly connected", yes(r.strongly_connected).into());
    row("diameter", r.diameter_text());
    row("sigma_1(P)", format!("{:.6}", r.sigma_1));
    row("sigma_2(P)", format!("{:.6}", r.sigma_2));
    row("spectral gap", format!("{:.6}", r.spectral_gap));
    row("SLEM (eigenvalues)", r.slem.map_or("not computed (> 256 nodes and not a Cayley graph)".into(), |v| format!("{v:.6}")));
    row("mixing rounds", r.mixing_rounds.map_or("never (gap 0)".into(), |t| format!("{t} (sigma_2^t < {})", r.epsilon)));
    if let Some(b) = r.bytes_per_round {
        row("bytes per round", format!("{b} ({:.2} MB)", b as f64 / 1e6));
    }
    let steps = match (r.iterations, r.residual) {
        (Some(k), Some(res)) => format!(", {k} steps, residual {res:.1e}{}", if r.converged { "" } else { ", NOT converged" }),
        _ => String::new(),
    };
    row("method", format!("{} ({:.3} s{steps})", r.method, r.seconds));
    s
}

fn mix_row(r: &MixReport) -> String {
    let measured = match r.measured_rounds {
        Some(m) => m.to_string(),
        None => format!("> {}", r.simulated_rounds),
    };
    format!(
        "{:<44} {:>9} {:>5} {:>10.3e} {:>10} {:>10} {:>8.2}",
        r.graph,
        r.nodes,
        r.sends_per_round,
        r.spectral_gap,
        r.predicted_rounds.map_or("never".into(), |p| p.to_string()),
        measured,
        r.analysis_seconds + r.simulation_seconds
    )
}

/// Best graph found by `search`: circulants (i -> i + s for a set of shifts) and random regular
/// graphs, by spectral gap.
pub fn search(n: usize, k: usize, candidates: usize, seed: u64) -> anyhow::Result<(Graph, GraphReport, usize)> {
    anyhow::ensure!(n >= 2, "--nodes must be at least 2, got {n}: a graph to search connects two or more ranks");
    anyhow::ensure!(k >= 1 && k < n, "--out-degree must be in 1..{}", n - 1);
    let mut best: Option<(Graph, f64)> = None;
    let mut tried = 0;
    // Candidates are ranked by sigma_2 alone (a full analysis of each would compute diameters
    // and, up to 1,024 nodes, all eigenvalues: minutes at 1,024 nodes).
    let mut consider = |g: Graph, tried: &mut usize| {
        *tried += 1;
        let gap = 1.0 - sigma_2(&g);
        if best.as_ref().is_none_or(|(_, b)| gap > *b + 1e-12) {
            best = Some((g, gap));
        }
    };
    // Circulants: all shift sets when there are few, random ones otherwise.
    let mut rng = Rng::new(seed);
    let shift_sets: Vec<Vec<usize>> = if binomial(n - 1, k) <= 5_000 {
        combinations(n - 1, k).into_iter().map(|c| c.into_iter().map(|s| s + 1).collect()).collect()
    } else {
        (0..candidates)
            .map(|_| {
                let mut v: Vec<usize> = (1..n).collect();
                rng.shuffle(&mut v);
                v.truncate(k);
                v
            })
            .collect()
    };
    for shifts in shift_sets {
        let edges = (0..n).flat_map(|i| shifts.iter().map(move |&s| (i, (i + s) % n)));
        let cayley = Cayley::new(vec![n], shifts.iter().map(|&s| vec![s]));
        let g = Graph::from_edges(n, edges, &format!("circulant shifts {shifts:?}")).with_cayley(cayley);
        consider(g, &mut tried);
    }
    for c in 0..candidates {
        if let Ok(mut g) = random_regular(n, k, seed.wrapping_add(c as u64 * 7919)) {
            g.name = format!("random {k}-regular (seed {})", seed.wrapping_add(c as u64 * 7919));
            consider(g, &mut tried);
        }
    }
    let (mut g, _) = best.expect("at least one candidate");
    let mut r = analyse_with(&g, 0, Method::Auto, 1e-3);
    // Hill climbing from the best candidate: swap the heads of two edges (a->b, c->d becomes
    // a->d, c->b), which keeps every in- and out-degree, and keep swaps that widen the gap.
    let n_swaps = if n <= 256 { 2000 } else { 0 };
    let mut edges: Vec<(usize, usize)> = g.edge_list().collect();
    for _ in 0..n_swaps {
        let (x, y) = (rng.below(edges.len()), rng.below(edges.len()));
        let ((a, b), (c, d)) = (edges[x], edges[y]);
        if x == y || a == d || c == b || edges.contains(&(a, d)) || edges.contains(&(c, b)) {
            continue;
        }
        let mut cand = edges.clone();
        cand[x] = (a, d);
        cand[y] = (c, b);
        let h = Graph::from_edges(n, cand.iter().copied(), "swapped");
        tried += 1;
        if !h.strongly_connected() {
            continue;
        }
        let hr = analyse_with(&h, 0, Method::Auto, 1e-3);
        if hr.spectral_gap > r.spectral_gap + 1e-12 {
            edges = cand;
            g = h;
            r = hr;
            g.name = format!("{k}-regular graph improved by degree-preserving edge swaps");
            r.name = g.name.clone();
        }
    }
    Ok((g, r, tried))
}

fn binomial(n: usize, k: usize) -> usize {
    (0..k).fold(1usize, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    fn rec(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            cur.push(i);
            rec(i + 1, n, k, cur, out);
            cur.pop();
        }
    }
    rec(0, n, k, &mut cur, &mut out);
    out
}

/// What `graph gap` reports for `which` (the Python package's `graph_gap` returns the same).
pub fn gap_report(which: &Which, model_bytes: u64, method: Method, epsilon: f64) -> anyhow::Result<GraphReport> {
    if which.kind == ONE_PEER_EXPONENTIAL && which.file.is_none() {
        let n = which.nodes.ok_or_else(|| anyhow::anyhow!("give --nodes N"))?;
        anyhow::ensure!(n >= 1, "a graph needs at least one node");
        let mut r = one_peer_report(n, epsilon);
        r.bytes_per_round = (model_bytes > 0).then(|| model_bytes * r.edges as u64);
        Ok(r)
    } else if let (None, Some(n)) = (&which.file, which.nodes) {
        generated_report(&which.kind, n, which.seed, model_bytes, method, epsilon)
    } else {
        Ok(analyse_with(&which.build()?, model_bytes, method, epsilon))
    }
}

/// Runs a `graph` subcommand.
pub fn run(args: &GraphArgs) -> anyhow::Result<()> {
    match &args.command {
        GraphCommand::Gap { which, model_bytes, method, epsilon, json } => {
            let r = gap_report(which, *model_bytes, *method, *epsilon)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", table(&r));
            }
        }
        GraphCommand::Compare { nodes, model_bytes, json } => {
            let kinds = [("all-reduce", "complete"), ("parameter server", "star"), ("root expander", "root-expander"), ("chain", "chain")];
            if !*json {
                print!("{:<18}", "graph");
                for n in nodes {
                    print!(" | {:>7} {:>6} {:>10}", format!("gap@{n}"), "outdeg", "MB/round");
                }
                println!();
            }
            for (label, kind) in kinds {
                if !*json {
                    print!("{label:<18}");
                }
                for &n in nodes {
                    let r = generated_report(kind, n, 1, *model_bytes, Method::Auto, 1e-3)?;
                    if *json {
                        println!("{}", serde_json::json!({"graph": label, "nodes": n, "report": r}));
                    } else {
                        print!(" | {:>7.4} {:>6} {:>10.3}", r.spectral_gap, r.max_out_degree, r.bytes_per_round.unwrap_or(0) as f64 / 1e6);
                    }
                }
                if !*json {
                    println!();
                }
            }
        }
        GraphCommand::Search { nodes, out_degree, candidates, seed, out } => {
            let (g, r, tried) = search(*nodes, *out_degree, *candidates, *seed)?;
            let root = analyse_with(&generate("root-expander", *nodes, 1)?, 0, Method::Auto, 1e-3);
            println!(
                "tried {tried} candidates; best: {} with spectral gap {:.6} (root expander: {:.6})",
                r.name, r.spectral_gap, root.spectral_gap
            );
            let text = file::format(
                &g,
                &format!(
                    "{}\nfound by: asap-train graph search --nodes {nodes} --out-degree {out_degree} --seed {seed}\nspectral gap {:.6}",
                    r.name, r.spectral_gap
                ),
            );
            match out {
                Some(p) => {
                    std::fs::write(p, text).map_err(|e| anyhow::anyhow!("cannot write {p}: {e}"))?;
                    println!("written to {p} (train on it with --graph file:{p})");
                }
                None => print!("{text}"),
            }
        }
        GraphCommand::Mix { kinds, nodes, epsilon, max_rounds, max_seconds, seed, json } => {
            anyhow::ensure!(*nodes >= 1, "--nodes must be at least 1");
            if !*json {
                println!(
                    "{:<44} {:>9} {:>5} {:>10} {:>10} {:>10} {:>8}",
                    "graph", "nodes", "sends", "gap", "predicted", "measured", "seconds"
                );
            }
            for kind in kinds {
                match mix(kind, *nodes, *seed, *epsilon, *max_rounds, *max_seconds) {
                    Ok(r) if *json => println!("{}", serde_json::to_string(&r)?),
                    Ok(r) => println!("{}", mix_row(&r)),
                    Err(e) if *json => println!("{}", serde_json::json!({"graph": kind, "nodes": nodes, "error": e.to_string()})),
                    Err(e) => println!("{kind:<44} skipped: {e}"),
                }
            }
            if !*json {
                println!(
                    "predicted: ceil(ln {epsilon} / ln sigma_2) rounds (x the period for time-varying graphs), a bound for \
                     doubly stochastic graphs; measured: rounds until ||x_t - mean|| <= {epsilon} ||x_0 - mean|| from a \
                     seeded N(0,1) start (seed {seed})"
                );
            }
        }
        GraphCommand::Dot { which } => print!("{}", which.build()?.to_dot()),
        GraphCommand::Export { which, out } => {
            let g = which.build()?;
            let r = analyse_with(&g, 0, Method::Auto, 1e-3);
            let text = file::format(
                &g,
                &format!(
                    "{} on {} nodes, spectral gap {:.6}\nmade by: asap-train graph export --kind {} --nodes {}",
                    which.kind,
                    g.nodes(),
                    r.spectral_gap,
                    which.kind,
                    g.nodes()
                ),
            );
            match out {
                Some(p) => std::fs::write(p, text).map_err(|e| anyhow::anyhow!("cannot write {p}: {e}"))?,
                None => print!("{text}"),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_beats_or_matches_the_root_expander() {
        let (_, r, tried) = search(16, 2, 20, 3).unwrap();
        let root = analyse_with(&generate("root-expander", 16, 1).unwrap(), 0, Method::Auto, 1e-3);
        assert!(tried > 100 && r.spectral_gap >= root.spectral_gap - 1e-12);
        assert_eq!(combinations(4, 2).len(), 6);
        assert_eq!(binomial(31, 2), 465);
    }

    #[test]
    fn generators_have_the_promised_shape() {
        for n in [1usize, 2, 5, 8, 25] {
            for kind in ["complete", "star", "root-expander", "line", "ring", "exponential", "torus"] {
                let g = generate(kind, n, 1).unwrap();
                assert_eq!(g.nodes(), n);
                assert!(g.strongly_connected(), "{kind} {n}");
            }
        }
        let r = generate("root-expander", 25, 1).unwrap();
        assert_eq!(r.out_neighbours(0), &[1, 5]);
        assert_eq!(r.in_neighbours(0), &[20, 24]);
        assert_eq!(generate("exponential", 8, 1).unwrap().out_neighbours(3), &[4, 5, 7]);
        assert!(generate("hypercube", 6, 1).is_err());
        assert!(generate("nonsense", 6, 1).unwrap_err().to_string().contains("root-expander"));
        let g = generate("random:3", 20, 9).unwrap();
        assert!((0..20).all(|i| g.in_neighbours(i).len() == 3 && g.out_neighbours(i).len() == 3));
    }
}
