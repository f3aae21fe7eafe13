//! `--sync bosen` and `--emulate-bandwidth` under real `mpirun`: the budget holds over every 1 s
//! window of the recorded sends, each priority / fp16 / AdaRevision trains and spends spare
//! budget between clocks, the emulated link paces allreduce and asap too, and misuse is refused.

mod common;
use common::*;

fn t10k() -> String {
    format!("{FASHION}/t10k-images-idx3-ubyte.gz")
}

/// (seconds, bytes) rows of a `--send-log` file.
fn send_log(path: &std::path::Path) -> Vec<(f64, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("seconds,bytes"));
    lines
        .map(|l| {
            let (t, b) = l.split_once(',').expect("two columns");
            (t.parse().unwrap(), b.parse().unwrap())
        })
        .collect()
}

/// The most bytes in any 1 s window (windows starting at a send: the worst case).
fn peak_per_second(log: &[(f64, u64)]) -> f64 {
    let mut best = 0u64;
    for (i, &(t0, _)) in log.iter().enumerate() {
        let sum: u64 = log[i..].iter().take_while(|(t, _)| *t < t0 + 1.0).map(|x| x.1).sum();
        best = best.max(sum);
    }
    best as f64
}

/// From the recorded send times, no rank ever sends more than its budget (+5 %) in any 1 s
/// window, and the budget is really spent (the run is bandwidth-bound: at 1 MB/s a clock's
/// exchange takes longer than its compute).
#[test]
fn budget_holds_over_every_one_second_window() {
    let dir = scratch("bosen-budget");
    let (m, log) = (dir.join("m.jsonl"), dir.join("sends"));
    // 8 Mbit/s = 1e6 bytes/s per rank.
    let args = ["train", "--data", &t10k(), "--sync", "bosen", "--bandwidth-mbps", "8", "--queue-size", "4",
        "--sync-every", "5", "--epochs", "10", "--max-rounds", "120", "--metrics", s(&m), "--send-log", s(&log)];
    mpirun(4, &args, 180).expect_ok();
    for r in 0..4 {
        let l = send_log(&dir.join(format!("sends.rank{r}.csv")));
        assert!(l.windows(2).all(|w| w[0].0 <= w[1].0), "rank {r}: the log is in time order");
        let total: u64 = l.iter().map(|x| x.1).sum();
        let span = l.last().unwrap().0 - l[0].0;
        assert!(span > 1.5, "rank {r}: the run must last a few windows to test them ({span:.2} s, {total} bytes)");
        let peak = peak_per_second(&l);
        assert!(peak <= 1.05e6, "rank {r}: {peak} bytes in one second against a budget of 1e6");
        assert!(peak >= 0.5e6, "rank {r}: only {peak} bytes/s: the budget should be the bottleneck here");
    }
    let sm = summary(&m);
    assert_eq!(sm["sync"], "bosen");
    let sync = &sm["sync_metrics"];
    assert!(sync["early_pushes"].as_f64().unwrap() > 0.0, "spare budget between clocks sends updates: {sync}");
    // Bosen Figure 5a as data: how often each of the 10 rows went out.
    let pushes = sync["row_pushes"].as_array().unwrap();
    assert_eq!(pushes.len(), 10);
    assert!(pushes.iter().all(|x| x.as_f64().unwrap() >= 40.0), "every row goes out at least once per clock per rank: {pushes:?}");
}

