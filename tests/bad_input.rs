//! Bad input gives a clear message naming the file and place, a non-zero exit on every rank, and
//! never a hang (each job runs under a hard time limit).

mod common;
use common::*;

fn train_on(path: &str, extra: &[&str]) -> Job {
    let mut args = vec!["train", "--data", path, "--epochs", "1"];
    args.extend_from_slice(extra);
    mpirun(2, &args, 60)
}

#[test]
fn missing_file() {
    train_on("/nonexistent/data.svm", &[]).expect_failure(&["/nonexistent/data.svm"]);
}

#[test]
fn malformed_libsvm_line_names_file_line_and_column() {
    let dir = scratch("bad-malformed");
    let p = write(&dir, "bad.svm", "+1 1:0.5 2:1\n-1 1:0.25 x:3\n+1 2:1\n-1 1:1\n");
    train_on(&p, &["--model", "svm"]).expect_failure(&["bad.svm:2:", "x:3"]);
}

#[test]
fn zero_and_negative_indices_are_refused() {
    let dir = scratch("bad-index");
    let p = write(&dir, "zero.svm", "+1 1:0.5\n-1 0:1\n+1 2:1\n-1 1:1\n");
    train_on(&p, &["--model", "svm"]).expect_failure(&["zero.svm:2:", "1-based"]);
    let q = write(&dir, "neg.svm", "+1 1:0.5\n-1 2:1\n+1 -3:1\n-1 1:1\n");
    train_on(&q, &["--model", "svm"]).expect_failure(&["neg.svm:3:"]);
}

#[test]
fn unparseable_label() {
    let dir = scratch("bad-label");
    let p = write(&dir, "label.svm", "+1 1:0.5\nyes 1:1\n+1 2:1\n-1 1:1\n");
    train_on(&p, &["--model", "svm"]).expect_failure(&["label.svm:2:1", "label"]);
}

#[test]
fn hdf5_with_wrong_shape() {
    let dir = scratch("bad-h5");
    let p = dir.join("flat.h5");
    let f = hdf5::File::create(&p).unwrap();
    f.new_dataset_builder().with_data(&ndarray::Array1::<f32>::zeros(10)).create("X").unwrap();
    f.new_dataset_builder().with_data(&ndarray::Array1::<f32>::zeros(10)).create("y").unwrap();
    drop(f);
    train_on(s(&p), &[]).expect_failure(&["flat.h5", "X"]);
}

#[test]
fn fewer_examples_than_ranks() {
    let dir = scratch("bad-few");
    let p = write(&dir, "one.svm", "+1 1:0.5 2:1\n");
    train_on(&p, &["--model", "svm"]).expect_failure(&["one.svm", "1 training examples cannot feed 2 ranks"]);
}

#[test]
fn multiclass_labels_must_be_class_ids() {
    let dir = scratch("bad-classes");
    let p = write(&dir, "pm.svm", "+1 1:0.5\n-1 1:1\n+1 2:1\n-1 1:1\n");
    train_on(&p, &["--model", "mlr"]).expect_failure(&["pm.svm", "class labels 0, 1"]);
}

#[test]
fn divergence_reports_the_step_and_suggests_a_smaller_step_size() {
    let p = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    train_on(&p, &["--model", "svm", "--lr", "1e30", "--lr-schedule", "constant", "--scale", "none"])
        .expect_failure(&["diverged", "smaller --lr"]);
}

#[test]
fn panic_on_one_rank_aborts_the_whole_job() {
    let p = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    train_on(&p, &["--fault-panic", "1:5"]).expect_failure(&["rank 1 panicked"]);
}

#[test]
fn bad_options_say_what_to_fix() {
    let p = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    train_on(&p, &["--batch-size", "0"]).expect_failure(&["--batch-size must be at least 1"]);
    train_on(&p, &["--straggler", "7:2"]).expect_failure(&["--straggler"]);
    let dir = scratch("bad-config");
    let c = write(&dir, "c.toml", "epoch = 2\n");
    train_on(&p, &["--config", &c]).expect_failure(&["c.toml", "epoch"]);
}

/// Issue 43, item 10: `data info` on an empty file says there is nothing in it (it printed "NaN %
/// dense" and exited 0), and `graph search --nodes 0` blames --nodes, not --out-degree (whose
/// range it printed as 1..18446744073709551615).
#[test]
fn an_empty_file_and_no_nodes_are_named() {
    let dir = scratch("bad-empty-info");
    let empty = write(&dir, "empty.svm", "");
    run(&["data", "info", &empty], 60).expect_failure(&["empty.svm holds no examples"]);
    let out = dir.join("g.txt");
    for n in ["0", "1"] {
        run(&["graph", "search", "--nodes", n, "--out-degree", "2", "--out", s(&out)], 60).expect_failure(&["--nodes must be at least 2"]);
    }
}

/// Issue 43, item 6: an error every rank finds in its own shard is said once, with the other
/// ranks named after it (each of 4 ranks printed its own copy), and every rank exits non-zero.
#[test]
fn an_error_every_rank_finds_is_said_once() {
    let dir = scratch("bad-said-once");
    let bad = write(&dir, "all-zero.svm", &"+1 0:1\n".repeat(8));
    let job = mpirun(4, &["train", "--model", "svm", "--data", &bad, "--epochs", "1"], 60).expect_failure(&[
        "error on rank 0: ",
        "all-zero.svm:1:4",
        "and on ranks 1-3: the same error at other places",
    ]);
    let copies = job.stderr.lines().filter(|l| l.contains("feature index 0")).count();
    assert_eq!(copies, 1, "{}", job.stderr);
}
