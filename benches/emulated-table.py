"""One markdown table from benches/emulated-cluster.sh's runs: per row the median (and range) of
the training seconds until the worst rank's own model reached the target, the rounds then, the
bytes a rank sent to the target, whether every run's emulation held, and the ratios to plain
allreduce and to the best valid allreduce of the same table.

Usage: python3 emulated-table.py OUT_DIR REPS ROW...
"""
import json
import os
import statistics
import sys


def runs(out, name, reps):
    stem = name.replace(" ", "_").replace("/", "_")
    for rep in range(1, reps + 1):
        f = f"{out}/{stem}-{rep}.jsonl"
        if os.path.exists(f"{out}/{stem}-{rep}.failed"):
            yield [], None  # it failed: no summary
            continue
        if not os.path.exists(f):
            yield None  # not run
            continue
        lines = [json.loads(l) for l in open(f) if l.strip()]
        s = next((l for l in lines if l["event"] == "summary"), None)
        yield (lines, s)


# TARGET_ON=averaged: time each run to the target on its averaged model (every eval line
# carries it), not on what the run was stopped by (`--target-on`, the worst rank's own model in
# benches/emulated-cluster.sh). Under allreduce the two are the same; a gossip run stopped at the
# worst rank's target may hide an averaged model that got there later (it is then "not reached").
TARGET_ON = os.environ.get("TARGET_ON", "")


def averaged_hit(lines):
    """The first evaluation whose averaged model reached the run's --target, as time_to_target."""
    start = next(l for l in lines if l["event"] == "start")
    target = start["config"]["target"]
    evals = sorted((l for l in lines if l["event"] == "eval" and l.get("test_metric") is not None), key=lambda e: e["round"])
    hit = next((e for e in evals if e["test_metric"] >= target), None)
    return {"round": hit["round"], "train_seconds": hit["train_seconds"]} if hit else None


def time_to_target(lines, s):
    return averaged_hit(lines) if TARGET_ON == "averaged" else s.get("time_to_target")


def row(out, name, reps):
    times, rounds, mb, valid, notes = [], [], [], True, []
    for r in runs(out, name, reps):
        if r is None or r[1] is None:
            valid = False
            # no metrics file: the row was not run (ONLY); a file without a summary: it failed
            notes.append("a run failed" if r else "not run")
            continue
        lines, s = r
        em = s.get("emulation") or {}
        if not em.get("valid", False):
            valid = False
            notes.append(f"broke {100 * em.get('worst_rank_broken_fraction', 0):.1f} %, drift {100 * em.get('worst_rank_drift', 0):+.1f} %, {em.get('link_overruns', 0):.0f} link overruns")
        t = time_to_target(lines, s)
        if t is None:
            times.append(float("inf"))
            continue
        times.append(t["train_seconds"])
        rounds.append(t["round"])
        hit = next(e for e in lines if e["event"] == "eval" and e["round"] == t["round"])
        mb.append(hit["counters"]["bytes_sent"]["mean"] / 1e6)
    return times, rounds, mb, valid, notes


def busiest_mb(out, name, reps):
    """The median over the runs of the MB sent to the target by the rank that sent the most: the
    bytes on the busiest link (every rank has one link in the emulated cluster)."""
    mb = []
    for r in runs(out, name, reps):
        if r is None or r[1] is None:
            continue
        lines, s = r
        t = time_to_target(lines, s)
        if t is None:
            continue
        hit = next(e for e in lines if e["event"] == "eval" and e["round"] == t["round"])
        mb.append(hit["counters"]["bytes_sent"]["max"] / 1e6)
    return statistics.median(mb) if mb else None


def fmt(times):
    if not times:
        return "-"
    m = statistics.median(times)
    if m == float("inf"):
        return "not reached"
    lo, hi = min(times), max(times)
    hi_s = "not reached" if hi == float("inf") else f"{hi:.2f}"
    return f"{m:.2f} ({lo:.2f}-{hi_s})"


