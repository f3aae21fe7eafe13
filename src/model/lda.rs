//! Latent Dirichlet allocation by collapsed Gibbs sampling (`--model lda`). No MPI in here.
//!
//! The shared model is the word-topic count matrix, W rows of K counts (row w = word w), kept as
//! the flat `f32` parameter vector every sync mode exchanges. Counts are integers and f32 holds
//! every integer up to 2^24 exactly, so a word-topic cell is exact as long as no word occurs more
//! than 2^24 times in the corpus (the driver checks it); count deltas of one clock are smaller
//! still. The topic totals n_k are NOT a shared row: on NYTimes (99.5M tokens) a total passes
//! 2^24 and an f32 row would round. They are the column sums of the word rows, recomputed in
//! exact integers at the start of every clock from the replica ([`Sampler::begin_clock`]) and
//! kept up to date with this rank's own moves during the clock.
//!
//! Two samplers (`--sampler`): `dense` draws each token from all K topics (O(K) per token);
//! `sparse` is SparseLDA (Yao, Mimno and McCallum, KDD 2009): the conditional
//! (alpha + n_dk)(beta + n_wk)/(beta W + n_k) splits into a smoothing bucket s (all topics,
//! rarely drawn), a document bucket r (the doc's topics) and a word bucket q (the word's
//! topics), so a token costs O(topics of its doc + topics of its word). docs/lda.md has the
//! measurement behind the default.
//!
//! A replica's cell may be transiently negative under bosen (a server's early push can overtake
//! this rank's own early push of the same row); the samplers read every word count as max(n, 0).

use crate::data::bow::Corpus;
use crate::rng::Rng;

/// Which sampler draws the topics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SamplerKind {
    /// SparseLDA's three buckets: cost per token ~ topics in the document + topics of the word.
    Sparse,
    /// The plain collapsed Gibbs conditional over all K topics.
    Dense,
}

/// How the topic assignments start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum InitKind {
    /// Documents in order (rank 0's first), each wholly in the topic that explains its words
    /// best so far, or an empty one: planted topics land in distinct topics.
    Sequential,
    /// Uniformly random topics.
    Random,
}

/// Options of `--model lda`.
#[derive(clap::Args, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[command(next_help_heading = "LDA (--model lda)")]
pub struct LdaOptions {
    /// Number of topics K.
    #[arg(long, value_name = "K", default_value_t = 100)]
    pub topics: usize,
    /// Dirichlet prior of the document-topic mixes (symmetric).
    #[arg(long, value_name = "A", default_value_t = 0.1, value_parser = crate::values::finite_f64)]
    pub alpha: f64,
    /// Dirichlet prior of the topic-word distributions (symmetric).
    #[arg(long, value_name = "B", default_value_t = 0.1, value_parser = crate::values::finite_f64)]
    pub beta: f64,
    /// Topic sampler: sparse (SparseLDA) or dense (O(K) per token).
    #[arg(long, value_enum, default_value_t = SamplerKind::Sparse)]
    pub sampler: SamplerKind,
    /// Clocks (sync rounds) per sweep over the documents; one epoch is one sweep.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub clocks_per_sweep: usize,
    /// How the assignments start: sequential (each document in the topic that explains it best
    /// given the documents before it, rank 0's first; K logarithms per token) or random.
    #[arg(long, value_enum, default_value_t = InitKind::Sequential)]
    pub lda_init: InitKind,
    /// Split-merge moves after each of the first N sweeps (0: none): topics that duplicate one
    /// another are merged, topics holding two are split, and a paired move merges one topic into
    /// its most similar one to split another into it, which token-by-token Gibbs moves cannot do
    /// (model/lda_moves.rs, docs/lda.md). A phase is a consistent cut plus a few sums over ranks
    /// (one of W x K counts); never after the last sweep.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub split_merge: usize,
    /// The first N sweeps sample with a document prior that falls linearly from 1 (the flat
    /// Dirichlet over a document's mix) to --alpha, so that a document's tokens can leave the
    /// topic its first sweeps put them in (0: --alpha throughout). The likelihoods and the
    /// split-merge moves always use --alpha.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub anneal_alpha: usize,
    /// Words listed per topic in the summary.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top_words: usize,
}

