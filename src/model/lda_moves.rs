//! Split and merge moves for LDA's burn-in (`--split-merge N`). No MPI in here: sums over ranks
//! go through the `sum` callback (an allreduce in the driver, the identity on one process).
//!
//! Why: token-by-token Gibbs sampling cannot undo a merge. When two planted topics share one
//! learned topic, every token of a document of either is likelier to stay (its document holds
//! ~100 tokens there) than to move to an empty topic (alpha beta / (beta W)), so the pair never
//! comes apart; at K = 100 a quarter to a third of the planted topics ended merged in pairs
//! (docs/lda.md). Jain and Neal's (2004) remedy is a move that reassigns a whole group of
//! tokens at once. Here a phase, run at a sweep boundary on every rank together, makes two kinds:
//!
//! - **Merge**: every topic's most similar topic (overlap of their top words) is a candidate
//!   partner; a candidate pair of duplicates (the word half of the joint likelihood, ln p(w | z),
//!   rises by the merge, or their top words overlap by half) is merged (every token of the
//!   smaller moves to the larger) when that raises the joint likelihood ln p(w, z): one topic's
//!   words spread over two learned topics come together, and a topic comes free. (The document
//!   half alone favours merging any two topics that share documents.)
//! - **Split**: every small topic (empty, or holding only the stray tokens the smoothing leaves in
//!   an unused topic) is offered part of a large one, drawn with probability proportional to its
//!   size: a document's tokens of the large topic move to the small one when the document lacks
//!   one of the large topic's top words (drawn from its top 5), then two restricted Gibbs scans
//!   (those tokens choose between the two topics only, counts summed over ranks after each scan)
//!   refine the split; it is kept when it raises ln p(w, z).
//! - **Paired merge-split** (keeps K): the best merge candidate that did not merge is merged
//!   anyway and every large topic is proposed for a split into the freed topic; both are kept when
//!   together they raise ln p(w, z). It repairs duplicates next to merged pairs when no topic is
//!   small (two planted topics per document: docs/lda.md, issue 44).
//!
//! The joint likelihood change of each move is exact: its word half comes from the global counts
//! (the exact recount of every rank's assignments), its document half is summed over ranks. The
//! moves are a hill-climb on ln p(w, z), not Metropolis-Hastings steps (the proposals are
//! targeted, their reverse probabilities not computed), which is why they are limited to the
//! first sweeps: after them the chain is plain collapsed Gibbs sampling again.
//!
//! Counts: a move changes this rank's assignments and its replica rows (`params`) exactly as
//! sampling does, so the next `sync` pushes the change as a count delta; the servers' rows
//! change only through deltas, and every token stays counted once.

use std::collections::{BTreeMap, HashMap};

use crate::data::bow::Corpus;
use crate::model::lda::{ln_gamma, LdaOptions, LocalState};
use crate::rng::Rng;

/// Restricted Gibbs scans that refine a split proposal before it is judged.
const RESTRICTED_SCANS: usize = 2;
/// Top words per topic compared to find merge partners.
const TOP: usize = 20;
/// The split word is drawn from this many top words of the topic.
const SPLIT_WORDS: usize = 5;
/// Topics whose top words overlap this much (sum of the smaller shares) are duplicates.
const DUPLICATE: f64 = 0.5;
/// Paired merge-split moves tried per phase, the best pairs first (each a pass over the tokens and
/// two restricted scans). Measured (benches/lda-planted.sh, 10 seeds): 1, 2 and 3 all recovered
/// every planted topic of the two-topic family and of the K = 100 corpus; 3 doubled the training
/// time of the Austen corpus (K = 20, 100 sweeps), so 1.
const SWAPS: usize = 1;
/// A topic with fewer tokens than this fraction of the mean topic's is a split target.
const SMALL: f64 = 0.1;
/// Split proposals are limited so that their summed counts (W per proposal, three sums a phase)
/// stay below this many f64 (128 MiB): all topics at W = 1,000, 167 at NYTimes' W = 100,000.
const MAX_SUMMED: usize = 1 << 24;

/// What a phase did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MoveCounts {
    pub merges_proposed: u64,
    pub merges: u64,
    pub splits_proposed: u64,
    pub splits: u64,
    /// Paired moves (a duplicate merged into its partner and another topic split into the freed
    /// one): proposed (split proposals made) and accepted.
    pub swaps_proposed: u64,
    pub swaps: u64,
}

impl std::ops::AddAssign for MoveCounts {
    fn add_assign(&mut self, o: Self) {
        self.merges_proposed += o.merges_proposed;
        self.merges += o.merges;
        self.splits_proposed += o.splits_proposed;
        self.splits += o.splits;
        self.swaps_proposed += o.swaps_proposed;
        self.swaps += o.swaps;
    }
}

