"""Checks of asap_train.Reducer under a real mpirun (numpy only), run by tests/python.rs.

    mpirun -n N python tests/python/reducer_checks.py CHECK

Each check raises AssertionError on a violated invariant (an uncaught exception aborts the job
through asap_train's excepthook, so the job fails rather than hangs) and prints one line
"CHECK ok rank R ..." per rank when it holds.
"""

import sys
import time

import numpy as np

import asap_train as at

N, RANK = at.size, at.rank


def ints(seed, n):
    """Small integers as float32, different on every rank: sums of them are exact in float32."""
    return np.random.default_rng(seed * 1000 + RANK).integers(-1000, 1000, n).astype(np.float32)


def global_sum(x):
    """Element-wise float64 sum over ranks (no mpi4py needed)."""
    return at.allreduce_sum(np.asarray(x, dtype=np.float64))


def allreduce_exact():
    """sync='allreduce' leaves the exact average on every rank, every round."""
    x = ints(1, 4099)
    r = at.Reducer(x, sync="allreduce")
    for k in range(5):
        x += np.float32(k)  # local change between rounds, integral so sums stay exact
        total = global_sum(x).astype(np.float32)  # exact: integers below 2^24
        expect = total * np.float32(1.0 / N)  # what the mode computes: the sum times 1/N in f32
        r.sync(x)
        assert np.array_equal(x, expect), "round %d: max error %g" % (k, np.abs(x - expect).max())
    s = r.stats()
    assert s["rounds"] == 5, s
    ring = int(2 * (N - 1) / N * x.size * 4) if N > 1 else 0
    assert s["bytes_sent"] == 5 * ring, (s, ring)
    r.finish(x)
    assert r.closed
    print("allreduce_exact ok rank %d" % RANK, flush=True)


def notify_ack():
    """NOTIFY-ACK: 0 torn reads, every reduce used every in-neighbour (ASAP's consistency), and
    on a regular graph the mean over ranks is kept, so finish() returns the initial mean."""
    x = ints(2, 10_000)
    mean0 = global_sum(x[:64]) / N
    r = at.Reducer(x, sync="asap", graph="exponential", notify="notify-ack")
    rounds = 30
    for _ in range(rounds):
        r.sync(x)
    s = r.stats()
    assert s["torn"] == 0, s
    hist = s["consistency_histogram"]
    assert hist[-1] == rounds and sum(hist) == rounds, s
    assert s["in_degree"] == len(hist) - 1
    g = r.global_stats()
    assert g["torn"] == 0 and g["rounds_max"] == rounds, g
    assert r.info["notify"] == "notify-ack" and r.info["report"]["nodes"] == N, r.info
    r.finish(x)
    assert np.allclose(x[:64], mean0, rtol=0, atol=1e-2), np.abs(x[:64] - mean0).max()
    print("notify_ack ok rank %d torn 0 histogram %s" % (RANK, hist), flush=True)


def push_sum():
    """Push-sum conserves mass: with local updates d between rounds, the final model is
    (sum of initial models + sum of every update) / N, and the weights sum to N."""
    x = np.random.default_rng(10 + RANK).standard_normal(5000).astype(np.float32)
    expect = global_sum(x[:64])
    r = at.Reducer(x, sync="asap", graph="ring", notify="push-sum")
    rounds = 40
    d = np.random.default_rng(99 + RANK).standard_normal(x.size).astype(np.float32) * np.float32(1e-2)
    for _ in range(rounds):
        x += d
        r.sync(x)
    expect = (expect + rounds * global_sum(d[:64].astype(np.float64))) / N
    r.finish(x)
    s = r.stats()
    assert abs(s["push_sum_weight_sum"] - N) < 1e-9, s
    err = np.abs(x[:64] - expect).max()
    assert err < 1e-4, err
    print("push_sum ok rank %d weight_sum %r error %.2e" % (RANK, s["push_sum_weight_sum"], err), flush=True)


def staleness():
    """Bounded staleness: every reduced message is at most S rounds old (the histogram has
    S + 1 buckets), and nothing is torn."""
    x = ints(3, 3000)
    r = at.Reducer(x, sync="asap", graph="ring", notify="notify-ack", staleness=2)
    for _ in range(25):
        x *= np.float32(1.0)
        r.sync(x)
    s = r.stats()
    assert len(s["staleness_histogram"]) == 3 and s["torn"] == 0, s
    r.finish(x)
    print("staleness ok rank %d ages %s" % (RANK, s["staleness_histogram"]), flush=True)