impl Default for LdaOptions {
    fn default() -> Self {
        crate::values::option_defaults()
    }
}

impl LdaOptions {
    /// Checks the options (called with the other options' validation).
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!((1..=u16::MAX as usize).contains(&self.topics), "--topics must be in 1..=65535, got {}", self.topics);
        anyhow::ensure!(self.alpha > 0.0 && self.alpha.is_finite(), "--alpha must be a positive number, got {}", self.alpha);
        anyhow::ensure!(self.beta > 0.0 && self.beta.is_finite(), "--beta must be a positive number, got {}", self.beta);
        anyhow::ensure!(self.clocks_per_sweep >= 1, "--clocks-per-sweep must be at least 1");
        Ok(())
    }
}

/// The document prior the sampler uses in sweep `sweep` (0-based): from max(1, alpha) in sweep 0
/// down to alpha in sweep `--anneal-alpha` and after, linearly. Why (docs/lda.md): with two
/// planted topics per document, the sequential start seats each document wholly in one topic,
/// and at alpha = 0.1 a token of the document's other topic stays there (its document holds ~99
/// tokens in that topic against 0.1 prior elsewhere): the log-likelihood climbed ~0.05 a sweep for
/// 20 sweeps after the split-merge phases, and 1 of 10 seeds still ended with a planted topic
/// merged; from 1 annealed over 5 sweeps it reached the planted value by sweep 14, and over 2, 3
/// or 5 sweeps every seed recovered every planted topic. 2 is the default: over 5 the Austen
/// corpus (K = 20) ended 0.014 lower in log-likelihood per token (median of 6 seeds), over 2
/// within the seeds' spread of no annealing.
pub fn burn_in_alpha(opts: &LdaOptions, sweep: usize) -> f64 {
    let n = opts.anneal_alpha;
    if sweep >= n || opts.alpha >= 1.0 {
        return opts.alpha;
    }
    opts.alpha + (1.0 - opts.alpha) * (n - sweep) as f64 / n as f64
}

/// A rank's topic assignments and document-topic counts (they never leave the rank).
pub struct LocalState {
    pub k: usize,
    /// Topic of every token, aligned with `Corpus::tokens`.
    pub z: Vec<u16>,
    /// Document d's topic counts are `ndk[d*k..(d+1)*k]`.
    pub ndk: Vec<u32>,
}

impl LocalState {
    /// Uniformly random assignments; adds their counts into `nwk` (W x K).
    pub fn random(corpus: &Corpus, k: usize, rng: &mut Rng, nwk: &mut [f32]) -> Self {
        let mut s = LocalState { k, z: Vec::with_capacity(corpus.tokens.len()), ndk: vec![0; corpus.len() * k] };
        for d in 0..corpus.len() {
            for &w in corpus.doc(d) {
                let t = rng.below(k);
                s.z.push(t as u16);
                s.ndk[d * k + t] += 1;
                nwk[w as usize * k + t] += 1.0;
            }
        }
        s
    }