/// What a phase works on: this rank's documents and state, and the global counts.
pub struct Phase<'a> {
    pub corpus: &'a Corpus,
    pub opts: &'a LdaOptions,
    pub state: &'a mut LocalState,
    /// This rank's replica rows (W x K); a move changes them as sampling does.
    pub params: &'a mut [f32],
    /// The exact global W x K counts (every rank's recount summed); kept up to date with the
    /// accepted moves. The same on every rank.
    pub global: &'a mut [f64],
    /// Sums a vector over ranks (every rank calls it with vectors of the same length), with the
    /// same result, bit for bit, on every rank: every decision is taken on every rank from it.
    pub sum: &'a mut dyn FnMut(&mut [f64]),
}

/// One phase of merges, paired merge-splits, then splits. `shared` must be in the same state on
/// every rank (it draws the split candidates); `local` is this rank's own stream (restricted scans).
pub fn split_merge(p: &mut Phase<'_>, shared: &mut Rng, local: &mut Rng) -> MoveCounts {
    let (mut out, rejected) = merge_step(p);
    (out.swaps_proposed, out.swaps) = swap_step(p, &rejected, shared, local);
    let k = p.opts.topics;
    let nk = totals(p.global, k);
    let small = SMALL * nk.iter().sum::<f64>() / k as f64;
    let mut targets: Vec<usize> = (0..k).filter(|&t| nk[t] < small).collect();
    targets.sort_by(|&a, &b| nk[a].total_cmp(&nk[b]).then(a.cmp(&b)));
    let none = Targets { to: targets, barred: vec![false; k], offset: vec![0.0; k] };
    let (proposed, accepted) = split_step(p, &none, shared, local);
    out.splits_proposed = proposed;
    out.splits = accepted.len() as u64;
    out
}

/// A paired move keeps K: a duplicate `a` that does not merge into its partner `b` on its own
/// (its merge lowers ln p(w, z)) is merged anyway, and some other topic is split into the freed
/// `a`; the pair is kept when the merge's loss and the split's gain together raise ln p(w, z),
/// and undone otherwise. Why: with two planted topics per document (benches/lda-planted.sh) Gibbs
/// sampling ended with one planted topic held by two to four learned duplicates while other
/// learned topics held two planted topics each; no topic was small, so no split had a target, and
/// merging the duplicates alone lowered ln p(w, z) (e.g. by 700 nats, the stray tokens of a third
/// topic in one of them, at seed 4 of the family), so nothing moved after the first phase.
/// `rejected` are merge_step's rejected duplicate pairs (a, b, gain), best first. Returns
/// (proposed, accepted).
fn swap_step(p: &mut Phase<'_>, rejected: &[(usize, usize, f64)], shared: &mut Rng, local: &mut Rng) -> (u64, u64) {
    let k = p.opts.topics;
    let (mut proposed, mut accepted) = (0, 0);
    // Topics an accepted move changed this phase: the gains of pairs with them are stale.
    let mut touched = vec![false; k];
    for &(a, b, gain) in rejected.iter().filter(|&&(a, b, _)| a != b).take(SWAPS) {
        if touched[a] || touched[b] {
            continue;
        }
        // Every other topic may be split into the freed a, b too (a merged pair's split undone
        // by the Gibbs scans: Jain and Neal's split of the union a + b).
        let mut t = Targets { to: vec![a], barred: touched.clone(), offset: vec![0.0; k] };
        (t.barred[a], t.offset[a]) = (true, gain);
        let saved: Vec<f64> = p.global.chunks_exact(k).map(|r| r[a]).collect();
        let mut into = vec![None; k];
        into[a] = Some(b);
        let moved = apply_merges(p, &into);
        let (n, took) = split_step(p, &t, shared, local);
        proposed += n;
        if let Some(&(_, from)) = took.first() {
            accepted += 1;
            (touched[a], touched[b], touched[from]) = (true, true, true);
            continue;
        }
        // Undo: no split happened, so every moved token is still in b.
        let c = p.corpus;
        for &(i, d) in &moved {
            let w = c.tokens[i] as usize;
            p.state.z[i] = a as u16;
            p.state.ndk[d * k + b] -= 1;
            p.state.ndk[d * k + a] += 1;
            p.params[w * k + b] -= 1.0;
            p.params[w * k + a] += 1.0;
        }
        for (row, &x) in p.global.chunks_exact_mut(k).zip(&saved) {
            row[b] -= x;
            row[a] = x;
        }
    }
    (proposed, accepted)
}

