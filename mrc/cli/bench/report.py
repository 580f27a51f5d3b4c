"""Output of `mrc bench`: iperf3-style text lines and the `-J` JSON document (docs/DESIGN.md §10).

Holds `Output` (text lines as they come, or one JSON document per test), the banner lines
(`implementation`, `security_line`), the interval and summary lines, the `start` facts
(`StartInfo`, `test_start_info`, `connected_rows`) and `json_document`. It reads a `BenchTest`
and never talks to the network; the units are iperf3's (`mrc.units`), the event lines
`events`'.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

import mrc
from mrc.core.events import ConnectionEstablished
from mrc.core.session import Session
from mrc.io.endpoint import IoEndpoint
from mrc.node.keys import encode_key

from ...units import fmt_bytes, fmt_rate
from .events import event_lines
from .options import BenchOptions
from .setup import WRITER, IntervalSample
from .state import RunState
from .stream import BenchTest

STREAM_ID = 5  # iperf3's first stream id; kept so the lines look familiar
RULE = "- " * 30


@dataclass(slots=True)
class StartInfo:
    """What `start` in the JSON holds; filled by the runner."""

    role: str  # "client" or "server"
    test_start: dict[str, Any]
    connected: list[dict[str, Any]] = field(default_factory=list)
    connecting_to: dict[str, Any] | None = None
    event_loop: str = ""
    timestamp: float = field(default_factory=time.time)


class Output:
    """Text lines as they come, or one JSON document per test (-J)."""

    def __init__(self, *, json_mode: bool, quiet: bool = False, stream: TextIO | None = None):
        self.json_mode = json_mode
        self.quiet = quiet
        self.stream = stream or sys.stdout

    def line(self, text: str) -> None:
        if not self.json_mode and not self.quiet:
            self.stream.write(text + "\n")
            self.stream.flush()

    def doc(self, doc: dict[str, Any]) -> None:
        if self.json_mode and not self.quiet:
            self.stream.write(json.dumps(doc, indent=2) + "\n")
            self.stream.flush()


def host_port(addr: Any) -> tuple[str, int]:
    return (str(addr[0]), int(addr[1])) if isinstance(addr, tuple) else (str(addr), 0)


def interval_printer(out: Output) -> Callable[[BenchTest, IntervalSample], None]:
    printed: set[int] = set()

    def show(test: BenchTest, sample: IntervalSample) -> None:
        if id(test) not in printed:
            printed.add(id(test))
            out.line(interval_header([p for p, _, _ in sample.planes], test.role))
        out.line(interval_line(sample, test.role))

    return show


class Connected(Protocol):
    """What `connected_rows` reads: a test of any kind on its session."""

    io: IoEndpoint[Session]
    session: Session


def connected_rows(test: Connected) -> list[dict[str, Any]]:
    rows = []
    for p, sock in sorted(test.io.planes.items()):
        lh, lp = host_port(sock.local_addr)
        rh, rp = host_port(test.session.peer_addrs.get(p, ("", 0)))
        rows.append(
            {"plane": p, "local_host": lh, "local_port": lp, "remote_host": rh, "remote_port": rp}
        )
    return rows


def test_start_info(
    opts: BenchOptions, state: RunState, test: BenchTest, est: ConnectionEstablished
) -> dict[str, Any]:
    p = test.params
    return {
        "protocol": "MRC",
        "num_streams": 1,
        "num_planes": bin(est.plane_mask).count("1"),
        "blksize": p.msg_size,
        "omit": 0,
        "duration": p.duration,
        "bytes": p.total_bytes,
        "blocks": 0,
        "reverse": int(test.role == WRITER) if opts.role == "server" else int(opts.reverse),
        "verify": p.verify,
        "interval": opts.interval,
        "payload_mtu": est.payload_mtu,
        "ev_per_plane": est.ev_per_plane,
        "mpr": est.mpr,
        "spray": opts.spray,
        "plane_balance": opts.plane_balance,
        "cc": opts.cc,
        "flowcell": opts.flowcell,
        "ev_encoding": test.session.config.ev_encoding,  # as agreed in CM
        "plane_mask": est.plane_mask,
        "inject": (
            [f"plane-down={pl}@{at:g}" for pl, at in p.injects]
            if opts.role == "server"
            else opts.inject_specs()
        ),
        "one_off": int(opts.one_off),
        "port": opts.port,
        "tos": 2,
        **security_info(opts, state, test.session.peer_static_key),
    }


def security_info(opts: BenchOptions, state: RunState, peer_key: bytes | None) -> dict[str, Any]:
    """`start.test_start` keys of --security: the level, our public key, the peer's
    authenticated static key, and whether that key was checked against --peer-key."""
    identity = state.identity
    return {
        "security": opts.security,
        "key": encode_key(identity.public_key) if identity is not None else None,
        "peer_key": encode_key(peer_key) if peer_key is not None else None,
        "peer_key_checked": identity is not None and identity.allowed_peers is not None,
    }


def implementation() -> str:
    """What the banner line says of the build that runs (`mrc.implementation`): "mrc 0.1.0,
    compiled", or pure Python with why and how to get the compiled core."""
    impl = mrc.implementation()
    if impl == "compiled":
        return f"mrc {mrc.__version__}, compiled"
    return f"mrc {mrc.__version__}, {impl}; `make install` compiles the core, several times faster"


