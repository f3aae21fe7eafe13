//! Elastic resumes (issue 42): a checkpoint written by N ranks continued on M != N ranks under
//! real `mpirun`. Asserted by invariants with independent oracles:
//! - the examples each epoch saw, counted by id from every rank's example trace
//!   (`ASAP_TRAIN_TRACE_EXAMPLES`): Fashion-MNIST t10k (10,000 rows) in mini-batches of 50 is
//!   covered exactly by an epoch at 2, 4 and 6 ranks, so every id must be seen exactly once in
//!   every epoch, the interrupted ones included;
//! - the resumed replicas against the documented rule, read from the HDF5 checkpoints: every new
//!   replica is the f64 mean of the old ones (a resume stopped at its own round by --max-rounds
//!   trains nothing and writes its new-count checkpoint);
//! - a same-count resume inside an epoch dealt at a resize ends bit-identical to the run that
//!   was not stopped there.

mod common;
use common::*;

use std::path::{Path, PathBuf};

/// The options every job of a test shares: 3 epochs of 50-example mini-batches, a fixed step
/// (an automatic step search could choose another per rank count, and the run's options would
/// differ; 0.05 unless `sync` gives one), one round per step, no evaluation before the end.
fn args<'a>(sync: &[&'a str], ck: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
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
        "--eval-every",
        "1000000",
        "--checkpoint-dir",
        s(ck),
    ];
    if !sync.contains(&"--lr") {
        a.extend(["--lr", "0.05"]);
    }
    a.extend(sync);
    a.extend(extra);
    a
}

const DATA: &str = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
const EXAMPLES: u64 = 10_000;

/// Runs one job on `n` ranks with its example trace under `trace`; returns the job.
fn job(n: usize, args: &[&str], trace: &Path) -> Job {
    mpirun_env(n, args, &[("ASAP_TRAIN_TRACE_EXAMPLES", s(trace))], 180).expect_ok()
}

/// Every example seen exactly once in each of the `epochs` epochs (tests/common).
fn assert_every_example_once(dir: &Path, epochs: u64, what: &str) {
    assert_each_example_once_per_epoch(dir, EXAMPLES, epochs, what);
}

/// The start line of a job's metrics file.
fn start_line(path: &Path) -> serde_json::Value {
    metrics(path).into_iter().find(|v| v["event"] == "start").expect("a start line")
}

/// The replicas (rows) of a checkpoint.
fn replicas(path: &Path) -> Vec<Vec<f32>> {
    let f = hdf5::File::open(path).unwrap();
    let a: ndarray::Array2<f32> = f.dataset("params").unwrap().read_2d().unwrap();
    a.rows().into_iter().map(|r| r.to_vec()).collect()
}

/// The documented rule's average: the f64 mean of the replicas, rounded once.
fn average(rows: &[Vec<f32>]) -> Vec<f32> {
    (0..rows[0].len()).map(|j| (rows.iter().map(|r| r[j] as f64).sum::<f64>() / rows.len() as f64) as f32).collect()
}

/// The only checkpoint of `ranks` ranks at `round` in `dir`.
fn checkpoint_by(dir: &Path, ranks: u64, round: u64) -> PathBuf {
    let suffix = format!("-{round:010}.h5");
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(&suffix))
        .filter(|p| hdf5::File::open(p).unwrap().attr("ranks").unwrap().read_scalar::<u64>().unwrap() == ranks)
        .collect();
    assert_eq!(found.len(), 1, "checkpoints of {ranks} ranks at round {round} in {}: {found:?}", dir.display());
    found[0].clone()
}

