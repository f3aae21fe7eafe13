//! Checkpoints belong to a run: two runs sharing a directory never prune or resume each other's,
//! and temporary files a crashed write left behind are removed when the run starts again.

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
