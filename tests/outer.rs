//! The outer optimizer (`--outer-optimizer`, DiLoCo and NoLoCo) under real `mpirun`: sgd with step
//! 1 is the mode without one, model for model; a checkpoint holds the outer state and a resumed
//! run ends bit-identical to the uninterrupted one, under allreduce (DiLoCo) and asap (NoLoCo);
//! the options are refused where they do not apply.

mod common;
use common::*;

fn t10k() -> String {
    format!("{FASHION}/t10k-images-idx3-ubyte.gz")
}

fn read_model(p: &std::path::Path) -> Vec<u32> {
    let v: Vec<f32> = hdf5::File::open(p).unwrap().dataset("params").unwrap().read_raw().unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

/// 10,000 examples on 4 ranks, batch 64: 39 steps an epoch, 9 rounds of 4 steps.
fn base(sync: &[&str]) -> Vec<String> {
    let common = ["train", "--data", &t10k(), "--epochs", "2", "--batch-size", "64", "--seed", "5", "--sync-every", "4"];
    common.iter().chain(sync).map(|s| s.to_string()).collect()
}

fn train(args: &[String], extra: &[&str]) -> Job {
    let argv: Vec<&str> = args.iter().map(String::as_str).chain(extra.iter().copied()).collect();
    mpirun(4, &argv, 180)
}

/// `x = average + (1 - lr) d` with lr 1 and no momentum is the average, so the saved models are
/// the same bits (NOTIFY-ACK on a ring is deterministic, as allreduce is, and gaia whose two
/// groups meet every clock).
#[test]
fn sgd_with_step_one_is_the_mode_without_an_outer_optimizer() {
    let dir = scratch("outer-sgd-one");
    let modes = [
        ("allreduce", &["--sync", "allreduce"][..]),
        ("asap", &["--sync", "asap", "--graph", "ring"][..]),
        ("gaia", &["--sync", "gaia", "--groups", "2", "--dc-staleness", "0"][..]),
    ];
    for (name, sync) in modes {
        let (plain, outer) = (dir.join(format!("{name}-none.h5")), dir.join(format!("{name}-sgd.h5")));
        train(&base(sync), &["--save-model", s(&plain)]).expect_ok();
        let m = dir.join(format!("{name}.jsonl"));
        train(&base(sync), &["--outer-optimizer", "sgd", "--outer-lr", "1", "--save-model", s(&outer), "--metrics", s(&m)]).expect_ok();
        assert!(read_model(&plain) == read_model(&outer), "{name}: sgd with --outer-lr 1 changed the model");
        let start = metrics(&m).into_iter().find(|e| e["event"] == "start").expect("a start line");
        assert_eq!(start["sync_info"]["outer"]["optimizer"], "sgd", "{start}");
    }
}

/// The anchor and the velocity are each rank's own state: the checkpoint holds them, and the run
/// resumed from it ends with the uninterrupted run's model, bit for bit. A nesterov run moves the
/// model off the plain average (the outer step is not a no-op).
#[test]
fn nesterov_resumes_bit_identically_with_its_outer_state() {
    let dir = scratch("outer-resume");
    for (name, sync) in [("diloco", &["--sync", "allreduce"][..]), ("noloco", &["--sync", "asap", "--graph", "ring"][..])] {
        let mut args = base(sync);
        args.extend(["--outer-optimizer", "nesterov", "--outer-lr", "0.7", "--outer-momentum", "0.9"].map(String::from));
        let (full, ck, resumed) = full_and_resumed_at_round_10(&dir, name, |extra| train(&args, extra));
        let round10 = checkpoint_of_round(&ck, 10);
        let f = hdf5::File::open(round10).unwrap();
        for rank in 0..4 {
            let g = f.group(&format!("sync/rank{rank}")).unwrap();
            for state in ["outer_anchor", "outer_velocity"] {
                assert!(g.dataset(state).is_ok(), "{name}: rank {rank}'s checkpoint lacks {state}");
            }
        }
        assert!(read_model(&full) == read_model(&resumed), "{name}: the resumed model differs from the uninterrupted one");
        let plain = dir.join(format!("{name}-plain.h5"));
        train(&base(sync), &["--save-model", s(&plain)]).expect_ok();
        assert!(read_model(&plain) != read_model(&full), "{name}: the outer step changed nothing");
    }
}

#[test]
fn outer_options_are_refused_where_they_do_not_apply() {
    let data = t10k();
    let cases: [(&[&str], &str); 6] = [
        (&["--sync", "ssp", "--outer-optimizer", "nesterov"], "--outer-optimizer applies to --sync allreduce"),
        (&["--sync", "allreduce", "--outer-optimizer", "sgd", "--outer-momentum", "0.5"], "--outer-momentum applies to"),
        (&["--sync", "allreduce", "--outer-lr", "0.5"], "--outer-lr applies to"),
        (&["--sync", "allreduce", "--outer-optimizer", "nesterov", "--outer-momentum", "1"], "--outer-momentum"),
        (&["--sync", "allreduce", "--outer-optimizer", "nesterov", "--outer-pseudo-gradient", "own"], "--outer-pseudo-gradient applies to"),
        (&["--sync", "asap", "--outer-pseudo-gradient", "neighbourhood"], "--outer-pseudo-gradient applies to"),
    ];
    for (extra, needle) in cases {
        let mut argv = vec!["train", "--data", &data, "--epochs", "1"];
        argv.extend(extra);
        mpirun(2, &argv, 60).expect_failure(&[needle]);
    }
    // A corpus in UCI bag-of-words form: documents, words, entries, then "doc word count" lines.
    let corpus = write(&scratch("outer-lda"), "docword.txt", "4\n3\n4\n1 1 2\n2 2 1\n3 3 4\n4 1 1\n");
    let lda = ["train", "--model", "lda", "--topics", "2", "--data", &corpus, "--outer-optimizer", "nesterov"];
    mpirun(2, &lda, 60).expect_failure(&["--model lda sums count deltas"]);
}

/// Under gossip the outer step is each rank's own, taken before the exchange
/// (src/sync/outer.rs): without inner steps (`--consensus-only`, every rank from its own random
/// model) nesterov is plain gossip. One period of the one-peer exponential graph (2 rounds on 4
/// ranks) then averages exactly, and the model is the starting replicas' mean (`--sync none`'s
/// final model). A step on the neighbourhood's average instead puts the replicas' differences
/// into the momentum: they overshoot the average and still differ after a period (that form
/// diverged at 64 ranks: docs/low-communication.md).
#[test]
fn under_gossip_the_outer_step_leaves_the_replicas_differences_to_plain_averaging() {
    let dir = scratch("outer-consensus");
    let every = ["--consensus-only", "--eval-every", "1"];
    let (start, none_m) = (dir.join("start.h5"), dir.join("start.jsonl"));
    train(&base(&["--sync", "none"]), &[&every[..], &["--save-model", s(&start), "--metrics", s(&none_m)]].concat()).expect_ok();
    let (model, m) = (dir.join("noloco.h5"), dir.join("noloco.jsonl"));
    let noloco = ["--sync", "asap", "--graph", "one-peer-exponential", "--outer-optimizer", "nesterov"];
    train(&base(&noloco), &[&every[..], &["--save-model", s(&model), "--metrics", s(&m)]].concat()).expect_ok();
    let distance = |m: &std::path::Path, round: u64| -> f64 {
        let e = metrics(m).into_iter().find(|e| e["event"] == "eval" && e["round"] == round).expect("an evaluation of that round");
        e["consensus_distance"].as_f64().unwrap()
    };
    let apart = distance(&none_m, 1);
    assert!(apart > 1.0, "the replicas start apart: {apart}");
    for round in 2..=18 {
        let d = distance(&m, round);
        assert!(d < 1e-5 * apart, "round {round}: the replicas' distance is {d}, from {apart}");
    }
    let bits = |p: &std::path::Path| -> Vec<f32> { hdf5::File::open(p).unwrap().dataset("params").unwrap().read_raw().unwrap() };
    let worst = bits(&start).iter().zip(bits(&model)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "the mean moved by {worst}");
    // `--outer-pseudo-gradient neighbourhood` steps on the neighbourhood's average: the replicas
    // overshoot it (1.33 times their distance to it), so one period leaves them apart (0.61 of the
    // starting distance, measured).
    let near = dir.join("near.jsonl");
    let args = base(&[&noloco[..], &["--outer-pseudo-gradient", "neighbourhood"]].concat());
    train(&args, &[&every[..], &["--metrics", s(&near)]].concat()).expect_ok();
    let d = distance(&near, 2);
    assert!(d > 0.1 * apart, "round 2: the replicas' distance is {d}, from {apart}");
}