def security_line(opts: BenchOptions, state: RunState) -> str:
    """The banner's security line: the key a secured run uses, or an unsecured run's warning.

    Without security nothing is authenticated (docs/DESIGN.md §8, the threat model), so the
    banner says so at the server and the client alike."""
    identity = state.identity
    if identity is None:
        return (
            "Security: none: anyone who can send to this run's planes can write into its "
            "memory and forge its acknowledgements (--security auth|encrypt with --key and "
            "--peer-key prevents it)"
        )
    origin = f"key {opts.key}" if opts.key else "a key made for this run"
    public = encode_key(identity.public_key)
    line = f"Security: {opts.security} (AES-256-GCM), {origin}, public key {public}"
    if identity.allowed_peers is None:
        return line + "; no --peer-key: protects against tampering, not impersonation"
    return line + "; the peer's key must be the one --peer-key names"


def _compact(n: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{int(n)}B"


def interval_header(planes: Sequence[int], role: str) -> str:
    cols = "  ".join(f"{'p' + str(p):>7}" for p in planes)
    retr = " Retr" if role == WRITER else "     "
    return f"[ ID] Interval           Transfer     Bitrate        {retr}  {cols}".rstrip()


def interval_line(sample: IntervalSample, role: str) -> str:
    secs = max(1e-9, sample.end - sample.start)
    rate = sample.bytes * 8 / secs
    retr = f"{sample.retransmits:5d}" if role == WRITER else "     "
    cols = "  ".join(f"{_compact(b):>7}" for _, b, _ in sample.planes)
    when = f"{sample.start:6.2f}-{sample.end:<6.2f} sec"
    amount = f"{fmt_bytes(sample.bytes):>11}  {fmt_rate(rate):>15}"
    return f"[{STREAM_ID:3d}] {when}  {amount} {retr}  {cols}".rstrip()


def _sum(side: dict[str, Any] | None, sender: bool) -> dict[str, Any]:
    side = side or {}
    secs = float(side.get("seconds") or 0.0)
    nbytes = int(side.get("bytes") or 0)
    out: dict[str, Any] = {
        "start": 0.0,
        "end": secs,
        "seconds": secs,
        "bytes": nbytes,
        "bits_per_second": nbytes * 8 / secs if secs > 0 else 0.0,
    }
    if sender:
        out["retransmits"] = int(side.get("retransmits") or 0)
    return out


def sides(test: BenchTest) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(sender summary, receiver summary); the remote one is None when it never arrived."""
    local = test.build_summary()
    if test.role == WRITER:
        return local, test.peer_summary
    return test.peer_summary, local


def summary_lines(test: BenchTest) -> list[str]:
    sent, received = sides(test)
    s_sum = _sum(sent, True)
    r_sum = _sum(received, False)
    lines = [RULE, "[ ID] Interval           Transfer     Bitrate         Retr"]
    if sent is not None:
        lines.append(
            f"[{STREAM_ID:3d}] {0.0:6.2f}-{s_sum['seconds']:<6.2f} sec  "
            f"{fmt_bytes(s_sum['bytes']):>11}  {fmt_rate(s_sum['bits_per_second']):>15} "
            f"{s_sum['retransmits']:5d}             sender"
        )
    if received is not None:
        lines.append(
            f"[{STREAM_ID:3d}] {0.0:6.2f}-{r_sum['seconds']:<6.2f} sec  "
            f"{fmt_bytes(r_sum['bytes']):>11}  {fmt_rate(r_sum['bits_per_second']):>15}"
            "                   receiver"
        )
    integrity = test.integrity()
    verified = (received or {}).get("messages_verified", 0)
    if integrity == "not-checked":
        lines.append("integrity: not-checked (run with --verify)")
    else:
        lines.append(f"integrity: {integrity} ({verified} messages verified)")
    errors = (sent or {}).get("write_errors") or {}
    if errors:
        listed = ", ".join(f"{k} x{v}" for k, v in sorted(errors.items()))
        lines.append(f"write errors: {listed}")
    local = test.build_summary()
    planes = []
    for row in local["planes"]:
        traffic = row["bytes_sent"] if test.role == WRITER else row["bytes_received"]
        word = "sent" if test.role == WRITER else "received"
        planes.append(f"p{row['plane']} {row['state']} {fmt_bytes(traffic).strip()} {word}")
    lines.append("planes: " + ", ".join(planes))
    causes = {k: v for k, v in local["retransmits_by_cause"].items() if v}
    if causes:
        lines.append(
            "retransmits by cause: " + ", ".join(f"{k} {v}" for k, v in sorted(causes.items()))
        )
    drops = local["drops_by_reason"]
    if drops:
        lines.append("drops: " + ", ".join(f"{k} {v}" for k, v in sorted(drops.items())))
    lines += event_lines(_merged_events(test))
    if test.error:
        lines.append(f"error: {test.error}")
    return lines


def _merged_events(test: BenchTest) -> list[dict[str, Any]]:
    events = [dict(e, side="local") for e in test.events]
    peer = test.peer_summary or {}
    remote = peer.get("events")
    if isinstance(remote, list):
        events += [dict(e, side="remote") for e in remote if isinstance(e, dict)]
    events.sort(key=lambda e: float(e.get("t") or 0.0))
    return events


def json_document(test: BenchTest, start: StartInfo) -> dict[str, Any]:
    sent, received = sides(test)
    local = test.build_summary()
    peer = test.peer_summary or {}
    stamp = start.timestamp
    doc_start: dict[str, Any] = {
        "version": f"mrc {mrc.__version__}",
        # "compiled" or "pure…": which build of mrc.wire/mrc.core ran (benchmark rows say so).
        "implementation": mrc.implementation(),
        "system_info": " ".join(platform.uname()),
        "timestamp": {
            "time": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(stamp)),
            "timesecs": int(stamp),
        },
        "connected": start.connected,
        "event_loop": start.event_loop,
        "role": start.role,
        "qpn": test.session.qpn,
        "peer_qpn": test.session.peer_qpn,
        "connection_id": test.session.connection_id,
        "test_start": start.test_start,
    }
    if start.connecting_to is not None:
        doc_start["connecting_to"] = start.connecting_to
    intervals = []
    for s in test.samples:
        secs = max(1e-9, s.end - s.start)
        summ: dict[str, Any] = {
            "start": round(s.start, 6),
            "end": round(s.end, 6),
            "seconds": round(secs, 6),
            "bytes": s.bytes,
            "bits_per_second": s.bytes * 8 / secs,
            "sender": test.role == WRITER,
        }
        if test.role == WRITER:
            summ["retransmits"] = s.retransmits
        if s.snd_cwnd is not None:
            summ["snd_cwnd"] = s.snd_cwnd
        rows = []
        for p, b, n in s.planes:
            row: dict[str, Any] = {"plane": p, "bytes": b, "packets": n}
            if p in s.in_flight:
                row["in_flight"], row["cap"] = s.in_flight[p]
            rows.append(row)
        intervals.append({"sum": summ, "planes": rows})
    cpu = dict(local["cpu_utilization_percent"])
    remote_cpu = peer.get("cpu_utilization_percent")
    if isinstance(remote_cpu, dict):
        for k in ("total", "user", "system"):
            cpu[f"remote_{k}"] = remote_cpu.get(f"host_{k}", 0.0)
    recv = received or {}
    mrc_end: dict[str, Any] = {
        "integrity": test.integrity(),
        "messages_verified": int(recv.get("messages_verified") or 0),
        "messages": int((sent or {}).get("messages") or 0),
        "write_errors": (sent or {}).get("write_errors") or {},
        "planes": local["planes"],
        "evs": _ev_rows(test),
        # EV state changes over time (docs/DESIGN.md §10, "Traces"); bounded, so always there.
        "ev_timeline": test.ev_timeline(),
        "ev_timeline_truncated": test.trace.timeline_truncated,
        "retransmits_by_cause": local["retransmits_by_cause"],
        "drops_by_reason": local["drops_by_reason"],
        "io_drops": dict(test.io.counters),
        "internal_errors": test.io.internal_errors,
        "socket_counters": {
            str(p): dict(s.counters) for p, s in sorted(test.io.planes.items()) if s.counters
        },
        "trimmed_received": local["trimmed_received"],
        # Data packets a full local qdisc or socket buffer refused, resent elsewhere.
        "local_drops": int(local.get("local_drops") or 0),
        "nacks_sent": local["nacks_sent"],
        "nacks_received": local["nacks_received"],
        "probes_sent": local["probes_sent"],
        "probes_answered": local["probes_answered"],
        "longest_stall_seconds": float(recv.get("longest_stall_seconds") or 0.0),
        # Seconds after the receiver's first placement that the longest stall began (null: none).
        "longest_stall_at_seconds": recv.get("longest_stall_at_seconds"),
        # This side's congestion window at the end (bytes of payload, docs/DESIGN.md §7).
        "cwnd_bytes": round(test.session.cc.window),
        "events": local["events"],
        "remote": peer,
    }
    doc: dict[str, Any] = {
        "start": doc_start,
        "intervals": intervals,
        "end": {
            "sum_sent": _sum(sent, True),
            "sum_received": _sum(received, False),
            "cpu_utilization_percent": cpu,
            "mrc": mrc_end,
        },
    }
    if test.error:
        doc["error"] = test.error
    return doc


def _ev_rows(test: BenchTest) -> list[dict[str, Any]]:
    """Per-EV rows (`end.mrc.evs[]`): the EVs this side sent on or retired."""
    return [dict(r) for r in test.session.ev_stats(test.io.now())]


__all__ = [
    "Output",
    "StartInfo",
    "connected_rows",
    "host_port",
    "implementation",
    "interval_header",
    "interval_line",
    "interval_printer",
    "json_document",
    "summary_lines",
    "test_start_info",
]