def budget():
    """bandwidth_mbps: each message carries the rows that fit the budget, the rest is held in
    per-edge residuals; finish() still leaves the same model on every rank, and the rows sent
    and held are counted."""
    x = np.zeros(4000, np.float32)
    r = at.Reducer(x, sync="asap", graph="ring", bandwidth_mbps=50, row_len=100)
    rng = np.random.default_rng(RANK)
    for _ in range(15):
        x += rng.standard_normal(x.size).astype(np.float32) * np.float32(0.1)
        r.sync(x)
    r.finish(x)
    s = r.stats()
    assert s["rows_sent"] > 0 and "rows_held" in s and s["torn"] == 0, s
    spread = at.allreduce_sum(np.abs(x[:32] - at.allreduce_sum(x[:32]) / N))
    assert spread.max() < 1e-5, spread.max()
    print("budget ok rank %d rows sent %d held %d" % (RANK, s["rows_sent"], s["rows_held"]), flush=True)


def graphs():
    """Graph analysis: a graph given by its edges has the report of the same graph given by
    kind; search finds a gap at least the root expander's; mix measures rounds to epsilon."""
    n = 12
    ring = [(i, (i + 1) % n) for i in range(n)]
    by_kind, by_edges = at.graph_gap(kind="ring", nodes=n), at.graph_gap_edges(n, np.array(ring))
    for k in ("nodes", "edges", "regular", "strongly_connected", "diameter", "mixing_rounds"):
        assert by_kind[k] == by_edges[k], (k, by_kind[k], by_edges[k])
    assert abs(by_kind["spectral_gap"] - by_edges["spectral_gap"]) < 1e-9
    edges, report = at.graph_search(16, 2, candidates=20, seed=3)
    root = at.graph_gap(kind="root-expander", nodes=16)
    assert len(edges) == 32 and report["spectral_gap"] >= root["spectral_gap"] - 1e-12, (report, root)
    assert abs(at.graph_gap_edges(16, edges)["spectral_gap"] - report["spectral_gap"]) < 1e-9
    rows = at.graph_mix(["exponential", "nonsense"], 16)
    assert rows[0]["measured_rounds"] >= 1 and "error" in rows[1], rows
    for bad, kw in [("outside", dict(nodes=3, edges=[(0, 5)])), ("epsilon", dict(nodes=3, edges=[(0, 1)], epsilon=2))]:
        try:
            at.graph_gap_edges(**kw)
        except at.OptionError as e:
            assert bad in str(e), str(e)
        else:
            raise AssertionError("graph_gap_edges(%r) did not raise" % (kw,))
    print("graphs ok rank %d" % RANK, flush=True)


def expect_option_error(needle, x=None, **kw):
    """Reducer(x, **kw) must raise OptionError on this rank, with `needle` in its message."""
    x = np.zeros(16, np.float32) if x is None else x
    try:
        at.Reducer(x, **kw)
    except at.OptionError as e:
        assert needle in str(e), "%r lacks %r" % (str(e), needle)
        return str(e)
    raise AssertionError("Reducer(%r) did not raise" % (kw,))


def bad_options():
    """Bad options raise OptionError on every rank (the binary's own messages), including one
    given by a single rank; afterwards the ranks still work together."""
    expect_option_error("possible values", sync="asap", notify="bogus")
    expect_option_error("--staleness on --sync asap", sync="asap", notify="barrier", staleness=2)
    expect_option_error("not strongly connected", sync="asap", graph="chain")
    expect_option_error("a similar argument exists: '--graph'", sync="asap", grpah="ring")
    expect_option_error("training loop", sync="allreduce", lr=0.1)
    expect_option_error("a Reducer runs allreduce, asap or none", sync="ssp")
    expect_option_error("--wait-timeout", sync="asap", wait_timeout=-1)
    for kw, needle in [
        ({"sync": "bosen"}, "--sync bosen needs a per-rank budget"),
        ({"sync": "asap"}, "a Table runs ssp or bosen"),
        ({"graph": "ring"}, "not of a Table"),
        ({"sync": "bosen", "bandwidth_mbps": 10, "fp16": True}, 'compress="fp16" from Python'),
        ({"sync": "bosen", "bandwidth_mbps": 10, "compress": "int8"}, "its row pushes take --compress fp16"),
    ]:
        try:
            at.Table(4, 2, **kw)
        except at.OptionError as e:
            assert needle in str(e), (str(e), needle)
        else:
            raise AssertionError("Table(%r) did not raise" % (kw,))
    differ = np.full(16, float(RANK), np.float32)
    expect_option_error("same starting params on every rank", x=differ, sync="asap", bandwidth_mbps=100)
    # Only the last rank is wrong: everyone raises, the others naming that rank.
    bad = {"notify": "bogus"} if RANK == N - 1 else {}
    msg = expect_option_error("bogus", sync="asap", **bad)
    if RANK != N - 1:
        assert msg.startswith("rank %d: " % (N - 1)), msg
    x = np.full(8, float(RANK), np.float32)
    r = at.Reducer(x, sync="allreduce")
    r.sync(x)
    assert np.all(x == np.float32(sum(range(N)) / N)), x
    r.close()
    print("bad_options ok rank %d" % RANK, flush=True)


