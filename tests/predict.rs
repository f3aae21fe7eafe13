//! `asap-train predict` against real training runs under mpirun: a model saved by `train
//! --save-model` scores its held-out set from the model file alone with the summary's metric,
//! computed with the same arithmetic (accuracy: the same count of correct examples; RMSE: the
//! same squared errors, summed in another order), for MLR, MLP, svm/logreg and MF. The file is
//! also read by h5py and scored by numpy (an independent oracle), and bad inputs fail clearly.

mod common;

use std::path::Path;

use common::*;

fn fashion(name: &str) -> String {
    format!("{FASHION}/{name}")
}

const HEART: &str = "/usr/share/doc/liblinear-tools/examples/heart_scale";

/// `predict --json`'s result.
fn predict(model: &Path, data: &str, out: Option<&Path>) -> serde_json::Value {
    let mut args = vec!["predict", "--model", s(model), "--data", data, "--json"];
    if let Some(o) = out {
        args.extend(["--out", s(o)]);
    }
    let job = run(&args, 120).expect_ok();
    serde_json::from_str(job.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", job.stdout))
}

/// The summary's held-out metric and the held-out example count of a metrics file.
fn reported(metrics: &Path) -> (f64, f64) {
    let all = common::metrics(metrics);
    let start = all.iter().find(|v| v["event"] == "start").expect("start line");
    let sum = summary(metrics);
    assert_eq!(sum["held_out"], true, "the run had a held-out set");
    (sum["final_metric"].as_f64().unwrap(), start["test_examples"].as_f64().unwrap())
}

/// Accuracy: predict's count of correct examples is the summary's exactly, and so its value.
fn assert_same_accuracy(metrics: &Path, p: &serde_json::Value) {
    let (acc, n) = reported(metrics);
    assert_eq!(p["count"].as_f64(), Some(n), "{p}");
    assert_eq!(p["metric_sum"].as_f64(), Some((acc * n).round()), "summary {acc} of {n}: {p}");
    assert_eq!(p["value"].as_f64(), Some(acc), "{p}");
}

/// The labels of a data file as asap-train reads them.
fn labels(path: &str) -> Vec<f32> {
    asap_train::data::load_shard(path, &Default::default(), 0, 1).unwrap().labels
}

fn read_predictions(path: &Path) -> Vec<f32> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| l.parse().unwrap_or_else(|_| panic!("{l:?}"))).collect()
}

