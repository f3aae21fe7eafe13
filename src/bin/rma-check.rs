//! `rma-check`: checks the one-sided MPI layer and ASAP stochastic reduce on a real MPI job.
//!
//! Run under `mpirun -n N rma-check ...`. It (1) exercises every window operation and checks the
//! results, then (2) runs [`StochasticReduce`] on the chosen graphs and notify modes with a
//! synthetic payload (rank r holds `r + (k mod 3)` at index k) and verifies:
//! - `notify-ack`, round 1: every value equals the average of itself and its in-neighbours,
//!   computed the same way, bit for bit; every reduce used all in-neighbours;
//! - every mode: values stay inside the initial range; after `finish` all ranks hold the same
//!   model; for `notify-ack` on these regular graphs it is the global mean;
//! - `--expect-converge TOL`: before `finish`, every value is within TOL of the global mean.
//!
//! Rank 0 prints one summary line per run; any mismatch or error aborts the job non-zero.
//! `--stop-sending RANK:ROUND` injects a fault and expects the wait-timeout error instead.

use std::time::{Duration, Instant};

use asap_train::comm::mailbox::{Mailboxes, SlotRead};
use asap_train::comm::window::{RmaOp, Window};
use asap_train::comm::{abort_job, init};
use asap_train::sync::gossip::{AsapConfig, NotifyMode, StochasticReduce};
use asap_train::sync::SyncMode;
use clap::Parser;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::{Communicator, SimpleCommunicator};

/// Graphs this binary builds itself (simple formulas; independent of src/graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum GraphKind {
    /// i receives from i-1.
    Ring,
    /// Root expander: i sends to i+1 and i+floor(sqrt N) (mod N).
    Expander,
    /// Everyone receives from everyone.
    Complete,
    /// Ring, expander and complete in turn.
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ModeChoice {
    NotifyAck,
    Barrier,
    None,
    All,
}

/// Diagnostic for the one-sided MPI layer and ASAP stochastic reduce (run under mpirun).
#[derive(Parser, Debug)]
struct Args {
    /// Communication graph.
    #[arg(long, value_enum, default_value = "ring")]
    graph: GraphKind,
    /// Notify mode(s).
    #[arg(long, value_enum, default_value = "notify-ack")]
    notify: ModeChoice,
    /// Sync rounds per run.
    #[arg(long, default_value_t = 1)]
    rounds: u64,
    /// Payload length in f32s.
    #[arg(long, default_value_t = 8)]
    len: usize,
    /// Wait timeout in milliseconds (the library's --wait-timeout).
    #[arg(long, default_value_t = 20_000)]
    wait_timeout_ms: u64,
    /// Fault injection RANK:ROUND: that rank stops sending after ROUND; the run must then fail
    /// with the wait-timeout error.
    #[arg(long, value_parser = parse_fault)]
    stop_sending: Option<(usize, u64)>,
    /// Require every value within this distance of the global mean before `finish`.
    #[arg(long)]
    expect_converge: Option<f64>,
    /// Bounded-staleness NOTIFY-ACK check instead of the runs above (ring only): every rank's
    /// payload is its round number, so after a reduce the value tells which round the
    /// in-neighbour's message came from, independently of the library's own accounting. Fails
    /// if any reduce used a message more than S rounds old.
    #[arg(long, value_name = "S")]
    staleness: Option<u64>,
    /// With --staleness: rank 0 sleeps this long before every round (a straggler whose
    /// receivers then use stale messages).
    #[arg(long, default_value_t = 0)]
    slow_rank_us: u64,
    /// One-peer exponential check instead of the runs above (N a power of two): round k pairs
    /// i with i - 2^((k-1) mod log2 N), so after log2 N rounds every rank holds the exact global
    /// mean (dyadic values: bit for bit), and again after every further period.
    #[arg(long)]
    one_peer: bool,
    /// Push-sum mass check instead of the runs above (expander graph): rank 0 adds 1 to every
    /// value before each of --rounds rounds, so after `finish` every rank must hold
    /// (sum of the initial values + rounds) / N, and the weights must sum to N.
    #[arg(long)]
    push_sum: bool,
    /// Transfer probe instead of the runs above (exactly 2 ranks): where the time of a
    /// NOTIFY-ACK message of --len f32s goes, against raw put + flush variants, all in this one
    /// run, with wall and CPU time (CPU time holds up on a loaded machine). Prints one line per
    /// variant and cycle; see docs/asap.md.
    #[arg(long)]
    probe: bool,
    /// With --probe: cycles through all variants this many times (variants interleaved, so a
    /// change of machine load shows up in every variant alike).
    #[arg(long, default_value_t = 3)]
    probe_cycles: u32,
}

fn parse_fault(s: &str) -> Result<(usize, u64), String> {
    let (r, k) = s.split_once(':').ok_or("expected RANK:ROUND, e.g. 1:3")?;
    Ok((r.parse().map_err(|e| format!("bad rank '{r}': {e}"))?, k.parse().map_err(|e| format!("bad round '{k}': {e}"))?))
}

