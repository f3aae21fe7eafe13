//! `--partition` under real mpirun: the rows move between ranks, and the class counts every rank
//! ends with (from the metrics' start line) are disjoint parts that cover the data, follow K for
//! by-label:K, and are skewed for a small Dirichlet ALPHA; misuse is refused naming the fix. An
//! epoch of skewed shards is a pass over the mean shard (smaller shards cycle), a resume goes on
//! as the uninterrupted run, and a run that would end before its first sync is refused.

mod common;
use common::*;

fn t10k() -> String {
    format!("{FASHION}/t10k-images-idx3-ubyte.gz")
}

/// Class counts per rank from the start line, and the examples the run trained on.
fn counts(m: &std::path::Path) -> (Vec<Vec<u64>>, u64) {
    let start = metrics(m).into_iter().find(|v| v["event"] == "start").unwrap();
    let c = start["class_counts_per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect())
        .collect();
    (c, start["train_examples"].as_u64().unwrap())
}

#[test]
fn partitions_cover_the_data_and_follow_k_and_alpha() {
    let dir = scratch("partition");
    let run = |name: &str, spec: &str| {
        let m = dir.join(format!("{name}.jsonl"));
        mpirun(4, &["train", "--data", &t10k(), "--partition", spec, "--epochs", "1", "--metrics", s(&m)], 120).expect_ok();
        counts(&m)
    };
    // t10k holds exactly 1,000 examples of each of the 10 classes.
    for (name, spec) in [("by-label", "by-label:3"), ("dirichlet", "dirichlet:0.5")] {
        let (c, total) = run(name, spec);
        assert_eq!(c.len(), 4, "{name}: one row per rank");
        assert_eq!(total, 10_000, "{name}");
        // An epoch is a pass over the mean shard, 2,500 examples in mini-batches of 32.
        let start = metrics(&dir.join(format!("{name}.jsonl"))).into_iter().find(|v| v["event"] == "start").unwrap();
        assert_eq!(start["steps_per_epoch"], 79, "{name}: ceil(10000 / 4 / 32) steps per epoch: {c:?}");
        for k in 0..10 {
            let sum: u64 = c.iter().map(|r| r[k]).sum();
            assert_eq!(sum, 1_000, "{name}: class {k} is split without loss or duplicates: {c:?}");
        }
        if spec.starts_with("by-label") {
            for (r, row) in c.iter().enumerate() {
                let held: Vec<usize> = (0..10).filter(|&k| row[k] > 0).collect();
                let mut want: Vec<usize> = (0..3).map(|j| (3 * r + j) % 10).collect();
                want.sort();
                assert_eq!(held, want, "rank {r} holds the classes 3r..3r+2 (mod 10): {c:?}");
            }
        } else {
            // Dirichlet(0.5) over 4 ranks: on average the largest rank holds well over 1/4 of a class.
            let top: f64 =
                (0..10).map(|k| *c.iter().map(|r| r[k]).collect::<Vec<_>>().iter().max().unwrap() as f64 / 1000.0).sum::<f64>() / 10.0;
            assert!(top > 0.45, "ALPHA 0.5 should skew: the largest share averages {top}: {c:?}");
        }
    }
}

#[test]
fn partition_misuse_is_refused_with_the_fix() {
    let d = t10k();
    mpirun(4, &["train", "--data", &d, "--partition", "by-label:2"], 60).expect_failure(&["covers only 8 of the 10 classes", "K >= 3"]);
    mpirun(2, &["train", "--data", &d, "--partition", "shards:2"], 60).expect_failure(&["--partition takes iid"]);
}

/// 200 examples of 4 classes, 10, 30, 50 and 110 of them, in LIBSVM form: under `by-label:1` on 4
/// ranks the shards are exactly those classes, of known unequal sizes.
fn unequal_classes(dir: &std::path::Path) -> String {
    let mut u = uniform_stream();
    let mut text = String::new();
    for (class, count) in [(0, 10), (1, 30), (2, 50), (3, 110)] {
        for _ in 0..count {
            let (a, b) = (class as f64 + u() - 0.5, u());
            text.push_str(&format!("{class} 1:{a:.4} 2:{b:.4}\n"));
        }
    }
    write(dir, "unequal.libsvm", &text)
}

/// A training job on `data` (from [`unequal_classes`]): by-label:1, mini-batches of 8, a fixed step.
fn skewed(data: &str) -> [&str; 11] {
    ["train", "--data", data, "--model", "mlr", "--partition", "by-label:1", "--batch-size", "8", "--lr", "0.1"]
}

/// Shards of 10, 30, 50 and 110 examples, mini-batches of 8: an epoch is the mean shard's 50
/// examples, 7 steps on every rank (the smallest shard's count was 2). Rank 0's 10 examples cycle:
/// 7 steps are three passes of 8 + 2 and one batch of 8, 38 examples an epoch, which the
/// summary's examples per second times the training seconds gives back.
#[test]
fn an_epoch_of_skewed_shards_is_a_pass_over_the_mean_shard() {
    let dir = scratch("partition-epoch");
    let data = unequal_classes(&dir);
    let m = dir.join("run.jsonl");
    let args = skewed(&data);
    let job = mpirun(4, &[&args[..], &["--sync", "allreduce", "--epochs", "3", "--metrics", s(&m)]].concat(), 120).expect_ok();
    assert!(job.stderr.contains("7 steps/epoch/rank (an epoch is a pass over the mean shard"), "{}", job.stderr);
    let (c, total) = counts(&m);
    let sizes: Vec<u64> = c.iter().map(|r| r.iter().sum()).collect();
    assert_eq!((sizes, total), (vec![10, 30, 50, 110], 200), "by-label:1 gives rank r class r");
    let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
    assert_eq!(start["steps_per_epoch"], 7);
    let sum = summary(&m);
    assert_eq!(sum["rounds"], 21, "3 epochs of 7 steps, a round each");
    let examples = sum["examples_per_second_per_rank"].as_f64().unwrap() * sum["train_seconds"].as_f64().unwrap();
    assert!((examples - 3.0 * 38.0).abs() < 1e-6, "rank 0 visits its 10 examples 3.8 times an epoch: {examples}");
}

/// A checkpoint in the middle of a cycling shard's pass (round 10 is step 3 of epoch 2, rank 0's
/// second step of its pass): the resumed run replays the pass's shuffles and ends with the
/// uninterrupted run's model, bit for bit.
#[test]
fn a_resume_in_the_middle_of_a_cycling_pass_is_bit_identical() {
    let dir = scratch("partition-resume");
    let data = unequal_classes(&dir);
    let args = [&skewed(&data)[..], &["--sync", "allreduce"]].concat();
    let (full, _, resumed) = full_and_resumed_at_round_10(&dir, "by-label", |extra| mpirun(4, &[&args[..], extra].concat(), 120));
    let params = |p: &std::path::Path| -> Vec<f32> { hdf5::File::open(p).unwrap().dataset("params").unwrap().read_raw().unwrap() };
    assert!(params(&full) == params(&resumed), "the resumed model differs from the uninterrupted one");
}

/// A run whose steps end before the first sync (1 epoch of 7 steps, --sync-every 8) is refused on
/// every rank with the fix, in a mode that syncs; --sync none asks for independent replicas and runs.
#[test]
fn a_run_that_would_never_sync_is_refused() {
    let dir = scratch("partition-never-syncs");
    let data = unequal_classes(&dir);
    let args = skewed(&data);
    let never = ["--epochs", "1", "--sync-every", "8"];
    for mode in ["allreduce", "asap"] {
        mpirun(4, &[&args[..], &never, &["--sync", mode]].concat(), 120).expect_failure(&[
            "--epochs 1 x 7 steps per epoch = 7 steps per rank, fewer than --sync-every 8",
            "before its first sync",
            &format!("--sync {mode} syncs every --sync-every steps"),
            "use --sync-every 7 or less, --epochs 2 or more, or --sync none",
        ]);
    }
    mpirun(4, &[&args[..], &never, &["--sync", "none"]].concat(), 120).expect_ok();
}
