//! `--sync bosen` and `--emulate-bandwidth` under real `mpirun`: the budget holds over every 1 s
//! window of the recorded sends, each priority / fp16 / AdaRevision trains and spends spare
//! budget between clocks, the emulated link paces allreduce and asap too, and misuse is refused.
//! The same budget on asap's graph edges holds, delivers every row, and resumes exactly.

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
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "bosen",
        "--bandwidth-mbps",
        "8",
        "--queue-size",
        "4",
        "--sync-every",
        "5",
        "--epochs",
        "10",
        "--max-rounds",
        "120",
        "--metrics",
        s(&m),
        "--send-log",
        s(&log),
    ];
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

/// Spare budget is spent during a clock, not one message per local step: with long clocks
/// (100 steps of 50 ms) whose mini-batches change more rows than the budget carries, a rank's
/// sends keep within the budget over every 1 s window and use most of it. Before the early
/// sends filled the budget up to the next step, a step sent at most one message of
/// --queue-size rows from the client and one from the server (here 2 x 1 row): main's binary
/// before the change sent 3.1-3.2 kB/s of the 10 kB/s in this run, the change 9.7 kB/s, both
/// with at most 10.08 kB in any 1 s window (2026-11-27, under the bench lock at nice -20).
#[test]
fn early_sends_spend_the_budget_during_a_clock() {
    let dir = scratch("bosen-fill");
    let data = fixed_ratings(&dir);
    let (m, log) = (dir.join("m.jsonl"), dir.join("sends"));
    // 0.08 Mbit/s = 1e4 bytes/s per rank; 500 ratings per rank in steps of 5 (up to 10 changed
    // rows, ~0.5 kB, a step); a clock is an epoch of 100 steps.
    let args = [
        "train",
        "--data",
        s(&data),
        "--model",
        "mf",
        "--lr",
        "0.05",
        "--sync",
        "bosen",
        "--bandwidth-mbps",
        "0.08",
        "--queue-size",
        "1",
        "--batch-size",
        "5",
        "--sync-every",
        "100",
        "--epochs",
        "2",
        "--staleness",
        "1",
        "--emulate-compute",
        "50",
        "--metrics",
        s(&m),
        "--send-log",
        s(&log),
    ];
    mpirun(4, &args, 180).expect_ok();
    for r in 0..4 {
        let l = send_log(&dir.join(format!("sends.rank{r}.csv")));
        let total: u64 = l.iter().map(|x| x.1).sum();
        let span = l.last().unwrap().0 - l[0].0;
        assert!(span > 5.0, "rank {r}: two clocks of 5 s must span the log ({span:.2} s)");
        let peak = peak_per_second(&l);
        assert!(peak <= 1.05e4, "rank {r}: {peak} bytes in one second against a budget of 1e4");
        let rate = total as f64 / span;
        assert!(rate >= 0.8e4, "rank {r}: {rate:.0} bytes/s over the run: spare budget during the clocks must be spent (budget 1e4)");
    }
}

/// 50 users x 50 items, 2,000 ratings from a fixed generator (the tests' own data).
fn fixed_ratings(dir: &std::path::Path) -> std::path::PathBuf {
    let mut text = String::new();
    let mut x: u64 = 12345;
    for _ in 0..2000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let (u, i, r) = ((x >> 33) % 50, (x >> 17) % 50, 1 + (x >> 45) % 5);
        text.push_str(&format!("{u} {i} {r}\n"));
    }
    let data = dir.join("r.ratings");
    std::fs::write(&data, text).unwrap();
    data
}