    /// Sequential initialisation by documents: in order, all tokens of a document start in the
    /// topic that explains its words best given the documents before it, i.e. the largest
    /// sum over its tokens of ln((beta + n_wt) / (beta W + n_t)); an empty topic wins when no
    /// topic has seen its words. Counts go on top of `nwk` (another rank's documents), to which
    /// they are added. Why (docs/lda.md): from random assignments, 100 planted topics ended with
    /// 8-22 of them merged in pairs after 50-200 sweeps, and a merge never comes apart (a word of
    /// a merged topic is always likelier there than in an empty topic); token-by-token sequential
    /// starts were no better (a document's tokens scatter over the many empty topics). Costs K
    /// logarithms per token, once.
    pub fn sequential(corpus: &Corpus, opts: &LdaOptions, nwk: &mut [f32]) -> Self {
        let k = opts.topics;
        let mut nk = vec![0f64; k];
        for row in nwk.chunks_exact(k) {
            nk.iter_mut().zip(row).for_each(|(a, &b)| *a += b as f64);
        }
        let beta_w = opts.beta * corpus.words as f64;
        let mut s = LocalState { k, z: Vec::with_capacity(corpus.tokens.len()), ndk: vec![0; corpus.len() * k] };
        let mut score = vec![0f64; k];
        for d in 0..corpus.len() {
            let doc = corpus.doc(d);
            for (t, sc) in score.iter_mut().enumerate() {
                *sc = -(doc.len() as f64) * (beta_w + nk[t]).ln();
            }
            for &w in doc {
                let row = &nwk[w as usize * k..(w as usize + 1) * k];
                score.iter_mut().zip(row).for_each(|(sc, &n)| *sc += (opts.beta + n as f64).ln());
            }
            // Largest score, ties to the lowest topic (the first empty one).
            let t = (0..k).fold(0, |b, t| if score[t] > score[b] { t } else { b });
            for &w in doc {
                s.z.push(t as u16);
                nwk[w as usize * k + t] += 1.0;
            }
            s.ndk[d * k + t] = doc.len() as u32;
            nk[t] += doc.len() as f64;
        }
        s
    }

    /// This rank's own word-topic counts, recounted from the assignments (exact).
    pub fn word_topic(&self, corpus: &Corpus, out: &mut [f64]) {
        for (&w, &t) in corpus.tokens.iter().zip(&self.z) {
            out[w as usize * self.k + t as usize] += 1.0;
        }
    }
}

/// Everything the sampler keeps between tokens of a clock (totals, SparseLDA's buckets).
pub struct Sampler {
    k: usize,
    alpha: f64,
    beta: f64,
    beta_w: f64,
    kind: SamplerKind,
    /// n_k from the replica at the clock's start plus this rank's moves since.
    nk: Vec<i64>,
    /// SparseLDA: c_k = (alpha + n_dk) / (beta W + n_k) for the current document.
    coef: Vec<f64>,
    /// SparseLDA: topics with a (possibly) non-zero count in each word row.
    word_topics: Vec<Vec<u16>>,
    /// SparseLDA: the current document's topics with n_dk > 0.
    doc_topics: Vec<u16>,
    scratch: Vec<f64>,
    /// Tokens sampled so far.
    pub sampled: u64,
}

/// max(n, 0) of a replica cell.
#[inline]
fn cnt(x: f32) -> f64 {
    if x > 0.0 {
        x as f64
    } else {
        0.0
    }
}

impl Sampler {
    /// A sampler for a W x K model.
    pub fn new(opts: &LdaOptions, words: usize) -> Self {
        let k = opts.topics;
        Sampler {
            k,
            alpha: opts.alpha,
            beta: opts.beta,
            beta_w: opts.beta * words as f64,
            kind: opts.sampler,
            nk: vec![0; k],
            coef: vec![0.0; k],
            word_topics: if opts.sampler == SamplerKind::Sparse { vec![Vec::new(); words] } else { Vec::new() },
            doc_topics: Vec::new(),
            scratch: vec![0.0; k],
            sampled: 0,
        }
    }

    /// Samples with the document prior `alpha` from now on (a burn-in may use another).
    pub fn set_alpha(&mut self, alpha: f64) {
        self.alpha = alpha;
    }

    /// The topic totals this sampler uses now.
    pub fn totals(&self) -> &[i64] {
        &self.nk
    }

    /// Takes the replica as it is at the start of a clock: the totals are its column sums (in
    /// integers: exact whatever the corpus size), and SparseLDA's word lists its non-zero cells.
    pub fn begin_clock(&mut self, nwk: &[f32]) {
        let k = self.k;
        self.nk.iter_mut().for_each(|x| *x = 0);
        for (w, row) in nwk.chunks_exact(k).enumerate() {
            for (t, &x) in row.iter().enumerate() {
                self.nk[t] += x.max(0.0) as i64;
            }
            if let Some(list) = self.word_topics.get_mut(w) {
                list.clear();
                list.extend((0..k).filter(|&t| row[t] > 0.0).map(|t| t as u16));
            }
        }
    }