def main():
    out, reps, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    data = {n: row(out, n, reps) for n in names}
    med = {n: statistics.median(d[0]) if d[0] else float("inf") for n, d in data.items()}
    plain = med.get("allreduce", med.get("allreduce, k 1", float("inf")))  # every-step allreduce
    allreduces = [n for n in names if n.startswith("allreduce") and data[n][3]]
    best_ar = min(allreduces, key=lambda n: med[n]) if allreduces else None
    print(f"| variant | s to target, median (range) | rounds | MB sent/rank to target | x plain allreduce | x best allreduce ({best_ar or '-'}) | emulation |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        times, rounds, mb, valid, notes = data[n]
        ratio = lambda base: f"{med[n] / base:.2f}" if base not in (0, float("inf")) and med[n] != float("inf") else "-"
        r = f"{statistics.median(rounds):.0f}" if rounds else "-"
        m = f"{statistics.median(mb):.1f}" if mb else "-"
        v = "valid" if valid else "INVALID: " + "; ".join(sorted(set(notes)))
        print(f"| {n} | {fmt(times)} | {r} | {m} | {ratio(plain)} | {ratio(med[best_ar]) if best_ar else '-'} | {v} |")
    asaps = [n for n in names if n.startswith("asap") and data[n][3]]
    if asaps and plain != float("inf"):
        best = min(asaps, key=lambda n: med[n])
        print(f"\nbest valid asap: {best}: {med[best] / plain:.2f}x plain allreduce" + (f", {med[best] / med[best_ar]:.2f}x the best allreduce ({best_ar})" if best_ar else ""))
    tuned(names, data, med, out, reps)


OUTER = ("diloco", "noloco")  # the rows with an outer optimizer (benches/emulated-cluster.sh)


def tuned(names, data, med, out, reps):
    """With an interval grid (rows "NAME, k K"): per variant its best valid interval by median
    time to target, the ratios to the best tuned allreduce without an outer optimizer and to the
    best tuned allreduce of any kind, and issue 40's time verdicts."""
    if not any(", k " in n for n in names):
        return
    best = {}
    for n in names:
        base, _, k = n.partition(", k ")
        if data[n][3] and med[n] != float("inf") and (base not in best or med[n] < med[best[base][0]]):
            best[base] = (n, k)
    is_outer = lambda b: any(o in b for o in OUTER)
    ars = [b for b in best if b.startswith("allreduce")]
    plain_ar = min((b for b in ars if not is_outer(b)), key=lambda b: med[best[b][0]], default=None)
    any_ar = min(ars, key=lambda b: med[best[b][0]], default=None)
    base_of = lambda b: med[best[b][0]] if b else float("inf")
    ratio = lambda t, b: f"{t / base_of(b):.2f}" if b and base_of(b) not in (0, float("inf")) else "-"
    print(f"\nTuned: each variant at its best valid --sync-every (same grid for every row)\n")
    print(f"| variant | best --sync-every | s to target, median (range) | MB sent/rank to target | MB on the busiest link | x best tuned allreduce ({plain_ar or '-'}) | x best tuned allreduce of any kind ({any_ar or '-'}) |")
    print("|---|---|---|---|---|---|---|")
    for b in dict.fromkeys(n.partition(", k ")[0] for n in names):
        if b not in best:
            print(f"| {b} | none valid and reached | - | - | - | - | - |")
            continue
        n, k = best[b]
        mb = f"{statistics.median(data[n][2]):.1f}" if data[n][2] else "-"
        busy = busiest_mb(out, n, reps)
        busy = f"{busy:.1f}" if busy is not None else "-"
        print(f"| {b} | {k} | {fmt(data[n][0])} | {mb} | {busy} | {ratio(med[n], plain_ar)} | {ratio(med[n], any_ar)} |")
    outer = [b for b in best if is_outer(b)]
    if outer and plain_ar:
        o = min(outer, key=lambda b: med[best[b][0]])
        print(f"\nbest outer-optimizer run: {o}: {ratio(med[best[o][0]], plain_ar)}x the best tuned allreduce without one (issue 40's target: at most 0.5)")
    dil = next((b for b in best if "diloco" in b), None)
    nol = next((b for b in best if "noloco" in b), None)
    if dil and nol:
        bd, bn = busiest_mb(out, best[dil][0], reps), busiest_mb(out, best[nol][0], reps)
        print(f"NoLoCo against DiLoCo, each at its best interval: {med[best[nol][0]] / med[best[dil][0]]:.2f}x the time, "
              f"{bn:.1f} against {bd:.1f} MB on the busiest link (target at 32 and 64 ranks: at most 1.0x, with fewer bytes)")
    asaps = [b for b in best if b.startswith("asap")]
    if asaps and any_ar:
        a = min(asaps, key=lambda b: med[best[b][0]])
        print(f"best asap or NoLoCo run: {a}: {ratio(med[best[a][0]], any_ar)}x the best tuned allreduce, DiLoCo included (target on uneven links: at most 0.5)")


if __name__ == "__main__":  # benches/claim-*.sh import row() and fmt()
    main()