/// In-neighbour lists of every rank.
fn graph(kind: GraphKind, n: usize) -> Vec<Vec<usize>> {
    let mut ins = vec![Vec::new(); n];
    let mut edge = |from: usize, to: usize| {
        if from != to && !ins[to].contains(&from) {
            ins[to].push(from);
        }
    };
    match kind {
        GraphKind::Ring => (0..n).for_each(|i| edge(i, (i + 1) % n)),
        GraphKind::Expander => {
            let s = (n as f64).sqrt().floor() as usize;
            for i in 0..n {
                edge(i, (i + 1) % n);
                edge(i, (i + s) % n);
            }
        }
        GraphKind::Complete => (0..n).for_each(|i| (0..n).for_each(|j| edge(j, i))),
        GraphKind::All => unreachable!("expanded by the caller"),
    }
    for l in &mut ins {
        l.sort_unstable();
    }
    ins
}

fn initial(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|k| rank as f32 + (k % 3) as f32).collect()
}

fn fail(msg: String) -> ! {
    abort_job(&format!("rma-check: MISMATCH: {msg}"), 1)
}

/// Checks every Window operation against values each rank can predict.
fn window_selftest(world: &SimpleCommunicator) -> Result<(), String> {
    let n = world.size() as usize;
    let me = world.rank() as usize;
    let win = Window::allocate(world, 40).map_err(|e| e.to_string())?;
    let e = |e: asap_train::comm::window::RmaError| e.to_string();
    let next = ((me + 1) % n) as i32;
    win.fetch_add_u64(0, 0, 1).map_err(e)?;
    win.put(next, 8, &[me as u64 + 100]).map_err(e)?;
    win.accumulate(0, 16, &[(me + 1) as f64], RmaOp::Sum).map_err(e)?;
    let old = win.compare_and_swap_u64(0, 24, 0, me as u64 + 1).map_err(e)?;
    win.accumulate(next, 32, &[7.5f32, me as f32], RmaOp::Replace).map_err(e)?;
    win.flush_all().map_err(e)?;
    world.barrier();
    win.sync().map_err(e)?;
    let prev = (me + n - 1) % n;
    if win.load_u64(8) != prev as u64 + 100 {
        return Err(format!("put: found {} expected {}", win.load_u64(8), prev + 100));
    }
    let mut f = [0f32; 2];
    win.read_local(32, &mut f);
    if f != [7.5, prev as f32] {
        return Err(format!("accumulate(replace): found {f:?}"));
    }
    let count = win.atomic_read_u64(0, 0).map_err(e)?;
    if count != n as u64 {
        return Err(format!("fetch_add/no-op read: counter {count}, expected {n}"));
    }
    let mut sum = [0f64];
    win.get(0, 16, &mut sum).map_err(e)?;
    if sum[0] != (n * (n + 1) / 2) as f64 {
        return Err(format!("accumulate(sum)/get: {} expected {}", sum[0], n * (n + 1) / 2));
    }
    let winners_local = u64::from(old == 0);
    let mut winners = 0u64;
    world.all_reduce_into(&winners_local, &mut winners, SystemOperation::sum());
    let cas = win.atomic_read_u64(0, 24).map_err(e)?;
    if winners != 1 || cas == 0 || cas > n as u64 {
        return Err(format!("compare_and_swap: {winners} winners, value {cas}"));
    }
    win.store_u64(0, 0); // local store, then sync and barrier before anyone reads it
    win.sync().map_err(e)?;
    world.barrier();
    Ok(())
}

/// Checks the library's reductions at the edges of their types and `agree` with one failing
/// rank, against values every rank can predict (MPICH 4.0.2 gets MIN/MAX of unsigned types wrong;
/// `collectives` must not).
fn collectives_selftest(world: &SimpleCommunicator) -> Result<(), String> {
    use asap_train::comm::collectives::{agree, max_u64, min_u64, sum_u64};
    let n = world.size() as u64;
    let me = world.rank() as u64;
    let last = n - 1;
    // The last rank holds the extreme that decides each result (the only one at n = 1).
    let edge = |low: u64, high: u64| if me == last { low } else { high };
    for (got, want, what) in [
        (min_u64(world, edge(0, u64::MAX)), 0, "min(0, u64::MAX)"),
        (min_u64(world, edge(5, 1 << 63)), 5, "min(5, 2^63)"),
        (max_u64(world, edge(u64::MAX, 1)), u64::MAX, "max(u64::MAX, 1)"),
        (max_u64(world, edge(1 << 63, (1 << 63) - 1)), 1 << 63, "max(2^63, 2^63 - 1)"),
        (sum_u64(world, me), n * (n - 1) / 2, "sum of ranks"),
    ] {
        if got != want {
            return Err(format!("{what} over {n} ranks gave {got}, expected {want}"));
        }
    }
    // The last rank fails: every rank must get an error, and the others must name that rank.
    let r = agree(world, if me == last { Err(anyhow::anyhow!("injected failure (expected)")) } else { Ok(()) });
    match r {
        Ok(()) => return Err(format!("agree: rank {me} saw no failure though rank {last} failed")),
        Err(e) if me != last && !e.to_string().contains(&format!("rank {last} ")) => {
            return Err(format!("agree: rank {me} got {e:#}, expected rank {last} named"))
        }
        Err(_) => {}
    }
    ring_sum_selftest(world)
}

