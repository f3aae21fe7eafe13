"""read_model and read_metrics on what the binary wrote (run by tests/python.rs, no MPI job):

    python tests/python/read_files.py MODEL.h5 METRICS.jsonl PREDICT_VALUE

Scores Fashion-MNIST's test set with numpy from read_model's parameters, scaling and labels,
and checks it against `asap-train predict --json`'s value and the run's summary line.
"""

import gzip
import sys

import numpy as np

import asap_train as at

model_path, metrics_path, predicted = sys.argv[1], sys.argv[2], float(sys.argv[3])
m = at.read_model(model_path)
spec = m["spec"]
assert spec["kind"] == "mlr", spec
J, d = spec["classes"], spec["features"]
assert m["params"].dtype == np.float32 and m["params"].size == m["row_offsets"][-1] == J * (d + 1)
assert m["scaling"]["method"] == "standard" and m["scaling"]["scale"].shape == (d,)


def idx(path):
    b = gzip.open(path).read()
    dims = [int.from_bytes(b[4 + 4 * i : 8 + 4 * i], "big") for i in range(b[3])]
    return np.frombuffer(b, np.uint8, offset=4 + 4 * b[3]).reshape(dims)


X = idx("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz").reshape(10000, -1).astype(np.float32)
y = idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")
X = (X - m["scaling"]["shift"]) * m["scaling"]["scale"]
# MLR's rows: one per class, its d weights then its bias (the model file's description).
W = m["params"].reshape(J, d + 1)
pred = m["class_labels"][(X @ W[:, :d].T + W[:, d]).argmax(1)]
acc = float((pred == y).mean())
assert abs(acc - predicted) < 1e-9, (acc, predicted)
lines = at.read_metrics(metrics_path)
summary = [l for l in lines if l.get("event") == "summary"]
assert len(summary) == 1 and lines[0]["event"] == "start", [l.get("event") for l in lines]
assert summary[0]["final_metric"] == m["metrics"]["final_metric"], (summary[0]["final_metric"], m["metrics"])
try:
    at.read_model(metrics_path)
except at.Error as e:
    assert "not an HDF5 file" in str(e) and metrics_path in str(e), str(e)
else:
    raise AssertionError("read_model accepted a JSONL file")
print("read_files ok accuracy %.4f" % acc)
