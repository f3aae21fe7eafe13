"""Matrix factorisation of MovieLens ratings in numpy on asap_train.Table: the binary's
`--model mf` (r_ui ~ l_u . r_i + b_u + c_i + mu, per-rating L2) trained by SSP workers on a
table the ranks serve themselves (Bösen's get / inc / clock).

    datasets/prepare.sh          # MovieLens from Debian's r-cran-dslabs into datasets/out/
    mpirun -n 8 .venv-python/bin/python examples/table_mf.py --staleness 3

Table rows: one per user, one per item (k factors, then the bias), and a last row whose first
value is mu. Each rank takes every N-th rating of a seeded permutation; per mini-batch it reads
the batch's rows (get: as fresh as the staleness bound requires), adds its SGD step to them
(inc), and ends a clock every --sync-every mini-batches, as `asap-train train --sync ssp
--sync-every K` does. Rank 0 prints the held-out RMSE of the final table and the ratings per
second over all ranks.
"""

import argparse
import os
import sys
import time

import numpy as np

import asap_train as at

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "datasets", "out")


def read_ratings(path):
    """`user item rating` per line, 0-based ids (what datasets/prepare.sh writes)."""
    a = np.loadtxt(path, dtype=np.float64, ndmin=2)
    return a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2].astype(np.float32)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", default=os.path.join(DATA, "movielens-train.ratings"))
    p.add_argument("--test", default=os.path.join(DATA, "movielens-test.ratings"))
    p.add_argument("--sync", choices=["ssp", "bosen"], default="ssp")
    p.add_argument("--staleness", type=int, default=3)
    p.add_argument("--apply", default="consgd", help="the servers' rule: plain, consgd, dynsgd")
    p.add_argument("--bandwidth-mbps", type=float, default=None, help="bosen's per-rank budget")
    p.add_argument("--factors", type=int, default=10)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--sync-every", type=int, default=22, help="mini-batches per clock")
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--lr-decay", type=float, default=0.9)
    p.add_argument("--lambda", dest="lam", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rank, size, k = at.rank, at.size, a.factors
    for f in (a.train, a.test):
        if not os.path.exists(f):
            raise SystemExit("%s: not found; run datasets/prepare.sh first (MovieLens from r-cran-dslabs)" % f)

    u_all, i_all, r_all = read_ratings(a.train)
    ut, it, rt = read_ratings(a.test)
    users = int(max(u_all.max(), ut.max())) + 1
    items = int(max(i_all.max(), it.max())) + 1
    mine = np.random.default_rng(a.seed).permutation(len(r_all))[rank::size]
    u, i, r = u_all[mine], users + i_all[mine], r_all[mine]
    rows, width, mu_row = users + items + 1, k + 1, users + items

    # The same start on every rank: small random factors (zero is a saddle point), biases 0.
    init = np.zeros((rows, width), np.float32)
    init[:mu_row, :k] = np.random.default_rng(a.seed + 1).normal(0, 0.3 / np.sqrt(k), (mu_row, k))
    opts = {"staleness": a.staleness, "apply": a.apply, "bandwidth_mbps": a.bandwidth_mbps}
    t = at.Table(rows, width, init=init, sync=a.sync, seed=a.seed, **opts)

    rng = np.random.default_rng(a.seed * 7919 + rank)
    steps = (len(r_all) // size) // a.batch_size  # the same on every rank: the smallest shard
    lr, B, lam = a.lr, a.batch_size, a.lam
    t0 = time.perf_counter()
    for epoch in range(a.epochs):
        order = rng.permutation(len(r))
        for s in range(steps):
            b = order[s * B : (s + 1) * B]
            need, inv = np.unique(np.concatenate([u[b], i[b], [mu_row]]), return_inverse=True)
            iu, ii, imu = inv[: len(b)], inv[len(b) : 2 * len(b)], inv[-1]
            V = t.get(need)
            Lu, Ri = V[iu, :k], V[ii, :k]
            e = r[b] - ((Lu * Ri).sum(1) + V[iu, k] + V[ii, k] + V[imu, 0])
            # One SGD step of the binary's per-rating loss, from the batch's snapshot.
            D = np.zeros_like(V)
            c = np.float32(lr / len(b))
            np.add.at(D[:, :k], iu, c * (e[:, None] * Ri - lam * Lu))
            np.add.at(D[:, :k], ii, c * (e[:, None] * Lu - lam * Ri))
            np.add.at(D[:, k], iu, c * (e - lam * V[iu, k]))
            np.add.at(D[:, k], ii, c * (e - lam * V[ii, k]))
            D[imu, 0] += c * e.sum()
            t.inc(need, D)
            if (s + 1) % a.sync_every == 0:
                t.clock()
        lr *= a.lr_decay
    t.clock()
    seconds = time.perf_counter() - t0
    final = t.finish()  # collective; global_stats only after it (see docs/python.md)
    stats = t.global_stats()

    if rank == 0:
        pred = (final[ut, :k] * final[users + it, :k]).sum(1) + final[ut, k] + final[users + it, k] + final[mu_row, 0]
        rmse = float(np.sqrt(np.mean((rt - pred) ** 2)))
        done = a.epochs * steps * B * size
        print("held-out RMSE %.4f (sync %s, staleness %d, apply %s, %d ranks, %d epochs, %d clocks)" % (rmse, a.sync, a.staleness, a.apply, size, a.epochs, t.clocks))
        print(
            "train seconds %.2f, %.0f ratings/s over all ranks, max staleness %d, blocked reads %d"
            % (seconds, done / seconds, stats["max_staleness"], stats["blocked_reads"]),
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
