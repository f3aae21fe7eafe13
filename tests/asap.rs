//! `--sync asap` end to end under real mpirun: convergence with NOTIFY-ACK (every reduce
//! consistent), bounded-staleness NOTIFY-ACK, the barrier and fully asynchronous variants, graph
//! refusal, and the timeout when a rank stops sending. The variant tests run on both transports
//! (`--transport rma` and `p2p`), side by side in threads: the jobs mostly wait.

mod common;
use common::*;

fn t10k() -> String {
    format!("{FASHION}/t10k-images-idx3-ubyte.gz")
}

fn asap(n: usize, extra: &[&str], m: &std::path::Path) -> Job {
    let data = t10k();
    let mut args = vec!["train", "--data", &data, "--test-fraction", "0.2", "--sync", "asap", "--epochs", "3", "--metrics", s(m)];
    args.extend_from_slice(extra);
    mpirun(n, &args, 240)
}

/// [`asap`] on `transport`.
fn asap_on(transport: &str, n: usize, extra: &[&str], m: &std::path::Path) -> Job {
    let mut args = extra.to_vec();
    args.extend(["--transport", transport]);
    asap(n, &args, m)
}

/// Runs `check` for `--transport rma` and `--transport p2p` side by side, each in a thread of its
/// own (the jobs share 2 cores and mostly wait, so this takes about one transport's time, not
/// two); a failure on either fails the test, its message naming the transport.
fn on_both_transports(check: impl Fn(&str) + Sync) {
    std::thread::scope(|scope| {
        let runs: Vec<_> = ["rma", "p2p"].map(|t| (t, scope.spawn(|| check(t)))).into_iter().collect();
        for (t, run) in runs {
            if let Err(e) = run.join() {
                eprintln!("--transport {t} failed");
                std::panic::resume_unwind(e);
            }
        }
    });
}

