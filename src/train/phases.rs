//! Where the wall time of a job goes, phase by phase, so a user sees what is training and what
//! is start-up and shutdown around it (at 256 ranks on 2 cores the training loop was 1.5 s of a
//! 309 s command).
//!
//! The process records two instants before the run ([`mark_process_start`] first thing in
//! `main`, [`mark_mpi_initialised`] after `MPI_Init`); the run adds its own phases and the
//! summary reports them; whatever follows the summary (freeing the one-sided windows,
//! `MPI_Finalize`) is reported by rank 0 after `MPI_Finalize` ([`teardown_line`]).
//!
//! "Launch" is measured from the start of the process that started this rank (mpirun, orted,
//! srun's slurmstepd, Hydra's proxy: read from /proc) to this rank's `main`: what the launcher
//! spends spawning ranks, which no timer inside the program can otherwise see. It is reported
//! only when the parent is such a launcher.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What the process knows about its own start.
#[derive(Clone, Copy, Debug)]
struct ProcessMarks {
    main: Instant,
    /// Seconds from the launcher's start to this process's `main`, when the parent is a launcher.
    launch: Option<f64>,
    /// Seconds spent in `MPI_Init`.
    mpi_init: Option<f64>,
}

static MARKS: OnceLock<std::sync::Mutex<ProcessMarks>> = OnceLock::new();
static SUMMARY_AT: OnceLock<Instant> = OnceLock::new();
static RUN_RETURNED_AT: OnceLock<Instant> = OnceLock::new();

/// Process names of MPI and batch launchers whose children are ranks.
const LAUNCHERS: [&str; 9] = ["mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "hydra_pmi_proxy", "slurmstepd", "srun"];

/// Call first thing in `main`.
pub fn mark_process_start() {
    let marks = ProcessMarks { main: Instant::now(), launch: launcher_age(), mpi_init: None };
    let _ = MARKS.set(std::sync::Mutex::new(marks));
}

/// Call when `MPI_Init` has returned.
pub fn mark_mpi_initialised() {
    if let Some(m) = MARKS.get() {
        let mut m = m.lock().expect("not poisoned");
        m.mpi_init = Some(m.main.elapsed().as_secs_f64());
    }
}

/// Called by the run when its summary is written: teardown is measured from here.
pub fn mark_summary() {
    let _ = SUMMARY_AT.set(Instant::now());
}

/// Called when the run has returned (its one-sided windows are freed), before `MPI_Finalize`.
pub fn mark_run_returned() {
    let _ = RUN_RETURNED_AT.set(Instant::now());
}

/// (launch, MPI init) seconds of this process, when known.
pub fn startup() -> (Option<f64>, Option<f64>) {
    MARKS.get().map_or((None, None), |m| {
        let m = m.lock().expect("not poisoned");
        (m.launch, m.mpi_init)
    })
}

/// How long the launcher (the parent process) had been running when this process reached
/// `main`; None when the parent is not a known launcher or /proc cannot tell.
fn launcher_age() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let ppid: u32 = fields_after_comm(&stat)?.get(1)?.parse().ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).ok()?;
    if !LAUNCHERS.contains(&comm.trim()) {
        return None;
    }
    let parent = std::fs::read_to_string(format!("/proc/{ppid}/stat")).ok()?;
    // Field 22 (starttime) is the 20th after the command name, in clock ticks since boot;
    // USER_HZ is 100 on Linux for /proc whatever the kernel's HZ.
    let start_ticks: f64 = fields_after_comm(&parent)?.get(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()?;
    let age = uptime - start_ticks / 100.0;
    (age >= 0.0).then_some(age)
}

/// The fields of a /proc/PID/stat line after "(comm)", which may itself hold spaces.
fn fields_after_comm(stat: &str) -> Option<Vec<&str>> {
    Some(stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect())
}

