//! The emulated cluster under real mpirun: only invariants that hold on any schedule (no wall
//! time, no accuracy): the declared-versus-real accounting, the broken-step count, the link
//! model's bytes over time windows, and the refusals of bad emulation options.

mod common;
use common::*;

fn t10k() -> String {
    format!("{FASHION}/t10k-images-idx3-ubyte.gz")
}

/// A `--send-log` CSV (`seconds,bytes` per message) as (seconds, bytes) pairs.
fn read_log(path: &std::path::Path) -> Vec<(f64, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .skip(1)
        .map(|l| {
            let (t, b) = l.split_once(',').unwrap();
            (t.parse().unwrap(), b.parse().unwrap())
        })
        .collect()
}

fn emulation(sm: &serde_json::Value) -> &serde_json::Value {
    let e = &sm["emulation"];
    assert!(e.is_object(), "the summary has an emulation block: {sm}");
    e
}

/// Every step of every rank is counted; no step can end before its declared time (lateness is
/// only made up, never borrowed), so training lasts at least rounds x the slowest rank's declared
/// step; the slowed rank's factor scales the declared time, not the measured one.
#[test]
fn declared_steps_are_counted_and_never_shortened() {
    let dir = scratch("emulate-accounting");
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "allreduce",
        "--epochs",
        "1",
        "--max-rounds",
        "30",
        "--batch-size",
        "32",
        "--emulate-compute",
        "5",
        "--straggler",
        "1:3",
        "--metrics",
        s(&m),
    ];
    let job = mpirun(3, &args, 120).expect_ok();
    let sm = summary(&m);
    let e = emulation(&sm);
    assert_eq!(e["steps"], 90.0, "{e}");
    assert_eq!(e["declared_step_ms"], 5.0);
    let c = &sm["counters"];
    assert_eq!(c["emulated_steps"]["max"], 30.0);
    // Rank 1 declares 15 ms per step; allreduce makes everyone wait for it each round.
    let train = sm["train_seconds"].as_f64().unwrap();
    assert!(train >= 30.0 * 0.015, "training {train} s is shorter than 30 steps of 15 ms");
    // Each rank slept at least what its declared time left after the real compute.
    let slept = c["straggler_sleep_seconds"]["max"].as_f64().unwrap();
    let compute = c["compute_seconds"]["max"].as_f64().unwrap();
    assert!(slept + compute >= 30.0 * 0.015 - 1e-3, "slept {slept} + computed {compute}");
    assert!(e["cpu_seconds"].as_f64().unwrap() > 0.0 && e["cores"].as_f64().unwrap() >= 1.0, "{e}");
    let printed = format!("{}{}", job.stdout, job.stderr);
    assert!(printed.contains("emulated cluster (5 ms steps)"), "{printed}");
}

/// A declared time shorter than any real step breaks every step: the run says so and is invalid.
#[test]
fn steps_that_cannot_fit_are_counted_broken_and_the_run_is_invalid() {
    let dir = scratch("emulate-broken");
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "asap",
        "--epochs",
        "1",
        "--max-rounds",
        "20",
        "--batch-size",
        "256",
        "--emulate-compute",
        "0.0001",
        "--metrics",
        s(&m),
    ];
    let job = mpirun(2, &args, 120).expect_ok();
    let sm = summary(&m);
    let e = emulation(&sm);
    assert_eq!(e["broken_steps"], 40.0, "{e}");
    assert_eq!(e["worst_rank_broken_fraction"], 1.0);
    assert_eq!(e["valid"], false);
    assert!(job.stdout.contains("INVALID"), "{}", job.stdout);
}

