//! Losing a rank in place (`--on-rank-loss continue`, issue 42 item 3; src/train/shrink.rs and
//! src/comm/ulfm.rs), in real jobs whose rank kills itself with SIGKILL (`--fault-kill`, a real
//! `kill -9`: no handler, no flush):
//! - the Debian build (no ULFM) refuses the option on every rank, naming what to build;
//! - the ULFM build (`make test-ulfm`: PyPI's Open MPI 5 in .venv-ompi5, the binary in
//!   target/ompi5, these tests with `ASAP_TRAIN_ULFM_MPIRUN` set to its `mpirun`) finishes with
//!   the survivors: exit 0, N - 1 ranks in the summary, the loss recorded, the graph rebuilt on
//!   N - 1 nodes and strongly connected, and the examples of every epoch counted from the ranks'
//!   traces (`ASAP_TRAIN_TRACE_EXAMPLES`): none seen twice in any epoch, every one once in the
//!   epochs before and after the loss, and in the epoch of the loss at least what the survivors
//!   saw plus what was dealt to them;
//! - a rank lost outside training (here during start-up) ends the job on every survivor with
//!   status 4 and a line naming where, never a hang.
//!
//! Where the ULFM build is not under test, its tests print why and pass. Every job runs under a
//! hang guard (`timeout`), never a speed claim.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use common::*;

/// The ULFM launcher, when the ULFM build is under test.
fn ulfm_launcher() -> Option<String> {
    std::env::var("ASAP_TRAIN_ULFM_MPIRUN").ok().filter(|m| !m.is_empty())
}

/// `mpirun --with-ft ulfm -n N asap-train ARGS` of the ULFM build, with its libraries found
/// (the binary has no run path to them: the wheel's libmpi.so.40 is named as Debian's).
fn ulfm_job(mpirun: &str, n: usize, args: &[&str], env: &[(&str, &str)], limit_s: u64) -> Job {
    let lib = Path::new(mpirun).parent().and_then(Path::parent).expect("mpirun in PREFIX/bin").join("lib");
    let mut cmd = Command::new("timeout");
    cmd.env(JOB_MARKER, new_job_marker());
    cmd.args(["-k", "5", &limit_s.to_string(), mpirun, "--with-ft", "ulfm", "--oversubscribe", "-n", &n.to_string(), bin()])
        .args(args)
        .envs(env.iter().copied())
        .env("LD_LIBRARY_PATH", lib)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let out = cmd.output().expect("timeout(1) runs");
    let status = out.status.code();
    let job = Job {
        timed_out: status == Some(124) || status == Some(137),
        status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    reap(&cmd, &job);
    job
}

#[test]
fn continuing_after_a_lost_rank_is_refused_without_ulfm() {
    if ulfm_launcher().is_some() {
        eprintln!("skipped: the ULFM build is under test (ASAP_TRAIN_ULFM_MPIRUN), which accepts the option");
        return;
    }
    mpirun(2, &["train", "--epochs", "1", "--on-rank-loss", "continue"], 120).expect_failure(&[
        "--on-rank-loss continue needs an MPI with ULFM",
        "make ulfm",
        "--with-ft ulfm",
    ]);
}

#[test]
fn a_mode_that_cannot_lose_a_rank_is_refused() {
    let Some(m) = ulfm_launcher() else {
        eprintln!("skipped: the ULFM build is not under test (make test-ulfm runs it)");
        return;
    };
    ulfm_job(&m, 2, &["train", "--epochs", "1", "--sync", "ssp", "--on-rank-loss", "continue"], &[], 120)
        .expect_failure(&["--sync ssp cannot go on without one of its ranks", "--sync allreduce, asap or none can"]);
}

/// On the ULFM build, a run without `--on-rank-loss continue` that loses a rank ends with the
/// dead rank named and status 4, as the Debian build's launcher names it (issue 42: "a killed
/// rank in a mode that cannot continue is still named"). Before, the wheel's default handler
/// ended this job naming no rank, with status 75, which slurm/asap-train.sbatch takes for a
/// preemption.
#[test]
fn a_rank_lost_where_the_run_cannot_go_on_is_named() {
    let Some(m) = ulfm_launcher() else {
        eprintln!("skipped: the ULFM build is not under test (make test-ulfm runs it)");
        return;
    };
    let args = ["train", "--epochs", "1", "--sync", "ssp", "--fault-kill", "2:20"];
    let job = ulfm_job(&m, 4, &args, &[], 120).expect_failure(&[
        "rank 2 kills itself (SIGKILL) at round 20",
        "rank(s) 2 of MPI_COMM_WORLD lost (a process failure); this run cannot go on without them",
    ]);
    assert_eq!(job.status, Some(4), "the survivors' status:\n{}", job.stderr);
}

/// Every (epoch, example id) in the traces under `prefix` (`.rank{r}` files); a line cut short by
/// the SIGKILL (the dead rank's last) is skipped.
fn traced(dir: &Path) -> Vec<(usize, u64)> {
    let mut all = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap();
        for line in text.lines() {
            let mut f = line.split(' ');
            if let (Some(Ok(ep)), Some(Ok(id)), None) = (f.next().map(str::parse), f.next().map(str::parse), f.next()) {
                all.push((ep, id));
            }
        }
    }
    all
}

