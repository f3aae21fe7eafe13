//! The training driver of `--model lda`: collapsed Gibbs sampling on the parameter-server rows.
//! It does not fit the SGD step loop (no mini-batch loss, no step size, counts instead of a
//! gradient), so [`super::run`] hands LDA runs to it.
//!
//! - **Data**: every rank reads its own documents of a UCI docword file ([`crate::data::bow`]);
//!   a document stays on the rank that read it, with its assignments and document-topic counts.
//! - **Model**: the W x K word-topic counts, one row per word, as the flat `f32` vector the sync
//!   modes exchange (exact integers: checked below against 2^24; model/lda.rs says why the topic
//!   totals are column sums instead of a row).
//! - **Clock**: a sweep over the documents is `--clocks-per-sweep` clocks. Within a clock the
//!   rank samples mini-batches of `--batch-size` documents, calling the mode's read gate
//!   (`before_step`) before each; at the end, `sync` pushes the clock's count deltas (the
//!   replica minus what the servers last sent).
//! - **Modes**: ssp and bosen (rank-hosted shards with `--apply plain`: servers add deltas),
//!   allreduce ([`crate::sync::delta_sum::DeltaSum`]: the deltas are summed each clock), gaia
//!   ([`crate::sync::gaia::Gaia::for_counts`]: summed in a group, significant cells between
//!   groups, residuals flushed at the end). asap, async and none average or keep apart
//!   replicas, which for counts means dividing or losing other ranks' tokens: refused.
//! - **Evaluation** (collective, after a consistent cut, excluded from training time): the exact
//!   global counts are the sum of every rank's recount of its own assignments; from them the
//!   training log-likelihood per token and the held-out perplexity by document completion.
//! - **End**: the servers' final model must equal that recount cell for cell (every token counted
//!   exactly once, no cell negative on any server); a mismatch is an error.

use std::time::Instant;

use anyhow::Context;
use mpi::topology::{Communicator, SimpleCommunicator};
use serde_json::json;

use super::eval::Evaluation;
use super::report::MetricsFile;
use super::Outcome;
use crate::comm::collectives::{self, agree};
use crate::config::{SyncKind, TrainConfig};
use crate::data::bow::{self, Corpus};
use crate::model::lda::{self, LocalState, Sampler};
use crate::model::lda_moves;
use crate::model::RowLayout;
use crate::rng::Rng;
use crate::sync::{SyncContext, SyncMode};

/// Largest count an f32 cell holds exactly (2^24).
const F32_EXACT: f64 = 16_777_216.0;
/// Gibbs sweeps over the first half of a held-out document to estimate its mix.
const COMPLETION_SWEEPS: usize = 20;

/// This rank's data.
struct Data {
    train: Corpus,
    test: Option<Corpus>,
    /// Rank 0 only, when the vocabulary file exists.
    vocab: Option<Vec<String>>,
    total_tokens: u64,
    total_test_tokens: u64,
}

fn read_agreed(path: &str, comm: &SimpleCommunicator) -> anyhow::Result<Corpus> {
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    let c = agree(comm, bow::read_docword(path, rank, n).map_err(anyhow::Error::from))?;
    let lines = collectives::sum_u64(comm, c.lines);
    anyhow::ensure!(
        lines == c.nnz_in_file,
        "{path}: the header says NNZ = {} lines but the file holds {lines} `docID wordID count` lines (fix line 3 of the file)",
        c.nnz_in_file
    );
    Ok(c)
}