/// `ring_sum_f32` against sums computed here: small integers, which f32 adds exactly in any
/// order, so every rank must hold exactly these values; lengths around the rank count (empty and
/// uneven n-ths) and one of several MB; once as it is, once under an armed deadline (polled).
fn ring_sum_selftest(world: &SimpleCommunicator) -> Result<(), String> {
    use asap_train::comm::{collectives, deadline};
    let (n, me) = (world.size() as usize, world.rank() as usize);
    let value = |r: usize, i: usize| ((r * 7 + i * 3) % 11) as f32;
    if collectives::host_count(world) != 1 {
        return Err("host_count: the ranks of one mpirun on this machine span more than one host".into());
    }
    for armed in [false, true] {
        if armed {
            deadline::arm(world, Duration::from_secs(60)).map_err(|e| format!("deadline::arm: {e}"))?;
        }
        for len in [0, 1, n.saturating_sub(1), n + 1, 1001, (1 << 20) + 3] {
            let mut v: Vec<f32> = (0..len).map(|i| value(me, i)).collect();
            collectives::ring_sum_f32(world, &mut v, &mut Vec::new());
            if let Some(i) = (0..len).find(|&i| v[i] != (0..n).map(|r| value(r, i)).sum::<f32>()) {
                return Err(format!("ring_sum_f32 of {len} values over {n} ranks (deadline armed: {armed}): value {i} is {}", v[i]));
            }
        }
        if armed {
            deadline::disarm();
        }
    }
    Ok(())
}

/// Summary of one (graph, mode) run.
struct RunReport {
    latency_us: f64,
    histogram: Vec<u64>,
    torn: u64,
    stale: u64,
    distance: f64,
    final_value: f32,
    comm_s: f64,
    /// Slowest rank's mean microseconds per message put (data, flush, NOTIFY).
    transfer_us: f64,
    wait_s: f64,
    bytes_sent: u64,
}

/// The transport's own speed, measured in the same run as the reduces: every rank puts `len`
/// f32s into the next rank's window and flushes, `rounds` times (after one warm-up); returns the
/// slowest rank's mean microseconds per put + flush. With `receiver_reads`, the ranks meet after
/// every put and each sums what it was sent (untimed) before the next put, as a receiver that
/// uses the data does: then the put's destination is in the receiver's cache, not the sender's
/// (docs/asap.md, NOTIFY-ACK step 3).
fn raw_put_flush_us(world: &SimpleCommunicator, len: usize, rounds: u64, receiver_reads: bool) -> anyhow::Result<f64> {
    let n = world.size();
    let win = Window::allocate(world, 4 * len.max(1))?;
    let data = vec![1f32; len];
    let next = (world.rank() + 1) % n;
    win.put(next, 0, &data)?;
    win.flush(next)?;
    world.barrier();
    let mut timed = 0.0;
    for _ in 0..rounds.max(1) {
        let start = Instant::now();
        win.put(next, 0, &data)?;
        win.flush(next)?;
        timed += start.elapsed().as_secs_f64();
        if receiver_reads {
            world.barrier();
            win.sync()?;
            let sum: f32 = win.quiescent_local(0, len, |x: &[f32]| x.iter().sum());
            std::hint::black_box(sum);
            world.barrier();
        }
    }
    let us = timed / rounds.max(1) as f64 * 1e6;
    world.barrier();
    Ok(all_max(world, us))
}

/// Plain NOTIFY-ACK on `in_neighbours` with this run's timeout: what the special checks start from.
fn check_config(in_neighbours: Vec<Vec<usize>>, args: &Args) -> AsapConfig {
    AsapConfig {
        in_neighbours,
        notify: NotifyMode::NotifyAck,
        wait_timeout: Duration::from_millis(args.wait_timeout_ms),
        stop_sending_after: None,
        staleness: 0,
        one_peer: false,
        overlap: false,
        deadline: std::time::Duration::ZERO,
    }
}

/// `--push-sum`: returns the largest deviation of any final value from the mass-conservation
/// prediction.
fn run_push_sum(world: &SimpleCommunicator, args: &Args) -> anyhow::Result<f64> {
    let n = world.size() as usize;
    let me = world.rank() as usize;
    let cfg = AsapConfig { notify: NotifyMode::PushSum, ..check_config(graph(GraphKind::Expander, n), args) };
    let mut sr = StochasticReduce::new(world, cfg, args.len)?;
    let mut params = initial(me, args.len);
    for round in 1..=args.rounds {
        if me == 0 {
            params.iter_mut().for_each(|p| *p += 1.0);
        }
        sr.sync(&mut params, round)?;
        if args.slow_rank_us > 0 && me == 0 {
            std::thread::sleep(Duration::from_micros(args.slow_rank_us));
        }
    }
    sr.finish(&mut params)?;
    // The prediction from the inputs alone: mean over ranks of r + (k mod 3), plus rounds / N.
    let want = |k: usize| (n - 1) as f64 / 2.0 + (k % 3) as f64 + args.rounds as f64 / n as f64;
    let worst = params.iter().enumerate().map(|(k, &v)| (v as f64 - want(k)).abs()).fold(0.0, f64::max);
    Ok(all_max(world, worst))
}