/// Per-rank links: rank 0's link is 10x slower than rank 1's. A message runs at the slower end's
/// rate, so both ranks' sends (each only to the other) stay within rank 0's 1e6 bytes/s in every
/// 1 s window (+ one message), and the emulated time shows in the training time.
#[test]
fn per_rank_links_hold_the_slower_end_over_every_window() {
    let dir = scratch("emulate-links");
    let (m, log) = (dir.join("m.jsonl"), dir.join("sends"));
    // 8 Mbit/s = 1e6 bytes/s for rank 0, 80 Mbit/s for rank 1; the MLR message is 31 kB.
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "asap",
        "--graph",
        "ring",
        "--epochs",
        "1",
        "--max-rounds",
        "80",
        "--emulate-bandwidth",
        "80,0:8",
        "--metrics",
        s(&m),
        "--send-log",
        s(&log),
    ];
    mpirun(2, &args, 180).expect_ok();
    let read = |r: usize| read_log(&dir.join(format!("sends.rank{r}.csv")));
    // Bytes in the fullest 1 s window (windows starting at a send).
    let peak = |log: &[(f64, u64)]| asap_train::comm::pace::peak_rate(log, 1.0);
    for r in 0..2 {
        let l = read(r);
        assert_eq!(l.len(), 80, "rank {r}: one message per round to its one out-neighbour");
        let span = l.last().unwrap().0 - l[0].0;
        assert!(span > 1.5, "rank {r}: the run must span a few windows ({span:.2} s)");
        let msg = l.iter().map(|x| x.1).max().unwrap() as f64;
        assert!(peak(&l) <= 1e6 + msg, "rank {r} sent {} bytes in one second over rank 0's 8 Mbit/s link", peak(&l));
    }
    let sm = summary(&m);
    assert_eq!(sm["sync_metrics"]["torn"], 0.0);
    // 80 messages of 31 kB at 1e6 bytes/s: the sends alone take 2.5 s of training.
    assert!(sm["train_seconds"].as_f64().unwrap() >= 2.4);
}

/// `--emulate-fabric tcp` (issue 41 item 4): the link carries payload at 1448/1514 of its line
/// rate. Two ranks of asap over two-sided messages on 8 Mbit/s links (1e6 bytes/s of line), each
/// sending its 31 kB MLR model every round: every rank's sends stay within the payload rate
/// (956,367 bytes/s) over every 1 s window (+ one message), and 60 messages of 31.4 kB at that
/// rate take at least 1.97 s of training.
#[test]
fn a_tcp_fabric_carries_its_payload_share_of_the_line() {
    let dir = scratch("emulate-fabric-tcp");
    let (m, log) = (dir.join("m.jsonl"), dir.join("sends"));
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "asap",
        "--transport",
        "p2p",
        "--epochs",
        "1",
        "--max-rounds",
        "60",
        "--emulate-bandwidth",
        "8",
        "--emulate-fabric",
        "tcp",
        "--metrics",
        s(&m),
        "--send-log",
        s(&log),
    ];
    mpirun(2, &args, 180).expect_ok();
    let payload = 1e6 * 1448.0 / 1514.0;
    for r in 0..2 {
        let l = read_log(&dir.join(format!("sends.rank{r}.csv")));
        let data: Vec<u64> = l.iter().map(|x| x.1).filter(|&b| b > 1000).collect();
        assert_eq!(data.len(), 60, "rank {r}: one model message per round (besides the ACKs): {l:?}");
        let msg = l.iter().map(|x| x.1).max().unwrap() as f64;
        let peak = asap_train::comm::pace::peak_rate(&l, 1.0);
        assert!(peak <= payload + msg, "rank {r} sent {peak} bytes in one second over a payload rate of {payload}");
    }
    let start = metrics(&m).into_iter().find(|v| v["event"] == "start").expect("a start line");
    assert_eq!(start["config"]["emulate_fabric"], "tcp");
    let sm = summary(&m);
    assert_eq!(sm["sync_metrics"]["torn"], 0.0);
    assert!(sm["train_seconds"].as_f64().unwrap() >= 60.0 * 31_400.0 / payload);
}

