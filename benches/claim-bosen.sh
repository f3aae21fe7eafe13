#!/usr/bin/env bash
# Issue 29, Bösen (papers/bosen-managed-communication.txt §5.1, Fig. 4a and 7a): managed
# communication against a well-implemented bounded-staleness system on MF.
#   claim 1: 2.5x faster to the target in wall time (MC-800-R against BS, 1 GbE, S = 2);
#   claim 2: 5.3x fewer iterations (clocks) to the target;
#   claim 3: relative-magnitude priority beats random at the same bandwidth budget.
#
#   benches/claim-bosen.sh OUTDIR      writes OUTDIR/claim.json and OUTDIR/table.md
#
# Setting, scaled to this machine (benches/claim-bosen.md says why each number):
# - 8 ranks, MF (--factors 10) on MovieLens latest-small (datasets/out, 90,004 training ratings,
#   10,000 held out), batch 256, one clock = one pass over a rank's shard (44 mini-batches, the
#   paper's "1 clock tick = 1 pass"), S = 2 (the paper's), --apply consgd for both modes (the
#   same server rule: bosen's default; ssp's DynSGD is not defined for bosen's early pushes).
# - links: clusters/1gbe.toml at dilation 20 (1 Gbit/s, 50 us; emulated as 50 Mbit/s, 1 ms);
#   bosen's budget 40 Mbit/s = 80 % of the link (the paper's 800 Mbps of 1 GbE), random and
#   relative priority; ssp sends only at clock ends (eager end-of-clock push and read).
# - compute: 7.6 ms per step = 0.380 ms x 20. 0.380 ms is one MF step of 256 ratings here:
#   `asap-train bench --data datasets/out/movielens-train.ratings --models mf --batch-size 256`
#   measured 673,261 ratings/s (2026-11-27, load ~7).
# - time to target: training seconds until the servers' model (evaluated every clock) reaches a
#   held-out RMSE of TARGET; every run trains EPOCHS clocks (>= 10 s of emulated training in full
#   mode), REPS runs per row, median [range]; a row is INVALID unless all its runs' emulation held.
#
# Environment: QUICK=1 (one short run per row, "quick run: not judged"), REPS [3], BIN
# [target/release/asap-train], BENCH_LOCK (each mpirun under `flock $BENCH_LOCK`), NICE [-20],
# TARGET [0.96], EPOCHS [24; QUICK 3], ONLY (a regex: run only the rows whose name matches, keeping
# the other rows' runs already in OUTDIR; the table and verdicts cover every row), GRID [1; QUICK 0]: the tuned-baseline rows of issue 40 (below).
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: benches/claim-bosen.sh OUTDIR}
mkdir -p "$OUTDIR"
source benches/priority.sh
BIN=${BIN:-target/release/asap-train}
NICE=${NICE:--20}
QUICK=$([ "${QUICK:-0}" = 1 ] && echo 1 || true)  # "1" or empty: QUICK=0, as report/run.sh passes it, is the full run
if [ -n "$QUICK" ]; then REPS=1; EPOCHS=${EPOCHS:-3}; PLAIN_EPOCHS=3; else REPS=${REPS:-3}; EPOCHS=${EPOCHS:-24}; PLAIN_EPOCHS=16; fi
TARGET=${TARGET:-0.96}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ -f datasets/out/movielens-train.ratings ] || datasets/prepare.sh >/dev/null
LOCK=()
[ -n "${BENCH_LOCK:-}" ] && LOCK=(flock "$BENCH_LOCK")
NP=8
STEP_MS=7.6
# DILATION slows the 1 GbE link (and its latency) by that factor, the step time staying 7.6 ms:
# at 20 ssp's clock-end traffic keeps the link busy ~20 % of a clock, at 50 about 40 % (issue 44
# item 3's regime). BUDGET defaults to 80 % of the emulated link (the paper's 800 of 1000 Mbit/s).
DILATION=${DILATION:-20}
BUDGET=${BUDGET:-$(python3 -c "print(round(1000 / $DILATION * 0.8, 3))")}
export DILATION BUDGET
common=(--data datasets/out/movielens-train.ratings --test-data datasets/out/movielens-test.ratings
    --model mf --lambda 0.1 --batch-size 256 --lr-decay 0.9
    --cluster clusters/1gbe.toml --dilation "$DILATION" --emulate-compute "$STEP_MS"
    --staleness 2 --eval-every 1 --target "$TARGET")