/// `--one-peer`: every rank must hold the exact global mean after each period of log2 N rounds.
fn run_one_peer(world: &SimpleCommunicator, args: &Args) -> anyhow::Result<u64> {
    let n = world.size() as usize;
    let me = world.rank() as usize;
    if !n.is_power_of_two() || n < 2 {
        anyhow::bail!("--one-peer needs a power of two ranks >= 2, got {n}");
    }
    let tau = n.trailing_zeros() as u64;
    // Our own formula for the period's edges: i hears from i - 2^k.
    let ins = (0..n).map(|i| (0..tau).map(|k| (i + n - (1 << k)) % n).collect()).collect();
    let cfg = AsapConfig { one_peer: true, ..check_config(ins, args) };
    let mut sr = StochasticReduce::new(world, cfg, args.len)?;
    let mut params = initial(me, args.len);
    let mean = |k: usize| (n - 1) as f32 / 2.0 + (k % 3) as f32;
    let mut periods = 0;
    for round in 1..=args.rounds {
        sr.sync(&mut params, round)?;
        if round % tau == 0 {
            if let Some((k, v)) = params.iter().enumerate().find(|&(k, &v)| v != mean(k)) {
                fail(format!("rank {me} round {round}: value {k} is {v}, not the global mean {}", mean(k)));
            }
            periods += 1;
        }
    }
    sr.finish(&mut params)?;
    Ok(periods)
}

/// `--staleness S`: ring NOTIFY-ACK with payload = round number; returns the largest staleness
/// any reduce of any rank used, measured from the values.
fn run_staleness(world: &SimpleCommunicator, s: u64, args: &Args) -> anyhow::Result<u64> {
    let n = world.size() as usize;
    let me = world.rank() as usize;
    let cfg = AsapConfig { staleness: s, ..check_config(graph(GraphKind::Ring, n), args) };
    let mut sr = StochasticReduce::new(world, cfg, args.len)?;
    let mut params = vec![0f32; args.len];
    let mut worst = 0u64;
    for round in 1..=args.rounds {
        if me == 0 && args.slow_rank_us > 0 {
            std::thread::sleep(Duration::from_micros(args.slow_rank_us));
        }
        params.iter_mut().for_each(|p| *p = round as f32);
        sr.sync(&mut params, round)?;
        // Ring: (own round + the in-neighbour's message round) / 2.
        let theirs = 2.0 * params[0] as f64 - round as f64;
        if theirs.fract() != 0.0 || theirs < 1.0 || params.iter().any(|&p| p != params[0]) {
            fail(format!("rank {me} round {round}: reduced value {} is no average of two whole rounds", params[0]));
        }
        let age = round.saturating_sub(theirs as u64);
        // Newer messages are fine (a sender may run ahead, by at most S per hop of the graph).
        if age > s {
            fail(format!("rank {me} round {round}: used the message of round {theirs}, older than --staleness {s}"));
        }
        worst = worst.max(age);
    }
    sr.finish(&mut params)?;
    Ok(all_max(world, worst as f64) as u64)
}

fn all_max(world: &SimpleCommunicator, x: f64) -> f64 {
    let mut out = 0f64;
    world.all_reduce_into(&x, &mut out, SystemOperation::max());
    out
}

/// What NOTIFY-ACK's first round must give rank `me` bit for bit: the same arithmetic as the
/// reduce (self, then in-neighbours in ascending order) on the initial values.
fn first_round_average(me: usize, ins: &[Vec<usize>], len: usize) -> Vec<f32> {
    let mut want = initial(me, len);
    for &j in &ins[me] {
        for (w, x) in want.iter_mut().zip(initial(j, len)) {
            *w += x;
        }
    }
    for w in &mut want {
        *w /= (1 + ins[me].len()) as f32;
    }
    want
}

/// The consistency histograms summed over ranks (index = consistent inputs used), then the torn
/// and the stale reads at indices n and n + 1.
fn summed_histogram(world: &SimpleCommunicator, sr: &StochasticReduce) -> Vec<u64> {
    let n = world.size() as usize;
    let mut local = vec![0u64; n + 2];
    for (i, c) in sr.consistency_histogram().iter().enumerate() {
        local[i] = *c;
    }
    local[n] = sr.torn();
    local[n + 1] = sr.stale();
    let mut total = vec![0u64; n + 2];
    world.all_reduce_into(&local[..], &mut total[..], SystemOperation::sum());
    total
}

