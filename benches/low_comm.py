"""Summary of benches/low-comm.sh (issue 40, "Targets: Bytes" and item 4, "Tuned baselines"): per
config (method, inner step, interval) the median and range of the final held-out accuracy and of
the bytes a rank sent while training; per method and interval the best inner step; then per
method the config with the fewest bytes whose median accuracy is within 0.5 pt of the baseline
bar (or above it), with the ratios the issue's targets are stated in.

Usage: python3 benches/low_comm.py DIR      (reads DIR/nN-METHOD[-stepETA]-kK-sS.jsonl)

The two references, both tuned over every inner step in DIR (the searched step is too small for
every-step allreduce on by-label:2 shards: 86.02 % at 0.0625, 87.78 % at 0.25, benches/low-comm.md):
- the bar: the best every-step allreduce (`ar`, k = 1), the step with the highest median accuracy;
  quality within 0.5 pt of it counts as equal, and its bytes are the ">= 100x" target's numerator;
- the best tuned local SGD: the `ar` config (any step, any interval) with the fewest bytes within
  0.5 pt of the bar; its bytes are the ">= 4x" target's numerator.
Fewest bytes ties (the same interval at two steps send the same bytes) go to the higher accuracy.

A run's step and partition are read from its config (the first line of its .jsonl), so runs named
without a step (nN-METHOD-kK-sS, the first grid's) are read too; a run without a readable config
takes the step from its name's `-stepETA`. Each partition is judged against its own bar.

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
NAME = re.compile(r"n(\d+)-(.+?)(?:-step([0-9.e-]+))?-k(\d+)-s(\d+)$")


def run_config(path):
    """The run's train config (its .jsonl's first line), or None when there is none to read."""
    try:
        with open(path) as f:
            return json.loads(f.readline()).get("config")
    except (OSError, ValueError):
        return None


def load(d):
    """{(ranks, partition, method, step, k): [(seed, accuracy or None, bytes or None)]}; None: diverged."""
    runs = {}
    for path in glob.glob(os.path.join(d, "n*-k*-s*.jsonl")) + glob.glob(os.path.join(d, "n*-k*-s*.diverged")):
        stem = path.rsplit(".", 1)[0]
        m = NAME.match(os.path.basename(stem))
        if not m or (path.endswith(".jsonl") and os.path.exists(stem + ".diverged")):
            continue  # not a run, or counted by its .diverged marker
        n, method, k, seed = int(m[1]), m[2], int(m[4]), int(m[5])
        config = run_config(stem + ".jsonl") or {}
        step = config.get("lr", float(m[3]) if m[3] else None)
        key = (n, config.get("partition", "?"), method, step, k)
        if path.endswith(".diverged"):
            runs.setdefault(key, []).append((seed, None, None))
            continue
        summary = next((json.loads(l) for l in open(path) if '"summary"' in l), None)
        if summary is not None:  # else unfinished
            runs.setdefault(key, []).append((seed, summary["final_metric"], summary["counters"]["bytes_sent"]["mean"]))
    return runs


def stats(values):
    return statistics.median(values), min(values), max(values)


def cell(rs):
    """'acc % [min-max] | MB [min-max]' of a config's runs, or the diverged cell."""
    ok = [r for r in rs if r[1] is not None]
    if not ok:
        return "diverged | -"
    a, b = stats([r[1] for r in ok]), stats([r[2] / 1e6 for r in ok])
    return f"{100*a[0]:.2f} % [{100*a[1]:.2f}-{100*a[2]:.2f}] | {b[0]:.2f} [{b[1]:.2f}-{b[2]:.2f}]"


def runs_note(rs):
    div = sum(r[1] is None for r in rs)
    return f"{len(rs)}" + (f" ({div} diverged)" if div else "")


def medians(rs):
    """(median accuracy, median bytes) of a config whose runs all finished, else None."""
    if any(r[1] is None for r in rs):
        return None
    return statistics.median(r[1] for r in rs), statistics.median(r[2] for r in rs)


def config_table(runs, group):
    print(f"### {group[0]} ranks, {group[1]}: every config (median [min-max] over the seeds)\n")
    print("| method | --lr | --sync-every | runs | held-out accuracy | MB sent per rank |")
    print("|---|---|---|---|---|---|")
    for method, label in METHODS:
        for (_, _, _, step, k) in sorted(key for key in runs if key[:2] == group and key[2] == method):
            rs = runs[group + (method, step, k)]
            print(f"| {label} | {step} | {k} | {runs_note(rs)} | {cell(rs)} |")
    print()