/// Every evaluation of a parameter-server run finishes, with one record per epoch:
/// - at S = 0 with messages held in the process (bosen's budget, an emulated link), where a rank
///   whose shard was ready went into the evaluation's allreduce still holding another shard's
///   pushes (the first three hung until --wait-timeout, on MovieLens' first 2,000 ratings too);
/// - with `--sync-every` above an epoch's 16 steps, where two epochs end at the same round and
///   the second evaluation waited for a snapshot the first had taken (bosen, ssp, async).
#[test]
fn evaluations_finish_with_held_messages_and_rounds_shared_by_epochs() {
    let dir = scratch("ps-evaluations");
    let data = fixed_ratings(&dir);
    let cases: [&[&str]; 6] = [
        &["--sync", "ssp", "--staleness", "0", "--batch-size", "125", "--emulate-bandwidth", "10"],
        &["--sync", "bosen", "--bandwidth-mbps", "100", "--batch-size", "125", "--staleness", "0"],
        // One step an epoch: the default staleness is fitted to 0.
        &["--sync", "bosen", "--bandwidth-mbps", "100", "--batch-size", "500"],
        &["--sync", "bosen", "--bandwidth-mbps", "100", "--sync-every", "40", "--staleness", "2"],
        &["--sync", "ssp", "--sync-every", "40", "--staleness", "2"],
        &["--sync", "async", "--sync-every", "40", "--barrier", "ssp:2"],
    ];
    for (i, extra) in cases.iter().enumerate() {
        let m = dir.join(format!("m{i}.jsonl"));
        // --wait-timeout 5: a wait that never ends fails in about a minute (ten extensions
        // while every rank lives), inside the launch limit.
        let mut a = vec!["train", "--data", s(&data), "--model", "mf", "--epochs", "3", "--wait-timeout", "5", "--metrics", s(&m)];
        a.extend(*extra);
        mpirun(4, &a, 120).expect_ok();
        let evals: Vec<f64> = metrics(&m).iter().filter(|x| x["event"] == "eval").map(|x| x["epoch"].as_f64().unwrap()).collect();
        assert_eq!(evals, [1.0, 2.0, 3.0], "{extra:?}");
        assert!(summary(&m)["final_metric"].as_f64().unwrap().is_finite(), "{extra:?}");
    }
}

