//! `asap-train plot METRICS.jsonl... -o out.svg`: the curves and histograms of one or more runs'
//! `--metrics` files as one SVG.
//!
//! Panels: held-out metric and objective against training seconds, bytes sent per rank and
//! epochs (one line per run; a run's `--target` as a grey dashed line, and where it was judged on
//! the worst rank's own model, that rank's curve dashed beside the averaged model's), then, when
//! any run's says something, ASAP's consistency histogram and the staleness distribution as
//! grouped bar charts (fractions of each run's total, so runs of different lengths compare; the
//! axis stops at 1). An emulated run whose emulation did not hold is labelled INVALID. An LDA run
//! plots its held-out perplexity and its log-likelihood per token. A run is labelled by its mode and the options
//! that tell it apart (from its `start` line), or by `--labels`, in one legend below the panels
//! (never over the data). A mode has the same colour in every figure (allreduce blue, asap
//! orange, ssp green, ...); further runs of a mode in one figure get lighter shades and other
//! markers. Accuracy is in percent, as the console prints it; only the major grid is drawn.
//!
//! Only the SVG backend of `plotters` is used, without its `ttf` feature: text goes into the SVG
//! as `<text>` elements for the viewer's fonts, so building needs no fontconfig or FreeType.
//! Reads files only; no MPI.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use plotters::prelude::*;
use serde_json::Value;

/// Options of `asap-train plot`.
#[derive(Args, Debug, Clone)]
pub struct PlotArgs {
    /// Metrics files written by `train --metrics` (JSON lines: start, eval..., summary).
    #[arg(required = true, value_name = "METRICS.jsonl")]
    pub files: Vec<PathBuf>,
    /// The SVG file to write.
    #[arg(short, long, value_name = "OUT.svg")]
    pub out: PathBuf,
    /// Labels for the runs, in the order of the files (comma separated); default: mode and options.
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Title above the panels.
    #[arg(long)]
    pub title: Option<String>,
    /// Which panels: all, curves (metric/objective vs time/bytes) or bars (histograms).
    #[arg(long, value_enum, default_value_t = Panels::All)]
    pub panels: Panels,
}

/// Which panels a plot has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Panels {
    All,
    Curves,
    Bars,
}

/// One evaluation of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub train_seconds: f64,
    /// Epochs done (passes over the shards), where the evaluation says.
    pub epoch: Option<f64>,
    /// The worst rank's own model's metric, where the run scored every rank's (`--own-models`).
    pub worst: Option<f64>,
    /// Mean over ranks of the bytes a rank sent to others so far.
    pub bytes_sent: f64,
    pub objective: Option<f64>,
    /// Held-out metric (training-set metric when the run had no held-out data).
    pub metric: Option<f64>,
}

/// What a plot needs from one metrics file.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub path: PathBuf,
    pub label: String,
    /// The sync mode (`--sync`), which picks the run's colour in every figure.
    pub mode: String,
    /// "accuracy", "rmse" or (LDA) "perplexity".
    pub metric_name: String,
    /// "objective", or (LDA) "log-likelihood per token".
    pub objective_name: String,
    /// `--target`, and whether it was judged on the worst rank's own model.
    pub target: Option<f64>,
    pub target_on_worst_rank: bool,
    /// Whether an emulated run's emulation held (None: not emulated, or no summary).
    pub valid: Option<bool>,
    /// The start line's configuration: runs whose labels agree are told apart by what differs.
    pub config: Value,
    /// Whether `metric` is on held-out data.
    pub held_out: bool,
    pub points: Vec<Point>,
    /// `consistency_histogram[k]`: reduces that used k consistent in-neighbour models (asap).
    pub consistency: Option<Vec<f64>>,
    /// Staleness distribution (asap with --staleness, ssp, bosen: reads or messages by age;
    /// async: results by age) and which metric it came from.
    pub staleness: Option<(String, Vec<f64>)>,
}

fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn num(v: &Value, key: &str) -> Option<f64> {
    field(v, key).and_then(Value::as_f64).filter(|x| x.is_finite())
}

fn hist(v: &Value, key: &str) -> Option<Vec<f64>> {
    let a = field(v, key)?.as_array()?;
    let h: Vec<f64> = a.iter().map(|x| x.as_f64().unwrap_or(0.0)).collect();
    (!h.is_empty()).then_some(h)
}