/// Reads the training documents (and held-out ones: `--test-data`, or `--test-fraction` of the
/// documents chosen by a seeded hash of their id), and rank 0 the vocabulary.
fn load(cfg: &TrainConfig, comm: &SimpleCommunicator) -> anyhow::Result<Data> {
    let rank0 = comm.rank() == 0;
    anyhow::ensure!(
        cfg.format.is_none(),
        "--model lda reads UCI bag-of-words files (docword.txt: D, W, NNZ, then `docID wordID count`); drop --format"
    );
    let mut train = read_agreed(&cfg.data, comm)?;
    let mut test = match &cfg.test_data {
        Some(p) => {
            let t = read_agreed(p, comm)?;
            anyhow::ensure!(
                t.words == train.words,
                "{p}: W = {} words but the training file {} has W = {}: both must share one vocabulary",
                t.words,
                cfg.data,
                train.words
            );
            Some(t)
        }
        None => None,
    };
    if cfg.test_fraction > 0.0 && test.is_none() {
        let (f, seed) = (cfg.test_fraction, cfg.seed);
        let (keep, held) = train.split(|id| Rng::for_stream(seed ^ 0x6c64_6174, id).next_f64() < f);
        train = keep;
        test = Some(held);
    }
    let vocab_file = bow::vocab_path_for(&cfg.data).filter(|p| std::path::Path::new(p).exists());
    let vocab = agree(
        comm,
        match (&vocab_file, rank0) {
            (Some(p), true) => bow::read_vocab(p, train.words).map(Some).map_err(anyhow::Error::from),
            _ => Ok(None),
        },
    )?;
    // Every word-topic cell is at most its word's corpus count: below 2^24, f32 is exact.
    let mut freq = vec![0f64; train.words];
    train.tokens.iter().for_each(|&w| freq[w as usize] += 1.0);
    collectives::sum_f64(comm, &mut freq);
    let (top, &most) = freq.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).expect("W >= 1");
    anyhow::ensure!(
        most < F32_EXACT,
        "{}: word {} occurs {most} times; counts are exchanged as f32, exact only below 2^24 = 16777216: drop that word (a stop word) or split the corpus",
        cfg.data,
        top + 1
    );
    let total_tokens = collectives::sum_u64(comm, train.tokens.len() as u64);
    anyhow::ensure!(total_tokens > 0, "{}: no tokens to train on", cfg.data);
    let total_test_tokens = collectives::sum_u64(comm, test.as_ref().map_or(0, |t| t.tokens.len() as u64));
    Ok(Data { train, test, vocab, total_tokens, total_test_tokens })
}

/// The sync mode of an LDA run, as its declaration builds one for counts
/// ([`crate::sync::ModeSpec::build_counts`]), refusing the modes that cannot carry count deltas.
fn build_mode(cfg: &TrainConfig, ctx: &SyncContext, init: &[f32]) -> anyhow::Result<Box<dyn SyncMode>> {
    let Some(build) = cfg.sync.spec().build_counts else {
        anyhow::bail!(
            "--model lda runs under --sync {}, not {}: its model is integer counts, and {} would average replicas \
             (dividing every rank's tokens by the number of ranks) or keep them apart, which counts no token exactly once",
            SyncKind::names_where(|m| m.build_counts.is_some()),
            cfg.sync,
            cfg.sync
        );
    };
    build(ctx, &cfg.mode_run(), init)
}

/// Rank `rank`'s part of the held-out perplexity of `test` under the counts `nwk`, by document
/// completion: (log-likelihood of the scored tokens, tokens scored: the odd positions,
/// floor(len / 2) a document). `predict` scores a saved model with it, as a 1-rank run does.
pub fn completion_part(cfg: &TrainConfig, test: &Corpus, nwk: &[f64], rank: usize) -> (f64, u64) {
    let o = &cfg.lda;
    let mut rng = Rng::for_stream(cfg.seed ^ 0x7065_7270, rank as u64 + 1);
    let ll = lda::completion_log_likelihood(test, nwk, o.topics, o.alpha, o.beta, COMPLETION_SWEEPS, &mut rng).0;
    (ll, (0..test.len()).map(|d| test.doc(d).len() as u64 / 2).sum())
}

