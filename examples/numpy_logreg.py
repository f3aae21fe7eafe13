"""Softmax (multinomial logistic) regression on Fashion-MNIST in plain numpy, data-parallel over
MPI ranks, with asap-train's reducer averaging the models after every mini-batch step.

    make python
    mpirun -n 8 .venv-python/bin/python examples/numpy_logreg.py --sync asap
    mpirun -n 8 .venv-python/bin/python examples/numpy_logreg.py --sync allreduce

Each rank trains its own replica on its shard (every N-th example of a seeded permutation) and
calls reducer.sync(params) after each step; finish() leaves the average of the replicas on every
rank, which rank 0 scores on the 10,000 test images. Data: Debian's dataset-fashion-mnist.
"""

import argparse
import gzip
import os
import sys
import time

import numpy as np

import asap_train as at

FASHION = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (the MNIST family's format, gzip-compressed) as a uint8 array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(kind):
    images = read_idx(os.path.join(FASHION, "%s-images-idx3-ubyte.gz" % kind))
    labels = read_idx(os.path.join(FASHION, "%s-labels-idx1-ubyte.gz" % kind))
    return images.reshape(len(images), -1), labels.astype(np.int64)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sync", choices=["asap", "allreduce", "none"], default="asap")
    p.add_argument("--graph", default="auto", help="asap's --graph (auto, exponential, ring, ...)")
    p.add_argument("--notify", default="notify-ack", help="asap's --notify")
    p.add_argument("--staleness", type=int, default=None, help="asap's --staleness (notify-ack)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--lr-decay", type=float, default=0.8, help="step size factor per epoch")
    p.add_argument("--lambda", dest="lam", type=float, default=1e-4, help="L2 regularisation")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rank, size = at.rank, at.size

    # This rank's shard: every size-th example of one seeded permutation (the same on all ranks).
    X_all, y_all = load("train")
    perm = np.random.default_rng(args.seed).permutation(len(y_all))[rank::size]
    X, y = X_all[perm].astype(np.float32), y_all[perm]
    count_all = len(y_all)
    del X_all
    # Standardise with the whole training set's statistics, combined over the ranks' shards.
    sums = at.allreduce_sum(np.concatenate([X.sum(0, dtype=np.float64), (X.astype(np.float64) ** 2).sum(0), [len(y)]]))
    d = X.shape[1]
    count = sums[-1]
    mean = sums[:d] / count
    std = np.sqrt(np.maximum(sums[d : 2 * d] / count - mean**2, 0.0))
    std[std < 1e-8] = 1.0
    X = ((X - mean) / std).astype(np.float32)
    classes = 10

    # One flat float32 vector holds the model; W and b are views into it (no copies).
    params, shapes = at.flatten([np.zeros((d, classes)), np.zeros(classes)])
    W, b = at.unflatten(params, shapes)
    options = {}
    if args.sync == "asap":
        options = {"graph": args.graph, "notify": args.notify, "staleness": args.staleness}
    reducer = at.Reducer(params, sync=args.sync, seed=args.seed, **options)

    rng = np.random.default_rng(args.seed * 7919 + rank)
    # Every rank runs the same number of rounds: the smallest shard decides.
    steps = (count_all // size) // args.batch_size
    lr = args.lr
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        order = rng.permutation(len(y))
        for s in range(steps):
            idx = order[s * args.batch_size : (s + 1) * args.batch_size]
            xb, yb = X[idx], y[idx]
            z = xb @ W + b
            z -= z.max(1, keepdims=True)
            prob = np.exp(z)
            prob /= prob.sum(1, keepdims=True)
            prob[np.arange(len(yb)), yb] -= 1.0
            prob /= len(yb)
            W -= np.float32(lr) * (xb.T @ prob + np.float32(args.lam) * W)
            b -= np.float32(lr) * prob.sum(0)
            reducer.sync(params)
        lr *= args.lr_decay
    train_seconds = time.perf_counter() - t0
    reducer.finish(params)  # the average of the replicas, on every rank
    g = reducer.global_stats()

    if rank == 0:
        Xt, yt = load("t10k")
        Xt = ((Xt.astype(np.float32) - mean) / std).astype(np.float32)
        acc = float(((Xt @ W + b).argmax(1) == yt).mean())
        print("final test accuracy %.4f (sync %s, %d ranks, %d epochs, %d rounds)" % (acc, args.sync, size, args.epochs, args.epochs * steps))
        line = "train seconds %.2f, bytes sent per rank per round %.0f" % (train_seconds, g["bytes_sent_mean"] / max(1, args.epochs * steps))
        if args.sync == "asap":
            line += ", torn %d, consistency histogram %s, graph %s" % (g["torn"], g["consistency_histogram"], reducer.info["report"]["name"])
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
