"""Writes README.md and summary.json of the report from the sections' runs (report/run.sh calls
it; `python3 report/render.py --runs runs/report --out report --bin target/release/asap-train`
re-renders without running anything). Every number comes from the metrics files and logs of the
runs; every table from one section run, with that run's load average."""
import argparse
import json
import math
import os
import re
import subprocess

# Held-out accuracy each training table times to: ~98 % of allreduce's final accuracy in the
# section's runs (MLR reaches 84 % after 3 epochs at 8 ranks, ~83 % at 32), so the target is met
# late in a run rather than in its first rounds; a table parameter, not a property of the runs.
TARGETS = {"asap61": 0.82, "asap62": 0.82, "stragglers": 0.82, "bandwidth": 0.83}

ORDER = ["asap61", "asap62", "mixing", "stragglers", "bandwidth", "peers", "sparse"]

TITLES = {
    "asap61": "ASAP 6.1: stochastic reduce over sparse graphs vs all-reduce",
    "asap62": "ASAP 6.2: NOTIFY-ACK vs barrier vs no synchronisation",
    "mixing": "Mixing vs spectral gap (real MPI job, training off)",
    "stragglers": "Stragglers: every mode with slow ranks",
    "bandwidth": "Bandwidth: Bösen vs SSP (and Gaia) under an emulated 100 Mbit/s link",
    "peers": "Peers: scikit-learn and LIBLINEAR on the same data and machine",
    "sparse": "Sparse throughput and memory (RCV1-shape synthetic set)",
}

CLAIMS = {
    "asap61": "ASAP §6.1: stochastic reduce over a sparse expander of out-degree 2 speeds up convergence "
              "2-10x over all-reduce and sends less (RCV1, 4 machines: root expander 56 MB vs all-reduce "
              "84 MB per machine to the target); graphs with a spectral gap below ~0.01 (a chain) converge slowly.",
    "asap62": "ASAP §6.2, Fig. 8: NOTIFY-ACK makes 100 % of reduces consistent (all in-neighbours' models "
              "used), a barrier and no synchronisation fewer; Fig. 10: NOTIFY-ACK ~3x faster than BSP to the target.",
    "mixing": "Spectral-gap bound: for a doubly stochastic graph the consensus distance shrinks by at least "
              "sigma_2 = 1 - gap per round, so ln(1e-3)/ln(1 - gap) rounds suffice for a 1e-3 reduction "
              "(the issue asks measured within 2x of that prediction).",
    "stragglers": "ASAP §6.2 and the SSP/DynSGD papers: fine-grained or bounded-staleness synchronisation "
                  "loses less time to slow workers than a BSP all-reduce, which waits for the slowest every round.",
    "bandwidth": "Bösen: managed communication (a bandwidth budget spent on the most significant rows first) "
                 "converges faster than plain bounded staleness on the same link; Gaia: 1.8-53.5x over the "
                 "baseline across a WAN, within 0.94-1.40x of a LAN.",
    "peers": "No paper claim; reference figures measured on this kind of machine (shared/TOOLCHAIN.md): "
             "LIBLINEAR -s 2 ~84.0 %, scikit-learn LogisticRegression 84.5 %, SGDClassifier ~82 % on Fashion-MNIST.",
    "sparse": "Issue 16 item 4: each rank holds ~1/N of the data, so peak RSS per rank falls with the rank count "
              "while examples/s per rank stays of the same order.",
}


