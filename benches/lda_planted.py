#!/usr/bin/env python3
"""Planted-topic recovery (issue 44 item 1), used by benches/lda-planted.sh.

  lda_planted.py score MODEL.h5 W K          -> prints "recovered R of K" for an asap-train model
  lda_planted.py sklearn DOCWORD K SEED ITERS -> the same for scikit-learn's batch VB LDA
                                                 (alpha = beta = 0.1, the asap-train defaults)

Criterion: planted topic p (words p*W/K .. (p+1)*W/K) is recovered when one learned topic t holds
at least 80 % of p's tokens (coverage) and p's words are at least 80 % of t's tokens (purity).
Two learned topics cannot both hold 80 % of p, so a recovered planted topic has exactly one
learned topic; a merged pair (about half each) fails purity and a topic split over two fails
coverage.
"""
import sys

import numpy as np

THRESHOLD = 0.8


def recovered(counts, k_planted):
    """counts: W x K learned word-topic counts (float); returns the number of planted topics recovered."""
    w, k = counts.shape
    # The block of word p: the largest t with t*W/K <= p (as synth_lda's planted_topic).
    block = np.array([max(t for t in range(k_planted) if t * w // k_planted <= p) for p in range(w)])
    per = np.zeros((k_planted, k))
    for p in range(k_planted):
        per[p] = counts[block == p].sum(axis=0)
    topic_tot = counts.sum(axis=0)
    planted_tot = per.sum(axis=1)
    purity = per / np.maximum(topic_tot, 1e-300)[None, :]
    coverage = per / np.maximum(planted_tot, 1e-300)[:, None]
    ok = ((purity >= THRESHOLD) & (coverage >= THRESHOLD)).any(axis=1)
    return int(ok.sum())


def read_docword(path):
    from scipy.sparse import csr_matrix
    with open(path) as f:
        d, w, _ = int(f.readline()), int(f.readline()), int(f.readline())
        rows, cols, vals = [], [], []
        for line in f:
            a, b, c = line.split()
            rows.append(int(a) - 1)
            cols.append(int(b) - 1)
            vals.append(int(c))
    return csr_matrix((vals, (rows, cols)), shape=(d, w), dtype=np.float64)


def main():
    if sys.argv[1] == "score":
        import h5py
        path, w, k = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        counts = h5py.File(path, "r")["word_topic"][:].astype(np.float64)
        assert counts.shape[0] == w, counts.shape
        print(f"recovered {recovered(counts, k)} of {k}")
    elif sys.argv[1] == "sklearn":
        from sklearn.decomposition import LatentDirichletAllocation
        path, k, seed, iters = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        x = read_docword(path)
        lda = LatentDirichletAllocation(n_components=k, doc_topic_prior=0.1, topic_word_prior=0.1,
                                        learning_method="batch", max_iter=iters, random_state=seed)
        lda.fit(x)
        # components_ is beta + the expected counts: the counts, W x K.
        counts = (lda.components_ - 0.1).T.clip(min=0)
        print(f"recovered {recovered(counts, k)} of {k}")
    else:
        sys.exit(f"unknown command {sys.argv[1]}")


if __name__ == "__main__":
    main()
