//! `asap-train elastic`: the elastic-restart fallback of issue 42 item 3, as torchelastic does it.
//! It launches `train` under mpirun (or srun), watches the launcher, and when a rank is lost
//! relaunches the job on one rank fewer with `--auto-resume`, which continues the newest
//! checkpoint at the new count (train::elastic's rule: the replicas' average, the examples left
//! of the interrupted epoch each seen once). Debian's Open MPI 4.1.4 has no ULFM, so the
//! survivors of a lost rank cannot go on in place: the launcher ends them all.
//!
//! What counts as a lost rank: the launcher ended with status 128 + S, its way of saying that a
//! rank was killed by signal S (mpirun: "mpirun noticed that process rank R with PID .. exited on
//! signal S"; srun: "task R: Killed"; both exit 128 + S, measured for mpirun 4.1.4: 137 after a
//! `kill -9`). The program's own errors (bad input, a bad option, divergence) end every rank with
//! status 1 (an abort of one rank with 3 to 5, a panic 101) and are not restarted: restarting
//! them would fail again the same way. Status 75 (a preemption stop, checkpoint written) is
//! passed on for the batch script to requeue.
//!
//! The restarts so far reach the relaunched program in [`RESTARTS_ENV`] (JSON), which records
//! them in its metrics' start line and summary ([`from_env`]).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use serde_json::json;

use crate::config::TrainConfig;

/// The environment variable in which `asap-train elastic` tells the program it relaunched the
/// restarts so far: a JSON array of [`Restart`] records.
pub const RESTARTS_ENV: &str = "ASAP_TRAIN_ELASTIC_RESTARTS";

/// The launchers `asap-train elastic` drives.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Open MPI's mpirun (the default build's launcher).
    Mpirun,
    /// Slurm's srun, inside an allocation (salloc or sbatch).
    Srun,
}

/// Options of `asap-train elastic`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example: asap-train elastic -n 8 --min-ranks 4 -- train --sync asap --checkpoint-dir ck \
                        --checkpoint-every 50 --metrics run.jsonl\n\
                        A restart redoes the steps since the newest checkpoint; every other example of the \
                        interrupted epoch is seen once (docs/training.md, \"Restarting after a lost rank\").")]
pub struct ElasticArgs {
    /// Ranks of the first launch.
    #[arg(short = 'n', long = "ranks", value_name = "N")]
    pub ranks: usize,
    /// The fewest ranks to go on with: a lost rank that would leave fewer ends the run with an
    /// error (its newest checkpoint kept for a later --auto-resume).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub min_ranks: usize,
    /// The most restarts; one more lost rank ends the run with an error.
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub max_restarts: usize,
    /// How to launch the ranks: mpirun (Open MPI), or srun inside a Slurm allocation.
    #[arg(long, value_enum, default_value = "mpirun")]
    pub launcher: Launcher,
    /// An argument for the launcher, before the program (repeatable), e.g.
    /// --launcher-arg=--hostfile --launcher-arg=hosts.
    #[arg(long = "launcher-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub launcher_args: Vec<String>,
    /// `train` and its options, after `--`; they need --checkpoint-dir DIR and --checkpoint-every
    /// N (--auto-resume is added).
    #[arg(last = true, required = true, value_name = "train OPTIONS")]
    pub train: Vec<String>,
}

/// One restart, as the program records it (the metrics' start line and summary, `restarts`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Restart {
    /// The rank the launcher reported lost (None when its message did not name one).
    pub lost_rank: Option<usize>,
    /// The signal that ended it (the launcher's status less 128).
    pub signal: i32,
    /// Ranks of the launch that lost it, and of the relaunch.
    pub ranks_before: usize,
    pub ranks: usize,
    /// The newest checkpoint of the run when the relaunch started (its --auto-resume continues it),
    /// and its round; None: none was written since `asap-train elastic` started.
    pub checkpoint: Option<String>,
    pub checkpoint_round: Option<u64>,
    /// How long the failed launch ran, and when its launcher ended (Unix seconds).
    pub launch_seconds: f64,
    pub ended_unix: f64,
}