/// Every prioritisation, fp16 and AdaRevision train to a sensible accuracy under the SSP bound;
/// fp16 halves the bytes of the values it pushes, so the same clocks cost fewer bytes.
#[test]
fn each_priority_fp16_and_adarevision_train() {
    let dir = scratch("bosen-options");
    let run = |name: &str, extra: &[&str]| -> serde_json::Value {
        let m = dir.join(format!("{name}.jsonl"));
        let mut a = vec!["train", "--data", t10k_static(), "--sync", "bosen", "--bandwidth-mbps", "400", "--sync-every", "10",
            "--epochs", "2", "--staleness", "2", "--metrics", s(&m)];
        a.extend(extra);
        mpirun(4, &a, 180).expect_ok();
        summary(&m)
    };
    // Bytes per pushed value (headers and row indices included).
    let per_value = |sm: &serde_json::Value| sm["sync_metrics"]["push_bytes"].as_f64().unwrap() / sm["sync_metrics"]["pushed_values"].as_f64().unwrap();
    for p in ["random", "round-robin", "absolute", "relative"] {
        let sm = run(p, &["--priority", p]);
        let acc = sm["final_metric"].as_f64().unwrap();
        assert!(acc > 0.77, "{p}: {acc}");
        let sync = &sm["sync_metrics"];
        let h: Vec<f64> = sync["staleness_histogram"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(*h.last().unwrap(), 0.0, "{p}: a read older than S: {h:?}");
        assert!(sync["early_pushes"].as_f64().unwrap() > 0.0, "{p}: {sync}");
        let b = per_value(&sm);
        assert!((4.0..4.2).contains(&b), "{p}: {b} bytes per pushed f32 value");
    }
    let sm = run("fp16", &["--priority", "relative", "--fp16"]);
    assert!(sm["final_metric"].as_f64().unwrap() > 0.77, "{sm}");
    let b = per_value(&sm);
    assert!((2.0..2.2).contains(&b), "fp16: {b} bytes per pushed value");
    let sm = run("adarevision", &["--lr-schedule", "adarevision", "--lr", "0.1"]);
    assert!(sm["final_metric"].as_f64().unwrap() > 0.77, "{sm}");
    let sync = &sm["sync_metrics"];
    assert_eq!(sync["adarevision_snapshot_misses"].as_f64(), Some(0.0), "{sync}");
    assert!(sync["adarevision_snapshots_max"].as_f64().unwrap() >= 1.0, "{sync}");
}

/// A bosen run stopped by --max-rounds resumes from its checkpoint (the servers' rows,
/// AdaRevision state, the clients' unsent updates) and finishes.
#[test]
fn bosen_resumes_from_a_checkpoint() {
    let dir = scratch("bosen-resume");
    let ck = dir.join("ck");
    let m = dir.join("m.jsonl");
    let base = ["train", "--data", t10k_static(), "--sync", "bosen", "--bandwidth-mbps", "400", "--fp16", "--sync-every", "2",
        "--lr-schedule", "adarevision", "--lr", "0.1", "--epochs", "2", "--checkpoint-dir", s(&ck), "--metrics", s(&m)];
    let mut first = base.to_vec();
    first.extend(["--max-rounds", "40"]);
    mpirun(4, &first, 180).expect_ok();
    let mut second = base.to_vec();
    second.push("--resume");
    mpirun(4, &second, 180).expect_ok();
    let sm = summary(&m);
    // 2500 examples per rank, 78-79 mini-batches per epoch, 2 epochs, a clock every 2: the
    // resumed run went on from round 40 to the end.
    assert!(sm["rounds"].as_u64().unwrap() >= 78, "{sm}");
    assert!(sm["final_metric"].as_f64().unwrap() > 0.77, "{sm}");
}

/// `--emulate-bandwidth` paces allreduce's and asap's sends as well: the recorded sends never
/// exceed the rate, and the run takes at least the time the link needs for its bytes.
#[test]
fn emulated_link_paces_allreduce_and_asap() {
    let dir = scratch("emulate");
    for mode in ["allreduce", "asap"] {
        let (m, log) = (dir.join(format!("{mode}.jsonl")), dir.join(mode));
        // 2 Mbit/s = 250 kB/s; an MLR model is 31 kB.
        let args = ["train", "--data", &t10k(), "--sync", mode, "--emulate-bandwidth", "2", "--emulate-latency", "1",
            "--sync-every", "4", "--epochs", "1", "--max-rounds", "30", "--metrics", s(&m), "--send-log", s(&log)];
        mpirun(4, &args, 180).expect_ok();
        let sm = summary(&m);
        for r in 0..4 {
            let l = send_log(&dir.join(format!("{mode}.rank{r}.csv")));
            let total: u64 = l.iter().map(|x| x.1).sum();
            let peak = peak_per_second(&l);
            assert!(peak <= 1.05 * 250e3 + 32e3, "{mode} rank {r}: {peak} bytes in one second at 250 kB/s");
            // The link needs total / rate seconds; the sync time of the rank covers it.
            let need = total as f64 / 250e3;
            let sync = sm["counters"]["sync_seconds"]["max"].as_f64().unwrap();
            assert!(sync >= 0.95 * need, "{mode} rank {r}: {total} bytes need {need:.2} s on the link, sync took {sync:.2} s");
        }
    }
}

#[test]
fn misuse_is_refused_with_the_option_to_fix() {
    let cases: [(&[&str], &str); 4] = [
        (&["--sync", "bosen"], "--bandwidth-mbps"),
        (&["--sync", "bosen", "--bandwidth-mbps", "10", "--apply", "dynsgd"], "--apply consgd"),
        (&["--sync", "ssp", "--lr-schedule", "adarevision"], "needs --sync bosen"),
        (&["--sync", "allreduce", "--emulate-bandwidth", "-3"], "--emulate-bandwidth must be a positive"),
    ];
    for (extra, needle) in cases {
        let mut a = vec!["train", "--data", t10k_static()];
        a.extend(extra);
        mpirun(2, &a, 60).expect_failure(&[needle]);
    }
}

fn t10k_static() -> &'static str {
    "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
}
