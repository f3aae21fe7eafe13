//! `asap-train plot METRICS.jsonl... -o out.svg`: the curves and histograms of one or more runs'
//! `--metrics` files as one SVG.
//!
//! Panels: held-out metric and objective against training seconds and against bytes sent per
//! rank (one line per run), then, when any run has them, ASAP's consistency histogram and the
//! staleness distribution as grouped bar charts (fractions of each run's total, so runs of
//! different lengths compare). A run is labelled by its mode and the options that tell it apart
//! (from its `start` line), or by `--labels`.
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
    /// "accuracy" or "rmse".
    pub metric_name: String,
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
                if field(&cfg, "fp16").and_then(Value::as_bool) == Some(true) {
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
        let v: Value =
            serde_json::from_str(line).with_context(|| format!("{} line {}: not a JSON object", path.display(), i + 1))?;
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
                let metric = num(&v, "test_metric").or_else(|| num(&v, "train_metric"));
                points.push(Point { train_seconds: t, bytes_sent: bytes, objective: num(&v, "objective"), metric });
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
    Ok(Run {
        path: path.to_path_buf(),
        label: label_from_start(&start),
        metric_name: metric_name.unwrap_or_else(|| "metric".into()),
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
    if labels.is_empty() {
        let all: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
        for r in &mut runs {
            if all.iter().filter(|l| **l == r.label).count() > 1 {
                let stem = r.path.file_stem().map_or(String::new(), |s| s.to_string_lossy().into_owned());
                r.label = format!("{} [{stem}]", r.label);
            }
        }
    }
    Ok(runs)
}

/// `histogram` as fractions of its total (all zeros stay zeros).
pub fn fractions(h: &[f64]) -> Vec<f64> {
    let t: f64 = h.iter().sum();
    h.iter().map(|x| if t > 0.0 { x / t } else { 0.0 }).collect()
}

fn color(i: usize) -> RGBColor {
    // Distinguishable on white: Tableau 10, then black and the light halves of Tableau 20, so
    // up to 16 runs in one plot never share a colour (the straggler table has 11).
    const C: [(u8, u8, u8); 16] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
        (0, 0, 0),
        (174, 199, 232),
        (255, 187, 120),
        (152, 223, 138),
        (255, 152, 150),
        (197, 176, 213),
    ];
    let (r, g, b) = C[i % C.len()];
    RGBColor(r, g, b)
}

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

/// One line chart: y (metric or objective) against x (seconds or MB sent) for every run.
fn curve_panel(
    area: &Area,
    runs: &[Run],
    title: &str,
    x_desc: &str,
    y_desc: &str,
    x: fn(&Point) -> f64,
    y: fn(&Point) -> Option<f64>,
    legend: SeriesLabelPosition,
) -> Result<()> {
    let series: Vec<Vec<(f64, f64)>> =
        runs.iter().map(|r| r.points.iter().filter_map(|p| y(p).map(|v| (x(p), v))).collect()).collect();
    let all = series.iter().flatten();
    let (x0, x1) = all.clone().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (x0, x1) = padded(x0.min(0.0), x1);
    let (y0, y1) = padded(y0, y1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(draw_err)?;
    for (i, (r, s)) in runs.iter().zip(&series).enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(s.iter().copied(), c.stroke_width(2)))
            .map_err(draw_err)?
            .label(r.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        // A dot per evaluation, so a run with one evaluation is still visible.
        chart.draw_series(s.iter().map(|&p| Circle::new(p, 2, c.filled()))).map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 12))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .position(legend)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// Grouped bars: bucket k on the x axis, one bar per run that has the histogram.
fn bar_panel(area: &Area, bars: &[(String, usize, Vec<f64>)], title: &str, x_desc: &str) -> Result<()> {
    let buckets = bars.iter().map(|b| b.2.len()).max().unwrap_or(1);
    // Head room above the tallest bar for the legend (one line per run).
    let top = bars.iter().flat_map(|b| b.2.iter().copied()).fold(0.0_f64, f64::max).max(1e-9)
        * (1.15 + 0.07 * bars.len() as f64);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..(buckets as f64 - 0.5), 0.0..top)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("fraction of the run's total")
        .x_labels(buckets.min(20))
        .x_label_formatter(&|v| format!("{}", v.round() as i64))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .disable_x_mesh()
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(draw_err)?;
    let w = 0.8 / bars.len().max(1) as f64;
    for (j, (label, ci, h)) in bars.iter().enumerate() {
        let c = color(*ci);
        chart
            .draw_series(h.iter().enumerate().map(|(k, &v)| {
                let x = k as f64 - 0.4 + j as f64 * w;
                Rectangle::new([(x, 0.0), (x + w * 0.9, v)], c.filled())
            }))
            .map_err(draw_err)?
            .label(label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 12))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// Draws `runs` into the SVG file `out`.
pub fn plot(runs: &[Run], out: &Path, title: Option<&str>, panels: Panels) -> Result<()> {
    if runs.is_empty() {
        bail!("nothing to plot");
    }
    let curves = panels != Panels::Bars;
    let consistency: Vec<(String, usize, Vec<f64>)> = runs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.consistency.as_ref().map(|h| (r.label.clone(), i, fractions(h))))
        .collect();
    let staleness: Vec<(String, usize, Vec<f64>)> = runs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.staleness.as_ref().map(|(_, h)| (r.label.clone(), i, fractions(h))))
        .collect();
    let bar_panels = if panels == Panels::Curves {
        0
    } else {
        usize::from(!consistency.is_empty()) + usize::from(!staleness.is_empty())
    };
    if !curves && bar_panels == 0 {
        bail!("--panels bars: none of the runs has a consistency or staleness histogram");
    }
    let rows = if curves { 2 } else { 0 } + bar_panels.div_ceil(2);
    let head = if title.is_some() { 40 } else { 0 };
    let (w, h) = (1400u32, 420 * rows as u32 + head);
    let root = SVGBackend::new(out, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let body = match title {
        Some(t) => {
            let (top, rest) = root.split_vertically(head);
            top.titled(t, ("sans-serif", 22)).map_err(draw_err)?;
            rest
        }
        None => root.clone(),
    };
    let cells = body.split_evenly((rows, 2));
    let mut next = 0;
    if curves {
        let metric = &runs[0].metric_name;
        let which = if runs[0].held_out { "held-out" } else { "training" };
        let m = format!("{which} {metric}");
        let mb = |p: &Point| p.bytes_sent / 1e6;
        let t = |p: &Point| p.train_seconds;
        let met = |p: &Point| p.metric;
        let obj = |p: &Point| p.objective;
        // Legends where the curves usually are not: below a rising accuracy, above a falling
        // loss or RMSE.
        let up = SeriesLabelPosition::UpperRight;
        let ml = if metric == "accuracy" { SeriesLabelPosition::LowerRight } else { up.clone() };
        curve_panel(&cells[0], runs, &format!("{m} vs training time"), "training seconds", &m, t, met, ml.clone())?;
        curve_panel(&cells[1], runs, &format!("{m} vs bytes sent"), "MB sent per rank", &m, mb, met, ml)?;
        curve_panel(&cells[2], runs, "objective vs training time", "training seconds", "objective", t, obj, up.clone())?;
        curve_panel(&cells[3], runs, "objective vs bytes sent", "MB sent per rank", "objective", mb, obj, up)?;
        next = 4;
    }
    if bar_panels > 0 {
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

    #[test]
    fn fractions_sum_to_one_or_stay_zero() {
        assert_eq!(fractions(&[1.0, 3.0]), vec![0.25, 0.75]);
        assert_eq!(fractions(&[0.0, 0.0]), vec![0.0, 0.0]);
    }
}
