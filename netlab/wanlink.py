#!/usr/bin/python3
"""A wide-area link between groups of hosts, in user space: the delay and rate that `tc netem`
would give, for kernels without sch_netem (this one: "Specified qdisc kind is unknown").

Each group's hosts share a bridge; the bridge has a tap device whose other end is this process.
A frame read from group g's tap is an Ethernet frame leaving data centre g. It is queued on the
link g -> h (h: the group owning the destination MAC, learnt from source addresses; broadcasts
and unknown destinations go to every other group), serialised at RATE (the link is busy for
len * 8 / RATE after the previous frame on it), then held DELAY, then written into h's tap.
A frame that finds more than QUEUE of serialisation backlog on its link is dropped (drop-tail,
as a router's buffer). Frames on one link keep their order: the release times of one link only
grow, so each link is a FIFO (no heap needed with a constant delay).

  wanlink.py --tap T0 --tap T1 [...] --rate-mbit R --delay-ms D [--queue-ms Q] [--stats FILE]
  wanlink.py --tap T0 --uplink R0:D0 --tap T1 --uplink R1:D1 [...] [--queue-ms Q] [--stats FILE]

With --uplink (one per tap, in tap order) the taps are hosts on one switch, each behind a link
of its own (netlab/wan.sh hosts): a frame from host s to host d is serialised on s's uplink at
Rs (shared by everything s sends; a broadcast crosses it once), crosses it in Ds, is
serialised again on d's downlink at Rd (shared by everything sent to d, in the order frames
reach the switch), and crosses that in Dd: one way Ds + Dd, at the slower end's rate, the
senders to one host sharing its port. It is the model of the program's own emulated links
(src/comm/pace.rs: a sender's pacer, a receiver's ingress), on real sockets. Each stage drops a
frame that finds more than its queue (Q, default 2 x its delay + 20 ms) of backlog.

Per host it also keeps the most bytes its link carried in any 1 s window (by the time each frame
actually left the uplink for the switch, and was actually written into the host's tap), beside
how late the relay ran: a link at R carries at most R x (1 s + the latest frame's lateness) plus
one frame in any second (tests/netlab.rs checks it).

--trace FILE (netlab/wan.sh: NETLAB_TRACE) records every frame twice, when the relay read it and
when it wrote it out, with its TCP header (ports, seq, ack, flags, payload bytes), written to
FILE (one line each, times in seconds of the monotonic clock) at exit and on SIGUSR1 (appended): the wire-level view
where tcpdump is missing (docs/emulation.md, the ring's round trip).

R = 0: no rate limit. The taps must exist (ip tuntap add mode tap) and be in their bridges.
On SIGTERM/SIGINT it writes per-link counters to FILE (JSON) and exits 0; on SIGUSR1 it writes
them and continues.
"""
import argparse
import collections
import fcntl
import json
import os
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


