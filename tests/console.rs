//! What a person reads: the console output of real mpirun jobs, captured as a log (not a TTY).

mod common;

use common::*;

/// A default 4-rank run (`mpirun -n 4 asap-train`, as `make run`) prints at most 25 lines in a
/// log; the configuration is printed only with --print-config, as a JSON object alone at the head
/// of stdout (no header: it reads back with --config, tests/configs.rs), and its f32 values
/// (lambda) are written in their shortest form there and in the metrics file.
#[test]
fn a_default_run_prints_at_most_25_lines() {
    let dir = scratch("console-default");
    let metrics = dir.join("m.jsonl");
    let job = mpirun(4, &["--metrics", s(&metrics)], 300).expect_ok();
    let all = format!("{}{}", job.stdout, job.stderr);
    let lines = all.lines().count();
    assert!(lines <= 25, "{lines} lines:\n{all}");
    assert!(!all.contains("effective configuration") && !all.contains("\"fault_panic\""), "{all}");
    // One wall time, named.
    assert_eq!(all.matches("wall").count(), 1, "{all}");
    assert!(all.contains("wall time "), "{all}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let start = text.lines().next().unwrap();
    let v: serde_json::Value = serde_json::from_str(start).unwrap();
    assert_eq!(v["config"]["lambda"].as_f64(), Some(1e-5), "{start}");
    assert_eq!(v["model_spec"]["lambda"].as_f64(), Some(1e-5), "{start}");

    let job = mpirun(2, &["train", "--epochs", "1", "--data", &format!("{FASHION}/t10k-images-idx3-ubyte.gz"), "--print-config"], 120)
        .expect_ok();
    let end = job.stdout.find("\n}\n").unwrap_or_else(|| panic!("no configuration on stdout:\n{}", job.stdout)) + 3;
    let printed: serde_json::Value = serde_json::from_str(&job.stdout[..end]).unwrap();
    assert_eq!(printed["lambda"].as_f64(), Some(1e-5), "{}", job.stdout);
    assert!(job.stdout.contains("\"lambda\": 0.00001") && !job.stderr.contains("\"lambda\""), "{}\n{}", job.stdout, job.stderr);
}

/// Messages every rank would print alike come once; at one rank nothing speaks of sends; without
/// a held-out set the summary names the training metric once and says there is no held-out set.
#[test]
fn messages_come_once_and_say_what_is_true() {
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let job = mpirun(4, &["train", "--data", &data, "--epochs", "1", "--graph", "star"], 120).expect_ok();
    assert_eq!(job.stderr.matches("in-degrees differ").count(), 1, "{}", job.stderr);
    assert_eq!(job.stderr.matches("communication graph").count(), 1, "{}", job.stderr);

    let job = mpirun(1, &["train", "--data", &data, "--epochs", "1"], 120).expect_ok();
    let all = format!("{}{}", job.stdout, job.stderr);
    assert!(all.contains("on 1 rank: no edges, nothing is sent") && !all.contains("sends per rank"), "{all}");
    assert!(all.contains("1 rank, sync") && !all.contains("1 ranks"), "{all}");
    assert!(all.contains("training ") && all.contains("(final model; no held-out set)"), "{all}");
    let summary_line = all.lines().find(|l| l.starts_with("final objective")).unwrap();
    assert_eq!(summary_line.matches("training").count(), 1, "{summary_line}");
}