/// `--emulate-fabric tcp` for one-sided puts: each put moves at 0.77 of the payload rate and
/// waits 2.4 ms and 13.4 one-way latencies more than the ideal pipe's one (UCX over TCP, fitted
/// over netlab's real links). Two ranks of asap over rma at 8 Mbit/s and 5 ms one way, 20
/// rounds: every round's put alone takes 31.4 kB / 736,433 bytes/s + 2.4 ms + 14.4 x 5 ms =
/// 117 ms, so training lasts at least 20 of them (2.3 s); the ideal pipe's would be 38 ms a
/// round.
#[test]
fn a_tcp_fabric_charges_one_sided_puts_their_round_trips() {
    let dir = scratch("emulate-fabric-rma");
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "asap",
        "--transport",
        "rma",
        "--epochs",
        "1",
        "--max-rounds",
        "20",
        "--emulate-bandwidth",
        "8",
        "--emulate-latency",
        "5",
        "--emulate-fabric",
        "tcp",
        "--metrics",
        s(&m),
    ];
    mpirun(2, &args, 180).expect_ok();
    let sm = summary(&m);
    let put = 31_400.0 / (1e6 * 1448.0 / 1514.0 * 0.77) + 0.0024 + 14.4 * 0.005;
    let train = sm["train_seconds"].as_f64().unwrap();
    assert!(train >= 20.0 * put, "20 rounds of {put:.3} s each in {train:.2} s");
    assert_eq!(sm["sync_metrics"]["torn"], 0.0);
}

/// `--emulate-fabric tcp`'s slow start in the all-reduce ring (issue 41 items 4 and 6): two
/// ranks of MLR (31.4 kB, so 2 ring steps of 15.7 kB) at 8 Mbit/s and 100 ms one way, 1 s
/// declared steps, a sync after each. The path holds 13 initial windows (956,367 bytes/s x
/// 200 ms), its RTO is 400 ms. A sync from the initial window (14,480 bytes) sends its first
/// chunk in two round trips: 200 ms less 14,480 bytes' 15.1 ms more than at the rate; the window
/// (31 segments after) then halves twice in the 1 s of compute (over 2 RTOs) and is back at
/// the initial window at every sync. Both ranks send and receive at once, so the bytes move at
/// the two-way share of the rate (0.76 from 10 ms one way up). So each round lasts at least 1 s
/// plus 31.4 kB over 0.76 of the rate, 2 latencies (the closed form's) and 184.9 ms; 6 rounds
/// at least 8.57 s, where the ideal pipe's would be 7.39 s.
#[test]
fn a_tcp_fabric_restarts_the_rings_slow_start_after_each_compute_phase() {
    let dir = scratch("emulate-fabric-slow-start");
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "allreduce",
        "--model",
        "mlr",
        "--epochs",
        "1",
        "--max-rounds",
        "6",
        "--emulate-compute",
        "1000",
        "--emulate-bandwidth",
        "8",
        "--emulate-latency",
        "100",
        "--emulate-fabric",
        "tcp",
        "--metrics",
        s(&m),
    ];
    mpirun(2, &args, 180).expect_ok();
    let sm = summary(&m);
    let rate = 1e6 * 1448.0 / 1514.0;
    let slow_start = 0.2 - 14_480.0 / rate;
    let round = 1.0 + 31_400.0 / (rate * 0.76) + 0.2 + slow_start;
    let train = sm["train_seconds"].as_f64().unwrap();
    assert_eq!(sm["rounds"].as_f64(), Some(6.0), "{sm}");
    assert!(train >= 6.0 * round, "6 rounds of at least {round:.4} s each in {train:.2} s");
}

/// The receiver's link: three workers send their results to the async coordinator (rank 0),
/// whose link is 10x slower than theirs. Each path alone runs at rank 0's rate, so without a
/// model of rank 0's inbound link the three together would bring it 3x its rate. With it, the
/// bytes rank 0 took in stay within its 1e6 bytes/s in every 1 s window (+ one message), and
/// they are the bytes it counted as received.
#[test]
fn a_slow_receiver_link_is_shared_by_its_senders() {
    let dir = scratch("emulate-ingress");
    let (m, log) = (dir.join("m.jsonl"), dir.join("sends"));
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "async",
        "--epochs",
        "1",
        "--max-rounds",
        "40",
        "--emulate-bandwidth",
        "80,0:8",
        "--metrics",
        s(&m),
        "--send-log",
        s(&log),
    ];
    mpirun(4, &args, 240).expect_ok();
    let l = read_log(&dir.join("sends.receives.rank0.csv"));
    assert!(l.len() >= 40, "rank 0 took in a result per round and worker: {} messages", l.len());
    let span = l.last().unwrap().0 - l[0].0;
    assert!(span > 1.5, "the run must span a few windows ({span:.2} s)");
    let msg = l.iter().map(|x| x.1).max().unwrap() as f64;
    let peak = asap_train::comm::pace::peak_rate(&l, 1.0);
    assert!(peak <= 1e6 + msg, "rank 0 took in {peak} bytes in one second over its 8 Mbit/s link");
    let sm = summary(&m);
    let logged: u64 = l.iter().map(|x| x.1).sum();
    let counted = sm["counters"]["bytes_received"]["max"].as_f64().unwrap();
    assert!(counted >= logged as f64, "rank 0's inbound log ({logged} bytes) within what a rank counted as received ({counted})");
}

