"""Writes README.md and summary.json of the report from the sections' runs (report/run.sh calls
it; `python3 report/render.py --runs runs/report --out report --bin target/release/asap-train`
re-renders without running anything). Every number comes from the metrics files and logs of the
runs; every table from one section run, with that run's load average."""
import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys

# Held-out accuracy each training table times to: ~98 % of allreduce's final accuracy in the
# section's runs (MLR reaches 84 % after 3 epochs at 8 ranks, ~83 % at 32), so the target is met
# late in a run rather than in its first rounds; a table parameter, not a property of the runs.
TARGETS = {"asap61": 0.82, "asap62": 0.82, "stragglers": 0.82, "bandwidth": 0.83, "torch": 0.82,
           # heart_scale: LIBLINEAR-class linear models score ~84 % on it; 80 % of the held-out rows.
           "libsvm": 0.80,
           # MovieLens held-out RMSE (lower is better): allreduce ends at ~0.907 after 12 epochs and
           # passes 0.91 after ~9 (benches/ssp.sh mf and docs/sync-modes.md use 0.90-0.91).
           "movielens": 0.91}
LOWER = {"movielens"}  # sections whose metric is an error (RMSE): the target is reached from above

ORDER = ["asap61", "asap62", "mixing", "stragglers", "bandwidth", "libsvm", "movielens", "peers", "torch", "sparse"]

TITLES = {
    "asap61": "ASAP 6.1: stochastic reduce over sparse graphs vs all-reduce (8 ranks sharing 2 cores)",
    "asap62": "ASAP 6.2: NOTIFY-ACK vs barrier vs no synchronisation (8 ranks sharing 2 cores)",
    "mixing": "Mixing vs spectral gap (real MPI job, training off)",
    "stragglers": "Stragglers: every mode with slow ranks (8 ranks sharing 2 cores)",
    "bandwidth": "Bandwidth: Bösen vs SSP (and Gaia) under an emulated 100 Mbit/s link (8 ranks sharing 2 cores)",
    "libsvm": "LIBSVM data (heart_scale): allreduce vs asap vs ssp, logistic regression and SVM (8 ranks sharing 2 cores)",
    "movielens": "MovieLens: matrix factorisation, allreduce vs asap vs ssp to a held-out RMSE (8 ranks sharing 2 cores)",
    "peers": "Peers: scikit-learn and LIBLINEAR on the same data and machine (1 and 8 ranks sharing 2 cores)",
    "torch": "PyTorch DistributedDataParallel (gloo, CPU) vs asap-train, 8 ranks",
    "sparse": "Sparse throughput and memory (RCV1-shape synthetic set, 1-8 ranks sharing 2 cores)",
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
    "libsvm": "No paper measures this set; the ASAP and SSP papers' claim for sparse linear models (ASAP §6.1 on RCV1: "
              "asap sends less than all-reduce for the same progress; SSP: bounded staleness reaches the same "
              "objective with less waiting) on the real LIBSVM set datasets/ prepares.",
    "movielens": "SSP/Bösen (matrix factorisation on Netflix/MovieLens): rank-hosted parameter shards move only the rows a "
                 "mini-batch touches, so SSP sends a fraction of the bytes of whole-model averaging for the same RMSE; "
                 "ASAP §6: stochastic reduce converges like all-reduce with fewer bytes per round.",
    "torch": "Issue 16: PyTorch DistributedDataParallel (gloo backend, CPU) is the tool most users would pick instead "
             "for data-parallel SGD; same model, shards, batch, step-size schedule and evaluation points, 8 processes: "
             "time to target and examples/s per rank next to ours.",
    "sparse": "Issue 16 item 4: each rank holds ~1/N of the data, so peak RSS per rank falls with the rank count "
              "while examples/s per rank stays of the same order.",
}


# Why DDP is opt-in, said in the peers section and the torch section alike.
TORCH_WHY = ("PyTorch is opt-in (`make report PEERS=torch`, or `report/run.sh torch`) because its install is heavy: "
             "the CPU-only wheel index is not reachable from this machine (only PyPI is), and PyPI's Linux torch is the "
             "CUDA build, which does not import without its NVIDIA libraries (`--no-deps` fails on libcudart), so the "
             "report's venv (runs/torch-venv, never committed) takes ~5 GB.")