/// What an evaluation gives: (log-likelihood per training token, held-out perplexity or NaN).
/// Collective; `global` receives the exact global counts.
fn evaluate(cfg: &TrainConfig, comm: &SimpleCommunicator, data: &Data, state: &LocalState, global: &mut Vec<f64>) -> (f64, f64) {
    let o = &cfg.lda;
    global.clear();
    global.resize(data.train.words * o.topics, 0.0);
    state.word_topic(&data.train, global);
    collectives::sum_f64(comm, global);
    let mut parts = [lda::doc_log_likelihood(state, o.alpha), 0.0];
    let mut scored = 0;
    if let Some(t) = &data.test {
        (parts[1], scored) = completion_part(cfg, t, global, comm.rank() as usize);
    }
    collectives::sum_f64(comm, &mut parts);
    let ll = (lda::word_log_likelihood(global, o.topics, o.beta) + parts[0]) / data.total_tokens as f64;
    let scored = collectives::sum_u64(comm, scored);
    let ppl = if scored > 0 { (-parts[1] / scored as f64).exp() } else { f64::NAN };
    (ll, ppl)
}

/// Timers of this rank.
#[derive(Default)]
struct Timers {
    compute: f64,
    excluded: f64,
}

/// Options of the SGD loop that the LDA driver does not implement: refused, not ignored.
fn check_unsupported(cfg: &TrainConfig) -> anyhow::Result<()> {
    let unsupported = [
        ("--checkpoint-dir / --resume / --auto-resume", cfg.checkpoint_dir.is_some() || cfg.resume || cfg.auto_resume),
        ("--send-log", cfg.send_log.is_some()),
        ("--straggler", cfg.straggler.is_some()),
        ("--cluster / --balance", cfg.cluster.is_some() || cfg.balance),
        ("--stop-at-target", cfg.stop_at_target),
        ("--partition", cfg.partition != "iid"),
        ("--consensus-only", cfg.consensus_only),
        ("--target", cfg.target.is_some()),
    ];
    for (flag, given) in unsupported {
        anyhow::ensure!(!given, "{flag} is not implemented for --model lda (its driver, train/lda.rs, has no such phase): drop the option");
    }
    Ok(())
}

