#!/usr/bin/env python3
"""How much of a link's payload rate each direction carries when both carry data at once,
against one direction alone, from netlab's relay trace (netlab/wanlink.py --trace, NETLAB_TRACE):
what `--emulate-fabric tcp`'s two-way share (src/comm/pace.rs, TCP_TWO_WAY_SHARE_*) was
measured with. benches/two-way-share.sh runs a cell and calls this.

Usage: benches/two_way_share.py TRACE RATE_MBIT [BIN_SECONDS]

Every frame the relay wrote out with a TCP payload counts for its destination group's direction.
Time is cut into bins (default 20 ms); a bin counts as two-way when both directions carried over
5 % of the payload rate in it and in both neighbouring bins, as one-way when exactly one did in
it and in both neighbours (so the edges of a transfer, half-filled bins, count in neither).
Prints the mean and median use of the payload rate (1448/1514 of the line) per direction in
each kind of bin.
"""
import collections
import statistics
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    trace, mbit = sys.argv[1], float(sys.argv[2])
    width = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
    bins = collections.defaultdict(lambda: [0, 0])
    t0 = None
    with open(trace) as f:
        for n, line in enumerate(f, 1):
            p = line.split()
            if len(p) < 10 or p[1] != "out":
                continue
            try:
                t, group, payload = float(p[0]), int(p[2]), int(p[9])
            except ValueError:
                sys.exit(f"{trace}:{n}: not a trace line of netlab/wanlink.py --trace: {line.strip()!r}")
            if payload == 0 or group not in (0, 1):
                continue
            t0 = t if t0 is None else t0
            bins[int((t - t0) / width)][group] += payload
    if not bins:
        sys.exit(f"{trace}: no TCP payload between two groups; was NETLAB_TRACE set for a run of 2 groups?")
    cap = mbit * 1e6 / 8 * width * 1448 / 1514
    busy = lambda b: [x > 0.05 * cap for x in bins.get(b, [0, 0])]
    two, one = [], []
    for b in range(min(bins), max(bins) + 1):
        around = [busy(b - 1), busy(b), busy(b + 1)]
        use = [x / cap for x in bins.get(b, [0, 0])]
        if all(all(a) for a in around):
            two += use
        elif all(sum(a) == 1 for a in around):
            one.append(max(use))
    for name, v in (("both directions at once, each", two), ("one direction alone", one)):
        if v:
            print(f"{name}: mean {statistics.mean(v):.3f}, median {statistics.median(v):.3f} of the payload rate ({len(v)} bin-directions)")
        else:
            print(f"{name}: no such bins")


if __name__ == "__main__":
    main()