fn run(world: &SimpleCommunicator, kind: GraphKind, mode: NotifyMode, args: &Args) -> anyhow::Result<RunReport> {
    let n = world.size() as usize;
    let me = world.rank() as usize;
    let ins = graph(kind, n);
    let cfg = AsapConfig {
        in_neighbours: ins.clone(),
        notify: mode,
        wait_timeout: Duration::from_millis(args.wait_timeout_ms),
        stop_sending_after: args.stop_sending,
        staleness: 0,
        one_peer: false,
        overlap: false,
        deadline: std::time::Duration::ZERO,
    };
    let mut sr = StochasticReduce::new(world, cfg, args.len)?;
    let mut params = initial(me, args.len);
    let (lo, hi) = (0.0f32, (n - 1) as f32 + 2.0);
    world.barrier();
    let start = Instant::now();
    for round in 1..=args.rounds {
        sr.sync(&mut params, round)?;
        if round == 1 && mode == NotifyMode::NotifyAck {
            let want = first_round_average(me, &ins, args.len);
            if params != want {
                fail(format!(
                    "rank {me} {kind:?} notify-ack round 1: got {:?}, expected {:?}",
                    &params[..params.len().min(4)],
                    &want[..want.len().min(4)]
                ));
            }
        }
        if let Some(bad) = params.iter().find(|v| !(lo..=hi).contains(*v)) {
            fail(format!("rank {me} {kind:?} {mode:?} round {round}: {bad} outside [{lo}, {hi}]"));
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Distance to the global mean of the initial values (mean rank + (k mod 3)).
    let mean_rank = (n - 1) as f64 / 2.0;
    let distance = params.iter().enumerate().map(|(k, v)| (*v as f64 - mean_rank - (k % 3) as f64).abs()).fold(0.0, f64::max);
    let distance = all_max(world, distance);
    if mode == NotifyMode::NotifyAck {
        let d = ins[me].len();
        let h = sr.consistency_histogram();
        if h[d] != args.rounds || sr.torn() != 0 || sr.stale() != 0 {
            fail(format!("rank {me} notify-ack did not use all {d} inputs every round: {h:?}"));
        }
    }
    sr.finish(&mut params)?;
    // Every rank must now hold the same model.
    let (mut vmax, mut vmin) = (0f32, 0f32);
    world.all_reduce_into(&params[0], &mut vmax, SystemOperation::max());
    world.all_reduce_into(&params[0], &mut vmin, SystemOperation::min());
    if vmax != vmin {
        fail(format!("after finish ranks differ: {vmin} .. {vmax}"));
    }
    if mode == NotifyMode::NotifyAck && ((params[0] as f64) - mean_rank).abs() > 1e-4 {
        fail(format!("notify-ack final average {} is not the global mean {mean_rank}", params[0]));
    }
    if let Some(tol) = args.expect_converge {
        if distance > tol {
            fail(format!("{kind:?} {mode:?}: after {} rounds distance {distance} > {tol}", args.rounds));
        }
    }
    let stats = sr.stats().clone();
    if stats.rounds != args.rounds {
        fail(format!("stats count {} rounds, ran {}", stats.rounds, args.rounds));
    }
    let total = summed_histogram(world, &sr);
    let max_in = all_max(world, ins[me].len() as f64) as usize;
    Ok(RunReport {
        latency_us: all_max(world, elapsed) / args.rounds.max(1) as f64 * 1e6,
        histogram: total[..=max_in].to_vec(),
        torn: total[n],
        stale: total[n + 1],
        distance,
        final_value: params[0],
        comm_s: all_max(world, stats.comm_seconds),
        transfer_us: all_max(world, sr.transfer_seconds()) / (args.rounds.max(1) * ins[me].len().max(1) as u64) as f64 * 1e6,
        wait_s: all_max(world, stats.wait_seconds),
        bytes_sent: all_max(world, stats.bytes_sent as f64) as u64,
    })
}

fn main() {
    let args = Args::parse();
    let universe = match init() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("rma-check: {e:#}");
            std::process::exit(2);
        }
    };
    let world = universe.world();
    let n = world.size();
    if let Err(msg) = window_selftest(&world) {
        fail(format!("window self-test: {msg}"));
    }
    if let Err(msg) = collectives_selftest(&world) {
        fail(format!("collectives self-test: {msg}"));
    }
    if world.rank() == 0 {
        println!("rma-check: window and collectives self-tests ok (n={n})");
    }
    if args.push_sum {
        match run_push_sum(&world, &args) {
            // f32 values of size up to n + rounds / n: a few ulps of that, far below one share.
            Ok(dev) if dev > 1e-5 * (n as f64 + args.rounds as f64 / n as f64) => {
                abort_job(&format!("rma-check: push-sum lost or duplicated mass: final values off by {dev:.3e}"), 3)
            }
            Ok(dev) if world.rank() == 0 => println!("rma-check: ok push-sum n={n} rounds={} max_deviation={dev:.3e}", args.rounds),
            Ok(_) => {}
            Err(e) => abort_job(&format!("rma-check: error: {e:#}"), 3),
        }
        return;
    }
    if args.probe {
        if let Err(e) = probe::run(&world, &args) {
            abort_job(&format!("rma-check: probe: {e:#}"), 3);
        }
        return;
    }
    if args.one_peer {
        match run_one_peer(&world, &args) {
            Ok(periods) if world.rank() == 0 => {
                println!("rma-check: ok one-peer n={n} rounds={} exact_mean_after_each_of={periods}_periods", args.rounds)
            }
            Ok(_) => {}
            Err(e) => abort_job(&format!("rma-check: error: {e:#}"), 3),
        }
        return;
    }
    if let Some(s) = args.staleness {
        match run_staleness(&world, s, &args) {
            Ok(worst) if world.rank() == 0 => println!(
                "rma-check: ok staleness={s} n={n} rounds={} slow_rank_us={} max_staleness_seen={worst}",
                args.rounds, args.slow_rank_us
            ),
            Ok(_) => {}
            Err(e) => abort_job(&format!("rma-check: error: {e:#}"), 3),
        }
        return;
    }
    let graphs = match args.graph {
        GraphKind::All => vec![GraphKind::Ring, GraphKind::Expander, GraphKind::Complete],
        g => vec![g],
    };
    let modes = match args.notify {
        ModeChoice::All => vec![NotifyMode::NotifyAck, NotifyMode::Barrier, NotifyMode::None],
        ModeChoice::NotifyAck => vec![NotifyMode::NotifyAck],
        ModeChoice::Barrier => vec![NotifyMode::Barrier],
        ModeChoice::None => vec![NotifyMode::None],
    };
    let (raw_us, read_us) = match raw_put_flush_us(&world, args.len, args.rounds, false)
        .and_then(|raw| Ok((raw, raw_put_flush_us(&world, args.len, args.rounds, true)?)))
    {
        Ok(us) => us,
        Err(e) => abort_job(&format!("rma-check: raw put baseline: {e:#}"), 3),
    };
    if world.rank() == 0 && n > 1 {
        println!(
            "rma-check: raw put+flush of len={} to the next rank: {raw_us:.1} us ({:.0} MB/s); \
             with the receiver reading its window between puts: {read_us:.1} us ({:.0} MB/s)",
            args.len,
            4.0 * args.len as f64 / raw_us,
            4.0 * args.len as f64 / read_us
        );
    }
    for &g in &graphs {
        for &m in &modes {
            match run(&world, g, m, &args) {
                Ok(r) if world.rank() == 0 => println!(
                    "rma-check: ok graph={g:?} n={n} notify={m:?} rounds={} len={} \
                     round_latency_us={:.1} transfer_us={:.1} transfer_vs_raw_put={:.2} transfer_vs_read_put={:.2} consistency_histogram={:?} torn={} stale={} \
                     distance_before_finish={:.3e} final={} max_comm_s={:.4} max_wait_s={:.4} \
                     max_bytes_sent={}",
                    args.rounds,
                    args.len,
                    r.latency_us,
                    r.transfer_us,
                    raw_us / r.transfer_us,
                    read_us / r.transfer_us,
                    r.histogram,
                    r.torn,
                    r.stale,
                    r.distance,
                    r.final_value,
                    r.comm_s,
                    r.wait_s,
                    r.bytes_sent
                ),
                Ok(_) => {}
                Err(e) => abort_job(&format!("rma-check: error: {e:#}"), 3),
            }
        }
    }
    if args.stop_sending.is_some() {
        abort_job("rma-check: fault injected but no wait timeout happened", 4);
    }
}

