//! Elastic resumes (issue 42): a checkpoint written by N ranks continued on M != N ranks, in the
//! modes whose ranks each hold a whole replica (allreduce, asap and its variants, none, gaia, and
//! async, whose workers all hold the coordinator's model at a checkpoint's cut) and in the
//! parameter-server modes (ssp, bosen) ([`crate::sync::ModeSpec::elastic`]). The rule
//! (docs/training.md, "Resuming at another rank count"):
//!
//! - **Replicas**: every new rank starts from the consensus average of the N replicas (the mean
//!   in f64, rounded to f32 once), so each rank's deviation from the consensus is reset. The
//!   average is what every mode converges to and what `finish` would have saved.
//! - **Parameter servers** (ssp, bosen: [`crate::sync::ModeSpec::resize_model`]): every new rank
//!   starts from the servers' model instead, the old shards laid end to end
//!   ([`laid_end_to_end`]); the new servers take their rows of it with the per-row state that
//!   follows them, every client's cache re-read, every worker at the cut's clock
//!   (`crate::sync::ps::resize`, through [`crate::sync::SyncMode::repartition`]).
//! - **Mode and optimizer state** is what a fresh run on M ranks builds from that average, except
//!   the state that describes the model's motion and not a rank's place in the graph: the outer
//!   optimizer's anchor and Nesterov velocity, momentum, AdamW's moments and step count, gaia's
//!   clock and the early-stopping count are averaged over the N ranks (exact where they are all
//!   equal, as in allreduce). Per-edge and per-rank exchange state (error-feedback residuals,
//!   CHOCO's public copies, budgeted edges' mirrors and caches, push-sum weights, gaia's residual
//!   and counters) is reset: it belongs to edges that no longer exist, and a residual holds at
//!   most what compression held back since the last exchange.
//! - **RNG**: new rank q's shuffle stream starts as stream q + 1 of the seed mixed with the epoch
//!   of the resume ([`resized_stream`]), so the new ranks' orders are independent of the old
//!   ones and of a fresh run's.
//! - **Per-example state** (SAGA's stored slopes, `--sync async --optimizer saga`) follows its
//!   examples to the rank that now holds them ([`per_example`]), so the history, and the
//!   coordinator's mean of it, stay those of the same gradients.
//! - **Data**: the examples the uninterrupted N-rank run still had planned for the interrupted
//!   epoch ([`left_of_rank`], from each old rank's shuffle state at the epoch's start, its steps
//!   done and its file rows) are dealt over the M new ranks: each takes those in its own new
//!   shard (no example moves between ranks), in an order shuffled by its stream, over the same
//!   number of steps on every rank, the largest share's `ceil(left / b)`; a rank with fewer takes
//!   smaller mini-batches ([`dealt_batch`]) with a step scaled to their size, as `--balance` does.
//!   So each of those examples is seen exactly once in the epoch, and no other. Later epochs
//!   shard over M as a fresh M-rank run does. A checkpoint inside such an epoch records the
//!   examples dealt ([`Dealt`]): a resume at the same count continues it bit for bit, one at
//!   another count deals what is left of it again.
//! - **Label-skewed partitions** (`--partition by-label:K`, `dirichlet:ALPHA`): the same rule
//!   over a multiset. An epoch there is a pass over the mean shard: a smaller shard cycles (each
//!   pass reshuffled), a larger one is cut, so the plan holds some examples more than once and
//!   some not at all. What is dealt is every occurrence the uninterrupted N-rank run still had
//!   planned ([`left_of_rank`] follows the passes as `Replica::new_pass` draws them), each to the
//!   rank that holds its example in the M-rank partition of the same seed (the shards the new
//!   ranks read; an example's rank is a rule of its class, its file row and the seed), so each
//!   planned occurrence is seen once and nothing else: the interrupted epoch trains on what the
//!   uninterrupted one would have, its weight of each class included, and later epochs are an
//!   M-rank run's. The examples' ids are their file rows, carried through the partition's
//!   all-to-all (`data::partition::decode_rows`) and recorded per rank in the checkpoint.
//!
//! Limits: `--balance` does not shrink the dealt mini-batches further; an example dealt twice
//! may fall into one mini-batch.