/// The label of a run from its start line's configuration: mode, then the options that tell
/// runs of that mode apart, then anything that changes the conditions (ranks, partition,
/// stragglers, emulated link).
pub fn label_from_start(start: &Value) -> String {
    let cfg = field(start, "config").cloned().unwrap_or(Value::Null);
    let s = |k: &str| field(&cfg, k).map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()));
    let mode = s("sync").unwrap_or_else(|| "?".into());
    let mut parts = vec![mode.clone()];
    match mode.as_str() {
        "asap" => {
            // The graph actually used (auto resolves to a name in sync_info).
            let g = field(start, "sync_info")
                .and_then(|i| field(i, "graph"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .or_else(|| s("graph"));
            if let Some(g) = g {
                // A graph file: its name, not its directory.
                parts.push(Path::new(&g).file_name().map_or(g.clone(), |f| f.to_string_lossy().into_owned()));
            }
            if let Some(n) = s("notify").filter(|n| n != "notify-ack") {
                parts.push(n);
            }
            if let Some(st) = s("staleness").filter(|x| x != "0") {
                parts.push(format!("S={st}"));
            }
            if field(&cfg, "overlap").and_then(Value::as_bool) == Some(true) {
                parts.push("overlap".into());
            }
            if let Some(b) = s("bandwidth_mbps") {
                parts.push(format!("B={b}"));
            }
        }
        "ssp" | "bosen" => {
            if let Some(st) = s("staleness") {
                parts.push(format!("S={st}"));
            }
            if let Some(a) = s("apply") {
                parts.push(a);
            }
            if mode == "bosen" {
                if let Some(b) = s("bandwidth_mbps") {
                    parts.push(format!("B={b}"));
                }
                if let Some(p) = s("priority") {
                    parts.push(p);
                }
                // bosen's own record (sync_info.bosen.fp16): written by --fp16 before issue 40 and
                // by --compress fp16 since, so old and new runs label alike.
                let record = field(start, "sync_info").and_then(|i| field(i, "bosen"));
                if record.and_then(|r| field(r, "fp16")).and_then(Value::as_bool) == Some(true) {
                    parts.push("fp16".into());
                }
            }
        }
        "async" => {
            if let Some(b) = s("barrier") {
                parts.push(b);
            }
            if let Some(o) = s("optimizer").filter(|o| o != "sgd") {
                parts.push(o);
            }
        }
        "gaia" => {
            if let Some(v) = s("significance") {
                parts.push(format!("sig={v}"));
            }
        }
        _ => {}
    }
    if let Some(n) = num(start, "ranks") {
        parts.push(format!("{n}r"));
    }
    if let Some(p) = s("partition").filter(|p| p != "iid") {
        parts.push(p);
    }
    if let Some(st) = s("straggler") {
        parts.push(format!("straggler {st}"));
    }
    if let Some(e) = s("emulate_bandwidth") {
        parts.push(format!("{e} Mbit/s"));
    }
    parts.join(" ")
}

/// Parses one metrics file's text (`path` only names it in errors and the result).
pub fn parse_run(path: &Path, text: &str) -> Result<Run> {
    let mut start = None;
    let mut summary = None;
    let mut last_sync = None;
    let mut points = Vec::new();
    let mut metric_name = None;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).with_context(|| format!("{} line {}: not a JSON object", path.display(), i + 1))?;
        let Some(event) = v.get("event").and_then(Value::as_str) else {
            bail!("{} line {}: no \"event\" field (is this a --metrics file?)", path.display(), i + 1);
        };
        match event {
            "start" => start = Some(v),
            "eval" => {
                let Some(t) = num(&v, "train_seconds") else {
                    bail!("{} line {}: eval without train_seconds", path.display(), i + 1);
                };
                let bytes = v.pointer("/counters/bytes_sent/mean").and_then(Value::as_f64).unwrap_or(0.0);
                if metric_name.is_none() {
                    metric_name = v.get("metric").and_then(Value::as_str).map(str::to_string);
                }
                // LDA scores held-out perplexity and the log-likelihood per token.
                if metric_name.is_none() && num(&v, "perplexity").is_some() {
                    metric_name = Some("perplexity".into());
                }
                let metric = num(&v, "test_metric").or_else(|| num(&v, "train_metric")).or_else(|| num(&v, "perplexity"));
                let objective = num(&v, "objective").or_else(|| num(&v, "log_likelihood_per_token"));
                let (epoch, worst) = (num(&v, "epoch"), v.pointer("/rank_metric/worst").and_then(Value::as_f64));
                points.push(Point { train_seconds: t, epoch, worst, bytes_sent: bytes, objective, metric });
                if let Some(s) = field(&v, "sync") {
                    last_sync = Some(s.clone());
                }
            }
            "summary" => summary = Some(v),
            _ => {}
        }
    }
    let Some(start) = start else {
        bail!("{}: no start line (is this a --metrics file?)", path.display());
    };
    if !points.iter().any(|p| p.metric.is_some() || p.objective.is_some()) {
        bail!("{}: no evaluation with a metric or an objective to plot (give the run --eval-every)", path.display());
    }
    // Asynchronous modes write their evaluations at the end, possibly not in time order.
    points.sort_by(|a, b| a.train_seconds.total_cmp(&b.train_seconds));
    let held_out = summary
        .as_ref()
        .and_then(|s| s.get("held_out").and_then(Value::as_bool))
        .unwrap_or_else(|| num(&start, "test_examples").unwrap_or(0.0) > 0.0);
    // The summary's mode metrics cover the whole run; a run that died has its last eval's.
    let sync = summary.as_ref().and_then(|s| field(s, "sync_metrics")).cloned().or(last_sync);
    let consistency = sync.as_ref().and_then(|s| hist(s, "consistency_histogram"));
    let staleness = sync.as_ref().and_then(|s| {
        ["staleness_histogram", "result_staleness_histogram", "row_age_histogram"]
            .iter()
            .find_map(|k| hist(s, k).map(|h| (k.to_string(), h)))
    });
    let mode = start.pointer("/config/sync").and_then(Value::as_str).unwrap_or("?").to_string();
    let lda = start.get("model").and_then(Value::as_str) == Some("lda");
    let valid = summary.as_ref().and_then(|s| s.pointer("/emulation/valid")).and_then(Value::as_bool);
    Ok(Run {
        path: path.to_path_buf(),
        label: label_from_start(&start),
        mode,
        metric_name: metric_name.unwrap_or_else(|| "metric".into()),
        objective_name: if lda { "log-likelihood per token" } else { "objective" }.into(),
        target: start.pointer("/config/target").and_then(Value::as_f64),
        target_on_worst_rank: start.pointer("/config/target_on").and_then(Value::as_str) == Some("worst-rank"),
        valid,
        config: field(&start, "config").cloned().unwrap_or(Value::Null),
        held_out,
        points,
        consistency,
        staleness,
    })
}

