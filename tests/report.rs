//! The report pipeline cannot rot: `report/run.sh` with QUICK=1 (every section but torch, fewer
//! and shorter runs: this test took 156 s at load ~3 on this 2-core machine, 192 s at load 9, of
//! which the five claims scripts took 77 s) writes README.md, summary.json and SVGs, and what it
//! says holds against the metrics behind it. The opt-in torch section (PEERS=torch) is not run
//! here: it installs ~5 GB.

mod common;
use common::*;

use std::process::Command;

#[test]
fn quick_report_runs_every_section_and_its_numbers_hold() {
    let dir = scratch("report-quick");
    let out = dir.join("out");
    // The scripts can raise their session's autogroup (benches/priority.sh; told not to here);
    // the session is this test's, and the kernel keeps the value after they exit unless they put
    // it back. Left at -20 it starved the next netlab run's other host in the same session
    // (issue 27), so it must read the same after the run.
    let autogroup = || std::fs::read_to_string("/proc/self/autogroup").ok();
    let group_before = autogroup();
    let st = Command::new("timeout")
        .args(["-k", "10", "600", "report/run.sh"])
        .env("QUICK", "1")
        // Other test binaries run beside this one (tests/suite.py): no raised session group and
        // no ranks at nice -20 to starve them (benches/priority.sh). Emulated rows may then read
        // INVALID on a loaded machine; what is asserted below holds either way.
        .env("BENCH_PRIORITY", "keep")
        .env("NICE", "0")
        .env("BIN", bin())
        .env("RUNS", &dir)
        .env("OUT", &out)
        .output()
        .expect("report/run.sh runs");
    let log = format!("{}{}", String::from_utf8_lossy(&st.stdout), String::from_utf8_lossy(&st.stderr));
    assert!(st.status.success(), "report/run.sh failed:\n{log}");
    assert_eq!(autogroup(), group_before, "report/run.sh left this session's autogroup priority changed");

    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let readme = std::fs::read_to_string(out.join("README.md")).unwrap();
    for s in ["asap61", "asap62", "mixing", "stragglers", "bandwidth", "libsvm", "movielens", "peers", "sparse"] {
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
    for s in ["asap61", "asap62", "stragglers", "bandwidth", "libsvm"] {
        for row in summary[s]["rows"].as_array().unwrap() {
            let name = row["run"].as_str().unwrap();
            let sm = common::summary(&dir.join(s).join(format!("{name}.jsonl")));
            assert_eq!(row["final_metric"], sm["final_metric"], "{s}/{name}");
            let acc = sm["final_metric"].as_f64().unwrap();
            assert!(acc > 0.6 && acc <= 1.0, "{s}/{name}: accuracy {acc}");
        }
    }
    // asap61's tuned table (issue 40): each variant's best --sync-every is its first evaluation
    // at the target in that run's metrics (read here), and the best allreduce row is 1.00x.
    let tuned = summary["asap61"]["tuned"].as_array().expect("asap61 ran its --sync-every grid");
    for row in tuned {
        let Some(k) = row["best_sync_every"].as_u64() else { continue };
        let v = row["variant"].as_str().unwrap();
        let name =
            if k == 1 { format!("{v}-{}", row["tag"].as_str().unwrap()) } else { format!("{v}-k{k}-{}", row["tag"].as_str().unwrap()) };
        let hit = common::metrics(&dir.join("asap61").join(format!("{name}.jsonl")))
            .into_iter()
            .filter(|e| e["event"] == "eval" && e["test_metric"].as_f64().is_some_and(|a| a >= 0.82))
            .min_by_key(|e| e["round"].as_u64().unwrap())
            .unwrap_or_else(|| panic!("{name} never reached 82 %: {row}"));
        assert_eq!(hit["train_seconds"], row["best_seconds"], "{name}: {row}");
    }
    if let Some(b) = tuned
        .iter()
        .filter(|r| r["variant"].as_str().unwrap().starts_with("allreduce"))
        .filter_map(|r| r["best_seconds"].as_f64())
        .reduce(f64::min)
    {
        let ar = tuned.iter().find(|r| r["best_seconds"].as_f64() == Some(b)).unwrap();
        assert_eq!(ar["x_best_tuned_allreduce"].as_f64(), Some(1.0), "{ar}");
    }
    // MovieLens: every mode's held-out RMSE beats predicting the training set's mean rating
    // (computed here from the rating files), and SSP's row pushes send less than averaging the
    // whole model every round (the SSP/Bösen claim the table sets next to it).
    let ratings = |f: &str| -> Vec<f64> {
        std::fs::read_to_string(format!("datasets/out/{f}"))
            .unwrap()
            .lines()
            .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
            .collect()
    };
    let (train, test) = (ratings("movielens-train.ratings"), ratings("movielens-test.ratings"));
    let mean = train.iter().sum::<f64>() / train.len() as f64;
    let mean_rmse = (test.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / test.len() as f64).sqrt();
    let ml = summary["movielens"]["rows"].as_array().unwrap();
    assert_eq!(ml.len(), 3, "allreduce, asap, ssp: {ml:?}");
    for row in ml {
        let name = row["run"].as_str().unwrap();
        let jsonl = dir.join("movielens").join(format!("{name}.jsonl"));
        let sm = common::summary(&jsonl);
        assert_eq!(row["final_metric"], sm["final_metric"], "movielens/{name}");
        let rmse = sm["final_metric"].as_f64().unwrap();
        if name != "ssp-S3-dynsgd" {
            assert!(rmse < mean_rmse - 0.05, "movielens/{name}: RMSE {rmse} vs the mean rating's {mean_rmse}");
            continue;
        }
        // SSP at S = 3 with DynSGD: the server's model oscillates on a loaded schedule, so its
        // final RMSE meets no floor on every legal schedule. Beside two CPU burners, after the
        // stamp fix of issue 27: 2 of 8 runs ended at 1.10 and 1.13 (the floor here is ~1.008),
        // with spikes up to 1.98 on the way (in the one run checked, the workers' own replicas
        // stayed at 0.94-0.96 mean throughout), while ConSGD at S = 3, even at --lr 8, fell
        // smoothly to 0.90-0.93. Asserted instead:
        // the bound held on every read, the run learned (its best evaluation beats the floor:
        // 0.93-0.95 in those 8 runs and in every run measured), and the end is finite.
        let sync = &sm["sync_metrics"];
        assert!(sync["max_staleness"].as_f64().unwrap() <= 3.0, "movielens/{name}: {sync}");
        let hist = sync["staleness_histogram"].as_array().unwrap();
        assert_eq!(hist.len(), 5, "buckets 0..=3 and beyond the bound: {sync}");
        assert_eq!(hist[4], 0.0, "movielens/{name}: reads beyond the bound: {sync}");
        let marks: Vec<f64> = common::metrics(&jsonl).iter().filter_map(|v| v["test_metric"].as_f64()).collect();
        let best = marks.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(best < mean_rmse - 0.05, "movielens/{name}: best RMSE {best} of {marks:?} vs the mean rating's {mean_rmse}");
        assert!(rmse.is_finite(), "movielens/{name}: final RMSE {rmse}");
    }
    let sent = |n: &str| ml.iter().find(|r| r["run"] == n).unwrap()["mb_sent_per_rank"].as_f64().unwrap();
    assert!(sent("ssp-S3-dynsgd") < sent("allreduce"), "ssp {} MB vs allreduce {} MB", sent("ssp-S3-dynsgd"), sent("allreduce"));
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
    // The claims table opens the report: every paper's script ran, and every row it wrote has the
    // fields the table shows, a verdict from the closed set, and its own bench script named.
    let claims = summary["claims"].as_array().expect("summary.json has a claims array");
    let papers: std::collections::BTreeSet<&str> = claims.iter().map(|c| c["paper"].as_str().unwrap()).collect();
    assert!(papers.len() >= 5, "one paper or more per claim script: {papers:?}");
    let claims_at = readme.find("## The papers' claims").expect("README opens with the claims");
    assert!(readme.find("## ASAP 6.1").is_some_and(|a| a > claims_at), "the claims come first");
    for c in claims {
        for k in ["paper", "claim", "paper_value", "measured", "verdict"] {
            assert!(c[k].as_str().is_some_and(|v| !v.is_empty()), "claim row lacks {k}: {c}");
        }
        let v = c["verdict"].as_str().unwrap();
        assert!(["reproduced", "partly", "not reproduced", "not judged", "quick run: not judged"].contains(&v), "verdict {v}: {c}");
        let bench = c["bench"].as_str().unwrap();
        assert!(std::path::Path::new(bench).exists(), "{bench}");
        assert!(readme.contains(&c["claim"].as_str().unwrap().replace('|', "\\|")), "README lacks the claim {c}");
    }
}
