//! `asap-train elastic` (issue 42 item 3, the elastic-restart fallback) under real `mpirun`: a
//! rank killed by a real SIGKILL mid-run, and the job relaunched on one rank fewer from the
//! newest checkpoint. Asserted by invariants only:
//! - the run ends with status 0 on 3 ranks, and its start lines and summary record the restart
//!   (the lost rank, the signal, the counts, the checkpoint the relaunch continued);
//! - every example is seen exactly once in every epoch, counted by id from the ranks' example
//!   traces (`ASAP_TRAIN_TRACE_EXAMPLES`), the killed launch's cut at the `# checkpoint ROUND`
//!   mark of the checkpoint the relaunch continued: the steps after it are redone, which is the
//!   documented cost of a restart;
//! - the program's own error (bad input) is not restarted: one launch, its error, non-zero;
//! - `--min-ranks` is respected: a loss that would leave fewer ends the run with an error;
//! - SIGTERM to `asap-train elastic` is a preemption stop (status 75), not a restart.
//!
//! The kill is race-free: the test waits until the run has written a checkpoint, then SIGKILLs
//! the process that the launcher started as rank 2 (found by the job's marker and rank variable
//! in its environment); every step takes at least 30 ms (`--emulate-compute 30`), so the run has
//! seconds of steps left after its first checkpoint. Every job runs under a hang guard.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DATA: &str = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
const EXAMPLES: u64 = 10_000;

/// `train` and its options: 3 epochs of 50-example mini-batches (t10k is covered exactly by an
/// epoch at 4 ranks), a checkpoint every 20 rounds, 30 ms steps.
fn train_args<'a>(ck: &'a Path, metrics: &'a Path, sync: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "train",
        "--data",
        DATA,
        "--epochs",
        "3",
        "--batch-size",
        "50",
        "--sync-every",
        "1",
        "--seed",
        "11",
        "--lr",
        "0.05",
        "--eval-every",
        "1000000",
        "--emulate-compute",
        "30",
        "--checkpoint-dir",
        s(ck),
        "--checkpoint-every",
        "20",
        "--metrics",
        s(metrics),
    ];
    a.extend(sync);
    a
}

/// `timeout LIMIT asap-train elastic ELASTIC -- TRAIN` with the environment Open MPI needs here
/// and a fresh job marker (the launcher and every rank inherit it).
fn elastic(elastic: &[&str], train: &[&str], env: &[(&str, &str)], limit_s: u64) -> (Command, String) {
    let marker = new_job_marker();
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", &(limit_s * HANG_GUARD_STRETCH).to_string(), bin(), "elastic"])
        .args(elastic)
        .arg("--")
        .args(train)
        .env(JOB_MARKER, &marker)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    (cmd, marker)
}

/// Starts the job, waits for a checkpoint in `ck`, SIGKILLs its rank `rank` and returns the job's
/// end.
fn kill_rank_after_a_checkpoint(mut cmd: Command, marker: &str, ck: &Path, rank: usize, limit_s: u64) -> Job {
    let child = cmd.spawn().expect("timeout(1) runs");
    let waited = Instant::now();
    let has_checkpoint = || std::fs::read_dir(ck).into_iter().flatten().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".h5"));
    while !has_checkpoint() {
        assert!(waited.elapsed() < Duration::from_secs(limit_s * HANG_GUARD_STRETCH), "no checkpoint in {}", ck.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    let pids = rank_pids(JOB_MARKER, marker, Some(rank));
    assert_eq!(pids.len(), 1, "one process is rank {rank} of job {marker}: {pids:?}");
    let killed = Command::new("kill").args(["-KILL", &pids[0].to_string()]).status().unwrap();
    assert!(killed.success(), "rank {rank} (pid {}) was alive to be killed", pids[0]);
    let out = child.wait_with_output().unwrap();
    let job = Job {
        timed_out: out.status.code() == Some(124),
        status: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    let left = kill_job(marker);
    assert_eq!(left, 0, "processes of job {marker} outlived it");
    job
}

/// Each example seen once in each epoch over the traces under `dir`, the launch of each rank's
/// file that was killed (all but the last in the file, `# start` lines parting them) cut at its
/// `# checkpoint ROUND` mark of the round the next launch continued (`resumed_from`, one per
/// restart). A trace file holds the launches its rank took part in, in order.
fn assert_each_example_once_across_restarts(dir: &Path, resumed_from: &[u64], what: &str) {
    let mut seen: std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, u32>> = Default::default();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap();
        let launches: Vec<&str> = text.split("# start\n").skip(1).collect();
        assert!(launches.len() <= resumed_from.len() + 1, "{what}: {} launches in {:?}", launches.len(), e.path());
        for (k, launch) in launches.iter().enumerate() {
            let kept = match resumed_from.get(k) {
                Some(round) => {
                    let mark = format!("# checkpoint {round}\n");
                    let at = launch.find(&mark).unwrap_or_else(|| panic!("{what}: no mark {mark:?} in launch {k} of {:?}", e.path()));
                    &launch[..at]
                }
                None => launch,
            };
            for line in kept.lines().filter(|l| !l.starts_with('#')) {
                let (epoch, id) = line.split_once(' ').unwrap();
                *seen.entry(epoch.parse().unwrap()).or_default().entry(id.parse().unwrap()).or_default() += 1;
            }
        }
    }
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2], "{what}: epochs traced");
    for (epoch, ids) in &seen {
        let twice: Vec<_> = ids.iter().filter(|(_, &c)| c != 1).take(5).collect();
        assert!(twice.is_empty(), "{what}: epoch {epoch}: examples seen more than once (id, times): {twice:?}");
        assert_eq!(ids.len() as u64, EXAMPLES, "{what}: epoch {epoch}: {} of {EXAMPLES} examples seen", ids.len());
    }
}

