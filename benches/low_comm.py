"""Summary of benches/low-comm.sh (issue 40, "Targets: Bytes"): per config the median and range
of the final held-out accuracy and of the bytes a rank sent while training, then per method the
config with the fewest bytes whose median accuracy is within 0.5 pt of every-step allreduce's
median (or above it), with the ratios the issue's targets are stated in.

Usage: python3 benches/low_comm.py DIR      (reads DIR/n*-METHOD-kK-sS.jsonl)

Bytes: the summary event's counters.bytes_sent mean (a rank's sends while training; the final
model's assembly, counters.final_bytes, is the same for every config and left out, as in
benches/lib.sh). Accuracy: the summary's final_metric (the run's final model: the average of the
replicas under asap).
"""
import glob
import json
import os
import re
import statistics
import sys

TOLERANCE = 0.005  # 0.5 pt of accuracy, the "equal final quality"
METHODS = [
    ("ar", "local SGD (allreduce, no outer)"),
    ("diloco", "DiLoCo (allreduce + nesterov 0.7/0.9)"),
    ("diloco-lr1", "DiLoCo, outer lr 1.0"),
    ("noloco", "NoLoCo (asap + nesterov 0.7/0.9)"),
    ("noloco-hypercube", "NoLoCo on --graph hypercube"),
    ("noloco-onepeer", "NoLoCo on --graph one-peer-exponential"),
    ("gossip", "gossip (asap, no outer)"),
]
TARGETS = {"diloco", "diloco-lr1", "noloco", "noloco-hypercube", "noloco-onepeer"}  # the outer-optimizer rows the targets judge
NAME = re.compile(r"n(\d+)-(.+)-k(\d+)-s(\d+)$")


def load(d):
    """{(ranks, method, k): [(seed, accuracy or None, bytes or None)]}; None: diverged."""
    runs = {}
    for path in glob.glob(os.path.join(d, "n*-k*-s*.jsonl")) + glob.glob(os.path.join(d, "n*-k*-s*.diverged")):
        m = NAME.match(os.path.basename(path).rsplit(".", 1)[0])
        if not m:
            continue
        n, method, k, seed = int(m[1]), m[2], int(m[3]), int(m[4])
        if path.endswith(".diverged"):
            runs.setdefault((n, method, k), []).append((seed, None, None))
            continue
        summary = next((json.loads(l) for l in open(path) if '"summary"' in l), None)
        if summary is None or os.path.exists(path[: -len(".jsonl")] + ".diverged"):
            continue  # unfinished run, or counted by its .diverged marker
        runs.setdefault((n, method, k), []).append((seed, summary["final_metric"], summary["counters"]["bytes_sent"]["mean"]))
    return runs


def stats(values):
    return statistics.median(values), min(values), max(values)


def config_table(runs, n):
    print(f"### {n} ranks: every config (3 seeds: median [min-max])\n")
    print("| method | --sync-every | runs | held-out accuracy | MB sent per rank |")
    print("|---|---|---|---|---|")
    for method, label in METHODS:
        for k in sorted(k for (rn, m, k) in runs if rn == n and m == method):
            rs = runs[(n, method, k)]
            ok = [r for r in rs if r[1] is not None]
            div = len(rs) - len(ok)
            if not ok:
                print(f"| {label} | {k} | {len(rs)} | diverged | - |")
                continue
            a, b = stats([r[1] for r in ok]), stats([r[2] / 1e6 for r in ok])
            note = f" ({div} diverged)" if div else ""
            print(f"| {label} | {k} | {len(rs)}{note} | {100*a[0]:.2f} % [{100*a[1]:.2f}-{100*a[2]:.2f}] | "
                  f"{b[0]:.2f} [{b[1]:.2f}-{b[2]:.2f}] |")
    print()


def best(runs, n, method, floor):
    """The config of `method` with the fewest median bytes among those whose runs all finished and
    whose median accuracy >= floor: (k, median accuracy, median bytes) or None."""
    found = []
    for (rn, m, k), rs in runs.items():
        if rn != n or m != method or any(r[1] is None for r in rs):
            continue
        acc, by = statistics.median(r[1] for r in rs), statistics.median(r[2] for r in rs)
        if acc >= floor:
            found.append((by, k, acc))
    if not found:
        return None
    by, k, acc = min(found)
    return k, acc, by


def target_table(runs, n):
    base = runs.get((n, "ar", 1))
    if not base or any(r[1] is None for r in base):
        print(f"### {n} ranks: no every-step allreduce runs, no target table\n")
        return
    base_acc = statistics.median(r[1] for r in base)
    base_bytes = statistics.median(r[2] for r in base)
    floor = base_acc - TOLERANCE
    tuned = best(runs, n, "ar", floor)
    print(f"### {n} ranks: fewest bytes within 0.5 pt of every-step allreduce "
          f"({100*base_acc:.2f} %, so >= {100*floor:.2f} %)\n")
    print("| method | largest interval within 0.5 pt | median held-out | MB sent per rank | every-step / method | best local SGD / method | targets (>= 100x, >= 4x) |")
    print("|---|---|---|---|---|---|---|")
    for method, label in METHODS:
        if not any(rn == n and m == method for (rn, m, _) in runs):
            continue
        b = best(runs, n, method, floor)
        if b is None:
            print(f"| {label} | none | - | - | - | - | {'missed (no interval reaches the quality)' if method in TARGETS else '-'} |")
            continue
        k, acc, by = b
        r_step = base_bytes / by
        r_tuned = tuned[2] / by if tuned else float("nan")
        verdict = "-"
        if method in TARGETS:
            verdict = f"{'met' if r_step >= 100 else 'missed'} / {'met' if r_tuned >= 4 else 'missed'}"
        print(f"| {label} | {k} | {100*acc:.2f} % | {by/1e6:.3f} | {r_step:.1f}x | {r_tuned:.2f}x | {verdict} |")
    print()


def main():
    d = sys.argv[1]
    runs = load(d)
    for n in sorted({rn for (rn, _, _) in runs}):
        lr_file = os.path.join(d, f"n{n}-lr")
        if os.path.exists(lr_file):
            print(f"{n} ranks: --lr {open(lr_file).read().strip()} for every run\n")
        config_table(runs, n)
        target_table(runs, n)


if __name__ == "__main__":
    main()
