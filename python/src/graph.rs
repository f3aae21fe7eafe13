//! Graph analysis for Python: the reports of `asap-train graph gap|search|mix --json`, computed by
//! the same functions (no MPI needed).

use asap_train::graph::command::{gap_report, search, Which};
use asap_train::graph::spectral::{analyse_with, Method};
use asap_train::graph::{mixing, Graph};
use clap::ValueEnum;
use pyo3::prelude::*;

use crate::{json_to_py, text, OptionError};

/// `--method`, as the binary spells it.
fn method(name: &str) -> PyResult<Method> {
    Method::from_str(name, false).map_err(|_| {
        let names: Vec<String> =
            Method::value_variants().iter().filter_map(|m| m.to_possible_value()).map(|v| v.get_name().to_owned()).collect();
        OptionError::new_err(format!("method {name:?} is not one of {}", names.join(", ")))
    })
}

/// `--epsilon` of the mixing estimates: in (0, 1).
fn check_epsilon(epsilon: f64) -> PyResult<()> {
    if !(epsilon > 0.0 && epsilon < 1.0) {
        return Err(OptionError::new_err(format!("epsilon must be in (0, 1), got {epsilon}")));
    }
    Ok(())
}

/// A report as a Python dict (the JSON `--json` prints, parsed).
fn to_dict<T: serde::Serialize>(py: Python<'_>, r: &T) -> PyResult<Py<PyAny>> {
    let v = serde_json::to_value(r).map_err(|e| crate::Error::new_err(e.to_string()))?;
    Ok(json_to_py(py, &v)?.unbind())
}

/// `asap-train graph gap --kind KIND --nodes N [--file PATH] --seed S --model-bytes B --method M
/// --epsilon E --json`, as a dict.
#[pyfunction]
#[pyo3(signature = (kind="root-expander", nodes=None, file=None, seed=1, model_bytes=0, method="auto", epsilon=1e-3))]
pub fn graph_gap(
    py: Python<'_>,
    kind: &str,
    nodes: Option<usize>,
    file: Option<String>,
    seed: u64,
    model_bytes: u64,
    method: &str,
    epsilon: f64,
) -> PyResult<Py<PyAny>> {
    check_epsilon(epsilon)?;
    let which = Which { kind: kind.to_owned(), nodes, file, seed };
    let m = self::method(method)?;
    let r = py.detach(|| gap_report(&which, model_bytes, m, epsilon)).map_err(|e| OptionError::new_err(text(&e)))?;
    to_dict(py, &r)
}

/// The same report for a graph given by its edges: `edges` is a sequence of (source, target)
/// pairs (an (E, 2) integer array works) over `nodes` nodes; self-loops and repeats are ignored,
/// as in a graph file.
#[pyfunction]
#[pyo3(signature = (nodes, edges, model_bytes=0, method="auto", epsilon=1e-3, name="edges"))]
pub fn graph_gap_edges(
    py: Python<'_>,
    nodes: usize,
    edges: Vec<(usize, usize)>,
    model_bytes: u64,
    method: &str,
    epsilon: f64,
    name: &str,
) -> PyResult<Py<PyAny>> {
    check_epsilon(epsilon)?;
    if nodes == 0 {
        return Err(OptionError::new_err("a graph needs at least one node"));
    }
    if let Some((i, (a, b))) = edges.iter().enumerate().find(|(_, (a, b))| *a >= nodes || *b >= nodes) {
        return Err(OptionError::new_err(format!("edge {i} ({a}, {b}) names a node outside 0..{nodes}")));
    }
    let m = self::method(method)?;
    let r = py.detach(|| analyse_with(&Graph::from_edges(nodes, edges, name), model_bytes, m, epsilon));
    to_dict(py, &r)
}

/// A graph's directed edges (from, to).
type EdgeList = Vec<(usize, usize)>;

/// `asap-train graph search --nodes N --out-degree K`: the out-degree-K graph with the largest
/// spectral gap found. Returns (edges as a list of pairs, its report).
#[pyfunction]
#[pyo3(signature = (nodes, out_degree, candidates=500, seed=1))]
pub fn graph_search(py: Python<'_>, nodes: usize, out_degree: usize, candidates: usize, seed: u64) -> PyResult<(EdgeList, Py<PyAny>)> {
    if nodes < 2 {
        return Err(OptionError::new_err(format!("search needs at least 2 nodes, got {nodes}")));
    }
    let (g, r, _tried) = py.detach(|| search(nodes, out_degree, candidates, seed)).map_err(|e| OptionError::new_err(text(&e)))?;
    Ok((g.edge_list().collect(), to_dict(py, &r)?))
}

/// `asap-train graph mix --kinds K1,K2 --nodes N --json`: the simulated averaging's rounds to
/// EPSILON next to the spectral prediction, one dict per graph (with "error" for a graph that
/// could not be built, as the binary prints).
#[pyfunction]
#[pyo3(signature = (kinds, nodes, epsilon=1e-3, max_rounds=100_000, max_seconds=60.0, seed=1))]
pub fn graph_mix(
    py: Python<'_>,
    kinds: Vec<String>,
    nodes: usize,
    epsilon: f64,
    max_rounds: u64,
    max_seconds: f64,
    seed: u64,
) -> PyResult<Vec<Py<PyAny>>> {
    check_epsilon(epsilon)?;
    if nodes == 0 {
        return Err(OptionError::new_err("nodes must be at least 1"));
    }
    let mut out = Vec::new();
    for kind in &kinds {
        let v = match py.detach(|| mixing::mix(kind, nodes, seed, epsilon, max_rounds, max_seconds)) {
            Ok(r) => serde_json::to_value(&r).map_err(|e| crate::Error::new_err(e.to_string()))?,
            Err(e) => serde_json::json!({"graph": kind, "nodes": nodes, "error": e.to_string()}),
        };
        out.push(json_to_py(py, &v)?.unbind());
    }
    Ok(out)
}
