"""claim.json and table.md for benches/claim-gaia.sh: each verdict computed here from the measured
medians against the paper's threshold (the constants below), never written by hand.

Usage: python3 claim_gaia.py OUTDIR REPS QUICK("quick" or "") DILATION ROW... -- SIGRUN...
Time to target, rounds, bytes to target and validity per run come from benches/emulated-table.py's
row() (the same counting as every emulated table).
"""
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# emulated-table.py is a script (a hyphen in its name, main() at the bottom): take its functions
# without running it.
_src = open(os.path.join(HERE, "emulated-table.py")).read()
ET = {"__name__": "emulated_table"}
exec(compile(_src.rsplit("\nmain()", 1)[0], "emulated-table.py", "exec"), ET)
row, fmt = ET["row"], ET["fmt"]

# The paper's numbers (papers/gaia-approximate-synchronous-parallel.txt, abstract and §6.2, §3.3).
LAN_RANGE = (0.94, 1.40)   # Gaia over WANs / the same algorithm on a LAN
ISSUE_LAN = 1.5            # issue 29's done-when: gaia within 1.5x of its LAN time
SPEEDUP_MIN = 1.8          # Gaia 1.8-53.5x faster than the BSP/SSP baselines over the same WAN
INSIGNIFICANT = 0.95       # > 95 % of updates change their parameter by < 1 %


def summaries(out, name, reps):
    stem = name.replace(" ", "_").replace("/", "_")
    for rep in range(1, reps + 1):
        f = f"{out}/{stem}-{rep}.jsonl"
        if os.path.exists(f):
            lines = [json.loads(l) for l in open(f) if l.strip()]
            s = next((l for l in lines if l["event"] == "summary"), None)
            if s:
                yield s


def grid(names, base):
    """{k: row} of one variant over the interval grid: BASE itself is the paper's clock (k 30)."""
    g = {30: base} if base in names else {}
    for n in names:
        b, _, k = n.partition(", k ")
        if b == base and k:
            g[int(k)] = n
    return g


def per_k(g, data, med, valid, extra):
    """'k 4 not reached (>= 21.3 s), k 16 24.10 s, ...': the grid as measured, for the claim's why and the table."""
    def one(n):
        if not valid[n]:
            return "INVALID"
        if med[n] == float("inf"):
            return f"not reached (>= {extra[n]['train_s'] or 0:.1f} s)"
        return f"{med[n]:.2f} s"
    return ", ".join(f"k {k} {one(n)}" for k, n in sorted(g.items()))


