//! `--sync gaia` under real `mpirun`: significance 0 against allreduce over all ranks (an
//! independent mode), nothing lost by the filter (every group's copy equal after the residuals'
//! flush), the mirror-clock bound with a slow group, a resumed run bit-identical, bad input;
//! `--gaia-inner asap` (ASAP's stochastic reduce inside each group): it trains, the reduce ran
//! with every in-neighbour's model every clock, and the end's correction makes the groups'
//! copies agree although the replicas inside a group differ.

mod common;
use common::*;

fn t10k() -> String {
    format!("{FASHION}/t10k-images-idx3-ubyte.gz")
}

fn read_model(p: &std::path::Path) -> Vec<f32> {
    hdf5::File::open(p).unwrap().dataset("params").unwrap().read_raw().unwrap()
}

fn num(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

/// With every update significant and the groups meeting every clock, each group's copy is the
/// average of all replicas: what `--sync allreduce` computes, up to the order of float additions.
#[test]
fn significance_zero_matches_allreduce_over_all_ranks() {
    let dir = scratch("gaia-allreduce");
    let base = ["train", "--data", &t10k(), "--epochs", "1", "--batch-size", "64"];
    let run = |name: &str, extra: &[&str]| -> (Vec<f32>, serde_json::Value) {
        let (model, m) = (dir.join(format!("{name}.h5")), dir.join(format!("{name}.jsonl")));
        let mut a: Vec<&str> = base.to_vec();
        a.extend(extra);
        a.extend(["--save-model", s(&model), "--metrics", s(&m)]);
        mpirun(4, &a, 120).expect_ok();
        (read_model(&model), summary(&m))
    };
    let (ar, ar_s) = run("allreduce", &["--sync", "allreduce"]);
    let (w, sm) = run("gaia", &["--sync", "gaia", "--groups", "2", "--significance", "0", "--dc-staleness", "0"]);
    let diff = ar.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-4, "largest difference from allreduce {diff}");
    assert!((num(&ar_s, "final_metric") - num(&sm, "final_metric")).abs() < 0.001);
    let g = &sm["sync_metrics"];
    assert_eq!(num(g, "groups"), 2.0);
    // Threshold 0: every non-zero update crosses.
    assert_eq!(num(g, "significant_updates"), num(g, "updates"), "{g}");
    assert_eq!(num(g, "mirror_lag_max"), 0.0, "{g}");
}

/// At 1 % most updates stay home, yet nothing is lost: after the residuals are flushed at the end
/// every group holds every group's every update, so the copies agree to float rounding (they
/// were built independently, one per group). The WAN carries less than the LAN.
#[test]
fn the_filter_keeps_residuals_and_every_copy_ends_equal() {
    let dir = scratch("gaia-residuals");
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--sync",
        "gaia",
        "--groups",
        "2",
        "--significance",
        "0.05",
        "--dc-staleness",
        "2",
        "--metrics",
        s(&m),
    ];
    mpirun(4, &args, 120).expect_ok();
    let sm = summary(&m);
    let g = &sm["sync_metrics"];
    let (upd, sig) = (num(g, "updates"), num(g, "significant_updates"));
    assert!(upd > 0.0 && sig < upd, "at 5 % some updates must be held back: {sig} of {upd}");
    assert!(sig > 0.0, "{g}");
    assert!(num(g, "final_group_disagreement") < 1e-4, "the groups' copies differ after the flush: {g}");
    assert!(num(g, "wan_bytes_sent") < num(g, "lan_bytes_sent"), "{g}");
    assert!(num(g, "mirror_lag_max") <= 2.0, "{g}");
    // Gaia's timing decides which updates cross when, so the accuracy varies between runs
    // (0.7725 to above 0.78 in our suite runs): see `TRAINED`.
    assert!(num(&sm, "final_metric") > TRAINED, "{sm}");
}