/// A scratch directory with its checkpoint directory and an empty trace directory.
fn scratch_with_trace(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = scratch(name);
    let (ck, trace) = (dir.join("ck"), dir.join("trace"));
    std::fs::create_dir_all(&trace).unwrap();
    (dir, ck, trace)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn read_model(p: &Path) -> Vec<f32> {
    hdf5::File::open(p).unwrap().dataset("params").unwrap().read_raw().unwrap()
}

/// allreduce: 4 ranks to round 70 (epoch 1, step 20 of 50), then 6 ranks for 10 steps of the
/// dealt rest, then 6 ranks again (a same-count resume inside the dealt epoch) to the end. Every
/// example once per epoch; the model bit-identical to a 6-rank resume of the same 4-rank
/// checkpoint run to the end without the stop; the start line names the resize.
#[test]
fn allreduce_resumes_4_ranks_on_6_with_every_example_once() {
    let (dir, ck, trace) = scratch_with_trace("elastic-allreduce");
    let sync = ["--sync", "allreduce"];
    job(4, &args(&sync, &ck, &["--max-rounds", "70"]), &trace.join("a"));
    let ck_direct = dir.join("ck-direct");
    copy_dir(&ck, &ck_direct);

    let m = dir.join("b.jsonl");
    let b = job(6, &args(&sync, &ck, &["--resume", "--max-rounds", "80", "--metrics", s(&m)]), &trace.join("b"));
    assert!(b.stderr.contains("resumed a 4-rank checkpoint on 6 ranks"), "{}", b.stderr);
    let resumed = &start_line(&m)["resumed"];
    assert_eq!((resumed["ranks_before"].as_u64(), resumed["ranks"].as_u64()), (Some(4), Some(6)), "{resumed}");
    assert_eq!(resumed["examples_dealt"].as_u64(), Some(30 * 50 * 4), "30 steps of 4 ranks were left of epoch 1: {resumed}");
    // The 6-rank checkpoint of round 80 records the dealt epoch.
    let f = hdf5::File::open(checkpoint_by(&ck, 6, 80)).unwrap();
    assert_eq!(f.dataset("dealt_ids").unwrap().size(), 6000);

    let stopped = dir.join("stopped.h5");
    let c = job(6, &args(&sync, &ck, &["--resume", "--save-model", s(&stopped)]), &trace.join("c"));
    assert!(!c.stderr.contains("resumed a"), "a same-count resume is no resize: {}", c.stderr);
    assert_every_example_once(&trace, 3, "4 -> 6 -> 6 ranks");

    let direct = dir.join("direct.h5");
    let trace_direct = dir.join("trace-direct");
    std::fs::create_dir_all(&trace_direct).unwrap();
    job(6, &args(&sync, &ck_direct, &["--resume", "--save-model", s(&direct)]), &trace_direct.join("d"));
    assert!(read_model(&stopped) == read_model(&direct), "a same-count resume inside the dealt epoch changed the model");
}

/// asap (ring): 4 ranks to round 70; a 6-rank resume stopped at once at round 70 writes 6
/// replicas that are each the average of the 4 (the rule); 2 ranks then train 10 steps of what
/// is left of epoch 1 and stop mid-epoch; 4 ranks finish. Every example once per epoch.
#[test]
fn asap_resumes_on_6_then_2_then_4_ranks_with_every_example_once() {
    let (_, ck, trace) = scratch_with_trace("elastic-asap");
    let sync = ["--sync", "asap", "--graph", "ring"];
    job(4, &args(&sync, &ck, &["--max-rounds", "70"]), &trace.join("a"));
    let old = replicas(&checkpoint_by(&ck, 4, 70));
    assert!(old.iter().any(|r| *r != old[0]), "asap's 4 replicas differ (else the rule is not tested)");

    job(6, &args(&sync, &ck, &["--resume", "--max-rounds", "70"]), &trace.join("z"));
    let new = replicas(&checkpoint_by(&ck, 6, 70));
    let avg = average(&old);
    assert_eq!(new.len(), 6);
    for (q, r) in new.iter().enumerate() {
        assert!(*r == avg, "new rank {q}'s replica is not the average of the 4 old ones");
    }
    // Move the 4-rank checkpoint aside, so the next resume continues the 6-rank one.
    std::fs::remove_file(checkpoint_by(&ck, 4, 70)).unwrap();

    let b = job(2, &args(&sync, &ck, &["--resume", "--max-rounds", "90"]), &trace.join("b"));
    assert!(b.stderr.contains("resumed a 6-rank checkpoint on 2 ranks"), "{}", b.stderr);
    let c = job(4, &args(&sync, &ck, &["--resume"]), &trace.join("c"));
    assert!(c.stderr.contains("resumed a 2-rank checkpoint on 4 ranks"), "{}", c.stderr);
    assert_every_example_once(&trace, 3, "asap 4 -> 6 -> 2 -> 4 ranks");
}

/// none, 2 ranks to round 150 (epoch 1, step 50 of 100), then 4 ranks by --auto-resume: every
/// example once.
#[test]
fn independent_replicas_resume_2_ranks_on_4_with_every_example_once() {
    let (_, ck, trace) = scratch_with_trace("elastic-none");
    let sync = ["--sync", "none"];
    // --auto-resume, as slurm/asap-train.sbatch runs a requeued job: a fresh start at first,
    // then the 2-rank checkpoint found at 4 ranks.
    job(2, &args(&sync, &ck, &["--auto-resume", "--max-rounds", "150"]), &trace.join("a"));
    let b = job(4, &args(&sync, &ck, &["--auto-resume"]), &trace.join("b"));
    assert!(b.stderr.contains("resumed a 2-rank checkpoint on 4 ranks"), "{}", b.stderr);
    assert_every_example_once(&trace, 3, "none 2 -> 4 ranks");
}

/// How often each example id was seen in each epoch by each rank of the job whose traces are
/// `dir/PREFIX.rank<r>`, for each prefix of `prefixes` (summed over them): rank -> epoch -> id -> times.
type PerRank = Vec<std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, u32>>>;
fn seen_per_rank(dir: &Path, prefixes: &[&str], ranks: usize) -> PerRank {
    let mut out: PerRank = vec![Default::default(); ranks];
    for (r, seen) in out.iter_mut().enumerate() {
        for prefix in prefixes {
            let text = std::fs::read_to_string(dir.join(format!("{prefix}.rank{r}"))).unwrap_or_default();
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let (epoch, id) = line.split_once(' ').unwrap();
                *seen.entry(epoch.parse().unwrap()).or_default().entry(id.parse().unwrap()).or_default() += 1;
            }
        }
    }
    out
}

