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
        let mut a = vec![
            "train",
            "--data",
            &data,
            "--sync",
            "allreduce",
            "--epochs",
            "1",
            "--seed",
            seed,
            "--checkpoint-dir",
            s(&ck),
            "--checkpoint-every",
            "10",
        ];
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
    run("3", &["--resume"]).expect_failure(&["belong to other runs", "seed", "3 here"]);
    // A temporary file left by a crashed write of run 1 is removed when run 1 starts again.
    let stale = ck.join(format!(".{}.999999.tmp", first[1]));
    std::fs::write(&stale, b"half a checkpoint").unwrap();
    let job = run("1", &["--resume", "--max-rounds", "40"]).expect_ok();
    assert!(job.stderr.contains(&first[1]), "resumed from its own newest checkpoint: {}", job.stderr);
    assert!(!stale.exists(), "stale temporary file still there");
}

/// `--resume` continues only a checkpoint of the same run: one written with another
/// `--significance` (gaia), `--optimizer` or `--barrier` (async) belongs to another run and is
/// refused; one that differs only in `--metrics` and the log level is continued.
#[test]
fn resume_refuses_other_trajectory_options_and_accepts_other_outputs() {
    let dir = scratch("ckpt-identity");
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let lsq = ["--sync", "async", "--model", "lsq", "--label-threshold", "5", "--lr", "0.01", "--lr-schedule", "constant"];
    // (name, options, the option changed, its value in the first run, in the other run)
    let cases: [(&str, &[&str], &str, &str, &str); 3] = [
        // --dc-staleness 0: with the default 2, 2 ranks in groups of 1 and --checkpoint-every 10,
        // main's gaia fails about 1 run in 3 ("updates to the other groups were not delivered
        // within --wait-timeout"), a gaia defect this test is not about.
        ("significance", &["--sync", "gaia", "--groups", "2", "--dc-staleness", "0"], "--significance", "0.01", "0.05"),
        ("optimizer", &lsq, "--optimizer", "sgd", "saga"),
        ("barrier", &["--sync", "async"], "--barrier", "bsp", "async"),
    ];
    for (name, opts, opt, value, other) in cases {
        let ck = dir.join(name);
        let go = |v: &str, extra: &[&str], env: &[(&str, &str)]| {
            let mut a = vec![
                "train",
                "--data",
                &data,
                "--epochs",
                "1",
                "--batch-size",
                "64",
                "--checkpoint-dir",
                s(&ck),
                "--checkpoint-every",
                "10",
                opt,
                v,
            ];
            a.extend(opts);
            a.extend(extra);
            mpirun_env(2, &a, env, 120)
        };
        let (m1, m2) = (dir.join(format!("{name}-1.jsonl")), dir.join(format!("{name}-2.jsonl")));
        go(value, &["--max-rounds", "10", "--metrics", s(&m1)], &[]).expect_ok();
        // The option changed: another run, which has no checkpoint there.
        go(other, &["--resume", "--max-rounds", "20"], &[]).expect_failure(&["belong to other runs"]);
        // Only the metrics file and the log level changed: the same run, continued.
        let job = go(value, &["--resume", "--max-rounds", "20", "--metrics", s(&m2)], &[("RUST_LOG", "debug")]).expect_ok();
        assert!(job.stderr.contains("resuming from") && job.stderr.contains("0000000010.h5"), "{name}: {}", job.stderr);
        assert_eq!(summary(&m2)["rounds"].as_u64(), Some(20), "{name}: the resumed run went on from round 10 to 20");
    }
}

/// An output that names an input fails at once on every rank, and the input is unchanged.
#[test]
fn an_output_that_is_an_input_fails_before_training() {
    let dir = scratch("outputs-inputs");
    let data = write(&dir, "train.svm", "1 1:0.5 2:1\n-1 1:-0.5 2:-1\n1 1:0.7\n-1 2:-0.3\n");
    let before = std::fs::read(&data).unwrap();
    let cfg = write(&dir, "run.toml", "epochs = 1\n");
    for (opt, target) in [("--metrics", data.as_str()), ("--save-model", data.as_str()), ("--metrics", cfg.as_str())] {
        mpirun(2, &["train", "--config", &cfg, "--data", &data, "--model", "svm", opt, target], 60).expect_failure(&[
            opt,
            "the same file as",
            "overwrite its input",
        ]);
    }
    assert_eq!(std::fs::read(&data).unwrap(), before, "the data file was changed");
    let m = dir.join("m.h5");
    mpirun(2, &["train", "--data", &data, "--model", "svm", "--metrics", s(&m), "--save-model", s(&m)], 60)
        .expect_failure(&["--save-model", "one output would overwrite the other"]);
    mpirun(1, &["train", "--data", &data, "--model", "svm", "--save-model", "/proc/nonexistent/model.h5"], 60)
        .expect_failure(&["--save-model", "/proc/nonexistent does not exist"]);
}

