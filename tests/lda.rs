//! `--model lda` under real `mpirun`: planted topics recovered by 4 ranks of ssp, every token
//! counted exactly once on the servers (ssp, bosen, allreduce, and gaia's replicas after its
//! significance filter held count deltas back between groups), refused modes and malformed
//! corpora failing with a clear message.

mod common;
use common::*;

use std::path::Path;

/// Generates a planted corpus `docword.NAME.txt` (+ vocab) in `dir`; returns its path.
fn corpus(dir: &Path, name: &str, docs: usize, words: usize, topics: usize, alpha: f64) -> String {
    let p = dir.join(format!("docword.{name}.txt"));
    let (d, w, k, a) = (docs.to_string(), words.to_string(), topics.to_string(), alpha.to_string());
    run(&["data", "synth-lda", s(&p), "--docs", &d, "--words", &w, "--topics", &k, "--doc-length", "100", "--alpha", &a], 60).expect_ok();
    p.to_string_lossy().into_owned()
}

/// Tokens in a docword file, counted here independently of the reader under test.
fn tokens_in(path: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().skip(3).map(|l| l.split_whitespace().nth(2).unwrap().parse::<u64>().unwrap()).sum()
}

/// The saved model's W x K counts.
fn word_topic(path: &Path) -> (Vec<u32>, usize, usize) {
    let f = hdf5::File::open(path).unwrap();
    let ds = f.dataset("word_topic").unwrap();
    let shape = ds.shape();
    (ds.read_raw::<u32>().unwrap(), shape[0], shape[1])
}

/// Planted topic of word `w` (blocks t*W/K..(t+1)*W/K, as `data synth-lda` documents).
fn planted(w: usize, words: usize, topics: usize) -> usize {
    (0..topics).find(|&t| w < (t + 1) * words / topics).unwrap()
}

/// Planted topics whose best-matching learned topic has at least 8 of its top 10 words in the
/// planted block.
fn recovered(counts: &[u32], words: usize, k: usize) -> Vec<bool> {
    let mut best = vec![0; k];
    for t in 0..k {
        let mut ids: Vec<usize> = (0..words).collect();
        ids.sort_by(|&a, &b| counts[b * k + t].cmp(&counts[a * k + t]).then(a.cmp(&b)));
        let mut per = vec![0; k];
        ids[..10].iter().for_each(|&w| per[planted(w, words, k)] += 1);
        for p in 0..k {
            best[p] = best[p].max(per[p]);
        }
    }
    best.iter().map(|&b| b >= 8).collect()
}

/// Planted topics recovered by mass (the criterion of benches/lda_planted.py): some learned topic
/// holds at least 80 % of the planted topic's tokens and the planted topic's words are at least
/// 80 % of that learned topic's tokens. A merged pair fails the second, a topic split over two
/// the first.
fn recovered_by_mass(counts: &[u32], words: usize, k: usize) -> Vec<bool> {
    let mut per = vec![0f64; k * k]; // planted p, learned t: per[p * k + t]
    for (w, row) in counts.chunks(k).enumerate() {
        let p = planted(w, words, k);
        row.iter().enumerate().for_each(|(t, &c)| per[p * k + t] += c as f64);
    }
    let learned: Vec<f64> = (0..k).map(|t| (0..k).map(|p| per[p * k + t]).sum()).collect();
    (0..k)
        .map(|p| {
            let own: f64 = per[p * k..(p + 1) * k].iter().sum();
            (0..k).any(|t| per[p * k + t] >= 0.8 * own && per[p * k + t] >= 0.8 * learned[t])
        })
        .collect()
}