use std::ops::Range;

/// The rule in one line, for the start line and rank 0's message.
pub const RULE: &str = "every replica starts from the average of the old ones; the outer optimizer's state, momentum and \
                        AdamW's moments are averaged, per-edge and residual state starts afresh; the examples left of the \
                        interrupted epoch are each seen once, later epochs shard over the new ranks";

/// The rule for the parameter-server modes (ssp, bosen; `crate::sync::ps::resize`).
pub const SERVER_RULE: &str = "every rank starts from the parameter servers' model, its shards re-partitioned by row with their \
                               per-row state (AdaRevision's, its denominators' growth scaled by M/N) and every client's cache \
                               re-read; every worker at the cut's clock, DynSGD's open versions closed; momentum and AdamW's \
                               moments are averaged; the examples left of the interrupted epoch are each seen once, later \
                               epochs shard over the new ranks";

/// The rule of a resize: [`SERVER_RULE`] where the model is the servers' (`server_model`), else
/// [`RULE`].
pub fn rule(server_model: bool) -> &'static str {
    if server_model {
        SERVER_RULE
    } else {
        RULE
    }
}

use crate::rng::Rng;
use crate::sync::ModeState;

/// The examples of an epoch dealt over the ranks at a resize: their global row ids, ascending
/// (all of them as a checkpoint stores them; a running rank keeps only its share, [`Dealt::share`],
/// so its memory stays a fraction of the data), the steps every rank takes over its share, and
/// how many were dealt in all.
#[derive(Clone, Debug, PartialEq)]
pub struct Dealt {
    pub ids: Vec<u64>,
    pub steps: usize,
    pub total: u64,
}

impl Dealt {
    /// The share of a rank holding `own_ids` (ascending) of all the examples dealt.
    pub fn share(self, own_ids: &[u64]) -> Dealt {
        let ids = share_of(&self.ids, own_ids).into_iter().map(|i| own_ids[i]).collect();
        Dealt { ids, ..self }
    }
}

/// How one rank walks its examples in the current epoch, from its shuffle state at the epoch's
/// start (`rng`).
pub enum Walk<'a> {
    /// A pass over its shard in mini-batches of `batch`, `steps` of them (`Replica::new_pass`).
    Shard { rng: [u64; 4], batch: usize, steps: usize },
    /// Its share of `dealt`.
    Dealt { rng: [u64; 4], dealt: &'a Dealt },
}

/// A rank's training examples as global row ids, ascending: the file rows `rows` less the ones
/// the held-out split takes (`holdout`: fraction and seed, when the split applies). The ids a
/// label-skewed `--partition` deals by (`train::setup`).
pub fn training_ids(rows: (u64, u64), holdout: Option<(f64, u64)>) -> Vec<u64> {
    (rows.0..rows.1).filter(|&g| holdout.is_none_or(|(f, seed)| !crate::data::held_out(g, f, seed))).collect()
}

/// This rank's share of `dealt_ids` (both lists ascending): the local indices of the examples of
/// `own_ids` among them, shuffled by `rng`.
pub fn dealt_order(dealt_ids: &[u64], own_ids: &[u64], rng: &mut Rng) -> Vec<usize> {
    let mine = share_of(dealt_ids, own_ids);
    let mut perm: Vec<usize> = (0..mine.len()).collect();
    rng.shuffle(&mut perm);
    perm.into_iter().map(|p| mine[p]).collect()
}

/// The local indices of the examples of `own_ids` among `dealt_ids` (both ascending), ascending:
/// an example dealt k times (a cycling shard's repeats, under a label-skewed `--partition`) is
/// in it k times.
pub fn share_of(dealt_ids: &[u64], own_ids: &[u64]) -> Vec<usize> {
    let mut mine = Vec::new();
    let mut j = 0;
    for (i, &g) in own_ids.iter().enumerate() {
        while j < dealt_ids.len() && dealt_ids[j] < g {
            j += 1;
        }
        while dealt_ids.get(j) == Some(&g) {
            mine.push(i);
            j += 1;
        }
    }
    mine
}