/// The ranks' counts of one epoch summed: id -> times.
fn epoch_of(per_rank: &PerRank, epoch: u64) -> std::collections::BTreeMap<u64, u32> {
    let mut all = std::collections::BTreeMap::new();
    for rank in per_rank {
        for (&id, &k) in rank.get(&epoch).into_iter().flatten() {
            *all.entry(id).or_default() += k;
        }
    }
    all
}

/// A label-skewed (`partition`) allreduce job's options on t10k: `args`' with it.
fn skewed_args<'a>(partition: &'a str, ck: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    args(&["--sync", "allreduce", "--partition", partition], ck, extra)
}

/// A label-skewed run (`partition`) checkpointed by 4 ranks at round 70 (epoch 1, step 20 of 50)
/// and resumed on `m` ranks, checked against independent oracles from the traces:
/// - the uninterrupted 4-rank run's trace is the plan: its epoch 1 (with the repeats of the
///   shards that cycle) is, example by example and count by count, the interrupted run's epoch 1
///   before the checkpoint plus the resumed run's after it;
/// - the shards of a fresh `m`-rank run, read from its trace with one mini-batch as large as the
///   data (each rank steps once on its whole shard): each resumed rank's examples in the
///   interrupted epoch and the next are its own shard's, and its next epoch is one of a fresh
///   `m`-rank run: ceil(floor(10000 / m) / 50) steps of 50 over the shard, passes of ceil(n / 50)
///   steps, so every example of the shard seen floor(steps / pass) or one more times, and
///   `full x n + min(n, rest x 50)` examples in all.
///
/// `stop`: where the resumed run is stopped and continued again at `m` ranks (a same-count resume
/// inside the dealt epoch), whose model must then be bit-identical to a resume not stopped.
fn label_skewed_resize(name: &str, partition: &str, m: usize, stop: Option<&str>) {
    let (dir, ck, trace) = scratch_with_trace(name);
    let full_trace = dir.join("full");
    std::fs::create_dir_all(&full_trace).unwrap();
    job(4, &skewed_args(partition, &dir.join("ck-full"), &[]), &full_trace.join("u"));
    job(4, &skewed_args(partition, &ck, &["--max-rounds", "70"]), &trace.join("a"));
    let ck_direct = dir.join("ck-direct");
    copy_dir(&ck, &ck_direct);
    let mut resumed = vec!["b"];
    let end = dir.join("end.h5");
    match stop {
        None => {
            let b = job(m, &skewed_args(partition, &ck, &["--resume", "--save-model", s(&end)]), &trace.join("b"));
            assert!(b.stderr.contains(&format!("resumed a 4-rank checkpoint on {m} ranks")), "{}", b.stderr);
        }
        Some(round) => {
            let b = job(m, &skewed_args(partition, &ck, &["--resume", "--max-rounds", round]), &trace.join("b"));
            assert!(b.stderr.contains(&format!("resumed a 4-rank checkpoint on {m} ranks")), "{}", b.stderr);
            let c = job(m, &skewed_args(partition, &ck, &["--resume", "--save-model", s(&end)]), &trace.join("c"));
            assert!(!c.stderr.contains("resumed a"), "a same-count resume is no resize: {}", c.stderr);
            resumed.push("c");
            let direct = dir.join("direct.h5");
            let trace_direct = dir.join("trace-direct");
            std::fs::create_dir_all(&trace_direct).unwrap();
            job(m, &skewed_args(partition, &ck_direct, &["--resume", "--save-model", s(&direct)]), &trace_direct.join("d"));
            assert!(read_model(&end) == read_model(&direct), "a same-count resume inside the dealt epoch changed the model");
        }
    }

    let full = seen_per_rank(&full_trace, &["u"], 4);
    let before = seen_per_rank(&trace, &["a"], 4);
    let after = seen_per_rank(&trace, &resumed, m);
    let planned = epoch_of(&full, 1);
    assert!(planned.values().any(|&k| k > 1), "{partition}: some shard cycles in an epoch (else the repeats are not tested)");
    assert!(planned.len() < EXAMPLES as usize, "{partition}: some shard is cut in an epoch (else the cut is not tested)");
    assert_eq!(epoch_of(&before, 0), epoch_of(&full, 0), "{partition}: epoch 0 before the checkpoint is the plan's");
    let mut seen = epoch_of(&before, 1);
    let split = seen.values().sum::<u32>();
    for (id, k) in epoch_of(&after, 1) {
        *seen.entry(id).or_default() += k;
    }
    assert!(split > 0 && seen.values().sum::<u32>() > split, "{partition}: the checkpoint is inside epoch 1");
    assert!(seen == planned, "{partition} 4 -> {m}: epoch 1 is not the uninterrupted run's plan, each planned occurrence once");

    // A fresh m-rank run's shards: one step of a mini-batch larger than any shard.
    let shard_trace = dir.join("shards");
    std::fs::create_dir_all(&shard_trace).unwrap();
    let shards_ck = dir.join("ck-shards");
    let one_step = [
        "train",
        "--data",
        DATA,
        "--epochs",
        "1",
        "--batch-size",
        "10000",
        "--seed",
        "11",
        "--lr",
        "0.05",
        "--sync",
        "allreduce",
        "--partition",
        partition,
        "--checkpoint-dir",
        s(&shards_ck),
    ];
    job(m, &one_step, &shard_trace.join("s"));
    let shards: Vec<std::collections::BTreeMap<u64, u32>> = seen_per_rank(&shard_trace, &["s"], m).iter().map(|r| r[&0].clone()).collect();
    assert_eq!(shards.iter().map(|s| s.len()).sum::<usize>() as u64, EXAMPLES, "the {m} shards cover the data");
    assert!(shards.iter().all(|s| s.values().all(|&k| k == 1)), "one step, each shard once");
    let steps = (EXAMPLES as usize / m).div_ceil(50);
    for (q, shard) in shards.iter().enumerate() {
        for epoch in [1, 2] {
            let outside: Vec<&u64> =
                after[q].get(&epoch).into_iter().flatten().map(|(id, _)| id).filter(|id| !shard.contains_key(id)).take(3).collect();
            assert!(
                outside.is_empty(),
                "{partition} 4 -> {m}: new rank {q} saw examples of other ranks' shards in epoch {epoch}: {outside:?}"
            );
        }
        let n = shard.len();
        let pass = n.div_ceil(50);
        let (times, rest) = (steps / pass, steps % pass);
        let next = &after[q][&2];
        let total: u32 = next.values().sum();
        assert_eq!(total as usize, times * n + n.min(rest * 50), "{partition} 4 -> {m}: new rank {q}'s epoch 2 over its shard of {n}");
        let most = times + usize::from(rest > 0);
        assert!(
            shard.keys().all(|id| (times..=most).contains(&(next.get(id).copied().unwrap_or(0) as usize))),
            "{partition} 4 -> {m}: new rank {q} saw each example of its shard {times} to {most} times in epoch 2"
        );
    }
}