/// A job of `n` ranks whose rank `kill` kills itself at `round`, with `args`: checks the
/// invariants of the module comment and returns the `rank_lost` record.
fn survive(n: usize, kill: usize, round: u64, args: &[&str]) -> Option<serde_json::Value> {
    let m = ulfm_launcher().or_else(|| {
        eprintln!("skipped: the ULFM build is not under test (make test-ulfm runs it)");
        None
    })?;
    let dir = scratch(&format!("ulfm-{n}-{kill}-{round}-{}", args.join("-").replace(['-', ' '], "")));
    let (metrics_file, traces) = (dir.join("m.jsonl"), dir.join("trace"));
    std::fs::create_dir_all(&traces).unwrap();
    let fault = format!("{kill}:{round}");
    let mut all = vec!["train", "--epochs", "3", "--metrics", s(&metrics_file), "--on-rank-loss", "continue", "--fault-kill", &fault];
    all.extend_from_slice(args);
    let prefix = traces.join("t");
    let job = ulfm_job(&m, n, &all, &[("ASAP_TRAIN_TRACE_EXAMPLES", s(&prefix))], 300);
    assert!(!job.timed_out, "the job hung:\n{}", job.stderr);
    let job = job.expect_ok();
    assert!(job.stderr.contains(&format!("rank {kill} kills itself")), "{}", job.stderr);
    let lines = metrics(&metrics_file);
    let summary = summary(&metrics_file);
    assert_eq!(summary["ranks"], n - 1, "the run finishes with the survivors");
    let lost: Vec<_> = lines.iter().filter(|v| v["event"] == "rank_lost").cloned().collect();
    assert_eq!(lost.len(), 1, "one loss recorded");
    let rec = &lost[0];
    assert_eq!(rec["dead_ranks"], serde_json::json!([kill]));
    assert_eq!((rec["ranks_before"].as_u64(), rec["ranks"].as_u64()), (Some(n as u64), Some(n as u64 - 1)));
    assert_eq!(summary["ranks_lost"][0]["dead_ranks"], rec["dead_ranks"], "the summary records the loss");
    // The set-up after the loss: a graph on the survivors that mixes.
    let starts: Vec<_> = lines.iter().filter(|v| v["event"] == "start").collect();
    let after = starts.last().unwrap();
    assert_eq!(after["ranks"], n - 1);
    assert_eq!(after["resumed"]["in_place"], true);
    if let Some(g) = after["sync_info"]["report"].as_object() {
        assert_eq!(g["nodes"], n - 1);
        assert_eq!(g["strongly_connected"], true);
        assert!(g["spectral_gap"].as_f64().unwrap() > 0.0, "{g:?}");
    }
    check_examples(&traces, rec, summary["train_examples"].as_u64().or(starts[0]["train_examples"].as_u64()).unwrap());
    Some(rec.clone())
}

