"""Checks of equal sync counts, Reducer.join(), broadcast_parameters and DistributedSampler under a
real mpirun (numpy only), run by tests/python.rs (issue 43 item 5):

    mpirun -n 4 python tests/python/sync_counts.py CHECK [MODE]

Each check prints "CHECK ok rank R ..." per rank when its invariant holds; an AssertionError
aborts the job (asap_train's excepthook). `extra_sync MODE` catches the SyncCountError, prints
"extra_sync error rank R: MESSAGE" and exits 3 on every rank; `extra_sync_uncaught MODE` leaves
it uncaught (the job must end, not hang).
"""

import sys

import numpy as np

import asap_train as at

N, RANK = at.size, at.rank
OPTIONS = {
    "allreduce": {"sync": "allreduce"},
    "asap": {"sync": "asap", "graph": "exponential", "notify": "notify-ack", "wait_timeout": 30},
    "none": {"sync": "none"},
}


def start(seed):
    """Rank r's starting model: small integers, different on every rank."""
    return np.random.default_rng(seed * 100 + RANK).integers(-1000, 1000, 257).astype(np.float32)


def delta(rank, k):
    """What rank `rank` adds before its sync k (integers, so f64 oracles are exact)."""
    return np.random.default_rng(10_000 + 100 * k + rank).integers(-50, 50, 257).astype(np.float32)


def extra_sync(mode, catch=True):
    """Rank 0 makes one sync more than the others, who then call finish()."""
    x = start(1)
    r = at.Reducer(x, **OPTIONS[mode])
    try:
        for _ in range(6 if RANK == 0 else 5):
            r.sync(x)
        r.finish(x)
    except at.SyncCountError as e:
        if not catch:
            raise
        print("extra_sync error rank %d: %s" % (RANK, e), flush=True)
        sys.exit(3)
    print("extra_sync finished rank %d without an error" % RANK, flush=True)


def join(mode, counts=(3, 5, 5, 5)):
    """Ranks make counts[rank] syncs, each after a local update, then join(); every rank
    finishes, and the model equals an oracle simulated in float64 from every rank's updates."""
    assert N == len(counts)
    x = start(2)
    r = at.Reducer(x, **OPTIONS[mode])
    for k in range(1, counts[RANK] + 1):
        x += delta(RANK, k)
        r.sync(x)
    r.join(x)
    assert r.rounds == max(counts), (r.rounds, counts)
    after_join = x.copy()
    r.finish(x)
    models = [np.random.default_rng(2 * 100 + q).integers(-1000, 1000, 257).astype(np.float64) for q in range(N)]
    if mode == "allreduce":
        # The rule: each round, every rank (joined ones too) gets the mean of the active ranks'
        # models after their local update.
        for k in range(1, max(counts) + 1):
            active = [q for q in range(N) if counts[q] >= k]
            for q in active:
                models[q] = models[q] + delta(q, k)
            mean = sum(models[q] for q in active) / len(active)
            models = [mean.copy() for _ in range(N)]
        oracle = models[0]
        assert np.abs(after_join - oracle).max() < 1e-3, np.abs(after_join - oracle).max()
    else:
        # asap (regular graph, NOTIFY-ACK) and none keep the mean of the models: finish() is the
        # mean of the starting models plus every update made.
        oracle = (sum(models) + sum(delta(q, k).astype(np.float64) for q in range(N) for k in range(1, counts[q] + 1))) / N
    err = np.abs(x - oracle).max()
    assert err < 1e-2, err
    spread = at.allreduce_sum(np.abs(x - at.allreduce_sum(x) / N))
    assert spread.max() < 1e-5, spread.max()
    print("join ok rank %d %s syncs %d error %.2e" % (RANK, mode, counts[RANK], err), flush=True)


def join_refused():
    """join() under allreduce with an outer optimizer: raised on every rank once another rank
    syncs past the joined one."""
    x = start(3)
    r = at.Reducer(x, sync="allreduce", outer="sgd", outer_lr=1)
    try:
        r.sync(x)
        if RANK == 0:
            r.join(x)
        else:
            r.sync(x)
    except at.SyncCountError as e:
        assert "join() is not defined for this Reducer" in str(e), str(e)
        print("join_refused ok rank %d" % RANK, flush=True)
        sys.exit(0)
    raise AssertionError("no error on rank %d" % RANK)


def unchecked():
    """asap with check_syncs=False: the same rounds as with the check (equal counts, the same
    updates: the final models agree bit for bit, since NOTIFY-ACK locks every round either way),
    join() raises OptionError on the rank that calls it, and allreduce refuses the option."""
    finals = []
    for check in (True, False):
        x = start(3)
        r = at.Reducer(x, check_syncs=check, **OPTIONS["asap"])
        for k in range(1, 6):
            x += delta(RANK, k)
            r.sync(x)
        if not check:
            try:
                r.join(x)
                raise AssertionError("join() under check_syncs=False did not raise")
            except at.OptionError as e:
                assert "check_syncs=False" in str(e), str(e)
        r.finish(x)
        finals.append(x.copy())
    assert np.array_equal(finals[0], finals[1]), "check_syncs changed the rounds' result"
    try:
        at.Reducer(start(4), sync="allreduce", check_syncs=False)
        raise AssertionError("allreduce took check_syncs=False")
    except at.OptionError as e:
        assert 'applies to sync="asap" only' in str(e), str(e)
    print("unchecked ok rank %d" % RANK, flush=True)


