//! The Python package `asap_train` (python/, built by `make python` into .venv-python) under a
//! real mpirun: the reducer's invariants (tests/python/reducer_checks.py), MPI shared with mpi4py
//! in both import orders, the graph functions against `asap-train graph gap --json`, and the
//! numpy example. `make test` runs `make python` first.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{bin, kill_job, launcher, launcher_is_open_mpi, new_job_marker, Job, JOB_MARKER};

/// The venv's interpreter; the tests need `make python` to have run.
fn python() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-python/bin/python");
    assert!(p.exists(), "{} is missing: run `make python` first (make test does)", p.display());
    p
}

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path).to_string_lossy().into_owned()
}

/// The package links the MPI `make python` built it against (Debian's default, Open MPI); under
/// `make test-mpich` (an MPICH build of the binary) there is no MPICH build of it to launch.
fn skip_under_mpich() -> bool {
    if common::built_with_mpich() {
        eprintln!("the Python package is built against Open MPI only: not run under an MPICH build");
        return true;
    }
    false
}

/// `LAUNCHER -n N .venv-python/bin/python ARGS` with the environment Open MPI needs here, killed
/// after `limit_s` seconds with every process of the job.
fn mpirun_python(n: usize, args: &[&str], env: &[(&str, &str)], limit_s: u64) -> Job {
    mpirun_interpreter(&python(), n, args, env, limit_s)
}