/// The examples per epoch against the rule (module comment).
fn check_examples(traces: &Path, rec: &serde_json::Value, total: u64) {
    let loss_epoch = rec["epoch"].as_u64().unwrap() as usize;
    let mut per_epoch: HashMap<usize, HashMap<u64, u32>> = HashMap::new();
    for (ep, id) in traced(traces) {
        *per_epoch.entry(ep).or_default().entry(id).or_default() += 1;
    }
    for ep in 0..3 {
        let seen = per_epoch.get(&ep).cloned().unwrap_or_default();
        let twice: Vec<_> = seen.iter().filter(|(_, &c)| c > 1).take(5).collect();
        assert!(twice.is_empty(), "epoch {ep}: examples seen twice: {twice:?}");
        let count = seen.len() as u64;
        if ep == loss_epoch {
            let kept = rec["examples_seen_in_epoch"].as_u64().unwrap() + rec["examples_dealt"].as_u64().unwrap();
            assert!(count >= kept && count <= total, "epoch {ep}: {count} examples, the survivors saw and were dealt {kept}");
            assert_eq!(kept + rec["examples_dropped"].as_u64().unwrap(), total);
        } else {
            assert_eq!(count, total, "epoch {ep}: every example once");
        }
    }
}

#[test]
fn asap_notify_ack_at_8_ranks_goes_on_with_7_after_a_kill() {
    survive(8, 5, 350, &["--sync", "asap", "--transport", "p2p", "--notify", "notify-ack"]);
}

#[test]
fn asap_at_4_ranks_goes_on_after_rank_0_is_killed() {
    // Rank 0 wrote the metrics: the new rank 0 appends to them.
    survive(4, 0, 600, &["--sync", "asap", "--transport", "p2p"]);
}

/// A loss outside the training loop is not continued from: a rank killed during start-up
/// (`--fault-kill 2:0`, before its first collective) ends the job with the survivors' status 4
/// and their line naming the phase, within the hang guard (before, the survivors went on with
/// the communicator a failed MPI_Comm_dup left, failed on it with "MPI_ERR_COMM: invalid
/// communicator", and their MPI_Abort could leave the launcher hung).
#[test]
fn a_rank_lost_during_start_up_ends_the_job() {
    let Some(m) = ulfm_launcher() else {
        eprintln!("skipped: the ULFM build is not under test (make test-ulfm runs it)");
        return;
    };
    let args = ["train", "--epochs", "1", "--sync", "asap", "--transport", "p2p", "--on-rank-loss", "continue", "--fault-kill", "2:0"];
    let job = ulfm_job(&m, 4, &args, &[], 120).expect_failure(&[
        "rank 2 kills itself (SIGKILL) at round 0",
        "a rank was lost before training started; --on-rank-loss continue goes on only from a loss during training",
    ]);
    assert_eq!(job.status, Some(4), "the survivors' status:\n{}", job.stderr);
    assert!(!job.stderr.contains("invalid communicator"), "{}", job.stderr);
}

#[test]
fn allreduce_and_none_shrink_and_go_on() {
    survive(4, 2, 700, &["--sync", "allreduce"]);
    survive(4, 3, 300, &["--sync", "none"]);
}

/// Per epoch, how often each example id was seen, in the traces `dir/PREFIX.rank<r>` of the ranks
/// `ranks`; a last line without its newline (cut by the SIGKILL) is left out.
fn seen_by(dir: &Path, prefix: &str, ranks: &[usize]) -> HashMap<usize, HashMap<u64, u32>> {
    let mut seen: HashMap<usize, HashMap<u64, u32>> = HashMap::new();
    for r in ranks {
        let text = std::fs::read_to_string(dir.join(format!("{prefix}.rank{r}"))).unwrap_or_default();
        let whole = if text.ends_with('\n') { &text[..] } else { &text[..text.rfind('\n').map_or(0, |i| i + 1)] };
        for line in whole.lines().filter(|l| !l.starts_with('#')) {
            let (ep, id) = line.split_once(' ').unwrap();
            *seen.entry(ep.parse().unwrap()).or_default().entry(id.parse().unwrap()).or_default() += 1;
        }
    }
    seen
}

/// `a` less `b`, count by count (None where `b` holds more of some id than `a`).
fn less(a: &HashMap<u64, u32>, b: &HashMap<u64, u32>) -> Option<HashMap<u64, u32>> {
    let mut out = a.clone();
    for (id, &k) in b {
        let have = out.get_mut(id)?;
        *have = have.checked_sub(k)?;
    }
    out.retain(|_, k| *k > 0);
    Some(out)
}