/// The restarts `asap-train elastic` passed on ([`RESTARTS_ENV`]); empty when not under it.
pub fn from_env() -> anyhow::Result<Vec<Restart>> {
    match std::env::var(RESTARTS_ENV) {
        Err(_) => Ok(Vec::new()),
        Ok(text) => serde_json::from_str(&text)
            .with_context(|| format!("{RESTARTS_ENV} holds no list of restarts ({text:?}): it is set by `asap-train elastic`; unset it")),
    }
}

/// The line rank 0 prints about the restarts (None without any).
pub fn line(restarts: &[Restart]) -> Option<String> {
    let last = restarts.last()?;
    let lost = restarts.iter().map(|r| r.lost_rank.map_or("a rank".to_owned(), |q| format!("rank {q}"))).collect::<Vec<_>>();
    Some(format!(
        "elastic restarts: {} ({} lost); now {} rank{}{}",
        restarts.len(),
        lost.join(", "),
        last.ranks,
        if last.ranks == 1 { "" } else { "s" },
        last.checkpoint_round.map_or(String::new(), |r| format!(", the last from the round-{r} checkpoint")),
    ))
}

/// How the launcher ended a launch.
#[derive(Debug, PartialEq)]
enum Outcome {
    Finished,
    /// Status 75: stopped by a signal with its checkpoint written (the batch script requeues).
    Preempted,
    /// A rank killed by `signal` (status 128 + signal), the rank if the launcher named it.
    Lost {
        rank: Option<usize>,
        signal: i32,
    },
    /// Any other status: the program's own error, not restarted.
    Failed(i32),
}

fn outcome(status: std::process::ExitStatus, named: Option<usize>) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => Outcome::Finished,
        (Some(c), _) if c == super::PREEMPTED_EXIT as i32 => Outcome::Preempted,
        (Some(c), _) if c > 128 => Outcome::Lost { rank: named, signal: c - 128 },
        (Some(c), _) => Outcome::Failed(c),
        // The launcher itself killed by a signal: the whole job is gone, not one rank.
        (None, s) => Outcome::Failed(128 + s.unwrap_or(0)),
    }
}

/// The rank a launcher's line reports killed by a signal, if it is such a line: mpirun's "mpirun
/// noticed that process rank R with PID P on node H exited on signal S (..)", srun's "srun:
/// error: H: task R: Killed" (or another signal's name).
pub fn killed_rank(line: &str) -> Option<usize> {
    if let Some(rest) = line.split("noticed that process rank ").nth(1) {
        if line.contains("exited on signal") {
            return rest.split_whitespace().next()?.parse().ok();
        }
    }
    let rest = line.strip_prefix("srun: error: ")?;
    let (_, task) = rest.split_once(": task ")?;
    let (rank, what) = task.split_once(": ")?;
    (!what.starts_with("Exited")).then(|| rank.trim().parse().ok()).flatten()
}

/// The newest checkpoint (by round) in `dir` written since `since`: (path, round).
fn newest_checkpoint(dir: &Path, since: SystemTime) -> Option<(PathBuf, u64)> {
    super::checkpoint::list_checkpoints(dir)
        .into_iter()
        .filter(|(_, _, path)| path.metadata().and_then(|m| m.modified()).is_ok_and(|t| t >= since))
        .max_by_key(|c| c.1)
        .map(|(_, round, path)| (path, round))
}

/// What `asap-train elastic` checks before the first launch: the options it needs, and that the
/// run can resume at another rank count.
fn check(args: &ElasticArgs, cfg: &TrainConfig) -> anyhow::Result<()> {
    if args.ranks == 0 || args.min_ranks == 0 || args.min_ranks > args.ranks {
        bail!("asap-train elastic: -n {} --min-ranks {}: give 1 <= --min-ranks <= -n", args.ranks, args.min_ranks);
    }
    if cfg.checkpoint_dir.is_none() || cfg.checkpoint_every == 0 {
        bail!(
            "asap-train elastic restarts from the newest checkpoint: give `train` --checkpoint-dir DIR and --checkpoint-every N \
             (rounds between checkpoints; a restart redoes at most N rounds)"
        );
    }
    if cfg.model == crate::model::ModelKind::Lda {
        bail!("asap-train elastic: --model lda writes no checkpoints, so a restart could only start over");
    }
    if let (Err(why), true) = (super::resize_plan(cfg).allowed, args.min_ranks < args.ranks) {
        bail!("asap-train elastic restarts on fewer ranks, and {why}; or give --min-ranks {} to allow no restart", args.ranks);
    }
    Ok(())
}