/// `--probe`: where the time of a large NOTIFY-ACK transfer goes (docs/asap.md, NOTIFY-ACK step 3).
mod probe {
    use super::*;
    use asap_train::comm::thread_cpu_seconds;
    use std::hint::black_box;

    /// Bytes written (one per cache line) between two puts of the cold variant: twice this
    /// machine's 32 MiB L3, so neither the put's source nor its destination is still cached.
    const EVICT_BYTES: usize = 64 << 20;

    /// Wall and CPU time of one part, summed over a variant's puts.
    #[derive(Default, Clone, Copy)]
    struct Clock {
        wall: f64,
        cpu: f64,
    }

    impl Clock {
        fn time<R>(&mut self, f: impl FnOnce() -> R) -> R {
            let (w, c) = (Instant::now(), thread_cpu_seconds());
            let r = f();
            self.cpu += thread_cpu_seconds() - c;
            self.wall += w.elapsed().as_secs_f64();
            r
        }
    }

    /// One variant's sums; reported per put in microseconds, the slowest rank's.
    #[derive(Default, Clone, Copy)]
    struct Times {
        /// The transfer: put + flush (raw) or `Mailboxes::send_to` (header, payload and footer
        /// puts, flush, NOTIFY).
        transfer: Clock,
        /// Of the mailbox transfer: puts (each MPI_Put + MPI_Win_flush_local), flush, NOTIFY.
        parts: [f64; 3],
        /// The receiver's reduce (mailbox variants).
        reduce: Clock,
        /// Whole rounds (mailbox variants: ACK waits, send, NOTIFY waits, reduce, ACKs).
        round_wall: f64,
        puts: u64,
        rounds: u64,
    }

    fn evict(scratch: &mut [u8]) {
        for line in scratch.chunks_mut(64) {
            line[0] = line[0].wrapping_add(1);
        }
        black_box(&scratch[0]);
    }

