//! Property tests of the input parsers (issue 11, item 4): LIBSVM, ratings, IDX, graph files and
//! config files. Each parser gets at least 100,000 generated inputs in total (`CASES` below; the
//! environment variable ASAP_TRAIN_FUZZ_CASES scales them up or down), of two kinds:
//!
//! - planted: a valid file in which the generator may corrupt chosen lines in ways known to be
//!   wrong. The oracle is the generator itself: a clean file must parse to exactly what was
//!   written (on 1 to 4 ranks, the shards concatenated), and a corrupted one must fail naming
//!   `file:LINE:COL` of the first corrupted line and column (each rank naming a corrupted line
//!   of its own shard);
//! - noise: arbitrary bytes drawn from an alphabet of the format's own characters. The oracle is
//!   weaker: no panic (proptest reports one as a failure), every case ends (each case is timed),
//!   and an error names the file and, for text, a line that exists.
//!
//! No MPI: the parsers are the pure `data`/`graph`/`config` layers, sharded as the training
//! start-up shards them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use asap_train::config::TrainConfig;
use asap_train::data::{idx, text, DataError, Features};
use asap_train::graph;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Generated cases per kind (planted, noise) and parser: at least 100,000 per parser in total.
const CASES: u32 = 50_000;

/// No single parse may use more CPU than this (quadratic work on a tiny input). CPU time of the
/// test's thread, not wall time: beside two CPU burners and five compiling jobs (load 20-23), a
/// clean 3-line LIBSVM file and a gzip IDX header took 2.50 s and 2.52 s of wall time, which a
/// starved thread spends waiting for a core, not parsing.
const CASE_LIMIT: Duration = Duration::from_secs(2);

/// The hang guard: a parse that never ends is caught by wall time, at a limit no schedule reaches.
const CASE_WALL_LIMIT: Duration = Duration::from_secs(120);

/// CPU time (user + system) of the calling thread so far, from /proc/thread-self/stat (fields 14
/// and 15, in clock ticks of 10 ms: USER_HZ is 100 on Linux).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat");
    // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
    let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn cases(scale: u32) -> u32 {
    let base = std::env::var("ASAP_TRAIN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(CASES);
    (base * scale).max(1)
}

fn runner(n: u32) -> TestRunner {
    TestRunner::new(Config { cases: n, failure_persistence: None, max_shrink_iters: 2000, ..Config::default() })
}

/// A scratch directory for this test's files (one file per parser, rewritten each case): in
/// memory (/dev/shm) where there is one, since every case writes and reads a file.
fn dir(name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.join(format!("asap-train-fuzz-{}", std::process::id()))
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("parsers-fuzz")
    };
    let d = base.join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Removes a [`dir`] when a test ends.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        // The per-process parent goes with the last test that used it.
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let (t, cpu) = (Instant::now(), thread_cpu());
    let r = f();
    let used = thread_cpu().saturating_sub(cpu);
    assert!(used < CASE_LIMIT, "{what} used {used:?} of CPU ({:?} of wall time)", t.elapsed());
    assert!(t.elapsed() < CASE_WALL_LIMIT, "{what} took {:?} of wall time", t.elapsed());
    r
}

/// Every error of a text parser names `path:LINE:COL` with an existing line, or at least `path:`.
fn names_place(e: &DataError, path: &str, lines: usize) {
    let shown = e.to_string();
    assert!(shown.starts_with(&format!("{path}:")), "error does not name the file: {shown}");
    if let Some(l) = e.line {
        assert!(l >= 1 && l <= lines.max(1), "line {l} of a {lines}-line file: {shown}");
        assert!(e.column.is_some_and(|c| c >= 1), "a line without a column: {shown}");
    }
}

/// Shards of a text file on `n` ranks, as training reads them.
fn shards<T>(path: &str, n: usize, read: impl Fn(text::TextRange) -> Result<T, DataError>) -> Vec<Result<T, DataError>> {
    match text::plan_serial(path, n) {
        Ok(ranges) => ranges.into_iter().map(read).collect(),
        Err(e) => vec![Err(e)],
    }
}

