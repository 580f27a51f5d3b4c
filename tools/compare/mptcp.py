"""A small kernel-MPTCP bulk sender and receiver (`socket.IPPROTO_MPTCP`, 262).

    python -m tools.compare.mptcp server --bind ADDR --port P [--timeout S]
    python -m tools.compare.mptcp client --connect ADDR --port P (--bytes N | --seconds S)

The server accepts one connection and reads into a 1 MiB buffer until the peer closes. For
every `recv_into` that returns data it stores (CLOCK_MONOTONIC, bytes) in arrays; at the end
it prints one JSON line: `bytes`, `first`/`last` (monotonic times of the first and last
byte), `seconds`, `bits_per_second`, `bins_ms` (bytes per 1 ms bin counted from `first`),
and `gaps` (every interval longer than 2 ms between two consecutive reads that returned
data, as `[start relative to first, length]`, exact to the microsecond rather than to the bin).
The client connects (the kernel's path manager adds the other subflows from the namespace's
`ip mptcp endpoint`s), sends a zero-filled 1 MiB buffer with `sendall` until `--bytes` or
`--seconds` is reached, and samples `MPTCP_INFO` (`getsockopt(SOL_MPTCP=284, MPTCP_INFO=1)`,
first byte = `mptcpi_subflows`) every 50 ms; its JSON line has `bytes`, `seconds`,
`max_subflows` (additional subflows, so 3 means 4 in use) and `mptcp_info_ok`.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from array import array
from typing import Any

IPPROTO_MPTCP = getattr(socket, "IPPROTO_MPTCP", 262)
SOL_MPTCP = 284
MPTCP_INFO = 1
CHUNK = 1 << 20


def _sock() -> socket.socket:
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    except OSError as e:
        raise SystemExit(f"mptcp: cannot open an MPTCP socket ({e.strerror}); "
                         "is net.mptcp.enabled=1?") from None


def serve(bind: str, port: int, timeout: float) -> dict[str, Any]:
    lsock = _sock()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((bind, port))
    lsock.listen(1)
    lsock.settimeout(timeout)
    conn, _ = lsock.accept()
    conn.settimeout(timeout)
    buf = bytearray(CHUNK)
    times = array("d")
    sizes = array("q")
    recv_into = conn.recv_into
    now = time.monotonic
    while True:
        n = recv_into(buf)
        if not n:
            break
        times.append(now())
        sizes.append(n)
    conn.close()
    lsock.close()
    return summarize(times, sizes)


def summarize(times: array[float], sizes: array[int]) -> dict[str, Any]:
    total = sum(sizes)
    if not times:
        return {"bytes": 0, "seconds": 0.0, "bits_per_second": 0.0, "bins_ms": [], "gaps": []}
    first, last = times[0], times[-1]
    bins = [0] * (int((last - first) * 1000) + 1)
    gaps: list[list[float]] = []
    prev = first
    for t, n in zip(times, sizes, strict=True):
        bins[int((t - first) * 1000)] += n
        if t - prev > 0.002:
            gaps.append([round(prev - first, 6), round(t - prev, 6)])
        prev = t
    seconds = last - first
    return {"bytes": total, "first": first, "last": last, "seconds": seconds,
            "bits_per_second": total * 8 / seconds if seconds > 0 else 0.0,
            "bins_ms": bins, "gaps": gaps}


def send(addr: str, port: int, nbytes: int | None, seconds: float | None) -> dict[str, Any]:
    sock = _sock()
    sock.settimeout(30)
    sock.connect((addr, port))
    state = {"max": 0, "ok": True, "stop": False}

    def watch() -> None:
        while not state["stop"]:
            try:
                info = sock.getsockopt(SOL_MPTCP, MPTCP_INFO, 64)
                state["max"] = max(int(state["max"]), info[0] if info else 0)
            except OSError:
                state["ok"] = False
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    data = memoryview(bytes(CHUNK))
    sent = 0
    start = time.monotonic()
    end = start + seconds if seconds is not None else None
    while True:
        if nbytes is not None:
            if sent >= nbytes:
                break
            n = min(CHUNK, nbytes - sent)
        else:
            assert end is not None
            if time.monotonic() >= end:
                break
            n = CHUNK
        sock.sendall(data[:n])
        sent += n
    state["stop"] = True
    watcher.join(1.0)
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(30)
    sock.recv(1)  # the server closes after reading everything
    sock.close()
    return {"bytes": sent, "seconds": time.monotonic() - start,
            "max_subflows": state["max"], "mptcp_info_ok": state["ok"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.compare.mptcp")
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--timeout", type=float, default=60.0)
    c = sub.add_parser("client")
    c.add_argument("--connect", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--bytes", type=int)
    c.add_argument("--seconds", type=float)
    a = p.parse_args(argv)
    try:
        if a.role == "server":
            doc = serve(a.bind, a.port, a.timeout)
        else:
            if (a.bytes is None) == (a.seconds is None):
                p.error("client needs exactly one of --bytes and --seconds")
            doc = send(a.connect, a.port, a.bytes, a.seconds)
    except OSError as e:
        print(f"mptcp {a.role}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