/// The positions in a share of `len` examples that step `k` of `steps` takes: an even split,
/// so every step has a mini-batch of floor or ceil(len / steps) (possibly none).
pub fn dealt_batch(len: usize, steps: usize, k: usize) -> Range<usize> {
    let at = |k: usize| (k * len).checked_div(steps).unwrap_or(0).min(len);
    at(k)..at(k + 1)
}

/// The examples (global ids) a rank holding `ids` had still planned in its epoch after `done`
/// steps of `walk`: those of its mini-batches `done..steps`. A shard walk's step k takes the
/// mini-batch k % p of pass k / p over the shard (p = ceil(n / batch) steps a pass, the last
/// taking what is left), each pass in a fresh order drawn from the stream (`Replica::new_pass`);
/// so a shard smaller than the epoch cycles, and its examples are planned once per pass.
pub fn left_of_rank(ids: &[u64], walk: &Walk, done: usize) -> Vec<u64> {
    match walk {
        Walk::Shard { rng, batch, steps } => {
            let n = ids.len();
            let per_pass = n.div_ceil(*batch).max(1);
            let mut rng = Rng::from_state(*rng);
            let mut perm: Vec<usize> = (0..n).collect();
            let mut left = Vec::new();
            for pass in 0..steps.div_ceil(per_pass) {
                perm.iter_mut().enumerate().for_each(|(i, x)| *x = i);
                rng.shuffle(&mut perm);
                let (first, end) = (done.max(pass * per_pass), *steps.min(&((pass + 1) * per_pass)));
                if first < end {
                    let (from, to) = (((first - pass * per_pass) * batch).min(n), ((end - pass * per_pass) * batch).min(n));
                    left.extend(perm[from..to].iter().map(|&i| ids[i]));
                }
            }
            left
        }
        Walk::Dealt { rng, dealt } => {
            let order = dealt_order(&dealt.ids, ids, &mut Rng::from_state(*rng));
            let from = dealt_batch(order.len(), dealt.steps, done).start;
            order[from..].iter().map(|&i| ids[i]).collect()
        }
    }
}

/// The examples a rank holding `ids` still has planned in a shard walk of `steps` mini-batches of
/// `batch` after `done` of them, from where it stands in memory (`train::shrink`): `current` is
/// the order of the pass step `done` falls in (used only inside a pass: at a pass's start that
/// pass is not yet drawn), `rng` its shuffle stream after the passes drawn so far. The same
/// plan as [`left_of_rank`] reads from the epoch's start.
pub fn left_in_walk(ids: &[u64], current: &[usize], rng: [u64; 4], batch: usize, steps: usize, done: usize) -> Vec<u64> {
    let n = ids.len();
    let per_pass = n.div_ceil(batch).max(1);
    let mut left = Vec::new();
    let mut take = |perm: &[usize], pass: usize| {
        let (first, end) = (done.max(pass * per_pass), steps.min((pass + 1) * per_pass));
        if first < end {
            let (from, to) = (((first - pass * per_pass) * batch).min(n), ((end - pass * per_pass) * batch).min(n));
            left.extend(perm[from..to].iter().map(|&i| ids[i]));
        }
    };
    let mut pass = done / per_pass;
    if !done.is_multiple_of(per_pass) && current.len() == n {
        take(current, pass);
        pass += 1;
    }
    let mut rng = Rng::from_state(rng);
    let mut perm: Vec<usize> = (0..n).collect();
    while pass * per_pass < steps {
        perm.iter_mut().enumerate().for_each(|(i, x)| *x = i);
        rng.shuffle(&mut perm);
        take(&perm, pass);
        pass += 1;
    }
    left
}

/// The examples a shard of `n` takes in the first `done` mini-batches of `batch` of a shard walk
/// (whole passes of `n`, then the part of one).
pub fn taken_in_walk(n: usize, batch: usize, done: usize) -> u64 {
    let per_pass = n.div_ceil(batch).max(1);
    (done / per_pass * n + n.min(done % per_pass * batch)) as u64
}