    /// Resamples every token of one document (`tokens`, assignments `z`, counts `ndk`),
    /// updating the replica `nwk` in place.
    pub fn sample_doc(&mut self, tokens: &[u32], z: &mut [u16], ndk: &mut [u32], nwk: &mut [f32], rng: &mut Rng) {
        match self.kind {
            SamplerKind::Dense => self.dense_doc(tokens, z, ndk, nwk, rng),
            SamplerKind::Sparse => self.sparse_doc(tokens, z, ndk, nwk, rng),
        }
        self.sampled += tokens.len() as u64;
    }

    fn dense_doc(&mut self, tokens: &[u32], z: &mut [u16], ndk: &mut [u32], nwk: &mut [f32], rng: &mut Rng) {
        let k = self.k;
        for (i, &w) in tokens.iter().enumerate() {
            let row = &mut nwk[w as usize * k..(w as usize + 1) * k];
            let old = z[i] as usize;
            ndk[old] -= 1;
            row[old] -= 1.0;
            self.nk[old] -= 1;
            let mut sum = 0.0;
            for t in 0..k {
                sum += (self.alpha + ndk[t] as f64) * (self.beta + cnt(row[t])) / (self.beta_w + self.nk[t].max(0) as f64);
                self.scratch[t] = sum;
            }
            let u = rng.next_f64() * sum;
            let new = self.scratch.partition_point(|&c| c <= u).min(k - 1);
            z[i] = new as u16;
            ndk[new] += 1;
            row[new] += 1.0;
            self.nk[new] += 1;
        }
    }

    fn denom(&self, t: usize) -> f64 {
        self.beta_w + self.nk[t].max(0) as f64
    }

    fn sparse_doc(&mut self, tokens: &[u32], z: &mut [u16], ndk: &mut [u32], nwk: &mut [f32], rng: &mut Rng) {
        let (k, a, b) = (self.k, self.alpha, self.beta);
        // Buckets of this document, from scratch (no drift across documents).
        let mut s = 0.0;
        // Indexing: denom borrows self while coef is written.
        #[allow(clippy::needless_range_loop)]
        for t in 0..k {
            let d = self.denom(t);
            s += a * b / d;
            self.coef[t] = (a + ndk[t] as f64) / d;
        }
        self.doc_topics.clear();
        self.doc_topics.extend((0..k).filter(|&t| ndk[t] > 0).map(|t| t as u16));
        let mut r: f64 = self.doc_topics.iter().map(|&t| ndk[t as usize] as f64 * b / self.denom(t as usize)).sum();
        for (i, &w) in tokens.iter().enumerate() {
            let w = w as usize;
            // Take the token out: every bucket term of its old topic changes.
            let old = z[i] as usize;
            let d = self.denom(old);
            s -= a * b / d;
            r -= ndk[old] as f64 * b / d;
            ndk[old] -= 1;
            nwk[w * k + old] -= 1.0;
            self.nk[old] -= 1;
            let d = self.denom(old);
            s += a * b / d;
            r += ndk[old] as f64 * b / d;
            self.coef[old] = (a + ndk[old] as f64) / d;
            if ndk[old] == 0 {
                let at = self.doc_topics.iter().position(|&t| t as usize == old).expect("a topic with a count is listed");
                self.doc_topics.swap_remove(at);
            }
            // Word bucket over the word's listed topics.
            let row = &nwk[w * k..(w + 1) * k];
            let list = &self.word_topics[w];
            let mut q = 0.0;
            for (j, &t) in list.iter().enumerate() {
                q += self.coef[t as usize] * cnt(row[t as usize]);
                self.scratch[j] = q;
            }
            let u = rng.next_f64() * (s + r + q);
            let new = if u < q && !list.is_empty() {
                list[self.scratch[..list.len()].partition_point(|&c| c <= u).min(list.len() - 1)] as usize
            } else if u < q + r && !self.doc_topics.is_empty() {
                let mut acc = q;
                let mut pick = *self.doc_topics.last().expect("non-empty") as usize;
                for &t in &self.doc_topics {
                    acc += ndk[t as usize] as f64 * b / self.denom(t as usize);
                    if u < acc {
                        pick = t as usize;
                        break;
                    }
                }
                pick
            } else {
                let mut acc = q + r;
                let mut pick = k - 1;
                for t in 0..k {
                    acc += a * b / self.denom(t);
                    if u < acc {
                        pick = t;
                        break;
                    }
                }
                pick
            };
            // Put it back under its new topic.
            let d = self.denom(new);
            s -= a * b / d;
            r -= ndk[new] as f64 * b / d;
            if ndk[new] == 0 {
                self.doc_topics.push(new as u16);
            }
            ndk[new] += 1;
            let cell = &mut nwk[w * k + new];
            if *cell <= 0.0 && !self.word_topics[w].contains(&(new as u16)) {
                self.word_topics[w].push(new as u16);
            }
            *cell += 1.0;
            self.nk[new] += 1;
            let d = self.denom(new);
            s += a * b / d;
            r += ndk[new] as f64 * b / d;
            self.coef[new] = (a + ndk[new] as f64) / d;
            z[i] = new as u16;
        }
        // Back to the no-document coefficients is not needed: the next document recomputes them.
    }
}

