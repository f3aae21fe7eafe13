"""benches/uneven-real.sh's side-by-side table: per row the time to target over real netlab links
and in its emulated twin (benches/emulated-table.py's `row`: median (range) of the training
seconds until the averaged model reached the target, with TARGET_ON=averaged), their ratio, the
rounds and MB a rank sent, and whether each side's declared steps held; then per variant its best
interval on each side and the ratio to the best tuned allreduce of that side (DiLoCo included),
with issue 41's verdict for the real links (best asap at most 0.5x).

Usage: python3 uneven_real.py OUT_DIR REPS ROW...   (OUT_DIR/real and OUT_DIR/emulated)
"""
import importlib.util
import os
import statistics
import sys

spec = importlib.util.spec_from_file_location("emulated_table", os.path.join(os.path.dirname(__file__), "emulated-table.py"))
et = importlib.util.module_from_spec(spec)
spec.loader.exec_module(et)

SIDES = ("real", "emulated")


def med(times):
    return statistics.median(times) if times else float("inf")


def main():
    out, reps, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    data = {s: {n: et.row(os.path.join(out, s), n, reps) for n in names} for s in SIDES if os.path.isdir(os.path.join(out, s))}
    sides = list(data)
    print("| row | " + " | ".join(f"{s}: s to target | {s}: rounds, MB/rank | {s}: steps" for s in sides) + (" | real / emulated |" if len(sides) == 2 else " |"))
    print("|---|" + "---|---|---|" * len(sides) + ("---|" if len(sides) == 2 else ""))
    for n in names:
        if all(not data[s][n][0] and "not run" in data[s][n][4] for s in sides):
            continue
        cells = []
        for s in sides:
            times, rounds, mb, valid, notes = data[s][n]
            r = f"{statistics.median(rounds):.0f}" if rounds else "-"
            m = f"{statistics.median(mb):.1f}" if mb else "-"
            v = "valid" if valid else "INVALID: " + "; ".join(sorted(set(notes)))
            cells += [et.fmt(times), f"{r}, {m}", v]
        if len(sides) == 2:
            a, b = med(data["real"][n][0]), med(data["emulated"][n][0])
            cells.append(f"{a / b:.2f}" if float("inf") not in (a, b) else "-")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()
    for s in sides:
        best = {}
        for n in names:
            base = n.partition(", k ")[0]
            t = med(data[s][n][0])
            if t != float("inf") and data[s][n][3] and (base not in best or t < best[base][1]):
                best[base] = (n, t)
        ars = {b: v for b, v in best.items() if b.startswith("allreduce")}
        if not ars:
            print(f"{s}: no valid allreduce row reached the target")
            continue
        ar = min(ars, key=lambda b: ars[b][1])
        parts = [f"{b} at {v[0].partition(', k ')[2] or '-'}: {v[1]:.2f} s ({v[1] / ars[ar][1]:.2f}x)" for b, v in best.items()]
        print(f"{s}, each variant at its best valid interval, x the best tuned allreduce ({best[ar][0]}): " + "; ".join(parts))
        gossip = {b: v for b, v in best.items() if b.startswith("asap")}
        if gossip:
            g = min(gossip, key=lambda b: gossip[b][1])
            verdict = "met" if gossip[g][1] / ars[ar][1] <= 0.5 else "missed"
            print(f"{s}: best asap run {gossip[g][0]}: {gossip[g][1] / ars[ar][1]:.2f}x the best tuned allreduce (issue 41's target on real uneven links: at most 0.5x: {verdict})")


if __name__ == "__main__":
    main()