TORCH_NOTE = ("PyTorch DistributedDataParallel has its own section below (opt-in, `make report PEERS=torch`; "
              "its install is ~5 GB).")
# The sentence an earlier peers section said about torch; a kept section gets TORCH_NOTE instead.
TORCH_NOTE_OLD = re.compile(r"PyTorch DistributedDataParallel is not in this report[^\n]*")


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
            "emulation": s.get("emulation"),
        }


def f(v, fmt="{:.2f}", none="-"):
    return none if v is None else fmt.format(v)


def secs(v):
    """Seconds: 2 decimals, 3 below 0.1 s (the small data sets train in milliseconds)."""
    return f(v, "{:.2f}" if v is None or v >= 0.1 else "{:.3f}")


def mb(v):
    """Megabytes: 1 decimal, 3 below 0.1 MB (heart_scale's model is 14 numbers)."""
    return f(v, "{:.1f}" if v is None or v >= 0.1 else "{:.3f}")


def pct(v):
    return f(v, "{:.2f} %") if v is None else f"{100 * v:.2f} %"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


def plot(args, svg, files, title, panels="all", labels=None):
    if labels is not None:
        labels = [l for l, x in zip(labels, files) if os.path.exists(x)]
    files = [x for x in files if os.path.exists(x)]
    if not files:
        return None
    cmd = [args.bin, "plot", *files, "-o", os.path.join(args.out, svg), "--title", title, "--panels", panels]
    if labels:
        cmd += ["--labels", ",".join(labels)]
    subprocess.run(cmd, check=True, capture_output=True)
    return svg


def metric_text(v, lower):
    """A held-out metric as the tables show it: accuracy in %, an error (RMSE) as is."""
    return f(v, "{:.4f}") if lower else pct(v)


def training_section(args, d, m, names, extra_cols, extra, base_of):
    target = TARGETS[m["section"]]
    lower = m["section"] in LOWER
    runs = {n: Run(d, n) for n in names}
    emulated = any(r.summary.get("emulation") for r in runs.values())
    rows, md = [], []
    for n in names:
        r = runs[n]
        row = r.row(target, lower)
        rows.append(row)
        if row.get("diverged"):
            md.append([n] + ["diverged"] + ["-"] * (6 + len(extra_cols) + emulated))
            continue
        b = base_of(n, r)
        base = runs[b].row(target, lower)["seconds_to_target"] if b in runs and not runs[b].diverged else None
        t = row["seconds_to_target"]
        row["vs_baseline"] = t / base if t and base else None
        md.append([n, row["ranks"], *extra(r, row), secs(t) if t else "not reached", f(row["vs_baseline"]),
                   mb(row["mb_sent_per_rank_to_target"]), f(row["rounds_to_target"], "{}"), metric_text(row["final_metric"], lower),
                   f"{secs(row['sync_seconds_mean'])} / {secs(row['sync_seconds_max'])}"] + ([emulation_text(row)] if emulated else []))
    to = f"RMSE {target}" if lower else f"{100 * target:.0f} %"
    head = ["run", "ranks", *extra_cols, f"train s to {to}", "vs allreduce", "MB sent/rank to target",
            "rounds to target", "final held-out " + ("RMSE" if lower else "acc"), "sync s/rank (mean/max)"] + (["emulation"] if emulated else [])
    return rows, table(head, md)


def emulation_text(row):
    """Whether the emulated cluster held for a run (docs/emulation.md), as the summary says."""
    e = row.get("emulation")
    if not e:
        return "-"
    if e.get("valid"):
        return "valid"
    return f"INVALID (broke {100 * e.get('worst_rank_broken_fraction', 0):.1f} %, drift {100 * e.get('worst_rank_drift', 0):+.1f} %)"


