"""Peer tools on the data asap-train's report uses (Fashion-MNIST from Debian's
dataset-fashion-mnist, pixels scaled to [0, 1]): scikit-learn (python3-sklearn) SGDClassifier and
LogisticRegression, and LIBLINEAR (liblinear-tools) L2-loss SVM and logistic regression, each on
the first ROWS training images, scored on the 10,000 test images. Seconds are the fit alone for
scikit-learn, and the whole liblinear-train process (it parses its LIBSVM text input) for
LIBLINEAR, as a user would see it. Writes a JSON list of rows to --out.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

FASHION = "/usr/share/datasets/fashion-mnist"


def idx(path):
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def libsvm(path, X, y):
    with open(path, "w") as f:
        for row, label in zip(X, y):
            nz = np.nonzero(row)[0]
            f.write(f"{label} " + " ".join(f"{j + 1}:{row[j]:.4g}" for j in nz) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=60000)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    X = idx(f"{FASHION}/train-images-idx3-ubyte.gz")[: a.rows].reshape(-1, 784).astype(np.float32) / 255
    y = idx(f"{FASHION}/train-labels-idx1-ubyte.gz")[: a.rows].astype(int)
    Xt = idx(f"{FASHION}/t10k-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255
    yt = idx(f"{FASHION}/t10k-labels-idx1-ubyte.gz").astype(int)
    rows = []
    from sklearn.linear_model import LogisticRegression, SGDClassifier
    import sklearn

    for name, est, epochs in [
        ("scikit-learn SGDClassifier log_loss, 5 epochs", SGDClassifier(loss="log_loss", max_iter=5, tol=None, random_state=1), 5),
        ("scikit-learn LogisticRegression lbfgs", LogisticRegression(max_iter=100), None),
    ]:
        t = time.perf_counter()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # lbfgs stops at max_iter: a result, reported as such
            est.fit(X, y)
        dt = time.perf_counter() - t
        acc = float((est.predict(Xt) == yt).mean())
        rows.append({"tool": name, "version": sklearn.__version__, "accuracy": acc, "seconds": dt,
                     "examples_per_second": len(X) * epochs / dt if epochs else None})
        print(f"{name}: {100 * acc:.2f} % in {dt:.1f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory() as d:
        tr, te = os.path.join(d, "train.svm"), os.path.join(d, "test.svm")
        libsvm(tr, X, y)
        libsvm(te, Xt, yt)
        for s, name in [(2, "LIBLINEAR -s 2 (L2-loss SVM, dual)"), (0, "LIBLINEAR -s 0 (logistic regression)")]:
            model = os.path.join(d, f"m{s}")
            t = time.perf_counter()
            subprocess.run(["liblinear-train", "-s", str(s), "-q", tr, model], check=True)
            dt = time.perf_counter() - t
            res = subprocess.run(["liblinear-predict", te, model, os.path.join(d, "pred")], check=True,
                                 capture_output=True, text=True).stdout
            pred = np.loadtxt(os.path.join(d, "pred"), dtype=int)
            acc = float((pred == yt).mean())
            rows.append({"tool": name, "version": "liblinear-tools", "accuracy": acc, "seconds": dt,
                         "examples_per_second": None, "predict_says": res.strip()})
            print(f"{name}: {100 * acc:.2f} % in {dt:.1f} s", file=sys.stderr)
    json.dump({"rows": a.rows, "results": rows}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
