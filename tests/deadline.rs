//! Every wait has a deadline: a rank stopped with SIGSTOP in the middle of a run ends the job
//! within `--wait-timeout` plus a few seconds, and the message names it.

mod common;
use common::*;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs 3 ranks of `sync` with a 3 s `--wait-timeout`, stops rank 1 with SIGSTOP once it runs,
/// and checks the job's end and its diagnosis. `judged_waits`: every timeout message of the mode
/// carries the sign-of-life board's verdict (the parameter-server modes, whose waits outside the
/// collectives go through `comm::deadline::WaitDeadline`).
fn stop_rank_and_expect_named(name: &str, sync: &[&str], judged_waits: bool) {
    let marker = format!("{name}-{}", std::process::id());
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let mut args = vec!["train", "--data", &data, "--epochs", "400", "--wait-timeout", "3"];
    args.extend(sync);
    // The job's own limit is only a hang guard (the assertion on `took` below is the claim):
    // start-up alone took tens of seconds beside two CPU burners at load 18.
    let mut child =
        launch(3, 300).args(&args).env("ASAP_TEST_MARKER", &marker).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    // Stop rank 1 once every rank is past start-up: after rank 0's start line, which follows the
    // set-up collectives (so every rank has armed the deadline board and built its sync mode).
    // Stopped earlier, inside MPI_Init or before the board exists, it left the others blocked
    // where no deadline reaches (seen under load: a fixed 3 s after the rank appeared was not
    // enough, and the job ran into its time limit).
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            if line.contains("steps/epoch/rank") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    assert!(rx.recv_timeout(Duration::from_secs(240)).is_ok(), "{name}: no start line within 240 s");
    let pid = *rank_pids("ASAP_TEST_MARKER", &marker, Some(1)).first().expect("rank 1 runs");
    std::thread::sleep(Duration::from_secs(1));
    assert!(Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap().success());
    let stopped = Instant::now();
    let status = child.wait().unwrap();
    let took = stopped.elapsed();
    let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    let text = reader.join().unwrap();
    assert!(!status.success(), "the job must fail:\n{text}");
    // A hang guard, not a speed claim: a watcher starved of CPU names nobody and waits another
    // timeout, at most 10 times (comm::deadline), each with 1 s of watching and two board reads
    // (0.5 s per rank at most under MPICH); then the job ends (async's workers wait 1.5 timeouts:
    // 11 x (4.5 + 1 + 3) s, still inside). Quiet, it ends ~4-5 s after the stop.
    let worst = Duration::from_secs(11 * (3 + 1 + 3) + 5);
    assert!(took < worst, "ended {took:?} after the stop (limit {worst:?})\n{text}");
    // Under any schedule every diagnosis ("rank(s) [..] hold it up", from the collectives'
    // deadline or from a wait outside them: comm::deadline) names rank 1 and no other, or says it
    // cannot tell. Rank 1's own lines are left out: continued by the launcher's kill sequence, it
    // finds its own wait timed out, a view of no value. What a wait lacks is said too (ssp: "the
    // rows of clock 7 from the shard servers on ranks [0, 1, 2]", every one of which waits for
    // rank 1's updates) but is not blame, and is not parsed here.
    let lines: Vec<&str> = text.lines().filter(|l| !l.contains("error on rank 1:") && l.contains("--wait-timeout")).collect();
    let named: Vec<&str> = lines
        .iter()
        .flat_map(|l| {
            // Each piece but the last is followed by "] hold it up": its ranks end the piece.
            let pieces: Vec<&str> = l.split("] hold it up").collect();
            pieces[..pieces.len() - 1].iter().filter_map(|before| before.rsplit_once("rank(s) [").map(|(_, n)| n)).collect::<Vec<_>>()
        })
        .collect();
    assert!(named.iter().all(|n| *n == "1"), "a rank other than the stopped rank 1 was named ({named:?}):\n{text}");
    // (asap's NOTIFY-ACK waits name the neighbours whose message never came: "ACK from rank(s)
    // [1]"; the other modes' waits name rank 1 through the board's verdict.)
    let named_1 = if judged_waits { "rank(s) [1] hold it up" } else { "rank(s) [1]" };
    assert!(text.contains("--wait-timeout") && (text.contains(named_1) || text.contains("cannot tell")), "rank 1 not named:\n{text}");
    if judged_waits {
        // Every wait of this mode past --wait-timeout gives the board's verdict, none blames by
        // what it lacks.
        let unjudged: Vec<&&str> = lines.iter().filter(|l| !l.contains("hold it up") && !l.contains("cannot tell")).collect();
        assert!(unjudged.is_empty(), "a timeout without the board's verdict: {unjudged:?}\n{text}");
    }
    eprintln!("{name}: the job ended {took:?} after rank 1 was stopped; named {named:?}");
}

#[test]
fn a_stopped_rank_under_allreduce_is_named_within_the_timeout() {
    stop_rank_and_expect_named("allreduce", &["--sync", "allreduce"], false);
}

#[test]
fn a_stopped_rank_under_ssp_is_named_within_the_timeout() {
    stop_rank_and_expect_named("ssp", &["--sync", "ssp", "--staleness", "2"], true);
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
    stop_rank_and_expect_named("asap", &["--sync", "asap", "--graph", "complete"], false);
}

/// A stopped worker under async: the coordinator (rank 0) waits for its task at a cut and worker
/// 2 for its release; neither blames the other.
#[test]
fn a_stopped_rank_under_async_is_named_within_the_timeout() {
    stop_rank_and_expect_named("async", &["--sync", "async"], true);
}

/// A stopped data centre under gaia (three groups of one rank): the other mirror servers wait
/// for its clocks at the mirror clock (DS 2).
#[test]
fn a_stopped_rank_under_gaia_is_named_within_the_timeout() {
    stop_rank_and_expect_named("gaia", &["--sync", "gaia", "--groups", "3"], true);
}
