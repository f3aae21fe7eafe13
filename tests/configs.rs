//! Configuration files under real `mpirun`: the configuration a run writes (`--save-config`,
//! `--print-config`) is one that `--config` reads back for the same run, it drives runs of other
//! modes where only defaults differ, and the example configs in configs/ run.

mod common;
use common::*;

const HEART: &str = "/usr/share/doc/liblinear-tools/examples/heart_scale";

/// The final model of a saved model file, bit for bit.
fn params(p: &std::path::Path) -> Vec<u32> {
    let v: Vec<f32> = hdf5::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).dataset("params").unwrap().read_raw().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// A 2-rank DiLoCo run (allreduce, every-4 Nesterov outer steps: deterministic) whose step size is
/// chosen by the search writes its configuration (TOML and JSON: --save-config, and the JSON of
/// --print-config, alone on stdout); each one fed back with `--config` is accepted, does not
/// search again, ends with the bit-identical model and the same metric, and writes the same file.
#[test]
fn a_saved_configuration_repeats_the_run() {
    let dir = scratch("configs-round-trip");
    let (first, first_h5) = (dir.join("first.toml"), dir.join("first.h5"));
    let m = dir.join("first.jsonl");
    let args = ["train", "--data", HEART, "--model", "logreg", "--sync", "allreduce", "--sync-every", "4", "--outer-optimizer", "nesterov"];
    let more = ["--epochs", "3", "--batch-size", "8", "--metrics", s(&m), "--save-model", s(&first_h5), "--save-config", s(&first)];
    let job = mpirun(2, &[&args[..], &more[..], &["--print-config"]].concat(), 120).expect_ok();
    assert!(job.stderr.contains("--lr not given"), "the step is searched the first time:\n{}", job.stderr);
    // The JSON object is the first thing on stdout, whole lines up to the first "}" line.
    let end = job.stdout.find("\n}\n").unwrap_or_else(|| panic!("no JSON object on stdout:\n{}", job.stdout)) + 3;
    let printed = write(&dir, "printed.json", &job.stdout[..end]);
    assert!(job.stdout.starts_with('{') && job.stdout[end..].contains("asap-train summary"), "{}", job.stdout);
    let text = std::fs::read_to_string(&first).unwrap();
    for other in ["graph", "notify", "staleness", "topics", "hidden", "classes", "save_config"] {
        assert!(!text.lines().any(|l| l.starts_with(&format!("{other} ="))), "{other} is not this run's:\n{text}");
    }
    let lr = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap()["config"]["lr"].clone();
    assert!(text.contains(&format!("\nlr = {lr}\n")), "the searched step {lr} is written:\n{text}");
    let (p0, m0) = (params(&first_h5), summary(&m)["final_metric"].clone());
    for (tag, config) in [("toml", s(&first)), ("json", printed.as_str())] {
        let again = dir.join(format!("again.{tag}"));
        let job = mpirun(2, &["train", "--config", config, "--save-config", s(&again)], 120).expect_ok();
        assert!(!job.stderr.contains("--lr not given"), "{tag}: the written step is used as given:\n{}", job.stderr);
        assert!(params(&first_h5) == p0, "{tag}: the run from the written configuration ends with another model");
        assert_eq!(summary(&m)["final_metric"], m0, "{tag}");
        let written = std::fs::read_to_string(config).unwrap();
        assert_eq!(std::fs::read_to_string(&again).unwrap(), written, "{tag}: the rerun's configuration differs");
    }
}

/// The configuration an asap run writes (asap's options at their defaults) drives an ssp run and
/// an allreduce run given by a flag; a key of asap's that is not at its default is refused for
/// allreduce, naming the file's line, whatever the file says of `sync`; a flag of asap's is
/// refused for allreduce even at its default.
#[test]
fn one_configuration_drives_runs_of_other_modes() {
    let dir = scratch("configs-modes");
    let asap = dir.join("asap.json");
    mpirun(2, &["train", "--data", HEART, "--model", "svm", "--epochs", "1", "--lr", "0.1", "--save-config", s(&asap)], 120).expect_ok();
    let text = std::fs::read_to_string(&asap).unwrap();
    assert!(text.contains("\"graph\": \"auto\"") && text.contains("\"notify\""), "{text}");
    for mode in ["ssp", "allreduce"] {
        let m = dir.join(format!("{mode}.jsonl"));
        mpirun(2, &["train", "--config", s(&asap), "--sync", mode, "--metrics", s(&m)], 120).expect_ok();
        let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
        assert_eq!(start["config"]["sync"], mode);
        assert_eq!(start["config"]["lr"].as_f64(), Some(0.1), "the file's options are used");
    }
    let bad = write(&dir, "bad.toml", &format!("data = {HEART:?}\nsync = \"asap\"\ngraph = \"complete\"\nepochs = 1\n"));
    mpirun(2, &["train", "--config", &bad, "--sync", "allreduce"], 120).expect_failure(&[
        "--graph applies to --sync asap",
        "not to this run (--sync allreduce)",
        "bad.toml:3:1",
    ]);
    mpirun(2, &["train", "--config", s(&asap), "--sync", "allreduce", "--graph", "auto"], 120)
        .expect_failure(&["--graph applies to --sync asap", "given on the command line"]);
}

/// Every example config in configs/ runs (one epoch, 2 ranks) as the mode it names, and says so
/// in its start line: examples that stopped parsing or drifted from their options would fail here.
#[test]
fn the_example_configs_run() {
    let dir = scratch("configs-examples");
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/configs");
    let mut files: Vec<_> = std::fs::read_dir(examples).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for expected in ["asap.toml", "diloco.toml", "ssp.toml"] {
        assert!(names.iter().any(|n| n == expected), "configs/{expected} is missing: {names:?}");
    }
    for file in &files {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        let m = dir.join(format!("{name}.jsonl"));
        mpirun(2, &["train", "--config", s(file), "--epochs", "1", "--metrics", s(&m)], 300).expect_ok();
        let config = &metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap()["config"];
        let table: toml::Table = std::fs::read_to_string(file).unwrap().parse().unwrap();
        for (key, value) in &table {
            if key != "epochs" {
                assert_eq!(config[key].to_string(), serde_json::to_string(value).unwrap(), "{name}: {key}");
            }
        }
    }
}