/// The examples left of the epoch over all old ranks, ascending (each rank's `ids` with its walk).
pub fn left_of_epoch(ranks: &[(Vec<u64>, Walk)], done: usize) -> Vec<u64> {
    let mut all: Vec<u64> = ranks.iter().flat_map(|(ids, walk)| left_of_rank(ids, walk, done)).collect();
    all.sort_unstable();
    all
}

/// New rank `rank`'s shuffle stream after a resize in epoch `epoch`.
pub fn resized_stream(seed: u64, epoch: usize, rank: usize) -> Rng {
    Rng::for_stream(seed ^ 0x7265_7369_7a65_0000 ^ (epoch as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15), rank as u64 + 1)
}

/// The state a resize carries over from the old ranks' `old` states: each entry that `averaged`
/// names, as the mean over the old ranks that hold it with one length (the value itself when
/// they all agree, so state the ranks share stays exact; an entry only the coordinator keeps is
/// its own).
pub fn carried_state(old: &[ModeState], averaged: impl Fn(&str) -> bool) -> ModeState {
    let mut names: Vec<&String> = Vec::new();
    for (name, _) in old.iter().flatten() {
        if averaged(name) && !names.contains(&name) {
            names.push(name);
        }
    }
    let mut out = Vec::new();
    for name in names {
        let all: Vec<&Vec<f64>> = old.iter().filter_map(|s| s.iter().find(|(n, _)| n == name).map(|(_, v)| v)).collect();
        let v0 = all[0];
        if all.iter().any(|v| v.len() != v0.len()) {
            continue;
        }
        let mean = if all.iter().all(|v| *v == v0) {
            v0.clone()
        } else {
            (0..v0.len()).map(|i| all.iter().map(|v| v[i]).sum::<f64>() / all.len() as f64).collect()
        };
        out.push((name.clone(), mean));
    }
    out
}

/// The entries `laid` names, each as the old ranks' values laid end to end in rank order (ranks
/// that hold none add nothing): a parameter server's shards of the model and its per-row state,
/// split over the old ranks by contiguous rows, are so the whole model's, for the new ranks to
/// take their own rows of ([`crate::sync::SyncMode::repartition`]).
pub fn laid_end_to_end(old: &[ModeState], laid: impl Fn(&str) -> bool) -> ModeState {
    let mut out: ModeState = Vec::new();
    for (name, v) in old.iter().flatten().filter(|(name, _)| laid(name)) {
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, all)) => all.extend_from_slice(v),
            None => out.push((name.clone(), v.clone())),
        }
    }
    out
}

/// Per-example state of the old ranks (the entry `name`, one value per example of each rank's
/// shard, in its order: SAGA's stored slopes) by the examples' global ids (`ids`, each old rank's),
/// ascending: the state follows its examples to their new ranks ([`own_per_example`]).
pub fn per_example(old: &[ModeState], ids: &[Vec<u64>], name: &str) -> (Vec<u64>, Vec<f64>) {
    let mut pairs: Vec<(u64, f64)> = Vec::new();
    for (state, ids) in old.iter().zip(ids) {
        if let Some((_, v)) = state.iter().find(|(n, v)| n == name && v.len() == ids.len()) {
            pairs.extend(ids.iter().copied().zip(v.iter().copied()));
        }
    }
    pairs.sort_unstable_by_key(|p| p.0);
    pairs.into_iter().unzip()
}

/// A new rank's per-example state: the values of its examples `own_ids` among `all_ids` (both
/// ascending), 0 (a fresh example's) for one the old ranks did not hold.
pub fn own_per_example(all_ids: &[u64], all_values: &[f64], own_ids: &[u64]) -> Vec<f64> {
    own_ids.iter().map(|g| all_ids.binary_search(g).map_or(0.0, |i| all_values[i])).collect()
}