def cluster_title(name, m):
    """A section's title, naming the emulated cluster its runs declared (report/run.sh CLUSTER)."""
    c = m.get("cluster")
    if not c or c == "none":
        return TITLES[name]
    return TITLES[name].replace("(8 ranks sharing 2 cores)", f"(emulated cluster {os.path.basename(c)}, dilation {m.get('dilation')})")


def tag(r):
    """ranks-partition of a run, as asap61's run names end."""
    return f"{r.start['ranks']}-{r.start['config']['partition'].replace(':', '')}"


# asap61's run names: VARIANT[-kK]-RANKS-PARTITION, asap62's VARIANT[-kK] (report/run.sh), K the
# --sync-every of issue 40's grid.
TUNED_NAME = re.compile(r"(.*?)(?:-k(\d+))?(?:-(\d+-(?:iid|by-label\d+|dirichlet[\d.]+)))?")


def tuned_section(d, names, target):
    """Issue 40's tuned baseline in asap61 and asap62: each variant's best --sync-every by time to
    target (valid runs only), against the best tuned allreduce, DiLoCo's outer optimizer included.
    The rows and a table per ranks-partition (asap62: its one setting); ([], "") when the section
    ran no grid (TUNE="")."""
    cells = {}  # tag -> variant -> {k: seconds to target or None (not reached, diverged, invalid)}
    labels = {}  # tag -> the table's heading
    for n in names:
        m = TUNED_NAME.fullmatch(n)
        if not m:
            continue
        variant, k, t = m.group(1), int(m.group(2) or 1), m.group(3) or "8 ranks, ranks 0-1 at half speed"
        labels[t] = t.replace("-", " ranks, ", 1) if m.group(3) else t
        r = Run(d, n)
        row = r.row(target)
        e = row.get("emulation")
        ok = not row.get("diverged") and (not e or e.get("valid"))
        cells.setdefault(t, {}).setdefault(variant, {})[k] = row.get("seconds_to_target") if ok else None
    ks = sorted({k for vs in cells.values() for c in vs.values() for k in c})
    if ks == [1] or not ks:
        return [], ""
    rows, text = [], []
    for t, vs in cells.items():
        best = {v: min(((s, k) for k, s in c.items() if s), default=None) for v, c in vs.items()}
        ars = [b for v, b in best.items() if v.startswith("allreduce") and b]
        plain = [b for v, b in best.items() if v.startswith("allreduce") and "diloco" not in v and b]
        base, base_plain = (min(ars) if ars else None), (min(plain) if plain else None)
        md = []
        for v, c in vs.items():
            b = best[v]
            ratio = b[0] / base[0] if b and base else None
            ratio_plain = b[0] / base_plain[0] if b and base_plain else None
            rows.append({"tag": t, "variant": v, "seconds_by_sync_every": {str(k): c.get(k) for k in ks},
                         "best_sync_every": b[1] if b else None, "best_seconds": b[0] if b else None,
                         "x_best_tuned_allreduce": ratio, "x_best_tuned_allreduce_without_outer": ratio_plain})
            md.append([v] + [secs(c[k]) if c.get(k) else ("-" if k not in c else "not reached") for k in ks]
                      + [f"{secs(b[0])} at k {b[1]}" if b else "not reached", f(ratio_plain), f(ratio)])
        text.append(f"**{labels[t]}, each variant at its best `--sync-every`** "
                    f"(train s to {100 * target:.0f} %, one run a cell; invalid or diverged runs count as not reached):")
        text.append(table(["variant"] + [f"k {k}" for k in ks]
                          + ["best", "x best tuned allreduce without an outer step", "x best tuned allreduce (DiLoCo included)"], md))
    text.insert(0, "**Against the tuned baseline** (issue 40): the same rows at every `--sync-every` of the grid, "
                   "with allreduce under DiLoCo's outer optimizer (nesterov, `allreduce-diloco`); each variant "
                   "takes its best interval, and the best of the allreduce rows is the baseline.")
    return rows, "\n\n".join(text)


def consistent(row):
    h = row.get("consistency_histogram")
    if not h or sum(h) == 0:
        return None
    return h[-1] / sum(h)