/// dirichlet:0.5 (shards of very unequal size: small ones cycle, large ones are cut), 4 ranks on 2.
#[test]
fn a_label_skewed_run_resumes_4_ranks_on_2_with_the_planned_examples() {
    label_skewed_resize("elastic-skewed-2", "dirichlet:0.5", 2, None);
}

/// dirichlet:0.5, 4 ranks on 6, stopped 10 steps into the dealt rest and resumed at 6 again.
#[test]
fn a_label_skewed_run_resumes_4_ranks_on_6_with_the_planned_examples() {
    label_skewed_resize("elastic-skewed-6", "dirichlet:0.5", 6, Some("80"));
}

/// The other replica modes and asap's variants resize too (4 ranks to round 70, then 2 to the
/// end), each seeing every example once per epoch: their per-edge state starts afresh from the
/// average (push-sum's weights, CHOCO's copies, gaia's residual), the outer velocity is averaged.
#[test]
fn gaia_and_asap_variants_resume_4_ranks_on_2_with_every_example_once() {
    let variants: [&[&str]; 4] = [
        // --dc-staleness 0: at the default 2, main's gaia sometimes never delivers the other
        // group's updates (tests/outputs.rs says the same); a fresh 4-rank run hung here once.
        &["--sync", "gaia", "--groups", "2", "--dc-staleness", "0"],
        &["--sync", "asap", "--notify", "push-sum"],
        &["--sync", "asap", "--graph", "ring", "--compress", "int8"],
        &["--sync", "allreduce", "--outer-optimizer", "nesterov", "--inner-optimizer", "momentum"],
    ];
    for (i, sync) in variants.iter().enumerate() {
        let (_, ck, trace) = scratch_with_trace(&format!("elastic-variant-{i}"));
        job(4, &args(sync, &ck, &["--max-rounds", "70"]), &trace.join("a"));
        let b = job(2, &args(sync, &ck, &["--resume"]), &trace.join("b"));
        assert!(b.stderr.contains("resumed a 4-rank checkpoint on 2 ranks"), "{sync:?}: {}", b.stderr);
        assert_every_example_once(&trace, 3, &format!("{sync:?} 4 -> 2 ranks"));
    }
}