/// The same under asap: on a star, three ranks send every round to rank 0, whose link is 10x
/// slower. Rank 0's inbound link takes their messages one after another: within its rate over
/// every 1 s window (+ one message), and no message read torn.
#[test]
fn many_in_neighbours_share_the_receiver_link_under_asap() {
    let sm = star_receiver_link_holds("emulate-ingress-asap", &[]);
    assert_eq!(sm["sync_metrics"]["torn"], 0.0);
}

/// 4 ranks of asap on the star with `extra` options, rank 0 behind 8 Mbit/s: rank 0 took in one
/// message per round from each of its 3 in-neighbours, within its rate over every 1 s window
/// (+ one message), so 90 messages of 31 kB at 1e6 bytes/s give at least 2.7 s of training.
/// Returns the run's summary.
fn star_receiver_link_holds(name: &str, extra: &[&str]) -> serde_json::Value {
    let dir = scratch(name);
    let (m, log, data) = (dir.join("m.jsonl"), dir.join("sends"), t10k());
    let mut args = vec![
        "train",
        "--data",
        &data,
        "--sync",
        "asap",
        "--graph",
        "star",
        "--epochs",
        "1",
        "--max-rounds",
        "30",
        "--emulate-bandwidth",
        "80,0:8",
        "--metrics",
        s(&m),
        "--send-log",
        s(&log),
    ];
    args.extend_from_slice(extra);
    mpirun(4, &args, 240).expect_ok();
    let l = read_log(&dir.join("sends.receives.rank0.csv"));
    assert_eq!(l.len(), 90, "rank 0 took in one message per round from each of its 3 in-neighbours");
    let msg = l.iter().map(|x| x.1).max().unwrap() as f64;
    let peak = asap_train::comm::pace::peak_rate(&l, 1.0);
    assert!(peak <= 1e6 + msg, "rank 0 took in {peak} bytes in one second over its 8 Mbit/s link");
    let sm = summary(&m);
    assert!(sm["train_seconds"].as_f64().unwrap() >= 2.7, "{}", sm["train_seconds"]);
    sm
}

/// The same under asap's BSP variant (`--notify barrier`), whose puts are read without a NOTIFY:
/// rank 0's inbound link still takes its three in-neighbours' messages one after another (each
/// one logged, within its rate over every 1 s window, + one message), and every round ends only
/// once they are in. Before, barrier rounds read the slots as soon as the senders' own links were
/// done, and rank 0's link logged nothing.
#[test]
fn barrier_rounds_wait_for_the_receiver_link() {
    star_receiver_link_holds("emulate-ingress-barrier", &["--notify", "barrier"]);
}

/// The deadline variant of NOTIFY-ACK never reads a torn message, reduces at most what was sent,
/// and finishes with a straggler that is never waited for beyond the deadline.
#[test]
fn deadline_reduces_only_whole_messages_and_finishes() {
    let dir = scratch("emulate-deadline");
    let m = dir.join("m.jsonl");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "asap",
        "--notify",
        "deadline",
        "--epochs",
        "1",
        "--max-rounds",
        "40",
        "--emulate-compute",
        "3",
        "--straggler",
        "1:4",
        "--emulate-bandwidth",
        "400,2:40",
        "--metrics",
        s(&m),
    ];
    mpirun(4, &args, 180).expect_ok();
    let sm = summary(&m);
    let sync = &sm["sync_metrics"];
    assert_eq!(sync["torn"], 0.0, "{sync}");
    let hist: Vec<f64> = sync["consistency_histogram"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(hist.iter().sum::<f64>(), 160.0, "one reduce per rank per round: {hist:?}");
    let reduced: f64 = hist.iter().enumerate().map(|(k, c)| k as f64 * c).sum();
    let ages: f64 = sync["message_age_histogram"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).sum();
    assert_eq!(reduced, ages, "every reduced message has an age");
    // Each rank sends at most one message per out-edge per round: at most 40 x out-degree.
    let skipped = sync["skipped_sends"].as_f64().unwrap();
    let degree = sync["in_degree"].as_f64().unwrap();
    assert!(reduced + skipped <= 4.0 * 40.0 * degree, "reduced {reduced} + skipped {skipped}");
    assert!(sm["final_metric"].as_f64().unwrap().is_finite());
}