/// Runs LDA as configured. Collective: every rank calls it (from [`super::run`]).
pub fn run(plan: &super::plan::RunPlan, comm: &SimpleCommunicator, t_start: Instant) -> anyhow::Result<Outcome> {
    let cfg = &plan.cfg;
    let (rank, n) = (comm.rank() as usize, comm.size() as usize);
    check_unsupported(cfg)?;
    let data = load(cfg, comm)?;
    let load_seconds = t_start.elapsed().as_secs_f64();
    let (w, k) = (data.train.words, cfg.lda.topics);
    anyhow::ensure!((w as u128) * (k as u128) <= (isize::MAX as u128) / 8, "W x K = {w} x {k} counts do not fit in memory");
    let mut metrics = MetricsFile::open(cfg.metrics.as_deref(), rank == 0, false)?;
    let mut rng = Rng::for_stream(cfg.seed, rank as u64 + 1);
    let (mut params, mut state) = initialise(cfg, comm, &data.train, &mut rng);
    let ctx = plan.sync_context(comm, RowLayout::uniform(w, k), cfg.lda.clocks_per_sweep as u64)?;
    let mut mode = agree(comm, build_mode(cfg, &ctx, &params))?;
    let start = json!({"event": "start", "ranks": n, "model": "lda", "sync": mode.name(), "documents": collectives::sum_u64(comm, data.train.len() as u64),
                       "words": w, "topics": k, "tokens": data.total_tokens, "test_tokens": data.total_test_tokens, "config": cfg});
    metrics.write(&start)?;
    let mut sampler = Sampler::new(&cfg.lda, w);
    // --emulate-compute: every mini-batch of --batch-size documents lasts the declared time (the
    // sampling is real, the rest is slept), so a rank's clock costs what it would on a node of its
    // own whatever the load here (docs/emulation.md).
    let mut pacer = super::emulate::StepPacer::new(cfg.emulate_compute, super::schedule::StragglerPlan::none(n), rank, cfg.straggler_wait)
        .with_jitter(cfg.emulate_jitter.as_ref(), cfg.seed);
    if let (Some(ms), 0) = (cfg.emulate_compute, rank) {
        eprintln!("asap-train lda: emulated cluster: every mini-batch of {} documents takes {ms} ms", cfg.batch_size.max(1));
    }
    let mut global = Vec::new();
    let mut timers = Timers::default();
    let train_start = Instant::now();
    let cps = cfg.lda.clocks_per_sweep as u64;
    let total_rounds = cfg.max_rounds.map_or(cfg.epochs as u64 * cps, |m| m.min(cfg.epochs as u64 * cps));
    let eval_every = if cfg.eval_every == 0 { cps } else { cfg.eval_every as u64 };
    let mut last = (f64::NAN, f64::NAN);
    let mut moves = lda_moves::MoveCounts::default();
    for round in 1..=total_rounds {
        let part = ((round - 1) % cps) as usize;
        let docs = data.train.len() * part / cps as usize..data.train.len() * (part + 1) / cps as usize;
        sampler.set_alpha(lda::burn_in_alpha(&cfg.lda, ((round - 1) / cps) as usize));
        clock(cfg, &data.train, docs, round - 1, mode.as_mut(), &mut sampler, &mut state, &mut params, &mut rng, &mut timers, &mut pacer)?;
        mode.sync(&mut params, round)?;
        if round % cps == 0 && round / cps <= cfg.lda.split_merge as u64 && round < total_rounds {
            let t = Instant::now();
            let m = split_merge_phase(cfg, comm, &data.train, mode.as_mut(), &mut state, &mut params, &mut global, round)?;
            timers.compute += t.elapsed().as_secs_f64();
            metrics.write(&json!({"event": "split_merge", "round": round, "epoch": round / cps, "moves": m}))?;
            moves += m;
        }
        if round % eval_every == 0 || round == total_rounds {
            let t = Instant::now();
            mode.quiesce(&mut params, round)?;
            last = evaluate(cfg, comm, &data, &state, &mut global);
            timers.excluded += t.elapsed().as_secs_f64();
            let train_seconds =
                collectives::max_u64(comm, ((train_start.elapsed().as_secs_f64() - timers.excluded) * 1e6) as u64) as f64 / 1e6;
            metrics.write(&json!({"event": "eval", "round": round, "epoch": round as f64 / cps as f64, "train_seconds": train_seconds,
                                  "log_likelihood_per_token": last.0, "perplexity": last.1}))?;
            if rank == 0 {
                eprintln!("asap-train lda: round {round}, log-likelihood/token {:.4}, held-out perplexity {:.1}", last.0, last.1);
            }
        }
    }
    let train_seconds = train_start.elapsed().as_secs_f64() - timers.excluded;
    if global.is_empty() {
        // --max-rounds 0: the start is still checked and reported.
        last = evaluate(cfg, comm, &data, &state, &mut global);
    }
    mode.finish(&mut params)?;
    let exact = check_counts(comm, &params, &global)?;
    let mut summary = finish_summary(
        cfg,
        comm,
        &data,
        mode.as_ref(),
        &sampler,
        &timers,
        &global,
        (load_seconds, train_seconds, t_start),
        last,
        total_rounds,
        exact,
    )?;
    summary["split_merge"] = json!(moves);
    summary["sync_metrics"] = mode_numbers(comm, mode.as_ref());
    if cfg.emulate_compute.is_some() {
        let st = &pacer.stats;
        let local = [pacer.drift(), st.broken as f64 / st.steps.max(1) as f64, st.compute_overruns as f64];
        let (mean, max) = collectives::mean_max(comm, &local);
        summary["emulation"] = json!({"declared_ms": cfg.emulate_compute, "steps_per_rank": st.steps, "drift": {"mean": mean[0], "max": max[0]},
                                      "broken_fraction": {"mean": mean[1], "max": max[1]}, "compute_overruns": {"mean": mean[2], "max": max[2]}});
    }
    metrics.write(&summary)?;
    if rank == 0 {
        print_summary(&summary);
    }
    let saved = match (&cfg.save_model, rank == 0) {
        (Some(path), true) => save_model(path, &global, w, k, data.vocab.as_deref(), &serde_json::to_string(cfg)?, &summary.to_string()),
        _ => Ok(()),
    };
    agree(comm, saved)?;
    let final_eval = Evaluation { objective: -last.0, metric: last.1, train_metric: last.0, consensus_distance: 0.0 };
    Ok(Outcome { final_eval, rounds: total_rounds, train_seconds, time_to_target: None, preempted: false })
}