def tuned_rows(names, data, med, valid, extra, verdict_of, setting):
    """Issue 40, item 4: gaia against BSP (with or without DiLoCo) and SSP over the WAN, each side at its
    best valid --sync-every of the grid by median time to target; the paper's threshold. A capped row
    that missed the target is out of the running; the why says whether its bound (its training time)
    is above the chosen best, i.e. whether it could not have won."""
    if not any(", k " in n for n in names):
        return []
    gg = grid(names, "wan gaia")
    best = lambda rs: min((n for n in rs if valid[n] and med[n] != float("inf")), key=lambda n: med[n], default=None)
    bg = best(gg.values())
    out = []
    for label, bases in (("BSP (allreduce, or DiLoCo: allreduce with an outer Nesterov step)", ("wan allreduce", "wan allreduce diloco")),
                         ("SSP (staleness 2)", ("wan ssp",))):
        grids = {b: grid(names, b) for b in bases}
        rs = [n for g in grids.values() for n in g.values()]
        bb = best(rs)
        ks = "/".join(str(k) for k in sorted({k for g in list(grids.values()) + [gg] for k in g}))
        shown = "; ".join(f"{b}: {per_k(g, data, med, valid, extra)}" for b, g in list(grids.items()) + [("wan gaia", gg)] if g)
        claim = (f"Gaia is 1.8-53.5x faster than a {label} parameter server over the same WAN: against the tuned baseline "
                 f"(best --sync-every of {ks}; gaia's clock at the same grid, its best)")
        if bb is None or bg is None:
            out.append({"paper": "Gaia (Hsieh et al., NSDI'17)", "claim": claim, "paper_value": ">= 1.8x (1.8-53.5x)",
                        "measured": f"no valid row reached the target on one side ({shown})", "verdict": "not judged",
                        "why": "a side of the grid has no valid run that reached the target", "setting": setting})
            continue
        r = med[bb] / med[bg]
        loose = [n for n in rs + list(gg.values()) if valid[n] and med[n] == float("inf")
                 and (extra[n]["train_s"] or 0) < med[bb if n in rs else bg]]
        rounds = lambda n: f"{statistics.median(data[n][1]):.0f}" if data[n][1] else "-"
        out.append({
            "paper": "Gaia (Hsieh et al., NSDI'17)",
            "claim": claim,
            "paper_value": ">= 1.8x (1.8-53.5x)",
            "measured": f"{r:.2f}x (the best baseline {bb} {fmt(data[bb][0])} s vs the best gaia {bg} {fmt(data[bg][0])} s)",
            "verdict": verdict_of([bb, bg], lambda r=r: "reproduced" if r >= SPEEDUP_MIN else ("partly" if r > 1.0 else "not reproduced")),
            "why": (f"Per interval (median s to target): {shown}. The best baseline ({bb}) reached the target in {rounds(bb)} rounds, "
                    f"sync {extra[bb]['wait'] or 0:.2f} s per rank; the best gaia ({bg}) in {rounds(bg)} clocks, "
                    f"{extra[bg]['wait'] or 0:.2f} s. Over this WAN every baseline round pays the round trip, so fewer, "
                    f"longer rounds are the baseline's only lever, and k 30 (a pass) is the top of the grid."
                    + (f" Not excluded by their bound: {', '.join(loose)} (capped below the best's time)." if loose else "")),
            "setting": setting,
        })
    return out


