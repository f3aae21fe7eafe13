#!/usr/bin/python3
"""The exact optimum of asap-train's --model lsq objective, for benches/async.sh:

    F(w, b) = 1/N sum_i 1/2 (x_i.w + b - y_i)^2 + lambda/2 ||w||^2

solved in float64 from the normal equations (the bias is not regularised), on the data exactly
as asap-train sees it: IDX images standardised with the training set's mean and population
variance per column (--scale auto on dense data; columns with variance <= 1e-12 only centred),
LIBSVM rows as read (--scale auto leaves sparse data alone); labels >= T become +1, the rest -1
(--label-threshold T). Prints one JSON line: {"optimum": F*, "examples": N, "features": d}.
Needs numpy (Debian: python3-numpy)."""
import gzip, json, struct, sys

import numpy as np


def idx(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def load(path, features):
    if "idx3" in path:
        x = idx(path).reshape(-1, 28 * 28).astype(np.float32).astype(np.float64)
        y = idx(path.replace("images-idx3", "labels-idx1")).astype(np.float64)
        mean = x.mean(axis=0)
        var = np.maximum((x * x).mean(axis=0) - mean * mean, 0.0)
        scale = np.where(var > 1e-12, 1.0 / np.sqrt(np.where(var > 0, var, 1.0)), 1.0)
        return ((x - mean) * scale).astype(np.float32).astype(np.float64), y
    rows, ys = [], []
    for line in open(path):
        parts = line.split()
        if not parts:
            continue
        ys.append(float(parts[0]))
        rows.append([(int(k) - 1, float(v)) for k, v in (p.split(":") for p in parts[1:])])
    d = features or 1 + max(k for r in rows for k, _ in r)
    x = np.zeros((len(rows), d))
    for i, r in enumerate(rows):
        for k, v in r:
            x[i, k] = np.float32(v)
    return x, np.array(ys)


def main():
    path, lam, threshold = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    features = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    x, y = load(path, features)
    if threshold != "none":
        y = np.where(y >= float(threshold), 1.0, -1.0)
    n, d = x.shape
    xt = np.hstack([x, np.ones((n, 1))])
    h = xt.T @ xt / n
    h[np.arange(d), np.arange(d)] += lam
    w = np.linalg.solve(h, xt.T @ y / n)
    r = xt @ w - y
    opt = 0.5 * np.mean(r * r) + 0.5 * lam * np.sum(w[:d] ** 2)
    print(json.dumps({"optimum": opt, "examples": n, "features": d}))


main()
