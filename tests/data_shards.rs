//! Text shards are balanced by examples (issue 17): a LIBSVM file sorted by label with skewed
//! line lengths trains at 2 and 4 ranks like at 1, with every example in some rank's shard and
//! every rank's epoch covering its whole shard.

mod common;
use common::*;

/// 1000 examples, the 500 of class -1 first with 3 features each, then the 500 of class +1 with
/// 57 features each (lines ~15x longer): byte-range shards gave rank 0 of 2 about 700 examples.
fn sorted_skewed(dir: &std::path::Path) -> String {
    let mut t = String::from("# sorted by label; class +1 has much longer lines\n");
    for i in 0..1000 {
        let v = 0.5 + (i % 10) as f32 / 20.0;
        if i < 500 {
            t.push_str(&format!("-1 1:{v} 2:{v} 3:{v}\n"));
        } else {
            let feats: String = (4..=60).map(|j| format!(" {j}:{:.3}", v / 7.0)).collect();
            t.push_str(&format!("+1{feats}\n"));
        }
    }
    write(dir, "sorted.svm", &t)
}

#[test]
fn sorted_skewed_libsvm_trains_at_2_and_4_ranks_to_the_1_rank_accuracy() {
    let dir = scratch("shards-skewed");
    let data = sorted_skewed(&dir);
    let mut acc = Vec::new();
    for n in [1usize, 2, 4] {
        let m = dir.join(format!("m{n}.jsonl"));
        mpirun(
            n,
            &[
                "train",
                "--data",
                &data,
                "--model",
                "svm",
                "--sync",
                "allreduce",
                "--epochs",
                "3",
                "--batch-size",
                "10",
                "--lr",
                "0.1",
                "--lambda",
                "1e-4",
                "--metrics",
                s(&m),
            ],
            120,
        )
        .expect_ok();
        let all = metrics(&m);
        let start = all.iter().find(|v| v["event"] == "start").expect("no start line");
        assert_eq!(start["train_examples"], 1000, "{n} ranks");
        // 1000/n examples per rank in batches of 10: the epoch covers every rank's whole shard
        // (byte-range shards gave 28 steps instead of 50 at 2 ranks).
        assert_eq!(start["steps_per_epoch"], 1000 / n / 10, "{n} ranks");
        acc.push(summary(&m)["final_metric"].as_f64().unwrap());
    }
    assert!(acc[0] > 0.95, "1 rank: accuracy {}", acc[0]);
    for (i, n) in [(1, 2), (2, 4)] {
        assert!((acc[i] - acc[0]).abs() <= 0.01, "{n} ranks: accuracy {} vs {} at 1 rank", acc[i], acc[0]);
    }
}

/// A first byte chunk holding only a comment used to give rank 0 no examples and the error
/// "use at most K ranks" although the file has enough examples for every rank.
#[test]
fn comment_only_first_chunk_still_feeds_every_rank() {
    let dir = scratch("shards-comment");
    let mut t = format!("#{}\n", "c".repeat(4000));
    for i in 0..8 {
        t.push_str(&format!("{} 1:{}\n", if i % 2 == 0 { "+1" } else { "-1" }, i + 1));
    }
    let data = write(&dir, "comment.svm", &t);
    let m = dir.join("m.jsonl");
    mpirun(4, &["train", "--data", &data, "--model", "svm", "--epochs", "1", "--batch-size", "1", "--metrics", s(&m)], 60).expect_ok();
    let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
    assert_eq!((start["train_examples"].as_u64(), start["steps_per_epoch"].as_u64()), (Some(8), Some(2)));
}

/// The held-out split of a text file no longer depends on the number of ranks: each rank knows
/// the global number of its examples.
#[test]
fn text_holdout_is_the_same_at_1_and_3_ranks() {
    let dir = scratch("shards-holdout");
    let t: String = (0..300).map(|i| format!("{} {}:1 {}:0.5\n", i % 2, i % 17 + 1, i % 5 + 20)).collect();
    let data = write(&dir, "h.svm", &t);
    let mut held = Vec::new();
    for n in [1usize, 3] {
        let m = dir.join(format!("m{n}.jsonl"));
        mpirun(n, &["train", "--data", &data, "--model", "logreg", "--epochs", "1", "--test-fraction", "0.2", "--metrics", s(&m)], 60)
            .expect_ok();
        let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
        held.push((start["train_examples"].as_u64().unwrap(), start["test_examples"].as_u64().unwrap()));
    }
    assert_eq!(held[0], held[1]);
    assert_eq!(held[0].0 + held[0].1, 300);
}
