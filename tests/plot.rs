//! `asap-train plot` on the metrics of real runs: every run is a line in each curve panel with
//! one point per evaluation the run wrote, labelled by its mode and options; the asap run's
//! consistency and staleness histograms are bars whose heights follow the summary's counts.
//! Bad input is refused naming the file.

mod common;
use common::*;

/// (stroke colour, number of points) of every polyline in an SVG.
fn polylines(svg: &str) -> Vec<(String, usize)> {
    svg.split("<polyline")
        .skip(1)
        .map(|p| &p[..p.find('>').unwrap()])
        .map(|p| {
            let attr = |name: &str| {
                let i = p.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                p[i..i + p[i..].find('"').unwrap()].to_string()
            };
            (attr("stroke"), attr("points").split_whitespace().count())
        })
        .collect()
}

/// Heights of the filled rectangles of one colour, in drawing order.
fn bar_heights(svg: &str, fill: &str) -> Vec<i64> {
    svg.split("<rect")
        .skip(1)
        .map(|r| &r[..r.find('>').unwrap()])
        .filter(|r| r.contains(&format!("fill=\"{fill}\"")) && !r.contains("stroke=\"#"))
        .map(|r| {
            let i = r.find("height=\"").unwrap() + 8;
            r[i..i + r[i..].find('"').unwrap()].parse().unwrap()
        })
        .collect()
}

#[test]
fn plots_real_runs_with_one_series_per_run_and_the_histograms() {
    let dir = scratch("plot-real");
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let common = ["train", "--data", &data, "--test-fraction", "0.2", "--epochs", "1", "--eval-every", "10", "--seed", "3"];
    let m_all = dir.join("allreduce.jsonl");
    let m_asap = dir.join("asap.jsonl");
    let mut a: Vec<&str> = common.to_vec();
    a.extend(["--sync", "allreduce", "--metrics", s(&m_all)]);
    mpirun(4, &a, 120).expect_ok();
    let mut b: Vec<&str> = common.to_vec();
    b.extend(["--sync", "asap", "--graph", "root-expander", "--staleness", "1", "--metrics", s(&m_asap)]);
    mpirun(4, &b, 120).expect_ok();

    let svg_path = dir.join("out.svg");
    run(&["plot", s(&m_all), s(&m_asap), "-o", s(&svg_path), "--title", "two runs"], 60).expect_ok();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "not a complete SVG");

    // Labels from the start lines, once each in the figure's one legend (outside the panels).
    let count = |t: &str| svg.matches(&format!(">\n{t}\n</text>")).count();
    assert_eq!(count("allreduce 4r"), 1, "allreduce's legend entry");
    assert_eq!(count("asap root-expander S=1 4r"), 1, "asap's legend entry");
    for title in [
        "held-out accuracy vs training time",
        "objective vs bytes sent",
        "held-out accuracy vs epochs",
        "staleness distribution",
        "two runs",
    ] {
        assert_eq!(count(title), 1, "panel title {title:?}");
    }
    // The consistency histogram is drawn when it has two buckets or more (issue 43).
    let sm = &summary(&m_asap)["sync_metrics"];
    let counts = |k: &str| sm[k].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect::<Vec<_>>();
    let cons = counts("consistency_histogram");
    let spread = cons.iter().filter(|&&c| c > 0.0).count() > 1;
    assert_eq!(count("consistency histogram (ASAP Fig. 8)"), spread as usize, "{cons:?}");

    // One line per run in each of the 4 curve panels, with as many points as evaluations that
    // the metrics file holds (read independently here). Colours: each mode's own, in every
    // figure (allreduce blue, asap orange).
    let evals = |p: &std::path::Path| metrics(p).iter().filter(|v| v["event"] == "eval").count();
    let (n_all, n_asap) = (evals(&m_all), evals(&m_asap));
    assert!(n_all >= 3 && n_asap >= 3, "too few evaluations to tell lines from legend marks: {n_all}, {n_asap}");
    let lines = polylines(&svg);
    let series = |colour: &str| lines.iter().filter(|(c, n)| c == colour && *n > 2).map(|l| l.1).collect::<Vec<_>>();
    assert_eq!(series("#1F77B4"), vec![n_all; 6], "allreduce's lines: metric and objective against time, bytes and epochs");
    assert_eq!(series("#FF7F0E"), vec![n_asap; 6], "asap's lines");

    // Bars: only the asap run has histograms; their heights are proportional to the summary's
    // fractions (same scale in a panel, so the ratios of the counts survive up to rounding).
    let stal = counts("staleness_histogram");
    assert_eq!(cons.len(), 3, "in-degree 2: buckets 0, 1, 2");
    let heights = bar_heights(&svg, "#FF7F0E");
    let drawn = if spread { cons.len() } else { 0 };
    assert_eq!(heights.len(), drawn + stal.len(), "{heights:?}");
    let (c, rest) = heights.split_at(drawn);
    let check = |h: &[i64], c: &[f64]| {
        let (hmax, cmax) = (*h.iter().max().unwrap() as f64, c.iter().cloned().fold(0.0, f64::max));
        for (hi, ci) in h.iter().zip(c) {
            assert!((*hi as f64 / hmax - ci / cmax).abs() < 0.02, "bar heights {h:?} against counts {c:?}");
        }
    };
    if spread {
        check(c, &cons);
    }
    check(&rest[..stal.len()], &stal);
    assert!(bar_heights(&svg, "#1F77B4").is_empty(), "allreduce has no histograms, so no bars");
    // Accuracy in percent, as the console prints it; no minor grid (light lines).
    assert!(svg.contains("held-out accuracy (%)"), "percent axis");
}