/// A cluster profile fills the emulation options with its dilated numbers.
#[test]
fn a_cluster_profile_fills_the_emulation() {
    let dir = scratch("emulate-cluster");
    let m = dir.join("m.jsonl");
    let profile = concat!(env!("CARGO_MANIFEST_DIR"), "/clusters/10gbe.toml");
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "allreduce",
        "--epochs",
        "1",
        "--max-rounds",
        "10",
        "--batch-size",
        "256",
        "--cluster",
        profile,
        "--metrics",
        s(&m),
    ];
    mpirun(2, &args, 120).expect_ok();
    let start = &metrics(&m)[0];
    let c = &start["config"];
    // mlr:256 = 0.916 ms at dilation 20; 10 GbE / 20 = 500 Mbit/s; 15 us x 20 = 0.3 ms.
    assert!((c["emulate_compute"].as_f64().unwrap() - 18.32).abs() < 1e-9, "{c}");
    assert_eq!(c["emulate_bandwidth"], 500.0);
    assert!((c["emulate_latency"].as_f64().unwrap() - 0.3).abs() < 1e-9, "{c}");
    assert_eq!(emulation(&summary(&m))["steps"], 20.0);
}

/// `--emulate-jitter` (issue 41): each declared step lasts its time times a factor drawn from the
/// declared quantiles. The draws are seeded, so the check is deterministic: every rank's fraction
/// of draws at most each declared factor is within 0.1 of its P after 240 steps (about 3
/// standard errors; the run prints it), the mean drawn near the declared mean, and no step ends
/// before its own drawn time: training lasts at least the slowest rank's drawn steps, which are
/// at least the smallest factor times the declared time each.
#[test]
fn jittered_steps_have_the_declared_quantiles() {
    let dir = scratch("emulate-jitter");
    let m = dir.join("m.jsonl");
    let quantiles = "0:0.9,0.5:1,0.9:1.4,0.99:2,1:3";
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "allreduce",
        "--epochs",
        "1",
        "--max-rounds",
        "240",
        "--batch-size",
        "16",
        "--emulate-compute",
        "2",
        "--emulate-jitter",
        quantiles,
        "--metrics",
        s(&m),
    ];
    let job = mpirun(2, &args, 120).expect_ok();
    let sm = summary(&m);
    let j = &emulation(&sm)["jitter"];
    assert_eq!(j["quantiles"], quantiles, "{j}");
    // 0.5 x 0.95 + 0.4 x 1.2 + 0.09 x 1.7 + 0.01 x 2.5
    let declared = j["mean_declared"].as_f64().unwrap();
    assert!((declared - 1.133).abs() < 1e-9, "{j}");
    let drawn = j["mean_drawn"].as_f64().unwrap();
    assert!((drawn / declared - 1.0).abs() < 0.05, "{j}");
    assert!(j["worst_rank_quantile_error"].as_f64().unwrap() < 0.1, "{j}");
    let train = sm["train_seconds"].as_f64().unwrap();
    assert!(train >= 240.0 * 0.9 * 0.002, "training {train} s is shorter than 240 steps of at least 1.8 ms");
    let printed = format!("{}{}", job.stdout, job.stderr);
    assert!(printed.contains(&format!("step-time jitter {quantiles}: mean factor 1.133 declared")), "{printed}");
}

/// One row of a `--send-log` link log (`--emulate-groups`): wall-clock nanoseconds.
struct LinkRow {
    requested: u64,
    start: u64,
    end: u64,
    bytes: u64,
    dest: usize,
    group: Option<(u64, u64)>,
}

