"""What calling Reducer.sync from Python costs beyond the round itself (issue 30, item 5: a 1 MiB
sync from Python within 5 % of the same round in the binary).

    mpirun -n 2 .venv-python/bin/python benches/python-overhead.py [--len 262144] [--sync asap]

Two measurements, printed by rank 0:

1. The call alone, load-independent: a `sync="none"` reducer (its round does nothing) over the
   same 1 MiB array, K calls of `r.sync(x)` from a Python loop against `r.sync_rounds(x, K)`,
   the same K calls in a Rust loop. The difference per call is what the binding adds (borrowing
   the numpy array, checking dtype, length, contiguity). Other jobs only ever add time, so the
   minimum over blocks is the estimate, with the median beside it.
2. The rounds: the reducer under test (default: asap on a ring with NOTIFY-ACK), the same two
   ways, in PAIRS pairs of blocks of ROUNDS rounds. A pair's ratio is python/rust of its two
   blocks; the pairs alternate which runs first (ABBA), so a drifting load cancels out rather
   than favouring one side. Printed: the median ratio, its range over pairs, and a 95 %
   bootstrap interval of the median (resampling the pairs, seeded), then whether the 5 % bound
   holds within that interval, and the bound the call cost alone gives: per-call cost over the
   fastest Rust-loop round seen (the least loaded, so the largest fraction).

Each block's seconds per round are averaged over the ranks (allreduce of the per-rank times).
"""

import argparse
import time

import numpy as np

import asap_train as at

p = argparse.ArgumentParser()
p.add_argument("--len", type=int, default=262144, help="float32 values per round (262144 = 1 MiB)")
p.add_argument("--rounds", type=int, default=20, help="rounds per block")
p.add_argument("--pairs", type=int, default=500, help="pairs of blocks (python, rust)")
p.add_argument("--calls", type=int, default=20000, help="calls per block of the call-alone measurement")
p.add_argument("--call-blocks", type=int, default=20, help="blocks of each kind of the call-alone measurement")
p.add_argument("--sync", default="asap")
p.add_argument("--graph", default="ring")
p.add_argument("--notify", default="notify-ack")
p.add_argument("--bootstrap", type=int, default=10000, help="bootstrap resamples")
a = p.parse_args()


def per_round(f, n):
    """Seconds per round of f() running n rounds, averaged over the ranks."""
    at.barrier()
    t = time.perf_counter()
    f()
    return at.allreduce_sum((time.perf_counter() - t) / n) / at.size


def python_loop(r, x, n):
    def go():
        for _ in range(n):
            r.sync(x)

    return go


x = np.full(a.len, float(at.rank), np.float32)

# 1. The call alone.
alone = at.Reducer(x, sync="none")
py_call, rs_call = [], []
for _ in range(a.call_blocks):
    py_call.append(per_round(python_loop(alone, x, a.calls), a.calls))
    rs_call.append(per_round(lambda: alone.sync_rounds(x, a.calls), a.calls))
alone.close()
call_cost = min(py_call) - min(rs_call)
call_median = float(np.median(np.array(py_call) - np.array(rs_call)))

# 2. The rounds.
opts = {"graph": a.graph, "notify": a.notify} if a.sync == "asap" else {}
r = at.Reducer(x, sync=a.sync, **opts)
r.sync_rounds(x, 20)  # warm-up: windows touched, caches filled
py, rs = [], []
for i in range(a.pairs):
    run_py = lambda: py.append(per_round(python_loop(r, x, a.rounds), a.rounds))  # noqa: E731
    run_rs = lambda: rs.append(per_round(lambda: r.sync_rounds(x, a.rounds), a.rounds))  # noqa: E731
    for run in (run_py, run_rs) if i % 2 == 0 else (run_rs, run_py):
        run()
s = r.global_stats()
r.finish(x)

if at.rank == 0:
    py, rs = np.array(py), np.array(rs)
    ratio = py / rs
    boot = np.random.default_rng(1).choice(ratio, size=(a.bootstrap, len(ratio)), replace=True)
    lo, hi = np.percentile(np.median(boot, axis=1), [2.5, 97.5])
    med = float(np.median(ratio))
    print("call alone (sync=none, %d bytes, %d ranks): python %.3f us/call, rust %.3f us/call (min of %d blocks of %d): "
          "%.3f us a call (median of blocks %.3f us)"
          % (4 * a.len, at.size, 1e6 * min(py_call), 1e6 * min(rs_call), a.call_blocks, a.calls, 1e6 * call_cost, 1e6 * call_median))
    print("rounds (sync=%s graph=%s notify=%s, %d ranks, %d bytes): python %.1f us/round, rust %.1f us/round (medians; rust min %.1f)"
          % (a.sync, a.graph, a.notify, at.size, 4 * a.len, 1e6 * np.median(py), 1e6 * np.median(rs), 1e6 * rs.min()))
    print("ratio python/rust over %d pairs of %d rounds: median %.3f, range %.3f .. %.3f, 95 %% bootstrap interval of the median %.3f .. %.3f; torn %s"
          % (len(ratio), a.rounds, med, ratio.min(), ratio.max(), lo, hi, s.get("torn", "-")))
    # The order effect the ABBA alternation cancels: the ratio when the Python block ran first
    # (even pairs) and when it ran second (odd pairs).
    print("median ratio when the python block ran first %.3f, second %.3f"
          % (np.median(ratio[0::2]), np.median(ratio[1::2])))
    verdict = "holds" if hi <= 1.05 else ("is violated" if lo > 1.05 else "is not decided")
    print("5 %% bound: %s within the measured noise (interval upper end %.3f); from the call cost alone: %.4f %% of the fastest round"
          % (verdict, hi, 100 * call_cost / rs.min()))