CONS="--apply consgd --lr 1 --epochs $EPOCHS"
variants=(
    "ssp|--sync ssp $CONS"
    "bosen random|--sync bosen --bandwidth-mbps $BUDGET --priority random $CONS"
    "bosen relative|--sync bosen --bandwidth-mbps $BUDGET --priority relative $CONS"
)
# Bösen's own server rule: updates are added (Inc), not averaged. The same step (--lr 0.1) for
# both; PLAIN_EPOCHS clocks (ssp runs that diverge stop early: a result, not a failure).
PLAIN=(--apply plain --lr 0.1 --epochs "$PLAIN_EPOCHS")
variants+=(
    "ssp plain|--sync ssp ${PLAIN[*]}"
    "bosen random plain|--sync bosen --bandwidth-mbps $BUDGET --priority random ${PLAIN[*]}"
)
# Issue 40's tuned baseline: the clock length is the knob an SSP user turns (the staleness bound
# S = 2 stays the paper's). ssp and bosen random get the same clock grid, 11 and 22 steps beside
# the paper's 44 (= one pass, the longest clock the grid takes: "up to an epoch"). Shorter clocks
# (1-4 steps) are left out: each clock end pushes and reads every touched row, and at 11 steps a
# clock already sends ~4x the rows of the 44-step clock for the same steps; sized to add
# 4 rows x 3 runs on the 2 shared cores (benches/claim-bosen.md, "Against the tuned ssp").
GRID=${GRID:-$([ -n "$QUICK" ] && echo 0 || echo 1)}
if [ "$GRID" = 1 ]; then
    for k in 11 22; do
        variants+=(
            "ssp k$k|--sync ssp $CONS --sync-every $k"
            "bosen random k$k|--sync bosen --bandwidth-mbps $BUDGET --priority random $CONS --sync-every $k"
        )
    done
fi
rows=()
for v in "${variants[@]}"; do
    name=${v%%|*}; args=${v#*|}
    [[ $args == *--sync-every* ]] || args="$args --sync-every 44"   # the paper's clock: one pass
    rows+=("$name")
    [ -n "${TABLE_ONLY:-}" ] && continue   # re-render OUTDIR's runs
    if [ -n "${ONLY:-}" ] && [[ ! $name =~ $ONLY ]]; then continue; fi   # keep the other rows' runs in OUTDIR
    for rep in $(seq 1 "$REPS"); do
        f="$OUTDIR/$(echo "$name" | tr ' /' '__')-$rep"
        # shellcheck disable=SC2086
        if ! "${LOCK[@]}" nice -n "$NICE" mpirun -n "$NP" "$BIN" train "${common[@]}" $args \
            --metrics "$f.jsonl" > "$f.log" 2>&1; then
            if grep -q "training diverged" "$f.log"; then
                touch "$f.diverged"
            else
                echo "run $name #$rep failed: see $f.log" >&2
                touch "$f.failed"
            fi
        fi
    done
done
LOAD="$(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUTDIR" "$REPS" "$TARGET" "$QUICK" "$LOAD" "${rows[@]}" <<'PY'
import importlib.util, json, os, statistics, sys
out, reps, target, quick, load, names = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] != "", sys.argv[5], sys.argv[6:]
spec = importlib.util.spec_from_file_location("et", os.path.join(os.path.dirname(os.path.abspath(".")), os.path.abspath("benches/emulated-table.py")))
et = importlib.util.module_from_spec(spec)
spec.loader.exec_module(et)