/// Runs LDA and checks the exact-count invariant against the file; returns the saved counts.
fn train_checked(n: usize, data: &str, dir: &Path, extra: &[&str], k: usize) -> (Vec<u32>, usize) {
    let (m, h5) = (dir.join("m.jsonl"), dir.join("model.h5"));
    let ks = k.to_string();
    let mut args = vec!["train", "--model", "lda", "--topics", &ks, "--data", data, "--metrics", s(&m), "--save-model", s(&h5)];
    args.extend_from_slice(extra);
    mpirun(n, &args, 300).expect_ok();
    let sm = summary(&m);
    let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
    // Documents held out of this file (--test-fraction) are not trained on.
    let held = if extra.contains(&"--test-data") { 0 } else { start["test_tokens"].as_u64().unwrap() };
    let tokens = tokens_in(data) - held;
    assert_eq!(sm["tokens"].as_u64(), Some(tokens), "{sm}");
    assert_eq!(sm["tokens_counted"].as_u64(), Some(tokens), "{sm}");
    assert_eq!(sm["counts_exact"], true);
    let (counts, w, kk) = word_topic(&h5);
    assert_eq!(kk, k);
    assert_eq!(counts.iter().map(|&c| c as u64).sum::<u64>(), tokens, "every token counted exactly once");
    // Per word: the model's row sums are the word's corpus frequency.
    let mut freq = vec![0u64; w];
    for l in std::fs::read_to_string(data).unwrap().lines().skip(3) {
        let v: Vec<u64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
        freq[v[1] as usize - 1] += v[2];
    }
    for (i, row) in counts.chunks(k).enumerate().filter(|_| held == 0) {
        assert_eq!(row.iter().map(|&c| c as u64).sum::<u64>(), freq[i], "word {}", i + 1);
    }
    let ll = sm["log_likelihood_per_token"].as_f64().unwrap();
    assert!(ll.is_finite() && ll < 0.0, "{sm}");
    (counts, w)
}

/// 10 planted topics (20 words each; documents mostly from one or two topics), 4 ranks of ssp:
/// every planted topic is recovered, and every token is counted once. At --staleness 0 the run
/// is the same on any schedule (each clock reads rows holding every update of the clock before,
/// and integer adds in f32 do not depend on their order: two runs saved identical models), so
/// what is asserted here holds everywhere. Measured on this corpus (docs/lda.md), without
/// split-merge moves: recovered with seeds 1-6 at --staleness 0 and 1-8 at the default staleness
/// 3; with 10 % of the documents held out instead, 2 of 7 seeds left two planted topics merged,
/// which --split-merge 20 (used here) repaired: all 10 with seeds 1-7.
#[test]
fn ssp_recovers_ten_planted_topics_and_counts_every_token_once() {
    let dir = scratch("lda-k10");
    let data = corpus(&dir, "k10", 2000, 200, 10, 0.1);
    // The same planted topics (they depend on W and K only), other documents.
    let test = dir.join("docword.k10test.txt");
    run(&["data", "synth-lda", s(&test), "--docs", "200", "--words", "200", "--topics", "10", "--doc-length", "100", "--seed", "2"], 60)
        .expect_ok();
    let extra =
        ["--sync", "ssp", "--staleness", "0", "--epochs", "40", "--eval-every", "20", "--test-data", s(&test), "--split-merge", "20"];
    let (counts, w) = train_checked(4, &data, &dir, &extra, 10);
    let got = recovered(&counts, w, 10);
    assert!(got.iter().all(|&r| r), "planted topics recovered: {got:?}");
    let evals: Vec<_> = metrics(&dir.join("m.jsonl")).into_iter().filter(|v| v["event"] == "eval").collect();
    assert_eq!(evals.len(), 2);
    let (ll0, ll1) = (evals[0]["log_likelihood_per_token"].as_f64().unwrap(), evals[1]["log_likelihood_per_token"].as_f64().unwrap());
    assert!(ll1 >= ll0 - 0.05, "log-likelihood per token {ll0} -> {ll1}");
    let ppl = evals[1]["perplexity"].as_f64().unwrap();
    // Uniform over 200 words scores 200; 10 Zipf topics of 20 words are far below it (29 seen).
    assert!(ppl.is_finite() && ppl < 60.0, "held-out perplexity {ppl}");
}

/// The defaults recover every planted topic when every document mixes two (issue 44): 10 planted
/// topics over disjoint 40-word blocks, two per document in equal shares, word j of a block drawn
/// with weight (j+1)^-2 (`data synth-lda --topics-per-doc 2 --word-exponent 2`), 2,000
/// documents; 4 ranks of ssp, 50 sweeps, no LDA option given. At --staleness 0 a run is the same
/// on any schedule (two runs saved identical models), so the assertion holds everywhere.
/// Measured with benches/lda-planted.sh (docs/lda.md): every planted topic with corpus and run
/// seeds 1-10 at staleness 0 and 1; before the annealed document prior and the paired moves
/// became defaults, 1-3 of seeds 1-5 at staleness 1.
#[test]
fn the_defaults_recover_every_planted_topic_of_two_topic_documents() {
    let dir = scratch("lda-two");
    for seed in 1..=5 {
        let p = dir.join(format!("docword.two{seed}.txt"));
        let sd = seed.to_string();
        let family = ["--docs", "2000", "--words", "400", "--topics", "10", "--topics-per-doc", "2", "--word-exponent", "2"];
        let mut args = vec!["data", "synth-lda", s(&p), "--seed", &sd];
        args.extend_from_slice(&family);
        run(&args, 60).expect_ok();
        let data = p.to_string_lossy().into_owned();
        let extra = ["--sync", "ssp", "--staleness", "0", "--epochs", "50", "--eval-every", "50", "--seed", &sd];
        let (counts, w) = train_checked(4, &data, &dir, &extra, 10);
        let got = recovered_by_mass(&counts, w, 10);
        assert!(got.iter().all(|&r| r), "seed {seed}: planted topics recovered: {got:?}");
    }
}