def uncaught():
    """A bad option nobody catches: every rank raises, and the job ends (non-zero) instead of
    hanging."""
    at.Reducer(np.zeros(4, np.float32), sync="asap", notify="bogus")
    print("not reached", flush=True)


def wrong_array():
    """Arrays that cannot be reduced in place are refused on the calling rank, before any
    communication: float64, 2-D, non-contiguous, wrong length."""
    x = np.zeros(100, np.float32)
    r = at.Reducer(x, sync="allreduce")
    for bad, err in [
        (np.zeros(100), TypeError),
        (np.zeros((10, 10), np.float32), TypeError),
        (np.zeros(200, np.float32)[::2], ValueError),
        (np.zeros(99, np.float32), ValueError),
    ]:
        try:
            r.sync(bad)
        except err:
            pass
        else:
            raise AssertionError("sync accepted %r" % (bad.dtype, bad.shape))
    r.sync(x)
    assert r.rounds == 1
    r.close()
    try:
        r.sync(x)
    except at.Error:
        pass
    else:
        raise AssertionError("sync after close() did not raise")
    print("wrong_array ok rank %d" % RANK, flush=True)


def table_ssp():
    """The table's staleness bound (SSP): every rank adds 1 to every entry each clock (apply
    plain: w += u). At clock c a read holds every update of clocks <= c-S-1 from every rank and
    all of this rank's own, so each entry is >= c + (N-1)(c-S); reads are at most S clocks
    stale; after finish the table holds every update: N x clocks."""
    S, clocks, rows, width = 2, 30, 16, 4
    t = at.Table(rows, width, sync="ssp", staleness=S, apply="plain")
    ones = np.ones((rows, width), np.float32)
    rng = np.random.default_rng(RANK)
    for c in range(clocks):
        some = sorted(rng.choice(rows, 5, replace=False).tolist())
        v = t.get(some)
        low = c + (N - 1) * max(0, c - S)
        assert v.shape == (5, width) and v.min() >= low, (c, v.min(), low)
        t.inc(list(range(rows)), ones)
        mine = t.get([0])
        assert mine.min() >= low + 1, (c, mine.min(), low)  # this rank's inc is visible at once
        t.clock()
    s = t.stats()
    assert s["max_staleness"] <= S and not any(s["staleness_histogram"][S + 1 :]), s
    assert s["reads"] > 0 and s["staleness_bound"] == S, s
    final = t.finish()
    assert final.shape == (rows, width) and np.all(final == N * clocks), final
    print("table_ssp ok rank %d staleness histogram %s" % (RANK, s["staleness_histogram"]), flush=True)


def table_bosen():
    """bosen's budgeted table (ConSGD: w += u / N): the final table is the mean update."""
    rows, width, clocks = 32, 8, 20
    init = np.full((rows, width), 5.0, np.float32)
    t = at.Table(rows, width, init=init, sync="bosen", staleness=1, bandwidth_mbps=1000)
    for c in range(clocks):
        t.get()
        t.inc(list(range(rows)), np.full((rows, width), float(RANK), np.float32))
        t.clock()
    final = t.finish()
    want = 5.0 + clocks * sum(range(N)) / N
    assert np.allclose(final, want, rtol=1e-5), (final.min(), final.max(), want)
    print("table_bosen ok rank %d" % RANK, flush=True)


