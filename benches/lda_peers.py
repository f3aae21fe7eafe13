"""Peers of `asap-train --model lda` on one corpus: scikit-learn's LatentDirichletAllocation
(variational Bayes) and the `lda` package (collapsed Gibbs, Cython), each trained for a few
iteration budgets; every model, ours included (saved word_topic counts), is scored by the same
held-out document completion as asap-train's: the even positions of each held-out document are
Gibbs-sampled 20 times with the topics fixed, the odd positions are scored.

usage: lda_peers.py TRAIN_DOCWORD TEST_DOCWORD K OURS_H5:SECONDS... (run by benches/lda-peers.sh)
"""
import sys
import time

import h5py
import numpy as np
import scipy.sparse as sp

ALPHA, BETA, SWEEPS = 0.1, 0.1, 20


def read_docword(path, words=None):
    with open(path) as f:
        d, w, _ = (int(f.readline()) for _ in range(3))
        body = np.loadtxt(f, dtype=np.int64, ndmin=2)
    return sp.csr_matrix((body[:, 2], (body[:, 0] - 1, body[:, 1] - 1)), shape=(d, words or w))


def completion_perplexity(phi, test, seed=1):
    """phi: K x W topic-word probabilities."""
    rng = np.random.default_rng(seed)
    k = phi.shape[0]
    ll, n = 0.0, 0
    for d in range(test.shape[0]):
        row = test.getrow(d)
        tokens = np.repeat(row.indices, row.data)
        if len(tokens) < 2:
            continue
        first, second = tokens[0::2], tokens[1::2]
        z = rng.integers(k, size=len(first))
        ndk = np.bincount(z, minlength=k).astype(float)
        for _ in range(SWEEPS):
            for i, w in enumerate(first):
                ndk[z[i]] -= 1
                p = (ndk + ALPHA) * phi[:, w]
                z[i] = np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right")
                z[i] = min(z[i], k - 1)
                ndk[z[i]] += 1
        theta = (ndk + ALPHA) / (len(first) + k * ALPHA)
        ll += np.log(theta @ phi[:, second]).sum()
        n += len(second)
    return float(np.exp(-ll / n))


def main():
    train_path, test_path, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    train = read_docword(train_path)
    test = read_docword(test_path, train.shape[1])
    rows = []
    for spec in sys.argv[4:]:
        path, seconds = spec.split(":")
        with h5py.File(path) as f:
            nwk = f["word_topic"][:].astype(float)
            sweeps = f.attrs["config"]
        cfg = __import__("json").loads(sweeps)
        phi = ((nwk + BETA) / (nwk.sum(0) + nwk.shape[0] * BETA)).T
        rows.append(("asap-train (1 rank, SparseLDA)", cfg["epochs"], float(seconds), completion_perplexity(phi, test)))
    from sklearn.decomposition import LatentDirichletAllocation

    for it in (10, 25, 50):
        m = LatentDirichletAllocation(n_components=k, doc_topic_prior=ALPHA, topic_word_prior=BETA, learning_method="batch", max_iter=it, random_state=1)
        t = time.perf_counter()
        m.fit(train)
        secs = time.perf_counter() - t
        phi = m.components_ / m.components_.sum(1, keepdims=True)
        rows.append(("scikit-learn LDA (batch VB)", it, secs, completion_perplexity(phi, test)))
    try:
        import lda
    except ImportError:
        lda = None
    if lda is not None:
        for it in (25, 50, 100):
            m = lda.LDA(n_topics=k, n_iter=it, alpha=ALPHA, eta=BETA, random_state=1)
            t = time.perf_counter()
            m.fit(train.astype(np.int64))
            secs = time.perf_counter() - t
            rows.append(("lda package (collapsed Gibbs)", it, secs, completion_perplexity(m.topic_word_, test)))
    tokens = int(train.sum())
    print(f"corpus {train_path}: {train.shape[0]} documents, {train.shape[1]} words, {tokens} tokens; held out {test.shape[0]} documents; K = {k}\n")
    print("| sampler | iterations | train seconds | tokens x iterations / s | held-out perplexity |")
    print("|---|---|---|---|---|")
    for name, it, secs, ppl in rows:
        print(f"| {name} | {it} | {secs:.2f} | {tokens * it / secs / 1e6:.2f} M | {ppl:.1f} |")


if __name__ == "__main__":
    main()