/// Runs `asap-train elastic`: `config` parses `train`'s options (the command line's parser).
pub fn run(args: &ElasticArgs, config: &dyn Fn(&[String]) -> anyhow::Result<TrainConfig>) -> anyhow::Result<ExitCode> {
    let mut train: Vec<String> = args.train.clone();
    if train.first().map(String::as_str) != Some("train") {
        train.insert(0, "train".into());
    }
    if !train.iter().any(|a| a == "--auto-resume" || a == "--resume") {
        train.push("--auto-resume".into());
    }
    let cfg = config(&train)?;
    check(args, &cfg)?;
    let dir = PathBuf::from(cfg.checkpoint_dir.as_deref().expect("checked"));
    let exe = std::env::current_exe().context("asap-train elastic: cannot find its own executable")?;
    crate::comm::preempt::install_handlers();
    let started = SystemTime::now();
    let mut restarts: Vec<Restart> = Vec::new();
    let mut ranks = args.ranks;
    loop {
        let t0 = Instant::now();
        let (status, named) = launch(args, ranks, &exe, &train, &restarts)?;
        let ended_unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let (rank, signal) = match outcome(status, named) {
            Outcome::Finished => {
                if !restarts.is_empty() {
                    eprintln!("asap-train elastic: finished on {ranks} rank(s) after {} restart(s)", restarts.len());
                }
                return Ok(ExitCode::SUCCESS);
            }
            Outcome::Preempted => return Ok(ExitCode::from(super::PREEMPTED_EXIT)),
            Outcome::Failed(code) => {
                eprintln!(
                    "asap-train elastic: the job ended with status {code}, the program's own error (above), not a lost rank: \
                     not restarted"
                );
                return Ok(ExitCode::from(code.clamp(1, 255) as u8));
            }
            Outcome::Lost { rank, signal } => (rank, signal),
        };
        let who = rank.map_or("a rank".to_owned(), |r| format!("rank {r}"));
        let ckpt = newest_checkpoint(&dir, started);
        let from = ckpt.as_ref().map_or(
            format!(
                "the newest checkpoint of the run in {} (none was written since `asap-train elastic` started: an older one, or the start)",
                dir.display()
            ),
            |(p, r)| format!("checkpoint {} (round {r})", p.display()),
        );
        if restarts.len() >= args.max_restarts {
            bail!("{who} of {ranks} was lost (signal {signal}) after {} restart(s), --max-restarts {}: stopping; the newest is {from}, which `train --auto-resume` continues", restarts.len(), args.max_restarts);
        }
        if ranks - 1 < args.min_ranks {
            bail!("{who} of {ranks} was lost (signal {signal}) and {} rank(s) are fewer than --min-ranks {}: stopping; the newest is {from}, which `train --auto-resume` continues", ranks - 1, args.min_ranks);
        }
        eprintln!(
            "asap-train elastic: {who} of {ranks} was lost (signal {signal}, {:.2} s into the launch); restart {} of at most {}: \
             relaunching on {} rank(s) from {from}",
            t0.elapsed().as_secs_f64(),
            restarts.len() + 1,
            args.max_restarts,
            ranks - 1
        );
        restarts.push(Restart {
            lost_rank: rank,
            signal,
            ranks_before: ranks,
            ranks: ranks - 1,
            checkpoint: ckpt.as_ref().map(|(p, _)| p.to_string_lossy().into_owned()),
            checkpoint_round: ckpt.map(|(_, r)| r),
            launch_seconds: t0.elapsed().as_secs_f64(),
            ended_unix,
        });
        ranks -= 1;
    }
}