/// The rule for the state beside the replicas, read from the checkpoints of a resume stopped at
/// its own round (asap with a Nesterov outer step and a momentum inner step, 4 ranks on 6): each
/// new rank's outer velocity and momentum are the mean of the old ranks' (f64 mean, kept as f32),
/// its outer anchor the old anchors' mean, its replica the old replicas' mean.
#[test]
fn a_resize_averages_the_outer_velocity_and_the_momentum() {
    let (_, ck, trace) = scratch_with_trace("elastic-state");
    let sync = ["--sync", "asap", "--graph", "ring", "--outer-optimizer", "nesterov", "--inner-optimizer", "momentum"];
    job(4, &args(&sync, &ck, &["--max-rounds", "70"]), &trace.join("a"));
    job(6, &args(&sync, &ck, &["--resume", "--max-rounds", "70"]), &trace.join("b"));
    let (old, new) = (checkpoint_by(&ck, 4, 70), checkpoint_by(&ck, 6, 70));
    let state = |path: &Path, rank: usize, name: &str| -> Vec<f64> {
        let f = hdf5::File::open(path).unwrap();
        f.dataset(&format!("sync/rank{rank}/{name}")).unwrap().read_raw().unwrap()
    };
    for name in ["outer_velocity", "momentum_velocity", "outer_anchor"] {
        let olds: Vec<Vec<f64>> = (0..4).map(|r| state(&old, r, name)).collect();
        assert!(olds.iter().any(|v| *v != olds[0]), "{name}: the old ranks' values differ (else the rule is not tested)");
        let mean: Vec<f64> = (0..olds[0].len()).map(|j| (olds.iter().map(|v| v[j]).sum::<f64>() / 4.0) as f32 as f64).collect();
        for q in 0..6 {
            assert!(state(&new, q, name) == mean, "{name} of new rank {q} is not the mean of the 4 old ranks'");
        }
    }
    let avg = average(&replicas(&old));
    assert!(replicas(&new).iter().all(|r| *r == avg), "the new replicas are the old ones' average");
}