/// §4.4's soft threshold: on an idle link (here shared memory, nothing queued between clocks)
/// entries between S and V go out too, best-effort, and still nothing is lost.
#[test]
fn the_soft_threshold_sends_more_on_an_idle_link() {
    let dir = scratch("gaia-soft");
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--sync",
        "gaia",
        "--groups",
        "2",
        "--significance",
        "0.05",
        "--soft-significance",
        "0.01",
        "--dc-staleness",
        "2",
        "--metrics",
        s(&m),
    ];
    mpirun(4, &args, 120).expect_ok();
    let sm = summary(&m);
    let g = &sm["sync_metrics"];
    assert!(num(g, "soft_updates_sent") > 0.0, "{g}");
    assert!(num(g, "significant_updates") + num(g, "soft_updates_sent") <= num(g, "updates") + 1e-9, "{g}");
    assert!(num(g, "final_group_disagreement") < 1e-4, "{g}");
    let start = metrics(&m).into_iter().find(|v| v["event"] == "start").expect("a start line");
    assert_eq!(start["sync_info"]["soft_significance"].as_f64(), Some(0.01), "{start}");
}

/// A backlogged WAN: a clock of 10 steps of 5 ms sends more than 2 Mbit/s carries in 50 ms, and
/// the one-way latency is 100 ms, so queued data and selective barriers come every clock. A rank
/// must keep releasing its queued data while it sits in its group's allreduce: before, they went
/// out only at its next exchange, and this run hung with its progress at round 4 (every try: at 1
/// and 2 Mbit/s, and at 10 Mbit/s with 90-110 ms before barriers needed a backlog): a receiver
/// blocked on announced values whose sender waited in its group's collective for a rank that was
/// itself waiting for the receiver's group.
#[test]
fn paced_data_flow_during_group_allreduce() {
    let dir = scratch("gaia-paced");
    let m = dir.join("m.jsonl");
    // 2,500 examples a rank, batch 25: 100 steps an epoch, 10 clocks (no steps after the last).
    let args = [
        "train",
        "--data",
        &t10k(),
        "--epochs",
        "2",
        "--batch-size",
        "25",
        "--sync",
        "gaia",
        "--groups",
        "2",
        "--sync-every",
        "10",
        "--emulate-compute",
        "5",
        "--emulate-bandwidth",
        "2",
        "--emulate-latency",
        "100",
        "--metrics",
        s(&m),
    ];
    mpirun(4, &args, 120).expect_ok();
    let g = &summary(&m)["sync_metrics"];
    assert!(num(g, "barriers_sent") > 0.0, "the run must exercise the selective barriers: {g}");
    // Every barrier sent is taken by its receiver by the end (2 groups: one message each). One
    // left in MPI at a cut hung its sender there (src/sync/gaia.rs, `receive`).
    assert_eq!(num(g, "barriers_received"), num(g, "barriers_sent"), "{g}");
    assert!(num(g, "mirror_lag_max") <= 2.0, "{g}");
    assert!(num(g, "final_group_disagreement") < 1e-4, "the groups' copies differ after the flush: {g}");
}

/// Selective barriers are for a backlogged link (§3.4: updates arriving faster than the WAN
/// carries them), not for latency: on a fast link with a long latency (1 Gbit/s, 100 ms, a clock
/// of 50 ms) every clock's data are in flight when the next clock ends, yet none is queued, so no
/// barrier may be sent (before, every clock announced its values and the receivers waited for
/// them at every clock, which undid the mirror clock's DS).
#[test]
fn latency_alone_sends_no_selective_barrier() {
    let dir = scratch("gaia-latency");
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--epochs",
        "1",
        "--batch-size",
        "25",
        "--sync",
        "gaia",
        "--groups",
        "2",
        "--sync-every",
        "10",
        "--emulate-compute",
        "5",
        "--emulate-bandwidth",
        "1000",
        "--emulate-latency",
        "100",
        "--metrics",
        s(&m),
    ];
    mpirun(4, &args, 120).expect_ok();
    let g = &summary(&m)["sync_metrics"];
    assert_eq!(num(g, "barriers_sent"), 0.0, "an idle link needs no barrier: {g}");
    assert!(num(g, "significant_updates") > 0.0, "{g}");
    assert!(num(g, "mirror_lag_max") <= 2.0, "{g}");
    assert!(num(g, "final_group_disagreement") < 1e-4, "{g}");
}

