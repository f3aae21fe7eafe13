//! Outputs never destroy anything: they are checked before training (never an input, never each
//! other, writable), and checkpoints belong to a run: two runs sharing a directory never prune or
//! resume each other's, and temporary files a crashed write left behind are removed when the run
//! starts again.

mod common;
use common::*;

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn runs_sharing_a_checkpoint_directory_keep_their_own() {
    let dir = scratch("ckpt-shared");
    let ck = dir.join("ck");
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let run = |seed: &str, extra: &[&str]| {
        let mut a = vec!["train", "--data", &data, "--sync", "allreduce", "--epochs", "1", "--seed", seed,
            "--checkpoint-dir", s(&ck), "--checkpoint-every", "10"];
        a.extend(extra);
        mpirun(2, &a, 120)
    };
    run("1", &["--max-rounds", "30"]).expect_ok();
    let first = names(&ck);
    assert_eq!(first.len(), 2, "the newest two are kept: {first:?}");
    run("2", &["--max-rounds", "30"]).expect_ok();
    let both = names(&ck);
    assert_eq!(both.len(), 4, "the second run pruned nothing of the first: {both:?}");
    assert!(first.iter().all(|n| both.contains(n)));
    // A third set of options finds no checkpoint of its own, and says whose they are.
    run("3", &["--resume"]).expect_failure(&["belong to other runs"]);
    // A temporary file left by a crashed write of run 1 is removed when run 1 starts again.
    let stale = ck.join(format!(".{}.999999.tmp", first[1]));
    std::fs::write(&stale, b"half a checkpoint").unwrap();
    let job = run("1", &["--resume", "--max-rounds", "40"]).expect_ok();
    assert!(job.stderr.contains(&first[1]), "resumed from its own newest checkpoint: {}", job.stderr);
    assert!(!stale.exists(), "stale temporary file still there");
}

/// An output that names an input fails at once on every rank, and the input is unchanged.
#[test]
fn an_output_that_is_an_input_fails_before_training() {
    let dir = scratch("outputs-inputs");
    let data = write(&dir, "train.svm", "1 1:0.5 2:1\n-1 1:-0.5 2:-1\n1 1:0.7\n-1 2:-0.3\n");
    let before = std::fs::read(&data).unwrap();
    let cfg = write(&dir, "run.toml", "epochs = 1\n");
    for (opt, target) in [("--metrics", data.as_str()), ("--save-model", data.as_str()), ("--metrics", cfg.as_str())] {
        mpirun(2, &["train", "--config", &cfg, "--data", &data, "--model", "svm", opt, target], 60)
            .expect_failure(&[opt, "the same file as", "overwrite its input"]);
    }
    assert_eq!(std::fs::read(&data).unwrap(), before, "the data file was changed");
    let m = dir.join("m.h5");
    mpirun(2, &["train", "--data", &data, "--model", "svm", "--metrics", s(&m), "--save-model", s(&m)], 60)
        .expect_failure(&["--save-model", "one output would overwrite the other"]);
    mpirun(1, &["train", "--data", &data, "--model", "svm", "--save-model", "/proc/nonexistent/model.h5"], 60)
        .expect_failure(&["--save-model", "cannot"]);
}
