//! Preemption: SIGUSR1 (what `mpirun` forwards to the ranks, and what Slurm's `--signal` sends)
//! makes every rank stop at the same round, write a checkpoint and exit with status 75; the job
//! continued with `--auto-resume` ends bit-identical to an uninterrupted run.

mod common;
use common::*;

use std::process::{Command, Stdio};
use std::time::Duration;

fn read_model(p: &std::path::Path) -> Vec<f32> {
    hdf5::File::open(p).unwrap().dataset("params").unwrap().read_raw().unwrap()
}

fn preempt_and_resume(name: &str, sync: &[&str]) {
    let dir = scratch(name);
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let ck = dir.join("ck");
    let model = dir.join("model.h5");
    let mut args = vec!["train", "--data", &data, "--epochs", "400", "--seed", "5", "--checkpoint-dir", s(&ck), "--auto-resume",
        "--save-model", s(&model)];
    args.extend(sync);
    let mut full_args: Vec<&str> = args.clone();
    let full = dir.join("full.h5");
    full_args.truncate(7);
    full_args.extend(["--save-model", s(&full)]);
    full_args.extend(sync);

    let marker = format!("{name}-{}", std::process::id());
    let child = launch(2, 120)
        .args(&args)
        .env("ASAP_TEST_MARKER", &marker)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let targets: Vec<String> = if launcher_is_open_mpi() {
        // `timeout` runs mpirun as its child: signal mpirun, which forwards SIGUSR1 to the ranks.
        let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id())).unwrap();
        vec![children.split_whitespace().next().expect("mpirun runs").to_owned()]
    } else {
        // MPICH 4.0.2's mpiexec forwards SIGUSR1 too, but then often exits 0 (or with the signal)
        // although every rank exited 75: 3 of 15 runs of a C program that exits 75 after the
        // signal. So the ranks are signalled directly, as Slurm's --signal does under srun.
        rank_pids("ASAP_TEST_MARKER", &marker, None).into_iter().map(|p| p.to_string()).collect()
    };
    assert!(!targets.is_empty(), "no process to signal");
    for t in &targets {
        assert!(Command::new("kill").args(["-USR1", t]).status().unwrap().success());
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "a preempted run exits 75:\n{err}");
    assert!(err.contains("stopping at round"), "{err}");
    assert!(!model.exists(), "no final model from a preempted run");

    // The requeued job: same command, continues from the checkpoint by itself.
    let job = mpirun(2, &args, 120).expect_ok();
    assert!(job.stderr.contains("resuming from"), "{}", job.stderr);
    mpirun(2, &full_args, 120).expect_ok();
    assert!(read_model(&model) == read_model(&full), "{name}: the preempted and resumed run differs from the uninterrupted one");
}

#[test]
fn preempted_allreduce_resumes_bit_identical() {
    preempt_and_resume("preempt-allreduce", &["--sync", "allreduce"]);
}

#[test]
fn preempted_ssp_at_staleness_zero_resumes_bit_identical() {
    preempt_and_resume("preempt-ssp", &["--sync", "ssp", "--staleness", "0"]);
}

#[test]
fn preempted_async_bsp_resumes_bit_identical() {
    preempt_and_resume("preempt-async", &["--sync", "async", "--barrier", "bsp"]);
}