def best_step_table(runs, group, floor):
    """Per method and interval the step with the highest median accuracy (diverged configs lose)."""
    print(f"### {group[0]} ranks, {group[1]}: per method and interval, the best --lr "
          f"(within 0.5 pt of the bar: >= {100*floor:.2f} %)\n")
    print("| method | --sync-every | best --lr (of those run) | held-out accuracy | MB sent per rank | within 0.5 pt |")
    print("|---|---|---|---|---|---|")
    for method, label in METHODS:
        for k in sorted({key[4] for key in runs if key[:2] == group and key[2] == method}):
            cands = [(medians(rs) or (-1.0, 0.0), step, rs) for (g0, g1, m, step, kk), rs in runs.items()
                     if (g0, g1) == group and m == method and kk == k]
            (acc, _), step, rs = max(cands, key=lambda c: c[0][0])
            steps = "/".join(str(s) for s in sorted(c[1] for c in cands))
            within = "yes" if acc >= floor else "no"
            print(f"| {label} | {k} | {step} (of {steps}) | {cell(rs)} | {within} |")
    print()


def best(runs, group, method, floor):
    """The (step, k) config of `method` with the fewest median bytes among those whose runs all
    finished and whose median accuracy >= floor, ties to the higher accuracy:
    (step, k, median accuracy, median bytes) or None."""
    found = []
    for (g0, g1, m, step, k), rs in runs.items():
        med = medians(rs)
        if (g0, g1) == group and m == method and med is not None and med[0] >= floor:
            found.append((med[1], -med[0], step, k))
    if not found:
        return None
    by, neg_acc, step, k = min(found)
    return step, k, -neg_acc, by


def bar(runs, group):
    """The best every-step allreduce over the steps: (step, median accuracy, median bytes) or None."""
    cands = [(med, step) for (g0, g1, m, step, k), rs in runs.items()
             if (g0, g1) == group and m == "ar" and k == 1 and (med := medians(rs)) is not None]
    if not cands:
        return None
    (acc, by), step = max(cands, key=lambda c: c[0][0])
    return step, acc, by


def target_table(runs, group):
    base = bar(runs, group)
    if base is None:
        print(f"### {group[0]} ranks, {group[1]}: no every-step allreduce runs, no target table\n")
        return None
    base_step, base_acc, base_bytes = base
    floor = base_acc - TOLERANCE
    tuned = best(runs, group, "ar", floor)
    print(f"### {group[0]} ranks, {group[1]}: fewest bytes within 0.5 pt of the best every-step allreduce "
          f"(--lr {base_step}: {100*base_acc:.2f} %, so >= {100*floor:.2f} %)\n")
    if tuned:
        print(f"Best tuned local SGD: --lr {tuned[0]} --sync-every {tuned[1]}, {100*tuned[2]:.2f} %, "
              f"{tuned[3]/1e6:.2f} MB per rank.\n")
    print("| method | --lr | --sync-every | median held-out | MB sent per rank | every-step / method | best local SGD / method | targets (>= 100x, >= 4x) |")
    print("|---|---|---|---|---|---|---|---|")
    for method, label in METHODS:
        if not any(key[:2] == group and key[2] == method for key in runs):
            continue
        b = best(runs, group, method, floor)
        if b is None:
            print(f"| {label} | none | none | - | - | - | - | {'missed / missed (no config reaches the quality)' if method in TARGETS else '-'} |")
            continue
        step, k, acc, by = b
        r_step = base_bytes / by
        r_tuned = tuned[3] / by if tuned else float("nan")
        verdict = "-"
        if method in TARGETS:
            verdict = f"{'met' if r_step >= 100 else 'missed'} / {'met' if r_tuned >= 4 else 'missed'}"
        print(f"| {label} | {step} | {k} | {100*acc:.2f} % | {by/1e6:.3f} | {r_step:.1f}x | {r_tuned:.2f}x | {verdict} |")
    print()
    return floor


def main():
    d = sys.argv[1]
    runs = load(d)
    for group in sorted({key[:2] for key in runs}):
        config_table(runs, group)
        floor = target_table(runs, group)
        if floor is not None:
            best_step_table(runs, group, floor)


if __name__ == "__main__":
    main()