/// Reads and parses metrics files and labels them (`labels` override in order); labels that
/// come out alike get the file name appended so the legend tells them apart.
pub fn load_runs(files: &[PathBuf], labels: &[String]) -> Result<Vec<Run>> {
    if !labels.is_empty() && labels.len() != files.len() {
        bail!("--labels has {} labels for {} files", labels.len(), files.len());
    }
    let mut runs = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let text = std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
        let mut r = parse_run(f, &text)?;
        if let Some(l) = labels.get(i) {
            r.label = l.clone();
        }
        runs.push(r);
    }
    for r in runs.iter_mut().filter(|r| r.valid == Some(false)) {
        r.label.push_str(" (INVALID emulation)");
    }
    if labels.is_empty() {
        tell_apart(&mut runs);
    }
    Ok(runs)
}

/// Options that say where a run wrote, not what it ran: never what tells runs apart.
const OUTPUT_KEYS: [&str; 7] = ["metrics", "save_model", "checkpoint_dir", "send_log", "save_config", "config_file", "create_dirs"];

/// Runs whose labels agree get the options in which they differ (up to 3, `key=value`; a file by
/// its name), and runs that still agree their file's name (issue 43: two ssp runs at other
/// staleness bounds or on other data were both "ssp 4r").
fn tell_apart(runs: &mut [Run]) {
    let all: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
    let configs: Vec<Value> = runs.iter().map(|r| r.config.clone()).collect();
    for (i, r) in runs.iter_mut().enumerate() {
        let same: Vec<usize> = (0..all.len()).filter(|&j| all[j] == all[i]).collect();
        if same.len() < 2 {
            continue;
        }
        let keys = configs[i].as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
        let show = |v: &Value| match v.as_str() {
            Some(s) => Path::new(s).file_name().map_or(s.to_owned(), |f| f.to_string_lossy().into_owned()),
            None => v.to_string(),
        };
        let differing: Vec<String> = keys
            .iter()
            .filter(|k| !OUTPUT_KEYS.contains(&k.as_str()))
            .filter(|k| same.iter().any(|&j| configs[j].get(k.as_str()) != configs[i].get(k.as_str())))
            .take(3)
            .map(|k| format!("{k}={}", show(&configs[i][k.as_str()])))
            .collect();
        if !differing.is_empty() {
            r.label = format!("{} {}", r.label, differing.join(" "));
        }
    }
    // What still agrees differs in nothing but its outputs: the file's name tells it apart.
    let all: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
    for r in runs.iter_mut().filter(|r| all.iter().filter(|l| **l == r.label).count() > 1) {
        r.label = format!("{} [{}]", r.label, r.path.file_stem().map_or(String::new(), |s| s.to_string_lossy().into_owned()));
    }
}

/// `histogram` as fractions of its total (all zeros stay zeros).
pub fn fractions(h: &[f64]) -> Vec<f64> {
    let t: f64 = h.iter().sum();
    h.iter().map(|x| if t > 0.0 { x / t } else { 0.0 }).collect()
}