/// 100 planted topics (1,000 words, documents mostly of one topic), 4 ranks of ssp with
/// split-merge moves after the first 20 of 30 sweeps: every planted topic is recovered, and every
/// token is counted once. Without the moves 58-66 of 100 came out (merged pairs that Gibbs
/// sampling never separates; docs/lda.md). At --staleness 0 the run is the same on any schedule
/// (see the K = 10 test; the moves decide from sums that rank 0 broadcasts), so the assertion
/// holds everywhere; measured (docs/lda.md): all 100 with seeds 1-6, at --staleness 0 and at the
/// default staleness.
#[test]
fn ssp_with_split_merge_recovers_a_hundred_planted_topics_and_counts_every_token_once() {
    let dir = scratch("lda-k100");
    let data = corpus(&dir, "k100", 3000, 1000, 100, 0.01);
    let extra = ["--sync", "ssp", "--staleness", "0", "--epochs", "30", "--eval-every", "30", "--split-merge", "20"];
    let (counts, w) = train_checked(4, &data, &dir, &extra, 100);
    let got = recovered(&counts, w, 100);
    let missed: Vec<usize> = (0..100).filter(|&t| !got[t]).collect();
    assert!(missed.is_empty(), "planted topics not recovered: {missed:?}");
    let sm = summary(&dir.join("m.jsonl"));
    let moves = &sm["split_merge"];
    // The moves did the work: merged pairs were split (each split also needs a free topic).
    assert!(moves["splits"].as_u64().unwrap() >= 10, "{moves}");
    let phases = metrics(&dir.join("m.jsonl")).into_iter().filter(|v| v["event"] == "split_merge").count();
    assert_eq!(phases, 20, "one phase after each of the first 20 sweeps");
}

/// bosen (budget, relative-magnitude priority, early partial pushes) and allreduce (summed
/// deltas, by MPI's allreduce and by the ring) keep the counts exact too; so does bosen at a budget whose early pushes are still
/// queued at a clock's end, where they are taken back and their counts go out with the clock's
/// own push (measured here: 59-61 of them at 2 Mbit/s, 14-17 at 20; and 23 and 16-17 of the servers'
/// early messages of fresh rows).
#[test]
fn bosen_and_allreduce_count_every_token_once() {
    let dir = scratch("lda-modes");
    let data = corpus(&dir, "modes", 400, 100, 5, 0.1);
    for mode in [
        &["--sync", "bosen", "--bandwidth-mbps", "20", "--queue-size", "10", "--batch-size", "8"][..],
        &["--sync", "bosen", "--bandwidth-mbps", "2", "--queue-size", "10", "--batch-size", "8"][..],
        &["--sync", "allreduce", "--test-fraction", "0.2"][..],
        // The program's own ring sums the count deltas (integers: exact in any order).
        &["--sync", "allreduce", "--allreduce-algorithm", "ring"][..],
    ] {
        let mut extra = vec!["--epochs", "10", "--clocks-per-sweep", "2"];
        extra.extend_from_slice(mode);
        train_checked(3, &data, &dir, &extra, 5);
        if mode[0..2] == ["--sync", "bosen"] {
            // Not asserted: whether anything is still queued at a clock's end depends on how the
            // steps and the link's drain interleave (the look-ahead queues about a step's worth).
            let sync = &summary(&dir.join("m.jsonl"))["sync_metrics"];
            let (pushes, serves) = (&sync["early_push_messages_withdrawn"], &sync["early_row_serve_messages_withdrawn"]);
            eprintln!("{mode:?}: withdrawn {pushes} early pushes and {serves} early row messages");
        }
    }
}