/// One launch of `train` on `ranks` ranks, watched to its end: the launcher's exit status and
/// the rank its output reported killed by a signal. Its standard error passes through line by
/// line; SIGTERM or SIGUSR1 to this process is passed on to the launcher as SIGUSR1 (the
/// ranks' preemption stop, slurm/asap-train.sbatch).
fn launch(
    args: &ElasticArgs,
    ranks: usize,
    exe: &Path,
    train: &[String],
    restarts: &[Restart],
) -> anyhow::Result<(std::process::ExitStatus, Option<usize>)> {
    let mut cmd = Command::new(match args.launcher {
        Launcher::Mpirun => "mpirun",
        Launcher::Srun => "srun",
    });
    cmd.arg("-n").arg(ranks.to_string());
    match args.launcher {
        // -x: the restarts also reach ranks on other nodes.
        Launcher::Mpirun => cmd.args(["-x", RESTARTS_ENV]),
        // Without it srun lets the other tasks run on after one is killed.
        Launcher::Srun => cmd.arg("--kill-on-bad-exit=1"),
    };
    cmd.args(&args.launcher_args).arg(exe).args(train).env(RESTARTS_ENV, serde_json::to_string(restarts)?);
    // When a rank dies, Open MPI's launcher sends the others SIGTERM, which they take as a
    // preemption request, and kills them only after this many seconds (default 1): they cannot
    // finish without the lost rank, so the wait only delays the restart (tests/common: `mpirun -n
    // 2 /bin/false` 1.08 s at the default, 0.04 s at 0).
    if std::env::var_os("OMPI_MCA_odls_base_sigkill_timeout").is_none() {
        cmd.env("OMPI_MCA_odls_base_sigkill_timeout", "0");
    }
    let mut child: Child = cmd.stderr(Stdio::piped()).spawn().with_context(|| format!("asap-train elastic: cannot start {cmd:?}"))?;
    let named = Arc::new(Mutex::new(None));
    let reader = {
        let (stderr, named) = (child.stderr.take().expect("piped"), Arc::clone(&named));
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(std::io::stderr().lock(), "{line}");
                if let (Some(r), Ok(mut n)) = (killed_rank(&line), named.lock()) {
                    n.get_or_insert(r);
                }
            }
        })
    };
    let mut forwarded = false;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if crate::comm::preempt::signalled() && !forwarded {
            forwarded = true;
            let _ = Command::new("kill").args(["-USR1", &child.id().to_string()]).status();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = reader.join();
    let named = *named.lock().map_err(|_| anyhow::anyhow!("the launcher's reader panicked"))?;
    Ok((status, named))
}

/// The restarts as JSON for the metrics (null when there were none).
pub fn to_json(restarts: &[Restart]) -> serde_json::Value {
    if restarts.is_empty() {
        serde_json::Value::Null
    } else {
        json!(restarts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launchers_lines_name_the_killed_rank() {
        let mpirun = "mpirun noticed that process rank 2 with PID 4242 on node vm exited on signal 9 (Killed).";
        assert_eq!(killed_rank(mpirun), Some(2));
        assert_eq!(killed_rank("srun: error: node3: task 5: Killed"), Some(5));
        assert_eq!(killed_rank("srun: error: node3: task 5: Exited with exit code 1"), None);
        assert_eq!(killed_rank("asap-train: error: cannot read data.csv"), None);
    }

    #[test]
    fn statuses_over_128_are_lost_ranks_and_the_programs_errors_are_not() {
        use std::os::unix::process::ExitStatusExt;
        let st = |code: i32| std::process::ExitStatus::from_raw(code << 8);
        assert_eq!(outcome(st(137), Some(1)), Outcome::Lost { rank: Some(1), signal: 9 });
        assert_eq!(outcome(st(1), None), Outcome::Failed(1));
        assert_eq!(outcome(st(4), Some(1)), Outcome::Failed(4));
        assert_eq!(outcome(st(75), None), Outcome::Preempted);
        assert_eq!(outcome(st(0), None), Outcome::Finished);
    }
}