fn read_link_log(path: &std::path::Path) -> Vec<LinkRow> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 7, "{l}");
            let n = |i: usize| f[i].parse::<u64>().unwrap();
            let group = (!f[5].is_empty()).then(|| (n(5), n(6)));
            LinkRow { requested: n(0), start: n(1), end: n(2), bytes: n(3), dest: n(4) as usize, group }
        })
        .collect()
}

/// `--emulate-groups 2` (issue 41 item 6): 4 ranks in 2 groups of 2, every rank sending its 31 kB
/// MLR model to every other each round (asap over two-sided messages on the complete graph, on
/// the tcp fabric: slow start across), so both ranks of a group send across at once. Checked on
/// the pacers' own reservations (the link logs), against oracles of their own:
/// - each group's link to the other is one FIFO shared by its ranks: merged, its reservations
///   never overlap, each lasts its bytes at the WAN's payload rate, they carry every byte sent
///   across, and the bytes that start on it in any 1 s window stay within that rate (+ one
///   message); a message has left only once the group link has carried it;
/// - every rank's own link (its NIC) is a FIFO at the LAN's payload rate, replayed here from the
///   times the messages were handed over: each message starts exactly when that replay says, so
///   a message within a group waits only for the rank's own earlier bytes at the LAN rate, never
///   on the WAN, and takes its bytes' time at the LAN rate.
#[test]
fn a_group_shares_one_wan_link_and_its_lan_never_waits_on_it() {
    let dir = scratch("emulate-groups");
    let (m, log) = (dir.join("m.jsonl"), dir.join("sends"));
    // WAN 8 Mbit/s = 1e6 bytes/s of line, 5 ms one way; LAN 800 Mbit/s = 1e8 bytes/s, 0 ms.
    let args = [
        "train",
        "--data",
        &t10k(),
        "--sync",
        "asap",
        "--transport",
        "p2p",
        "--graph",
        "complete",
        "--epochs",
        "1",
        "--max-rounds",
        "30",
        "--emulate-compute",
        "20",
        "--emulate-bandwidth",
        "8",
        "--emulate-latency",
        "5",
        "--emulate-fabric",
        "tcp",
        "--emulate-groups",
        "2",
        "--emulate-lan-bandwidth",
        "800",
        "--metrics",
        s(&m),
        "--send-log",
        s(&log),
    ];
    mpirun(4, &args, 240).expect_ok();
    let logs: Vec<Vec<LinkRow>> = (0..4).map(|r| read_link_log(&dir.join(format!("sends.links.rank{r}.csv")))).collect();
    let share = 1448.0 / 1514.0;
    let (wan, lan) = (1e6 * share, 1e8 * share);
    let ns = |secs: f64| (secs * 1e9).round() as i64;
    for (r, l) in logs.iter().enumerate() {
        let group = r / 2;
        assert!(l.iter().any(|x| x.group.is_none()) && l.iter().any(|x| x.group.is_some()), "rank {r} sent within and across");
        // The NIC replayed: a FIFO at the LAN rate from the hand-over times.
        let mut nic_free = 0u64;
        for x in l {
            assert_eq!(x.group.is_some(), x.dest / 2 != group, "rank {r} to {}: the group link only across groups", x.dest);
            let want = x.requested.max(nic_free);
            let late = x.start as i64 - want as i64;
            assert!(late.abs() <= 2_000, "rank {r}: a message to {} started {late} ns off the NIC replay", x.dest);
            nic_free = x.start + ns(x.bytes as f64 / lan) as u64;
            match x.group {
                None => {
                    let took = x.end as i64 - x.start as i64;
                    assert!((took - ns(x.bytes as f64 / lan)).abs() <= 2_000, "rank {r}: {took} ns within a group, not at the LAN rate");
                }
                Some((gs, ge)) => {
                    assert!(gs >= x.start && x.end >= ge, "rank {r}: a message across leaves after its time on the group link")
                }
            }
        }
    }
    for group in 0..2 {
        let ranks = 2 * group..2 * group + 2;
        let mut taken: Vec<(u64, u64, u64)> = Vec::new();
        for r in ranks.clone() {
            let text = std::fs::read_to_string(dir.join(format!("sends.wan.rank{r}.csv"))).unwrap();
            for l in text.lines().skip(1) {
                let f: Vec<u64> = l.split(',').map(|v| v.parse().unwrap()).collect();
                assert_eq!(f[3], 1 - group as u64, "rank {r} reserved only its group's link to the other");
                assert!((f[1] as i64 - f[0] as i64 - ns(f[2] as f64 / wan)).abs() <= 2_000, "rank {r}: a burst not at the WAN rate: {l}");
                taken.push((f[0], f[1], f[2]));
            }
        }
        let across: u64 = logs[ranks].iter().flatten().filter(|x| x.group.is_some()).map(|x| x.bytes).sum();
        assert_eq!(taken.iter().map(|t| t.2).sum::<u64>(), across, "group {group}: the link carried every byte sent across");
        taken.sort();
        assert!(taken.len() >= 2 * 30 * 2, "group {group}: 2 ranks x 30 rounds x 2 messages across at least");
        for w in taken.windows(2) {
            assert!(w[1].0 >= w[0].1, "group {group}: two bursts on the shared link at once: {:?} and {:?}", w[0], w[1]);
        }
        let starts: Vec<(f64, u64)> = taken.iter().map(|&(s, _, b)| (s as f64 / 1e9, b)).collect();
        let span = starts.last().unwrap().0 - starts[0].0;
        assert!(span > 1.5, "group {group}: the run must span a few windows ({span:.2} s)");
        let msg = starts.iter().map(|x| x.1).max().unwrap() as f64;
        let peak = asap_train::comm::pace::peak_rate(&starts, 1.0);
        assert!(peak <= wan + msg, "group {group}'s ranks put {peak} bytes in one second on their WAN link of {wan} bytes/s");
    }
    assert_eq!(summary(&m)["sync_metrics"]["torn"], 0.0);
}

