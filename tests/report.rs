//! The report pipeline cannot rot: `report/run.sh` with QUICK=1 (every section, fewer and shorter
//! runs: ~1 minute on a quiet 2-core machine) writes README.md, summary.json and SVGs, and what it
//! says holds against the metrics behind it.

mod common;
use common::*;

use std::process::Command;

#[test]
fn quick_report_runs_every_section_and_its_numbers_hold() {
    let dir = scratch("report-quick");
    let out = dir.join("out");
    let st = Command::new("timeout")
        .args(["-k", "10", "600", "report/run.sh"])
        .env("QUICK", "1")
        .env("BIN", bin())
        .env("RUNS", &dir)
        .env("OUT", &out)
        .output()
        .expect("report/run.sh runs");
    let log = format!("{}{}", String::from_utf8_lossy(&st.stdout), String::from_utf8_lossy(&st.stderr));
    assert!(st.status.success(), "report/run.sh failed:\n{log}");

    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let readme = std::fs::read_to_string(out.join("README.md")).unwrap();
    for s in ["asap61", "asap62", "mixing", "stragglers", "bandwidth", "peers", "sparse"] {
        let sec = &summary[s];
        assert!(sec["rows"].as_array().is_some_and(|r| !r.is_empty()), "section {s} has no rows: {sec}");
        assert!(sec["load"].as_str().is_some_and(|l| l.split(' ').count() == 3), "section {s} lacks its load average");
        let title = sec["title"].as_str().unwrap();
        assert!(readme.contains(&format!("## {title}")), "README lacks {title}");
        assert!(readme.contains(&format!("Re-run: `report/run.sh {s}")), "README lacks the command of {s}");
        // Every embedded plot exists and has lines in it.
        for svg in sec["svgs"].as_array().unwrap() {
            let svg = svg.as_str().unwrap();
            assert!(readme.contains(&format!("]({svg})")), "{svg} not embedded");
            let text = std::fs::read_to_string(out.join(svg)).unwrap();
            assert!(text.starts_with("<svg") && text.contains("<polyline"), "{svg} is not a plot");
        }
    }
    // Training rows agree with their metrics files (read here independently).
    for s in ["asap61", "asap62", "stragglers", "bandwidth"] {
        for row in summary[s]["rows"].as_array().unwrap() {
            let name = row["run"].as_str().unwrap();
            let sm = common::summary(&dir.join(s).join(format!("{name}.jsonl")));
            assert_eq!(row["final_metric"], sm["final_metric"], "{s}/{name}");
            let acc = sm["final_metric"].as_f64().unwrap();
            assert!(acc > 0.6 && acc <= 1.0, "{s}/{name}: accuracy {acc}");
        }
    }
    // ASAP Fig. 8's claim, checked: NOTIFY-ACK used every in-neighbour in every reduce.
    let na = summary["asap62"]["rows"].as_array().unwrap().iter().find(|r| r["run"] == "asap-notify-ack").unwrap();
    let h: Vec<f64> = na["consistency_histogram"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert!(h[h.len() - 1] > 0.0 && h[..h.len() - 1].iter().all(|&x| x == 0.0), "NOTIFY-ACK histogram {h:?}");
    // Mixing: measured rounds within 2x of the spectral gap's prediction (the criterion).
    for row in summary["mixing"]["rows"].as_array().unwrap() {
        let r = row["ratio"].as_f64().unwrap_or_else(|| panic!("consensus never fell by 1e-3: {row}"));
        assert!((0.5..=2.0).contains(&r), "measured/predicted {r}: {row}");
    }
    // Peers: scikit-learn and LIBLINEAR learned something real on the same test set.
    let peers = summary["peers"]["rows"].as_array().unwrap();
    assert_eq!(peers.len(), 5, "ours + 2 scikit-learn + 2 LIBLINEAR rows: {peers:?}");
    assert!(peers.iter().all(|p| p["accuracy"].as_f64().unwrap() > 0.7), "{peers:?}");
    // Sparse: the whole synthetic set was trained on at 1, 4 and 8 ranks, each rank measured.
    let ranks: Vec<u64> = summary["sparse"]["rows"].as_array().unwrap().iter().map(|r| r["ranks"].as_u64().unwrap()).collect();
    assert_eq!(ranks, vec![1, 4, 8]);
    for row in summary["sparse"]["rows"].as_array().unwrap() {
        assert_eq!(row["train_examples"].as_u64().unwrap(), 20000, "{row}");
        assert!(row["peak_rss_mb_max"].as_f64().unwrap() >= row["peak_rss_mb_mean"].as_f64().unwrap(), "{row}");
    }
}
