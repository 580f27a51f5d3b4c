"""`mrc bench --daemon SOCK`: the benchmark as two applications of their hosts' daemons.

`mrc bench -s --daemon SOCK [-1]` serves tests through the local daemon; `mrc bench -c PEER
--daemon SOCK -n 1G -l 1M --verify` writes to the server application on the daemon's peer
PEER. So the measurement crosses the real service path: control socket, shared-memory regions,
the daemon's MRC connection (docs/DESIGN.md §9, §10). Both print iperf3-like lines or, with
-J, one JSON document with goodput, integrity and the daemon's per-plane byte counts moved
during the test.

Holds the flag checks of this mode (the transport flags of the in-process bench belong to the
daemon's configuration here), the output, and `run`; the roles and their message agreement are
`bench_daemon_roles`. Every expected failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import mrc
from mrc.client import Client, ClientError

from .bench_daemon_roles import (
    ENDPOINT,
    BenchFailed,
    Progress,
    TestResult,
    run_writer,
    serve_one,
)
from .bench_options import DEFAULT_CC
from .bench_report import RULE, STREAM_ID, fmt_bytes, fmt_rate

__all__ = ["DaemonBenchOptions", "options_from", "run"]

DEFAULT_DURATION = 10.0
#: In-process flags that name transport settings; with --daemon they are the daemon's.
_TRANSPORT_FLAGS: tuple[tuple[str, str, Any], ...] = (
    ("-B", "bind", None),
    ("-R", "reverse", False),
    ("--demo", "demo", False),
    ("--paths", "paths", None),
    ("--inject", "inject", []),
    ("-p", "port", 4791),
    ("--payload-mtu", "payload_mtu", 4096),
    ("--ev-per-plane", "ev_per_plane", 16),
    ("--mpr", "mpr", 8),
    ("--flowcell", "flowcell", None),
    ("--spray", "spray", "bitmap"),
    ("--plane-balance", "plane_balance", "equal"),
    ("--cc", "cc", DEFAULT_CC),
)


class UsageError(Exception):
    """A flag that does not fit --daemon; one line, exit status 2."""


@dataclass(slots=True)
class DaemonBenchOptions:
    role: str  # "server" or "client"
    socket: str
    peer: str = ""
    msg_size: int = 1 << 20
    total_bytes: int = 0
    duration: float = 0.0
    interval: float = 1.0
    json: bool = False
    one_off: bool = False
    verify: bool = False
    connect_timeout: float = 5.0


def options_from(ns: argparse.Namespace) -> DaemonBenchOptions:
    for flag, attr, default in _TRANSPORT_FLAGS:
        value = getattr(ns, attr, default)
        if value != default:
            raise UsageError(f"{flag} does not apply with --daemon: the daemon's configuration "
                             "sets its transport")
    if ns.server == bool(ns.client):
        raise UsageError("--daemon needs exactly one of -s and -c PEER")
    if ns.client and len(ns.client) != 1:
        raise UsageError("with --daemon, -c names one peer (a name from the daemon's config)")
    if ns.time is not None and ns.bytes is not None:
        raise UsageError("-t and -n are mutually exclusive")
    if ns.interval and ns.interval < 0.01:
        raise UsageError(f"-i must be 0 or at least 0.01, got {ns.interval:g}")
    if not 1 <= ns.length <= 256 << 20:
        raise UsageError(f"-l must be 1..{256 << 20} bytes, got {ns.length}")
    opts = DaemonBenchOptions(
        role="server" if ns.server else "client",
        socket=ns.daemon,
        peer=ns.client[0] if ns.client else "",
        msg_size=ns.length,
        total_bytes=ns.bytes or 0,
        duration=ns.time or 0.0,
        interval=ns.interval,
        json=ns.json,
        one_off=ns.one_off,
        verify=ns.verify,
        connect_timeout=ns.connect_timeout,
    )
    if opts.role == "server":
        if ns.time is not None or ns.bytes is not None or ns.verify:
            raise UsageError("-t/-n/--verify are client flags (the client asks for them)")
    else:
        if opts.one_off:
            raise UsageError("-1 is a server flag")
        if ns.time is not None and ns.time <= 0:
            raise UsageError("-t must be more than 0 seconds")
        if not opts.total_bytes and not opts.duration:
            opts.duration = DEFAULT_DURATION
    return opts


class _Out:
    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode

    def line(self, text: str) -> None:
        if not self.json_mode:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def interval(self, start: float, end: float, nbytes: int) -> None:
        rate = nbytes * 8 / max(1e-9, end - start)
        self.line(f"[{STREAM_ID:3d}] {start:6.2f}-{end:<6.2f} sec  {fmt_bytes(nbytes):>11}  "
                  f"{fmt_rate(rate):>15}")


def _sum(side: dict[str, Any]) -> dict[str, Any]:
    secs = float(side.get("seconds") or 0.0)
    nbytes = int(side.get("bytes") or 0)
    return {"start": 0.0, "end": secs, "seconds": secs, "bytes": nbytes,
            "bits_per_second": nbytes * 8 / secs if secs > 0 else 0.0}


def _plane_deltas(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """The daemon's per-plane counters moved during the test (all its traffic, not only ours:
    on a shared daemon other applications' bytes count too)."""
    keys = ("bytes_sent", "bytes_received", "packets_sent", "packets_received")
    old = {p.get("plane"): p for p in before.get("planes") or [] if isinstance(p, dict)}
    rows = []
    for p in after.get("planes") or []:
        if not isinstance(p, dict):
            continue
        prev = old.get(p.get("plane"), {})
        row = {"plane": p.get("plane"), "local": p.get("local"), "state": p.get("state")}
        row.update({k: int(p.get(k) or 0) - int(prev.get(k) or 0) for k in keys})
        rows.append(row)
    return rows