fn scratch_dirs(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = scratch(name);
    let trace = dir.join("trace");
    std::fs::create_dir_all(&trace).unwrap();
    (dir.join("ck"), dir.join("m.jsonl"), trace)
}

/// Open MPI's mpirun is the launcher `asap-train elastic --launcher mpirun` drives; an MPICH
/// build runs under srun (slurm/README.md).
fn open_mpi() -> bool {
    let yes = launcher_is_open_mpi();
    if !yes {
        eprintln!("skipped: asap-train elastic --launcher mpirun drives Open MPI's mpirun, and this build's launcher is another");
    }
    yes
}

/// kill -9 of rank `rank` of 4 under `sync` after the first checkpoint: restarted on 3 ranks from
/// the newest checkpoint, the run ends with status 0, the restart is in the start line and
/// summary, and every example is seen once in every epoch (the redone steps cut from the killed
/// launch).
fn killed_rank_is_restarted_on_one_rank_fewer(name: &str, sync: &[&str], rank: usize) {
    if !open_mpi() {
        return;
    }
    let (ck, m, trace) = scratch_dirs(name);
    let prefix = trace.join("t");
    let (cmd, marker) = elastic(&["-n", "4"], &train_args(&ck, &m, sync), &[("ASAP_TRAIN_TRACE_EXAMPLES", s(&prefix))], 120);
    let job = kill_rank_after_a_checkpoint(cmd, &marker, &ck, rank, 120);
    assert_eq!(job.status, Some(0), "the restarted run finishes:\n{}\n{}", job.stdout, job.stderr);
    assert!(job.stderr.contains(&format!("rank {rank} of 4 was lost (signal 9")), "{}", job.stderr);
    assert!(job.stderr.contains("relaunching on 3 rank(s) from checkpoint"), "{}", job.stderr);
    assert!(job.stdout.contains(&format!("elastic restarts: 1 (rank {rank} lost); now 3 ranks")), "{}", job.stdout);

    let lines = metrics(&m);
    let starts: Vec<&serde_json::Value> = lines.iter().filter(|l| l["event"] == "start").collect();
    assert_eq!(starts.len(), 2, "two launches wrote start lines: {starts:?}");
    assert!(starts[0]["restarts"].is_null() && starts[0]["resumed"].is_null(), "{}", starts[0]);
    let resumed = &starts[1]["resumed"];
    assert_eq!((resumed["ranks_before"].as_u64(), resumed["ranks"].as_u64()), (Some(4), Some(3)), "{resumed}");
    let round = resumed["round"].as_u64().unwrap();
    let summary = lines.iter().find(|l| l["event"] == "summary").expect("a summary");
    assert_eq!(summary["ranks"], 3);
    let r = &summary["restarts"];
    assert_eq!(r.as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!((r[0]["lost_rank"].as_u64(), r[0]["signal"].as_i64()), (Some(rank as u64), Some(9)), "{r}");
    assert_eq!((r[0]["ranks_before"].as_u64(), r[0]["ranks"].as_u64()), (Some(4), Some(3)), "{r}");
    assert_eq!(r[0]["checkpoint_round"].as_u64(), Some(round), "the relaunch continued the checkpoint it was told of: {r}");
    assert_eq!(starts[1]["restarts"], *r, "the relaunch's start line records the restart");
    assert_each_example_once_across_restarts(&trace, &[round], &format!("{sync:?}, rank {rank} of 4 killed"));
}

#[test]
fn asap_rank_killed_mid_run_is_restarted_on_one_rank_fewer() {
    killed_rank_is_restarted_on_one_rank_fewer("elastic-restart-asap", &["--sync", "asap"], 2);
}

/// Rank 0 is async's coordinator and the rank that writes the checkpoints and the metrics.
#[test]
fn async_coordinator_killed_mid_run_is_restarted_on_one_rank_fewer() {
    killed_rank_is_restarted_on_one_rank_fewer("elastic-restart-async", &["--sync", "async"], 0);
}

/// A parameter server's shard is lost with its rank: the relaunch re-partitions the servers'
/// model of the checkpoint by row over 3.
#[test]
fn ssp_server_killed_mid_run_is_restarted_on_one_rank_fewer() {
    killed_rank_is_restarted_on_one_rank_fewer("elastic-restart-ssp", &["--sync", "ssp", "--staleness", "2"], 1);
}

/// Bad input is the program's own error: one launch, its error, a non-zero status, no restart.
#[test]
fn bad_input_is_not_restarted() {
    if !open_mpi() {
        return;
    }
    let (ck, m, _) = scratch_dirs("elastic-restart-bad-input");
    let missing = ck.with_file_name("no-such-file.csv");
    let mut args = train_args(&ck, &m, &["--sync", "allreduce"]);
    args[2] = s(&missing);
    let (mut cmd, marker) = elastic(&["-n", "2"], &args, &[], 60);
    let job = finish_output(cmd.output().unwrap());
    assert_eq!(kill_job(&marker), 0);
    let job = job.expect_failure(&["no-such-file.csv", "not a lost rank: not restarted"]);
    assert_eq!(job.status, Some(1), "{}", job.stderr);
    assert_eq!(job.stderr.matches("no-such-file.csv").count(), 1, "the error once, from one launch:\n{}", job.stderr);
    assert!(!job.stderr.contains("relaunching"), "{}", job.stderr);
}

/// `--min-ranks 2` at 2 ranks: the lost rank ends the run with an error naming it and the
/// newest checkpoint, after one launch. Options it cannot restart are refused before any launch.
#[test]
fn min_ranks_is_respected_and_unrestartable_runs_are_refused() {
    if !open_mpi() {
        return;
    }
    let (ck, m, _) = scratch_dirs("elastic-restart-min-ranks");
    let (cmd, marker) = elastic(&["-n", "2", "--min-ranks", "2"], &train_args(&ck, &m, &["--sync", "allreduce"]), &[], 120);
    let job = kill_rank_after_a_checkpoint(cmd, &marker, &ck, 1, 120);
    let job = job.expect_failure(&["rank 1 of 2 was lost (signal 9)", "fewer than --min-ranks 2", "train --auto-resume"]);
    assert!(!job.stderr.contains("relaunching"), "{}", job.stderr);
    assert_eq!(metrics(&m).iter().filter(|l| l["event"] == "start").count(), 1, "one launch");

    let (ck2, m2, _) = scratch_dirs("elastic-restart-refused");
    let mut args = train_args(&ck2, &m2, &["--sync", "allreduce"]);
    let at = args.iter().position(|a| *a == "--checkpoint-every").unwrap();
    args.drain(at..at + 2);
    let (mut cmd, _) = elastic(&["-n", "2"], &args, &[], 30);
    finish_output(cmd.output().unwrap()).expect_failure(&["--checkpoint-every N"]);
    // A label-skewed --partition resumes at any rank count now (tests/elastic.rs); LDA writes
    // no checkpoints.
    let mut args = train_args(&ck2, &m2, &["--sync", "allreduce"]);
    args.extend(["--model", "lda"]);
    let (mut cmd, _) = elastic(&["-n", "2"], &args, &[], 30);
    let job = finish_output(cmd.output().unwrap()).expect_failure(&["--model lda writes no checkpoints"]);
    assert!(!ck2.exists(), "nothing was launched: {}", job.stderr);
}

/// SIGTERM to `asap-train elastic` (what a batch script passes on at a preemption) reaches the
/// ranks as SIGUSR1: they stop at the next vote with a checkpoint, and `elastic` exits 75 (the
/// status slurm/asap-train.sbatch requeues on) without a restart.
#[test]
fn a_signal_to_elastic_stops_the_run_with_status_75() {
    if !open_mpi() {
        return;
    }
    let (ck, m, _) = scratch_dirs("elastic-restart-preempt");
    let (mut cmd, marker) = elastic(&["-n", "2"], &train_args(&ck, &m, &["--sync", "allreduce"]), &[], 120);
    let child = cmd.spawn().expect("timeout(1) runs");
    let waited = Instant::now();
    while !std::fs::read_dir(&ck).into_iter().flatten().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".h5")) {
        assert!(waited.elapsed() < Duration::from_secs(120 * HANG_GUARD_STRETCH), "no checkpoint in {}", ck.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The supervisor: the process of the job whose program is the binary and whose first
    // argument is `elastic` (not `timeout`, not mpirun, not a rank).
    let supervisor: Vec<u32> = pids_with_env(JOB_MARKER, &marker)
        .into_iter()
        .filter(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args.first() == Some(&bin().as_bytes()) && args.get(1) == Some(&&b"elastic"[..])
        })
        .collect();
    assert_eq!(supervisor.len(), 1, "one asap-train elastic process: {supervisor:?}");
    assert!(Command::new("kill").args(["-TERM", &supervisor[0].to_string()]).status().unwrap().success());
    let job = finish_output(child.wait_with_output().unwrap());
    assert_eq!(kill_job(&marker), 0);
    assert_eq!(job.status, Some(75), "{}", job.stderr);
    assert!(job.stderr.contains("stopping at round") && !job.stderr.contains("relaunching"), "{}", job.stderr);
}

fn finish_output(out: std::process::Output) -> Job {
    Job {
        timed_out: out.status.code() == Some(124),
        status: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