// ---------------------------------------------------------------------------------------------
// LIBSVM

/// One line of a planted LIBSVM file: label, strictly increasing 1-based features, and maybe
/// a defect (which token, which kind).
#[derive(Clone, Debug)]
struct SvmLine {
    label: i32,
    feats: Vec<(u32, i32)>,
    comment: bool,
    defect: Option<(usize, u8)>,
}

fn svm_line() -> impl Strategy<Value = SvmLine> {
    (
        -3i32..10,
        prop::collection::btree_map(1u32..60, -1000i32..1000, 0..6),
        any::<bool>(),
        prop::option::weighted(0.15, (0usize..8, 0u8..9)),
    )
        .prop_map(|(label, feats, comment, defect)| SvmLine { label, feats: feats.into_iter().collect(), comment, defect })
}

/// Renders a line; returns its text and, when it is defective, the 1-based column the parser
/// must name. The defective token replaces feature `at` (or the label) and ends the line.
/// Defects: 0 a label that is no number, 1 NaN label, 2 index 0, 3 an index not above the
/// previous one, 4 a missing colon, 5 a value that is no number, 6 an infinite value, 7 an index
/// above 2^32, 8 a fractional index.
fn render_svm(l: &SvmLine) -> (String, Option<usize>) {
    let mut toks: Vec<String> = vec![l.label.to_string()];
    toks.extend(l.feats.iter().map(|(i, v)| format!("{i}:{}", *v as f32 / 8.0)));
    let mut col = None;
    if let Some((at, kind)) = l.defect {
        let pos = if kind <= 1 { 0 } else { 1 + at % (l.feats.len() + 1) };
        // Index of the feature before `pos` (0 when there is none).
        let prev = if pos >= 2 { l.feats[pos - 2].0 } else { 0 };
        // Without a previous feature, "not above the previous" becomes index 0.
        let kind = if kind == 3 && prev == 0 { 2 } else { kind };
        let bad = match kind {
            0 => "yes".to_string(),
            1 => "nan".to_string(),
            2 => "0:1".to_string(),
            3 => format!("{prev}:1"),
            4 => "17".to_string(),
            5 => format!("{}:x", prev + 1000),
            6 => format!("{}:inf", prev + 1000),
            7 => format!("{}:1", 1u64 << 33),
            _ => format!("{}.5:1", prev + 1000),
        };
        toks.truncate(pos);
        let c = toks.iter().map(|t| t.len() + 1).sum::<usize>() + 1;
        // Values are named at their own column (after the colon).
        col = Some(if matches!(kind, 5 | 6) { c + bad.find(':').unwrap() + 1 } else { c });
        toks.push(bad);
    }
    let mut s = toks.join(" ");
    if l.comment {
        s.push_str(" # note");
    }
    (s, col)
}

