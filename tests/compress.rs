//! `--compress` (int8, fp16 and top-k with error feedback) under real `mpirun`, with `--sync allreduce`:
//! the byte counters are the encoded sizes (an oracle computed here from the chunking, not read
//! from the code), the replicas agree, a resume is bit-identical with the residuals, and the
//! option is refused where it does not apply.

mod common;
use common::*;

fn t10k() -> String {
    format!("{FASHION}/t10k-images-idx3-ubyte.gz")
}

fn read_model(p: &std::path::Path) -> Vec<u32> {
    let v: Vec<f32> = hdf5::File::open(p).unwrap().dataset("params").unwrap().read_raw().unwrap();
    v.into_iter().map(f32::to_bits).collect()
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
        let full = dir.join(format!("{name}-full.h5"));
        train(&args, &["--save-model", s(&full)]).expect_ok();
        let ck = dir.join(format!("{name}-ck"));
        train(&args, &["--checkpoint-dir", s(&ck), "--checkpoint-every", "5", "--max-rounds", "10"]).expect_ok();
        let resumed = dir.join(format!("{name}-resumed.h5"));
        let job = train(&args, &["--checkpoint-dir", s(&ck), "--resume", "--save-model", s(&resumed)]).expect_ok();
        assert!(job.stderr.contains("resuming from"), "{}", job.stderr);
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
    let cases: [(&[&str], &str); 5] = [
        (&["--sync", "asap", "--compress", "int8"], "--compress applies to --sync allreduce"),
        (&["--sync", "ssp", "--compress", "topk:0.01"], "--compress applies to --sync allreduce"),
        (&["--sync", "ssp", "--compress", "fp16"], "--compress applies to --sync allreduce"),
        (&["--sync", "allreduce", "--compress", "topk:2"], "--compress takes none, int8"),
        (&["--sync", "allreduce", "--compress", "int8:0"], "--compress takes none, int8"),
    ];
    for (extra, needle) in cases {
        let mut argv = vec!["train", "--data", &data, "--epochs", "1"];
        argv.extend(extra);
        mpirun(2, &argv, 60).expect_failure(&[needle]);
    }
}