#[test]
fn refuses_files_that_are_not_metrics_naming_them() {
    let dir = scratch("plot-bad");
    let f = write(&dir, "notes.jsonl", "{\"event\":\"start\",\"config\":{}}\nthis is not json\n");
    run(&["plot", &f, "-o", s(&dir.join("x.svg"))], 30).expect_failure(&["notes.jsonl line 2"]);
    let g = write(&dir, "empty.jsonl", "");
    run(&["plot", &g, "-o", s(&dir.join("x.svg"))], 30).expect_failure(&["empty.jsonl: no start line"]);
    run(&["plot", &f, "-o", s(&dir.join("x.svg")), "--labels", "a,b"], 30).expect_failure(&["--labels has 2 labels for 1 files"]);
    assert!(!dir.join("x.svg").exists(), "no SVG written on bad input");
}

/// Issue 43, item 7: a run judged on its worst rank draws its --target (grey, dashed) and that
/// rank's curve (dashed, in the run's colour) beside the averaged model's; no tick reads "-0";
/// an LDA run plots its held-out perplexity and log-likelihood (it drew four empty axes).
#[test]
fn targets_worst_ranks_and_lda_runs_are_drawn() {
    let dir = scratch("plot-marks");
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let m = dir.join("asap.jsonl");
    let args = ["train", "--data", &data, "--test-fraction", "0.2", "--epochs", "1", "--eval-every", "10", "--seed", "3"];
    let mut a = args.to_vec();
    a.extend(["--sync", "asap", "--target", "0.7", "--target-on", "worst-rank", "--own-models", "0", "--metrics", s(&m)]);
    mpirun(4, &a, 120).expect_ok();
    let svg_path = dir.join("marks.svg");
    run(&["plot", s(&m), "-o", s(&svg_path)], 60).expect_ok();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.contains("stroke=\"#6E6E6E\""), "the target line");
    let texts: Vec<&str> = svg.split("<text").skip(1).map(|t| t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()].trim()).collect();
    assert!(!texts.iter().any(|t| t.starts_with("-0") && t.chars().skip(1).all(|c| c == '0' || c == '.')), "{texts:?}");
    // The worst rank's dashes: short orange polylines beside the averaged model's long ones.
    let dashes = polylines(&svg).iter().filter(|(c, n)| c == "#FF7F0E" && *n == 2).count();
    assert!(dashes > 0, "the worst rank's dashed curve");

    let corpus = dir.join("docword.p.txt");
    let synth = ["data", "synth-lda", s(&corpus), "--docs", "60", "--words", "50", "--topics", "3", "--doc-length", "40"];
    run(&synth, 60).expect_ok();
    let held = dir.join("docword.q.txt");
    let mut synth = synth.to_vec();
    synth[2] = s(&held);
    synth.extend(["--seed", "2"]);
    run(&synth, 60).expect_ok();
    let l = dir.join("lda.jsonl");
    let (c, h) = (s(&corpus), s(&held));
    let lda = ["train", "--model", "lda", "--sync", "allreduce", "--topics", "3", "--data", c, "--test-data", h, "--epochs", "4"];
    let mut a = lda.to_vec();
    a.extend(["--eval-every", "2", "--metrics", s(&l)]);
    mpirun(2, &a, 120).expect_ok();
    let svg_path = dir.join("lda.svg");
    run(&["plot", s(&l), "-o", s(&svg_path)], 60).expect_ok();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    for title in ["held-out perplexity vs training time", "log-likelihood per token vs epochs"] {
        assert!(svg.contains(&format!(">\n{title}\n</text>")), "{title}");
    }
    let evals = metrics(&l).iter().filter(|v| v["event"] == "eval").count();
    assert!(polylines(&svg).iter().any(|(_, n)| *n == evals), "a line of every evaluation ({evals})");
}