def extra(name):
    """Per run: bytes sent per rank, waiting per rank (mean), mean read staleness, early sends."""
    stem = name.replace(" ", "_")
    res = []
    for rep in range(1, reps + 1):
        f = f"{out}/{stem}-{rep}.jsonl"
        if not os.path.exists(f):
            continue
        s = next((json.loads(l) for l in open(f) if '"summary"' in l), None)
        if s is None:
            continue
        c, sm = s["counters"], s.get("sync_metrics") or {}
        res.append((c["bytes_sent"]["mean"] / 1e6, c["wait_seconds"]["mean"], sm.get("mean_staleness", float("nan")),
                    sm.get("early_pushes", 0) + sm.get("early_row_serves", 0), s["final_metric"], s["train_seconds"] if "train_seconds" in s else float("nan")))
    return res

def diverged(name):
    stem = name.replace(" ", "_")
    return sum(os.path.exists(f"{out}/{stem}-{rep}.diverged") for rep in range(1, reps + 1))

def row(name):
    """emulated-table.py's row, with diverged runs (loss NaN, no summary) as 'not reached' and
    not as failures: a step size a mode cannot hold is a result."""
    times, rounds, mb, valid, notes = et.row(out, name, reps)
    d = diverged(name)
    if d:
        notes = [x for x in notes if x != "a run failed"]
        valid = not notes and (len(times) + d == reps)
        times = times + [float("inf")] * d
    return times, rounds, mb, valid, notes

data = {n: row(n) for n in names}
ext = {n: extra(n) for n in names}
med = lambda xs: statistics.median(xs) if xs else float("inf")
rng = lambda xs: f"{med(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]" if xs and med(xs) != float("inf") else "not reached"

dil, budget = os.environ.get("DILATION", "20"), os.environ.get("BUDGET", "40")
lines = [f"| mode (8 ranks, MF MovieLens, 1 GbE at dilation {dil}) | s to RMSE %.2f, median [range] | clocks to target | MB sent/rank to target | MB sent/rank, whole run | wait s/rank | mean read staleness | early sends | final RMSE | emulation |".replace("%.2f", f"{target:.2f}"),
         "|---|---|---|---|---|---|---|---|---|---|"]
for n in names:
    times, rounds, mb, valid, notes = data[n]
    e = ext[n]
    col = lambda i, f="{:.2f}": f.format(med([x[i] for x in e])) if e else "-"
    rounds_s = f"{med(rounds):.0f} [{min(rounds)}-{max(rounds)}]" if rounds else "-"
    v = "valid" if valid else "INVALID: " + "; ".join(sorted(set(notes)))
    if diverged(n):
        v += f" ({diverged(n)} of {reps} diverged: loss NaN)"
    lines.append(f"| {n} | {et.fmt(times) if any(t != float('inf') for t in times) else 'not reached'} | {rounds_s} | "
                 f"{(f'{med(mb):.1f}' if mb else '-')} | {col(0, '{:.1f}')} | {col(1)} | {col(2)} | {col(3, '{:.0f}')} | {col(4, '{:.4f}')} | {v} |")

setting = (f"8 ranks, MF (10 factors) on MovieLens latest-small, batch 256, 1 clock = 1 pass (44 steps), S = 2, "
           f"--apply consgd, --lr 1 decay 0.9/epoch; clusters/1gbe.toml at dilation {dil} (1 Gbit/s links emulated as "
           f"{1000 / float(dil):g} Mbit/s, {0.05 * float(dil):g} ms); bosen budget {budget} Mbit/s (80 % of the link by default, "
           f"the paper's MC-800); 7.6 ms per step = 0.380 ms measured by "
           f"`asap-train bench --models mf --batch-size 256` on MovieLens x 20; {reps} run(s) per row; load {load}")

def verdict(ok, partly, valid):
    if not valid:
        return "not judged"
    if quick:
        return "quick run: not judged"
    return "reproduced" if ok else ("partly" if partly else "not reproduced")

