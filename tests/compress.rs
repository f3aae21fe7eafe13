//! `--compress` (int8, fp16 and top-k) under real `mpirun`:
//! - with `--sync allreduce` (error feedback): the byte counters are the encoded sizes (an oracle
//!   computed here from the chunking, not read from the code), the replicas agree, a resume is
//!   bit-identical with the residuals;
//! - with `--sync asap` (CHOCO's public copies, on the undirected hypercube and on the one-peer
//!   exponential graph with a copy per edge): the replicas' mean is kept (against `--sync none`,
//!   which averages the untouched starting replicas) while they come to agree, the byte counters
//!   are the encoded sizes of the messages, and a resume is bit-identical with the copies, under
//!   NoLoCo's outer step too;
//! - the option is refused where it does not apply, and asap's variants that do not deliver
//!   every message once are refused with it.

mod common;
use common::*;

fn t10k() -> String {
    format!("{FASHION}/t10k-images-idx3-ubyte.gz")
}

fn read_model(p: &std::path::Path) -> Vec<u32> {
    read_values(p).into_iter().map(f32::to_bits).collect()
}

fn read_values(p: &std::path::Path) -> Vec<f32> {
    hdf5::File::open(p).unwrap().dataset("params").unwrap().read_raw().unwrap()
}

/// The default model, multinomial logistic regression on 784 pixels and 10 classes.
const N_PARAMS: usize = 7850;

/// 10,000 examples on 4 ranks, batch 64: 39 steps an epoch, 9 rounds of 4 steps.
fn base(extra: &[&str]) -> Vec<String> {
    let common =
        ["train", "--data", &t10k(), "--epochs", "2", "--batch-size", "64", "--seed", "5", "--sync-every", "4", "--sync", "allreduce"];
    common.iter().chain(extra).map(|s| s.to_string()).collect()
}

fn train(args: &[String], extra: &[&str]) -> Job {
    let argv: Vec<&str> = args.iter().map(String::as_str).chain(extra.iter().copied()).collect();
    mpirun(4, &argv, 180)
}

/// Bytes of one encoded chunk of `len` values, from the formats' definitions: int8 is a 4-byte
/// scale per `block` values and a byte per value; fp16 is 2 bytes a value; top-k is k = ceil(fraction len) (index u32,
/// value f32) pairs, or the chunk dense (4 bytes a value) when that is shorter.
fn encoded(codec: &str, len: usize) -> f64 {
    match codec.split_once(':') {
        Some(("topk", f)) => {
            let k = (f.parse::<f64>().unwrap() * len as f64).ceil().max(1.0) as usize;
            (8 * k).min(4 * len) as f64
        }
        None if codec == "fp16" => (2 * len) as f64,
        _ => (len + 4 * len.div_ceil(256)) as f64,
    }
}

/// Per sync, the mean over ranks of what a rank sends: to each other rank its contribution to
/// that rank's chunk (step 1), and its own chunk's encoded mean to each other rank (step 2), so
/// 2 (N-1)/N times the encoded chunks together.
fn bytes_per_sync(codec: &str, ranks: usize) -> f64 {
    let chunks: f64 = (0..ranks).map(|j| encoded(codec, (j + 1) * N_PARAMS / ranks - j * N_PARAMS / ranks)).sum();
    2.0 * (ranks - 1) as f64 / ranks as f64 * chunks
}

