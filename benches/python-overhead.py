"""What calling Reducer.sync from Python costs beyond the round itself (issue 30, item 5).

    mpirun -n 2 .venv-python/bin/python benches/python-overhead.py [--len 262144] [--sync asap]

The same reducer runs blocks of ROUNDS rounds two ways, alternating: ROUNDS calls of
`r.sync(x)` from a Python loop, and `r.sync_rounds(x, ROUNDS)`, the same rounds in a Rust loop
(the binary's code path, no Python between rounds). Per block, each rank's seconds per round are
averaged over the ranks; the medians over blocks and of the per-block ratio are printed (rank 0).
Alternating blocks keeps a loaded machine's drift out of the ratio.
"""

import argparse
import time

import numpy as np

import asap_train as at

p = argparse.ArgumentParser()
p.add_argument("--len", type=int, default=262144, help="float32 values per round (262144 = 1 MiB)")
p.add_argument("--rounds", type=int, default=200, help="rounds per block")
p.add_argument("--blocks", type=int, default=10, help="blocks of each kind")
p.add_argument("--sync", default="asap")
p.add_argument("--graph", default="ring")
p.add_argument("--notify", default="notify-ack")
a = p.parse_args()

x = np.full(a.len, float(at.rank), np.float32)
opts = {"graph": a.graph, "notify": a.notify} if a.sync == "asap" else {}
r = at.Reducer(x, sync=a.sync, **opts)
r.sync_rounds(x, 20)  # warm-up: windows touched, caches filled
py, rs = [], []
for _ in range(a.blocks):
    at.barrier()
    t = time.perf_counter()
    for _ in range(a.rounds):
        r.sync(x)
    py.append(at.allreduce_sum((time.perf_counter() - t) / a.rounds) / at.size)
    at.barrier()
    t = time.perf_counter()
    r.sync_rounds(x, a.rounds)
    rs.append(at.allreduce_sum((time.perf_counter() - t) / a.rounds) / at.size)
s = r.global_stats()
r.finish(x)
if at.rank == 0:
    ratio = np.median(np.array(py) / np.array(rs))
    print(
        "sync=%s graph=%s notify=%s ranks=%d bytes=%d: python loop %.1f us/round, rust loop %.1f us/round, "
        "median ratio %.3f (overhead %+.1f %%), torn %s"
        % (a.sync, a.graph, a.notify, at.size, 4 * a.len, 1e6 * np.median(py), 1e6 * np.median(rs), ratio,
           100 * (ratio - 1), s.get("torn", "-"))
    )