def broadcast():
    """broadcast_parameters: every rank's arrays become root's bit for bit (NaN payloads and
    -0.0 included), in a list and in a dict; different sizes raise on every rank."""
    root = N - 1

    def arrays(seed):
        g = np.random.default_rng(seed)
        f = g.standard_normal(1000).astype(np.float32)
        f[:3] = [np.nan, -0.0, np.inf]
        f.view(np.uint32)[3] = 0x7FC12345  # a NaN with a payload
        return [f, g.integers(-(2**62), 2**62, (7, 5)), g.standard_normal((3, 4, 2))]

    mine, theirs = arrays(RANK), arrays(root)
    at.broadcast_parameters(mine, root=root)
    for a, b in zip(mine, theirs):
        assert a.dtype == b.dtype and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    state = {"w": arrays(RANK)[0], "b": np.full(3, RANK, np.int64)}
    at.broadcast_parameters(state)
    assert np.array_equal(state["w"].view(np.uint32), arrays(0)[0].view(np.uint32)) and (state["b"] == 0).all()
    try:
        at.broadcast_parameters(np.zeros(5 + RANK, np.float32))
    except at.OptionError as e:
        assert "different sizes" in str(e), str(e)
    else:
        raise AssertionError("different sizes were broadcast")
    print("broadcast ok rank %d" % RANK, flush=True)


def sampler():
    """DistributedSampler: equal lengths on every rank; over the ranks every index once per
    epoch (drop_last=False: padded with the permutation's first indices, as torch pads;
    drop_last=True: the tail dropped, none twice); the same order for the same seed and epoch,
    another for another epoch; each rank's share computed here by every rank (num_replicas,
    rank given) and by the rank itself (defaults) agree."""
    for n in [1, 7, 10, 13, 64, 1001]:
        for drop_last in [False, True]:
            for shuffle in [True, False]:
                if drop_last and n < N:
                    continue
                for epoch in range(3):
                    shares = []
                    for q in range(N):
                        s = at.DistributedSampler(n, num_replicas=N, rank=q, shuffle=shuffle, seed=7, drop_last=drop_last)
                        s.set_epoch(epoch)
                        shares.append(s.indices())
                    own = at.DistributedSampler(n, shuffle=shuffle, seed=7, drop_last=drop_last)
                    own.set_epoch(epoch)
                    assert np.array_equal(list(own), shares[RANK]) and len(own) == len(shares[RANK])
                    assert len({len(s) for s in shares}) == 1, [len(s) for s in shares]
                    counts = np.bincount(np.concatenate(shares), minlength=n)
                    if drop_last:
                        assert counts.max() <= 1 and counts.sum() == N * (n // N), (n, counts)
                    else:
                        total = N * -(-n // N)
                        assert counts.min() >= 1 and counts.sum() == total, (n, counts)
                        assert counts.max() <= 1 + -(-(total - n) // n), counts
                    again = at.DistributedSampler(n, num_replicas=N, rank=RANK, shuffle=shuffle, seed=7, drop_last=drop_last)
                    again.set_epoch(epoch)
                    assert np.array_equal(again.indices(), shares[RANK])
                    if shuffle and n >= 64 and epoch > 0:
                        other = at.DistributedSampler(n, num_replicas=N, rank=RANK, seed=7, drop_last=drop_last)
                        other.set_epoch(epoch - 1)
                        assert not np.array_equal(other.indices(), shares[RANK])
    print("sampler ok rank %d" % RANK, flush=True)


def cost(mode, n):
    """Not a check: the time of one sync (30 blocks of 50 r.sync(x) calls; fastest and median
    block), for docs/python.md's cost of the count check."""
    import time

    x = np.zeros(int(n), np.float32)
    opts = {"sync": mode, **({"graph": "ring", "notify": "notify-ack"} if mode == "asap" else {})}
    r = at.Reducer(x, **opts)
    times = []
    for _ in range(30):
        at.barrier()
        t = time.perf_counter()
        for _ in range(50):
            r.sync(x)
        times.append((time.perf_counter() - t) / 50)
    r.finish(x)
    times.sort()
    if RANK == 0:
        print("%s n=%s: per sync fastest block %.1f us, median %.1f us" % (mode, n, times[0] * 1e6, times[15] * 1e6))


if __name__ == "__main__":
    name, args = sys.argv[1], sys.argv[2:]
    if name == "extra_sync_uncaught":
        extra_sync(args[0], catch=False)
    else:
        {"cost": cost, "extra_sync": extra_sync, "join": join, "join_refused": join_refused, "broadcast": broadcast, "unchecked": unchecked, "sampler": sampler}[name](*args)
