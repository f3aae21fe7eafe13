//! Real Slurm jobs: each test starts a single-node cluster (munge, slurmctld, slurmd) with
//! slurm/local-cluster.sh and submits the scripts in slurm/ with `sbatch --wait`.
//!
//! When the machine cannot run Slurm daemons (not root, packages missing, a daemon refused by
//! the system) the script exits 77 and the test prints `SKIPPED: <reason>` and returns; set
//! ASAP_TRAIN_REQUIRE_SLURM=1 (CI does) to make that a failure. Any other failure, of the
//! cluster script or of our program inside the job, fails the test.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A running local cluster, stopped on drop.
struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    /// Starts a cluster in `dir`, or returns None (after saying why) when this machine cannot.
    fn start(dir: &Path) -> Option<Cluster> {
        let out = Command::new("slurm/local-cluster.sh").current_dir(ROOT).args(["start", s(dir)]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        match out.status.code() {
            Some(0) => Some(Cluster { dir: dir.to_owned() }),
            Some(77) if std::env::var_os("ASAP_TRAIN_REQUIRE_SLURM").is_none() => {
                eprintln!("SKIPPED: {}", err.trim());
                None
            }
            _ => panic!("the local Slurm cluster did not start ({:?}):\n{err}", out.status),
        }
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// A command run as a Slurm client of this cluster from the repository root, killed after
    /// `limit_s` seconds.
    fn client(&self, limit_s: u64, program: &str) -> Command {
        let mut c = Command::new("timeout");
        c.args(["-k", "5", &limit_s.to_string(), program]).current_dir(ROOT).env("SLURM_CONF", self.conf()).env("ASAP_TRAIN_BIN", bin());
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("slurm/local-cluster.sh").current_dir(ROOT).args(["stop", s(&self.dir)]).status();
    }
}

/// Submits slurm/asap-train.sbatch with 4 tasks and the given launcher; checks the run.
fn four_rank_job(name: &str, launcher: &str, expect_in_log: &str) {
    let dir = scratch(name);
    let Some(cluster) = Cluster::start(&dir.join("cluster")) else { return };
    let metrics = dir.join("slurm.jsonl");
    let job_out = dir.join("job.out");
    let status = cluster
        .client(240, "sbatch")
        .args(["--wait", "-n", "4", "-o", s(&job_out), "slurm/asap-train.sbatch", "--data", &format!("{FASHION}/t10k-images-idx3-ubyte.gz"),
               "--epochs", "1", "--metrics", s(&metrics)])
        .env("ASAP_TRAIN_LAUNCHER", launcher)
        .status()
        .unwrap();
    let log = std::fs::read_to_string(&job_out).unwrap_or_default();
    assert!(status.success(), "sbatch job failed ({status}): {log}");
    assert!(log.contains(expect_in_log), "the job did not use {expect_in_log:?}:\n{log}");
    let sm = summary(&metrics);
    assert_eq!(sm["ranks"], 4, "{log}");
    assert!(sm["final_metric"].as_f64().unwrap() > 0.7, "{sm}");
    assert!(log.contains("asap-train summary"), "{log}");
}

#[test]
fn sbatch_runs_a_four_rank_training_job_with_mpirun() {
    four_rank_job("slurm-mpirun", "mpirun", "mpirun -n 4");
}

/// Direct launch by Slurm: srun starts the 4 ranks and PMIx wires them up (no mpirun).
#[test]
fn sbatch_runs_a_four_rank_training_job_with_srun() {
    // pmix for Open MPI, pmi2 for an MPICH build: the script reads it from the binary.
    let plugin = if launcher_is_open_mpi() { "pmix" } else { "pmi2" };
    four_rank_job("slurm-srun", "srun", &format!("srun --mpi={plugin}"));
}

/// slurm/sweep.sh: one array task per list entry, then the gather job's table has one row per
/// entry with that run's own summary (mode, graph, rounds, metric).
#[test]
fn sweep_array_job_runs_every_entry_and_gathers_their_summaries() {
    let dir = scratch("slurm-sweep");
    let Some(cluster) = Cluster::start(&dir.join("cluster")) else { return };
    let list = write(
        &dir,
        "list.txt",
        "# name options\nallreduce --sync allreduce\n\nasap-ring --sync asap --graph ring --notify notify-ack\nindependent --sync none\n",
    );
    let out = dir.join("out");
    let status = cluster
        .client(300, "slurm/sweep.sh")
        .args([&list, s(&out), "-n", "2", "--wait", "--", "--data", &format!("{FASHION}/t10k-images-idx3-ubyte.gz"), "--epochs", "1",
               "--max-rounds", "30"])
        .status()
        .unwrap();
    let logs = || {
        std::fs::read_dir(&out)
            .map(|d| d.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "log" || x == "out"))
                .map(|e| format!("== {}\n{}", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default()))
                .collect::<String>())
            .unwrap_or_default()
    };
    assert!(status.success(), "sweep failed ({status}):\n{}", logs());
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap_or_else(|e| panic!("no summary.csv ({e}):\n{}", logs()));
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |row: &[String], name: &str| row[header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no column {name}"))].clone();
    let rows: Vec<Vec<String>> = lines.map(|l| l.split(',').map(str::to_owned).collect()).collect();
    assert_eq!(rows.len(), 3, "{csv}");
    for (name, sync, graph) in [("allreduce", "allreduce", ""), ("asap-ring", "asap", "ring"), ("independent", "none", "")] {
        let row = rows.iter().find(|r| r[0] == name).unwrap_or_else(|| panic!("no row {name}:\n{csv}"));
        assert_eq!(col(row, "status"), "ok", "{csv}\n{}", logs());
        assert_eq!(col(row, "sync"), sync, "{csv}");
        assert_eq!(col(row, "graph"), graph, "{csv}");
        assert_eq!(col(row, "ranks"), "2", "{csv}");
        assert_eq!(col(row, "rounds"), "30", "{csv}");
        // The row is that run's own summary line.
        let sm = summary(&out.join(format!("{name}.jsonl")));
        let (got, want) = (col(row, "final_metric").parse::<f64>().unwrap(), sm["final_metric"].as_f64().unwrap());
        assert!((got - want).abs() <= 1e-5, "{name}: table says {got}, its metrics file {want}");
    }
}
