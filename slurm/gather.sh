#!/usr/bin/env bash
# Combines the summary lines of a sweep's metrics files (OUTDIR/*.jsonl) into OUTDIR/summary.csv
# and prints it as a table. A task without a summary line (failed, killed, still running) gets a
# row whose status names its log. Usage: slurm/gather.sh OUTDIR
set -euo pipefail
out=${1:?usage: gather.sh OUTDIR}
exec python3 - "$out" <<'PY'
import csv, glob, json, os, sys

out = sys.argv[1]
cols = ["name", "status", "ranks", "sync", "graph", "notify", "rounds", "epochs", "train_seconds",
        "wall_seconds", "metric", "final_metric", "objective", "time_to_target_s",
        "bytes_sent_per_rank", "comm_seconds_per_rank", "wait_seconds_per_rank", "args"]
rows = []
names = sorted({os.path.basename(p)[:-5] for p in glob.glob(os.path.join(out, "*.args"))}
               | {os.path.basename(p)[:-6] for p in glob.glob(os.path.join(out, "*.jsonl"))})
for name in names:
    row = {"name": name, "status": f"no summary (see {name}.log)"}
    args = os.path.join(out, name + ".args")
    if os.path.exists(args):
        row["args"] = open(args).read().strip()
    start = summary = None
    try:
        for line in open(os.path.join(out, name + ".jsonl")):
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if v.get("event") == "start":
                start = v
            elif v.get("event") == "summary":
                summary = v
    except FileNotFoundError:
        pass
    if start:
        cfg = start.get("config") or {}
        row["graph"] = cfg.get("graph") if cfg.get("sync") == "asap" else ""
        row["notify"] = cfg.get("notify") if cfg.get("sync") == "asap" else ""
    if summary:
        c = summary.get("counters") or {}
        mean = lambda k: (c.get(k) or {}).get("mean")
        t = summary.get("time_to_target") or {}
        row.update(status="ok", ranks=summary["ranks"], sync=summary["sync"], rounds=summary["rounds"],
                   epochs=round(summary["epochs"], 3), train_seconds=round(summary["train_seconds"], 3),
                   wall_seconds=round(summary["wall_seconds"], 3), metric=summary["metric"],
                   final_metric=round(summary["final_metric"], 5), objective=round(summary["objective"], 6),
                   time_to_target_s=round(t["train_seconds"], 3) if t else "",
                   bytes_sent_per_rank=int(mean("bytes_sent") or 0),
                   comm_seconds_per_rank=round(mean("comm_seconds") or 0, 4),
                   wait_seconds_per_rank=round(mean("wait_seconds") or 0, 4))
    rows.append(row)
path = os.path.join(out, "summary.csv")
with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in cols})
shown = cols[:-1]
table = [shown] + [[str(r.get(k, "")) for k in shown] for r in rows]
width = [max(len(t[i]) for t in table) for i in range(len(shown))]
for t in table:
    print("  ".join(x.ljust(w) for x, w in zip(t, width)).rstrip())
print(f"{len(rows)} runs, {sum(r['status'] == 'ok' for r in rows)} ok; written to {path}")
sys.exit(0 if rows else 1)
PY
