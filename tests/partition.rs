//! `--partition` under real mpirun: the rows move between ranks, and the class counts every rank
//! ends with (from the metrics' start line) are disjoint parts that cover the data, follow K for
//! by-label:K, and are skewed for a small Dirichlet ALPHA; misuse is refused naming the fix.

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