# The claims section (`report/run.sh claims`): each `benches/claim-NAME.sh DIR` wrote DIR/claim.json,
# an array of rows (paper, claim, paper_value, measured, verdict, why, setting), and DIR/table.md.
# The verdicts are the scripts' own, computed from their runs against the paper's threshold; this
# only lays them out. summary.json gets them as its `claims` array, the section's facts as
# `claims_run`. A meta.jsonl key `assembled` (written by hand when DIR/NAME are copies of the
# scripts' separate full runs rather than one `report/run.sh claims`) says where each came from,
# in place of "one run of this section".
CLAIMS_TITLE = "The papers' claims, tested in the emulated cluster"
CLAIM_FIELDS = ("paper", "claim", "paper_value", "measured", "verdict")


def cell(v):
    return str(v).replace("|", "\\|").replace("\n", " ")


def claims_section(args):
    d = os.path.join(args.runs, "claims")
    if not os.path.exists(os.path.join(d, "meta.jsonl")):
        return None
    m = meta(d)
    if "finished" not in m:
        return None
    rows, parts = [], []
    for name in m.get("rows", "").split():
        cd = os.path.join(d, name)
        got = json.load(open(os.path.join(cd, "claim.json")))
        got = got if isinstance(got, list) else [got]
        for r in got:
            missing = [k for k in CLAIM_FIELDS if not r.get(k)]
            if missing:
                raise SystemExit(f"{cd}/claim.json: a row lacks {', '.join(missing)} ({r}); "
                                 f"benches/claim-{name}.sh must write every field")
            rows.append(dict(r, bench=f"benches/claim-{name}.sh"))
        tmd = os.path.join(cd, "table.md")
        parts.append((name, got, open(tmd).read().strip() if os.path.exists(tmd) else "", m.get(f"seconds_{name}")))
    q = m.get("quick") == "1"
    text = [("QUICK=1: each claim's script ran its short subset (one repetition, runs too short to judge); "
             "`make report` runs them in full.\n" if q else "")
            + (m["assembled"] + " " if m.get("assembled") else "Every row below was measured in one run of this section, ")
            + "in the emulated cluster "
            "(docs/emulation.md): every step lasts a declared compute time and every message the time its "
            "declared link takes, at a dilation that keeps the ranks on time on this 2-core machine; each run "
            "checks that it did (its validity is in the tables). Times are to the same target on the same "
            "evaluation; medians over the repetitions, [min-max] their range.\n",
            table(["paper", "claim", "paper's number", "measured here", "verdict"],
                  [[cell(r[k]) for k in CLAIM_FIELDS] for r in rows])]
    for name, got, tmd, secs in parts:
        text.append(f"### {got[0]['paper']} (`benches/claim-{name}.sh`)")
        for r in got:
            text.append(f"- **{cell(r['claim'])}**: {cell(r['verdict'])}. {r.get('why', '')}")
        settings = sorted({r["setting"] for r in got if r.get("setting")})
        text += [f"Setting: {st}" for st in settings]
        if tmd:
            text.append(tmd)
        text.append(f"Re-run: `benches/claim-{name}.sh DIR`" + (f" ({secs} s here)." if secs else "."))
    return {"title": CLAIMS_TITLE, "rows": rows, "load": m["load"], "finished": m["finished"],
            "command": "report/run.sh claims" + (" (QUICK=1)" if q else ""), "markdown": "\n\n".join(text)}