def main():
    args = sys.argv[1:]
    cut = args.index("--")
    out, reps, quick, dil = args[0], int(args[1]), args[2] == "quick", float(args[3])
    names, sigruns = args[4:cut], args[cut + 1:]
    data = {n: row(out, n, reps) for n in names}
    med = {n: statistics.median(d[0]) if d[0] else float("inf") for n, d in data.items()}
    valid = {n: d[3] for n, d in data.items()}
    extra = {}
    for n in names:
        ss = list(summaries(out, n, reps))
        sm = [s.get("sync_metrics") or {} for s in ss]
        extra[n] = {
            "wait": statistics.median(s["counters"]["sync_seconds"]["mean"] for s in ss) if ss else None,
            "train_s": statistics.median(s["train_seconds"] for s in ss) if ss else None,
            "mirror": statistics.median(m["mirror_wait_seconds"] for m in sm) if sm and "mirror_wait_seconds" in sm[0] else None,
            "filter": statistics.median(1 - m["significant_updates"] / m["updates"] for m in sm) if sm and sm[0].get("updates") else None,
            "w1": statistics.median(m["worker_updates_below_1pct"] / m["worker_updates"] for m in sm) if sm and sm[0].get("worker_updates") else None,
            "wan_mb": statistics.median(m["wan_bytes_sent"] / 1e6 for m in sm) if sm and "wan_bytes_sent" in sm[0] else None,
        }

    setting = (f"8 ranks = 2 DCs x 4 (gaia --groups 2, 1 %, DS 2); Fashion-MNIST MLR, batch 256, step 0.916 ms "
               f"(clusters/*.toml [compute], asap-train bench --write-profile), a clock = 30 steps = one pass over a "
               f"rank's data; target 83.6 % held-out; WAN 100 Mbit/s 50 ms (clusters/wan-2dc.toml), LAN 1 GbE 50 us "
               f"(clusters/1gbe.toml); baselines over the WAN at the PS-equivalent rate (175 Mbit/s; allreduce 16.7 ms, "
               f"ssp 50 ms); dilation {dil:g}; {reps} run(s) per row")

    def verdict_of(ok_rows, judge):
        if quick:
            return "quick run: not judged"
        if not all(valid.get(r, False) for r in ok_rows):
            return "not judged"
        return judge()

    def meas(text, ok_rows):
        return text if all(valid.get(r, False) for r in ok_rows) else "INVALID: " + text

    def ratio(a, b):
        return med[a] / med[b] if med[b] not in (0, float("inf")) and a in med else float("inf")

    rows = []
    g, gl, bl, bw, sw = "wan gaia", "lan gaia", "lan allreduce", "wan allreduce", "wan ssp"
    if g in med and bl in med:
        r = ratio(g, bl)
        rows.append({
            "paper": "Gaia (Hsieh et al., NSDI'17)",
            "claim": "over a WAN, Gaia is within 0.94-1.40x of the same ML algorithm on a LAN (the baseline PS on a LAN)",
            "paper_value": "0.94-1.40x",
            "measured": meas(f"{r:.2f}x (wan gaia {fmt(data[g][0])} s vs lan allreduce {fmt(data[bl][0])} s to {100 * 0.836:.1f} %)", [g, bl]),
            "verdict": verdict_of([g, bl], lambda: "reproduced" if r <= LAN_RANGE[1] else ("partly" if r <= ISSUE_LAN else "not reproduced")),
            "why": (f"Each clock computes {30 * 0.916:.1f} ms (cluster time) and DS 2 lets a group run 2 clocks ahead of the "
                    f"other's data, more than the 50 ms one-way latency plus a shard's serialisation, so gaia's mirror wait "
                    f"was {extra[g]['mirror'] or 0:.2f} s (worst rank) over {extra[g]['train_s'] or 0:.1f} s of training; "
                    f"clocks to target {statistics.median(data[g][1]) if data[g][1] else '-'} vs {statistics.median(data[bl][1]) if data[bl][1] else '-'}."),
            "setting": setting,
        })
    if g in med and gl in med:
        r = ratio(g, gl)
        rows.append({
            "paper": "Gaia (Hsieh et al., NSDI'17)",
            "claim": "issue 29: gaia over the WAN within 1.5x of the same gaia run on a LAN",
            "paper_value": "<= 1.5x (issue), paper 0.94-1.40x",
            "measured": meas(f"{r:.2f}x (wan gaia {fmt(data[g][0])} s vs lan gaia {fmt(data[gl][0])} s)", [g, gl]),
            "verdict": verdict_of([g, gl], lambda: "reproduced" if r <= ISSUE_LAN else "not reproduced"),
            "why": (f"The same gaia with its WAN messages at 1 GbE: mirror wait {extra[gl]['mirror'] or 0:.2f} s on the LAN "
                    f"against {extra[g]['mirror'] or 0:.2f} s over the WAN (median per rank); the LAN inside a group is "
                    f"not paced in either."),
            "setting": setting,
        })
    for base, label in ((bw, "BSP (allreduce)"), (sw, "SSP (staleness 2)")):
        if g in med and base in med:
            r = ratio(base, g)
            rows.append({
                "paper": "Gaia (Hsieh et al., NSDI'17)",
                "claim": f"Gaia is 1.8-53.5x faster than a {label} parameter server over the same WAN",
                "paper_value": ">= 1.8x (1.8-53.5x)",
                "measured": meas(f"{r:.2f}x ({base} {fmt(data[base][0])} s vs wan gaia {fmt(data[g][0])} s)", [g, base]),
                "verdict": verdict_of([g, base], lambda r=r: "reproduced" if r >= SPEEDUP_MIN else ("partly" if r > 1.0 else "not reproduced")),
                "why": (f"{base}: {statistics.median(data[base][1]) if data[base][1] else '-'} rounds to target, in sync "
                        f"{extra[base]['wait'] or 0:.2f} s per rank (median of the runs' mean), against gaia's "
                        f"{statistics.median(data[g][1]) if data[g][1] else '-'} clocks and {extra[g]['wait'] or 0:.2f} s; "
                        f"the baseline pays the WAN round trip every clock"
                        f"{' (our ssp worker waits for its read answer every clock, so staleness 2 hides no latency)' if base == sw else ''}."),
                "setting": setting,
            })
    rows += tuned_rows(names, data, med, valid, extra, verdict_of, setting)
    # §3.3: the share of each worker's updates that change their parameter by < 1 %.
    fr = {}
    if g in extra and extra[g]["w1"] is not None:
        fr["Fashion-MNIST MLR (the timed wan gaia runs)"] = (extra[g]["w1"], extra[g]["filter"])
    for sname, label in (("mf", "MovieLens MF (4 ranks, 2 groups, untimed)"), ("logreg", "RCV1-shape sparse logreg (4 ranks, 2 groups, untimed)")):
        if sname in sigruns:
            s = next(json.loads(l) for l in open(f"{out}/sig-{sname}.jsonl") if '"summary"' in l)
            m = s["sync_metrics"]
            fr[label] = (m["worker_updates_below_1pct"] / m["worker_updates"], 1 - m["significant_updates"] / m["updates"])
    if fr:
        hits = [k for k, (w, _) in fr.items() if w > INSIGNIFICANT]
        rows.append({
            "paper": "Gaia (Hsieh et al., NSDI'17) §3.3",
            "claim": "> 95 % of the updates change their parameter by less than 1 % (the significance filter's premise)",
            "paper_value": "95.2 % (MF) / 95.6 % (TM) / 97.0 % (IC)",
            "measured": "; ".join(f"{k}: {100 * w:.1f} % of worker updates < 1 % (filter held back {100 * f:.1f} % of group updates)" for k, (w, f) in fr.items()),
            "verdict": ("quick run: not judged" if quick else
                        "reproduced" if len(hits) == len(fr) else ("partly" if hits else "not reproduced")),
            "why": ("Counted as in §3.3: per rank, clock and parameter with a non-zero update, its change to the global model "
                    "against the parameter's value (sync_metrics.worker_updates_below_1pct); our runs stop after a few epochs, "
                    "the paper's run to convergence."),
            "setting": "gaia 1 %, DS 2; MLR as above; MF: lr 1, lambda 0.1, a clock = 22 steps; logreg: asap-train data synth (RCV1 shape, fewer rows), batch 64, a clock = 30 steps",
        })
    json.dump(rows, open(f"{out}/claim.json", "w"), indent=1)

    with open(f"{out}/table.md", "w") as t:
        t.write("| run | s to target, median [min-max] | clocks/rounds to target | MB sent/rank to target | sync s/rank (transfer + wait, whole run) | mirror wait s (gaia, worst rank) | WAN MB (gaia's mirror data) | emulation |\n")
        t.write("|---|---|---|---|---|---|---|---|\n")
        for n in names:
            times, rounds, mb, ok, notes = data[n]
            rng = fmt(times).replace(" (", " [").replace(")", "]")
            r = f"{statistics.median(rounds):.0f}" if rounds else "-"
            m = f"{statistics.median(mb):.2f}" if mb else "-"
            ws = f"{extra[n]['wait']:.2f}" if extra[n]["wait"] is not None else "-"
            mw = f"{extra[n]['mirror']:.2f}" if extra[n]["mirror"] is not None else "-"
            wan = f"{extra[n]['wan_mb']:.2f}" if extra[n]["wan_mb"] is not None else "-"
            v = "valid" if ok else "INVALID: " + "; ".join(sorted(set(notes)))
            t.write(f"| {n} | {rng} | {r} | {m} | {ws} | {mw} | {wan} | {v} |\n")
        if any(", k " in n for n in names):
            t.write("\nAgainst the tuned baseline, per --sync-every (median s to target; a capped row that missed it: its "
                    "training time, a lower bound):\n\n")
            for b in ("wan allreduce", "wan allreduce diloco", "wan ssp", "wan gaia"):
                gb = grid(names, b)
                if gb:
                    t.write(f"- {b}: {per_k(gb, data, med, valid, extra)}\n")
        t.write("\n" + setting.replace("; ", ".\n", 2) + ".\n")
        t.write("Time is training seconds (emulated, dilated) until the evaluated model reached the target, evaluated every clock; "
                "the baselines' links charge a parameter server's WAN cost per round (benches/claim-gaia.sh).\n")
    print(open(f"{out}/table.md").read())
    for r in rows:
        print(f"- {r['claim']}: {r['measured']} -> {r['verdict']}")


main()