/// The consistency histogram of a summary.
fn histogram(sm: &serde_json::Value) -> Vec<f64> {
    sm["sync_metrics"]["consistency_histogram"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
}

#[test]
fn notify_ack_converges_and_every_reduce_is_consistent() {
    on_both_transports(notify_ack_converges_on);
}

fn notify_ack_converges_on(t: &str) {
    for n in [2usize, 4] {
        let dir = scratch(&format!("asap-na-{n}-{t}"));
        let m = dir.join("m.jsonl");
        asap_on(t, n, &["--graph", "root-expander"], &m).expect_ok();
        let sm = summary(&m);
        let acc = sm["final_metric"].as_f64().unwrap();
        assert!(acc > 0.75, "{t}: {n} ranks: held-out accuracy {acc}");
        let sync = &sm["sync_metrics"];
        let hist: Vec<f64> = sync["consistency_histogram"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let rounds = sm["rounds"].as_f64().unwrap();
        // Summed over ranks: every rank's every reduce used all its in-neighbours.
        assert_eq!(*hist.last().unwrap(), rounds * n as f64, "{t}: histogram {hist:?}");
        assert!(hist[..hist.len() - 1].iter().all(|&c| c == 0.0), "{t}: histogram {hist:?}");
        assert_eq!(sync["torn"].as_f64(), Some(0.0), "{t}");
        assert_eq!(sync["stale"].as_f64(), Some(0.0), "{t}");
        assert!(sm["per_rank_metric"].as_array().unwrap().len() == n);
        let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
        assert!(start["sync_info"]["report"]["spectral_gap"].as_f64().unwrap() > 0.0);
    }
}

/// On p2p no message can be torn (a received message is complete) and barrier's per-edge wait
/// reduces every in-neighbour's message of every round; none's reads never wait.
#[test]
fn barrier_and_asynchronous_variants_run_and_report_histograms() {
    on_both_transports(|t| {
        for notify in ["barrier", "none"] {
            let dir = scratch(&format!("asap-{notify}-{t}"));
            let m = dir.join("m.jsonl");
            asap_on(t, 4, &["--graph", "ring", "--notify", notify], &m).expect_ok();
            let sm = summary(&m);
            // Without NOTIFY-ACK's full reduce the schedule picks the messages: see `TRAINED`.
            assert!(sm["final_metric"].as_f64().unwrap() > TRAINED, "{t} {notify}: {sm}");
            let hist = histogram(&sm);
            let rounds = sm["rounds"].as_f64().unwrap();
            assert_eq!(hist.iter().sum::<f64>(), rounds * 4.0, "{t} {notify}: one histogram entry per reduce");
            if t == "p2p" {
                assert_eq!(sm["sync_metrics"]["torn"].as_f64(), Some(0.0), "{t} {notify}: {sm}");
                if notify == "barrier" {
                    assert_eq!(hist, [0.0, rounds * 4.0], "{t} {notify}: every round's message reduced: {sm}");
                }
            }
        }
    });
}

/// `--notify deadline` trains on both transports; every message reduced has its age recorded
/// (the ages add up to the histogram's inputs) and none is torn.
#[test]
fn deadline_variant_reduces_what_came_and_records_its_age() {
    on_both_transports(|t| {
        let dir = scratch(&format!("asap-deadline-{t}"));
        let m = dir.join("m.jsonl");
        asap_on(t, 4, &["--graph", "ring", "--notify", "deadline", "--straggler", "0:3"], &m).expect_ok();
        let sm = summary(&m);
        let sync = &sm["sync_metrics"];
        assert_eq!(sync["torn"].as_f64(), Some(0.0), "{t}: {sync}");
        let hist = histogram(&sm);
        assert_eq!(hist.iter().sum::<f64>(), sm["rounds"].as_f64().unwrap() * 4.0, "{t}: one entry per reduce: {sync}");
        let inputs: f64 = hist.iter().enumerate().map(|(k, c)| k as f64 * c).sum();
        let ages: f64 = sync["message_age_histogram"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).sum();
        assert_eq!(ages, inputs, "{t}: one age per message reduced: {sync}");
        assert!(sm["final_metric"].as_f64().unwrap() > TRAINED, "{t}: {sm}");
    });
}

#[test]
fn a_graph_that_is_not_strongly_connected_is_refused() {
    let dir = scratch("asap-chain");
    asap(3, &["--graph", "chain"], &dir.join("m.jsonl")).expect_failure(&["not strongly connected"]);
    let g = write(&dir, "g.txt", "nodes 4\n0 1\n1 2\n2 3\n3 0\n");
    asap(3, &["--graph", &format!("file:{g}")], &dir.join("m.jsonl")).expect_failure(&["g.txt:1:", "declares 4 nodes", "3 ranks"]);
}

#[test]
fn a_rank_that_stops_sending_makes_the_others_abort_with_the_timeout_message() {
    on_both_transports(|t| {
        let dir = scratch(&format!("asap-stop-{t}"));
        let args = ["--graph", "ring", "--stop-sending-after", "2:20", "--wait-timeout", "3"];
        asap_on(t, 4, &args, &dir.join("m.jsonl")).expect_failure(&["never arrived", "rank(s) [2]", "--wait-timeout"]);
    });
}

/// Every graph file shipped in graphs/ parses, has the spectral gap its header claims, and the
/// small ones train under NOTIFY-ACK at their size with the gap reported in the metrics.
#[test]
fn shipped_graph_files_have_the_gap_they_claim_and_train() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs");
    let mut files: Vec<_> =
        std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "txt")).collect();
    files.sort();
    assert!(files.len() >= 5, "graphs/ lost files: {files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let claimed: f64 = text
            .lines()
            .find_map(|l| l.split_once("spectral gap ").map(|(_, g)| g.trim().parse().unwrap()))
            .unwrap_or_else(|| panic!("{} has no 'spectral gap' header line", f.display()));
        let out = run(&["graph", "gap", "--file", s(f), "--json"], 60).expect_ok().stdout;
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        let gap = r["spectral_gap"].as_f64().unwrap();
        assert!((gap - claimed).abs() < 1e-5, "{}: gap {gap}, header says {claimed}", f.display());
    }
    for n in [6usize, 8] {
        let f = root.join(format!("root-expander-{n}.txt"));
        let dir = scratch(&format!("asap-file-{n}"));
        let m = dir.join("m.jsonl");
        let g = format!("file:{}", s(&f));
        let data = t10k();
        mpirun(
            n,
            &["train", "--data", &data, "--sync", "asap", "--graph", &g, "--epochs", "1", "--max-rounds", "20", "--metrics", s(&m)],
            120,
        )
        .expect_ok();
        let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
        let gap = start["sync_info"]["report"]["spectral_gap"].as_f64().unwrap();
        let generated: serde_json::Value = serde_json::from_str(
            &run(&["graph", "gap", "--kind", "root-expander", "--nodes", &n.to_string(), "--json"], 60).expect_ok().stdout,
        )
        .unwrap();
        assert!((gap - generated["spectral_gap"].as_f64().unwrap()).abs() < 1e-9, "{n}: file gap {gap} vs generator {generated}");
        let sm = summary(&m);
        let hist: Vec<f64> = sm["sync_metrics"]["consistency_histogram"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        // Out-degree 2 everywhere, so in-degree 2: all 20 reduces on every rank used both inputs.
        assert_eq!(hist.last().copied(), Some(20.0 * n as f64), "{n} ranks: histogram {hist:?}");
    }
}