/// ln Gamma(x) for x > 0 (Lanczos, g = 7, 9 terms; relative error ~1e-15).
pub fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Gamma(x) Gamma(1-x) = pi / sin(pi x).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut acc = G[0];
    for (i, &g) in G.iter().enumerate().skip(1) {
        acc += g / (x + i as f64);
    }
    let t = x + 7.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + acc.ln()
}

/// The word half of the joint log-likelihood ln p(w | z): sum over topics of
/// ln Gamma(W beta) - ln Gamma(W beta + n_k) + sum_w [ln Gamma(beta + n_wk) - ln Gamma(beta)],
/// from the exact global counts `nwk` (W x K).
pub fn word_log_likelihood(nwk: &[f64], k: usize, beta: f64) -> f64 {
    let w = nwk.len() / k;
    let mut nk = vec![0.0; k];
    let lg_b = ln_gamma(beta);
    let mut ll = 0.0;
    for row in nwk.chunks_exact(k) {
        for (t, &n) in row.iter().enumerate() {
            nk[t] += n;
            if n > 0.0 {
                ll += ln_gamma(beta + n) - lg_b;
            }
        }
    }
    let wb = w as f64 * beta;
    ll + nk.iter().map(|&n| ln_gamma(wb) - ln_gamma(wb + n)).sum::<f64>()
}

/// The document half ln p(z) of this rank's documents: sum over documents of
/// ln Gamma(K alpha) - ln Gamma(K alpha + n_d) + sum_k [ln Gamma(alpha + n_dk) - ln Gamma(alpha)].
pub fn doc_log_likelihood(state: &LocalState, alpha: f64) -> f64 {
    let k = state.k;
    let (ka, lg_a) = (k as f64 * alpha, ln_gamma(alpha));
    let mut ll = 0.0;
    for row in state.ndk.chunks_exact(k) {
        let n: u32 = row.iter().sum();
        ll += ln_gamma(ka) - ln_gamma(ka + n as f64);
        for &c in row.iter().filter(|&&c| c > 0) {
            ll += ln_gamma(alpha + c as f64) - lg_a;
        }
    }
    ll
}