    fn report(world: &SimpleCommunicator, name: &str, cycle: u32, len: usize, t: Times) {
        let per_put = |x: f64| all_max(world, x / t.puts.max(1) as f64 * 1e6);
        let per_round = |x: f64| all_max(world, x / t.rounds.max(1) as f64 * 1e6);
        let (wall, cpu) = (per_put(t.transfer.wall), per_put(t.transfer.cpu));
        let parts = t.parts.map(per_put);
        let (rw, rc) = (per_round(t.reduce.wall), per_round(t.reduce.cpu));
        let round = per_round(t.round_wall);
        if world.rank() == 0 {
            println!(
                "rma-check: probe cycle={cycle} len={len} {name:<22} transfer_us={wall:.1} cpu_us={cpu:.1} \
                 GB_per_s={:.1} put/flush/notify_us={:.1}/{:.1}/{:.1} reduce_us={rw:.1} reduce_cpu_us={rc:.1} round_us={round:.1}",
                4.0 * len as f64 / wall / 1e3,
                parts[0],
                parts[1],
                parts[2]
            );
        }
    }

    /// When the ranks of a raw variant put.
    #[derive(Clone, Copy, PartialEq)]
    enum Pattern {
        /// Every rank puts to the next one and flushes, again and again, without waiting.
        Free,
        /// All ranks meet in a barrier before every put, so all puts start together.
        Together,
        /// Only rank 0 puts (to rank 1); the others wait in a barrier after every put.
        OneWay,
        /// Rank 0 puts to rank 1, then (after a barrier) rank 1 to rank 0, and so on: a put never
        /// shares the machine with another.
        Alternate,
    }

    /// What a raw variant runs between its timed puts (see `raw`).
    type Between<'a> = &'a mut dyn FnMut(&Window, &mut [f32]);

    /// Puts `data` at offset 0 of the next rank's window and flushes, `rounds` times, in
    /// `pattern`. With `between`, the ranks meet in a barrier after every put, run `between`
    /// (untimed: a peer's put is complete by then), and meet again.
    fn raw(
        world: &SimpleCommunicator,
        win: &Window,
        data: &mut [f32],
        rounds: u64,
        pattern: Pattern,
        mut between: Option<Between>,
    ) -> anyhow::Result<Times> {
        let (me, n) = (world.rank(), world.size());
        let next = (me + 1) % n;
        let mut t = Times { rounds, ..Times::default() };
        world.barrier();
        for k in 0..rounds {
            let turns: &[bool] = match pattern {
                Pattern::Free => &[true],
                Pattern::Together => {
                    world.barrier();
                    &[true]
                }
                Pattern::OneWay => &[me == 0],
                Pattern::Alternate => {
                    if (k % 2 == 0) == (me == 0) {
                        &[true, false]
                    } else {
                        &[false, true]
                    }
                }
            };
            for &mine in turns {
                if mine {
                    t.transfer.time(|| -> anyhow::Result<()> {
                        win.put(next, 0, data)?;
                        Ok(win.flush(next)?)
                    })?;
                    t.puts += 1;
                }
                if pattern != Pattern::Free && pattern != Pattern::Together {
                    world.barrier();
                }
            }
            if let Some(f) = between.as_mut() {
                world.barrier();
                win.sync()?;
                f(win, data);
                world.barrier();
            }
        }
        world.barrier();
        t.round_wall = t.transfer.wall;
        Ok(t)
    }

    /// Rank 0 puts `data` to rank 1 and flushes, `rounds` times, while rank 1 repeats the
    /// library's reduce traffic for one in-neighbour on its own 3 x len f32s (acc <- params,
    /// acc += slot, params <- acc / 2) until rank 0 says stop in the window's last word.
    fn one_way_peer_sums(world: &SimpleCommunicator, win: &Window, data: &[f32], rounds: u64) -> anyhow::Result<Times> {
        let len = data.len();
        let flag = 4 * len.div_ceil(2) * 2;
        let mut t = Times { rounds, ..Times::default() };
        world.barrier();
        match world.rank() {
            0 => {
                for _ in 0..rounds {
                    t.transfer.time(|| -> anyhow::Result<()> {
                        win.put(1, 0, data)?;
                        Ok(win.flush(1)?)
                    })?;
                    t.puts += 1;
                }
                win.put(1, flag, &[1u64])?;
                win.flush(1)?;
            }
            1 => {
                let (mut params, mut acc, slot) = (vec![1f32; len], vec![0f32; len], vec![2f32; len]);
                loop {
                    // MPICH (ch4:ucx) completes rank 0's puts here only while this rank calls
                    // into MPI: without the probe the job hung.
                    win.progress()?;
                    win.sync()?;
                    if win.load_u64(flag) != 0 {
                        break;
                    }
                    acc.copy_from_slice(&params);
                    for (a, x) in acc.iter_mut().zip(&slot) {
                        *a += *x;
                    }
                    for (p, a) in params.iter_mut().zip(&acc) {
                        *p = *a / 2.0;
                    }
                    black_box(&params[0]);
                    t.rounds += 1;
                }
                win.store_u64(flag, 0);
                win.sync()?;
            }
            _ => {}
        }
        world.barrier();
        t.round_wall = t.transfer.wall;
        Ok(t)
    }