def report(out: _Out, result: TestResult, progress: Progress, before: dict[str, Any],
           after: dict[str, Any]) -> None:
    local = result.as_dict()
    sent, received = (local, result.peer) if result.role == "client" else (result.peer, local)
    planes = _plane_deltas(before, after)
    integrity = result.integrity()
    if out.json_mode:
        s_sum, r_sum = _sum(sent), _sum(received)
        s_sum["retransmits"] = 0
        doc = {
            "start": {"version": f"mrc {mrc.__version__}", "role": result.role,
                      "implementation": mrc.implementation(),
                      "daemon": {k: before.get(k) for k in ("host", "version", "security")},
                      "timestamp": {"timesecs": int(time.time())},
                      "test_start": result.test_start},
            "intervals": [{"sum": {"start": round(a, 6), "end": round(b, 6),
                                   "seconds": round(b - a, 6), "bytes": n,
                                   "bits_per_second": n * 8 / max(1e-9, b - a),
                                   "sender": result.role == "client"}}
                          for a, b, n in progress.samples],
            "end": {"sum_sent": s_sum, "sum_received": r_sum, "mrc": {
                "integrity": integrity,
                "messages": int(sent.get("messages") or 0),
                "messages_verified": int(received.get("messages_verified") or 0),
                "writes_per_second": (int(sent.get("messages") or 0)
                                      / s_sum["seconds"] if s_sum["seconds"] else 0.0),
                "write_errors": sent.get("write_errors") or {},
                "planes": planes,
                "remote": result.peer,
            }},
        }
        if result.error:
            doc["error"] = result.error
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    out.line(RULE)
    out.line("[ ID] Interval           Transfer     Bitrate")
    for side, word in ((sent, "sender"), (received, "receiver")):
        if side:
            s = _sum(side)
            out.line(f"[{STREAM_ID:3d}] {0.0:6.2f}-{s['seconds']:<6.2f} sec  "
                     f"{fmt_bytes(s['bytes']):>11}  {fmt_rate(s['bits_per_second']):>15}"
                     f"                   {word}")
    msgs = int(sent.get("messages") or 0)
    secs = float(sent.get("seconds") or 0.0)
    out.line(f"writes: {msgs} of {result.test_start.get('blksize')} bytes"
             + (f", {msgs / secs:.0f} writes/s" if secs else ""))
    if integrity == "not-checked":
        out.line("integrity: not-checked (run with --verify)")
    else:
        out.line(f"integrity: {integrity} ({int(received.get('messages_verified') or 0)} "
                 "messages verified)")
    errors = sent.get("write_errors") or {}
    if errors:
        out.line("write errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(errors.items())))
    word = "bytes_sent" if result.role == "client" else "bytes_received"
    out.line("daemon planes: " + ", ".join(
        f"p{p['plane']} {p['state']} {fmt_bytes(p[word]).strip()} {word.split('_')[1]}"
        for p in planes))
    if result.error:
        out.line(f"error: {result.error}")


def _run_client(client: Client, opts: DaemonBenchOptions, out: _Out) -> int:
    before = client.status()
    out.line(f"Connecting to peer {opts.peer} through the daemon {before.get('host')} "
             f"({opts.socket})")
    progress = Progress(opts.interval, out.interval)
    out.line("[ ID] Interval           Transfer     Bitrate")
    result = run_writer(client, opts.peer, msg_size=opts.msg_size,
                        total_bytes=opts.total_bytes, duration=opts.duration,
                        verify=opts.verify, wait=opts.connect_timeout + 10.0, progress=progress)
    report(out, result, progress, before, client.status())
    if result.write_errors:
        sys.stderr.write("mrc bench: some WRITEs completed with an error status\n")
        return 1
    if result.integrity() == "mismatch":
        sys.stderr.write("mrc bench: integrity check failed: received bytes did not match\n")
        return 1
    return 0


def _run_server(client: Client, opts: DaemonBenchOptions, out: _Out) -> int:
    client.bind(ENDPOINT)
    host = client.status().get("host")
    failures = 0
    while True:
        out.line("-" * 60)
        out.line(f"Server listening on endpoint {ENDPOINT!r} of the daemon {host} "
                 f"({opts.socket})")
        out.line("-" * 60)
        request = client.recv_message(ENDPOINT, timeout=None)
        if request is None:
            continue
        before = client.status()
        progress = Progress(opts.interval, out.interval)
        out.line(f"Accepted a test from peer {request.peer}")
        try:
            result = serve_one(client, request, progress)
        except BenchFailed as exc:
            sys.stderr.write(f"mrc bench: {exc}\n")
            failures += 1
            if opts.one_off:
                return 1
            continue
        report(out, result, progress, before, client.status())
        bad = bool(result.error) or result.integrity() == "mismatch"
        failures += bad
        if opts.one_off:
            return 1 if bad else 0


def run(ns: argparse.Namespace) -> int:
    try:
        opts = options_from(ns)
    except UsageError as exc:
        sys.stderr.write(f"mrc bench: error: {exc}\n")
        return 2
    out = _Out(opts.json)
    try:
        with Client(opts.socket, connect_timeout=opts.connect_timeout) as client:
            if opts.role == "server":
                return _run_server(client, opts, out)
            return _run_client(client, opts, out)
    except (ClientError, BenchFailed) as exc:
        sys.stderr.write(f"mrc bench: {exc}\n")
        return 1