/// Document completion on held-out documents (Wallach et al. 2009, "estimated theta"): with the
/// topics phi_wk = (n_wk + beta)/(n_k + W beta) fixed, the first half of each document's tokens
/// (even positions) is Gibbs-sampled `sweeps` times to estimate its mix theta, and the second
/// half is scored by ln sum_k theta_k phi_wk. Returns (log-likelihood sum, tokens scored).
pub fn completion_log_likelihood(test: &Corpus, nwk: &[f64], k: usize, alpha: f64, beta: f64, sweeps: usize, rng: &mut Rng) -> (f64, u64) {
    let w_n = nwk.len() / k;
    let mut nk = vec![0.0; k];
    for row in nwk.chunks_exact(k) {
        nk.iter_mut().zip(row).for_each(|(a, &b)| *a += b);
    }
    let phi = |w: usize, t: usize| (nwk[w * k + t] + beta) / (nk[t] + w_n as f64 * beta);
    let (mut ll, mut scored) = (0.0, 0u64);
    let mut cum = vec![0.0; k];
    for d in 0..test.len() {
        let doc = test.doc(d);
        let first: Vec<usize> = doc.iter().step_by(2).map(|&w| w as usize).collect();
        let mut z: Vec<usize> = first.iter().map(|_| rng.below(k)).collect();
        let mut ndk = vec![0.0; k];
        z.iter().for_each(|&t| ndk[t] += 1.0);
        for _ in 0..sweeps {
            for (i, &w) in first.iter().enumerate() {
                ndk[z[i]] -= 1.0;
                let mut sum = 0.0;
                for t in 0..k {
                    sum += (ndk[t] + alpha) * phi(w, t);
                    cum[t] = sum;
                }
                let u = rng.next_f64() * sum;
                z[i] = cum.partition_point(|&c| c <= u).min(k - 1);
                ndk[z[i]] += 1.0;
            }
        }
        let norm = first.len() as f64 + k as f64 * alpha;
        for &w in doc.iter().skip(1).step_by(2) {
            let p: f64 = (0..k).map(|t| (ndk[t] + alpha) / norm * phi(w as usize, t)).sum();
            ll += p.ln();
            scored += 1;
        }
    }
    (ll, scored)
}