/// `mpirun_python` with another interpreter (.venv-torch's).
fn mpirun_interpreter(python: &Path, n: usize, args: &[&str], env: &[(&str, &str)], limit_s: u64) -> Job {
    let marker = new_job_marker();
    let mut cmd = Command::new("timeout");
    cmd.env(JOB_MARKER, &marker).args(["-k", "5", &limit_s.to_string(), &launcher(), "-n", &n.to_string()]);
    if launcher_is_open_mpi() {
        cmd.arg("--oversubscribe");
    }
    cmd.arg(python)
        .args(args)
        .envs(env.iter().copied())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1");
    let out = cmd.output().expect("timeout(1) runs");
    let status = out.status.code();
    let job = Job {
        timed_out: status == Some(124) || status == Some(137),
        status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    let left = kill_job(&marker);
    if left > 0 {
        eprintln!("killed {left} process(es) left behind (timed out: {})", job.timed_out);
    }
    job
}

/// Runs reducer_checks.py CHECK on `n` ranks and asserts that every rank reported it held.
fn check(n: usize, name: &str) -> Job {
    let job = mpirun_python(n, &[&repo("tests/python/reducer_checks.py"), name], &[], 120).expect_ok();
    // mpirun may join two ranks' lines into one, so the reports are looked for anywhere
    // (n <= 10: "rank 1" cannot be the start of another rank's number).
    assert!(n <= 10);
    for r in 0..n {
        let report = format!("{name} ok rank {r}");
        assert!(job.stdout.contains(&report), "rank {r} did not report {name}:\n{}\n{}", job.stdout, job.stderr);
    }
    job
}

#[test]
fn allreduce_average_is_exact() {
    if !skip_under_mpich() {
        check(8, "allreduce_exact");
        check(3, "allreduce_exact");
    }
}

#[test]
fn outer_optimizer_is_plain_averaging_at_step_one_and_textbook_nesterov() {
    if !skip_under_mpich() {
        check(4, "outer");
    }
}

#[test]
fn compressed_gossip_keeps_the_mean_while_the_replicas_agree() {
    if !skip_under_mpich() {
        check(4, "choco");
    }
}

#[test]
fn notify_ack_has_no_torn_reads_and_keeps_the_mean() {
    if !skip_under_mpich() {
        check(8, "notify_ack");
    }
}

#[test]
fn push_sum_conserves_mass() {
    if !skip_under_mpich() {
        check(8, "push_sum");
    }
}

#[test]
fn bounded_staleness_reduces_messages_at_most_s_rounds_old() {
    if !skip_under_mpich() {
        check(4, "staleness");
        check(4, "budget");
    }
}

#[test]
fn table_reads_hold_the_staleness_bound() {
    if !skip_under_mpich() {
        check(8, "table_ssp");
        check(4, "table_bosen");
    }
}

#[test]
fn bad_options_raise_on_every_rank() {
    if !skip_under_mpich() {
        check(8, "bad_options");
        check(2, "wrong_array");
    }
}

/// `emulate_bandwidth=` paces a reducer's sends as the binary's `--emulate-bandwidth` does (per-rank
/// links, the slower end's rate), and a table's; bad link options raise on every rank.
#[test]
fn emulated_links_pace_the_reducer() {
    if !skip_under_mpich() {
        check(2, "emulated");
    }
}

#[test]
fn an_uncaught_bad_option_ends_the_job_without_a_hang() {
    if skip_under_mpich() {
        return;
    }
    let job = mpirun_python(4, &[&repo("tests/python/reducer_checks.py"), "uncaught"], &[], 60);
    job.expect_failure(&["invalid value 'bogus' for '--notify <NOTIFY>'", "aborting every rank"]);
}

/// MPI is initialised once whichever of asap_train and mpi4py is imported first, and both use
/// the same MPI_COMM_WORLD.
#[test]
fn mpi_is_shared_with_mpi4py_in_both_import_orders() {
    if skip_under_mpich() {
        return;
    }
    for order in ["asap_train-first", "mpi4py-first"] {
        let job = mpirun_python(4, &[&repo("tests/python/mpi4py_order.py"), order], &[], 120).expect_ok();
        let lines = job.stdout.matches(&format!("{order} ok rank")).count();
        assert_eq!(lines, 4, "{order}:\n{}\n{}", job.stdout, job.stderr);
    }
}

/// graph_gap returns what `asap-train graph gap --json` prints (all but its timing); edges,
/// search and mix agree with it.
#[test]
fn graph_gap_matches_the_binary() {
    if skip_under_mpich() {
        return;
    }
    check(1, "graphs");
    let cases: [&[&str]; 4] = [
        &["--kind", "root-expander", "--nodes", "25"],
        &["--kind", "random:4", "--nodes", "300", "--seed", "7"],
        &["--kind", "one-peer-exponential", "--nodes", "16"],
        &["--kind", "exponential", "--nodes", "1024", "--model-bytes", "31400"],
    ];
    for args in cases {
        let out = Command::new(bin()).args(["graph", "gap", "--json"]).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let want: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let kw: Vec<String> = args.chunks(2).map(|p| format!("{}={:?}", p[0].trim_start_matches("--").replace('-', "_"), p[1])).collect();
        let code = format!(
            "import json, asap_train as at\nkw = dict({})\nfor k in ('nodes', 'seed', 'model_bytes'):\n    kw[k] = int(kw[k]) if k in kw else kw.get(k)\nprint(json.dumps(at.graph_gap(**{{k: v for k, v in kw.items() if v is not None}})))",
            kw.join(", ")
        );
        let py = Command::new(python()).args(["-c", &code]).output().unwrap();
        assert!(py.status.success(), "{}", String::from_utf8_lossy(&py.stderr));
        let mut got: serde_json::Value = serde_json::from_slice(&py.stdout).unwrap();
        let mut want = want;
        for v in [&mut got, &mut want] {
            v.as_object_mut().unwrap().remove("seconds");
        }
        assert_eq!(got, want, "{args:?}");
    }
}

/// The numpy example trains softmax regression on Fashion-MNIST on 8 ranks with both reducers,
/// and reaches the binary's held-out accuracy with the same data, model (MLR), step size,
/// decay, L2, batch and mode within 0.5 pt (issue 30). Under allreduce and NOTIFY-ACK every
/// round reduces the same models on any schedule, so neither result depends on how the OS runs
/// the ranks; the two differ in shuffling and sharding only.
#[test]
fn numpy_example_reaches_the_binarys_accuracy() {
    if skip_under_mpich() {
        return;
    }
    let dir = common::scratch("python-numpy-example");
    let same = ["--epochs", "2", "--batch-size", "32", "--lr", "0.1", "--lr-decay", "0.8", "--lambda", "1e-4", "--seed", "1"];
    for sync in ["allreduce", "asap"] {
        let mut args = vec![repo("examples/numpy_logreg.py"), "--sync".into(), sync.into()];
        args.extend(same.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let job = mpirun_python(8, &args, &[], 300).expect_ok();
        let line = job
            .stdout
            .lines()
            .find(|l| l.starts_with("final test accuracy"))
            .unwrap_or_else(|| panic!("no result line:\n{}\n{}", job.stdout, job.stderr));
        let python: f64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
        if sync == "asap" {
            assert!(job.stdout.contains("torn 0"), "{}", job.stdout);
        }
        let metrics = dir.join(format!("{sync}.jsonl"));
        let mut bin_args = vec!["train", "--model", "mlr", "--sync", sync, "--metrics", metrics.to_str().unwrap()];
        bin_args.extend(same);
        common::mpirun(8, &bin_args, 300).expect_ok();
        let binary = common::summary(&metrics)["final_metric"].as_f64().unwrap();
        assert!((python - binary).abs() <= 0.005, "{sync}: numpy example {python}, binary {binary}");
        eprintln!("{sync}: numpy example {python:.4}, binary {binary:.4}");
    }
}

/// read_model gives what `predict` needs: numpy scores the test set from it exactly as
/// `asap-train predict` does; read_metrics reads the run's metrics file.
#[test]
fn read_model_and_metrics_of_a_binary_run() {
    if skip_under_mpich() {
        return;
    }
    let dir = common::scratch("python-read-files");
    let (model, metrics) = (dir.join("m.h5"), dir.join("m.jsonl"));
    let (model, metrics) = (model.to_str().unwrap(), metrics.to_str().unwrap());
    common::mpirun(
        2,
        &[
            "train",
            "--sync",
            "allreduce",
            "--epochs",
            "1",
            "--max-rounds",
            "40",
            "--lr",
            "0.05",
            "--metrics",
            metrics,
            "--save-model",
            model,
        ],
        120,
    )
    .expect_ok();
    let test = format!("{}/t10k-images-idx3-ubyte.gz", common::FASHION);
    let out = Command::new(bin()).args(["predict", "--model", model, "--data", &test, "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let value = v["value"].as_f64().unwrap().to_string();
    let py = Command::new(python()).args([&repo("tests/python/read_files.py"), model, metrics, &value]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&py.stdout), String::from_utf8_lossy(&py.stderr));
    assert!(py.status.success() && text.contains("read_files ok"), "{text}");
}

/// Runs sync_counts.py CHECK ARGS on `n` ranks and asserts that every rank reported it held.
fn count_check(n: usize, args: &[&str]) -> Job {
    let mut all = vec![repo("tests/python/sync_counts.py")];
    all.extend(args.iter().map(|s| s.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let job = mpirun_python(n, &all, &[], 120).expect_ok();
    for r in 0..n {
        let report = format!("{} ok rank {r}", args[0]);
        assert!(job.stdout.contains(&report), "rank {r} did not report {}:\n{}\n{}", args[0], job.stdout, job.stderr);
    }
    job
}

/// Issue 43 item 5: a rank that makes one sync more than the others (who then call finish)
/// gets a SyncCountError naming the ranks and their counts on every rank, in every mode a
/// Reducer runs, and the job ends (each rank exits 3 after printing it; uncaught, the job is
/// aborted), where allreduce gave ranks 1-3 a wrong model and hung rank 0, and asap waited
/// wait_timeout and blamed the peers.
#[test]
fn unequal_sync_counts_are_an_error_on_every_rank() {
    if skip_under_mpich() {
        return;
    }
    let script = repo("tests/python/sync_counts.py");
    for mode in ["allreduce", "asap", "none"] {
        let job = mpirun_python(4, &[&script, "extra_sync", mode], &[], 120);
        assert!(!job.timed_out && job.status != Some(0), "{mode}: {:?}\n{}\n{}", job.status, job.stdout, job.stderr);
        // mpirun may join two ranks' lines into one: each rank's report is looked for anywhere,
        // and the message is the same on every rank.
        let ahead = if mode == "none" { "rank 0 called finish() after 6 syncs" } else { "rank 0 called sync 6" };
        for r in 0..4 {
            let report = format!("extra_sync error rank {r}: unequal sync counts");
            assert!(job.stdout.contains(&report), "{mode}: rank {r} reported no error:\n{}\n{}", job.stdout, job.stderr);
        }
        let each = job.stdout.matches("unequal sync counts").count();
        for part in [ahead, "ranks 1-3 called finish() after 5 syncs", "reducer.join()"] {
            assert_eq!(job.stdout.matches(part).count(), each, "{mode}: not every report says '{part}':\n{}", job.stdout);
        }
    }
    for mode in ["allreduce", "asap"] {
        let job = mpirun_python(4, &[&script, "extra_sync_uncaught", mode], &[], 120);
        job.expect_failure(&["SyncCountError: unequal sync counts: rank 0 called sync 6", "aborting every rank"]);
    }
}

/// check_syncs=False (asap only): no per-sync rendezvous, the same rounds' result bit for bit,
/// join() refused on the rank that calls it, and allreduce refusing the option, on every rank.
#[test]
fn asap_without_the_count_check() {
    if skip_under_mpich() {
        return;
    }
    count_check(4, &["unchecked"]);
}

/// join(): ranks with 3, 5, 5, 5 syncs all finish; under allreduce every rank holds the mean of
/// the active ranks' models after each round (an oracle simulated in float64), under asap (a
/// relay) and none the final model keeps the mean of every update; a join under allreduce with
/// an outer optimizer raises on every rank.
#[test]
fn join_lets_ranks_with_fewer_syncs_finish() {
    if skip_under_mpich() {
        return;
    }
    for mode in ["allreduce", "asap", "none"] {
        count_check(4, &["join", mode]);
    }
    count_check(4, &["join_refused"]);
}

/// broadcast_parameters leaves root's arrays on every rank bit for bit; DistributedSampler deals
/// every index once per epoch over the ranks (padded as torch pads, or dropped), deterministic.
#[test]
fn broadcast_and_sampler_hold_their_invariants() {
    if skip_under_mpich() {
        return;
    }
    count_check(4, &["broadcast"]);
    count_check(3, &["sampler"]);
    count_check(4, &["sampler"]);
}

/// Issue 43 item 6: read_model reads an LDA model `train --model lda --save-model` wrote (it
/// refused it as "not an asap-train model file"): each word's topic counts sum to its tokens in
/// the training file, and the top words are the run's.
#[test]
fn read_model_reads_an_lda_model() {
    if skip_under_mpich() {
        return;
    }
    let dir = common::scratch("python-read-lda");
    let train = dir.join("docword.train.txt");
    let train = train.to_str().unwrap();
    let synth = ["data", "synth-lda", train, "--docs", "60", "--words", "50", "--topics", "3", "--doc-length", "30", "--seed", "1"];
    let out = Command::new(bin()).args(synth).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (model, metrics) = (dir.join("lda.h5"), dir.join("lda.jsonl"));
    let (model, metrics) = (model.to_str().unwrap(), metrics.to_str().unwrap());
    let args = ["train", "--model", "lda", "--sync", "allreduce", "--topics", "3", "--data", train, "--epochs", "3"];
    let mut a = args.to_vec();
    a.extend(["--save-model", model, "--metrics", metrics]);
    common::mpirun(2, &a, 120).expect_ok();
    let py = Command::new(python()).args([&repo("tests/python/read_lda.py"), model, train, metrics, "3"]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&py.stdout), String::from_utf8_lossy(&py.stderr));
    assert!(py.status.success() && text.contains("read_lda ok"), "{text}");
}

/// A Python MF loop on the Table (examples/table_mf.py) reaches the binary's held-out RMSE on
/// MovieLens with the same settings (`--model mf --sync ssp --staleness 0 --apply consgd`):
/// at S = 0 each shard applies a clock's pushes in worker order, so both runs are the same on
/// any schedule; they differ in shuffling and in the Python loop's one step per mini-batch.
#[test]
fn table_mf_example_reaches_the_binarys_rmse() {
    if skip_under_mpich() {
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let prep = Command::new(format!("{root}/datasets/prepare.sh")).current_dir(root).output().unwrap();
    assert!(prep.status.success(), "datasets/prepare.sh: {}", String::from_utf8_lossy(&prep.stderr));
    let (train, test) = (repo("datasets/out/movielens-train.ratings"), repo("datasets/out/movielens-test.ratings"));
    let same = [
        "--staleness",
        "0",
        "--apply",
        "consgd",
        "--lr",
        "1",
        "--lambda",
        "0.1",
        "--lr-decay",
        "0.9",
        "--epochs",
        "3",
        "--sync-every",
        "22",
        "--seed",
        "1",
    ];
    let mut args = vec![repo("examples/table_mf.py"), "--train".into(), train.clone(), "--test".into(), test.clone()];
    args.extend(same.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let job = mpirun_python(4, &args, &[], 300).expect_ok();
    let line =
        job.stdout.lines().find(|l| l.starts_with("held-out RMSE")).unwrap_or_else(|| panic!("no result:\n{}\n{}", job.stdout, job.stderr));
    let python: f64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(job.stdout.contains("max staleness 0"), "{}", job.stdout);
    let metrics = common::scratch("python-table-mf").join("mf.jsonl");
    let mut bin_args =
        vec!["train", "--data", &train, "--test-data", &test, "--model", "mf", "--sync", "ssp", "--metrics", metrics.to_str().unwrap()];
    bin_args.extend(same);
    common::mpirun(4, &bin_args, 300).expect_ok();
    let binary = common::summary(&metrics)["final_metric"].as_f64().unwrap();
    assert!((python - binary).abs() <= 0.01, "numpy MF on the Table {python}, binary {binary}");
    eprintln!("held-out RMSE: Python on the Table {python:.4}, binary {binary:.4}");
}

/// .venv-torch's interpreter, which `make test-torch` installs for the opt-in torch tests.
fn torch_python() -> std::path::PathBuf {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-torch/bin/python");
    assert!(py.exists(), "{} is missing: run `make test-torch` (it runs `make torch` first)", py.display());
    py
}

/// The PyTorch example (examples/torch_mlp.py) on 4 ranks, 1 epoch: DDP (torch's gradient
/// all-reduce over gloo) and the allreduce reducer (model averaging after the step) are the same
/// algorithm for plain SGD from equal replicas, so torch itself is the oracle for the reducer:
/// their final models must agree up to float rounding and score the same; asap trains on the
/// same batches (the same hash) with 0 torn reads. Every way is deterministic (gloo's and our
/// allreduce sum in a fixed order; NOTIFY-ACK reduces the same models on any schedule), so the
/// bounds do not depend on the schedule. Opt-in: torch is a 5 GB install, so this test is
/// ignored by `make test`; `make test-torch` installs torch and runs it.
#[test]
#[ignore = "needs torch: `make test-torch` installs it into .venv-torch and runs this test"]
fn torch_example_matches_ddp() {
    if skip_under_mpich() {
        return;
    }
    let py = torch_python();
    let script = repo("examples/torch_mlp.py");
    let job = mpirun_interpreter(&py, 4, &[&script, "--sync", "ddp,allreduce,asap", "--epochs", "1"], &[], 600).expect_ok();
    let summary = |way: &str| -> (f64, String, String) {
        let line = job.stdout.lines().find(|l| l.starts_with(&format!("{way:<9} summary")));
        let line = line.unwrap_or_else(|| panic!("no {way} summary:\n{}\n{}", job.stdout, job.stderr));
        let after = |key: &str| line.split(key).nth(1).unwrap().split([',', ' ']).find(|w| !w.is_empty()).unwrap().to_string();
        (after("test accuracy").parse().unwrap(), after("batches sha256"), line.to_string())
    };
    let (ddp, ddp_batches, _) = summary("ddp");
    let (allreduce, allreduce_batches, _) = summary("allreduce");
    let (asap, asap_batches, asap_line) = summary("asap");
    assert!(ddp_batches == allreduce_batches && ddp_batches == asap_batches, "not the same batches:\n{}", job.stdout);
    assert!(asap_line.contains("torn 0"), "{asap_line}");
    let diff = job.stdout.lines().find_map(|l| l.strip_prefix("ddp vs allreduce: final models differ by ")).unwrap();
    let diff: f64 = diff.split_whitespace().next().unwrap().parse().unwrap();
    assert!(diff < 1e-4, "DDP and the allreduce reducer diverged beyond float rounding: {diff}\n{}", job.stdout);
    assert!((ddp - allreduce).abs() <= 0.005, "DDP {ddp}, allreduce reducer {allreduce}");
    assert!(ddp > 0.75 && asap > 0.75, "one epoch of the MLP should pass 75 %: ddp {ddp}, asap {asap}\n{}", job.stdout);
    eprintln!("{}", job.stdout);
}

/// asap_train.torch (issue 43 item 5): examples/torch_distributed.py on 4 ranks, 1 epoch, with
/// rank 0 on half its shard: broadcast_parameters leaves every rank rank 0's model and finish()
/// every rank the same one (both checked bit for bit in the script), DistributedOptimizer's syncs
/// go on past rank 0's join() (468 syncs where rank 0 made 234 steps) under allreduce and asap,
/// and the model learns. Opt-in like `torch_example_matches_ddp`: `make test-torch` runs it.
#[test]
#[ignore = "needs torch: `make test-torch` installs it into .venv-torch and runs this test"]
fn torch_distributed_optimizer_joins_and_broadcasts() {
    if skip_under_mpich() {
        return;
    }
    let py = torch_python();
    let script = repo("examples/torch_distributed.py");
    for sync in ["allreduce", "asap"] {
        let job = mpirun_interpreter(&py, 4, &[&script, "--sync", sync, "--uneven", "0.5"], &[], 600).expect_ok();
        assert!(job.stdout.contains("(rank 0: 234), syncs 468"), "{sync}:\n{}\n{}", job.stdout, job.stderr);
        let line = job.stdout.lines().find(|l| l.starts_with("summary:")).unwrap_or_else(|| panic!("{sync}: no summary\n{}", job.stdout));
        let acc: f64 = line.split("test accuracy ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        assert!(acc > 0.75, "{sync}: one epoch should pass 75 %: {line}");
        eprintln!("{line}");
    }
}
