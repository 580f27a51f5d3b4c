"""UDP and TCP ping-pong: the kernel's round trip next to `mrc bench --latency`.

    python -m tools.compare.pingpong serve {udp,tcp} --bind ADDR --port P
    python -m tools.compare.pingpong ping {udp,tcp} --connect ADDR --port P [-l BYTES] [-n N]

The pinger sends N messages of BYTES one at a time and times each from just before the send to
just after the whole answer is read (`time.perf_counter`); the server sends each message back
as it reads it. Blocking sockets and one message in flight, the same shape as mrc's
WRITE_WITH_IMM ping-pong, so the difference is the transport (and mrc's event loop), not the
pattern. TCP runs with `TCP_NODELAY` on both ends (Nagle would hold the small answers).

UDP: one datagram each way; a datagram not answered within 1 s is counted `lost` and the next
one goes out (a late answer to it is recognised by its number and skipped). The pinger ends
the server with an empty datagram; the server also ends after 30 s without one.

The server prints `READY` once it listens; the pinger prints one JSON line: `samples`, `lost`,
`bytes`, and min/mean/p50/p90/p99/p99_9/max/stdev in microseconds (the percentile math is
`mrc.cli.bench.latency`'s, so the three rows of the comparison are computed alike).
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from typing import Any

from mrc.cli.bench.latency import latency_stats

_SEQ = struct.Struct("!I")
IDLE_SECONDS = 30.0
ANSWER_SECONDS = 1.0


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def serve_udp(bind: str, port: int) -> None:
    with socket.socket(_family(bind), socket.SOCK_DGRAM) as s:
        s.bind((bind, port))
        s.settimeout(IDLE_SECONDS)
        print("READY", flush=True)
        while True:
            try:
                data, peer = s.recvfrom(65535)
            except TimeoutError:
                return
            if not data:
                return
            s.sendto(data, peer)


def serve_tcp(bind: str, port: int) -> None:
    with socket.socket(_family(bind), socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((bind, port))
        ls.listen(1)
        ls.settimeout(IDLE_SECONDS)
        print("READY", flush=True)
        try:
            conn, _ = ls.accept()
        except TimeoutError:
            return
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(IDLE_SECONDS)
            while True:
                try:
                    data = conn.recv(1 << 20)
                except TimeoutError:
                    return
                if not data:
                    return
                conn.sendall(data)


def ping_udp(host: str, port: int, size: int, count: int) -> dict[str, Any]:
    payload = bytearray(max(size, _SEQ.size))
    samples: list[float] = []
    lost = 0
    with socket.socket(_family(host), socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        s.settimeout(ANSWER_SECONDS)
        for k in range(count):
            _SEQ.pack_into(payload, 0, k)
            t0 = time.perf_counter()
            s.send(payload)
            while True:
                try:
                    answer = s.recv(65535)
                except TimeoutError:
                    lost += 1
                    break
                if len(answer) >= _SEQ.size and _SEQ.unpack_from(answer)[0] == k:
                    samples.append(time.perf_counter() - t0)
                    break
        s.send(b"")
    return _doc(samples, lost, len(payload))


def ping_tcp(host: str, port: int, size: int, count: int) -> dict[str, Any]:
    payload = bytes(size)
    buf = bytearray(size)
    samples: list[float] = []
    with socket.create_connection((host, port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        view = memoryview(buf)
        for _ in range(count):
            t0 = time.perf_counter()
            s.sendall(payload)
            got = 0
            while got < size:
                n = s.recv_into(view[got:])
                if not n:
                    raise OSError("server closed the connection")
                got += n
            samples.append(time.perf_counter() - t0)
    return _doc(samples, 0, size)


def _doc(samples: list[float], lost: int, size: int) -> dict[str, Any]:
    if not samples:
        raise OSError(f"no answers ({lost} lost)")
    return {"samples": len(samples), "lost": lost, "bytes": size, "unit": "us",
            **latency_stats(samples)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.compare.pingpong")
    p.add_argument("role", choices=("serve", "ping"))
    p.add_argument("proto", choices=("udp", "tcp"))
    p.add_argument("--bind", help="serve: the address to listen on")
    p.add_argument("--connect", help="ping: the server's address")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("-l", "--length", type=int, default=64, help="message bytes (64)")
    p.add_argument("-n", "--count", type=int, default=10_000, help="round trips (10000)")
    a = p.parse_args(argv)
    if a.length < 1 or a.count < 1:
        print("pingpong: -l and -n must be at least 1", file=sys.stderr)
        return 2
    host = a.bind if a.role == "serve" else a.connect
    if not host:
        print(f"pingpong: {a.role} needs --{'bind' if a.role == 'serve' else 'connect'}",
              file=sys.stderr)
        return 2
    try:
        if a.role == "serve":
            (serve_udp if a.proto == "udp" else serve_tcp)(host, a.port)
            return 0
        ping = ping_udp if a.proto == "udp" else ping_tcp
        doc = ping(host, a.port, a.length, a.count)
    except OSError as e:
        print(f"pingpong {a.role} {a.proto}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