/// The built-in default run (MLR on Fashion-MNIST with its test set, 4 ranks) saves a model
/// that `predict` scores with the summary's held-out accuracy, writing one original label per
/// example; h5py reads the file and numpy scores it from its arrays alone.
#[test]
fn default_run_model_predicts_its_held_out_accuracy() {
    let dir = scratch("predict-default");
    let (model, metrics, out) = (dir.join("m.h5"), dir.join("m.jsonl"), dir.join("pred.txt"));
    mpirun(4, &["train", "--save-model", s(&model), "--metrics", s(&metrics)], 300).expect_ok();
    let test = fashion("t10k-images-idx3-ubyte.gz");
    let p = predict(&model, &test, Some(&out));
    assert_same_accuracy(&metrics, &p);
    let pred = read_predictions(&out);
    let y = labels(&test);
    assert_eq!(pred.len(), y.len());
    let correct = pred.iter().zip(&y).filter(|(a, b)| a == b).count();
    assert_eq!(correct as f64, p["metric_sum"].as_f64().unwrap(), "the written predictions are the scored ones");
    // The independent oracle: numpy, from the file's arrays and attributes only.
    let script = r#"
import gzip, h5py, json, numpy as np, sys
f = h5py.File(sys.argv[1], "r")
assert f.attrs["format"] == "asap-train model" and f.attrs["scaling"] == "standard"
spec = json.loads(f.attrs["model_spec"])
d, j = spec["features"], spec["classes"]
W = f["params"][:].reshape(j, d + 1)
x = np.frombuffer(gzip.open(sys.argv[2]).read()[16:], np.uint8).reshape(-1, d).astype(np.float32)
y = np.frombuffer(gzip.open(sys.argv[3]).read()[8:], np.uint8)
x = (x - f["shift"][:]) * f["scale"][:]
pred = f["class_labels"][:][np.argmax(x @ W[:, :d].T + W[:, d], axis=1)]
print(int((pred == y).sum()))
"#;
    let o = std::process::Command::new("/usr/bin/python3")
        .args(["-c", script, s(&model), &test, &fashion("t10k-labels-idx1-ubyte.gz")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let numpy: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    // numpy sums the 784 products in another order than OpenBLAS: an example whose two best
    // scores are within rounding may go the other way, so the count may differ by a few (of
    // 10,000); a wrong scaling, layout or label map costs thousands.
    assert!((numpy - p["metric_sum"].as_f64().unwrap()).abs() <= 3.0, "numpy {numpy} against {p}");
}

/// MLP (another layout: layers of neuron rows) at 3 ranks.
#[test]
fn mlp_model_predicts_its_held_out_accuracy() {
    let dir = scratch("predict-mlp");
    let (model, metrics) = (dir.join("m.h5"), dir.join("m.jsonl"));
    mpirun(3, &["train", "--model", "mlp", "--hidden", "16", "--epochs", "1", "--save-model", s(&model), "--metrics", s(&metrics)], 300)
        .expect_ok();
    assert_same_accuracy(&metrics, &predict(&model, &fashion("t10k-images-idx3-ubyte.gz"), None));
}

/// svm and logreg on a LIBSVM file whose labels are 0 and 2: predictions come back as those
/// labels, and the accuracy is the summary's.
#[test]
fn linear_models_predict_original_labels() {
    let dir = scratch("predict-linear");
    let text: String = std::fs::read_to_string(HEART)
        .unwrap()
        .lines()
        .map(|l| {
            let (y, rest) = l.split_once(' ').unwrap();
            format!("{} {rest}\n", if y.starts_with('+') || y == "1" { "2" } else { "0" })
        })
        .collect();
    let data = write(&dir, "heart02.svm", &text);
    for kind in ["svm", "logreg"] {
        let (model, metrics, out) = (dir.join(format!("{kind}.h5")), dir.join(format!("{kind}.jsonl")), dir.join(format!("{kind}.txt")));
        mpirun(
            2,
            &[
                "train",
                "--model",
                kind,
                "--data",
                &data,
                "--test-data",
                &data,
                "--epochs",
                "3",
                "--save-model",
                s(&model),
                "--metrics",
                s(&metrics),
            ],
            120,
        )
        .expect_ok();
        // heart_scale is 96 % non-zero: held dense and standardised (issue 43, item 1).
        assert_eq!(scaling_of(&model), "standard", "{kind}");
        let p = predict(&model, &data, Some(&out));
        assert_same_accuracy(&metrics, &p);
        let pred = read_predictions(&out);
        assert!(pred.iter().all(|&v| v == 0.0 || v == 2.0), "{kind}: predictions not in the file's labels");
        let correct = pred.iter().zip(labels(&data)).filter(|(a, b)| **a == *b).count();
        assert_eq!(correct as f64, p["metric_sum"].as_f64().unwrap(), "{kind}");
    }
}

/// The scaling a model file says its training applied.
fn scaling_of(model: &Path) -> String {
    let f = hdf5::File::open(model).unwrap();
    f.attr("scaling").unwrap().read_scalar::<hdf5::types::VarLenUnicode>().unwrap().as_str().to_owned()
}

/// Issue 43, item 1: sparse rows under a quarter non-zero stay sparse and unscaled by default;
/// `--scale standard` (refused on sparse data before) holds them dense and standardises them,
/// and `predict` scores the LIBSVM file as training did.
#[test]
fn sparse_rows_are_standardised_on_request() {
    let dir = scratch("predict-sparse-standard");
    // 40 rows of 20 features, 2 non-zeros each (10 %): the label is the sign of feature 1.
    let text: String = (0..40)
        .map(|i| {
            let (a, b) = (if i % 2 == 0 { 3.0 } else { -3.0 }, 2 + (i * 7) % 19);
            format!(
                "{} 1:{a} {b}:{}
",
                if a > 0.0 { "+1" } else { "-1" },
                100 + i
            )
        })
        .collect();
    let data = write(&dir, "sparse10.svm", &text);
    for (scale, want) in [("auto", "none"), ("standard", "standard")] {
        let (model, metrics) = (dir.join(format!("{scale}.h5")), dir.join(format!("{scale}.jsonl")));
        let args = ["train", "--model", "logreg", "--data", &data, "--test-data", &data, "--epochs", "2", "--scale", scale];
        let mut a = args.to_vec();
        a.extend(["--save-model", s(&model), "--metrics", s(&metrics)]);
        mpirun(2, &a, 120).expect_ok();
        assert_eq!(scaling_of(&model), want, "--scale {scale}");
        assert_same_accuracy(&metrics, &predict(&model, &data, None));
    }
}

/// MF on a seeded low-rank ratings set: the same RMSE (the same squared errors, summed over
/// ranks in another order, so equal to f64 rounding), one predicted rating per line.
#[test]
fn mf_model_predicts_its_held_out_rmse() {
    let dir = scratch("predict-mf");
    let mut u = uniform_stream();
    let (a, b): (Vec<f64>, Vec<f64>) = ((0..40 * 2).map(|_| u() - 0.5).collect(), (0..30 * 2).map(|_| u() - 0.5).collect());
    let mut sets = Vec::new();
    for (name, n) in [("train.ratings", 3000), ("test.ratings", 400)] {
        let mut text = String::new();
        for _ in 0..n {
            let (i, j) = ((u() * 40.0) as usize, (u() * 30.0) as usize);
            let r = 3.0 + 4.0 * (a[2 * i] * b[2 * j] + a[2 * i + 1] * b[2 * j + 1]) + 0.1 * (u() - 0.5);
            text.push_str(&format!("{i} {j} {r:.4}\n"));
        }
        sets.push(write(&dir, name, &text));
    }
    let (model, metrics, out) = (dir.join("mf.h5"), dir.join("mf.jsonl"), dir.join("mf.txt"));
    // allreduce: a deterministic run, so its objective's course does not depend on the schedule.
    mpirun(
        2,
        &[
            "train",
            "--model",
            "mf",
            "--sync",
            "allreduce",
            "--data",
            &sets[0],
            "--test-data",
            &sets[1],
            "--epochs",
            "3",
            "--save-model",
            s(&model),
            "--metrics",
            s(&metrics),
        ],
        120,
    )
    .expect_ok();
    // The objective is the one SGD minimises (per-rating regulariser), named in the summary, and
    // it falls with the RMSE (the global regulariser used to make it rise).
    let evals: Vec<f64> =
        common::metrics(&metrics).iter().filter(|v| v["event"] == "eval").map(|v| v["objective"].as_f64().unwrap()).collect();
    assert!(evals.windows(2).all(|w| w[1] < w[0]), "objective by epoch {evals:?}");
    let definition = summary(&metrics)["objective_definition"].clone();
    assert!(definition.as_str().is_some_and(|d| d.contains("training ratings") && d.contains("lambda")), "{definition}");
    let p = predict(&model, &sets[1], Some(&out));
    let (rmse, n) = reported(&metrics);
    assert_eq!(p["count"].as_f64(), Some(n));
    let v = p["value"].as_f64().unwrap();
    assert!((v - rmse).abs() <= 1e-12 * rmse, "predict {v} against the summary's {rmse}");
    let pred = read_predictions(&out);
    let y = labels(&sets[1]);
    let sse: f64 = pred.iter().zip(&y).map(|(p, y)| ((y - p) as f64).powi(2)).sum();
    assert!(((sse / n).sqrt() - v).abs() <= 1e-6 * v, "written predictions give RMSE {} against {v}", (sse / n).sqrt());
}

/// Bad inputs: each a clear error naming the file and what to do, exit status 1.
/// Issue 43, item 6: the tools read what `train --zero-based auto` reads. A model trained on a
/// 0-based LIBSVM file scores its own test file with the run's accuracy and no flag; `data info`
/// and `data convert` take the `--zero-based auto` their errors name.
#[test]
fn the_tools_read_zero_based_files_as_training_did() {
    let dir = scratch("predict-zero-based");
    // heart_scale with every index one lower: column 0 is its first feature.
    let shifted: Vec<String> = std::fs::read_to_string(HEART)
        .unwrap()
        .lines()
        .map(|l| {
            let mut t = l.split_whitespace();
            let label = t.next().unwrap().to_owned();
            let feats = t.map(|f| {
                let (i, v) = f.split_once(':').unwrap();
                format!("{}:{v}", i.parse::<u32>().unwrap() - 1)
            });
            std::iter::once(label).chain(feats).collect::<Vec<_>>().join(" ")
        })
        .collect();
    let train = write(&dir, "train0.svm", &(shifted[..200].join("\n") + "\n"));
    let test = write(&dir, "test0.svm", &(shifted[200..].join("\n") + "\n"));
    let (model, metrics) = (dir.join("m.h5"), dir.join("m.jsonl"));
    let args = ["train", "--model", "logreg", "--data", &train, "--test-data", &test, "--zero-based", "auto", "--epochs", "2"];
    let mut a = args.to_vec();
    a.extend(["--lr", "0.5", "--save-model", s(&model), "--metrics", s(&metrics)]);
    mpirun(2, &a, 120).expect_ok();
    assert_same_accuracy(&metrics, &predict(&model, &test, None));
    // Read as 1-based, index 0 is refused, naming the option that the tools now take.
    run(&["data", "info", &test], 60).expect_failure(&["test0.svm:1:", "--zero-based auto"]);
    let info = run(&["data", "info", "--zero-based", "auto", &test], 60).expect_ok();
    assert!(info.stdout.contains("dimension   13") && info.stdout.contains("0-based"), "{}", info.stdout);
    let h5 = dir.join("test0.h5");
    run(&["data", "convert", "--zero-based", "auto", &test, s(&h5)], 60).expect_ok();
    let info = run(&["data", "info", s(&h5)], 60).expect_ok();
    assert!(info.stdout.contains("dimension   13") && info.stdout.contains("examples    70"), "{}", info.stdout);
    // heart_scale is 96 % non-zero: written dense, as training holds it (issue 43, item 1).
    assert!(info.stdout.contains("layout      dense"), "{}", info.stdout);
    // --zero-based given to predict overrides the model's numbering: 1-based, the 0 is refused.
    run(&["predict", "--model", s(&model), "--data", &test, "--zero-based", "false"], 60).expect_failure(&["test0.svm:1:"]);
}

#[test]
fn bad_inputs_to_predict_fail_clearly() {
    let dir = scratch("predict-bad");
    let model = dir.join("heart.h5");
    mpirun(1, &["train", "--model", "svm", "--data", HEART, "--epochs", "1", "--save-model", s(&model)], 120).expect_ok();
    let fail = |args: &[&str], needles: &[&str]| {
        let mut all = vec!["predict"];
        all.extend(args);
        let job = run(&all, 60);
        assert_eq!(job.status, Some(1), "{args:?}: {}", job.stderr);
        job.expect_failure(needles);
    };
    let missing = dir.join("missing.h5");
    fail(&["--model", s(&missing), "--data", HEART], &["--model", "missing.h5", "no such file", "--save-model"]);
    fail(&["--model", s(&model), "--data", s(&dir.join("none.svm"))], &["none.svm", "no such file"]);
    // Data of another shape than the model: 784 pixels against 13 features.
    fail(
        &["--model", s(&model), "--data", &fashion("t10k-images-idx3-ubyte.gz")],
        &["784 features per example", "trained on 13", "same shape"],
    );
    // Another kind: ratings against a classifier.
    let ratings = write(&dir, "r.ratings", "0 1 4\n1 0 3\n");
    fail(&["--model", s(&model), "--data", &ratings], &["r.ratings", "ratings data", "svm model"]);
    // Data with no feature at all: every prediction would be the bias alone.
    let bare = write(&dir, "labels-only.svm", "1\n-1\n");
    fail(&["--model", s(&model), "--data", &bare], &["labels-only.svm", "no example has a feature"]);
    // Files that are not our models: text, and an HDF5 file of something else.
    fail(&["--model", HEART, "--data", HEART], &["--model", "not an HDF5 file", "--save-model"]);
    let other = dir.join("other.h5");
    let f = hdf5::File::create(&other).unwrap();
    f.new_dataset_builder().with_data(&[1.0f32, 2.0]).create("x").unwrap();
    drop(f);
    fail(&["--model", s(&other), "--data", HEART], &["other.h5", "not an asap-train model file"]);
    // An output where no directory is.
    fail(&["--model", s(&model), "--data", HEART, "--out", "/nonexistent-dir/p.txt"], &["--out", "does not exist"]);
}

/// Issue 43, item 6: `predict` reads an LDA model that `train --save-model` wrote (it refused it
/// as "not an asap-train model file"): the topics' top words are the run's summary's, and on the
/// held-out file the perplexity is the 1-rank run's own (the same counts, seed and sweeps).
#[test]
fn an_lda_model_prints_its_topics_and_scores_perplexity() {
    let dir = scratch("predict-lda");
    let synth = |name: &str, seed: &str| {
        let p = dir.join(format!("docword.{name}.txt"));
        let a = ["data", "synth-lda", s(&p), "--docs", "80", "--words", "60", "--topics", "3", "--doc-length", "40", "--seed", seed];
        run(&a, 60).expect_ok();
        p.to_string_lossy().into_owned()
    };
    let (train, test) = (synth("train", "1"), synth("test", "2"));
    let (model, metrics) = (dir.join("lda.h5"), dir.join("lda.jsonl"));
    let args = ["train", "--model", "lda", "--sync", "allreduce", "--topics", "3", "--data", &train, "--test-data", &test];
    let mut a = args.to_vec();
    a.extend(["--epochs", "5", "--save-model", s(&model), "--metrics", s(&metrics)]);
    mpirun(1, &a, 120).expect_ok();
    let p = predict(&model, &test, None);
    let sm = summary(&metrics);
    assert_eq!(p["perplexity"], sm["perplexity"], "predict {p} against the run's {sm}");
    assert_eq!(p["top_words"], sm["top_words"], "{p}");
    run(&["predict", "--model", s(&model), "--data", &test, "--out", s(&dir.join("x.txt"))], 60)
        .expect_failure(&["--out", "an LDA model predicts no labels"]);
}