#[test]
fn bytes_are_the_encoded_sizes_and_fewer_than_the_ring() {
    let dir = scratch("compress-bytes");
    let plain = dir.join("plain.jsonl");
    train(&base(&[]), &["--metrics", s(&plain)]).expect_ok();
    let ring = summary(&plain)["counters"]["bytes_sent"]["mean"].as_f64().unwrap();
    for (codec, fewer) in [("int8", 3.9), ("fp16", 1.99), ("topk:0.01", 40.0)] {
        let m = dir.join(format!("{}.jsonl", codec.replace(':', "-")));
        train(&base(&["--compress", codec]), &["--metrics", s(&m)]).expect_ok();
        let sum = summary(&m);
        let rounds = sum["rounds"].as_f64().unwrap();
        let sent = sum["counters"]["bytes_sent"]["mean"].as_f64().unwrap();
        let received = sum["counters"]["bytes_received"]["mean"].as_f64().unwrap();
        let want = rounds * bytes_per_sync(codec, 4);
        assert_eq!(sent, want, "{codec}: {rounds} syncs");
        assert_eq!(received, want, "{codec}: every byte sent is received");
        assert!(ring / sent > fewer, "{codec}: {ring} ring bytes against {sent}");
        let start = metrics(&m).into_iter().find(|e| e["event"] == "start").expect("a start line");
        assert_eq!(start["sync_info"]["compress"], codec, "{start}");
    }
}

/// The residuals are each rank's state: with them (and the model of the last sync) in the
/// checkpoint the resumed run ends with the uninterrupted run's model, bit for bit, under an
/// outer optimizer too. Every rank decodes the same bytes, so the replicas agree: the saved model
/// is the one every rank holds (allreduce's final average of equal replicas is itself).
#[test]
fn a_resume_is_bit_identical_with_the_residuals() {
    let dir = scratch("compress-resume");
    for (name, extra) in [
        ("int8", &["--compress", "int8"][..]),
        ("fp16", &["--compress", "fp16"]),
        ("topk-diloco", &["--compress", "topk:0.05", "--outer-optimizer", "nesterov"]),
    ] {
        let args = base(extra);
        let (full, ck, resumed) = full_and_resumed_at_round_10(&dir, name, |extra| train(&args, extra));
        let round10 = checkpoint_of_round(&ck, 10);
        let f = hdf5::File::open(round10).unwrap();
        let g = f.group("sync/rank1").unwrap();
        for state in ["compress_last_sync", "compress_worker_residual", "compress_server_residual"] {
            assert!(g.dataset(state).is_ok(), "{name}: the checkpoint lacks {state}");
        }
        assert!(read_model(&full) == read_model(&resumed), "{name}: the resumed model differs from the uninterrupted one");
    }
}

#[test]
fn compress_is_refused_where_it_does_not_apply() {
    let data = t10k();
    let cases: [(&[&str], &str); 12] = [
        (&["--sync", "ssp", "--compress", "topk:0.01"], "--compress applies to --sync allreduce"),
        (&["--sync", "ssp", "--compress", "fp16"], "--compress applies to --sync allreduce"),
        (&["--sync", "allreduce", "--compress", "topk:2"], "--compress takes none, int8"),
        (&["--sync", "allreduce", "--compress", "int8:0"], "--compress takes none, int8"),
        (&["--sync", "asap", "--compress", "int8", "--notify", "barrier"], "cannot be combined with --notify barrier"),
        (&["--sync", "asap", "--compress", "int8", "--notify", "push-sum"], "cannot be combined with --notify push-sum"),
        (&["--sync", "asap", "--compress", "int8", "--staleness", "1"], "cannot be combined with --staleness > 0"),
        (&["--sync", "asap", "--compress", "topk:0.01", "--overlap"], "cannot be combined with --overlap"),
        (&["--sync", "asap", "--compress", "int8", "--bandwidth-mbps", "10"], "cannot be combined with --bandwidth-mbps"),
        (&["--sync", "asap", "--consensus-step", "0.5"], "--consensus-step is CHOCO's step on compressed public copies"),
        (&["--sync", "allreduce", "--compress", "int8", "--consensus-step", "0.5"], "--consensus-step applies to --sync asap"),
        (&["--sync", "asap", "--compress", "int8", "--consensus-step", "2"], "must be in (0, 1]"),
    ];
    for (extra, needle) in cases {
        let mut argv = vec!["train", "--data", &data, "--epochs", "1"];
        argv.extend(extra);
        mpirun(2, &argv, 60).expect_failure(&[needle]);
    }
}

