//! Every wait has a deadline: a rank stopped with SIGSTOP in the middle of a run ends the job
//! within `--wait-timeout` plus a few seconds, and the message names it.

mod common;
use common::*;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Pid of the rank `rank` of the job whose ranks carry `marker` in their environment.
fn rank_pid(marker: &str, rank: usize) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        let has = |v: String| vars.iter().any(|x| *x == v.as_bytes());
        if has(format!("ASAP_TEST_MARKER={marker}")) && has(format!("OMPI_COMM_WORLD_RANK={rank}")) {
            return Some(pid);
        }
    }
    None
}

fn stop_rank_and_expect_named(name: &str, sync: &[&str]) {
    let marker = format!("{name}-{}", std::process::id());
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let mut args = vec!["-n", "3", "--oversubscribe", bin(), "train", "--data", &data, "--epochs", "400", "--wait-timeout", "3"];
    args.extend(sync);
    let child = Command::new("timeout")
        .args(["-k", "5", "120", "mpirun"])
        .args(&args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("ASAP_TEST_MARKER", &marker)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until rank 1 runs and is past start-up, then stop it.
    let start = Instant::now();
    let pid = loop {
        if let Some(p) = rank_pid(&marker, 1) {
            break p;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "rank 1 never appeared");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(3));
    assert!(Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap().success());
    let stopped = Instant::now();
    let out = child.wait_with_output().unwrap();
    let took = stopped.elapsed();
    let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the job must fail:\n{text}");
    assert!(took < Duration::from_secs(3 + 5 + 4), "ended {took:?} after the stop (limit: timeout 3 s + 5 s)\n{text}");
    assert!(text.contains("--wait-timeout") && text.contains("rank(s) [1]"), "rank 1 not named:\n{text}");
}

#[test]
fn a_stopped_rank_under_allreduce_is_named_within_the_timeout() {
    stop_rank_and_expect_named("allreduce", &["--sync", "allreduce"]);
}

#[test]
fn a_stopped_rank_under_ssp_is_named_within_the_timeout() {
    stop_rank_and_expect_named("ssp", &["--sync", "ssp", "--staleness", "2"]);
}

#[test]
fn a_stopped_rank_under_asap_is_named_within_the_timeout() {
    stop_rank_and_expect_named("asap", &["--sync", "asap", "--graph", "complete"]);
}