/// The common start, the same model on every rank: rank 0 assigns its documents sequentially
/// (see [`LocalState::sequential`]), every other rank then its own on top of rank 0's counts (one
/// broadcast: all ranks start from rank 0's topics instead of each making its own), and every
/// rank's own counts are summed (exact: every cell is below 2^24). `--lda-init random` draws
/// the assignments uniformly instead.
fn initialise(cfg: &TrainConfig, comm: &SimpleCommunicator, c: &Corpus, rng: &mut Rng) -> (Vec<f32>, LocalState) {
    let (w, k) = (c.words, cfg.lda.topics);
    let mut params = vec![0f32; w * k];
    let state = match cfg.lda.lda_init {
        lda::InitKind::Random => LocalState::random(c, k, rng, &mut params),
        lda::InitKind::Sequential => {
            let state = if comm.rank() == 0 {
                LocalState::sequential(c, &cfg.lda, &mut params)
            } else {
                LocalState { k, z: Vec::new(), ndk: Vec::new() }
            };
            collectives::broadcast_f32(comm, 0, &mut params);
            if comm.rank() == 0 {
                state
            } else {
                LocalState::sequential(c, &cfg.lda, &mut params)
            }
        }
    };
    let mut own = vec![0f64; w * k];
    state.word_topic(c, &mut own);
    params.iter_mut().zip(&own).for_each(|(p, &o)| *p = o as f32);
    collectives::sum_f32(comm, &mut params, &mut Vec::new());
    (params, state)
}

/// A split-merge phase (model/lda_moves.rs) after sweep `round / cps`: a consistent cut, the
/// exact global counts (every rank's recount summed), then the moves, which change this rank's
/// assignments and replica rows; the next `sync` pushes them as count deltas. Collective.
#[allow(clippy::too_many_arguments)]
fn split_merge_phase(
    cfg: &TrainConfig,
    comm: &SimpleCommunicator,
    c: &Corpus,
    mode: &mut dyn SyncMode,
    state: &mut LocalState,
    params: &mut [f32],
    global: &mut Vec<f64>,
    round: u64,
) -> anyhow::Result<lda_moves::MoveCounts> {
    mode.quiesce(params, round)?;
    global.clear();
    global.resize(c.words * cfg.lda.topics, 0.0);
    state.word_topic(c, global);
    collectives::sum_f64(comm, global);
    let mut shared = Rng::for_stream(cfg.seed ^ 0x7370_6c69, round);
    let mut local = Rng::for_stream(cfg.seed ^ 0x7370_6c69, (round << 16) + comm.rank() as u64 + 1);
    // Every rank decides every move from these sums: rank 0's result is broadcast, so that a sum
    // whose rounding differed between ranks could not make them decide differently.
    let mut sum = |v: &mut [f64]| {
        collectives::sum_f64(comm, v);
        collectives::broadcast(comm, 0, v);
    };
    let mut phase = lda_moves::Phase { corpus: c, opts: &cfg.lda, state, params, global, sum: &mut sum };
    let m = lda_moves::split_merge(&mut phase, &mut shared, &mut local);
    if comm.rank() == 0 {
        eprintln!(
            "asap-train lda: split-merge after sweep {}: {} of {} merges, {} of {} splits, {} of {} paired",
            round / cfg.lda.clocks_per_sweep as u64,
            m.merges,
            m.merges_proposed,
            m.splits,
            m.splits_proposed,
            m.swaps,
            m.swaps_proposed
        );
    }
    Ok(m)
}