def section(args, name):
    d = os.path.join(args.runs, name)
    if not os.path.exists(os.path.join(d, "meta.jsonl")):
        return None
    m = meta(d)
    if "finished" not in m:
        return None
    names = m.get("rows", "").split()
    svgs, text = [], []
    res = {"title": cluster_title(name, m), "claim": CLAIMS[name], "load": m["load"], "finished": m["finished"],
           "command": f"report/run.sh {name}" + (" (QUICK=1)" if m.get("quick") == "1" else "")}
    q = args.quick == "1"
    if name in ("asap61", "stragglers", "bandwidth", "asap62", "libsvm", "movielens"):
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
        elif name == "libsvm":
            base_of = lambda n, r: f"allreduce-{r.start['config']['model']}"
            cols = ["model", "staleness mean (ssp)"]
            extra = lambda r, row: [r.start["config"]["model"], f(row["mean_staleness"])]
        else:
            base_of = lambda n, r: "allreduce"
            cols = ["staleness mean"]
            extra = lambda r, row: [f(row["mean_staleness"])]
        if name in ("libsvm", "movielens"):
            r0 = Run(d, names[0]).start
            text.append(f"Data: `{m.get('data')}` ({r0.get('train_examples')} training examples, {r0.get('test_examples')} held out"
                        + (", `--test-fraction " + m["test_fraction"] + "`" if m.get("test_fraction") else "")
                        + f"), {m.get('what')}; run options `{m.get('options')}`.\n")
        rows, md = training_section(args, d, m, names, cols, extra, base_of)
        res["rows"] = rows
        text.append(md)
        if name in ("asap61", "asap62"):
            res["tuned"], tmd = tuned_section(d, names, TARGETS[name])
            if tmd:
                text.append(tmd)
        groups = {}
        for n in names:
            tm = TUNED_NAME.fullmatch(n)
            if name in ("asap61", "asap62") and tm and tm.group(2):
                continue  # the grid's rows are in the tuned table; the plots keep every-step runs
            if name == "asap61":
                key = tag(Run(d, n))
            elif name == "libsvm":
                key = Run(d, n).start["config"]["model"]
            else:
                key = "32" if n.endswith("production") else "8"
            groups.setdefault(key, []).append(f"{d}/{n}.jsonl")
        for key, files in groups.items():
            what = key.replace("-", " ranks, ", 1) if name == "asap61" else (f"{key}, 8 ranks" if name == "libsvm" else f"{key} ranks")
            svg = plot(args, f"{name}-{key}.svg", files, f"{res['title']} ({what})")
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
        text.append(TORCH_NOTE)
    elif name == "torch":
        target = TARGETS[name]
        rows, md = [], []
        for n in names:
            r = Run(d, n)
            s, h = r.summary, r.hit(target)
            cfg = r.start["config"]
            torch_run = cfg.get("sync") == "ddp-gloo"
            row = {"run": n, "tool": f"PyTorch {cfg.get('torch')} DDP, gloo" if torch_run else "asap-train",
                   "model": cfg["model"], "seed": cfg["seed"], "ranks": s["ranks"], "target": target,
                   "seconds_to_target": h["train_seconds"] if h else None, "rounds_to_target": h["round"] if h else None,
                   "mb_sent_per_rank_to_target": h["counters"]["bytes_sent"]["mean"] / 1e6 if h else None,
                   "final_metric": s["final_metric"], "train_seconds": s["train_seconds"], "rounds": s["rounds"],
                   "examples_per_second_per_rank": s["examples_per_second_per_rank"]}
            rows.append(row)
        # vs allreduce: our allreduce with the same model and seed.
        base = {(x["model"], x["seed"]): x["seconds_to_target"] for x in rows if x["run"].startswith("allreduce")}
        for row in rows:
            t, b0 = row["seconds_to_target"], base.get((row["model"], row["seed"]))
            row["vs_baseline"] = t / b0 if t and b0 else None
            md.append([row["run"], row["tool"], row["model"], row["seed"], secs(t) if t else "not reached", f(row["vs_baseline"]),
                       f(row["rounds_to_target"], "{}"), mb(row["mb_sent_per_rank_to_target"]), pct(row["final_metric"]),
                       secs(row["train_seconds"]), f(row["examples_per_second_per_rank"], "{:,.0f}")])
        res["rows"] = rows
        text.append(f"Same run options for all: `{m.get('options')} --model M --seed S` (8 ranks; Fashion-MNIST, contiguous IID "
                    "shards, standardised pixels, held-out set of 10,000 images, evaluation every 10 rounds). The DDP peer is "
                    "`report/torch_ddp.py`: 8 processes from `torch.multiprocessing.spawn`, gloo over loopback, "
                    "`torch.set_num_threads(1)` per process; MLR is a zero-initialised `nn.Linear(784, 10)`, the MLP "
                    "784-128-10 with ReLU and our He-normal initialisation; plain SGD, weight decay 1e-5 on the weights only, "
                    "eta = 0.3 * 0.8^epoch, 64 examples per rank per step, every rank the same number of steps per epoch. "
                    "DDP averages gradients every step, which for equal replicas is our `--sync allreduce` model "
                    "averaging; only the shuffles' random streams differ. MB sent for DDP is the ring all-reduce volume, "
                    "counted as for our allreduce (gloo does not report it). vs allreduce: against our allreduce with the "
                    "same model and seed.\n")
        text.append(table(["run", "tool", "model", "seed", f"train s to {100 * target:.0f} %", "vs allreduce", "rounds to target",
                           "MB sent/rank to target", "final held-out acc", "training s", "examples/s per rank"], md))
        agg = []
        for tool in ("asap-train", "ddp"):
            for model in ("mlr", "mlp"):
                xs = [x for x in rows if x["model"] == model and (x["run"].startswith("allreduce") if tool == "asap-train" else x["run"].startswith("torch"))]
                if len(xs) > 1:
                    agg.append(f"{'our allreduce' if tool == 'asap-train' else 'DDP'} {model} over seeds "
                               f"{', '.join(str(x['seed']) for x in xs)}: final accuracy {', '.join(pct(x['final_metric']) for x in xs)}; "
                               f"examples/s per rank {', '.join(f(x['examples_per_second_per_rank'], '{:,.0f}') for x in xs)}")
        if agg:
            text.append("Seed spread (the shuffles differ, the training does not): " + "; ".join(agg) + ".")
        res["torch_install"] = {k: m.get(k) for k in ("torch_source", "torch_version", "torch_venv_mb", "torch_install_seconds",
                                                      "torch_installed_at", "torch_installed_now", "torch_venv")}
        ti = res["torch_install"]
        text.append(f"torch: `{ti['torch_version']}` from {ti['torch_source']}, its venv `{ti['torch_venv']}` holds "
                    f"{ti['torch_venv_mb']} MB; `pip install` took {ti['torch_install_seconds']} s (finished {ti['torch_installed_at']})"
                    + (" (this run's set-up, not counted in the training times)" if ti.get("torch_installed_now") == "1" else " (an earlier run's set-up)")
                    + ". " + TORCH_WHY)
        for model in ("mlr", "mlp"):
            files = [f"{d}/{x['run']}.jsonl" for x in rows if x["model"] == model and x["seed"] == 1]
            if files:
                labels = ["PyTorch DDP (gloo)" if x["run"].startswith("torch") else "asap-train " + x["run"].rsplit("-", 2)[0]
                          for x in rows if x["model"] == model and x["seed"] == 1]
                svg = plot(args, f"torch-{model}-8.svg", files, f"{TITLES[name]} ({model}, seed 1)", labels=labels)
                if svg:
                    svgs.append(svg)
    elif name == "sparse":
        md, rows = [], []
        for n in names:
            r = Run(d, n)
            s = r.summary
            rss_files = sorted(glob.glob(f"{d}/{n}.rss.*"))
            if len(rss_files) != s["ranks"]:
                sys.exit(f"{d}/{n}.rss.*: {len(rss_files)} peak-RSS files for {s['ranks']} ranks "
                         "(each rank's /usr/bin/time -o writes one): re-run `report/run.sh sparse`")
            rss = [int(open(x).read().split()[-1]) / 1024 for x in rss_files]
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
    claims = claims_section(args)
    # A section without runs here keeps what the report already says about it (its summary entry
    # and its README text, as that section's own run wrote them): re-running one section must not
    # drop the others, whose raw runs may be gone (runs/ is not committed).
    kept = {}
    old_json, old_md = os.path.join(args.out, "summary.json"), os.path.join(args.out, "README.md")
    if os.path.exists(old_json) and os.path.exists(old_md):
        old = json.load(open(old_json))
        blocks, cur = {}, None
        for line in open(old_md).read().split("\n"):
            if line.startswith("## "):
                cur = line[3:]
                blocks[cur] = []
            elif cur is not None:
                blocks[cur].append(line)
        if claims is None and isinstance(old.get("claims"), list) and CLAIMS_TITLE in blocks:
            claims = dict(old.get("claims_run") or {}, rows=old["claims"], kept=True,
                          markdown="\n".join(blocks[CLAIMS_TITLE]).strip("\n"))
        for n in ORDER:
            # The heading may have been renamed by hand since (matched by the part before " (").
            title = old.get(n, {}).get("title")
            if title not in blocks and title:
                title = next((b for b in blocks if b.split(" (")[0] == title.split(" (")[0]), title)
            if n not in secs and n in old and title in blocks:
                # A 2-core section's heading takes today's label; an emulated one keeps its cluster.
                relabel = title.split(" (")[0] == TITLES.get(n, "").split(" (")[0] and "emulated cluster" not in title
                old[n]["title"] = TITLES[n] if relabel else title
                text = "\n".join(blocks[title]).strip("\n")
                if "Not run yet" in text:
                    continue
                if n == "peers":
                    text = TORCH_NOTE_OLD.sub(TORCH_NOTE, text)
                kept[n] = (old[n], text)
    summary = {n: {k: v for k, v in s.items() if k != "markdown"} for n, s in secs.items()}
    summary.update({n: k[0] for n, k in kept.items()})
    summary = {n: summary[n] for n in ORDER if n in summary}
    if claims:
        summary = {"claims": claims["rows"],
                   "claims_run": {k: v for k, v in claims.items() if k not in ("rows", "markdown", "kept")}, **summary}
    json.dump(summary, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    doc = ["# asap-train report", "",
           "Produced by `make report` (`report/run.sh`): every table below comes from one run of its section on "
           "this machine (2 cores), so ratios within a table are meaningful. The claims and the ASAP sections run in "
           "the emulated cluster (docs/emulation.md), where a rank's step and a link's transfer take declared times; "
           "sections labelled \"sharing 2 cores\" ran 8 or more ranks on the 2 cores themselves, where the CPU "
           "decides more than the algorithm (they are kept from earlier runs and re-run only when named: "
           "`report/run.sh stragglers`). The load average at the end of each section is given next to it. All "
           "numbers are also in [summary.json](summary.json). Re-run one table with the command under it.", ""]
    if claims:
        doc += [f"## {CLAIMS_TITLE}", "", claims["markdown"], ""]
        if not claims.get("kept"):
            doc += [f"Load average (1/5/15 min) at the end: {claims['load']}; finished {claims['finished']}. "
                    f"Re-run: `{claims['command']}`.", ""]
    else:
        doc += [f"## {CLAIMS_TITLE}", "", "Not run yet: `report/run.sh claims`.", ""]
    for n in ORDER:
        if n in kept:
            doc += [f"## {kept[n][0]['title']}", "", kept[n][1], ""]
            continue
        if n not in secs:
            if n == "torch":
                doc += [f"## {TITLES[n]}", "", "Not run: opt-in, `make report PEERS=torch` or `report/run.sh torch`. " + TORCH_WHY, ""]
            else:
                doc += [f"## {TITLES[n]}", "", f"Not run yet: `report/run.sh {n}`.", ""]
            continue
        s = secs[n]
        doc += [f"## {s['title']}", "", f"**Paper's claim.** {s['claim']}", "", "**Measured.**", "", s["markdown"], "",
                f"Load average (1/5/15 min) at the end: {s['load']}; finished {s['finished']}. Re-run: `{s['command']}`.", ""]
        for svg in s["svgs"]:
            doc += [f"![{svg}]({svg})", ""]
    open(os.path.join(args.out, "README.md"), "w").write("\n".join(doc))
    print(f"wrote {args.out}/README.md and {args.out}/summary.json ({len(secs)} section(s) from runs"
          + (f", kept from the existing report: {' '.join(kept)}" if kept else "") + ")")


if __name__ == "__main__":
    main()