def emulated():
    """emulate_bandwidth= paces the reducer's sends as --emulate-bandwidth paces the binary's: with
    rank 0's link at 8 Mbit/s (1e6 bytes/s) and the others' at 80, every message runs at the slower
    end's rate, so a rank that sent B bytes in its rounds spent at least (B - one message) / 1e6
    seconds in them (the first message may leave at once). A lower bound on time holds on any
    schedule: a loaded machine only adds to it. Bad link options raise on every rank."""
    x = np.full(25_000, float(RANK), np.float32)  # 100 kB messages: 0.1 s each at 1e6 bytes/s
    for sync, opts in [("asap", {"graph": "ring", "notify": "notify-ack"}), ("allreduce", {})]:
        r = at.Reducer(x, sync=sync, emulate_bandwidth="80,0:8", **opts)
        at.barrier()
        t = time.perf_counter()
        for _ in range(6):
            r.sync(x)
        took = time.perf_counter() - t
        s = r.stats()
        r.finish(x)
        sent = s["bytes_sent"]
        assert sent >= 6 * 4 * len(x) * (N - 1) / N, (sync, sent)
        least = (sent - 4 * len(x) - 64) / 1e6
        assert took >= least, "%s: %d bytes in %.3f s over a 1e6 bytes/s link (at least %.3f s)" % (sync, sent, took, least)
        if sync == "asap":
            assert s["torn"] == 0, s
        assert np.allclose(x, np.float32((N - 1) / 2)), (sync, x[:4])
        x = np.full(25_000, float(RANK), np.float32)
    expect_option_error("rank 9 is outside", sync="asap", emulate_bandwidth="1000,9:100")
    expect_option_error("needs --emulate-bandwidth", sync="allreduce", emulate_latency=5)
    t = at.Table(8, 4, sync="ssp", staleness=0, apply="plain", emulate_bandwidth=80)
    t.inc([RANK % 8], np.ones((1, 4), np.float32))
    t.clock()
    assert np.allclose(t.finish().sum(), 4 * N)
    print("emulated ok rank %d" % RANK, flush=True)

def outer():
    """outer="sgd" with step 1 is the plain average bit for bit; outer="nesterov" follows the
    textbook update (torch's SGD with nesterov=True on the pseudo-gradient, in float64) from this
    rank's own anchor, the params it started from."""
    x = ints(7, 1000)
    r = at.Reducer(x.copy(), sync="allreduce", outer="sgd", outer_lr=1)
    expect = global_sum(x).astype(np.float32) * np.float32(1.0 / N)
    r.sync(x)
    assert np.array_equal(x, expect) and r.info["outer"]["optimizer"] == "sgd", r.info
    r.finish(x)
    lr, mu = 0.7, 0.9
    x = ints(8, 1000)
    anchor, v = x.astype(np.float64), np.zeros(x.size)
    r = at.Reducer(x.copy(), sync="allreduce", outer="nesterov", outer_lr=lr, outer_momentum=mu)
    for k in range(4):
        x += np.float32(3 * k + RANK)  # this round's inner steps
        avg = global_sum(x) / N
        r.sync(x)
        d = anchor - avg
        v = mu * v + d
        anchor = anchor - lr * (d + mu * v)
        assert np.allclose(x, anchor, rtol=1e-5, atol=1e-3), "round %d: max error %g" % (k, np.abs(x - anchor).max())
    assert r.info["outer"] == {"optimizer": "nesterov", "lr": lr, "momentum": mu, "step": "on the exchange's average"}, r.info
    r.finish(x)
    # Under asap the step is the rank's own, before the exchange, unless outer_pseudo_gradient
    # asks for the neighbourhood's average (src/sync/outer.rs).
    for form, step in [(None, "own pseudo-gradient, before the exchange"), ("neighbourhood", "on the exchange's average")]:
        extra = {} if form is None else {"outer_pseudo_gradient": form}
        r = at.Reducer(x.copy(), sync="asap", graph="ring", outer="nesterov", **extra)
        assert r.info["outer"]["step"] == step, (form, r.info)
        r.finish(x)
    print("outer ok rank %d" % RANK, flush=True)


def choco():
    """sync="asap" with compress (CHOCO-SGD's public copies) on the undirected hypercube: with no
    local change between syncs the replicas' mean stays where it started (the mixing is
    doubly stochastic) while they come to agree at the consensus_step given."""
    x = ints(9, 1000) / np.float32(100)
    mean = global_sum(x) / N
    r = at.Reducer(x.copy(), sync="asap", graph="hypercube", compress="int8", consensus_step=0.5)
    for _ in range(120):
        r.sync(x)
    assert np.abs(global_sum(x) / N - mean).max() < 1e-3, np.abs(global_sum(x) / N - mean).max()
    spread = np.abs(x - global_sum(x) / N).max()
    assert spread < 1e-3, "the replicas still differ by %g" % spread
    r.finish(x)
    print("choco ok rank %d" % RANK, flush=True)


CHECKS = {
    f.__name__: f
    for f in [allreduce_exact, notify_ack, push_sum, staleness, budget, graphs, bad_options, uncaught, wrong_array, table_ssp, table_bosen, emulated, outer, choco]
}

if __name__ == "__main__":
    for name in sys.argv[1:]:
        CHECKS[name]()