/// Each mode's colour, the same in every figure (Tableau 10), so a reader follows one mode
/// across figures; runs of one mode in one figure get lighter shades and other markers.
fn mode_color(mode: &str) -> (u8, u8, u8) {
    match mode {
        "allreduce" => (31, 119, 180),
        "asap" => (255, 127, 14),
        "ssp" => (44, 160, 44),
        "bosen" => (214, 39, 40),
        "gaia" => (148, 103, 189),
        "async" => (140, 86, 75),
        "none" => (127, 127, 127),
        _ => (23, 190, 207),
    }
}

/// How run `i` of `runs` is drawn: its mode's colour, mixed towards white for the k-th run of the
/// same mode (k = 0 keeps the mode's colour itself), and a marker per k.
#[derive(Clone, Copy)]
struct Look {
    color: RGBColor,
    marker: usize,
}

fn look(runs: &[Run], i: usize) -> Look {
    let k = runs[..i].iter().filter(|r| r.mode == runs[i].mode).count();
    let (r, g, b) = mode_color(&runs[i].mode);
    // Shades 0, 0.3, 0.5, 0.6, ...: lighter, never white.
    let t = [0.0, 0.3, 0.5, 0.6, 0.15, 0.4][k % 6];
    let mix = |c: u8| (c as f64 + (255.0 - c as f64) * t).round() as u8;
    Look { color: RGBColor(mix(r), mix(g), mix(b)), marker: k }
}

/// Text sizes (px) for a 1400-px-wide canvas viewed whole.
const TITLE: u32 = 26;
const CAPTION: u32 = 22;
const AXIS_DESC: u32 = 19;
const TICKS: u32 = 17;
const LEGEND: u32 = 18;

fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.0, 1.0);
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { lo.abs().max(1.0) * 0.05 };
    (lo - pad, hi + pad)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_err<E: std::error::Error + Send + Sync + 'static>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("drawing failed: {e}")
}

/// A tick's text: as many decimals as the axis' `span` needs, and never "-0" (issue 43: an axis
/// read "-0.0" where it crossed zero).
fn tick(v: f64, span: f64) -> String {
    let decimals = if span > 0.0 { (2.0 - span.log10().floor()).clamp(0.0, 6.0) as usize } else { 2 };
    let text = format!("{v:.decimals$}");
    if text.trim_start_matches('-').chars().all(|c| c == '0' || c == '.') {
        text.trim_start_matches('-').to_owned()
    } else {
        text
    }
}

/// What a metric panel draws beside the curves: the runs' targets (on the panel's scale) and
/// each run's worst rank's own model (`worst`), where its target was judged on it.
struct Marks<'a> {
    targets: Vec<f64>,
    worst: &'a dyn Fn(&Point) -> Option<f64>,
}

/// An x axis of the curve panels: its description and each evaluation's value on it.
type XAxis = (&'static str, fn(&Point) -> Option<f64>);

/// One line chart: y (metric or objective) against x (seconds, MB sent or epochs) for every run.
fn curve_panel(
    area: &Area,
    runs: &[Run],
    title: &str,
    (x_desc, x): XAxis,
    y_desc: &str,
    y: &dyn Fn(&Point) -> Option<f64>,
    marks: Option<&Marks>,
) -> Result<()> {
    let series: Vec<Vec<(f64, f64)>> = runs.iter().map(|r| r.points.iter().filter_map(|p| Some((x(p)?, y(p)?))).collect()).collect();
    let worst: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| match marks {
            Some(m) if r.target_on_worst_rank => r.points.iter().filter_map(|p| Some((x(p)?, (m.worst)(p)?))).collect(),
            _ => Vec::new(),
        })
        .collect();
    let targets = marks.map_or(&[][..], |m| &m.targets[..]);
    let all = series.iter().chain(&worst).flatten().copied().chain(targets.iter().map(|&t| (0.0, t)));
    let (x0, x1) = all.clone().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (x0, x1) = padded(x0.min(0.0), x1);
    let (y0, y1) = padded(y0, y1);
    let (x_span, y_span) = (x1 - x0, y1 - y0);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", CAPTION))
        .margin(14)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(draw_err)?;
    // Major grid lines only, light: the minor grid cluttered the panels.
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(6)
        .y_labels(6)
        .x_label_formatter(&|v| tick(*v, x_span))
        .y_label_formatter(&|v| tick(*v, y_span))
        .label_style(("sans-serif", TICKS))
        .axis_desc_style(("sans-serif", AXIS_DESC))
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(draw_err)?;
    for &t in targets {
        chart.draw_series(DashedLineSeries::new([(x0, t), (x1, t)], 8, 6, RGBColor(110, 110, 110).stroke_width(2))).map_err(draw_err)?;
    }
    for (i, w) in worst.iter().enumerate().filter(|(_, w)| !w.is_empty()) {
        chart.draw_series(DashedLineSeries::new(w.iter().copied(), 6, 5, look(runs, i).color.stroke_width(2))).map_err(draw_err)?;
    }
    // The legend is one for the whole figure, outside the panels (`legend`).
    for (i, s) in series.iter().enumerate() {
        let l = look(runs, i);
        chart.draw_series(LineSeries::new(s.iter().copied(), l.color.stroke_width(2))).map_err(draw_err)?;
        // A mark per evaluation (so a run with one evaluation is still visible), its shape by
        // the run's marker: circle, triangle, square, cross.
        let c = l.color;
        let pts = s.iter().copied();
        match l.marker % 4 {
            0 => chart.draw_series(pts.map(|p| Circle::new(p, 3, c.filled()))).map(|_| ()),
            1 => chart.draw_series(pts.map(|p| TriangleMarker::new(p, 4, c.filled()))).map(|_| ()),
            2 => chart.draw_series(pts.map(|p| EmptyElement::at(p) + Rectangle::new([(-3, -3), (3, 3)], c.filled()))).map(|_| ()),
            _ => chart.draw_series(pts.map(|p| Cross::new(p, 4, c.stroke_width(2)))).map(|_| ()),
        }
        .map_err(draw_err)?;
    }
    Ok(())
}

