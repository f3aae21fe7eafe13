//! Each rank's own model as the gathered evaluation reports it, against an independent run that
//! trains the same model alone; and the time-by-phase report with its teardown line.

mod common;
use common::*;

const HEART: &str = "/usr/share/doc/liblinear-tools/examples/heart_scale";

/// Under `--sync none` rank 0 of a 2-rank job trains on the first half of the file with RNG
/// stream 1, exactly what a 1-rank job on that half does: its own model's held-out accuracy
/// (gathered with the other rank's replica and evaluated on both ranks' test shards) must equal
/// the 1-rank job's accuracy on the same held-out file (counts of correct answers: exact).
#[test]
fn own_model_metrics_match_a_single_rank_run_of_the_same_model() {
    let dir = scratch("own-models");
    let text = std::fs::read_to_string(HEART).expect("heart_scale (liblinear-tools, make deps)");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 270);
    let half = write(&dir, "first-half.svm", &(lines[..135].join("\n") + "\n"));
    let common = [
        "train",
        "--model",
        "svm",
        "--sync",
        "none",
        "--epochs",
        "3",
        "--batch-size",
        "8",
        "--lr",
        "0.1",
        "--lambda",
        "1e-3",
        "--features",
        "13",
        "--test-data",
        HEART,
        "--seed",
        "5",
        // Standardising would fit the half's statistics alone and the whole file's on 2 ranks:
        // the same model needs the same (no) scaling.
        "--scale",
        "none",
    ];
    let (m1, m2) = (dir.join("one.jsonl"), dir.join("two.jsonl"));
    let mut a: Vec<&str> = common.to_vec();
    a.extend(["--data", &half, "--metrics", s(&m1)]);
    mpirun(1, &a, 120).expect_ok();
    let mut b: Vec<&str> = common.to_vec();
    b.extend(["--data", HEART, "--metrics", s(&m2)]);
    mpirun(2, &b, 120).expect_ok();

    let alone = summary(&m1)["final_metric"].as_f64().unwrap();
    let sm = summary(&m2);
    let own: Vec<f64> = sm["per_rank_metric"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(own.len(), 2);
    assert_eq!(own[0], alone, "rank 0's own model {own:?} against the same model trained alone ({alone})");
    assert!(own.iter().all(|&a| a > 0.6), "{own:?}");
    // The last evaluation point holds the same replicas: its worst and mean are those of the list.
    let last = metrics(&m2).into_iter().rfind(|v| v["event"] == "eval").unwrap();
    let (worst, mean) = (last["rank_metric"]["worst"].as_f64().unwrap(), last["rank_metric"]["mean"].as_f64().unwrap());
    assert_eq!(worst, own[0].min(own[1]));
    assert!((mean - (own[0] + own[1]) / 2.0).abs() < 1e-12, "{mean} vs {own:?}");
}

/// The summary's phases are disjoint parts of the program's wall time (their sum cannot exceed
/// it), the launcher and MPI start-up are measured, and rank 0 appends the teardown after
/// MPI_Finalize.
#[test]
fn phases_partition_the_wall_time_and_teardown_is_appended() {
    let dir = scratch("phases");
    let m = dir.join("m.jsonl");
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let job = mpirun(3, &["train", "--data", &data, "--epochs", "2", "--metrics", s(&m)], 120).expect_ok();
    assert!(job.stdout.contains("time by phase: launch "), "{}", job.stdout);
    assert!(job.stderr.contains("asap-train: teardown "), "{}", job.stderr);
    let lines = metrics(&m);
    let sm = summary(&m);
    let p = &sm["phases"];
    let f = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("phase {k} in {p}"));
    for k in ["launch", "mpi_init", "load", "step_search", "setup", "train", "evaluate", "checkpoint", "final_model"] {
        assert!(f(k) >= 0.0, "{k}: {p}");
    }
    assert_eq!(f("load"), sm["load_seconds"].as_f64().unwrap());
    assert_eq!(f("train"), sm["train_seconds"].as_f64().unwrap());
    let wall = sm["wall_seconds"].as_f64().unwrap();
    // --lr not given: the step search ran, and its time is a phase of its own (issue 43).
    assert!(job.stderr.contains("--lr not given: step size") && f("step_search") > 0.0, "{p}");
    let inside: f64 = ["load", "step_search", "setup", "train", "evaluate", "checkpoint", "final_model"].iter().map(|k| f(k)).sum();
    assert!(inside <= wall + 1e-6 && inside >= 0.5 * wall, "phases {inside} s within the program's {wall} s: {p}");
    assert!(f("evaluate") > 0.0, "three evaluations and the final one take time: {p}");
    let last = lines.last().unwrap();
    assert_eq!(last["event"], "teardown", "{last}");
    let teardown = last["teardown_seconds"].as_f64().unwrap();
    let since = last["since_launch_seconds"].as_f64().unwrap();
    assert!(teardown >= 0.0 && since >= wall + teardown + f("launch"), "{last} after a {wall} s program");
    let (free, fin) = (last["free_seconds"].as_f64().unwrap(), last["finalize_seconds"].as_f64().unwrap());
    assert!(free >= 0.0 && fin >= 0.0 && (free + fin - teardown).abs() < 1e-6, "{last}");
}