/// What a split step may do: the target topics, the topics that may not be split (`barred`), and
/// a gain added to each target's proposals (the paired merge's, negative; 0 otherwise).
struct Targets {
    to: Vec<usize>,
    barred: Vec<bool>,
    offset: Vec<f64>,
}

fn totals(global: &[f64], k: usize) -> Vec<f64> {
    let mut nk = vec![0.0; k];
    for row in global.chunks_exact(k) {
        nk.iter_mut().zip(row).for_each(|(a, &b)| *a += b);
    }
    nk
}

/// The `n` most frequent words of topic `t` (ties by word id), with their counts.
fn top_of(global: &[f64], k: usize, t: usize, n: usize) -> Vec<(usize, f64)> {
    let mut v: Vec<(usize, f64)> = global.chunks_exact(k).enumerate().filter(|(_, r)| r[t] > 0.0).map(|(w, r)| (w, r[t])).collect();
    let by = |a: &(usize, f64), b: &(usize, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if v.len() > n {
        v.select_nth_unstable_by(n, by);
        v.truncate(n);
    }
    v.sort_by(by);
    v
}

/// Candidate merges (from, into): for every topic its most similar other topic, by the overlap
/// sum_w min(p_a(w), p_b(w)) of their top words (returned with the pair); the smaller topic goes
/// into the larger, each topic is `from` at most once, best overlaps first.
fn merge_candidates(global: &[f64], nk: &[f64]) -> Vec<(usize, usize, f64)> {
    let k = nk.len();
    // Ordered maps: the sums below must come out the same, bit for bit, on every rank.
    let mut by_word: BTreeMap<usize, Vec<(usize, f64)>> = BTreeMap::new();
    for t in (0..k).filter(|&t| nk[t] > 0.0) {
        for (w, n) in top_of(global, k, t, TOP) {
            by_word.entry(w).or_default().push((t, n / nk[t]));
        }
    }
    let mut overlap: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    for list in by_word.values() {
        for (i, &(a, pa)) in list.iter().enumerate() {
            for &(b, pb) in &list[i + 1..] {
                *overlap.entry((a.min(b), a.max(b))).or_default() += pa.min(pb);
            }
        }
    }
    // Every topic's best partner.
    let mut best: Vec<Option<(f64, usize)>> = vec![None; k];
    for (&(a, b), &o) in &overlap {
        for (x, y) in [(a, b), (b, a)] {
            if best[x].is_none_or(|(bo, by)| o > bo || (o == bo && y < by)) {
                best[x] = Some((o, y));
            }
        }
    }
    let mut pairs: Vec<(f64, usize, usize)> =
        best.iter().enumerate().filter_map(|(a, b)| b.map(|(o, b)| if (nk[a], a) < (nk[b], b) { (o, a, b) } else { (o, b, a) })).collect();
    pairs.sort_by(|x, y| y.0.total_cmp(&x.0).then((x.1, x.2).cmp(&(y.1, y.2))));
    let mut from_seen = vec![false; k];
    pairs.into_iter().filter(|&(_, f, _)| !std::mem::replace(&mut from_seen[f], true)).map(|(o, f, t)| (f, t, o)).collect()
}

/// The word half of ln p(w, z) gained by merging topic `a` into `b` (exact, global counts).
fn merge_word_gain(global: &[f64], nk: &[f64], beta: f64, a: usize, b: usize) -> f64 {
    let k = nk.len();
    let wb = beta * (global.len() / k) as f64;
    let lg_b = ln_gamma(beta);
    let words: f64 = global
        .chunks_exact(k)
        .filter(|r| r[a] > 0.0 && r[b] > 0.0)
        .map(|r| ln_gamma(beta + r[a] + r[b]) - ln_gamma(beta + r[a]) - ln_gamma(beta + r[b]) + lg_b)
        .sum();
    words + ln_gamma(wb + nk[a]) + ln_gamma(wb + nk[b]) - ln_gamma(wb) - ln_gamma(wb + nk[a] + nk[b])
}

/// Merges: candidates judged by the exact change of ln p(w, z), the best accepted first, each
/// topic in one accepted merge at most.
fn merge_step(p: &mut Phase<'_>) -> (MoveCounts, Vec<(usize, usize, f64)>) {
    let (k, alpha) = (p.opts.topics, p.opts.alpha);
    let nk = totals(p.global, k);
    let cands = merge_candidates(p.global, &nk);
    let words: Vec<f64> = cands.iter().map(|&(a, b, _)| merge_word_gain(p.global, &nk, p.opts.beta, a, b)).collect();
    // The document half, this rank's documents, summed over ranks.
    let mut cand_of = vec![usize::MAX; k];
    cands.iter().enumerate().for_each(|(i, &(a, _, _))| cand_of[a] = i);
    let mut docs = vec![0.0; cands.len()];
    let lg_a = ln_gamma(alpha);
    for row in p.state.ndk.chunks_exact(k) {
        for (a, &na) in row.iter().enumerate().filter(|&(a, &na)| na > 0 && cand_of[a] != usize::MAX) {
            let i = cand_of[a];
            let nb = row[cands[i].1];
            if nb > 0 {
                let (na, nb) = (na as f64, nb as f64);
                docs[i] += ln_gamma(alpha + na + nb) - ln_gamma(alpha + na) - ln_gamma(alpha + nb) + lg_a;
            }
        }
    }
    (p.sum)(&mut docs);
    // Only duplicates merge: the word half must gain on its own, or the two topics' top words
    // overlap by at least `DUPLICATE` (a fragment of a topic, e.g. some of its words, whose
    // documents are the topic's). Two distinct topics that share documents can raise ln p(w, z)
    // by the document half alone (fewer topics per document): on the Austen corpus (K = 20) such
    // merges took 14-18 of the 20 topics in 20 phases. With the word half alone as the test, 2 of
    // 100 planted topics stayed merged at seed 2 (a fragment never merged back, no topic came free).
    let gain: Vec<f64> = cands
        .iter()
        .zip(words.iter().zip(&docs))
        .map(|(&(_, _, o), (&w, &d))| if w > 0.0 || o >= DUPLICATE { w + d } else { f64::NEG_INFINITY })
        .collect();
    let mut order: Vec<usize> = (0..cands.len()).collect();
    order.sort_by(|&x, &y| gain[y].total_cmp(&gain[x]).then(x.cmp(&y)));
    let mut used = vec![false; k];
    let mut into: Vec<Option<usize>> = vec![None; k];
    let mut merges = 0;
    for i in order.into_iter().filter(|&i| gain[i] > 0.0) {
        let (a, b, _) = cands[i];
        if !used[a] && !used[b] {
            used[a] = true;
            used[b] = true;
            into[a] = Some(b);
            merges += 1;
        }
    }
    if merges > 0 {
        apply_merges(p, &into);
    }
    // The duplicates that did not merge (on their own, or because a topic of theirs took part in
    // another merge), best gain first: candidates of paired moves.
    let mut rejected: Vec<(usize, usize, f64)> = (0..cands.len())
        .filter(|&i| gain[i] <= 0.0 && !used[cands[i].0] && !used[cands[i].1])
        .map(|i| (cands[i].0, cands[i].1, words[i] + docs[i]))
        .collect();
    rejected.sort_by(|x, y| y.2.total_cmp(&x.2).then((x.0, x.1).cmp(&(y.0, y.1))));
    (MoveCounts { merges_proposed: cands.len() as u64, merges, ..Default::default() }, rejected)
}

/// Moves every token of each topic `a` with `into[a] = Some(b)` to `b` (assignments, document
/// counts, replica rows and the global counts). Returns the (token, document) pairs moved here.
fn apply_merges(p: &mut Phase<'_>, into: &[Option<usize>]) -> Vec<(usize, usize)> {
    let k = into.len();
    let (c, st) = (p.corpus, &mut *p.state);
    let mut moved = Vec::new();
    for d in 0..c.len() {
        for i in c.doc_ptr[d]..c.doc_ptr[d + 1] {
            if let Some(b) = into[st.z[i] as usize] {
                let (a, w) = (st.z[i] as usize, c.tokens[i] as usize);
                st.z[i] = b as u16;
                st.ndk[d * k + a] -= 1;
                st.ndk[d * k + b] += 1;
                p.params[w * k + a] -= 1.0;
                p.params[w * k + b] += 1.0;
                moved.push((i, d));
            }
        }
    }
    for row in p.global.chunks_exact_mut(k) {
        for a in 0..k {
            if let Some(b) = into[a] {
                row[b] += row[a];
                row[a] = 0.0;
            }
        }
    }
    moved
}

/// One split proposal: part of topic `from` into the small topic `to`; this rank's tokens of `from` in
/// document order, with the document ranges over them and the side each token is on.
struct Split {
    from: usize,
    to: usize,
    /// Token positions (into `Corpus::tokens`) of this rank's tokens in `from`.
    items: Vec<usize>,
    /// (document, range into `items`).
    docs: Vec<(usize, std::ops::Range<usize>)>,
    /// true: the token goes to `to`.
    side: Vec<bool>,
}

/// Split candidates (from, to, split word): the targets are `t.to` (the small topics, fewer than
/// `SMALL` of the mean topic's tokens: empty, or the few stray tokens the smoothing keeps in an
/// unused topic; or the topics a paired move frees); every other topic not barred is proposed (at
/// most `MAX_SUMMED / W` of them, drawn with probability proportional to their size without
/// replacement), each to one target in turn, with a split word drawn from its top words. The
/// same on every rank (`shared`).
fn split_candidates(global: &[f64], nk: &[f64], t: &Targets, shared: &mut Rng) -> Vec<(usize, usize, usize)> {
    let k = nk.len();
    let small = SMALL * nk.iter().sum::<f64>() / k as f64;
    let targets = &t.to;
    let mut weight: Vec<f64> =
        nk.iter().zip(&t.barred).map(|(&n, &barred)| if n >= small && n >= 2.0 && !barred { n } else { 0.0 }).collect();
    let most = if targets.is_empty() { 0 } else { (MAX_SUMMED / (global.len() / k)).max(targets.len()) };
    let mut out = Vec::new();
    for to in targets.iter().cycle().copied().take(most) {
        let total: f64 = weight.iter().sum();
        if total <= 0.0 {
            break;
        }
        let mut u = shared.next_f64() * total;
        let from = (0..k)
            .find(|&t| {
                weight[t] > 0.0 && {
                    u -= weight[t];
                    u < 0.0
                }
            })
            .unwrap_or_else(|| (0..k).rev().find(|&t| weight[t] > 0.0).expect("total > 0"));
        weight[from] = 0.0;
        let top = top_of(global, k, from, SPLIT_WORDS);
        let word = top[shared.below(top.len())].0;
        out.push((from, to, word));
    }
    out
}

/// Splits: launch (a document's tokens go to the target topic when it lacks the split word), restricted
/// scans, then each proposal kept when it (plus its target's offset) raises ln p(w, z). Returns
/// (proposed, (target, split topic) of the accepted ones).
fn split_step(p: &mut Phase<'_>, t: &Targets, shared: &mut Rng, local: &mut Rng) -> (u64, Vec<(usize, usize)>) {
    let (k, w_n) = (p.opts.topics, p.corpus.words);
    let nk = totals(p.global, k);
    let cands = split_candidates(p.global, &nk, t, shared);
    if cands.is_empty() {
        return (0, Vec::new());
    }
    let mut splits: Vec<Split> =
        cands.iter().map(|&(from, to, _)| Split { from, to, items: Vec::new(), docs: Vec::new(), side: Vec::new() }).collect();
    let mut cand_of = vec![usize::MAX; k];
    cands.iter().enumerate().for_each(|(i, &(f, _, _))| cand_of[f] = i);
    let c = p.corpus;
    for d in 0..c.len() {
        for i in c.doc_ptr[d]..c.doc_ptr[d + 1] {
            let s = cand_of[p.state.z[i] as usize];
            if s != usize::MAX {
                let sp = &mut splits[s];
                if sp.docs.last().is_none_or(|(dd, _)| *dd != d) {
                    sp.docs.push((d, sp.items.len()..sp.items.len()));
                }
                sp.items.push(i);
                sp.docs.last_mut().expect("pushed").1.end = sp.items.len();
            }
        }
    }
    for (sp, &(_, _, word)) in splits.iter_mut().zip(&cands) {
        sp.side = vec![false; sp.items.len()];
        for (_, r) in &sp.docs {
            let lacks = !sp.items[r.clone()].iter().any(|&i| c.tokens[i] as usize == word);
            sp.side[r.clone()].iter_mut().for_each(|s| *s = lacks);
        }
    }
    // Global counts of the `to` side, word by word, per proposal (after the launch, after each scan).
    let mut to_cols = vec![0.0; splits.len() * w_n];
    for scan in 0..=RESTRICTED_SCANS {
        if scan > 0 {
            for (s, sp) in splits.iter_mut().enumerate() {
                restricted_scan(c, p.opts, p.global, &p.state.ndk, &to_cols[s * w_n..(s + 1) * w_n], sp, local);
            }
        }
        to_cols.iter_mut().for_each(|x| *x = 0.0);
        for (s, sp) in splits.iter().enumerate() {
            for (&i, _) in sp.items.iter().zip(&sp.side).filter(|(_, &to)| to) {
                to_cols[s * w_n + c.tokens[i] as usize] += 1.0;
            }
        }
        (p.sum)(&mut to_cols);
    }
    judge_splits(p, &splits, &to_cols, &nk, &t.offset)
}

/// Resamples every token of one split proposal between its two topics, from the global counts
/// of the last sum (`moved`: the tokens of `from` now on the `to` side, word by word) plus this
/// rank's own moves since. The `to` topic's own tokens stay where they are.
fn restricted_scan(c: &Corpus, o: &LdaOptions, global: &[f64], ndk: &[u32], moved: &[f64], sp: &mut Split, rng: &mut Rng) {
    let k = o.topics;
    let wb = o.beta * c.words as f64;
    let mut moved = moved.to_vec();
    let mut n_moved: f64 = moved.iter().sum();
    let (mut n_from, mut n_to) = (0.0, 0.0);
    for row in global.chunks_exact(k) {
        n_from += row[sp.from];
        n_to += row[sp.to];
    }
    n_from -= n_moved;
    n_to += n_moved;
    for (d, r) in &sp.docs {
        let mut d_moved = sp.side[r.clone()].iter().filter(|&&s| s).count() as f64;
        let mut d_from = r.len() as f64 - d_moved;
        let d_own = ndk[d * k + sp.to] as f64;
        for j in r.clone() {
            let w = c.tokens[sp.items[j]] as usize;
            let was = sp.side[j];
            if was {
                moved[w] -= 1.0;
                n_moved -= 1.0;
                n_to -= 1.0;
                d_moved -= 1.0;
            } else {
                n_from -= 1.0;
                d_from -= 1.0;
            }
            // Without this token: `from` holds its global count less the moved ones (less this
            // token when it was on `from`), `to` its own plus the moved ones.
            let w_from = global[w * k + sp.from] - moved[w] - if was { 0.0 } else { 1.0 };
            let w_to = global[w * k + sp.to] + moved[w];
            let p_from = (o.alpha + d_from) * (o.beta + w_from.max(0.0)) / (wb + n_from);
            let p_to = (o.alpha + d_own + d_moved) * (o.beta + w_to) / (wb + n_to);
            let now = rng.next_f64() * (p_from + p_to) >= p_from;
            sp.side[j] = now;
            if now {
                moved[w] += 1.0;
                n_moved += 1.0;
                n_to += 1.0;
                d_moved += 1.0;
            } else {
                n_from += 1.0;
                d_from += 1.0;
            }
        }
    }
    debug_assert!(n_moved >= 0.0);
}

/// The exact change of ln p(w, z) of every split proposal (word half from the summed `to`
/// columns, document half summed over ranks) plus its target's `offset`; applies the best one of
/// each target if that raises it. Returns (proposed, (target, split topic) of the accepted ones).
fn judge_splits(p: &mut Phase<'_>, splits: &[Split], to_cols: &[f64], nk: &[f64], offset: &[f64]) -> (u64, Vec<(usize, usize)>) {
    let (k, w_n, c) = (p.opts.topics, p.corpus.words, p.corpus);
    let (alpha, beta) = (p.opts.alpha, p.opts.beta);
    let wb = beta * w_n as f64;
    let mut docs = vec![0.0; splits.len()];
    for (s, sp) in splits.iter().enumerate() {
        for (d, r) in &sp.docs {
            let e = sp.side[r.clone()].iter().filter(|&&x| x).count() as f64;
            let (a, b) = (r.len() as f64, p.state.ndk[d * k + sp.to] as f64);
            if e > 0.0 {
                docs[s] += ln_gamma(alpha + a - e) + ln_gamma(alpha + b + e) - ln_gamma(alpha + a) - ln_gamma(alpha + b);
            }
        }
    }
    (p.sum)(&mut docs);
    // The gain of every proposal; then for each target its best proposal, if it gains.
    let mut gains = vec![f64::NEG_INFINITY; splits.len()];
    for (s, sp) in splits.iter().enumerate() {
        let col = &to_cols[s * w_n..(s + 1) * w_n];
        let n_e: f64 = col.iter().sum();
        let (n_a, n_b) = (nk[sp.from], nk[sp.to]);
        let mut gain = docs[s] + ln_gamma(wb + n_a) + ln_gamma(wb + n_b) - ln_gamma(wb + n_a - n_e) - ln_gamma(wb + n_b + n_e);
        for (w, &e) in col.iter().enumerate().filter(|(_, &e)| e > 0.0) {
            let (a, b) = (p.global[w * k + sp.from], p.global[w * k + sp.to]);
            gain += ln_gamma(beta + a - e) + ln_gamma(beta + b + e) - ln_gamma(beta + a) - ln_gamma(beta + b);
        }
        gain += offset[sp.to];
        if gain > 0.0 && n_e > 0.0 && n_e < n_a {
            gains[s] = gain;
        }
    }
    let mut best: HashMap<usize, usize> = HashMap::new();
    for (s, sp) in splits.iter().enumerate().filter(|(s, _)| gains[*s] > 0.0) {
        let b = best.entry(sp.to).or_insert(s);
        if gains[s] > gains[*b] {
            *b = s;
        }
    }
    let mut chosen: Vec<usize> = best.into_values().collect();
    chosen.sort_unstable();
    for &s in &chosen {
        let (sp, col) = (&splits[s], &to_cols[s * w_n..(s + 1) * w_n]);
        for (d, r) in &sp.docs {
            for j in r.clone().filter(|&j| sp.side[j]) {
                let i = sp.items[j];
                let w = c.tokens[i] as usize;
                p.state.z[i] = sp.to as u16;
                p.state.ndk[d * k + sp.from] -= 1;
                p.state.ndk[d * k + sp.to] += 1;
                p.params[w * k + sp.from] -= 1.0;
                p.params[w * k + sp.to] += 1.0;
            }
        }
        for (w, &e) in col.iter().enumerate() {
            p.global[w * k + sp.from] -= e;
            p.global[w * k + sp.to] += e;
        }
    }
    (splits.len() as u64, chosen.iter().map(|&s| (splits[s].to, splits[s].from)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::lda::{doc_log_likelihood, word_log_likelihood};

    /// K topics over disjoint blocks of `per` words; every document from one topic.
    fn planted(k: usize, per: usize, docs: usize, len: usize, seed: u64) -> Corpus {
        let mut rng = Rng::new(seed);
        let mut c = Corpus { doc_ptr: vec![0], words: k * per, ..Default::default() };
        for d in 0..docs {
            let t = d % k;
            for _ in 0..len {
                c.tokens.push((t * per + rng.below(per)) as u32);
            }
            c.doc_ptr.push(c.tokens.len());
            c.doc_ids.push(d as u64 + 1);
        }
        c
    }

    fn joint(c: &Corpus, st: &LocalState, o: &LdaOptions) -> f64 {
        let mut g = vec![0.0; c.words * o.topics];
        st.word_topic(c, &mut g);
        word_log_likelihood(&g, o.topics, o.beta) + doc_log_likelihood(st, o.alpha)
    }

    /// Planted topics 0+1 share learned topic 0, planted 2 is spread over learned 1 and 2, 3 is
    /// alone in 3: the phases merge 1 and 2 and split 0 (and nothing else), the joint likelihood rises, and the
    /// replica, the assignments and the global counts still agree.
    #[test]
    fn a_phase_merges_duplicates_and_splits_merged_topics() {
        let (k, per) = (4, 10);
        let c = planted(k, per, 40, 50, 1);
        let o = LdaOptions { topics: k, ..LdaOptions::default() };
        let mut st = LocalState { k, z: Vec::new(), ndk: vec![0; c.len() * k] };
        for d in 0..c.len() {
            let t = match d % k {
                0 | 1 => 0,
                2 => 1 + (d / k) % 2,
                _ => 3,
            };
            for _ in c.doc(d) {
                st.z.push(t as u16);
            }
            st.ndk[d * k + t] = c.doc(d).len() as u32;
        }
        let mut params = vec![0f32; c.words * k];
        let mut g = vec![0.0; c.words * k];
        st.word_topic(&c, &mut g);
        params.iter_mut().zip(&g).for_each(|(p, &x)| *p = x as f32);
        let before = joint(&c, &st, &o);
        let mut ident = |_: &mut [f64]| {};
        let mut moves = MoveCounts::default();
        let (mut shared, mut local) = (Rng::new(5), Rng::new(6));
        // A split candidate is drawn by size: a few phases give every topic its turn.
        for _ in 0..6 {
            let mut phase = Phase { corpus: &c, opts: &o, state: &mut st, params: &mut params, global: &mut g, sum: &mut ident };
            moves += split_merge(&mut phase, &mut shared, &mut local);
        }
        assert_eq!((moves.merges, moves.splits), (1, 1), "{moves:?}");
        assert!(joint(&c, &st, &o) > before + 10.0);
        let mut own = vec![0.0; g.len()];
        st.word_topic(&c, &mut own);
        assert_eq!(own, g, "global counts follow the moves");
        assert!(params.iter().zip(&own).all(|(&p, &x)| p as f64 == x), "replica = recount");
        for (d, row) in st.ndk.chunks_exact(k).enumerate() {
            let mut n = vec![0u32; k];
            st.z[c.doc_ptr[d]..c.doc_ptr[d + 1]].iter().for_each(|&t| n[t as usize] += 1);
            assert_eq!(row, &n[..]);
        }
        // Every planted topic now has a learned topic of its own.
        let top = crate::model::lda::top_words(&own, k, 10);
        for planted in 0..k {
            let best = top.iter().map(|t| t.iter().filter(|&&w| w / per == planted).count()).max().unwrap();
            assert!(best >= 8, "planted topic {planted}: {top:?}");
        }
    }

    /// Two planted topics per document from a random start: no phase lowers ln p(w, z) (every
    /// move is judged by its exact change), and the counts follow the moves.
    #[test]
    fn phases_never_lower_the_joint_likelihood() {
        let (k, per) = (6, 8);
        let mut rng = Rng::new(9);
        let mut c = Corpus { doc_ptr: vec![0], words: k * per, ..Default::default() };
        for d in 0..300 {
            let (t1, t2) = (rng.below(k), rng.below(k));
            for i in 0..40 {
                let t = if i % 2 == 0 { t1 } else { t2 };
                c.tokens.push((t * per + rng.below(per).min(rng.below(per))) as u32);
            }
            c.doc_ptr.push(c.tokens.len());
            c.doc_ids.push(d as u64 + 1);
        }
        let o = LdaOptions { topics: k, ..LdaOptions::default() };
        let mut params = vec![0f32; c.words * k];
        let mut st = LocalState::random(&c, k, &mut rng, &mut params);
        let mut sampler = crate::model::lda::Sampler::new(&o, c.words);
        let (mut shared, mut local) = (Rng::new(5), Rng::new(6));
        let mut ident = |_: &mut [f64]| {};
        let mut moves = MoveCounts::default();
        for _ in 0..15 {
            sampler.begin_clock(&params);
            for d in 0..c.len() {
                let (a, b) = (c.doc_ptr[d], c.doc_ptr[d + 1]);
                sampler.sample_doc(&c.tokens[a..b], &mut st.z[a..b], &mut st.ndk[d * k..(d + 1) * k], &mut params, &mut rng);
            }
            let mut g = vec![0.0; c.words * k];
            st.word_topic(&c, &mut g);
            let before = joint(&c, &st, &o);
            let mut phase = Phase { corpus: &c, opts: &o, state: &mut st, params: &mut params, global: &mut g, sum: &mut ident };
            let m = split_merge(&mut phase, &mut shared, &mut local);
            moves += m;
            let after = joint(&c, &st, &o);
            assert!(after >= before - 1e-6 * before.abs(), "{m:?}: {before} -> {after}");
            let mut own = vec![0.0; g.len()];
            st.word_topic(&c, &mut own);
            assert_eq!(own, g, "global counts follow the moves");
            assert!(params.iter().zip(&own).all(|(&p, &x)| p as f64 == x), "replica = recount");
        }
        eprintln!("{moves:?}");
    }

    /// Gains computed here equal the change of the joint likelihood computed from scratch.
    #[test]
    fn merge_gain_is_the_change_of_the_joint_likelihood() {
        let (k, per) = (3, 6);
        let c = planted(k, per, 12, 20, 2);
        let o = LdaOptions { topics: k, ..LdaOptions::default() };
        let mut rng = Rng::new(3);
        let mut nwk = vec![0f32; c.words * k];
        let st = LocalState::random(&c, k, &mut rng, &mut nwk);
        let mut g = vec![0.0; c.words * k];
        st.word_topic(&c, &mut g);
        let nk = totals(&g, k);
        let mut merged = LocalState { k, z: st.z.iter().map(|&t| if t == 1 { 2 } else { t }).collect(), ndk: vec![0; c.len() * k] };
        for d in 0..c.len() {
            for i in c.doc_ptr[d]..c.doc_ptr[d + 1] {
                merged.ndk[d * k + merged.z[i] as usize] += 1;
            }
        }
        let mut docs = 0.0;
        for row in st.ndk.chunks_exact(k).filter(|r| r[1] > 0 && r[2] > 0) {
            let (a, b, al) = (row[1] as f64, row[2] as f64, o.alpha);
            docs += ln_gamma(al + a + b) - ln_gamma(al + a) - ln_gamma(al + b) + ln_gamma(al);
        }
        let gain = merge_word_gain(&g, &nk, o.beta, 1, 2) + docs;
        let exact = joint(&c, &merged, &o) - joint(&c, &st, &o);
        assert!((gain - exact).abs() < 1e-6 * exact.abs().max(1.0), "{gain} vs {exact}");
    }
}