/// One legend for every panel, below them: each run's line and mark in its look, and its label.
fn legend(area: &Area, runs: &[Run]) -> Result<()> {
    let (w, _) = area.dim_in_pixel();
    let cols = if runs.len() > 1 { 2 } else { 1 };
    let col_w = w as i32 / cols;
    for (i, r) in runs.iter().enumerate() {
        let l = look(runs, i);
        let (x, y) = (20 + (i as i32 % cols) * col_w, 16 + (i as i32 / cols) * LEGEND_ROW);
        area.draw(&PathElement::new(vec![(x, y), (x + 36, y)], l.color.stroke_width(3))).map_err(draw_err)?;
        let c = l.color;
        match l.marker % 4 {
            0 => area.draw(&Circle::new((x + 18, y), 4, c.filled())),
            1 => area.draw(&TriangleMarker::new((x + 18, y), 5, c.filled())),
            2 => area.draw(&Rectangle::new([(x + 14, y - 4), (x + 22, y + 4)], c.filled())),
            _ => area.draw(&Cross::new((x + 18, y), 5, c.stroke_width(2))),
        }
        .map_err(draw_err)?;
        area.draw(&Text::new(r.label.clone(), (x + 46, y - LEGEND as i32 / 2 - 1), ("sans-serif", LEGEND))).map_err(draw_err)?;
    }
    Ok(())
}

/// Height of one legend row (px), and of the note below the legend.
const LEGEND_ROW: i32 = 28;
const NOTE: u32 = 30;

/// Grouped bars: bucket k on the x axis, one bar per run that has the histogram.
fn bar_panel(area: &Area, bars: &[(String, RGBColor, Vec<f64>)], title: &str, x_desc: &str) -> Result<()> {
    let buckets = bars.iter().map(|b| b.2.len()).max().unwrap_or(1);
    // A fraction never passes 1: a little head room above the tallest bar, up to 1.
    let top = (bars.iter().flat_map(|b| b.2.iter().copied()).fold(0.0_f64, f64::max).max(1e-9) * 1.08).min(1.0);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", CAPTION))
        .margin(14)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(-0.5..(buckets as f64 - 0.5), 0.0..top)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("fraction of the run's total")
        .x_labels(buckets.min(20))
        .x_label_formatter(&|v| format!("{}", v.round() as i64))
        .y_labels(6)
        .label_style(("sans-serif", TICKS))
        .axis_desc_style(("sans-serif", AXIS_DESC))
        .disable_x_mesh()
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(draw_err)?;
    let w = 0.8 / bars.len().max(1) as f64;
    for (j, (_, c, h)) in bars.iter().enumerate() {
        let c = *c;
        chart
            .draw_series(h.iter().enumerate().map(|(k, &v)| {
                let x = k as f64 - 0.4 + j as f64 * w;
                Rectangle::new([(x, 0.0), (x + w * 0.9, v)], c.filled())
            }))
            .map_err(draw_err)?;
    }
    Ok(())
}

