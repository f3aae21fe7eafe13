"""read_model on an LDA model that `train --model lda --save-model` wrote (run by tests/python.rs,
no MPI job; issue 43 item 6):

    python tests/python/read_lda.py MODEL.h5 TRAIN_DOCWORD METRICS.jsonl TOPICS

Invariants: the word-topic counts are the final sample's, so each word's row sums to that
word's token count in the training docword file (read here with numpy), and all of them to its
tokens; the top words are the run's summary's.
"""

import sys

import numpy as np

import asap_train as at

model_path, docword, metrics_path, topics = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
m = at.read_model(model_path)
with open(docword) as f:
    docs, words, _ = (int(next(f)) for _ in range(3))
    triples = np.loadtxt(f, dtype=np.int64).reshape(-1, 3)
per_word = np.bincount(triples[:, 1] - 1, weights=triples[:, 2], minlength=words).astype(np.int64)
wt = m["word_topic"]
assert m["spec"] == {"kind": "lda", "topics": topics, "words": words, "alpha": m["spec"]["alpha"], "beta": m["spec"]["beta"]}, m["spec"]
assert wt.shape == (words, topics) and wt.dtype == np.uint32, (wt.shape, wt.dtype)
assert np.array_equal(wt.sum(axis=1, dtype=np.int64), per_word), "a word's counts over the topics are not its token count"
assert int(wt.sum()) == int(triples[:, 2].sum())
summary = [l for l in at.read_metrics(metrics_path) if l.get("event") == "summary"][0]
assert m["top_words"] == summary["top_words"], (m["top_words"], summary["top_words"])
assert m["metrics"]["perplexity"] == summary["perplexity"] and m["config"]["model"] == "lda", m["config"].get("model")
print("read_lda ok tokens %d topics %d" % (int(wt.sum()), topics))