/// `--staleness 2` with a straggler: every reduce still uses every in-neighbour's consistent
/// message (0 torn), the recorded ages cover every message reduced and stay within 2, some are
/// stale (the straggler's receivers go on without waiting), and the model trains.
#[test]
fn bounded_staleness_notify_ack_trains_and_records_the_ages_used() {
    on_both_transports(bounded_staleness_on);
}

fn bounded_staleness_on(t: &str) {
    let dir = scratch(&format!("asap-stale-{t}"));
    let m = dir.join("m.jsonl");
    asap_on(t, 4, &["--graph", "ring", "--staleness", "2", "--straggler", "0:3"], &m).expect_ok();
    let sm = summary(&m);
    let sync = &sm["sync_metrics"];
    let rounds = sm["rounds"].as_f64().unwrap();
    assert_eq!(sync["torn"].as_f64(), Some(0.0), "{t}: {sync}");
    let hist: Vec<f64> = sync["consistency_histogram"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(hist, [0.0, 4.0 * rounds], "{t}: {sync}");
    let ages: Vec<f64> = sync["staleness_histogram"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(ages.len(), 3, "{t}: ages 0..=2: {sync}");
    assert_eq!(ages.iter().sum::<f64>(), 4.0 * rounds, "{t}: one age per message reduced: {sync}");
    assert!(ages[1] + ages[2] > 0.0, "{t}: a 3x straggler's receiver should reduce older messages: {sync}");
    // The schedule picks the ages (histogram above): see `TRAINED`.
    assert!(sm["final_metric"].as_f64().unwrap() > TRAINED, "{t}: {sm}");
}

#[test]
fn staleness_misuse_is_refused_with_the_fix() {
    let dir = scratch("asap-stale-misuse");
    let m = dir.join("m.jsonl");
    asap(2, &["--staleness", "2", "--notify", "barrier"], &m).expect_failure(&["needs --notify notify-ack"]);
    asap(2, &["--staleness", "2", "--bandwidth-mbps", "10"], &m).expect_failure(&["cannot be combined"]);
    let data = t10k();
    mpirun(2, &["train", "--data", &data, "--sync", "allreduce", "--staleness", "1"], 60).expect_failure(&["--staleness applies to"]);
}

/// `--straggler-wait busy`: only the slowed rank pays extra time (so the mean over 4 ranks is a
/// quarter of the max), about (factor - 1) x its compute, spinning instead of sleeping.
#[test]
fn a_busy_waiting_straggler_is_slowed_alone() {
    let dir = scratch("asap-busy-straggler");
    let m = dir.join("m.jsonl");
    asap(4, &["--straggler", "0:3", "--straggler-wait", "busy"], &m).expect_ok();
    let c = &summary(&m)["counters"];
    let (mean, max) = (c["straggler_sleep_seconds"]["mean"].as_f64().unwrap(), c["straggler_sleep_seconds"]["max"].as_f64().unwrap());
    assert!(max > 0.0, "{c}");
    assert!((4.0 * mean - max).abs() < 1e-9, "only rank 0 straggles: {c}");
    let compute = c["compute_seconds"]["max"].as_f64().unwrap();
    assert!(max > 1.0 * compute && max < 3.0 * compute, "3x slower: about twice its compute extra: {c}");
}

/// `--graph one-peer-exponential` trains with one in-neighbour per round (the histogram's
/// column 1 holds every reduce) and is refused with the options it cannot combine with.
#[test]
fn one_peer_exponential_trains_with_one_neighbour_per_round() {
    on_both_transports(|t| {
        let dir = scratch(&format!("asap-one-peer-{t}"));
        let m = dir.join("m.jsonl");
        asap_on(t, 4, &["--graph", "one-peer-exponential"], &m).expect_ok();
        let sm = summary(&m);
        let hist = histogram(&sm);
        let rounds = sm["rounds"].as_f64().unwrap();
        assert_eq!(hist[1], 4.0 * rounds, "{t}: {hist:?}");
        assert_eq!(hist.iter().sum::<f64>(), 4.0 * rounds, "{t}: {hist:?}");
        assert_eq!(sm["sync_metrics"]["torn"].as_f64(), Some(0.0), "{t}: {sm}");
        assert!(sm["final_metric"].as_f64().unwrap() > 0.75, "{t}: {sm}");
    });
    let m = scratch("asap-one-peer").join("m.jsonl");
    asap(2, &["--graph", "one-peer-exponential", "--staleness", "1"], &m).expect_failure(&["changes every round"]);
}

/// `--notify push-sum` trains without waiting: the weights still sum to N at the end (no mass
/// lost or counted twice, to float precision) and the model is sensible.
#[test]
fn push_sum_trains_and_keeps_the_weights_summing_to_n() {
    on_both_transports(|t| {
        let dir = scratch(&format!("asap-push-sum-{t}"));
        let m = dir.join("m.jsonl");
        asap_on(t, 4, &["--notify", "push-sum"], &m).expect_ok();
        let sm = summary(&m);
        let w = sm["sync_metrics"]["push_sum_weight_sum"].as_f64().unwrap();
        assert!((w - 4.0).abs() < 1e-9, "{t}: weights sum to {w}: {sm}");
        // Push-sum never waits: the schedule picks what each rank folds in (see `TRAINED`).
        assert!(sm["final_metric"].as_f64().unwrap() > TRAINED, "{t}: {sm}");
        if t == "p2p" {
            assert_eq!(sm["sync_metrics"]["torn"].as_f64(), Some(0.0), "{t}: {sm}");
        }
    });
}

/// Push-sum's byte counters count what their names say: every share a rank sends is received
/// once, directly or inside a newer running total that overwrote it (its data arrives with
/// that total), and re-reading an unchanged slot receives nothing. So over all ranks the bytes
/// received equal the bytes sent, whatever the schedule: with a 3x straggler, whose in-neighbours
/// see its totals rarely and whose own reads lag, and at 8 ranks on a sparser graph. (The issue
/// asked for within 10 %; the count is exact by construction, so equality is asserted.)
#[test]
fn push_sum_bytes_received_equal_bytes_sent_over_ranks() {
    on_both_transports(push_sum_bytes_on);
}

fn push_sum_bytes_on(t: &str) {
    let dir = scratch(&format!("asap-push-sum-bytes-{t}"));
    for (n, extra) in [(4, &["--straggler", "1:3"][..]), (8, &["--graph", "ring"][..])] {
        let m = dir.join(format!("m{n}.jsonl"));
        let mut args = vec!["--notify", "push-sum"];
        args.extend_from_slice(extra);
        asap_on(t, n, &args, &m).expect_ok();
        let sm = summary(&m);
        let c = &sm["counters"];
        let total = |k: &str| c[k]["mean"].as_f64().unwrap() * n as f64;
        let (sent, received) = (total("bytes_sent"), total("bytes_received"));
        assert!(sent > 0.0, "{t}: {sm}");
        assert!((received - sent).abs() <= 1e-9 * sent, "{t}: {n} ranks: received {received} B against {sent} B sent: {c}");
        // And per rank nothing absurd: nobody receives more than the whole job sent.
        assert!(c["bytes_received"]["max"].as_f64().unwrap() <= sent, "{t}: {c}");
    }
}

/// `--overlap`: every round is still reduced with every in-neighbour's consistent message (the
/// reduce just happens one sync later, `finish` completing the last), and the model trains.
#[test]
fn overlapped_rounds_are_all_reduced_and_train() {
    on_both_transports(|t| {
        let dir = scratch(&format!("asap-overlap-{t}"));
        let m = dir.join("m.jsonl");
        asap_on(t, 4, &["--graph", "ring", "--overlap"], &m).expect_ok();
        let sm = summary(&m);
        assert_eq!(histogram(&sm), [0.0, 4.0 * sm["rounds"].as_f64().unwrap()], "{t}: {sm}");
        assert_eq!(sm["sync_metrics"]["torn"].as_f64(), Some(0.0), "{t}");
        assert!(sm["final_metric"].as_f64().unwrap() > 0.75, "{t}: {sm}");
    });
    let m = scratch("asap-overlap").join("m.jsonl");
    asap(2, &["--overlap", "--notify", "none"], &m).expect_failure(&["--overlap runs with --notify notify-ack"]);
}

/// `--transport p2p` (issue 41): NOTIFY-ACK over two-sided messages reduces the same messages in
/// the same order as the one-sided mailboxes, so a seeded run gives the same model bit for bit,
/// on a static graph, with `--overlap`, on the one-peer graph, over emulated links and with
/// CHOCO's compressed messages; every reduce is consistent and no read is torn. On one host `auto` keeps the one-sided transport and says why.
#[test]
fn p2p_and_rma_transports_give_the_same_models() {
    let dir = scratch("asap-p2p");
    let cases: &[(&str, &[&str])] = &[
        ("static", &["--graph", "root-expander"]),
        ("overlap", &["--graph", "root-expander", "--overlap"]),
        ("one-peer", &["--graph", "one-peer-exponential"]),
        // The emulated link holds p2p's messages in the sender's queue: the cut before the stop
        // vote's collective must hand them to MPI (a run hung there before it did).
        ("emulated", &["--graph", "root-expander", "--emulate-compute", "2", "--emulate-bandwidth", "100", "--emulate-latency", "1"]),
        // CHOCO's compressed changes: encoded messages, delivered once and in order on both.
        ("compressed", &["--graph", "root-expander", "--compress", "int8"]),
    ];
    // Each transport's runs in a thread of its own, side by side; the models compared after.
    let models = std::sync::Mutex::new(std::collections::BTreeMap::new());
    on_both_transports(|transport| {
        for (name, extra) in cases {
            let (m, model) = (dir.join(format!("{name}-{transport}.jsonl")), dir.join(format!("{name}-{transport}.h5")));
            let mut args = extra.to_vec();
            args.extend(["--max-rounds", "60", "--lr", "0.05", "--save-model", s(&model)]);
            asap_on(transport, 4, &args, &m).expect_ok();
            let sm = summary(&m);
            assert_eq!(sm["sync_metrics"]["torn"].as_f64(), Some(0.0), "{name} {transport}: {sm}");
            let hist = histogram(&sm);
            let full = if *name == "one-peer" { hist[1] } else { *hist.last().unwrap() };
            assert_eq!(full, sm["rounds"].as_f64().unwrap() * 4.0, "{name} {transport}: every reduce used every in-neighbour: {hist:?}");
            let start = metrics(&m).into_iter().find(|v| v["event"] == "start").unwrap();
            assert_eq!(start["sync_info"]["transport"], transport, "{name}: {start}");
            let params = hdf5::File::open(&model).unwrap().dataset("params").unwrap().read_raw::<f32>().unwrap();
            models.lock().unwrap().insert((*name, transport.to_string()), params);
        }
    });
    let models = models.into_inner().unwrap();
    for (name, _) in cases {
        let model = |t: &str| &models[&(*name, t.to_string())];
        assert!(model("rma") == model("p2p"), "{name}: the two transports trained different models");
    }
    let m = dir.join("auto.jsonl");
    let job = asap(2, &["--max-rounds", "3"], &m).expect_ok();
    assert!(job.stderr.contains("sync asap by one-sided RMA (auto: every rank on one host, shared memory)"), "{}", job.stderr);
}

/// The budgeted edges on p2p (their rows depend on the token bucket's timing, so no two runs send
/// the same) train with no torn read.
#[test]
fn p2p_carries_the_budgeted_edges() {
    let dir = scratch("asap-p2p-budget");
    let m = dir.join("budget.jsonl");
    asap(4, &["--graph", "root-expander", "--transport", "p2p", "--bandwidth-mbps", "20", "--max-rounds", "30"], &m).expect_ok();
    let sm = summary(&m);
    assert_eq!(sm["sync_metrics"]["torn"].as_f64(), Some(0.0), "{sm}");
    assert!(sm["counters"]["bytes_sent"]["mean"].as_f64().unwrap() > 0.0, "{sm}");
}

/// Every variant through cuts over emulated links, on both transports: evaluations every 5
/// rounds and checkpoints every 7, where the ranks meet in collectives (the barrier variant
/// evaluates without a cut, so a p2p message the emulated link still held left its receiver
/// waiting through the evaluation until the round released it), the end settling the links. No
/// read is torn and every run ends.
#[test]
fn every_variant_passes_cuts_over_emulated_links() {
    on_both_transports(|t| {
        let dir = scratch(&format!("asap-cuts-{t}"));
        let variants: &[&[&str]] =
            &[&["--notify", "barrier"], &["--notify", "none"], &["--notify", "push-sum"], &["--notify", "deadline"], &["--staleness", "2"]];
        for (k, v) in variants.iter().enumerate() {
            let (m, ck) = (dir.join(format!("m{k}.jsonl")), dir.join(format!("ck{k}")));
            let mut args = v.to_vec();
            args.extend(["--graph", "root-expander", "--max-rounds", "30", "--eval-every", "5"]);
            args.extend(["--emulate-compute", "2", "--emulate-bandwidth", "100", "--emulate-latency", "1"]);
            if v[1] != "deadline" {
                // (deadline refuses checkpoints: it has no cut.)
                args.extend(["--checkpoint-dir", s(&ck), "--checkpoint-every", "7"]);
            }
            asap_on(t, 4, &args, &m).expect_ok();
            let sm = summary(&m);
            assert_eq!(sm["rounds"].as_f64(), Some(30.0), "{t} {v:?}: {sm}");
            // On rma, barrier, none and push-sum read slots that a sender may be overwriting (a
            // torn read is skipped; push-sum retries it next round with nothing lost), so only the
            // variants that wait for the ACK, and every p2p run, must read no torn message.
            if t == "p2p" || !["barrier", "none", "push-sum"].contains(&v[1]) {
                assert_eq!(sm["sync_metrics"]["torn"].as_f64(), Some(0.0), "{t} {v:?}: {sm}");
            }
            if v[1] == "push-sum" {
                // Mass conserved through the cuts: the weights sum to N.
                let w = sm["sync_metrics"]["push_sum_weight_sum"].as_f64().unwrap();
                assert!((w - 4.0).abs() < 1e-9, "{t} {v:?}: weights sum to {w}: {sm}");
            }
        }
    });
}
