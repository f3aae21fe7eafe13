//! End-to-end training jobs under real `mpirun`: convergence, resume equivalence, outputs.

mod common;
use common::*;

fn fashion(file: &str) -> String {
    format!("{FASHION}/{file}")
}

/// MLR on Fashion-MNIST with the all-reduce baseline converges at 1, 2 and 4 ranks.
#[test]
fn allreduce_mlr_fashion_converges_at_1_2_4_ranks() {
    for n in [1usize, 2, 4] {
        let dir = scratch(&format!("conv{n}"));
        let m = dir.join("m.jsonl");
        mpirun(
            n,
            &["train", "--data", &fashion("train-images-idx3-ubyte.gz"), "--test-data", &fashion("t10k-images-idx3-ubyte.gz"),
              "--sync", "allreduce", "--epochs", "2", "--lr", "0.1", "--metrics", s(&m)],
            300,
        )
        .expect_ok();
        let sm = summary(&m);
        let acc = sm["final_metric"].as_f64().unwrap();
        assert!(acc > 0.80, "{n} ranks: test accuracy {acc} after two epochs");
        assert_eq!(sm["ranks"], n);
        // Every evaluation line carries the fields users plot.
        let evals: Vec<_> = metrics(&m).into_iter().filter(|v| v["event"] == "eval").collect();
        assert!(!evals.is_empty());
        for k in ["epoch", "round", "train_seconds", "objective", "test_metric", "consensus_distance", "counters"] {
            assert!(!evals[0][k].is_null(), "eval line lacks {k}: {}", evals[0]);
        }
        if n > 1 {
            assert!(sm["counters"]["bytes_sent"]["mean"].as_f64().unwrap() > 0.0);
        }
    }
}

/// Binary models on a real LIBSVM file (heart_scale from liblinear-tools), two ranks.
#[test]
fn svm_and_logreg_learn_heart_scale() {
    let heart = "/usr/share/doc/liblinear-tools/examples/heart_scale";
    for model in ["svm", "logreg"] {
        let dir = scratch(&format!("heart-{model}"));
        let m = dir.join("m.jsonl");
        mpirun(
            2,
            &["train", "--data", heart, "--model", model, "--epochs", "30", "--batch-size", "8", "--lr", "0.1",
              "--lambda", "1e-3", "--metrics", s(&m)],
            120,
        )
        .expect_ok();
        let acc = summary(&m)["final_metric"].as_f64().unwrap();
        assert!(acc > 0.80, "{model}: training accuracy {acc} on heart_scale");
    }
}

/// A run stopped by --max-rounds and continued with --resume ends bit-identical to an
/// uninterrupted run with the same seed.
#[test]
fn resume_from_checkpoint_matches_uninterrupted_run() {
    let dir = scratch("resume");
    let data = fashion("t10k-images-idx3-ubyte.gz");
    let common = ["train", "--data", &data, "--epochs", "2", "--batch-size", "64", "--seed", "7", "--lr-schedule", "bottou"];
    let full = dir.join("full.h5");
    let mut a: Vec<&str> = common.to_vec();
    a.extend(["--save-model", s(&full)]);
    mpirun(2, &a, 120).expect_ok();

    let ck = dir.join("ck");
    let mut b: Vec<&str> = common.to_vec();
    b.extend(["--checkpoint-dir", s(&ck), "--checkpoint-every", "20", "--max-rounds", "101"]);
    mpirun(2, &b, 120).expect_ok();
    let resumed = dir.join("resumed.h5");
    let mut c: Vec<&str> = common.to_vec();
    c.extend(["--checkpoint-dir", s(&ck), "--resume", "--save-model", s(&resumed)]);
    let job = mpirun(2, &c, 120).expect_ok();
    assert!(job.stderr.contains("resuming from"), "{}", job.stderr);

    let read = |p: &std::path::Path| -> Vec<f32> {
        hdf5::File::open(p).unwrap().dataset("params").unwrap().read_raw().unwrap()
    };
    let (x, y) = (read(&full), read(&resumed));
    assert_eq!(x.len(), y.len());
    assert!(x == y, "resumed model differs from the uninterrupted one");
    // Resuming with a different rank count is refused with a message that says what to do.
    mpirun(1, &c, 60).expect_failure(&["written by 2 ranks", "resume it with 2 ranks"]);
}

/// The final model file opens in h5py with the expected shape; config and metrics are stored.
#[test]
fn final_model_is_readable_by_h5py() {
    let dir = scratch("h5py");
    let model = dir.join("model.h5");
    mpirun(2, &["train", "--data", &fashion("t10k-images-idx3-ubyte.gz"), "--epochs", "1", "--save-model", s(&model)], 120)
        .expect_ok();
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import h5py,json,sys; f=h5py.File(sys.argv[1]); p=f['params'][:]; \
                      c=json.loads(f.attrs['config']); print(p.shape[0], c['model'], f['row_offsets'][-1])", s(&model)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.trim(), "7850 mlr 7850", "h5py saw: {text}");
}

/// Options come from a config file, flags override it, and the effective configuration is
/// stored with the metrics.
#[test]
fn config_file_and_flags_make_the_effective_configuration() {
    let dir = scratch("config");
    let cfg = write(&dir, "run.toml", "epochs = 3\nbatch_size = 128\nlr = 0.02\nmodel = \"mlr\"\n");
    let m = dir.join("m.jsonl");
    mpirun(1, &["train", "--config", &cfg, "--epochs", "1", "--data", &fashion("t10k-images-idx3-ubyte.gz"), "--metrics", s(&m)], 120)
        .expect_ok();
    let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
    assert_eq!(start["config"]["epochs"], 1, "flag overrides the file");
    assert_eq!(start["config"]["batch_size"], 128, "file overrides the default");
    assert_eq!(start["config"]["test_data"], serde_json::Value::Null, "no built-in test set for other data");
}

/// `data convert` writes HDF5 that training then reads (sharded by hyperslabs).
#[test]
fn converted_hdf5_trains_like_the_source() {
    let dir = scratch("convert");
    let h5 = dir.join("heart.h5");
    run(&["data", "convert", "/usr/share/doc/liblinear-tools/examples/heart_scale", s(&h5), "--format", "libsvm"], 60).expect_ok();
    let m = dir.join("m.jsonl");
    mpirun(3, &["train", "--data", s(&h5), "--model", "svm", "--epochs", "20", "--batch-size", "8", "--lr", "0.1", "--metrics", s(&m)], 120)
        .expect_ok();
    assert_eq!(summary(&m).get("ranks").unwrap(), 3);
    let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
    assert_eq!(start["train_examples"], 270);
}

#[test]
fn help_explains_every_mode() {
    let h = run(&["train", "--help"], 30).expect_ok().stdout;
    for k in ["--sync", "--graph", "--notify", "--sync-every", "--checkpoint-dir", "--resume", "--metrics", "--straggler", "--lr-schedule"] {
        assert!(h.contains(k), "help lacks {k}");
    }
    assert!(run(&["--help"], 30).expect_ok().stdout.contains("graph"));
}