/// One group three times slower: the fast group runs ahead, but never more than DS clocks ahead
/// of what it has received (the mirror clock), and it waits for that.
#[test]
fn the_mirror_clock_bounds_a_slow_group() {
    let dir = scratch("gaia-mirror");
    for ds in ["0", "3"] {
        let m = dir.join(format!("ds{ds}.jsonl"));
        let args = [
            "train",
            "--data",
            &t10k(),
            "--epochs",
            "1",
            "--batch-size",
            "64",
            "--sync",
            "gaia",
            "--groups",
            "2",
            "--significance",
            "0.01",
            "--dc-staleness",
            ds,
            "--straggler",
            "2,3:3",
            "--eval-every",
            "50",
            "--metrics",
            s(&m),
        ];
        mpirun(4, &args, 120).expect_ok();
        let bound: f64 = ds.parse().unwrap();
        for e in metrics(&m).iter().filter(|v| v["event"] == "eval" || v["event"] == "summary") {
            let g = if e["event"] == "eval" { &e["sync"] } else { &e["sync_metrics"] };
            assert!(num(g, "mirror_lag_max") <= bound, "DS {ds}: {g}");
        }
        let g = &summary(&m)["sync_metrics"];
        assert!(num(g, "mirror_wait_seconds") > 0.0, "the fast group should wait: {g}");
        if bound > 0.0 {
            assert!(num(g, "mirror_lag_max") >= 1.0, "a 3x slower group should leave the fast one ahead: {g}");
        }
    }
}

/// The checkpoint holds the residuals and clock; with two groups meeting every clock the run is
/// deterministic, so the resumed run ends bit-identical to the uninterrupted one.
#[test]
fn resume_is_bit_identical() {
    let dir = scratch("gaia-resume");
    // 39 rounds per epoch (10,000 examples, 4 ranks, batch 64): stopped at 60 of 78.
    let common = [
        "train",
        "--data",
        &t10k(),
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--seed",
        "3",
        "--sync",
        "gaia",
        "--groups",
        "2",
        "--significance",
        "0.02",
        "--dc-staleness",
        "0",
    ];
    let full = dir.join("full.h5");
    let mut a: Vec<&str> = common.to_vec();
    a.extend(["--save-model", s(&full)]);
    mpirun(4, &a, 120).expect_ok();
    let ck = dir.join("ck");
    let mut b: Vec<&str> = common.to_vec();
    b.extend(["--checkpoint-dir", s(&ck), "--checkpoint-every", "25", "--max-rounds", "60"]);
    mpirun(4, &b, 120).expect_ok();
    let resumed = dir.join("resumed.h5");
    let mut c: Vec<&str> = common.to_vec();
    c.extend(["--checkpoint-dir", s(&ck), "--resume", "--save-model", s(&resumed)]);
    let job = mpirun(4, &c, 120).expect_ok();
    assert!(job.stderr.contains("resuming from"), "{}", job.stderr);
    let name = std::fs::read_dir(&ck)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .find(|n| n.ends_with("-0000000060.h5"))
        .expect("the checkpoint of round 60");
    let f = hdf5::File::open(ck.join(name)).unwrap();
    assert!(f.group("sync/rank0").unwrap().dataset("residual").is_ok(), "the checkpoint holds the residuals");
    assert!(read_model(&full) == read_model(&resumed), "resumed model differs from the uninterrupted one");
}

/// The summary's count of asap reduces inside the groups: one per rank and clock, each with
/// every in-neighbour's model (NOTIFY-ACK), none torn. Returns the clocks.
fn check_inner_asap_ran(sm: &serde_json::Value, ranks: f64, in_degree: usize) -> f64 {
    let g = &sm["sync_metrics"];
    let rounds = num(sm, "rounds");
    assert!(rounds > 0.0, "{sm}");
    assert_eq!(num(g, "inner_rounds"), rounds * ranks, "{g}");
    let h: Vec<f64> = g["inner_consistency_histogram"].as_array().expect("a histogram").iter().map(|v| v.as_f64().unwrap()).collect();
    let mut want = vec![0.0; in_degree + 1];
    want[in_degree] = rounds * ranks;
    assert_eq!(h, want, "every reduce should use all {in_degree} in-neighbour(s): {g}");
    assert_eq!(num(g, "inner_torn"), 0.0, "{g}");
    rounds
}