/// Every prioritisation, fp16 and AdaRevision train to a sensible accuracy under the SSP bound;
/// fp16 halves the bytes of the values it pushes, so the same clocks cost fewer bytes.
#[test]
fn each_priority_fp16_and_adarevision_train() {
    let dir = scratch("bosen-options");
    let run = |name: &str, extra: &[&str]| -> serde_json::Value {
        let m = dir.join(format!("{name}.jsonl"));
        let mut a = vec![
            "train",
            "--data",
            t10k_static(),
            "--sync",
            "bosen",
            "--bandwidth-mbps",
            "400",
            "--sync-every",
            "10",
            "--epochs",
            "2",
            "--staleness",
            "2",
            "--metrics",
            s(&m),
        ];
        a.extend(extra);
        mpirun(4, &a, 180).expect_ok();
        summary(&m)
    };
    // Bytes per pushed value (headers and row indices included).
    let per_value =
        |sm: &serde_json::Value| sm["sync_metrics"]["push_bytes"].as_f64().unwrap() / sm["sync_metrics"]["pushed_values"].as_f64().unwrap();
    for p in ["random", "round-robin", "absolute", "relative"] {
        let sm = run(p, &["--priority", p]);
        let acc = sm["final_metric"].as_f64().unwrap();
        // Schedule-dependent (which early pushes a read sees): see `TRAINED`. One suite run
        // beside two CPU burners ended at 0.7598 against the old floor of 0.77.
        assert!(acc > TRAINED, "{p}: {acc}");
        let sync = &sm["sync_metrics"];
        let h: Vec<f64> = sync["staleness_histogram"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(*h.last().unwrap(), 0.0, "{p}: a read older than S: {h:?}");
        assert!(sync["early_pushes"].as_f64().unwrap() > 0.0, "{p}: {sync}");
        let b = per_value(&sm);
        assert!((4.0..4.2).contains(&b), "{p}: {b} bytes per pushed f32 value");
    }
    let sm = run("fp16", &["--priority", "relative", "--compress", "fp16"]);
    assert!(sm["final_metric"].as_f64().unwrap() > TRAINED, "{sm}");
    let b = per_value(&sm);
    assert!((2.0..2.2).contains(&b), "fp16: {b} bytes per pushed value");
    let sm = run("adarevision", &["--lr-schedule", "adarevision", "--lr", "0.1"]);
    assert!(sm["final_metric"].as_f64().unwrap() > TRAINED, "{sm}");
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
    let base = [
        "train",
        "--data",
        t10k_static(),
        "--sync",
        "bosen",
        "--bandwidth-mbps",
        "400",
        "--compress",
        "fp16",
        "--sync-every",
        "2",
        "--lr-schedule",
        "adarevision",
        "--lr",
        "0.1",
        "--epochs",
        "2",
        "--checkpoint-dir",
        s(&ck),
        "--metrics",
        s(&m),
    ];
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
    assert!(sm["final_metric"].as_f64().unwrap() > TRAINED, "{sm}");
}

/// `--emulate-bandwidth` paces allreduce's and asap's sends as well: the recorded sends never
/// exceed the rate, and the run takes at least the time the link needs for its bytes.
#[test]
fn emulated_link_paces_allreduce_and_asap() {
    let dir = scratch("emulate");
    for mode in ["allreduce", "asap"] {
        let (m, log) = (dir.join(format!("{mode}.jsonl")), dir.join(mode));
        // 2 Mbit/s = 250 kB/s; an MLR model is 31 kB.
        let args = [
            "train",
            "--data",
            &t10k(),
            "--sync",
            mode,
            "--emulate-bandwidth",
            "2",
            "--emulate-latency",
            "1",
            "--sync-every",
            "4",
            "--epochs",
            "1",
            "--max-rounds",
            "30",
            "--metrics",
            s(&m),
            "--send-log",
            s(&log),
        ];
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

/// asap with a budget on its graph edges: the recorded sends (messages, NOTIFY and ACK words)
/// hold the budget over every 1 s window and spend it; the budget binds (rows wait), yet every
/// row goes out again and again (per-edge residuals); NOTIFY-ACK keeps every message consistent,
/// so every reduce used all in-neighbours and no row was torn.
#[test]
fn asap_edge_budget_holds_and_every_row_arrives() {
    let dir = scratch("asap-budget");
    let (m, log) = (dir.join("m.jsonl"), dir.join("sends"));
    // 2 Mbit/s = 250 kB/s per rank; a full MLR message is 31 kB per edge and round, about
    // 125 ms of budget, while a round takes about 1.5 ms (steps declared at 1.5 ms on 2,500
    // examples per rank; 1,580 rounds in at least 2.4 s): the budget, not the compute, decides
    // what goes out. Measured on 2 cores at load 2 (with 10x slowed real steps then): 62,708
    // row-rounds held against 492 rows sent, so rounds may be 80x slower (a busy machine) before
    // the budget stops binding. At 8 Mbit/s the margin was 25x, and one suite run beside 32-rank
    // benchmarks at load ~24 broke it. Declared, not slowed real steps: once the MLR kernel got
    // 1.8x faster (issue 44), 10x its real step made a run of 1.38 s, too short for the windows.
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "asap",
        "--graph",
        "ring",
        "--bandwidth-mbps",
        "2",
        "--priority",
        "relative",
        "--epochs",
        "20",
        "--emulate-compute",
        "1.5",
        "--metrics",
        s(&m),
        "--send-log",
        s(&log),
    ];
    mpirun(4, &args, 180).expect_ok();
    for r in 0..4 {
        let l = send_log(&dir.join(format!("sends.rank{r}.csv")));
        let span = l.last().unwrap().0 - l[0].0;
        assert!(span > 1.5, "rank {r}: the run must last a few windows to test them ({span:.2} s)");
        let peak = peak_per_second(&l);
        assert!(peak <= 1.05 * 250e3, "rank {r}: {peak} bytes in one second against a budget of 250 kB");
        assert!(peak >= 0.5 * 250e3, "rank {r}: only {peak} bytes/s: the budget should be spent");
    }
    let sm = summary(&m);
    let sync = &sm["sync_metrics"];
    let f = |k: &str| sync[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {sync}"));
    let rounds = sm["rounds"].as_f64().unwrap();
    assert_eq!(f("torn"), 0.0, "{sync}");
    // Every reduce of every rank used its in-neighbour's message.
    let hist: Vec<f64> = sync["consistency_histogram"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let d = f("in_degree") as usize;
    assert_eq!(hist.len(), d + 1, "{sync}");
    assert_eq!(hist[d], 4.0 * rounds, "{sync}");
    // Each receiver's cache of each sender equals the sender's record of what it sent.
    assert_eq!(f("edge_mismatched_rows"), 0.0, "{sync}");
    assert!(f("rows_held") > f("rows_sent"), "the budget must hold rows back: {sync}");
    let pushes = sync["row_pushes"].as_array().unwrap();
    assert_eq!(pushes.len(), 10);
    // 4 out-edges in all, 20 epochs: every row reached every neighbour many times (relative
    // priority starves no row). Measured: 29 to 75 per row in 1.8 s; a slower run sends more.
    assert!(pushes.iter().all(|x| x.as_f64().unwrap() >= 10.0), "every row keeps going out: {pushes:?}");
    // Per row: counts of how many neighbours' rows came in this round, over (reduce, row) pairs.
    let rows: f64 = sync["row_consistency_histogram"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).sum();
    assert_eq!(rows, 4.0 * rounds * 10.0, "{sync}");
    assert!(sm["final_metric"].as_f64().unwrap() > TRAINED, "{sm}");
}

/// A budget larger than anything a round sends makes the edges carry every changed row every
/// round: the model is bit for bit plain asap's (an oracle for the mirrors, caches and reduce).
/// Under a tight budget what goes out depends on timing, so a resumed run is checked by the
/// protocol's invariant instead: after resuming from the checkpoint (mirrors, caches and their
/// round stamps) every receiver's cache still equals its sender's mirror, and the run trains on.
#[test]
fn asap_edge_budget_matches_plain_asap_and_resumes_consistently() {
    let dir = scratch("asap-budget-exact");
    let train = |name: &str, extra: &[&str]| -> (Vec<f32>, serde_json::Value) {
        let (out, m) = (dir.join(format!("{name}.h5")), dir.join(format!("{name}.jsonl")));
        let mut a = vec!["train", "--data", t10k_static(), "--sync", "asap", "--epochs", "1", "--save-model", s(&out), "--metrics", s(&m)];
        a.extend(extra);
        mpirun(4, &a, 180).expect_ok();
        (hdf5::File::open(&out).unwrap().dataset("params").unwrap().read_raw().unwrap(), summary(&m))
    };
    let (plain, _) = train("plain", &[]);
    let (unlimited, _) = train("unlimited", &["--bandwidth-mbps", "1e7"]);
    assert!(plain == unlimited, "an unexhausted budget changed the model");
    // 2 Mbit/s: a 10 kB bucket, about three rows a round once it is spent.
    let tight = ["--bandwidth-mbps", "2", "--priority", "absolute"];
    let ck = dir.join("ck");
    let mut first = tight.to_vec();
    first.extend(["--checkpoint-dir", s(&ck), "--max-rounds", "30"]);
    let (_, sm) = train("first", &first);
    assert!(sm["sync_metrics"]["rows_held"].as_f64().unwrap() > 0.0, "2 Mbit/s should hold rows back: {sm}");
    let mut second = tight.to_vec();
    // Two rounds after the resume, too few to resend every row: a cache not restored shows.
    second.extend(["--checkpoint-dir", s(&ck), "--resume", "--max-rounds", "32"]);
    let (_, sm) = train("resumed", &second);
    assert_eq!(sm["rounds"].as_u64(), Some(32), "{sm}");
    assert_eq!(sm["sync_metrics"]["edge_mismatched_rows"].as_f64(), Some(0.0), "{sm}");
}

#[test]
fn misuse_is_refused_with_the_option_to_fix() {
    let cases: [(&[&str], &str); 10] = [
        (&["--sync", "bosen"], "--bandwidth-mbps"),
        (&["--sync", "bosen", "--bandwidth-mbps", "10", "--apply", "dynsgd"], "--apply consgd"),
        (&["--sync", "ssp", "--lr-schedule", "adarevision"], "needs --sync bosen"),
        (&["--sync", "allreduce", "--emulate-bandwidth", "-3"], "--emulate-bandwidth <MBPS[,RANKS:MBPS]>': expected Mbit/s"),
        (&["--sync", "allreduce", "--bandwidth-mbps", "10"], "--bandwidth-mbps applies to --sync asap and to --sync bosen"),
        (&["--sync", "asap", "--bandwidth-mbps", "10", "--notify", "barrier"], "needs --notify notify-ack"),
        (&["--sync", "asap", "--bandwidth-mbps", "10", "--queue-size", "5"], "--queue-size applies to --sync bosen"),
        // One codec option: bosen's half precision is --compress fp16; the old flag names it.
        (&["--sync", "bosen", "--bandwidth-mbps", "10", "--fp16"], "--fp16 is now --compress fp16"),
        (
            &["--sync", "bosen", "--bandwidth-mbps", "10", "--compress", "int8"],
            "--compress int8 with --sync bosen: its row pushes take --compress fp16",
        ),
        (&["--sync", "bosen", "--bandwidth-mbps", "10", "--compress", "topk:0.01"], "--compress topk:0.01 with --sync bosen"),
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