/// Seconds of each phase of a run, as the summary reports them (max over ranks where ranks
/// differ).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Phases {
    /// Launcher start to the last rank's `main` (null when the launcher is unknown).
    pub launch: Option<f64>,
    /// The slowest rank's `MPI_Init`.
    pub mpi_init: Option<f64>,
    /// Reading and preparing the data (output checks, shards, scaling).
    pub load: f64,
    /// The automatic step search (`--lr` not given; src/train/step_search.rs): 0 without one.
    /// Apart from `load`, which it was counted in before (issue 43: "data loaded in 31.74s" was
    /// 31.3 s of search). Absent from the summaries of older versions.
    #[serde(default)]
    pub step_search: f64,
    /// Model, sync mode (graph analysis, one-sided windows), metrics file.
    pub setup: f64,
    /// The training loop without evaluations and checkpoints (`train_seconds`).
    pub train: f64,
    /// Every evaluation: of the averaged model, of each rank's own model, and the counters.
    pub evaluate: f64,
    /// Checkpoints (with the consistent cut before each).
    pub checkpoint: f64,
    /// The mode's final model (one allreduce in most modes) and the send log.
    pub final_model: f64,
}

impl Phases {
    /// One line for people.
    pub fn line(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("?".to_string(), |s| format!("{s:.2} s"));
        format!(
            "time by phase: launch {}, MPI init {}, load {:.2} s, step search {:.2} s, setup {:.2} s, training {:.2} s, evaluation {:.2} s, checkpoints {:.2} s, final model {:.2} s",
            opt(self.launch), opt(self.mpi_init), self.load, self.step_search, self.setup, self.train, self.evaluate, self.checkpoint, self.final_model
        )
    }
}

/// Rank 0's line after `MPI_Finalize`: the time since the summary (freeing windows,
/// `MPI_Finalize`) and since the launcher started. Also appended to the metrics file as
/// `{"event": "teardown", ...}` when one is given. None when no summary was written.
pub fn teardown_line(metrics: Option<&str>) -> Option<String> {
    let summary = *SUMMARY_AT.get()?;
    let teardown = summary.elapsed().as_secs_f64();
    // Up to the run's return: the final agreement and freeing the windows (ours); after it,
    // MPI_Finalize (Open MPI's).
    let freed = RUN_RETURNED_AT.get().map(|t| t.saturating_duration_since(summary).as_secs_f64());
    let finalize = freed.map(|f| teardown - f);
    let (launch, _) = startup();
    let total = MARKS.get().map(|m| m.lock().expect("not poisoned").main.elapsed().as_secs_f64() + launch.unwrap_or(0.0));
    if let Some(path) = metrics {
        let line = serde_json::json!({
            "event": "teardown",
            "teardown_seconds": teardown,
            "free_seconds": freed,
            "finalize_seconds": finalize,
            "since_launch_seconds": launch.and(total),
            "unix_time": SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs_f64(),
        });
        use std::io::Write;
        if let Err(e) = std::fs::OpenOptions::new().append(true).open(path).and_then(|mut f| writeln!(f, "{line}")) {
            eprintln!("asap-train: cannot append the teardown time to {path}: {e}");
        }
    }
    let parts = match (freed, finalize) {
        (Some(a), Some(b)) => format!(" (freeing the windows {a:.2} s, MPI_Finalize {b:.2} s)"),
        _ => String::new(),
    };
    Some(match (launch, total) {
        (Some(_), Some(t)) => format!("asap-train: teardown {teardown:.2} s{parts}; wall time {t:.2} s since the launcher started"),
        _ => format!("asap-train: teardown {teardown:.2} s{parts}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_fields_survive_spaces_and_parentheses_in_the_command_name() {
        let line = "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let f = fields_after_comm(line).unwrap();
        assert_eq!(f[0], "S");
        assert_eq!(f[1], "17");
        assert_eq!(f[19], "987654");
    }

    #[test]
    fn this_process_reads_its_own_start_time() {
        // Under cargo test the parent is cargo (not a launcher): no launch time.
        assert_eq!(launcher_age(), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        let ticks: f64 = fields_after_comm(&own).unwrap()[19].parse().unwrap();
        let uptime: f64 = std::fs::read_to_string("/proc/uptime").unwrap().split_whitespace().next().unwrap().parse().unwrap();
        // This test process started a moment ago (well within an hour).
        let age = uptime - ticks / 100.0;
        assert!((0.0..3600.0).contains(&age), "{age}");
    }
}
