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
        if os.path.exists(f"{out}/{stem}-{rep}.failed") or not os.path.exists(f):
            yield None
            continue
        lines = [json.loads(l) for l in open(f) if l.strip()]
        s = next((l for l in lines if l["event"] == "summary"), None)
        yield (lines, s)


def row(out, name, reps):
    times, rounds, mb, valid, notes = [], [], [], True, []
    for r in runs(out, name, reps):
        if r is None or r[1] is None:
            valid = False
            notes.append("a run failed")
            continue
        lines, s = r
        em = s.get("emulation") or {}
        if not em.get("valid", False):
            valid = False
            notes.append(f"broke {100 * em.get('worst_rank_broken_fraction', 0):.1f} %, drift {100 * em.get('worst_rank_drift', 0):+.1f} %, {em.get('link_overruns', 0):.0f} link overruns")
        t = s.get("time_to_target")
        if t is None:
            times.append(float("inf"))
            continue
        times.append(t["train_seconds"])
        rounds.append(t["round"])
        hit = next(e for e in lines if e["event"] == "eval" and e["round"] == t["round"])
        mb.append(hit["counters"]["bytes_sent"]["mean"] / 1e6)
    return times, rounds, mb, valid, notes


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
    plain = med.get("allreduce", float("inf"))
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


if __name__ == "__main__":  # benches/claim-bosen.sh imports row() and fmt()
    main()