/// One clock: sample the documents `docs` in mini-batches, each after the mode's read gate.
#[allow(clippy::too_many_arguments)]
fn clock(
    cfg: &TrainConfig,
    c: &Corpus,
    docs: std::ops::Range<usize>,
    clock: u64,
    mode: &mut dyn SyncMode,
    sampler: &mut Sampler,
    state: &mut LocalState,
    params: &mut [f32],
    rng: &mut Rng,
    timers: &mut Timers,
    pacer: &mut super::emulate::StepPacer,
) -> anyhow::Result<()> {
    let k = state.k;
    let batch = cfg.batch_size.max(1);
    let mut first = docs.start;
    loop {
        mode.before_step(params, clock)?;
        let t = Instant::now();
        if first == docs.start {
            sampler.begin_clock(params);
        }
        let end = (first + batch).min(docs.end);
        for d in first..end {
            let (a, b) = (c.doc_ptr[d], c.doc_ptr[d + 1]);
            sampler.sample_doc(&c.tokens[a..b], &mut state.z[a..b], &mut state.ndk[d * k..(d + 1) * k], params, rng);
        }
        let dt = t.elapsed().as_secs_f64();
        timers.compute += dt;
        pacer.after_step(t, dt, clock, 1.0);
        first = end;
        if first >= docs.end {
            return Ok(());
        }
    }
}

/// The servers' final model against the exact recount of every rank's assignments: equal cell
/// for cell (so no cell is negative and every token is counted once). Returns the tokens counted.
fn check_counts(comm: &SimpleCommunicator, model: &[f32], recount: &[f64]) -> anyhow::Result<u64> {
    let bad = model.iter().zip(recount).position(|(&m, &r)| m as f64 != r || m < 0.0);
    if let Some(i) = bad {
        anyhow::bail!(
            "rank {}: the servers' final word-topic count of cell {i} is {} but the ranks' assignments count {}: count deltas were lost or applied twice (a bug)",
            comm.rank(),
            model[i],
            recount[i]
        );
    }
    Ok(model.iter().map(|&m| m as u64).sum())
}

/// The summary line (collective: combines the counters over ranks).
#[allow(clippy::too_many_arguments)]
fn finish_summary(
    cfg: &TrainConfig,
    comm: &SimpleCommunicator,
    data: &Data,
    mode: &dyn SyncMode,
    sampler: &Sampler,
    timers: &Timers,
    global: &[f64],
    (load_seconds, train_seconds, t_start): (f64, f64, Instant),
    (ll, ppl): (f64, f64),
    rounds: u64,
    counted: u64,
) -> anyhow::Result<serde_json::Value> {
    let s = mode.stats();
    let local = [
        sampler.sampled as f64 / timers.compute.max(1e-9),
        timers.compute,
        s.comm_seconds,
        s.wait_seconds,
        s.bytes_sent as f64,
        s.bytes_received as f64,
    ];
    let (mean, max) = collectives::mean_max(comm, &local);
    let names = ["tokens_per_second", "compute_seconds", "comm_seconds", "wait_seconds", "bytes_sent", "bytes_received"];
    let counters: serde_json::Map<String, serde_json::Value> =
        names.iter().enumerate().map(|(i, n)| (n.to_string(), json!({"mean": mean[i], "max": max[i]}))).collect();
    let k = cfg.lda.topics;
    let words = |ids: &Vec<usize>| -> Vec<String> {
        ids.iter().map(|&i| data.vocab.as_ref().map_or_else(|| format!("#{}", i + 1), |v| v[i].clone())).collect()
    };
    let top: Vec<Vec<String>> = lda::top_words(global, k, cfg.lda.top_words).iter().map(words).collect();
    Ok(json!({
        "event": "summary", "ranks": comm.size(), "model": "lda", "sync": mode.name(), "sampler": cfg.lda.sampler,
        "topics": k, "alpha": cfg.lda.alpha, "beta": cfg.lda.beta,
        "epochs": rounds as f64 / cfg.lda.clocks_per_sweep as f64, "rounds": rounds,
        "load_seconds": load_seconds, "train_seconds": collectives::max_u64(comm, (train_seconds * 1e6) as u64) as f64 / 1e6,
        "wall_seconds": t_start.elapsed().as_secs_f64(),
        "tokens": data.total_tokens, "tokens_counted": counted, "counts_exact": counted == data.total_tokens,
        "tokens_per_second_per_rank": mean[0],
        "log_likelihood_per_token": ll, "perplexity": ppl, "held_out": data.test.is_some(),
        "objective": -ll,
        "counters": counters,
        "top_words": top,
    }))
}