/// A label-skewed run (dirichlet:0.5, allreduce, t10k in mini-batches of 50) of 4 ranks whose
/// rank 2 is killed at round 70 (epoch 1, step 20 of 50), against the uninterrupted run's trace
/// as its plan: the epoch before is the plan's (the dead rank's trace, cut by the kill, in it); in the epoch of the loss nothing is seen that
/// was not planned, nor more often (a small shard's repeats are planned, a large shard's rest is
/// not), what the plan held and was not seen is the dead rank's, and the survivors saw exactly
/// what they had seen and were dealt, which with the dropped is the plan.
#[test]
fn a_label_skewed_run_goes_on_after_a_kill_with_its_planned_examples() {
    let Some(m) = ulfm_launcher() else {
        eprintln!("skipped: the ULFM build is not under test (make test-ulfm runs it)");
        return;
    };
    let dir = scratch("ulfm-skewed");
    let traces = dir.join("trace");
    std::fs::create_dir_all(&traces).unwrap();
    let data = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
    let metrics_file = dir.join("m.jsonl");
    let common = [
        "train",
        "--data",
        data,
        "--epochs",
        "3",
        "--batch-size",
        "50",
        "--sync-every",
        "1",
        "--lr",
        "0.05",
        "--seed",
        "11",
        "--eval-every",
        "1000000",
        "--sync",
        "allreduce",
        "--partition",
        "dirichlet:0.5",
        "--on-rank-loss",
        "continue",
    ];
    let env = |p: &str| vec![("ASAP_TRAIN_TRACE_EXAMPLES", traces.join(p).to_string_lossy().into_owned())];
    let run = |extra: &[&str], prefix: &str| {
        let env = env(prefix);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let job = ulfm_job(&m, 4, &[&common[..], extra].concat(), &env, 300);
        assert!(!job.timed_out, "the job hung:\n{}", job.stderr);
        job.expect_ok()
    };
    run(&[], "u");
    run(&["--fault-kill", "2:70", "--metrics", s(&metrics_file)], "k");
    let rec = metrics(&metrics_file).into_iter().find(|v| v["event"] == "rank_lost").expect("the loss recorded");
    let epoch = rec["epoch"].as_u64().unwrap() as usize;
    assert_eq!(epoch, 1, "{rec}");
    let plan = seen_by(&traces, "u", &[0, 1, 2, 3]);
    let seen = seen_by(&traces, "k", &[0, 1, 2, 3]);
    let survivors = seen_by(&traces, "k", &[0, 1, 3]);
    // The dead rank's trace loses what it had not written out when it was killed.
    assert!(survivors[&0] == seen_by(&traces, "u", &[0, 1, 3])[&0], "epoch 0 of the survivors is the plan's");
    assert!(less(&seen_by(&traces, "u", &[2])[&0], &seen_by(&traces, "k", &[2])[&0]).is_some(), "epoch 0 of the dead rank is in the plan");
    let planned = &plan[&1];
    assert!(planned.values().any(|&k| k > 1), "some shard cycles (else the repeats are not tested)");
    let missing = less(planned, &seen[&1]).expect("epoch 1: an example seen more often than planned, or not planned");
    let dead_plan = &seen_by(&traces, "u", &[2])[&1];
    assert!(less(dead_plan, &missing).is_some(), "epoch 1: what the plan held and was not seen is the dead rank's");
    let total: u64 = planned.values().map(|&k| k as u64).sum();
    let (kept, dropped) = (
        rec["examples_seen_in_epoch"].as_u64().unwrap() + rec["examples_dealt"].as_u64().unwrap(),
        rec["examples_dropped"].as_u64().unwrap(),
    );
    assert_eq!(kept + dropped, total, "seen, dealt and dropped are the plan: {rec}");
    let by_survivors: u64 = survivors[&1].values().map(|&k| k as u64).sum();
    let survivors_before: u64 = rec["examples_seen_in_epoch"].as_u64().unwrap();
    assert!(
        survivors_before + rec["examples_dealt"].as_u64().unwrap() == by_survivors,
        "the survivors saw what they had seen and were dealt: {rec}"
    );
    assert_eq!(seen.keys().count(), 3, "three epochs traced");
}
