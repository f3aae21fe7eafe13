#!/usr/bin/python3
"""Measures a netlab link from inside the namespaces (this machine has no ping or iperf):

  probe.py ping ADDR [N]           ICMP echo (raw socket, as ping does): N round trips, one line
                                   of JSON: min/median/max RTT in ms
  probe.py sink PORT               accepts one TCP connection and reads it to the end; prints
                                   JSON: bytes, seconds (first byte to last), Mbit/s
  probe.py bulk ADDR PORT MB       sends MB megabytes over TCP to a sink

TCP buffers are left to the kernel's autotuning (net.ipv4.tcp_rmem / tcp_wmem of the namespace).
"""
import json
import os
import socket
import statistics
import struct
import sys
import time


def checksum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def ping(addr, n):
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    sock.settimeout(5.0)
    ident = os.getpid() & 0xFFFF
    rtts = []
    for seq in range(n):
        body = struct.pack("!d", time.monotonic()) + bytes(48)
        hdr = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
        pkt = struct.pack("!BBHHH", 8, 0, checksum(hdr + body), ident, seq) + body
        t0 = time.monotonic()
        sock.sendto(pkt, (addr, 0))
        while True:
            data, _ = sock.recvfrom(2048)
            ihl = (data[0] & 0xF) * 4
            typ, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
            if typ == 0 and rid == ident and rseq == seq:
                break
        rtts.append((time.monotonic() - t0) * 1e3)
        time.sleep(0.05)
    print(json.dumps({"to": addr, "n": n, "rtt_ms_min": min(rtts), "rtt_ms_median": statistics.median(rtts),
                      "rtt_ms_max": max(rtts)}))


def sink(port):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    print("listening", file=sys.stderr, flush=True)
    conn, _ = srv.accept()
    total, first = 0, None
    buf = bytearray(1 << 20)
    while True:
        k = conn.recv_into(buf)
        if not k:
            break
        if first is None:
            first = time.monotonic()
        total += k
    secs = time.monotonic() - first
    print(json.dumps({"bytes": total, "seconds": secs, "mbit_s": total * 8 / secs / 1e6,
                      "rcvbuf": conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)}))


def bulk(addr, port, mb):
    s = socket.create_connection((addr, port), timeout=30)
    chunk = bytes(1 << 20)
    for _ in range(mb):
        s.sendall(chunk)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    s.close()


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "ping":
        ping(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 10)
    elif cmd == "sink":
        sink(int(sys.argv[2]))
    elif cmd == "bulk":
        bulk(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(__doc__)