/// 10,000 examples on 4 ranks on the hypercube (every rank 2 in- and 2 out-neighbours, doubly
/// stochastic equal weights), batch 64: 39 rounds an epoch.
fn gossip(extra: &[&str]) -> Vec<String> {
    let common = ["train", "--data", &t10k(), "--batch-size", "64", "--seed", "5", "--sync", "asap", "--graph", "hypercube"];
    common.iter().chain(extra).map(|s| s.to_string()).collect()
}

/// CHOCO-GOSSIP from every rank's own random model (`--consensus-only`: no gradient): summed
/// over the ranks the consensus steps cancel on a doubly stochastic graph, so the final model
/// (the replicas' average) is the starting replicas' average, which `--sync none` computes
/// without any gossip, up to the rounding of the steps; the replicas come to agree (their
/// distance falls 1,000-fold from the starting one, `--sync none`'s); and every message costs
/// its encoded body plus the mailbox's five words (round, length and footer with the body, the
/// NOTIFY, and the ACK back), per edge and round.
#[test]
fn gossip_compression_keeps_the_mean_while_the_replicas_agree() {
    let graph = ["--graph", "hypercube"];
    keeps_the_mean_while_the_replicas_agree("compress-choco-mean", 4, &graph, &["int8", "fp16", "topk:0.05"], "4", 2.0);
}

/// The same on NoLoCo's one-peer exponential graph at 8 ranks (a copy per edge, one out-edge a
/// round): 10,000 examples, batch 64, 20 rounds an epoch, 25 epochs (top-5 % at its default
/// step fell 0.2-fold every 80 rounds, measured: see choco.rs).
#[test]
fn one_peer_compression_keeps_the_mean_while_the_replicas_agree() {
    let graph = ["--graph", "one-peer-exponential"];
    keeps_the_mean_while_the_replicas_agree("compress-choco-one-peer-mean", 8, &graph, &["int8", "topk:0.05"], "25", 1.0);
}

/// The check of the two tests above on `ranks` ranks, `graph`, each of `codecs` for `epochs`
/// epochs, `out_degree` messages a rank and round.
fn keeps_the_mean_while_the_replicas_agree(name: &str, ranks: usize, graph: &[&str], codecs: &[&str], epochs: &str, out_degree: f64) {
    let dir = scratch(name);
    let run = |args: &[&str]| mpirun(ranks, args, 300);
    let every = ["--consensus-only", "--epochs", epochs, "--batch-size", "64", "--seed", "5", "--eval-every", "39"];
    let start = dir.join("start.h5");
    let none_metrics = dir.join("start.jsonl");
    let data = t10k();
    let none = [&["train", "--data", &data, "--sync", "none"][..], &every, &["--save-model", s(&start), "--metrics", s(&none_metrics)]];
    run(&none.concat()).expect_ok();
    let mean = read_values(&start);
    let distance = |m: &std::path::Path| -> f64 {
        let evals: Vec<serde_json::Value> = metrics(m).into_iter().filter(|e| e["event"] == "eval").collect();
        evals.last().expect("an evaluation")["consensus_distance"].as_f64().unwrap()
    };
    let apart = distance(&none_metrics);
    for &codec in codecs {
        let name = codec.replace(':', "-");
        let (model, m) = (dir.join(format!("{name}.h5")), dir.join(format!("{name}.jsonl")));
        let gossip = [&["train", "--data", &data, "--sync", "asap", "--compress", codec][..], graph, &every];
        run(&[&gossip.concat()[..], &["--save-model", s(&model), "--metrics", s(&m)]].concat()).expect_ok();
        let end = read_values(&model);
        let worst = mean.iter().zip(&end).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-4, "{codec}: the mean moved by {worst}");
        let last = distance(&m);
        assert!(last < 1e-3 * apart, "{codec}: the replicas' distance went from {apart} to {last}");
        let sum = summary(&m);
        let rounds = sum["rounds"].as_f64().unwrap();
        let body = encoded(codec, N_PARAMS);
        let want = rounds * out_degree * (body + 5.0 * 8.0);
        for counter in ["bytes_sent", "bytes_received"] {
            assert_eq!(sum["counters"][counter]["mean"].as_f64().unwrap(), want, "{codec} {counter}: {rounds} rounds");
        }
        let all = ranks as f64 * rounds * out_degree * body;
        assert_eq!(sum["sync_metrics"]["compressed_bytes_sent"].as_f64().unwrap(), all, "{codec}");
        assert_eq!(sum["sync_metrics"]["torn"].as_f64().unwrap(), 0.0, "{codec}");
    }
}