/// async (the fully asynchronous barrier): at a checkpoint's cut every worker holds the
/// coordinator's model, so the replicas' average is that model; a resume on 6 ranks stopped at
/// its own round keeps the coordinator's model, version and uniform clocks; 6 ranks then finish,
/// every example once per epoch.
#[test]
fn async_resumes_4_ranks_on_6_from_the_coordinators_model() {
    let (_, ck, trace) = scratch_with_trace("elastic-async");
    let sync = ["--sync", "async"];
    job(4, &args(&sync, &ck, &["--max-rounds", "70"]), &trace.join("a"));
    job(6, &args(&sync, &ck, &["--resume", "--max-rounds", "70"]), &trace.join("z"));
    let (old, new) = (checkpoint_by(&ck, 4, 70), checkpoint_by(&ck, 6, 70));
    let state = |path: &Path, name: &str| -> Vec<f64> {
        hdf5::File::open(path).unwrap().dataset(&format!("sync/rank0/{name}")).unwrap().read_raw().unwrap()
    };
    let model: Vec<f32> = state(&old, "model").iter().map(|&x| x as f32).collect();
    assert!(replicas(&old).iter().all(|r| *r == model), "at the cut every worker holds the coordinator's model");
    assert!(replicas(&new).iter().all(|r| *r == model), "the new replicas are the coordinator's model");
    assert_eq!(state(&new, "model"), state(&old, "model"));
    assert_eq!(state(&new, "version"), state(&old, "version"));
    assert_eq!(state(&new, "clock"), vec![70.0; 6], "every new worker at the cut's clock");
    job(6, &args(&sync, &ck, &["--resume"]), &trace.join("b"));
    assert_every_example_once(&trace, 3, "async 4 -> 6 ranks");
}

/// async with SAGA (least squares): a resize moves each example's stored slope with the
/// example. Every old rank's `saga_slope` (shards are contiguous rows, in rank order, without a
/// held-out split) laid end to end is, value for value, every new rank's laid end to end; the
/// coordinator's mean of them is kept; the run then finishes, every example once per epoch.
#[test]
fn async_saga_history_follows_its_examples_at_a_resize() {
    let (_, ck, trace) = scratch_with_trace("elastic-saga");
    let sync = ["--sync", "async", "--barrier", "bsp", "--model", "lsq", "--label-threshold", "5", "--optimizer", "saga", "--lr", "0.01"];
    job(4, &args(&sync, &ck, &["--max-rounds", "70"]), &trace.join("a"));
    job(6, &args(&sync, &ck, &["--resume", "--max-rounds", "70"]), &trace.join("z"));
    let (old, new) = (checkpoint_by(&ck, 4, 70), checkpoint_by(&ck, 6, 70));
    let state = |path: &Path, rank: usize, name: &str| -> Vec<f64> {
        hdf5::File::open(path).unwrap().dataset(&format!("sync/rank{rank}/{name}")).unwrap().read_raw().unwrap()
    };
    let laid = |path: &Path, ranks: usize| -> Vec<f64> { (0..ranks).flat_map(|r| state(path, r, "saga_slope")).collect() };
    let before = laid(&old, 4);
    assert_eq!(before.len() as u64, EXAMPLES);
    assert!(before.iter().filter(|&&x| x != 0.0).count() > 5000, "most examples have a stored slope");
    assert!(laid(&new, 6) == before, "the slopes moved with their examples");
    assert_eq!(state(&new, 0, "history_mean"), state(&old, 0, "history_mean"));
    job(6, &args(&sync, &ck, &["--resume"]), &trace.join("b"));
    assert_every_example_once(&trace, 3, "async saga 4 -> 6 ranks");
}

/// Rank `rank`'s mode-state entry `name` in checkpoint `path`, or None where it has none.
fn rank_state(path: &Path, rank: usize, name: &str) -> Option<Vec<f64>> {
    hdf5::File::open(path).unwrap().dataset(&format!("sync/rank{rank}/{name}")).ok().map(|d| d.read_raw().unwrap())
}

/// The entry `name` of every one of `ranks` ranks that holds one, laid end to end in rank order
/// (the parameter servers' shards are contiguous rows in rank order), with each part's length.
fn laid(path: &Path, ranks: usize, name: &str) -> (Vec<f64>, Vec<usize>) {
    let parts: Vec<Vec<f64>> = (0..ranks).filter_map(|r| rank_state(path, r, name)).collect();
    (parts.concat(), parts.iter().map(|p| p.len()).collect())
}

/// MLR on Fashion-MNIST: 10 rows (classes) of 785 parameters.
const ROW: usize = 785;