    /// Sums the `len` f32s at the start of the local window in place (the receiver reading what
    /// it was sent, as a reduce does).
    fn read_window(win: &Window, len: usize) {
        let s: f32 = win.quiescent_local(0, len, |x: &[f32]| x.iter().sum());
        black_box(s);
    }

    /// How a mailbox variant's receiver reduces.
    #[derive(Clone, Copy, PartialEq)]
    enum Reduce {
        /// Through an accumulator, as `StochasticReduce` did until it reduced in place: acc <-
        /// params, acc += slots (read in the window), params <- acc / (1 + d).
        Accumulator,
        /// ACK at once, never read the slot (not a protocol: the transfer without a reader).
        Skip,
        /// params += slots in place, then params /= 1 + d: no accumulator (as `StochasticReduce`).
        InPlace,
    }

    /// NOTIFY-ACK on the library's mailboxes over `ins`, `rounds` rounds.
    fn mailbox(
        world: &SimpleCommunicator,
        ins: &[Vec<usize>],
        len: usize,
        rounds: u64,
        reduce: Reduce,
        timeout: Duration,
    ) -> anyhow::Result<Times> {
        let mut mail = Mailboxes::new(world, ins, len)?;
        let me = world.rank() as usize;
        let mut params = initial(me, len);
        let mut acc = vec![0f32; len];
        let (d, outs) = (mail.in_neighbours().len(), mail.out_neighbours().len());
        let mut t = Times { puts: rounds * outs as u64, rounds, ..Times::default() };
        world.barrier();
        let start = Instant::now();
        for round in 1..=rounds {
            for j in 0..outs {
                mail.wait_ack(j, round, timeout)?;
                t.transfer.time(|| mail.send_to(j, round, &params))?;
            }
            mail.wait_notifications(round, timeout)?;
            if reduce != Reduce::Skip {
                t.reduce.time(|| -> anyhow::Result<()> {
                    let target: &mut [f32] = if reduce == Reduce::Accumulator {
                        acc.copy_from_slice(&params);
                        &mut acc
                    } else {
                        &mut params
                    };
                    for i in 0..d {
                        let read = mail.add_notified_slot(i, target)?;
                        if read != SlotRead::Consistent(round) {
                            anyhow::bail!("rank {me} round {round}: slot {i} was {read:?} after its NOTIFY");
                        }
                    }
                    let denom = (1 + d) as f32;
                    if reduce == Reduce::Accumulator {
                        for (p, a) in params.iter_mut().zip(&acc) {
                            *p = *a / denom;
                        }
                    } else {
                        params.iter_mut().for_each(|p| *p /= denom);
                    }
                    Ok(())
                })?;
            }
            for i in 0..d {
                mail.ack(i)?;
            }
        }
        t.round_wall = start.elapsed().as_secs_f64();
        mail.wait_acks(rounds, timeout)?;
        world.barrier();
        t.parts = mail.transfer_parts();
        Ok(t)
    }

    pub fn run(world: &SimpleCommunicator, args: &Args) -> anyhow::Result<()> {
        let n = world.size() as usize;
        if n != 2 {
            anyhow::bail!("--probe needs exactly 2 ranks, got {n}");
        }
        let (len, rounds) = (args.len.max(1), args.rounds.max(1));
        let timeout = Duration::from_millis(args.wait_timeout_ms);
        let ins = graph(GraphKind::Complete, n);
        let win = Window::allocate(world, 4 * len.div_ceil(2) * 2 + 8)?;
        let mut data = vec![1f32; len];
        let mut scratch = vec![0u8; EVICT_BYTES];
        // Warm-up: first touch of both windows and the data.
        raw(world, &win, &mut data, 2, Pattern::Free, None)?;
        for cycle in 1..=args.probe_cycles {
            for (name, pattern) in [
                ("raw", Pattern::Free),
                ("raw-together", Pattern::Together),
                ("raw-one-way", Pattern::OneWay),
                ("raw-alternate", Pattern::Alternate),
            ] {
                report(world, name, cycle, len, raw(world, &win, &mut data, rounds, pattern, None)?);
            }
            report(world, "raw-one-way-peer-sums", cycle, len, one_way_peer_sums(world, &win, &data, rounds)?);
            let mut cold = |_: &Window, _: &mut [f32]| evict(&mut scratch);
            report(world, "raw-together-cold", cycle, len, raw(world, &win, &mut data, rounds, Pattern::Together, Some(&mut cold))?);
            let mut reads = |w: &Window, _: &mut [f32]| read_window(w, len);
            report(world, "raw-together-reads", cycle, len, raw(world, &win, &mut data, rounds, Pattern::Together, Some(&mut reads))?);
            report(world, "notify-ack-accumulator", cycle, len, mailbox(world, &ins, len, rounds, Reduce::Accumulator, timeout)?);
            report(world, "notify-ack-no-reduce", cycle, len, mailbox(world, &ins, len, rounds, Reduce::Skip, timeout)?);
            report(world, "notify-ack-in-place", cycle, len, mailbox(world, &ins, len, rounds, Reduce::InPlace, timeout)?);
        }
        Ok(())
    }
}
