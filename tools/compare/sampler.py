"""A 1 ms sampler of a namespace's per-interface receive counters (run inside the namespace).

    python -m tools.compare.sampler --ifaces p0,p1,p2,p3 [--max-seconds S] [--start-bytes N]

It opens `/sys/class/net/IF/statistics/rx_bytes` once per interface and re-reads each with
`os.pread(fd, 32, 0)` on every tick of a 1 ms grid (sleeping to the next tick on
CLOCK_MONOTONIC; a late tick is recorded when it happens, with its real time). When the
total has grown by `--start-bytes` (default 1 MiB) since it started, it prints
`FLOWING <monotonic time of that sample>` on stdout, so the caller can time a fault from
the start of the transfer. It stops on SIGTERM/SIGINT or after `--max-seconds`, then prints
one JSON line: `t` (monotonic seconds of each sample), `ifaces`, and `rx` (for each
interface, its cumulative rx_bytes at each sample, minus the value at the first sample).
These are wire bytes: IP/UDP/TCP headers and retransmitted duplicates count.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from array import array
from types import FrameType


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.compare.sampler")
    p.add_argument("--ifaces", required=True)
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--start-bytes", type=int, default=1 << 20)
    a = p.parse_args(argv)
    names = a.ifaces.split(",")
    try:
        fds = [os.open(f"/sys/class/net/{n}/statistics/rx_bytes", os.O_RDONLY) for n in names]
    except OSError as e:
        print(f"sampler: {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    stop = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    pread = os.pread
    now = time.monotonic
    base = [int(pread(fd, 32, 0)) for fd in fds]
    series = [array("q") for _ in fds]
    stamps = array("d")
    flowing = False
    start = now()
    tick = start
    end = start + a.max_seconds
    while not stop:
        t = now()
        total = 0
        for fd, b0, col in zip(fds, base, series, strict=True):
            v = int(pread(fd, 32, 0)) - b0
            col.append(v)
            total += v
        stamps.append(t)
        if not flowing and total >= a.start_bytes:
            flowing = True
            print(f"FLOWING {t:.6f}", flush=True)
        if t >= end:
            break
        tick += 0.001
        delay = tick - now()
        if delay > 0:
            time.sleep(delay)
        else:
            tick = now()
    print(json.dumps({"t": [round(x, 6) for x in stamps], "ifaces": names,
                      "rx": [list(col) for col in series]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
