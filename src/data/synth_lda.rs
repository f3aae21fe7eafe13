//! A seeded synthetic corpus with planted topics (`asap-train data synth-lda`), written in the
//! UCI bag-of-words format, so that topic recovery can be checked and LDA can be run at the shape
//! of NYTimes (300,000 documents, 102,660 words, 99.5M tokens) without downloading anything.
//!
//! Topic t owns the words `t*W/K .. (t+1)*W/K` (disjoint blocks) and draws its j-th word with
//! probability proportional to (j+1)^-s (`word_exponent` s; 1 is Zipf, as real vocabularies; s =
//! 1 + a is the discrete Pareto tail of shape a). Document d (its own RNG stream: (seed, d)) has
//! a length uniform in [L/2, 3L/2] and a topic mix: from a symmetric Dirichlet(alpha), or, with
//! `topics_per_doc` N >= 1, N distinct topics drawn uniformly with equal shares; each token draws
//! a topic from the mix, then a word from the topic. The vocabulary names word j of topic t
//! `t<t>_w<j>`, so the planted topic of every word is visible.

use std::io::Write;

use crate::rng::Rng;

/// What to generate.
#[derive(Clone, Debug)]
pub struct LdaSynthSpec {
    pub docs: usize,
    pub words: usize,
    pub topics: usize,
    /// Mean document length in tokens.
    pub doc_length: usize,
    /// Dirichlet parameter of the document mixes (small: few topics per document).
    pub alpha: f64,
    /// 0: mixes from Dirichlet(alpha); N >= 1: N distinct topics a document, equal shares.
    pub topics_per_doc: usize,
    /// Word j of a topic's block has weight (j+1)^-s.
    pub word_exponent: f64,
    pub seed: u64,
}

impl LdaSynthSpec {
    /// The planted topic of word `w` (0-based).
    pub fn topic_of(&self, w: usize) -> usize {
        planted_topic(w, self.words, self.topics)
    }
}

/// The planted topic of word `w` of `words` split into `topics` blocks.
pub fn planted_topic(w: usize, words: usize, topics: usize) -> usize {
    // Block t is [t*W/K, (t+1)*W/K): the largest t with t*W/K <= w.
    let t = (w * topics) / words;
    if (t + 1) * words / topics <= w {
        t + 1
    } else {
        t
    }
}

/// Cumulative power-law weights (j+1)^-s of a block of `n` words.
fn power_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut c: Vec<f64> = (0..n)
        .map(|j| {
            acc += ((j + 1) as f64).powf(-s);
            acc
        })
        .collect();
    c.iter_mut().for_each(|x| *x /= acc);
    c
}

/// Document `d`: sorted (word, count) pairs.
fn document(spec: &LdaSynthSpec, d: usize, cdfs: &[Vec<f64>]) -> Vec<(u32, u32)> {
    let mut rng = Rng::for_stream(spec.seed, d as u64);
    let k = spec.topics;
    let mut theta: Vec<f64> = if spec.topics_per_doc == 0 {
        (0..k).map(|_| rng.gamma(spec.alpha)).collect()
    } else {
        // N distinct topics, uniformly (a partial Fisher-Yates shuffle), equal shares.
        let mut ids: Vec<usize> = (0..k).collect();
        let mut th = vec![0.0; k];
        for i in 0..spec.topics_per_doc.min(k) {
            ids.swap(i, i + rng.below(k - i));
            th[ids[i]] = 1.0;
        }
        th
    };
    let mut acc = 0.0;
    for x in theta.iter_mut() {
        acc += *x;
        *x = acc;
    }
    let lo = (spec.doc_length / 2).max(1);
    let len = lo + rng.below(spec.doc_length.max(1) + 1);
    let mut words = Vec::with_capacity(len);
    for _ in 0..len {
        let u = rng.next_f64() * acc;
        let t = theta.partition_point(|&c| c <= u).min(k - 1);
        let start = t * spec.words / k;
        let v = rng.next_f64();
        let j = cdfs[t].partition_point(|&c| c <= v).min(cdfs[t].len() - 1);
        words.push((start + j) as u32);
    }
    words.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::new();
    for w in words {
        match out.last_mut() {
            Some((lw, c)) if *lw == w => *c += 1,
            _ => out.push((w, 1)),
        }
    }
    out
}