def load(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def meta(d):
    m = {}
    for l in open(os.path.join(d, "meta.jsonl")):
        m.update(json.loads(l))
    return m


class Run:
    def __init__(self, d, name):
        self.name = name
        self.diverged = os.path.exists(f"{d}/{name}.diverged")
        self.lines = [] if self.diverged else load(f"{d}/{name}.jsonl")
        self.start = next((l for l in self.lines if l["event"] == "start"), {})
        self.summary = next((l for l in self.lines if l["event"] == "summary"), {})
        self.evals = [l for l in self.lines if l["event"] == "eval"]
        self.path = f"{d}/{name}.jsonl"

    def hit(self, target, lower=False):
        ok = lambda v: v is not None and (v <= target if lower else v >= target)
        return next((e for e in sorted(self.evals, key=lambda e: e["round"]) if ok(e["test_metric"])), None)

    def gap(self):
        r = ((self.start.get("sync_info") or {}).get("report") or {})
        return r.get("spectral_gap")

    def row(self, target, lower=False):
        """The numbers every training table shares (None where not applicable)."""
        if self.diverged:
            return {"run": self.name, "diverged": True}
        s, h = self.summary, self.hit(target, lower)
        c = s["counters"]
        sm = s.get("sync_metrics") or {}
        return {
            "run": self.name, "ranks": s["ranks"], "target": target,
            "seconds_to_target": h["train_seconds"] if h else None,
            "rounds_to_target": h["round"] if h else None,
            "mb_sent_per_rank_to_target": h["counters"]["bytes_sent"]["mean"] / 1e6 if h else None,
            "final_metric": s["final_metric"], "train_seconds": s["train_seconds"], "rounds": s["rounds"],
            "mb_sent_per_rank": c["bytes_sent"]["mean"] / 1e6,
            "sync_seconds_mean": c["sync_seconds"]["mean"], "sync_seconds_max": c["sync_seconds"]["max"],
            "spectral_gap": self.gap(),
            "mean_staleness": sm.get("mean_staleness"),
            "consistency_histogram": sm.get("consistency_histogram"),
            "examples_per_second_per_rank": s.get("examples_per_second_per_rank"),
        }


def f(v, fmt="{:.2f}", none="-"):
    return none if v is None else fmt.format(v)


def pct(v):
    return f(v, "{:.2f} %") if v is None else f"{100 * v:.2f} %"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


def plot(args, svg, files, title, panels="all"):
    files = [x for x in files if os.path.exists(x)]
    if not files:
        return None
    cmd = [args.bin, "plot", *files, "-o", os.path.join(args.out, svg), "--title", title, "--panels", panels]
    subprocess.run(cmd, check=True, capture_output=True)
    return svg


def training_section(args, d, m, names, extra_cols, extra, base_of):
    target = TARGETS[m["section"]]
    runs = {n: Run(d, n) for n in names}
    rows, md = [], []
    for n in names:
        r = runs[n]
        row = r.row(target)
        rows.append(row)
        if row.get("diverged"):
            md.append([n] + ["diverged"] + ["-"] * (6 + len(extra_cols)))
            continue
        b = base_of(n, r)
        base = runs[b].row(target)["seconds_to_target"] if b in runs and not runs[b].diverged else None
        t = row["seconds_to_target"]
        row["vs_baseline"] = t / base if t and base else None
        md.append([n, row["ranks"], *extra(r, row), f(t) if t else "not reached", f(row["vs_baseline"]),
                   f(row["mb_sent_per_rank_to_target"], "{:.1f}"), f(row["rounds_to_target"], "{}"), pct(row["final_metric"]),
                   f"{row['sync_seconds_mean']:.2f} / {row['sync_seconds_max']:.2f}"])
    head = ["run", "ranks", *extra_cols, f"train s to {100 * target:.0f} %", "vs allreduce", "MB sent/rank to target",
            "rounds to target", "final held-out acc", "sync s/rank (mean/max)"]
    return rows, table(head, md)


def tag(r):
    """ranks-partition of a run, as asap61's run names end."""
    return f"{r.start['ranks']}-{r.start['config']['partition'].replace(':', '')}"


def consistent(row):
    h = row.get("consistency_histogram")
    if not h or sum(h) == 0:
        return None
    return h[-1] / sum(h)


def section(args, name):
    d = os.path.join(args.runs, name)
    if not os.path.exists(os.path.join(d, "meta.jsonl")):
        return None
    m = meta(d)
    if "finished" not in m:
        return None
    names = m.get("rows", "").split()
    svgs, text = [], []
    res = {"title": TITLES[name], "claim": CLAIMS[name], "load": m["load"], "finished": m["finished"],
           "command": f"report/run.sh {name}" + (" (QUICK=1)" if m.get("quick") == "1" else "")}
    q = args.quick == "1"
    if name in ("asap61", "stragglers", "bandwidth", "asap62"):
        if name == "asap61":
            base_of = lambda n, r: f"allreduce-{tag(r)}"
            cols = ["partition", "spectral gap"]
            extra = lambda r, row: [r.start["config"]["partition"], f(row["spectral_gap"], "{:.3f}")]
        elif name == "asap62":
            base_of = lambda n, r: "allreduce"
            cols = ["reduces using every in-neighbour", "torn buffers skipped"]
            extra = lambda r, row: [f(consistent(row), "{:.1%}"), f((r.summary.get("sync_metrics") or {}).get("torn"), "{:.0f}")]
        elif name == "stragglers":
            base_of = lambda n, r: "allreduce-32-production" if n.endswith("production") else "allreduce-8"
            cols = ["staleness mean (ssp)"]
            extra = lambda r, row: [f(row["mean_staleness"])]
        else:
            base_of = lambda n, r: "allreduce"
            cols = ["staleness mean"]
            extra = lambda r, row: [f(row["mean_staleness"])]
        rows, md = training_section(args, d, m, names, cols, extra, base_of)
        res["rows"] = rows
        text.append(md)
        groups = {}
        for n in names:
            key = tag(Run(d, n)) if name == "asap61" else ("32" if n.endswith("production") else "8")
            groups.setdefault(key, []).append(f"{d}/{n}.jsonl")
        for key, files in groups.items():
            what = key.replace("-", " ranks, ", 1) if name == "asap61" else f"{key} ranks"
            svg = plot(args, f"{name}-{key}.svg", files, f"{TITLES[name]} ({what})")
            if svg:
                svgs.append(svg)
    elif name == "mixing":
        md, rows = [], []
        for n in names:
            r = Run(d, n)
            p, ranks = r.start["params"], r.start["ranks"]
            rep = r.start["sync_info"]["report"]
            # Every parameter starts N(0,1) on every rank: E||x_i - mean|| = sqrt(p (1 - 1/n)) up
            # to a relative spread of ~1/sqrt(2p) (2.5 % at p = 785).
            d0 = math.sqrt(p * (1 - 1 / ranks))
            ev = sorted(r.evals, key=lambda e: e["round"])
            hit = next((e for e in ev if e["consensus_distance"] <= 1e-3 * d0), None)
            gap = rep["spectral_gap"]
            pred = math.log(1e-3) / math.log(1 - gap) if 0 < gap < 1 else None
            meas = hit["round"] if hit else None
            every = r.start["config"]["eval_every"]
            gname = rep["name"]
            if gname.startswith("file:"):
                gname = "searched (" + os.path.basename(gname[5:]) + ")"
            row = {"run": n, "graph": gname, "ranks": ranks, "spectral_gap": gap, "predicted_rounds": pred,
                   "measured_rounds": meas, "eval_every": every, "ratio": meas / pred if meas and pred else None,
                   "start_distance": d0, "last_distance": ev[-1]["consensus_distance"] if ev else None}
            rows.append(row)
            md.append([gname, ranks, f"{gap:.4f}", f(pred, "{:.1f}"), f(meas, "{}") + (f" (±{every})" if every > 1 else ""),
                       f(row["ratio"]), f"{d0:.1f} → {f(row['last_distance'], '{:.2e}')} at round {ev[-1]['round'] if ev else '-'}"])
        res["rows"] = rows
        text.append(table(["graph", "ranks", "spectral gap", "predicted rounds ln(1e-3)/ln(1-gap)",
                           "measured rounds to 1e-3 of the start", "measured / predicted", "consensus distance start → last"], md))
        text.append("The start distance is the expectation sqrt(p (1 - 1/n)) for N(0,1) starts (p parameters, "
                    "n ranks; spread ~1/sqrt(2p)); the measured round is the first evaluation at or below 1e-3 of it "
                    "(evaluations every `eval_every` rounds, shown as ±). `--consensus-only` was added for this table: "
                    "the trainer takes no gradient steps and each rank starts from its own random model.")
    elif name == "peers":
        pj = json.load(open(f"{d}/peers.json"))
        md, rows = [], []
        for n in names:
            r = Run(d, n)
            s = r.summary
            row = {"tool": f"asap-train MLR, {s['ranks']} rank(s), 5 epochs", "accuracy": s["final_metric"],
                   "seconds": s["train_seconds"], "examples_per_second_per_rank": s["examples_per_second_per_rank"]}
            rows.append(row)
        rows += [{"tool": x["tool"], "accuracy": x["accuracy"], "seconds": x["seconds"],
                  "examples_per_second_per_rank": x["examples_per_second"]} for x in pj["results"]]
        for row in rows:
            md.append([row["tool"], pct(row["accuracy"]), f(row["seconds"], "{:.1f}"), f(row["examples_per_second_per_rank"], "{:,.0f}")])
        res["rows"] = rows
        text.append(f"Training on the first {pj['rows']} Fashion-MNIST training images, scored on the 10,000 test images.\n")
        text.append(table(["tool", "held-out accuracy", "training s", "examples/s (per rank)"], md))
        if m.get("torch"):
            text.append("PyTorch DDP (PEERS=torch) was requested: " + m["torch"] + ".")
        else:
            text.append("PyTorch DistributedDataParallel is not in this report (opt-in `PEERS=torch` is not implemented yet; "
                        "torch from PyPI is a ~5 GB CUDA build).")
    elif name == "sparse":
        md, rows = [], []
        for n in names:
            r = Run(d, n)
            log = open(f"{d}/{n}.log").read()
            rss = [int(x) / 1024 for x in re.findall(r"PEAK_RSS_KB (\d+)", log)]
            s = r.summary
            row = {"ranks": s["ranks"], "examples_per_second_per_rank": s["examples_per_second_per_rank"],
                   "peak_rss_mb_max": max(rss), "peak_rss_mb_mean": sum(rss) / len(rss),
                   "load_seconds": r.start["load_seconds"], "train_examples": r.start["train_examples"],
                   "final_metric": s["final_metric"]}
            rows.append(row)
            md.append([row["ranks"], f"{row['examples_per_second_per_rank']:,.0f}", f"{row['peak_rss_mb_max']:.0f} / {row['peak_rss_mb_mean']:.0f}",
                       f"{row['train_examples'] / row['ranks']:,.0f}", f(row["load_seconds"]), pct(row["final_metric"])])
        res["rows"] = rows
        text.append(f"Data: `{m.get('data')}` ({m.get('data_mb')} MB of LIBSVM text, `asap-train data synth --seed 1`), "
                    "SVM, 1 epoch, allreduce; RSS from /usr/bin/time per rank.\n")
        text.append(table(["ranks", "examples/s per rank", "peak RSS MB per rank (max / mean)", "examples per rank",
                           "load s", "training accuracy"], md))
    res["svgs"] = svgs
    res["markdown"] = "\n\n".join(text)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--quick", default="0")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    secs = {n: s for n in ORDER if (s := section(args, n))}
    summary = {n: {k: v for k, v in s.items() if k != "markdown"} for n, s in secs.items()}
    json.dump(summary, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    doc = ["# asap-train report", "",
           "Produced by `make report` (`report/run.sh`): every table below comes from one run of its section on "
           "this machine (2 cores, shared), so ratios within a table are meaningful, absolute times are not "
           "promises. The load average at the end of each section is given next to it. All numbers are also in "
           "[summary.json](summary.json). Re-run one table with the command under it.", ""]
    for n in ORDER:
        if n not in secs:
            doc += [f"## {TITLES[n]}", "", f"Not run yet: `report/run.sh {n}`.", ""]
            continue
        s = secs[n]
        doc += [f"## {s['title']}", "", f"**Paper's claim.** {s['claim']}", "", "**Measured.**", "", s["markdown"], "",
                f"Load average (1/5/15 min) at the end: {s['load']}; finished {s['finished']}. Re-run: `{s['command']}`.", ""]
        for svg in s["svgs"]:
            doc += [f"![{svg}]({svg})", ""]
    open(os.path.join(args.out, "README.md"), "w").write("\n".join(doc))
    print(f"wrote {args.out}/README.md and {args.out}/summary.json ({len(secs)} section(s))")


if __name__ == "__main__":
    main()