/// ssp (S = 2, DynSGD): 4 ranks to round 70; a 6-rank resume stopped at once at round 70 holds
/// the 4 servers' model row for row in its 6 shards, each of whole rows, and every new replica
/// is that model (the servers' model is the truth, the caches are re-read); every new worker is
/// at clock 70 on every shard and DynSGD's versions are closed at the old count of versions. 6
/// ranks then finish, every example once per epoch.
#[test]
fn ssp_resumes_4_ranks_on_6_from_the_servers_model_re_partitioned_by_row() {
    let (_, ck, trace) = scratch_with_trace("elastic-ssp");
    let sync = ["--sync", "ssp", "--staleness", "2"];
    job(4, &args(&sync, &ck, &["--max-rounds", "70"]), &trace.join("a"));
    let z = job(6, &args(&sync, &ck, &["--resume", "--max-rounds", "70"]), &trace.join("z"));
    assert!(
        z.stderr.contains("resumed a 4-rank checkpoint on 6 ranks: every rank starts from the parameter servers' model"),
        "{}",
        z.stderr
    );
    let (old, new) = (checkpoint_by(&ck, 4, 70), checkpoint_by(&ck, 6, 70));
    let (model, old_parts) = laid(&old, 4, "shard_rows");
    let (resharded, new_parts) = laid(&new, 6, "shard_rows");
    assert_eq!(model.len(), 10 * ROW);
    assert_eq!((old_parts.len(), new_parts.len()), (4, 6), "every rank serves rows at 4 and at 6 ranks");
    assert!(new_parts.iter().all(|&l| l > 0 && l % ROW == 0), "each new shard holds whole rows: {new_parts:?}");
    assert!(resharded == model, "the 6 shards laid end to end are the 4 old ones' model, row for row");
    let model32: Vec<f32> = model.iter().map(|&x| x as f32).collect();
    assert!(replicas(&new).iter().all(|r| *r == model32), "every new replica is the servers' model");
    let cmax = rank_state(&old, 0, "dyn_cmax").unwrap();
    assert_eq!(cmax, vec![70.0], "DynSGD counted a version per clock");
    for q in 0..6 {
        assert_eq!(rank_state(&new, q, "shard_completed").unwrap(), vec![70.0; 6], "new rank {q}'s shard has every worker at clock 70");
        assert_eq!(rank_state(&new, q, "dyn_version").unwrap(), vec![70.0; 6], "new rank {q}: every worker's next update is of version 70");
        assert_eq!(rank_state(&new, q, "dyn_live").unwrap(), Vec::<f64>::new(), "new rank {q}: no version is left open");
        assert_eq!(rank_state(&new, q, "dyn_stamp").unwrap(), vec![71.0; 6], "new rank {q}'s client read version 70 of every shard");
    }
    // Move the 4-rank checkpoint aside, so the next resume continues the 6-rank one.
    std::fs::remove_file(&old).unwrap();
    job(6, &args(&sync, &ck, &["--resume"]), &trace.join("b"));
    assert_every_example_once(&trace, 3, "ssp 4 -> 6 ranks");
}