/// Runs a 2-rank job with every rank wrapped in a shell that reports the rank's own exit status
/// (the launcher reports only one); returns the job and each rank's status, rank-ordered.
fn job_with_rank_statuses(args: &[&str]) -> (Job, Vec<i32>) {
    let mut cmd = std::process::Command::new("timeout");
    cmd.args(["-k", "5", "60", &launcher(), "-n", "2"]);
    if launcher_is_open_mpi() {
        cmd.arg("--oversubscribe");
    }
    // Exit 0 after reporting, so the launcher never kills a rank for another one's status.
    cmd.args(["sh", "-c", r#""$0" "$@"; echo "rank-exit ${OMPI_COMM_WORLD_RANK:-$PMI_RANK} $?" >&2"#, bin()])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut statuses: Vec<(usize, i32)> = stderr
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("rank-exit ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    statuses.sort();
    let statuses: Vec<i32> = statuses.into_iter().map(|(_, c)| c).collect();
    let job = Job {
        // The launcher's status is 0 (the wrappers exit 0): the job's is its first failing rank's.
        status: statuses.iter().copied().find(|&c| c != 0).or(out.status.code()),
        timed_out: matches!(out.status.code(), Some(124) | Some(137) | None),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    };
    (job, statuses)
}

/// Every output option with a path that cannot work: the job stops before reading any data
/// (`--data` names a file that does not exist, so an error about the output proves the check
/// came first), every rank exits non-zero, the message names the option and what is wrong, and
/// nothing is created. A missing directory is an error unless --create-dirs is given.
#[test]
fn bad_output_paths_stop_every_rank_before_training() {
    let dir = scratch("outputs-bad-paths");
    let d = dir.to_str().unwrap();
    let file = write(&dir, "file", "not a directory");
    // Rank 1's send log is a directory; rank 0's is fine: the one rank's error stops both.
    std::fs::create_dir(dir.join("sends.rank1.csv")).unwrap();
    let missing = format!("{d}/typo");
    let cases: Vec<(Vec<String>, Vec<String>)> = vec![
        (
            vec!["--metrics".into(), format!("{missing}/m.jsonl")],
            vec![format!("--metrics {missing}/m.jsonl"), format!("directory {missing} does not exist"), "--create-dirs".into()],
        ),
        (
            vec!["--save-model".into(), format!("{missing}/sub/m.h5")],
            vec![format!("--save-model {missing}/sub/m.h5"), format!("directory {missing} does not exist")],
        ),
        (
            vec!["--checkpoint-dir".into(), format!("{missing}/ck")],
            vec![format!("--checkpoint-dir {missing}/ck"), format!("directory {missing} does not exist")],
        ),
        (
            vec!["--send-log".into(), format!("{missing}/s"), "--emulate-bandwidth".into(), "1000".into()],
            vec![format!("--send-log {missing}/s.rank0.csv"), format!("directory {missing} does not exist")],
        ),
        (vec!["--metrics".into(), d.into()], vec![format!("--metrics {d} is a directory")]),
        (vec!["--save-model".into(), format!("{d}/")], vec!["--save-model".into(), "is a directory".into()]),
        (vec!["--checkpoint-dir".into(), file.clone()], vec![format!("--checkpoint-dir {file} is not a directory")]),
        (vec!["--metrics".into(), format!("{file}/m.jsonl")], vec!["--metrics".into(), format!("{file} is not a directory")]),
        (vec!["--save-model".into(), "/sys/m.h5".into()], vec!["--save-model /sys/m.h5".into(), "cannot create files in /sys".into()]),
        (
            vec!["--metrics".into(), "/sys/kernel/uevent_seqnum".into()],
            vec!["--metrics /sys/kernel/uevent_seqnum: cannot open for writing".into()],
        ),
        (vec!["--save-model".into(), "/dev/null".into()], vec!["--save-model /dev/null exists and is not a regular file".into()]),
        (
            vec!["--send-log".into(), format!("{d}/sends"), "--emulate-bandwidth".into(), "1000".into()],
            vec![format!("error on rank 1: --send-log {d}/sends.rank1.csv is a directory")],
        ),
    ];
    for (opts, needles) in &cases {
        let mut args = vec!["train", "--data", "/nonexistent/train.svm", "--model", "svm"];
        args.extend(opts.iter().map(String::as_str));
        let (job, statuses) = job_with_rank_statuses(&args);
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        let job = job.expect_failure(&needles);
        assert_eq!(statuses.len(), 2, "{opts:?}: every rank reports its exit status:\n{}", job.stderr);
        assert!(statuses.iter().all(|&c| c != 0), "{opts:?}: every rank exits non-zero: {statuses:?}\n{}", job.stderr);
        let data_errors = job.stderr.lines().filter(|l| l.contains("error") && l.contains("/nonexistent/train.svm")).count();
        assert_eq!(data_errors, 0, "{opts:?}: the data was read before the outputs were checked:\n{}", job.stderr);
        assert!(!std::path::Path::new(&missing).exists(), "{opts:?}: {missing} was created");
    }
}

/// --create-dirs creates every missing directory above every output (like mkdir -p), and the
/// run writes its outputs there.
#[test]
fn create_dirs_makes_the_directories_of_every_output() {
    let dir = scratch("outputs-create-dirs");
    let data = write(&dir, "train.svm", "1 1:0.5 2:1\n-1 1:-0.5 2:-1\n1 1:0.7\n-1 2:-0.3\n");
    let new = dir.join("new");
    let (m, model, ck, sends) = (new.join("a/m.jsonl"), new.join("b/c/model.h5"), new.join("d/ck"), new.join("e/sends"));
    let args = [
        "train",
        "--data",
        &data,
        "--model",
        "svm",
        "--epochs",
        "2",
        "--checkpoint-every",
        "1",
        "--emulate-bandwidth",
        "1000",
        "--metrics",
        s(&m),
        "--save-model",
        s(&model),
        "--checkpoint-dir",
        s(&ck),
        "--send-log",
        s(&sends),
    ];
    mpirun(2, &args, 60).expect_failure(&["does not exist", "--create-dirs"]);
    assert!(!new.exists(), "created without --create-dirs");
    let mut with = args.to_vec();
    with.push("--create-dirs");
    mpirun(2, &with, 60).expect_ok();
    assert_eq!(summary(&m)["ranks"], 2);
    assert!(model.is_file() && ck.is_dir() && std::fs::read_dir(&ck).unwrap().count() > 0);
    for r in 0..2 {
        assert!(new.join(format!("e/sends.rank{r}.csv")).is_file(), "no send log of rank {r}");
    }
}