/// gaia, 4 ranks in 2 groups: each group sums its deltas every clock, the groups exchange only
/// the accumulated count deltas that pass the significance filter (the default V = 1 %), the end
/// flushes every residual, and every replica ends with every token counted exactly once. The
/// counts are exact on any schedule (what a group receives when is up to the mirror clocks, but
/// integer adds in f32 do not depend on their order); that the filter holds deltas back is a
/// count too, with a wide margin: with seeds 1-5 at --dc-staleness 2 and 0, 491-532 cell decisions
/// kept a delta back, 22-42 cells went in the final flush and 6,223-6,499 crossed during clocks.
#[test]
fn gaia_filters_count_deltas_between_groups_and_counts_every_token_once() {
    let dir = scratch("lda-gaia");
    let data = corpus(&dir, "gaia", 400, 100, 5, 0.1);
    let extra = ["--sync", "gaia", "--groups", "2", "--epochs", "8", "--clocks-per-sweep", "2"];
    train_checked(4, &data, &dir, &extra, 5);
    let sm = summary(&dir.join("m.jsonl"));
    let g = &sm["sync_metrics"];
    let num = |k: &str| g[k].as_f64().unwrap_or_else(|| panic!("{k} in {g}"));
    assert_eq!(num("groups"), 2.0, "{g}");
    let (sent, held, flushed) = (num("significant_updates"), num("residual_entries_held"), num("residual_entries_flushed"));
    assert!(sent > 0.0, "no count delta crossed between groups: {g}");
    assert!(held > 0.0, "the filter held nothing back: {g}");
    assert!(flushed > 0.0, "the end flushed no residual: {g}");
    assert_eq!(num("final_group_disagreement"), 0.0, "{g}");
}

/// --emulate-compute paces every mini-batch: rank 0's training lasts at least its mini-batches'
/// declared time, and the counts stay exact.
#[test]
fn emulated_compute_paces_every_mini_batch() {
    let dir = scratch("lda-emulate");
    let data = corpus(&dir, "emu", 120, 60, 3, 0.1);
    let extra = ["--sync", "ssp", "--epochs", "3", "--batch-size", "10", "--emulate-compute", "20", "--emulate-bandwidth", "100"];
    train_checked(2, &data, &dir, &extra, 3);
    let sm = summary(&dir.join("m.jsonl"));
    let steps = sm["emulation"]["steps_per_rank"].as_u64().unwrap();
    // About 60 documents per rank: 6 mini-batches of 10 a sweep (one more where a rank has 61+).
    assert!((15..=30).contains(&steps), "{sm}");
    let train = sm["train_seconds"].as_f64().unwrap();
    assert!(train >= 0.95 * steps as f64 * 0.020, "training {train} s for {steps} mini-batches of 20 ms");
}

/// Modes that average replicas are refused on every rank with the reason; a malformed corpus is
/// named with its line.
#[test]
fn refused_modes_and_malformed_corpora_fail_clearly() {
    let dir = scratch("lda-bad");
    let data = corpus(&dir, "ok", 50, 40, 4, 0.1);
    mpirun(2, &["train", "--model", "lda", "--topics", "4", "--data", &data, "--sync", "asap"], 60)
        .expect_failure(&["--model lda runs under --sync allreduce, ssp, bosen or gaia, not asap", "average replicas"]);
    mpirun(
        2,
        &["train", "--model", "lda", "--topics", "4", "--data", &data, "--sync", "gaia", "--groups", "2", "--gaia-inner", "asap"],
        60,
    )
    .expect_failure(&["--gaia-inner asap with --model lda", "--gaia-inner allreduce"]);
    mpirun(2, &["train", "--model", "lda", "--data", &data, "--sync", "ssp", "--apply", "consgd"], 60).expect_failure(&["--apply plain"]);
    let ck = dir.join("ck");
    mpirun(2, &["train", "--model", "lda", "--topics", "4", "--data", &data, "--sync", "ssp", "--checkpoint-dir", s(&ck)], 60)
        .expect_failure(&["--checkpoint-dir", "not implemented for --model lda"]);
    let bad = write(&dir, "docword.bad.txt", "2\n5\n3\n1 2 3\n1 4 1\n2 7 1\n");
    mpirun(2, &["train", "--model", "lda", "--topics", "2", "--data", &bad, "--sync", "ssp"], 60)
        .expect_failure(&["docword.bad.txt:6", "wordID 7 outside 1..=5"]);
    let short = write(&dir, "docword.short.txt", "2\n5\n4\n1 2 3\n1 4 1\n2 5 1\n");
    mpirun(2, &["train", "--model", "lda", "--topics", "2", "--data", &short, "--sync", "allreduce"], 60)
        .expect_failure(&["NNZ = 4", "holds 3"]);
}