/// 2 groups x 2 ranks, asap inside at 1 %: it trains (chance is 0.10; ~0.83 measured), the
/// inner reduce ran every clock on every rank, and the groups' copies agree after the flush.
#[test]
fn asap_inside_the_groups_trains() {
    let dir = scratch("gaia-inner-asap");
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--sync",
        "gaia",
        "--groups",
        "2",
        "--gaia-inner",
        "asap",
        "--significance",
        "0.01",
        "--metrics",
        s(&m),
    ];
    let job = mpirun(4, &args, 120).expect_ok();
    assert!(job.stderr.contains("(asap inside)"), "{}", job.stderr);
    let sm = summary(&m);
    check_inner_asap_ran(&sm, 4.0, 1);
    let g = &sm["sync_metrics"];
    assert!(num(g, "final_group_disagreement") < 1e-4, "{g}");
    assert!(num(g, "significant_updates") > 0.0 && num(g, "wan_bytes_sent") > 0.0, "{g}");
    assert!(num(&sm, "final_metric") > TRAINED, "{sm}");
    let start = metrics(&m).into_iter().find(|v| v["event"] == "start").expect("a start line");
    assert_eq!(start["sync_info"]["gaia_inner"], "asap", "{start}");
    assert_eq!(start["sync_info"]["inner"]["report"]["nodes"], 2, "the inner graph spans a group: {start}");
}

/// 2 groups x 3 ranks on a directed ring: the reduce never averages a group exactly, so the
/// mirror servers' own replicas differ from their group's mean and the end must correct what
/// they sent (inner_correction_max > 0). The oracle: the groups' copies, built separately,
/// agree after the flush only if that correction is right (without it: see docs/gaia.md). On
/// both transports.
#[test]
fn asap_inside_the_groups_ends_with_equal_copies() {
    // On both transports (`--transport`, per group), side by side: the jobs mostly wait.
    std::thread::scope(|scope| {
        let runs: Vec<_> = ["rma", "p2p"].map(|t| (t, scope.spawn(move || equal_copies_on(t)))).into_iter().collect();
        for (t, run) in runs {
            if let Err(e) = run.join() {
                eprintln!("--transport {t} failed");
                std::panic::resume_unwind(e);
            }
        }
    });
}

fn equal_copies_on(transport: &str) {
    let dir = scratch(&format!("gaia-inner-ring-{transport}"));
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--sync",
        "gaia",
        "--groups",
        "2",
        "--gaia-inner",
        "asap",
        "--graph",
        "ring",
        "--transport",
        transport,
        "--significance",
        "0.05",
        "--metrics",
        s(&m),
    ];
    mpirun(6, &args, 120).expect_ok();
    let sm = summary(&m);
    check_inner_asap_ran(&sm, 6.0, 1);
    let g = &sm["sync_metrics"];
    assert!(num(g, "inner_correction_max") > 1e-4, "{transport}: the ring on 3 ranks leaves the replicas apart: {g}");
    assert!(num(g, "final_group_disagreement") < 1e-4, "{transport}: {g}");
    let start = metrics(&m).into_iter().find(|v| v["event"] == "start").expect("a start line");
    assert_eq!(start["sync_info"]["inner"]["transport"], transport, "{start}");
}