def open_tap(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


class Window:
    """The most bytes seen in any WIDTH-second window of (time, bytes) events, times ascending."""

    WIDTH = 1.0

    def __init__(self):
        self.events = collections.deque()
        self.sum = 0
        self.max = 0

    def add(self, t, size):
        self.events.append((t, size))
        self.sum += size
        while self.events[0][0] <= t - self.WIDTH:
            self.sum -= self.events.popleft()[1]
        self.max = max(self.max, self.sum)


class Switch:
    """Hosts behind links of their own (--uplink): per host an uplink FIFO (frames leaving it,
    ordered by when they reach the switch) and a downlink FIFO (frames for it, ordered by when
    they leave the switch's port), each with the time its serialiser is busy until."""

    def __init__(self, uplinks, queue_ms):
        self.rate = [r * 1e6 / 8 if r > 0 else 0.0 for r, _ in uplinks]
        self.delay = [d / 1e3 for _, d in uplinks]
        self.queue = [(queue_ms if queue_ms is not None else 2 * d + 20) / 1e3 for _, d in uplinks]
        n = len(uplinks)
        self.up = [collections.deque() for _ in range(n)]  # (at switch, frame, targets)
        self.down = [collections.deque() for _ in range(n)]  # (delivered, frame)
        self.up_busy = [0.0] * n
        self.down_busy = [0.0] * n
        self.count = {k: [0] * n for k in ("out_frames", "out_bytes", "out_dropped", "in_frames", "in_bytes", "in_dropped")}
        self.out_window = [Window() for _ in range(n)]
        self.in_window = [Window() for _ in range(n)]
        self.late_max = 0.0  # how late frames left the uplinks against their time

    def serialise(self, busy, h, at, size, side):
        """Host h's link (`busy`: its up or down side) takes `size` bytes arriving at `at`: when
        they are through, or None when its queue is full (counted as dropped on `side`)."""
        start = max(at, busy[h])
        if start - at > self.queue[h]:
            self.count[side + "_dropped"][h] += 1
            return None
        done = start + (size / self.rate[h] if self.rate[h] else 0.0)
        busy[h] = done
        self.count[side + "_frames"][h] += 1
        self.count[side + "_bytes"][h] += size
        return done

    def send(self, t, s, fr, targets):
        """Host s hands frame `fr` for `targets` to its uplink at time t."""
        done = self.serialise(self.up_busy, s, t, len(fr), "out")
        if done is not None:
            self.up[s].append((done + self.delay[s], fr, targets))

    def switch(self, t):
        """Moves the frames that reached the switch by t to their downlinks, in arrival order."""
        due = []
        for s, q in enumerate(self.up):
            while q and q[0][0] <= t:
                due.append(q.popleft())
                self.late_max = max(self.late_max, t - due[-1][0])
                self.out_window[s].add(t, len(due[-1][1]))
        due.sort(key=lambda x: x[0])
        for at, fr, targets in due:
            for d in targets:
                done = self.serialise(self.down_busy, d, at, len(fr), "in")
                if done is not None:
                    self.down[d].append((done + self.delay[d], fr))

    def next_event(self):
        heads = [q[0][0] for q in self.up if q] + [q[0][0] for q in self.down if q]
        return min(heads, default=None)

    def deliver(self, t):
        """(host, frame, release time) of every frame due at its host by t."""
        for d, q in enumerate(self.down):
            while q and q[0][0] <= t:
                rel, fr = q.popleft()
                self.in_window[d].add(t, len(fr))
                yield d, fr, rel

    def stats(self):
        return [{"host": h, "rate_mbit": self.rate[h] * 8 / 1e6, "delay_ms": self.delay[h] * 1e3,
                 **{k: v[h] for k, v in self.count.items()},
                 "out_max_1s_bytes": self.out_window[h].max, "in_max_1s_bytes": self.in_window[h].max}
                for h in range(len(self.rate))]


def tcp_summary(fr):
    """"sport dport seq ack flags payload" of a TCP/IPv4 frame, "-" for anything else."""
    if len(fr) < 34 or fr[12:14] != b"\x08\x00" or fr[23] != 6:
        return "-"
    ihl = (fr[14] & 15) * 4
    total = struct.unpack_from("!H", fr, 16)[0]
    o = 14 + ihl
    if len(fr) < o + 14:
        return "-"
    sport, dport, seq, ack, off, flags = struct.unpack_from("!HHIIBB", fr, o)
    return f"{sport} {dport} {seq} {ack} {flags:#04x} {total - ihl - (off >> 4) * 4}"


def uplink(text):
    """RATE_MBIT:DELAY_MS of one host's link."""
    try:
        r, d = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--uplink takes RATE_MBIT:DELAY_MS, got {text!r}")
    if r < 0 or d < 0:
        raise argparse.ArgumentTypeError(f"--uplink {text}: rate and delay must be >= 0")
    return r, d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tap", action="append", required=True, help="one per group, in group order")
    ap.add_argument("--rate-mbit", type=float, default=0.0)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--queue-ms", type=float, default=None,
                    help="drop a frame when its link has more than this much serialisation backlog "
                         "(default: 2 x delay + 20 ms, one bandwidth-delay product plus headroom)")
    ap.add_argument("--uplink", action="append", type=uplink, default=None,
                    help="RATE_MBIT:DELAY_MS of each tap's own link, one per --tap (hosts on one switch)")
    ap.add_argument("--stats", default=None)
    ap.add_argument("--trace", default=None, help="write every frame's read and write times and TCP header here (at exit and on SIGUSR1)")
    ap.add_argument("--ready", default=None, help="create this file once the taps are open")
    a = ap.parse_args()
    g = len(a.tap)
    if a.uplink is not None and len(a.uplink) != g:
        sys.exit(f"wanlink: {len(a.uplink)} --uplink for {g} --tap: give one per tap")
    sw = Switch(a.uplink, a.queue_ms) if a.uplink is not None else None
    try:
        fds = [open_tap(t) for t in a.tap]
    except OSError as e:
        sys.exit(f"wanlink: cannot open the tap devices {a.tap} through /dev/net/tun: {e}")
    byte_s = a.rate_mbit * 1e6 / 8 if a.rate_mbit > 0 else 0.0
    delay = a.delay_ms / 1e3
    queue = (a.queue_ms if a.queue_ms is not None else 2 * a.delay_ms + 20) / 1e3
    # link (src, dst): FIFO of (release, frame); the time its serialiser is busy until
    links = {(s, d): collections.deque() for s in range(g) for d in range(g) if s != d}
    busy = {k: 0.0 for k in links}
    frames = {k: 0 for k in links}
    nbytes = {k: 0 for k in links}
    drops = {k: 0 for k in links}
    # How late frames left against their release time (how far the loop fell behind).
    late_max = [0.0]
    late = {"over_1ms": 0, "over_10ms": 0}
    where = {}  # MAC -> group
    stop = [False]

    trace = [] if a.trace else None

    def dump_trace():
        """Appends the frames traced so far to the trace file and forgets them."""
        with open(a.trace, "a") as f:
            for t, what, g, fr in trace:
                f.write(f"{t:.6f} {what} {g} {len(fr)} {tcp_summary(fr)}\n")
        trace.clear()

    def on_usr1(*_):
        dump()
        if trace is not None:
            dump_trace()

    def dump():
        if not a.stats:
            return
        out = {"late_max_ms": late_max[0] * 1e3, "late_over_1ms": late["over_1ms"], "late_over_10ms": late["over_10ms"]}
        if sw is not None:
            out["hosts"] = sw.stats()
            out["uplink_late_max_ms"] = sw.late_max * 1e3
        else:
            out.update({"rate_mbit": a.rate_mbit, "delay_ms": a.delay_ms, "queue_ms": queue * 1e3,
                        "links": [{"from": s, "to": d, "frames": frames[(s, d)], "bytes": nbytes[(s, d)],
                                   "dropped": drops[(s, d)]} for (s, d) in sorted(links)]})
        tmp = a.stats + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, a.stats)

    def release(d, fr, rel, t):
        """Writes frame `fr`, due at `rel`, into tap d at t, counting how late it left; False when
        the tap's queue is full (the frame is dropped)."""
        lateness = t - rel
        if trace is not None:
            trace.append((t, "out", d, fr))
        late_max[0] = max(late_max[0], lateness)
        late["over_1ms"] += lateness > 1e-3
        late["over_10ms"] += lateness > 1e-2
        try:
            os.write(fds[d], fr)
        except BlockingIOError:
            return False
        except OSError as e:
            print(f"wanlink: writing {a.tap[d]}: {e}; exiting", file=sys.stderr)
            stop[0] = True
        return True

    def on_term(*_):
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    fd_group = {fd: i for i, fd in enumerate(fds)}
    now = time.monotonic
    if a.ready:
        open(a.ready, "w").close()
    while not stop[0]:
        t = now()
        nxt = sw.next_event() if sw is not None else min((q[0][0] for q in links.values() if q), default=None)
        timeout = None if nxt is None else max(0.0, nxt - t)
        # select(), not poll(): poll takes whole milliseconds and Python rounds its timeout up, so
        # a frame due in 1.07 ms left 2 ms later, and a burst's last frames waited for the next
        # whole millisecond (at 1 ms one way: 0.38 ms late on average, 0.87 at p90, 1.0 for
        # the tail of each of the ring allreduce's 11-frame steps, one more crossing's worth
        # a step; docs/emulation.md). select's timeout is in microseconds.
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            continue
        t = now()
        for fd in ready:
            s = fd_group[fd]
            for _ in range(256):
                try:
                    fr = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError as e:  # the tap went away (its namespace was deleted)
                    print(f"wanlink: reading {a.tap[s]}: {e}; exiting", file=sys.stderr)
                    stop[0] = True
                    break
                if len(fr) < 14:
                    continue
                if trace is not None:
                    trace.append((t, "in", s, fr))
                src = fr[6:12]
                where[src] = s
                dst = fr[0:6]
                d = where.get(dst)
                targets = [d] if d is not None and not dst[0] & 1 else [x for x in range(g) if x != s]
                if sw is not None:
                    targets = [x for x in targets if x != s]
                    if targets:
                        sw.send(t, s, fr, targets)
                    continue
                for d in targets:
                    if d == s:
                        continue
                    k = (s, d)
                    start = max(t, busy[k])
                    if start - t > queue:
                        drops[k] += 1
                        continue
                    done = start + len(fr) / byte_s if byte_s else start
                    busy[k] = done
                    links[k].append((done + delay, fr))
                    frames[k] += 1
                    nbytes[k] += len(fr)
        t = now()
        if sw is not None:
            sw.switch(t)
            for d, fr, rel in sw.deliver(t):
                if not release(d, fr, rel, t):
                    sw.count["in_dropped"][d] += 1
            continue
        for (s, d), q in links.items():
            while q and q[0][0] <= t:
                rel, fr = q.popleft()
                if not release(d, fr, rel, t):
                    drops[(s, d)] += 1
    dump()
    if trace is not None:
        dump_trace()


if __name__ == "__main__":
    main()
