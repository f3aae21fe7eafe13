//! A real Slurm job: start a single-node cluster (munge, slurmctld, slurmd) with
//! slurm/local-cluster.sh, submit slurm/asap-train.sbatch with 4 tasks, wait, check the run.

mod common;
use common::*;
use std::process::Command;

struct Cluster(String);

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("slurm/local-cluster.sh").args(["stop", &self.0]).status();
    }
}

#[test]
fn sbatch_runs_a_four_rank_training_job() {
    let dir = scratch("slurm");
    let cdir = dir.join("cluster");
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("slurm/local-cluster.sh").current_dir(root).args(["start", s(&cdir)]).output().unwrap();
    assert!(out.status.success(), "cluster did not start (needs root and `make deps`): {}", String::from_utf8_lossy(&out.stderr));
    let _guard = Cluster(s(&cdir).to_string());
    let conf = cdir.join("slurm.conf");
    let metrics = dir.join("slurm.jsonl");
    let job_out = dir.join("job.out");
    let status = Command::new("timeout")
        .args(["-k", "5", "240", "sbatch", "--wait", "-n", "4", "-o", s(&job_out), "slurm/asap-train.sbatch",
               "--data", &format!("{FASHION}/t10k-images-idx3-ubyte.gz"), "--epochs", "1", "--metrics", s(&metrics)])
        .current_dir(root)
        .env("SLURM_CONF", &conf)
        .env("ASAP_TRAIN_BIN", bin())
        .status()
        .unwrap();
    let log = std::fs::read_to_string(&job_out).unwrap_or_default();
    assert!(status.success(), "sbatch job failed: {log}");
    let sm = summary(&metrics);
    assert_eq!(sm["ranks"], 4, "{log}");
    assert!(sm["final_metric"].as_f64().unwrap() > 0.7, "{sm}");
    assert!(log.contains("asap-train summary"), "{log}");
}