/// The `n` most frequent words of every topic (ties by word id), from W x K counts.
pub fn top_words(nwk: &[f64], k: usize, n: usize) -> Vec<Vec<usize>> {
    let w = nwk.len() / k;
    (0..k)
        .map(|t| {
            let mut ids: Vec<usize> = (0..w).filter(|&i| nwk[i * k + t] > 0.0).collect();
            ids.sort_by(|&a, &b| nwk[b * k + t].total_cmp(&nwk[a * k + t]).then(a.cmp(&b)));
            ids.truncate(n);
            ids
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K topics over disjoint blocks of `per` words; each document mixes two topics.
    fn planted(k: usize, per: usize, docs: usize, len: usize, seed: u64) -> Corpus {
        let mut rng = Rng::new(seed);
        let mut c = Corpus { doc_ptr: vec![0], words: k * per, ..Default::default() };
        for d in 0..docs {
            let (t1, t2) = (rng.below(k), rng.below(k));
            for _ in 0..len {
                let t = if rng.next_f64() < 0.7 { t1 } else { t2 };
                c.tokens.push((t * per + rng.below(per)) as u32);
            }
            c.doc_ptr.push(c.tokens.len());
            c.doc_ids.push(d as u64 + 1);
        }
        c
    }

    fn opts(k: usize, sampler: SamplerKind) -> LdaOptions {
        LdaOptions { topics: k, sampler, ..LdaOptions::default() }
    }

    fn train(c: &Corpus, o: &LdaOptions, sweeps: usize, seed: u64) -> (Vec<f32>, LocalState, Sampler) {
        let mut rng = Rng::new(seed);
        let mut nwk = vec![0f32; c.words * o.topics];
        let mut st = LocalState::random(c, o.topics, &mut rng, &mut nwk);
        let mut s = Sampler::new(o, c.words);
        for _ in 0..sweeps {
            s.begin_clock(&nwk);
            for d in 0..c.len() {
                let (a, b) = (c.doc_ptr[d], c.doc_ptr[d + 1]);
                s.sample_doc(&c.tokens[a..b], &mut st.z[a..b], &mut st.ndk[d * o.topics..(d + 1) * o.topics], &mut nwk, &mut rng);
            }
        }
        (nwk, st, s)
    }

    #[test]
    fn both_samplers_keep_counts_consistent_and_recover_planted_topics() {
        let c = planted(8, 12, 300, 60, 4);
        for kind in [SamplerKind::Sparse, SamplerKind::Dense] {
            let o = opts(8, kind);
            let (nwk, st, s) = train(&c, &o, 60, 7);
            let mut own = vec![0.0; nwk.len()];
            st.word_topic(&c, &mut own);
            assert!(nwk.iter().zip(&own).all(|(a, &b)| *a as f64 == b), "{kind:?}: replica = recount");
            let nk: Vec<i64> = (0..8).map(|t| (0..c.words).map(|w| nwk[w * 8 + t] as i64).sum()).collect();
            assert_eq!(s.totals(), &nk[..], "{kind:?}");
            for (d, row) in st.ndk.chunks_exact(8).enumerate() {
                assert_eq!(row.iter().sum::<u32>() as usize, c.doc(d).len());
            }
            let top = top_words(&own, 8, 10);
            for planted in 0..8 {
                let best = top.iter().map(|t| t.iter().filter(|&&w| w / 12 == planted).count()).max().unwrap();
                assert!(best >= 8, "{kind:?}: planted topic {planted} best match {best}/10");
            }
        }
    }

    #[test]
    fn the_log_likelihood_rises_from_random_assignments() {
        let c = planted(5, 10, 100, 40, 1);
        let o = opts(5, SamplerKind::Sparse);
        let ll = |nwk: &[f32], st: &LocalState| {
            let g: Vec<f64> = nwk.iter().map(|&x| x as f64).collect();
            (word_log_likelihood(&g, 5, o.beta) + doc_log_likelihood(st, o.alpha)) / c.tokens.len() as f64
        };
        let (n0, s0, _) = train(&c, &o, 0, 3);
        let (n1, s1, _) = train(&c, &o, 30, 3);
        assert!(ll(&n1, &s1) > ll(&n0, &s0) + 0.3, "{} -> {}", ll(&n0, &s0), ll(&n1, &s1));
        // Document completion: a trained model beats the uniform perplexity W.
        let held = planted(5, 10, 30, 40, 99);
        let g: Vec<f64> = n1.iter().map(|&x| x as f64).collect();
        let (lls, n) = completion_log_likelihood(&held, &g, 5, o.alpha, o.beta, 10, &mut Rng::new(1));
        let ppl = (-lls / n as f64).exp();
        assert!(ppl < 20.0, "perplexity {ppl} (uniform: 50, planted: about 10-15)");
    }

    #[test]
    fn the_burn_in_prior_falls_from_one_to_alpha() {
        let o = LdaOptions { alpha: 0.1, anneal_alpha: 5, ..LdaOptions::default() };
        let a: Vec<f64> = (0..7).map(|s| burn_in_alpha(&o, s)).collect();
        assert!((a[0] - 1.0).abs() < 1e-12 && (a[4] - (0.1 + 0.9 * 0.2)).abs() < 1e-12, "{a:?}");
        assert!(a.windows(2).all(|w| w[1] <= w[0]) && a[5] == 0.1 && a[6] == 0.1, "{a:?}");
        let off = LdaOptions { anneal_alpha: 0, ..o.clone() };
        assert_eq!(burn_in_alpha(&off, 0), 0.1);
        let large = LdaOptions { alpha: 2.0, ..o };
        assert_eq!(burn_in_alpha(&large, 0), 2.0, "a prior of 1 or more is not raised");
    }

    #[test]
    fn ln_gamma_matches_factorials() {
        let mut f = 0.0f64;
        for n in 1..30 {
            assert!((ln_gamma(n as f64) - f).abs() < 1e-9 * f.max(1.0), "n {n}");
            f += (n as f64).ln();
        }
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
        assert!((ln_gamma(0.1) - 2.252_712_651_734_206).abs() < 1e-10);
    }
}
