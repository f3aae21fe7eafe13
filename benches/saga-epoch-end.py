#!/usr/bin/env python3
"""An independent NumPy SAGA, as `--sync async --barrier bsp --optimizer saga` runs it: M workers
each take one mini-batch step from the shared model, leaving out the mean stored gradient A;
the results are averaged and A is added once per round (the mean before the round's changes).
Least squares on Fashion-MNIST t10k (standardised, label +1 for classes >= 5), lambda 0.

It shows why the last mini-batch of an epoch must hold the examples left: with `wrap` it takes
the epoch's first examples again (as asap-train did before 2026-11-27), and the objective jumps
at every epoch's last round; with `tail` it does not. Per round it prints the objective, and at
the last two rounds of each epoch how far the SAGA estimate is from the true gradient.

    python3 benches/saga-epoch-end.py wrap    # 13: 0.2945 (12: 0.1706)
    python3 benches/saga-epoch-end.py tail    # 13: 0.1696
and asap-train itself (8 ranks, the same data; round 13 gives 0.1704 since the fix, 0.2969
before it):
    mpirun -n 8 target/release/asap-train train --data .../t10k-images-idx3-ubyte.gz \\
        --label-threshold 5 --model lsq --lambda 1e-4 --lr-schedule constant --sync async \\
        --barrier bsp --optimizer saga --lr 0.01 --batch-size 100 --epochs 2 --eval-every 1
"""
import gzip
import sys

import numpy as np

FASHION = "/usr/share/datasets/fashion-mnist"
mode = sys.argv[1] if len(sys.argv) > 1 else "tail"
assert mode in ("wrap", "tail"), "usage: saga-epoch-end.py wrap|tail"
X = np.frombuffer(gzip.open(f"{FASHION}/t10k-images-idx3-ubyte.gz").read()[16:], np.uint8).reshape(-1, 784).astype(np.float64)
labels = np.frombuffer(gzip.open(f"{FASHION}/t10k-labels-idx1-ubyte.gz").read()[8:], np.uint8)
y = np.where(labels >= 5, 1.0, -1.0)
sd = X.std(0)
sd[sd == 0] = 1
X = np.hstack([(X - X.mean(0)) / sd, np.ones((len(X), 1))])  # bias last
N, d = X.shape
M, lr, b, epochs = 8, 0.01, 100, 2
rng = np.random.default_rng(1)
shards = np.array_split(rng.permutation(N), M)
w, A, h = np.zeros(d), np.zeros(d), np.zeros(N)  # h: stored slope per example (0: none yet)
steps = -(-len(shards[0]) // b)
out, rnd = [], 0
for ep in range(epochs):
    perms = [rng.permutation(s) for s in shards]
    for st in range(steps):
        corr, change = np.zeros(d), np.zeros(d)
        for p in perms:
            n = len(p)
            idx = p[[(st * b + j) % n for j in range(b)]] if mode == "wrap" else p[st * b:(st + 1) * b]
            s = X[idx] @ w - y[idx]
            c = s - h[idx]
            h[idx] = s
            corr += (c @ X[idx]) / len(idx) / M
            change += (c @ X[idx]) / N
        grad = X.T @ (X @ w - y) / N
        est = corr + A
        if st >= steps - 2:
            print(f"round {rnd + 1}: SAGA estimate {np.linalg.norm(est - grad):.2f} from the true gradient (|gradient| {np.linalg.norm(grad):.2f})")
        w, A, rnd = w - lr * est, A + change, rnd + 1
        r = X @ w - y
        out.append(f"{rnd}:{0.5 * np.mean(r * r):.4f}")
print(" ".join(out))