/// Writes the docword file (two passes over the per-document streams: NNZ comes first) and
/// returns (NNZ, tokens).
pub fn write_docword(spec: &LdaSynthSpec, out: &mut impl Write) -> anyhow::Result<(u64, u64)> {
    anyhow::ensure!(
        spec.topics >= 1 && spec.words >= spec.topics,
        "--words ({}) must be at least --topics ({}) >= 1",
        spec.words,
        spec.topics
    );
    anyhow::ensure!(spec.docs >= 1 && spec.doc_length >= 1, "--docs and --doc-length must be positive");
    anyhow::ensure!(spec.alpha > 0.0 && spec.alpha.is_finite(), "--alpha must be positive, got {}", spec.alpha);
    anyhow::ensure!(
        spec.topics_per_doc <= spec.topics,
        "--topics-per-doc ({}) must be at most --topics ({})",
        spec.topics_per_doc,
        spec.topics
    );
    anyhow::ensure!(
        spec.word_exponent >= 0.0 && spec.word_exponent.is_finite(),
        "--word-exponent must be a non-negative number, got {}",
        spec.word_exponent
    );
    let k = spec.topics;
    let cdfs: Vec<Vec<f64>> = (0..k).map(|t| power_cdf((t + 1) * spec.words / k - t * spec.words / k, spec.word_exponent)).collect();
    let nnz: u64 = (0..spec.docs).map(|d| document(spec, d, &cdfs).len() as u64).sum();
    writeln!(out, "{}\n{}\n{nnz}", spec.docs, spec.words)?;
    let mut tokens = 0u64;
    for d in 0..spec.docs {
        for (w, c) in document(spec, d, &cdfs) {
            writeln!(out, "{} {} {c}", d + 1, w + 1)?;
            tokens += c as u64;
        }
    }
    Ok((nnz, tokens))
}

/// Writes the vocabulary: `t<t>_w<j>` for word j of topic t's block.
pub fn write_vocab(spec: &LdaSynthSpec, out: &mut impl Write) -> std::io::Result<()> {
    for w in 0..spec.words {
        let t = spec.topic_of(w);
        writeln!(out, "t{t}_w{}", w - t * spec.words / spec.topics)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_disjoint_and_cover_the_vocabulary() {
        for (w, k) in [(10, 3), (100, 100), (1000, 7)] {
            let mut last = 0;
            for i in 0..w {
                let t = planted_topic(i, w, k);
                assert!(t < k && t >= last && i >= t * w / k && i < (t + 1) * w / k, "w {w} k {k} word {i} topic {t}");
                last = t;
            }
        }
    }

    #[test]
    fn the_corpus_reads_back_and_documents_keep_to_few_topics() {
        let spec =
            LdaSynthSpec { docs: 50, words: 200, topics: 10, doc_length: 40, alpha: 0.05, topics_per_doc: 0, word_exponent: 1.0, seed: 3 };
        let mut text = Vec::new();
        let (nnz, tokens) = write_docword(&spec, &mut text).unwrap();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&text).unwrap();
        let c = crate::data::bow::read_docword(f.path().to_str().unwrap(), 0, 1).unwrap();
        assert_eq!((c.lines, c.tokens.len() as u64, c.len(), c.words), (nnz, tokens, 50, 200));
        // With alpha = 0.05 most of a document's tokens come from one topic.
        let mut dominant = 0.0;
        for d in 0..c.len() {
            let mut per = [0usize; 10];
            c.doc(d).iter().for_each(|&w| per[spec.topic_of(w as usize)] += 1);
            dominant += *per.iter().max().unwrap() as f64 / c.doc(d).len() as f64;
        }
        assert!(dominant / 50.0 > 0.7, "mean dominant share {}", dominant / 50.0);
        let mut g = Rng::new(1);
        let m: f64 = (0..20000).map(|_| g.gamma(0.3)).sum::<f64>() / 20000.0;
        assert!((m - 0.3).abs() < 0.02, "Gamma(0.3) mean {m}");
    }

    /// `topics_per_doc` 2: every document holds words of exactly two planted topics (about half
    /// each), and the first word of a block is drawn 2^s times as often as the second.
    #[test]
    fn two_topics_per_document_with_a_skewed_word_choice() {
        let spec =
            LdaSynthSpec { docs: 300, words: 400, topics: 10, doc_length: 100, alpha: 0.1, topics_per_doc: 2, word_exponent: 2.0, seed: 5 };
        let cdfs: Vec<Vec<f64>> = (0..10).map(|_| power_cdf(40, 2.0)).collect();
        let (mut first, mut second) = (0usize, 0usize);
        for d in 0..spec.docs {
            let doc = document(&spec, d, &cdfs);
            let mut per = [0u32; 10];
            doc.iter().for_each(|&(w, c)| per[spec.topic_of(w as usize)] += c);
            let n: u32 = per.iter().sum();
            assert_eq!(per.iter().filter(|&&c| c > 0).count(), 2, "document {d}: {per:?}");
            assert!(per.iter().all(|&c| c == 0 || c as f64 > 0.2 * n as f64), "document {d}: {per:?}");
            doc.iter().for_each(|&(w, c)| match w % 40 {
                0 => first += c as usize,
                1 => second += c as usize,
                _ => {}
            });
        }
        let ratio = first as f64 / second as f64;
        assert!((3.5..4.5).contains(&ratio), "first / second word {ratio} (expected 4)");
    }
}