/// The mode's single-number metrics (staleness, early pushes...) combined over ranks as each says.
fn mode_numbers(comm: &SimpleCommunicator, mode: &dyn SyncMode) -> serde_json::Value {
    let numbers: Vec<_> = mode.metrics().into_iter().filter(|m| !m.is_array).collect();
    let local: Vec<f64> = numbers.iter().map(|m| m.values[0]).collect();
    let (mean, max) = collectives::mean_max(comm, &local);
    let n = comm.size() as f64;
    let out: serde_json::Map<String, serde_json::Value> = numbers
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let v = match m.aggregate {
                crate::sync::Aggregate::Sum => mean[i] * n,
                crate::sync::Aggregate::Mean => mean[i],
                crate::sync::Aggregate::Max => max[i],
            };
            (m.name.to_string(), json!(v))
        })
        .collect();
    serde_json::Value::Object(out)
}

fn print_summary(s: &serde_json::Value) {
    let f = |k: &str| s[k].as_f64().unwrap_or(f64::NAN);
    let c = &s["counters"];
    let mm = |k: &str| (c[k]["mean"].as_f64().unwrap_or(0.0), c[k]["max"].as_f64().unwrap_or(0.0));
    println!("== asap-train summary ({} ranks, sync {}, lda K = {}) ==", s["ranks"], s["sync"].as_str().unwrap_or("?"), s["topics"]);
    println!(
        "epochs {:.2}, rounds {}; wall {:.2} s = load {:.2} s + training {:.2} s + evaluation",
        f("epochs"),
        s["rounds"],
        f("wall_seconds"),
        f("load_seconds"),
        f("train_seconds")
    );
    let (comp, comp_max) = mm("compute_seconds");
    let (wait, wait_max) = mm("wait_seconds");
    println!(
        "per rank (mean / max): sampling {comp:.2} / {comp_max:.2} s, waiting {wait:.2} / {wait_max:.2} s; tokens/second per rank {:.0}",
        f("tokens_per_second_per_rank")
    );
    println!("tokens {} (counted on the servers: {}, exact: {})", s["tokens"], s["tokens_counted"], s["counts_exact"]);
    println!("log-likelihood per token {:.4}; held-out perplexity {:.2}", f("log_likelihood_per_token"), f("perplexity"));
    for (t, words) in s["top_words"].as_array().into_iter().flatten().enumerate() {
        let ws: Vec<&str> = words.as_array().into_iter().flatten().filter_map(|w| w.as_str()).collect();
        println!("topic {t:>3}: {}", ws.join(" "));
    }
}

/// Writes `word_topic` (W x K counts, u32) and `vocab` (when known) for h5py.
fn save_model(path: &str, global: &[f64], w: usize, k: usize, vocab: Option<&[String]>, config: &str, metrics: &str) -> anyhow::Result<()> {
    use hdf5::types::VarLenUnicode;
    let counts: Vec<u32> = global.iter().map(|&x| x as u32).collect();
    let arr = ndarray::Array2::from_shape_vec((w, k), counts).expect("W x K");
    super::checkpoint::write_atomic(std::path::Path::new(path), |f| {
        f.new_dataset_builder().with_data(&arr).create("word_topic")?;
        if let Some(v) = vocab {
            let words: Vec<VarLenUnicode> = v.iter().map(|s| s.parse().unwrap_or_default()).collect();
            f.new_dataset_builder().with_data(&ndarray::Array1::from_vec(words)).create("vocab")?;
        }
        for (name, value) in [("config", config), ("metrics", metrics)] {
            let v: VarLenUnicode = value.parse().map_err(|e| hdf5::Error::from(format!("{e:?}")))?;
            f.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&v)?;
        }
        Ok(())
    })
    .with_context(|| "cannot save the final model (--save-model)")?;
    eprintln!("asap-train: final model written to {path}");
    Ok(())
}