/// bosen with AdaRevision (S = 1): 4 ranks to round 70; a 2-rank resume stopped at once at round
/// 70: AdaRevision's accumulated gradient and row versions laid end to end are the 4 old servers',
/// its denominators theirs with their growth since 1 halved (2 workers of 4), so each row's
/// state followed it to its new server (whose shard, of whole rows,
/// holds as many parameters as those rows); every client holds every row's current version, every
/// worker holds nothing older, and each row with a version keeps one snapshot, its accumulated
/// gradient. 2 ranks then finish, every example once per epoch.
#[test]
fn bosen_adarevision_state_follows_its_rows_from_4_ranks_to_2() {
    let (_, ck, trace) = scratch_with_trace("elastic-bosen");
    let sync = ["--sync", "bosen", "--bandwidth-mbps", "100", "--lr-schedule", "adarevision", "--staleness", "1"];
    job(4, &args(&sync, &ck, &["--max-rounds", "70"]), &trace.join("a"));
    let z = job(2, &args(&sync, &ck, &["--resume", "--max-rounds", "70"]), &trace.join("z"));
    assert!(z.stderr.contains("resumed a 4-rank checkpoint on 2 ranks"), "{}", z.stderr);
    let (old, new) = (checkpoint_by(&ck, 4, 70), checkpoint_by(&ck, 2, 70));
    let (model, _) = laid(&old, 4, "shard_rows");
    assert!(laid(&new, 2, "shard_rows").0 == model, "the 2 shards are the 4 old ones' model, row for row");
    let (version, _) = laid(&old, 4, "ada_version");
    assert_eq!(version.len(), 10);
    assert!(version.iter().all(|&v| v > 0.0), "every row was updated (else its state is not tested): {version:?}");
    for name in ["ada_g_sum", "ada_version"] {
        assert!(laid(&new, 2, name).0 == laid(&old, 4, name).0, "{name} followed its rows");
    }
    // The denominators followed their rows, their growth since 1 scaled to 2 workers of 4.
    for name in ["ada_z", "ada_z_max"] {
        // The servers hold f32: the rescaled value rounded once.
        let want: Vec<f64> = laid(&old, 4, name).0.iter().map(|z| (1.0 + (z - 1.0) * 2.0 / 4.0) as f32 as f64).collect();
        assert!(laid(&new, 2, name).0 == want, "{name} followed its rows, rescaled");
        assert!(laid(&old, 4, name).0.iter().any(|&z| z > 1.0), "{name} grew (else the rescaling is not tested)");
    }
    for q in 0..2 {
        let rows = rank_state(&new, q, "shard_rows").unwrap().len();
        let own = rank_state(&new, q, "ada_version").unwrap();
        assert_eq!((rows, rank_state(&new, q, "ada_g_sum").unwrap().len()), (own.len() * ROW, own.len() * ROW), "new rank {q}: whole rows");
        assert!(rank_state(&new, q, "held_version").unwrap() == version, "new rank {q}'s client holds every row's current version");
        assert_eq!(rank_state(&new, q, "ada_held_lo").unwrap(), [own.clone(), own.clone()].concat(), "new rank {q}: no worker holds older");
        let keys: Vec<f64> = own.iter().enumerate().flat_map(|(r, &v)| [r as f64, v]).collect();
        assert_eq!(rank_state(&new, q, "ada_snapshot_keys").unwrap(), keys, "new rank {q}: one snapshot per row, of its version");
        assert!(
            rank_state(&new, q, "ada_snapshots").unwrap() == rank_state(&new, q, "ada_g_sum").unwrap(),
            "snapshots are the rows' g_sum"
        );
    }
    std::fs::remove_file(&old).unwrap();
    job(2, &args(&sync, &ck, &["--resume"]), &trace.join("b"));
    assert_every_example_once(&trace, 3, "bosen 4 -> 2 ranks");
}

/// ssp at S = 0 (deterministic: a shard applies each clock in worker order): 4 ranks to round 70,
/// 6 ranks for 10 clocks of the dealt rest, then 6 ranks again to the end; the model is
/// bit-identical to a 6-rank resume of the same 4-rank checkpoint run to the end without the
/// stop: a same-count resume of a re-partitioned checkpoint continues it exactly.
#[test]
fn ssp_same_count_resume_after_a_resize_is_bit_identical() {
    let (dir, ck, trace) = scratch_with_trace("elastic-ssp-same");
    let sync = ["--sync", "ssp", "--staleness", "0"];
    job(4, &args(&sync, &ck, &["--max-rounds", "70"]), &trace.join("a"));
    let ck_direct = dir.join("ck-direct");
    copy_dir(&ck, &ck_direct);
    job(6, &args(&sync, &ck, &["--resume", "--max-rounds", "80"]), &trace.join("b"));
    let stopped = dir.join("stopped.h5");
    let c = job(6, &args(&sync, &ck, &["--resume", "--save-model", s(&stopped)]), &trace.join("c"));
    assert!(!c.stderr.contains("resumed a"), "a same-count resume is no resize: {}", c.stderr);
    assert_every_example_once(&trace, 3, "ssp 4 -> 6 -> 6 ranks");
    let direct = dir.join("direct.h5");
    let trace_direct = dir.join("trace-direct");
    std::fs::create_dir_all(&trace_direct).unwrap();
    job(6, &args(&sync, &ck_direct, &["--resume", "--save-model", s(&direct)]), &trace_direct.join("d"));
    assert!(read_model(&stopped) == read_model(&direct), "a same-count resume after the resize changed the model");
}