#[test]
fn libsvm_planted_defects_are_named_and_clean_files_parse_exactly() {
    let d = dir("libsvm");
    let _cleanup = Cleanup(d.clone());
    let path = d.join("planted.svm");
    let path = path.to_str().unwrap();
    let strategy = (prop::collection::vec(prop::option::weighted(0.9, svm_line()), 1..12), 1usize..=4);
    runner(cases(1))
        .run(&strategy, |(lines, nranks)| {
            let mut textv = Vec::new();
            let mut want = Vec::new(); // (label, feats) of each example line, in order
            let mut first_bad: Option<(usize, usize)> = None;
            let mut bad_lines = Vec::new();
            for (k, l) in lines.iter().enumerate() {
                match l {
                    None => textv.push("# a comment line".to_string()),
                    Some(l) => {
                        let (s, col) = render_svm(l);
                        if let Some(c) = col {
                            first_bad.get_or_insert((k + 1, c));
                            bad_lines.push((k + 1, c));
                        }
                        want.push((l.label as f32, l.feats.iter().map(|&(i, v)| (i - 1, v as f32 / 8.0)).collect::<Vec<_>>()));
                        textv.push(s);
                    }
                }
            }
            std::fs::write(path, textv.join("\n") + "\n").unwrap();
            let nlines = textv.len();
            // One rank: the first defect, exactly.
            let whole = timed("read_libsvm", || text::read_libsvm(path, 0, 1, None));
            match (&whole, first_bad) {
                (Ok(ds), None) => {
                    let Features::Sparse(c) = &ds.features else { panic!("not sparse") };
                    let got: Vec<(f32, Vec<(u32, f32)>)> = (0..ds.len())
                        .map(|r| (ds.labels[r], (c.indptr[r]..c.indptr[r + 1]).map(|j| (c.indices[j], c.data[j])).collect()))
                        .collect();
                    prop_assert_eq!(&got, &want);
                }
                (Err(e), Some((line, col))) => {
                    names_place(e, path, nlines);
                    prop_assert_eq!((e.line, e.column), (Some(line), Some(col)), "{}\n{}", e, textv.join("\n"));
                }
                (r, want) => prop_assert!(false, "expected defect {:?}, got {:?}\n{}", want, r.as_ref().map(|d| d.len()), textv.join("\n")),
            }
            // Several ranks: each shard parses or names a defect of its own.
            let parts = timed("sharded read_libsvm", || {
                shards(path, nranks, |r| text::read_libsvm_range(path, r, None, asap_train::data::ZeroBased::False))
            });
            let mut rows = 0;
            for p in &parts {
                match p {
                    Ok(ds) => rows += ds.len(),
                    Err(e) => {
                        names_place(e, path, nlines);
                        prop_assert!(
                            bad_lines.contains(&(e.line.unwrap(), e.column.unwrap())),
                            "{} is no planted defect {:?}",
                            e,
                            bad_lines
                        );
                    }
                }
            }
            if first_bad.is_none() {
                prop_assert_eq!(rows, want.len());
            } else {
                prop_assert!(
                    parts.iter().any(|p| p.as_ref().is_err_and(|e| e.line == Some(first_bad.unwrap().0))),
                    "nobody named the first defect"
                );
            }
            Ok(())
        })
        .unwrap();
}

/// Bytes from the LIBSVM alphabet (and a few others): arbitrary lines.
fn noise(alphabet: &'static [u8], max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(alphabet), 0..max)
}

const SVM_ALPHABET: &[u8] = b"0123456789:: \t\n\n\n+-.eE#qid,nafi\r\xff\x00";