/// Bad emulation options stop every rank with a message naming the option and the fix.
#[test]
fn bad_emulation_options_are_refused() {
    let data = t10k();
    let cases: &[(&[&str], &str)] = &[
        (&["--emulate-bandwidth", "1000,9:100"], "rank 9 is outside"),
        (&["--emulate-bandwidth", "1000,0:nan"], "--emulate-bandwidth"),
        (&["--emulate-latency", "5"], "needs --emulate-bandwidth"),
        (&["--emulate-fabric", "tcp"], "--emulate-fabric tcp needs --emulate-bandwidth"),
        (&["--emulate-bandwidth", "100", "--emulate-fabric", "rdma"], "--emulate-fabric"),
        (&["--emulate-compute", "nan"], "--emulate-compute"),
        (&["--emulate-compute", "-3"], "--emulate-compute"),
        (&["--balance"], "--balance"),
        (&["--dilation", "4"], "--dilation scales a --cluster"),
        (&["--cluster", "/nonexistent/c.toml"], "/nonexistent/c.toml"),
        (&["--straggler", "transient:2:0"], "ROUNDS must be positive"),
        (&["--straggler", "0:2@9-3"], "A <= B"),
        (&["--notify", "deadline", "--checkpoint-dir", "/tmp"], "--notify deadline"),
        (&["--emulate-jitter", "0:1,1:2"], "give --emulate-compute"),
        (&["--emulate-compute", "5", "--emulate-jitter", "0:1,0.5:0.9,1:2"], "the factors must not fall"),
        (&["--emulate-compute", "5", "--emulate-jitter", "0.5:1,1:2"], "must start at P = 0"),
        (&["--emulate-groups", "2"], "--emulate-groups 2 splits the emulated links"),
        (&["--emulate-groups", "1", "--emulate-bandwidth", "100"], "give 2 or more groups"),
        (&["--emulate-groups", "3", "--emulate-bandwidth", "100"], "2 ranks do not split into 3 equal groups"),
        (&["--emulate-groups", "2", "--emulate-bandwidth", "100,0:10"], "differ per rank"),
        (&["--emulate-lan-bandwidth", "1000"], "give --emulate-groups G"),
        (&["--emulate-groups", "off", "--emulate-lan-latency", "1"], "give --emulate-groups G"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["train", "--data", data.as_str(), "--epochs", "1", "--max-rounds", "2"];
        args.extend_from_slice(extra);
        mpirun(2, &args, 60).expect_failure(&[needle]);
    }
}