/// Draws `runs` into the SVG file `out`: two rows of curve panels (metric and objective, against
/// time and bytes), a row of the histograms that any run has (one or two panels, as wide as the
/// row: no empty cell), and one legend below.
pub fn plot(runs: &[Run], out: &Path, title: Option<&str>, panels: Panels) -> Result<()> {
    if runs.is_empty() {
        bail!("nothing to plot");
    }
    let curves = panels != Panels::Bars;
    let bars = |h: fn(&Run) -> Option<&Vec<f64>>| -> Vec<(String, RGBColor, Vec<f64>)> {
        runs.iter().enumerate().filter_map(|(i, r)| h(r).map(|h| (r.label.clone(), look(runs, i).color, fractions(h)))).collect()
    };
    // A consistency histogram with one bucket (every reduce used the same number of consistent
    // models) says nothing a bar chart shows better: it is drawn only when some run's has two.
    let spread = |h: &Vec<f64>| h.iter().filter(|&&c| c > 0.0).count() > 1;
    let consistency =
        if runs.iter().any(|r| r.consistency.as_ref().is_some_and(spread)) { bars(|r| r.consistency.as_ref()) } else { Vec::new() };
    let staleness = bars(|r| r.staleness.as_ref().map(|s| &s.1));
    let bar_panels = if panels == Panels::Curves { 0 } else { usize::from(!consistency.is_empty()) + usize::from(!staleness.is_empty()) };
    if !curves && bar_panels == 0 {
        bail!("--panels bars: none of the runs has a consistency or staleness histogram");
    }
    let row_h = 460u32;
    let head = if title.is_some() { 48 } else { 0 };
    let legend_h = 24 + LEGEND_ROW as u32 * runs.len().div_ceil(if runs.len() > 1 { 2 } else { 1 }) as u32;
    let curve_h = if curves { 2 * row_h } else { 0 };
    let bar_h = if bar_panels > 0 { row_h } else { 0 };
    let (w, h) = (if curves { 1800u32 } else { 1400 }, head + curve_h + bar_h + legend_h + NOTE);
    let root = SVGBackend::new(out, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let (top, body) = root.split_vertically(head);
    if let Some(t) = title {
        top.titled(t, ("sans-serif", TITLE)).map_err(draw_err)?;
    }
    let (curve_area, rest) = body.split_vertically(curve_h);
    let (bar_area, legend_area) = rest.split_vertically(bar_h);
    if curves {
        let cells = curve_area.split_evenly((2, 3));
        let metric = &runs[0].metric_name;
        let which = if runs[0].held_out { "held-out" } else { "training" };
        // Accuracy in percent, as the console prints it.
        let percent = metric == "accuracy";
        let scaled = move |v: f64| if percent { 100.0 * v } else { v };
        let m = format!("{which} {metric}{}", if percent { " (%)" } else { "" });
        let axes: [XAxis; 3] =
            [("training seconds", |p| Some(p.train_seconds)), ("MB sent per rank", |p| Some(p.bytes_sent / 1e6)), ("epochs", |p| p.epoch)];
        let met = move |p: &Point| p.metric.map(scaled);
        let worst = move |p: &Point| p.worst.map(scaled);
        let mut targets: Vec<f64> = runs.iter().filter_map(|r| r.target.map(scaled)).collect();
        targets.dedup();
        let marks = Marks { targets, worst: &worst };
        let obj = |p: &Point| p.objective;
        let name = format!("{which} {metric}");
        let objective = &runs[0].objective_name;
        for (k, (axis, versus)) in axes.into_iter().zip(["training time", "bytes sent", "epochs"]).enumerate() {
            curve_panel(&cells[k], runs, &format!("{name} vs {versus}"), axis, &m, &met, Some(&marks))?;
            curve_panel(&cells[3 + k], runs, &format!("{objective} vs {versus}"), axis, objective, &obj, None)?;
        }
    }
    if bar_panels > 0 {
        let cells = bar_area.split_evenly((1, bar_panels));
        let mut next = 0;
        if !consistency.is_empty() {
            bar_panel(
                &cells[next],
                &consistency,
                "consistency histogram (ASAP Fig. 8)",
                "consistent in-neighbour models used in a reduce",
            )?;
            next += 1;
        }
        if !staleness.is_empty() {
            let kinds: Vec<&str> = runs.iter().filter_map(|r| r.staleness.as_ref().map(|s| s.0.as_str())).collect();
            let what = if kinds.iter().all(|k| *k == "result_staleness_histogram") {
                "age of applied results (clocks)"
            } else {
                "staleness (asap: rounds a message waited; ssp/bosen: clocks a read lagged)"
            };
            bar_panel(&cells[next], &staleness, "staleness distribution", what)?;
        }
    }
    let (legend_area, note_area) = legend_area.split_vertically(legend_h);
    legend(&legend_area, runs)?;
    note_area
        .draw(&Text::new(
            "grey dashed: a run's --target; a run's colour dashed: its worst rank's own model, where its target was judged on it",
            (20, 4),
            ("sans-serif", TICKS),
        ))
        .map_err(draw_err)?;
    root.present().map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
    Ok(())
}

/// Runs `asap-train plot`.
pub fn run(args: &PlotArgs) -> Result<()> {
    let runs = load_runs(&args.files, &args.labels)?;
    plot(&runs, &args.out, args.title.as_deref(), args.panels)?;
    eprintln!("asap-train plot: {} run(s) -> {}", runs.len(), args.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: &str = r#"{"event":"start","ranks":8,"test_examples":10000,"config":{"sync":"asap","graph":"auto","notify":"notify-ack","staleness":1,"overlap":false,"partition":"by-label:2","straggler":"0,1:2","emulate_bandwidth":null,"bandwidth_mbps":null},"sync_info":{"graph":"root-expander"}}"#;

    fn eval(t: f64, bytes: f64, obj: &str, metric: &str, sync: &str) -> String {
        format!(
            r#"{{"event":"eval","train_seconds":{t},"counters":{{"bytes_sent":{{"mean":{bytes},"max":{bytes}}}}},"objective":{obj},"metric":"accuracy","test_metric":{metric},"train_metric":0.5,"sync":{sync}}}"#
        )
    }

    #[test]
    fn a_mode_has_its_colour_in_every_figure() {
        let run = |mode: &str| Run {
            path: "x".into(),
            label: mode.into(),
            mode: mode.into(),
            metric_name: "accuracy".into(),
            objective_name: "objective".into(),
            target: None,
            target_on_worst_rank: false,
            valid: None,
            config: Value::Null,
            held_out: true,
            points: vec![],
            consistency: None,
            staleness: None,
        };
        let a = [run("allreduce"), run("asap"), run("asap")];
        let b = [run("ssp"), run("asap"), run("gaia"), run("allreduce")];
        let c = |runs: &[Run], i| {
            let RGBColor(r, g, b) = look(runs, i).color;
            (r, g, b)
        };
        assert_eq!(c(&a, 0), c(&b, 3), "allreduce");
        assert_eq!(c(&a, 1), c(&b, 1), "the first asap run");
        assert_ne!(c(&a, 2), c(&a, 1), "a second asap run in one figure is told apart");
        assert_ne!(look(&a, 2).marker, look(&a, 1).marker);
    }

    #[test]
    fn label_names_mode_graph_and_conditions() {
        let v: Value = serde_json::from_str(START).unwrap();
        assert_eq!(label_from_start(&v), "asap root-expander S=1 8r by-label:2 straggler 0,1:2");
        let ssp: Value = serde_json::from_str(
            r#"{"ranks":4,"config":{"sync":"ssp","staleness":3,"apply":"consgd","partition":"iid","emulate_bandwidth":100.0}}"#,
        )
        .unwrap();
        assert_eq!(label_from_start(&ssp), "ssp S=3 consgd 4r 100.0 Mbit/s");
        let file: Value =
            serde_json::from_str(r#"{"ranks":8,"config":{"sync":"asap","graph":"graphs/searched-8.txt","notify":"barrier"}}"#).unwrap();
        assert_eq!(label_from_start(&file), "asap searched-8.txt barrier 8r");
        let bosen: Value = serde_json::from_str(
            r#"{"ranks":8,"config":{"sync":"bosen","staleness":2,"apply":"consgd","bandwidth_mbps":40.0,"priority":"relative","compress":"fp16"},
                "sync_info":{"bosen":{"fp16":true}}}"#,
        )
        .unwrap();
        assert_eq!(label_from_start(&bosen), "bosen S=2 consgd B=40.0 relative fp16 8r");
    }

    #[test]
    fn parses_points_sorted_and_histograms_from_the_summary() {
        let text = [
            START.to_string(),
            eval(2.0, 2e6, "0.5", "0.8", r#"{"consistency_histogram":[0,1,1]}"#),
            eval(1.0, 1e6, "0.9", "null", r#"{"consistency_histogram":[0,0,1]}"#),
            r#"{"event":"summary","held_out":true,"sync_metrics":{"consistency_histogram":[0,2,6],"staleness_histogram":[3,1]}}"#.into(),
            r#"{"event":"teardown"}"#.into(),
        ]
        .join("\n");
        let r = parse_run(Path::new("x.jsonl"), &text).unwrap();
        assert_eq!(r.points.len(), 2);
        assert_eq!(r.points[0].train_seconds, 1.0);
        assert_eq!(r.points[0].bytes_sent, 1e6);
        // No held-out value: the training metric stands in.
        assert_eq!(r.points[0].metric, Some(0.5));
        assert_eq!(r.points[1].metric, Some(0.8));
        assert_eq!(r.points[1].objective, Some(0.5));
        assert_eq!(r.consistency, Some(vec![0.0, 2.0, 6.0]));
        assert_eq!(r.staleness, Some(("staleness_histogram".into(), vec![3.0, 1.0])));
        assert!(r.held_out);
        assert_eq!(r.metric_name, "accuracy");
    }

    #[test]
    fn a_run_without_summary_keeps_its_last_eval_histogram_and_non_finite_values_are_dropped() {
        let text = [START.to_string(), eval(1.0, 0.0, "NaN", "0.7", r#"{"consistency_histogram":[1,0,3]}"#)].join("\n");
        // serde_json does not read NaN: a diverged run writes null instead; check both forms.
        assert!(parse_run(Path::new("d.jsonl"), &text).is_err());
        let text = [START.to_string(), eval(1.0, 0.0, "null", "0.7", r#"{"consistency_histogram":[1,0,3]}"#)].join("\n");
        let r = parse_run(Path::new("d.jsonl"), &text).unwrap();
        assert_eq!(r.points[0].objective, None);
        assert_eq!(r.consistency, Some(vec![1.0, 0.0, 3.0]));
        assert_eq!(r.staleness, None);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let e = parse_run(Path::new("bad.jsonl"), &format!("{START}\n{{oops")).unwrap_err();
        assert!(format!("{e:#}").contains("bad.jsonl line 2"), "{e:#}");
        let e = parse_run(Path::new("no-start.jsonl"), &eval(1.0, 0.0, "1", "1", "null")).unwrap_err();
        assert!(format!("{e:#}").contains("no-start.jsonl: no start line"), "{e:#}");
        let e = parse_run(Path::new("other.jsonl"), "{\"a\":1}").unwrap_err();
        assert!(format!("{e:#}").contains("other.jsonl line 1: no \"event\""), "{e:#}");
        let e = parse_run(Path::new("t.jsonl"), &format!("{START}\n{{\"event\":\"eval\"}}")).unwrap_err();
        assert!(format!("{e:#}").contains("t.jsonl line 2: eval without train_seconds"), "{e:#}");
    }

    /// Issue 43, item 7: runs whose labels agree are told apart by the options that differ (not
    /// their outputs), or by their file where none does.
    #[test]
    fn alike_labels_name_the_options_that_differ() {
        let dir = tempfile::tempdir().unwrap();
        let start = |staleness: u32, data: &str, metrics: &str| {
            format!(
                r#"{{"event":"start","ranks":4,"config":{{"sync":"ssp","staleness":{staleness},"data":"{data}","metrics":"{metrics}"}}}}"#
            )
        };
        let files: Vec<PathBuf> = [(1, "/d/a.svm", "x"), (3, "/d/a.svm", "y"), (3, "/d/b.svm", "z"), (3, "/d/b.svm", "w")]
            .iter()
            .enumerate()
            .map(|(i, (st, d, m))| {
                let f = dir.path().join(format!("run{i}.jsonl"));
                std::fs::write(&f, [start(*st, d, m), eval(1.0, 0.0, "0.5", "0.7", "null")].join("\n")).unwrap();
                f
            })
            .collect();
        let labels: Vec<String> = load_runs(&files, &[]).unwrap().into_iter().map(|r| r.label).collect();
        // Labels "ssp S=1 4r" and three of "ssp S=3 4r": those three differ in data only, and
        // the last two in nothing but their outputs.
        assert_eq!(labels, ["ssp S=1 4r", "ssp S=3 4r data=a.svm", "ssp S=3 4r data=b.svm [run2]", "ssp S=3 4r data=b.svm [run3]"]);
    }

    /// Issue 43, item 7: an emulated run whose emulation broke is labelled INVALID (the plot and
    /// the summary disagreed on which run won), and no tick reads "-0".
    #[test]
    fn invalid_runs_are_marked_and_ticks_never_read_minus_zero() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("broken.jsonl");
        let summary = r#"{"event":"summary","held_out":true,"emulation":{"valid":false}}"#;
        std::fs::write(&f, [START.to_string(), eval(1.0, 0.0, "0.5", "0.7", "null"), summary.into()].join("\n")).unwrap();
        let runs = load_runs(&[f], &[]).unwrap();
        assert!(runs[0].label.ends_with(" (INVALID emulation)"), "{}", runs[0].label);
        assert_eq!(tick(-1e-17, 2.0), "0.00");
        assert_eq!(tick(-0.0, 50.0), "0.0");
        assert_eq!(tick(-0.25, 2.0), "-0.25");
        assert_eq!(tick(1234.5, 3000.0), "1234");
    }

    #[test]
    fn fractions_sum_to_one_or_stay_zero() {
        assert_eq!(fractions(&[1.0, 3.0]), vec![0.25, 0.75]);
        assert_eq!(fractions(&[0.0, 0.0]), vec![0.0, 0.0]);
    }
}