ssp, rnd, rel, sspp, rndp = (data[n] for n in names[:5])
allvalid = lambda *ds: all(d[3] for d in ds)
t_ssp, t_rnd, t_rel = med(ssp[0]), med(rnd[0]), med(rel[0])
c_ssp, c_rnd = med(ssp[1]), med(rnd[1])
inv = lambda *ds: None if allvalid(*ds) else "INVALID"
rows = []
# Claim 1: the issue's done-when: bosen's time to target <= 0.5x ssp's (the paper: 2.5x faster).
ratio = t_rnd / t_ssp if t_ssp not in (0, float("inf")) and t_rnd != float("inf") else float("nan")
best = min(t_rnd, t_rel)
ratio_best = best / t_ssp if t_ssp not in (0, float("inf")) and best != float("inf") else float("nan")
rows.append({
    "paper": "Bösen (Wei et al., SoCC 2015)",
    "claim": "managed communication (MC-800-R) reaches the MF target 2.5x faster in wall time than bounded staleness (BS, S = 2)",
    "paper_value": "2.5x faster (time ratio 0.40); done-when of issue 29: bosen <= 0.5x ssp's time",
    "measured": inv(ssp, rnd, rel) or f"bosen random / ssp = {ratio:.2f} ({t_rnd:.2f} s vs {t_ssp:.2f} s); best bosen (relative or random) / ssp = {ratio_best:.2f}",
    "verdict": verdict(ratio <= 0.5, ratio < 0.9, allvalid(ssp, rnd, rel)),
    "why": f"Time to held-out RMSE {target}: ssp {rng(ssp[0])} s, bosen random {rng(rnd[0])} s, bosen relative {rng(rel[0])} s; "
           f"clocks {c_ssp:.0f} vs {c_rnd:.0f}; mean read staleness ssp {med([x[2] for x in ext[names[0]]]):.2f} vs bosen random {med([x[2] for x in ext[names[1]]]):.2f} clocks.",
    "setting": setting,
})
cr = c_ssp / c_rnd if c_rnd not in (0, float("inf")) and c_ssp != float("inf") else float("nan")
rows.append({
    "paper": "Bösen (Wei et al., SoCC 2015)",
    "claim": "managed communication needs 5.3x fewer iterations (clocks) than bounded staleness to reach the MF target",
    "paper_value": "5.3x fewer clocks (64 -> 24 at 200 Mbps, ~12 at 800 Mbps); threshold here: >= 2.65x (half the paper's factor) reproduced, > 1.1x partly",
    "measured": inv(ssp, rnd) or f"ssp {c_ssp:.0f} clocks / bosen random {c_rnd:.0f} clocks = {cr:.2f}x",
    "verdict": verdict(cr >= 2.65, cr > 1.1, allvalid(ssp, rnd)),
    "why": f"Clocks to RMSE {target} (median of {reps}): ssp {c_ssp:.0f}, bosen random {c_rnd:.0f}, bosen relative {med(rel[1]):.0f}; a clock is one pass over a rank's shard in both.",
    "setting": setting,
})
rel_beats = t_rel < t_rnd and (max(rel[0]) < min(rnd[0]) if rel[0] and rnd[0] else False)
rows.append({
    "paper": "Bösen (Wei et al., SoCC 2015)",
    "claim": "relative-magnitude prioritization beats random at the same bandwidth budget",
    "paper_value": "LDA: 25 % faster convergence than random at 640 Mbps; MLR 2.5x over BS with relative at 200 Mbps (MF itself used random)",
    "measured": inv(rnd, rel) or f"bosen relative / bosen random time = {t_rel / t_rnd:.2f}" if t_rnd not in (0, float("inf")) and t_rel != float("inf") else (inv(rnd, rel) or "a mode did not reach the target"),
    "verdict": verdict(rel_beats, t_rel < t_rnd, allvalid(rnd, rel)),
    "why": f"At 40 Mbit/s each: relative {rng(rel[0])} s, random {rng(rnd[0])} s to RMSE {target}; reproduced only when every relative run beats every random one.",
    "setting": setting,
})
# Claim 1 again at Bösen's own server rule (updates added, not averaged), the same step for both.
fin = lambda n: [x[4] for x in ext[n]]
d_ssp = diverged(names[3])
bos_fin = fin(names[4])
ok_bos = rndp[3] and len(bos_fin) == reps and max(bos_fin) <= 1.0
rows.append({
    "paper": "Bösen (Wei et al., SoCC 2015)",
    "claim": "managed communication converges faster than bounded staleness under Bösen's own update rule (Inc adds updates; stale sums are the parallel error it cuts)",
    "paper_value": "2.5x faster in wall time, 5.3x fewer clocks (MF, AdaRevision)",
    "measured": inv(rndp) or f"ssp diverged in {d_ssp} of {reps} runs; bosen random final RMSE {', '.join(f'{x:.3f}' for x in bos_fin)}; times to {target}: ssp {rng(sspp[0])}, bosen {rng(rndp[0])}",
    "verdict": verdict(False, d_ssp == reps and ok_bos, rndp[3]) if med(sspp[0]) == float("inf") else verdict(med(rndp[0]) / med(sspp[0]) <= 0.5, med(rndp[0]) < 0.9 * med(sspp[0]), rndp[3] and sspp[3]),
    "why": "At --apply plain and --lr 0.1 for both: when every ssp run diverges and every bosen run converges (final RMSE <= 1.0) the mechanism is shown but no time ratio exists (at most partly); otherwise the time ratio decides as in the first row.",
    "setting": setting.replace("--apply consgd, --lr 1", "--apply plain, --lr 0.1, 16 clocks"),
})
# Issue 40: the same claim against the best-tuned ssp: the clock length (44 = the paper's, 22, 11
# steps) chosen by median time to target, each side over the same grid.
grid = {44: ("ssp", "bosen random")} | {int(n.split(" k")[1]): (n, n.replace("ssp", "bosen random")) for n in names if n.startswith("ssp k")}
if len(grid) > 1:
    best_of = lambda side: min(((med(data[grid[k][side]][0]), k) for k in grid), key=lambda tk: (tk[0], tk[1]))
    (ts, ks), (tb, kb) = best_of(0), best_of(1)
    gvalid = allvalid(*(data[n] for k in grid for n in grid[k]))
    gr = tb / ts if ts not in (0, float("inf")) and tb != float("inf") else float("nan")
    per = "; ".join(f"--sync-every {k}: ssp {rng(data[grid[k][0]][0])} s, bosen random {rng(data[grid[k][1]][0])} s" for k in sorted(grid))
    rows.append({
        "paper": "Bösen (Wei et al., SoCC 2015)",
        "claim": "managed communication (MC-800-R) reaches the MF target 2.5x faster than the best-tuned bounded staleness (clock length tuned for both, issue 40)",
        "paper_value": "2.5x faster (time ratio 0.40); threshold as in the first row: <= 0.5 reproduced, < 0.9 partly",
        "measured": inv(*(data[n] for k in grid for n in grid[k])) or f"best bosen random (--sync-every {kb}) / best ssp (--sync-every {ks}) = {gr:.2f} ({tb:.2f} s vs {ts:.2f} s)",
        "verdict": verdict(gr <= 0.5, gr < 0.9, gvalid),
        "why": f"Time to held-out RMSE {target}, median [range] of {reps}, per clock length: {per}. Best by median time, S = 2 for every row.",
        "setting": setting.replace("1 clock = 1 pass (44 steps)", "1 clock = 11, 22 or 44 steps (44 = 1 pass)"),
    })
for r in rows:
    if r["measured"] == "INVALID":
        r["verdict"] = "not judged"
json.dump(rows, open(f"{out}/claim.json", "w"), indent=1, ensure_ascii=False)
with open(f"{out}/table.md", "w") as f:
    f.write("\n".join(lines) + "\n\n")
    f.write(f"Setting: {setting}.\n")
    f.write("Time = training seconds (evaluations excluded) until the servers' model reaches the target; "
            "bytes and waiting are per rank, means over ranks; early sends = bosen's early client pushes + server row pushes (all ranks).\n")
print("\n".join(lines))
for r in rows:
    print(f"- {r['claim']}: {r['verdict']} ({r['measured']})")
PY