/// The public copies are each rank's state: with them in the checkpoint the resumed run ends with
/// the uninterrupted run's model, bit for bit, under NoLoCo's outer step too (asap's NOTIFY-ACK
/// reduces every in-neighbour's message of each round, so a run is deterministic).
#[test]
fn a_gossip_resume_is_bit_identical_with_the_public_copies() {
    let dir = scratch("compress-choco-resume");
    let cases: [(&str, &[&str]); 2] = [
        ("int8", &["--compress", "int8"]),
        ("topk-noloco", &["--compress", "topk:0.01", "--sync-every", "4", "--outer-optimizer", "nesterov"]),
    ];
    for (name, extra) in cases {
        let args = gossip(&[&["--epochs", "2"], extra].concat());
        let (full, ck, resumed) = full_and_resumed_at_round_10(&dir, name, |extra| train(&args, extra));
        let f = hdf5::File::open(checkpoint_of_round(&ck, 10)).unwrap();
        let g = f.group("sync/rank1").unwrap();
        for state in ["choco_public_self", "choco_public_in_0", "choco_public_in_1"] {
            assert!(g.dataset(state).is_ok(), "{name}: the checkpoint lacks {state}");
        }
        assert!(read_model(&full) == read_model(&resumed), "{name}: the resumed model differs from the uninterrupted one");
    }
}

/// On the one-peer graph at 8 ranks the copies are one per out-edge and one per in-edge (three of
/// each, one per offset 1, 2, 4), all in the checkpoint: the resumed run ends with the
/// uninterrupted run's model, bit for bit (round 10 is in the middle of a period of 3).
#[test]
fn a_one_peer_resume_is_bit_identical_with_the_public_copies() {
    let dir = scratch("compress-choco-one-peer-resume");
    let data = t10k();
    let cases: [(&str, &[&str]); 2] =
        [("int8", &["--compress", "int8"]), ("topk-noloco", &["--compress", "topk:0.01", "--outer-optimizer", "nesterov"])];
    for (name, extra) in cases {
        let common = [
            "train",
            "--data",
            &data,
            "--batch-size",
            "64",
            "--seed",
            "5",
            "--epochs",
            "1",
            "--sync",
            "asap",
            "--graph",
            "one-peer-exponential",
        ];
        let args: Vec<&str> = common.iter().chain(extra).copied().collect();
        let (full, ck, resumed) = full_and_resumed_at_round_10(&dir, name, |more| mpirun(8, &[&args[..], more].concat(), 300));
        let f = hdf5::File::open(checkpoint_of_round(&ck, 10)).unwrap();
        let g = f.group("sync/rank1").unwrap();
        for j in 0..3 {
            for state in [format!("choco_public_self_{j}"), format!("choco_public_in_{j}")] {
                assert!(g.dataset(&state).is_ok(), "{name}: the checkpoint lacks {state}");
            }
        }
        assert!(read_model(&full) == read_model(&resumed), "{name}: the resumed model differs from the uninterrupted one");
    }
}