/// A checkpoint with asap inside holds every rank's own replica (its base after the cut) and
/// the residuals; the resumed run continues the sums the end's correction relies on, so the
/// groups' copies still agree at the end (runs with different replicas per group: the ring on 3).
#[test]
fn asap_inside_resumes_and_still_ends_with_equal_copies() {
    let dir = scratch("gaia-inner-resume");
    let ck = dir.join("ck");
    let m = dir.join("m.jsonl");
    // The decay schedule the correction's bound below was measured under: the default cosine
    // anneals the resumed rounds' steps towards 0, and their largest correction fell to 0.996e-4.
    let common = [
        "train",
        "--data",
        &t10k(),
        "--lr-schedule",
        "decay",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--sync",
        "gaia",
        "--groups",
        "2",
        "--gaia-inner",
        "asap",
        "--graph",
        "ring",
        "--significance",
        "0.02",
        "--checkpoint-dir",
        s(&ck),
    ];
    let mut a: Vec<&str> = common.to_vec();
    a.extend(["--checkpoint-every", "20", "--max-rounds", "40"]);
    mpirun(6, &a, 120).expect_ok();
    let mut b: Vec<&str> = common.to_vec();
    b.extend(["--resume", "--metrics", s(&m)]);
    let job = mpirun(6, &b, 120).expect_ok();
    assert!(job.stderr.contains("(epoch 1, round 40)"), "{}", job.stderr);
    let sm = summary(&m);
    let g = &sm["sync_metrics"];
    // The resumed run's own inner reduces: the rounds after 40, on every rank.
    let after = num(&sm, "rounds") - 40.0;
    assert!(after > 0.0, "{sm}");
    assert_eq!(num(g, "inner_rounds"), 6.0 * after, "{g}");
    assert!(num(g, "inner_correction_max") > 1e-4, "{g}");
    assert!(num(g, "final_group_disagreement") < 1e-4, "{g}");
    assert!(num(&sm, "final_metric") > TRAINED, "{sm}");
}

/// Bad --gaia-inner combinations fail on every rank with a message naming the flag and group.
#[test]
fn bad_inner_asap_fails_clearly() {
    let dir = scratch("gaia-inner-bad");
    let base = ["train", "--data", &t10k(), "--epochs", "1", "--sync", "gaia", "--gaia-inner", "asap"];
    let run = |np: usize, extra: &[&str], needles: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend(extra);
        mpirun(np, &a, 60).expect_failure(needles);
    };
    // A graph file for 6 nodes on groups of 2.
    let six = format!("file:{}/graphs/root-expander-6.txt", env!("CARGO_MANIFEST_DIR"));
    run(4, &["--groups", "2", "--graph", &six], &["--gaia-inner asap: group 0 (2 ranks: [0, 1])", "declares 6 nodes"]);
    // Groups of 3 and 1: a hypercube fits only the group of 1, and the whole job fails.
    let f = write(
        &dir,
        "g31.txt",
        "0 0
1 0
2 0
3 1
",
    );
    run(4, &["--groups", &f, "--graph", "hypercube"], &["group 0 (3 ranks: [0, 1, 2])", "power-of-two"]);
    // A star does not keep the group's mean.
    run(4, &["--groups", &f, "--graph", "star"], &["--graph star on 3 ranks averages with unequal weights"]);
    // The inner reduce is NOTIFY-ACK: asap's --notify is no option of gaia.
    run(2, &["--notify", "barrier"], &["--notify applies to --sync asap, not to this run (--sync gaia)"]);
    mpirun(2, &["train", "--data", &t10k(), "--epochs", "1", "--sync", "allreduce", "--gaia-inner", "asap"], 60)
        .expect_failure(&["--gaia-inner applies to --sync gaia, not to this run (--sync allreduce)"]);
}

/// Bad --groups input fails on every rank with a message naming the flag or file.
#[test]
fn bad_groups_fail_clearly() {
    let dir = scratch("gaia-bad");
    let base = ["train", "--data", &t10k(), "--epochs", "1", "--sync", "gaia"];
    let run = |extra: &[&str], needles: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend(extra);
        mpirun(2, &a, 60).expect_failure(needles);
    };
    run(&["--groups", "3"], &["--groups 3", "between 1 and the number of ranks (2)"]);
    run(&["--groups", "/no/such/groups.txt"], &["--groups \"/no/such/groups.txt\""]);
    let f = write(&dir, "g.txt", "0 0\n1 5\n");
    run(&["--groups", &f], &["g.txt", "have no rank"]);
    run(&["--significance", "-1"], &["--significance"]);
    run(
        &["--significance", "0.01", "--soft-significance", "0.02"],
        &["--soft-significance must be 0 (off) or between 0 and --significance (0.01), got 0.02"],
    );
}
