//! Every wait has a deadline: a rank stopped with SIGSTOP in the middle of a run ends the job
//! within `--wait-timeout` plus a few seconds, and the message names it.

mod common;
use common::*;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn stop_rank_and_expect_named(name: &str, sync: &[&str]) {
    let marker = format!("{name}-{}", std::process::id());
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let mut args = vec!["train", "--data", &data, "--epochs", "400", "--wait-timeout", "3"];
    args.extend(sync);
    let child = launch(3, 120)
        .args(&args)
        .env("ASAP_TEST_MARKER", &marker)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until rank 1 runs and is past start-up, then stop it.
    let start = Instant::now();
    let pid = loop {
        if let Some(&p) = rank_pids("ASAP_TEST_MARKER", &marker, Some(1)).first() {
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
    // A hang guard, not a speed claim: a watcher starved of CPU names nobody and waits another
    // timeout, at most 10 times (comm::deadline), each with 1 s of watching and two board reads
    // (0.5 s per rank at most under MPICH); then the job ends. Quiet, it ends ~4-5 s after the stop.
    let worst = Duration::from_secs(11 * (3 + 1 + 3) + 5);
    assert!(took < worst, "ended {took:?} after the stop (limit {worst:?})\n{text}");
    // Under any schedule the collectives' diagnosis (comm::deadline: "rank(s) [..] hold it up")
    // names rank 1 and no other, or says it cannot tell. Rank 1's own lines are left out:
    // continued by the launcher's kill sequence, it finds its own wait timed out, a view of no
    // value. (ssp's own timeouts name the shard servers a rank waits on, then the rank they wait
    // for: "[0, 1, 2] ... waits for the updates of rank(s) [1]"; they must name rank 1.)
    let verdicts: Vec<&str> = text.lines().filter(|l| !l.contains("error on rank 1:") && l.contains("hold it up")).collect();
    let named: Vec<&str> = verdicts
        .iter()
        .filter_map(|l| l.split_once("rank(s) [").and_then(|(_, rest)| rest.split_once(']')).map(|(n, _)| n))
        .collect();
    assert!(named.iter().all(|n| *n == "1"), "a rank other than the stopped rank 1 was named ({named:?}):\n{text}");
    assert!(text.contains("--wait-timeout") && (text.contains("rank(s) [1]") || text.contains("cannot tell")), "rank 1 not named:\n{text}");
    eprintln!("{name}: the job ended {took:?} after rank 1 was stopped; named {named:?}");
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
    if built_with_mpich() {
        // Measured: under MPICH 4.0.2 (ch4:ucx) MPI_Win_flush of a put towards a SIGSTOPped rank
        // never returns (remote completion needs the target in MPI), so its NOTIFY-ACK senders
        // block inside MPI where no deadline can reach them. A property of that MPI library.
        eprintln!("SKIPPED: MPICH 4.0.2 blocks in MPI_Win_flush towards a stopped rank; see docs/mpich.md");
        return;
    }
    stop_rank_and_expect_named("asap", &["--sync", "asap", "--graph", "complete"]);
}