/// `fresh` (a new mode's state) with the entries `carried` holds under the same name put in their
/// place: at the same length, or, for a per-rank table whose old entries were all one value (at
/// the checkpoint's cut every worker is at the same clock), that value at the new length.
pub fn overlay(fresh: ModeState, carried: &ModeState) -> ModeState {
    fresh
        .into_iter()
        .map(|(name, v)| match carried.iter().find(|(n, _)| *n == name) {
            Some((_, c)) if c.len() == v.len() => (name, c.clone()),
            Some((_, c)) if !c.is_empty() && c.iter().all(|x| *x == c[0]) => (name, vec![c[0]; v.len()]),
            _ => (name, v),
        })
        .collect()
}

/// The consensus average of `replicas` (rows of `p` values): the mean in f64, rounded once.
pub fn average_replicas(replicas: &[f32], p: usize) -> Vec<f32> {
    let n = replicas.len() / p.max(1);
    let mut sum = vec![0f64; p];
    for row in replicas.chunks(p.max(1)) {
        sum.iter_mut().zip(row).for_each(|(s, &x)| *s += x as f64);
    }
    sum.into_iter().map(|s| (s / n.max(1) as f64) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The N-rank plan of an epoch: each rank's ids and shard walk.
    fn plan(n_ranks: usize, total: u64, seed: u64) -> Vec<(Vec<u64>, [u64; 4])> {
        (0..n_ranks)
            .map(|r| {
                let (lo, hi) = (total * r as u64 / n_ranks as u64, total * (r as u64 + 1) / n_ranks as u64);
                (training_ids((lo, hi), Some((0.1, seed))), Rng::for_stream(seed, r as u64 + 1).state())
            })
            .collect()
    }

    /// What a rank sees in steps `range` of a shard walk (the training loop's rule).
    fn seen_shard(ids: &[u64], rng: [u64; 4], batch: usize, range: Range<usize>) -> Vec<u64> {
        let mut perm: Vec<usize> = (0..ids.len()).collect();
        Rng::from_state(rng).shuffle(&mut perm);
        range.flat_map(|k| perm[(k * batch).min(ids.len())..((k + 1) * batch).min(ids.len())].to_vec()).map(|i| ids[i]).collect()
    }

    /// 4 ranks for 3 steps, then 6 ranks over the rest, then 2 ranks over what 6 left after 2
    /// steps: every example of the epoch once, and only those.
    #[test]
    fn a_chain_of_resizes_sees_every_example_of_the_epoch_once() {
        let (total, b, seed) = (1000u64, 10usize, 3u64);
        let four = plan(4, total, seed);
        let steps = four.iter().map(|(ids, _)| ids.len().div_ceil(b)).min().unwrap();
        let mut seen: Vec<u64> = four.iter().flat_map(|(ids, rng)| seen_shard(ids, *rng, b, 0..3)).collect();
        let walks: Vec<(Vec<u64>, Walk)> =
            four.iter().map(|(ids, rng)| (ids.clone(), Walk::Shard { rng: *rng, batch: b, steps })).collect();
        let left = left_of_epoch(&walks, 3);
        // Six new ranks deal it, each over its own shard.
        let six = plan(6, total, seed);
        let steps6 = six.iter().map(|(ids, _)| dealt_order(&left, ids, &mut Rng::new(0)).len().div_ceil(b)).max().unwrap();
        let dealt = Dealt { ids: left.clone(), steps: steps6, total: left.len() as u64 };
        let rngs6: Vec<[u64; 4]> = (0..6).map(|q| resized_stream(seed, 0, q).state()).collect();
        for ((ids, _), rng) in six.iter().zip(&rngs6) {
            let order = dealt_order(&dealt.ids, ids, &mut Rng::from_state(*rng));
            seen.extend((0..2).flat_map(|k| order[dealt_batch(order.len(), steps6, k)].iter().map(|&i| ids[i]).collect::<Vec<_>>()));
        }
        let walks6: Vec<(Vec<u64>, Walk)> =
            six.iter().zip(&rngs6).map(|((ids, _), rng)| (ids.clone(), Walk::Dealt { rng: *rng, dealt: &dealt })).collect();
        let left2 = left_of_epoch(&walks6, 2);
        // Two ranks take all that is left, one step each.
        for (ids, _) in plan(2, total, seed) {
            let order = dealt_order(&left2, &ids, &mut Rng::new(9));
            seen.extend(order.iter().map(|&i| ids[i]));
        }
        seen.sort_unstable();
        let mut planned: Vec<u64> = four.iter().flat_map(|(ids, rng)| seen_shard(ids, *rng, b, 0..steps)).collect();
        planned.sort_unstable();
        assert_eq!(seen, planned, "the examples seen across the resizes are the epoch's, each once");
        assert!(planned.len() > 850, "the held-out split leaves most of the 1000: {}", planned.len());
    }

    /// Parts laid end to end in rank order; a rank without the entry adds nothing; entries not
    /// named stay out.
    #[test]
    fn laid_end_to_end_joins_the_ranks_parts_in_rank_order() {
        let old = vec![
            vec![("rows".to_owned(), vec![1.0, 2.0]), ("other".to_owned(), vec![9.0])],
            vec![("other".to_owned(), vec![8.0])],
            vec![("rows".to_owned(), vec![3.0])],
        ];
        assert_eq!(laid_end_to_end(&old, |n| n == "rows"), vec![("rows".to_owned(), vec![1.0, 2.0, 3.0])]);
    }

    /// What a rank sees in steps `range` of a shard walk that cycles: pass k / p in a fresh
    /// order each (the training loop's `new_pass`), mini-batch k % p of it.
    fn seen_cycling(ids: &[u64], rng: [u64; 4], batch: usize, range: Range<usize>) -> Vec<u64> {
        let (n, mut rng) = (ids.len(), Rng::from_state(rng));
        let per_pass = n.div_ceil(batch);
        let mut perm: Vec<usize> = Vec::new();
        let mut seen = Vec::new();
        for k in 0..range.end {
            if k % per_pass == 0 {
                perm = (0..n).collect();
                rng.shuffle(&mut perm);
            }
            let s = k % per_pass;
            if k >= range.start {
                seen.extend(perm[s * batch..((s + 1) * batch).min(n)].iter().map(|&i| ids[i]));
            }
        }
        seen
    }

    /// A shard of 7 in mini-batches of 3 over an epoch of 8 steps (passes of 3 steps: 3, 3 and
    /// 1 examples): what is left after each step, with the steps before, is the epoch's plan,
    /// repeats and all; dealt again over 2 shards, each takes its repeats.
    #[test]
    fn a_cycling_shard_leaves_its_planned_repeats() {
        let ids = [2u64, 3, 5, 8, 13, 21, 34];
        let rng = Rng::for_stream(7, 1).state();
        let walk = Walk::Shard { rng, batch: 3, steps: 8 };
        let sorted = |mut v: Vec<u64>| {
            v.sort_unstable();
            v
        };
        let plan = sorted(seen_cycling(&ids, rng, 3, 0..8));
        assert_eq!(plan.len(), 7 + 7 + 6, "two whole passes and two steps of a third");
        for done in 0..=8 {
            let mut all = seen_cycling(&ids, rng, 3, 0..done);
            all.extend(left_of_rank(&ids, &walk, done));
            assert_eq!(sorted(all), plan, "after {done} steps");
        }
        // From where a rank stands after `done` steps (its pass's order, its stream after it).
        for done in 0..=8usize {
            let mut rng_now = Rng::from_state(rng);
            let mut perm: Vec<usize> = Vec::new();
            for _ in 0..done.div_ceil(3) {
                perm = (0..7).collect();
                rng_now.shuffle(&mut perm);
            }
            let left = sorted(left_in_walk(&ids, &perm, rng_now.state(), 3, 8, done));
            assert_eq!(left, sorted(left_of_rank(&ids, &walk, done)), "in memory after {done} steps");
            assert_eq!(taken_in_walk(7, 3, done) as usize + left.len(), plan.len(), "after {done} steps");
        }
        let left = left_of_epoch(&[(ids.to_vec(), walk)], 4);
        let (a, b) = ([2u64, 5, 13, 34], [3u64, 8, 21]);
        let shares = [Dealt { ids: left.clone(), steps: 0, total: 0 }.share(&a), Dealt { ids: left.clone(), steps: 0, total: 0 }.share(&b)];
        assert_eq!(sorted([shares[0].ids.clone(), shares[1].ids.clone()].concat()), left);
        assert_eq!(share_of(&[1, 1, 3, 5, 5, 5], &[1, 2, 5]), [0, 0, 2, 2, 2]);
    }

    #[test]
    fn dealt_batches_split_a_share_evenly_over_the_steps() {
        let sizes: Vec<usize> = (0..4).map(|k| dealt_batch(10, 4, k).len()).collect();
        assert_eq!(sizes, [2, 3, 2, 3]);
        assert_eq!(dealt_batch(3, 5, 0).len() + dealt_batch(3, 5, 4).len(), 1);
        assert_eq!(dealt_batch(0, 0, 0), 0..0);
        assert_eq!((0..5).map(|k| dealt_batch(3, 5, k).len()).sum::<usize>(), 3);
    }

    #[test]
    fn carried_state_averages_only_what_it_is_told_and_keeps_equal_values_exact() {
        let old = vec![
            vec![("v".to_owned(), vec![0.1, 1.0]), ("r".to_owned(), vec![5.0]), ("c".to_owned(), vec![0.3])],
            vec![("v".to_owned(), vec![0.3, 3.0]), ("r".to_owned(), vec![7.0]), ("c".to_owned(), vec![0.3])],
            vec![("v".to_owned(), vec![0.2, 2.0]), ("r".to_owned(), vec![9.0]), ("c".to_owned(), vec![0.3])],
        ];
        let carried = carried_state(&old, |n| n != "r");
        assert_eq!(carried.len(), 2);
        assert_eq!(carried[0].1[1], 2.0);
        assert_eq!(carried[1].1, vec![0.3], "equal values are carried as they are");
        let fresh = vec![("r".to_owned(), vec![0.0]), ("v".to_owned(), vec![0.0, 0.0]), ("c".to_owned(), vec![0.0, 0.0])];
        let merged = overlay(fresh, &carried);
        assert_eq!(merged[0].1, vec![0.0], "reset state stays fresh");
        assert_eq!(merged[1].1[1], 2.0);
        assert_eq!(merged[2].1, vec![0.3, 0.3], "a table of one value is carried at the new length");
        let uneven = overlay(vec![("v".to_owned(), vec![0.0])], &carried);
        assert_eq!(uneven[0].1, vec![0.0], "a table of several values is not carried at another length");
        let coordinator = carried_state(&[vec![("m".to_owned(), vec![4.0])], vec![]], |_| true);
        assert_eq!(coordinator, vec![("m".to_owned(), vec![4.0])], "an entry only one old rank holds is its");
    }

    #[test]
    fn per_example_state_follows_its_examples() {
        let old = vec![vec![("s".to_owned(), vec![1.0, 2.0])], vec![("s".to_owned(), vec![3.0, 4.0, 5.0])]];
        let (ids, values) = per_example(&old, &[vec![0, 2], vec![3, 4, 7]], "s");
        assert_eq!((ids.clone(), values.clone()), (vec![0, 2, 3, 4, 7], vec![1.0, 2.0, 3.0, 4.0, 5.0]));
        assert_eq!(own_per_example(&ids, &values, &[2, 3]), vec![2.0, 3.0]);
        assert_eq!(own_per_example(&ids, &values, &[4, 5, 7]), vec![4.0, 0.0, 5.0]);
    }

    #[test]
    fn the_average_of_replicas_is_taken_in_f64() {
        assert_eq!(average_replicas(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2), vec![3.0, 4.0]);
        assert_eq!(average_replicas(&[0.1, 0.1, 0.1], 1), vec![0.1]);
    }
}