#[test]
fn libsvm_noise_never_panics_and_errors_name_an_existing_line() {
    let d = dir("libsvm");
    let _cleanup = Cleanup(d.clone());
    let path = d.join("noise.svm");
    let path = path.to_str().unwrap();
    runner(cases(1))
        .run(&(noise(SVM_ALPHABET, 120), 1usize..=3), |(bytes, nranks)| {
            std::fs::write(path, &bytes).unwrap();
            let nlines = bytes.split(|&b| b == b'\n').count();
            for p in timed("noise read_libsvm", || {
                shards(path, nranks, |r| text::read_libsvm_range(path, r, None, asap_train::data::ZeroBased::False))
            }) {
                match p {
                    Ok(ds) => {
                        let Features::Sparse(c) = &ds.features else { panic!() };
                        prop_assert_eq!(c.indptr.len(), ds.len() + 1);
                        prop_assert!(c.data.iter().chain(&ds.labels).all(|v| v.is_finite()));
                    }
                    Err(e) => names_place(&e, path, nlines),
                }
            }
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Ratings

#[test]
fn ratings_planted_defects_are_named_and_clean_files_parse_exactly() {
    let d = dir("ratings");
    let _cleanup = Cleanup(d.clone());
    let path = d.join("planted.ratings");
    let path = path.to_str().unwrap();
    // (user, item, rating*2, defect kind: 0 none; 1 negative user; 2 fractional item; 3 two
    // fields; 4 NaN rating; 5 an item id above 2^32; 6 a word for a user)
    let line = (0u32..50, 0u32..50, 0u8..11, prop::sample::select(vec![0u8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6]));
    runner(cases(1))
        .run(&(prop::collection::vec(line, 1..10), 1usize..=4), |(lines, nranks)| {
            let mut textv = Vec::new();
            let mut bad = Vec::new();
            for (k, &(u, i, r, defect)) in lines.iter().enumerate() {
                let r = r as f32 / 2.0;
                let (s, col) = match defect {
                    1 => (format!("-{} {i} {r}", u + 1), Some(1)),
                    2 => (format!("{u} {i}.5 {r}"), Some(u.to_string().len() + 2)),
                    3 => (format!("{u}  {i}"), Some(1)),
                    4 => (format!("{u} {i} NaN"), Some(u.to_string().len() + i.to_string().len() + 3)),
                    5 => (format!("{u} 99999999999 {r}"), Some(u.to_string().len() + 2)),
                    6 => (format!("alice {i} {r}"), Some(1)),
                    _ => (format!("{u} {i} {r}"), None),
                };
                if let Some(c) = col {
                    bad.push((k + 1, c));
                }
                textv.push(s);
            }
            std::fs::write(path, textv.join("\n") + "\n").unwrap();
            match (timed("read_ratings", || text::read_ratings(path, 0, 1)), bad.first()) {
                (Ok(ds), None) => {
                    let Features::Ratings { users, items, .. } = &ds.features else { panic!() };
                    let got: Vec<(u32, u32, f32)> = (0..ds.len()).map(|k| (users[k], items[k], ds.labels[k])).collect();
                    let want: Vec<(u32, u32, f32)> = lines.iter().map(|&(u, i, r, _)| (u, i, r as f32 / 2.0)).collect();
                    prop_assert_eq!(got, want);
                }
                (Err(e), Some(&(line, col))) => {
                    names_place(&e, path, textv.len());
                    prop_assert_eq!((e.line, e.column), (Some(line), Some(col)), "{}\n{}", e, textv.join("\n"));
                }
                (r, b) => prop_assert!(false, "expected {:?}, got {:?}\n{}", b, r.map(|d| d.len()), textv.join("\n")),
            }
            let parts = timed("sharded read_ratings", || shards(path, nranks, |r| text::read_ratings_range(path, r)));
            let rows: usize = parts.iter().filter_map(|p| p.as_ref().ok()).map(|d| d.len()).sum();
            for e in parts.iter().filter_map(|p| p.as_ref().err()) {
                names_place(e, path, textv.len());
                prop_assert!(bad.contains(&(e.line.unwrap(), e.column.unwrap())), "{} is no planted defect {:?}", e, bad);
            }
            if bad.is_empty() {
                prop_assert_eq!(rows, lines.len());
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn ratings_noise_never_panics_and_errors_name_an_existing_line() {
    let d = dir("ratings");
    let _cleanup = Cleanup(d.clone());
    let path = d.join("noise.ratings");
    let path = path.to_str().unwrap();
    runner(cases(1))
        .run(&(noise(b"0123456789 \t\n\n.-+e,#nai\r\xff", 80), 1usize..=3), |(bytes, nranks)| {
            std::fs::write(path, &bytes).unwrap();
            let nlines = bytes.split(|&b| b == b'\n').count();
            for p in timed("noise read_ratings", || shards(path, nranks, |r| text::read_ratings_range(path, r))) {
                if let Err(e) = p {
                    names_place(&e, path, nlines);
                }
            }
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// IDX

/// An IDX file: magic type byte, dimensions, payload length, gzip or not; and its labels.
#[derive(Clone, Debug)]
struct Idx {
    magic: [u8; 4],
    dims: Vec<u32>,
    payload: usize,
    label_count: u32,
    gz: bool,
}

fn idx_file() -> impl Strategy<Value = Idx> {
    let dim = prop_oneof![8 => 0u32..6, 1 => any::<u32>(), 1 => Just(u32::MAX)];
    let magic = prop_oneof![8 => (1u8..4).prop_map(|n| [0, 0, 8, n]), 1 => any::<[u8; 4]>()];
    (magic, prop::collection::vec(dim, 0..5), 0usize..200, prop_oneof![Just(None), (0u32..8).prop_map(Some)], any::<bool>()).prop_map(
        |(magic, mut dims, payload, labels, gz)| {
            dims.truncate(magic[3] as usize);
            while dims.len() < magic[3] as usize && magic[..3] == [0, 0, 8] {
                dims.push(1);
            }
            let promised = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d as usize));
            // Mostly the payload the header promises, sometimes not.
            let payload = match promised {
                Some(p) if p <= 200 && payload % 4 != 0 => p,
                _ => payload,
            };
            let label_count = labels.unwrap_or(dims.first().copied().unwrap_or(0));
            Idx { magic, dims, payload, label_count, gz }
        },
    )
}

fn write_idx(path: &Path, magic: [u8; 4], dims: &[u32], payload: usize, gz: bool) {
    use std::io::Write;
    let mut bytes = magic.to_vec();
    for d in dims {
        bytes.extend(d.to_be_bytes());
    }
    bytes.extend((0..payload).map(|i| (i % 251) as u8));
    if gz {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&bytes).unwrap();
        bytes = e.finish().unwrap();
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn idx_headers_and_payloads_of_every_shape() {
    let d = dir("idx");
    let _cleanup = Cleanup(d.clone());
    let images = d.join("f-images-idx3-ubyte");
    let labels = d.join("f-labels-idx1-ubyte");
    let ip = images.to_str().unwrap();
    runner(cases(2))
        .run(&(idx_file(), 1usize..=3), |(f, nranks)| {
            write_idx(&images, f.magic, &f.dims, f.payload, f.gz);
            // At most 256 label bytes are written: a count above that is a truncated labels file.
            write_idx(&labels, [0, 0, 8, 1], &[f.label_count], (f.label_count as usize).min(256), false);
            let valid_magic = f.magic[..3] == [0, 0, 8] && f.magic[3] > 0;
            let n = f.dims.first().copied().unwrap_or(0) as usize;
            let row = f.dims.iter().skip(1).try_fold(1usize, |a, &d| a.checked_mul(d as usize));
            let complete = row.is_some_and(|r| n.checked_mul(r).is_some_and(|t| t <= f.payload)) && n <= 256;
            let (mut seen, mut failed) = (0, false);
            for r in 0..nranks {
                let res = timed("read_idx", || idx::read_idx(ip, None, r, nranks));
                match res {
                    Ok(ds) => {
                        // A rank may read its own rows of a truncated gzip file (or have none) before
                        // the damage: then another rank fails (checked below), which fails the job.
                        prop_assert!(valid_magic && f.label_count as usize == n && (complete || f.gz), "accepted {:?}", f);
                        let row = row.unwrap();
                        let Features::Dense { x, d } = &ds.features else { panic!() };
                        prop_assert_eq!(*d, row);
                        // The bytes of exactly this shard, in order.
                        let want: Vec<f32> = (ds.first_row * row..(ds.first_row + ds.len()) * row).map(|i| (i % 251) as f32).collect();
                        prop_assert_eq!(x, &want);
                        prop_assert_eq!(ds.first_row, seen);
                        seen += ds.len();
                    }
                    Err(e) => {
                        failed = true;
                        prop_assert!(!(valid_magic && complete && f.label_count as usize == n), "refused a valid file {:?}: {}", f, e);
                        prop_assert!(e.path == ip || e.path == labels.to_str().unwrap(), "{}", e);
                        let shown = e.to_string();
                        prop_assert!(shown.starts_with(&format!("{}: ", e.path)), "{}", shown);
                    }
                }
            }
            if valid_magic && complete && f.label_count as usize == n {
                prop_assert_eq!(seen, n);
            } else {
                prop_assert!(failed, "no rank refused {:?}", f);
            }
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Graph files

#[test]
fn graph_files_planted_defects_are_named() {
    // (nodes, edges as (src, dst) pairs, comments, defect: (line among the edges, kind))
    let strategy = (2usize..12, prop::collection::vec((0usize..12, 0usize..12), 0..20), prop::option::weighted(0.3, (0usize..20, 0u8..7)));
    runner(cases(1))
        .run(&strategy, |(n, raw, defect)| {
            // A valid edge list: distinct pairs within 0..n, no self-edges.
            let mut edges: Vec<(usize, usize)> = Vec::new();
            for (a, b) in raw {
                let (a, b) = (a % n, b % n);
                if a != b && !edges.contains(&(a, b)) {
                    edges.push((a, b));
                }
            }
            let mut lines = vec!["# generated".to_string(), format!("nodes {n}  # header")];
            lines.extend(edges.iter().map(|(a, b)| format!("{a} {b}")));
            let mut bad_line = None;
            if let Some((at, kind)) = defect {
                let k = 2 + at % (edges.len() + 1);
                let l = match kind {
                    0 => format!("{n} 0"),      // node out of range
                    1 => "3 3".to_string(),     // self-edge
                    2 => "1 two".to_string(),   // not a number
                    3 => "1 2 3".to_string(),   // three fields
                    4 => "nodes 5".to_string(), // second header
                    5 => "-1 0".to_string(),    // negative
                    _ => match edges.first() {
                        Some(&(a, b)) if k > 2 => format!("{a} {b}"),
                        _ => "0 0".into(),
                    }, // duplicate (or self-edge)
                };
                let l = if kind == 1 && n <= 3 { format!("{} {}", n - 1, n - 1) } else { l };
                // A duplicate is a well-formed edge line: found only after the edge count check.
                let duplicate = kind == 6 && k > 2 && !edges.is_empty();
                lines.insert(k, l);
                bad_line = Some(if duplicate && edges.len() + 1 < n { 2 } else { k + 1 });
            }
            // Fewer edges than nodes cannot make a strongly connected graph: refused at the header.
            if bad_line.is_none() && n > edges.len() {
                bad_line = Some(2);
            }
            let text = lines.join("\n") + "\n";
            let r = timed("graph parse", || graph::file::parse(&text, "g.txt", None));
            match (r, bad_line) {
                (Ok(g), None) => {
                    prop_assert_eq!(g.nodes(), n);
                    prop_assert_eq!(g.edges(), edges.len());
                }
                (Err(e), Some(l)) => {
                    prop_assert!(e.to_string().starts_with(&format!("g.txt:{l}: ")), "{} (expected line {})\n{}", e, l, text)
                }
                (r, l) => {
                    prop_assert!(false, "expected defect at {:?}, got {:?}\n{}", l, r.map(|g| g.edges()).map_err(|e| e.to_string()), text)
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn graph_file_noise_never_panics_and_errors_name_the_file() {
    let alphabet = b"0123456789 \t\n\n\n#nodes-+x\r";
    runner(cases(1))
        .run(&noise(alphabet, 100), |bytes| {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let nlines = text.lines().count();
            if let Err(e) = timed("graph noise", || graph::file::parse(&text, "n.txt", None)) {
                let s = e.to_string();
                prop_assert!(s.starts_with("n.txt:"), "{}", s);
                // file:LINE: with an existing line, or a whole-file error.
                let place = s["n.txt:".len()..].split(':').next().unwrap();
                if let Ok(l) = place.parse::<usize>() {
                    prop_assert!(l >= 1 && l <= nlines, "{}", s);
                }
            }
            Ok(())
        })
        .unwrap();
}

/// A header promising billions of nodes fails at once instead of allocating for them (found by
/// the noise test above: `nodes 4294967294` asked for 64 GiB of offsets).
#[test]
fn graph_header_with_billions_of_nodes_is_refused_quickly() {
    let e = timed("huge graph", || graph::file::parse("nodes 4294967294\n0 1\n", "big.txt", None)).unwrap_err().to_string();
    assert!(e.starts_with("big.txt:1: "), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Config files

/// Keys with a valid value and a value of the wrong type.
const KEYS: &[(&str, &str, &str)] = &[
    ("epochs", "3", "\"three\""),
    ("batch_size", "16", "1.5"),
    ("lr", "0.05", "\"fast\""),
    ("seed", "7", "-1"),
    // ssp and its --staleness: any subset of these keys is a valid run (an option of another
    // mode's group, e.g. --graph with allreduce, would be refused).
    ("sync", "\"ssp\"", "\"sometimes\""),
    ("model", "\"svm\"", "3"),
    ("staleness", "2", "[1]"),
    ("sync_every", "2", "true"),
    ("lambda", "0.001", "\"none\""),
];

#[test]
fn config_files_planted_defects_are_named_at_their_key() {
    let d = dir("config");
    let _cleanup = Cleanup(d.clone());
    // (TOML or JSON, which keys, defect: (entry, kind: 0 unknown key, 1 wrong type, 2 syntax))
    let strategy = (
        any::<bool>(),
        prop::sample::subsequence((0..KEYS.len()).collect::<Vec<_>>(), 0..KEYS.len()),
        prop::option::weighted(0.5, (0usize..10, 0u8..3)),
    );
    runner(cases(1))
        .run(&strategy, |(toml, keys, defect)| {
            let path = d.join(if toml { "c.toml" } else { "c.json" });
            let mut entries: Vec<(String, String)> = keys.iter().map(|&k| (KEYS[k].0.to_string(), KEYS[k].1.to_string())).collect();
            let mut bad = None;
            if let Some((at, kind)) = defect {
                let at = at % (entries.len() + 1);
                let e = match kind {
                    0 => ("epoch".to_string(), "2".to_string()),
                    1 => {
                        let &(k, _, wrong) = KEYS.iter().find(|(k, ..)| !entries.iter().any(|(e, _)| e == k)).unwrap_or(&KEYS[0]);
                        entries.retain(|(e, _)| e != k);
                        (k.to_string(), wrong.to_string())
                    }
                    _ => ("epochs".to_string(), "\"3".to_string()),
                };
                let at = at.min(entries.len());
                entries.insert(at, e);
                bad = Some((at, kind));
            }
            // One entry per line; JSON has `{` on line 1, so entry k is on line k + 2 there.
            let text = if toml {
                entries.iter().map(|(k, v)| format!("{k} = {v}\n")).collect::<String>()
            } else {
                let body: Vec<String> = entries.iter().map(|(k, v)| format!("  \"{k}\": {v}")).collect();
                format!("{{\n{}\n}}\n", body.join(",\n"))
            };
            std::fs::write(&path, &text).unwrap();
            let p = path.to_str().unwrap();
            let r = timed("config", || TrainConfig::from_file(&path));
            match (r, bad) {
                (Ok(cfg), None) => {
                    let cfg = serde_json::to_value(&cfg).unwrap();
                    for (k, v) in &entries {
                        let got = cfg[k.as_str()].clone();
                        let want: serde_json::Value = serde_json::from_str(v).unwrap();
                        prop_assert!(
                            got == want || got.as_f64().zip(want.as_f64()).is_some_and(|(a, b)| (a - b).abs() < 1e-6),
                            "{}: {} vs {}",
                            k,
                            got,
                            want
                        );
                    }
                }
                (Err(e), Some((at, _))) => {
                    let line = if toml { at + 1 } else { at + 2 };
                    let s = format!("{e:#}");
                    prop_assert!(s.starts_with(&format!("{p}:{line}:")), "{} (expected line {})\n{}", s, line, text);
                }
                (r, b) => prop_assert!(false, "expected defect {:?}, got {:?}\n{}", b, r.err().map(|e| format!("{e:#}")), text),
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn config_noise_never_panics_and_errors_name_the_file() {
    let d = dir("config");
    let _cleanup = Cleanup(d.clone());
    let alphabet = b"abcdeghlnoprstyz_=\"'[]{}:,.0123456789 \n\n#-+\\\xff";
    runner(cases(1))
        .run(&(noise(alphabet, 80), any::<bool>()), |(bytes, toml)| {
            let path = d.join(if toml { "n.toml" } else { "n.json" });
            std::fs::write(&path, &bytes).unwrap();
            if let Err(e) = timed("config noise", || TrainConfig::from_file(&path)) {
                let s = format!("{e:#}");
                let p = path.display().to_string();
                prop_assert!(s.starts_with(&format!("{p}:")) || s.contains(&p), "{}", s);
            }
            Ok(())
        })
        .unwrap();
}
