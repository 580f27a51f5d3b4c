"""`mrc switch`: the command line of the userspace trimming switch (docs/DESIGN.md §5, §10).

Holds the argparse definition, the parsers for `ADDR:PORT` and bit rates, the checks that turn
flags into a `SwitchConfig`, and `run`: bind, say "listening" on stderr, relay until SIGINT,
SIGTERM or `-t`, then print the counters (one JSON document with `-J`). Bad flags and addresses
end here with one line on stderr and a non-zero exit (2 for usage, 1 for a socket that cannot be
bound or a --realtime that is not allowed). The relay itself is `mrc.io.switch`; byte counts use
`mrc.units` as the bench does (`K` = 1024), rates are bit/s with SI suffixes (`M` = 10**6), as
iperf3's `-b`.

Synopsis: mrc switch --listen ADDR:PORT --forward ADDR:PORT --rate RATE [--reverse-rate RATE]
[--queue BYTES] [--ecn-threshold BYTES] [--priority-queue BYTES] [--trim-size N] [--no-trim]
[--last-hop | --no-last-hop] [--realtime] [-t SEC] [-J]
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import signal
import socket
import sys
from typing import Any

from mrc.cli import COMMANDS
from mrc.io.switch import Relay, SwitchConfig, format_addr
from mrc.io.switch_queue import DEFAULT_TRIM_SIZE, MIN_TRIM_SIZE

from ..units import UsageError, parse_seconds, parse_size

__all__ = ["add_parser", "parse_hostport", "parse_rate", "run"]

DEFAULT_QUEUE = 256 << 10
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: SCHED_FIFO priority for --realtime: above ordinary tasks, below the kernel's own threads.
REALTIME_PRIORITY = 10
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)\s*(?:bit/s|bps|bit|b/s)?\s*$", re.I)
_RATE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_HOSTPORT = re.compile(r"^\s*(?:\[([^\]]+)\]|([^:\[\]\s]+)):(\d+)\s*$")


def parse_rate(text: str) -> float:
    """'500M' → 5e8 bit/s; also '1.5G', '300Mbit', '40000000'."""
    m = _RATE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a rate in bit/s: {text!r} (try 500M, 1G, 300Mbit)")
    value = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value < 1000:
        raise argparse.ArgumentTypeError(f"rate must be at least 1k bit/s: {text!r}")
    return value


def parse_hostport(text: str) -> tuple[str, int]:
    """'127.0.0.1:4791' or '[::1]:4791' → (host, port); the host is checked when binding."""
    m = _HOSTPORT.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"not ADDR:PORT: {text!r} (IPv4 as 127.0.0.1:4791, IPv6 as [::1]:4791)"
        )
    host = m.group(1) or m.group(2)
    port = int(m.group(3))
    if port > 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535 in {text!r}")
    return host, port


def _size_or_zero(text: str) -> int:
    return 0 if text.strip() == "0" else parse_size(text)


def _trim_size(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"trim size must be an integer, got {text!r}") from None
    if not MIN_TRIM_SIZE <= value <= 65507:
        raise argparse.ArgumentTypeError(
            f"trim size must be {MIN_TRIM_SIZE}..65507 (every data header must survive), "
            f"got {value}"
        )
    return value


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "switch",
        help=COMMANDS["switch"],
        description="Relay one plane's UDP traffic between a client and a server through a "
        "finite queue drained at --rate: ECN-mark above --ecn-threshold, trim MRC data "
        "packets that do not fit (docs/WIRE.md §5) and send them ahead at priority. The client "
        "sends to --listen instead of the server; replies go back to the last client seen.",
    )
    p.add_argument(
        "--listen",
        required=True,
        type=parse_hostport,
        metavar="ADDR:PORT",
        help="where the client sends this plane's traffic (IPv4, or [v6]:port)",
    )
    p.add_argument(
        "--forward",
        required=True,
        type=parse_hostport,
        metavar="ADDR:PORT",
        help="the server's address on this plane",
    )
    p.add_argument(
        "--rate",
        required=True,
        type=parse_rate,
        metavar="RATE",
        help="egress rate toward the server, bit/s (500M, 1G; SI, 1000-based)",
    )
    p.add_argument(
        "--reverse-rate",
        type=parse_rate,
        metavar="RATE",
        help="egress rate toward the client (default unlimited: no queue that way)",
    )
    p.add_argument(
        "--queue",
        type=parse_size,
        default=DEFAULT_QUEUE,
        metavar="BYTES",
        help="data queue size in UDP payload bytes (default 256K; K = 1024)",
    )
    p.add_argument(
        "--ecn-threshold",
        type=_size_or_zero,
        metavar="BYTES",
        help="mark CE on ECN-capable packets queued behind more than this (default: queue/4)",
    )
    p.add_argument(
        "--priority-queue",
        type=parse_size,
        metavar="BYTES",
        help="room for trimmed headers, which go first (default: as large as --queue)",
    )
    p.add_argument(
        "--trim-size",
        type=_trim_size,
        default=DEFAULT_TRIM_SIZE,
        metavar="N",
        help=f"bytes of UDP payload a trimmed packet keeps (default {DEFAULT_TRIM_SIZE}, "
        f"at least {MIN_TRIM_SIZE})",
    )
    p.add_argument(
        "--no-trim", action="store_true", help="tail-drop what does not fit instead of trimming"
    )
    p.add_argument(
        "--last-hop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="trimmed packets get DSCP 21 (TRIMMED_LASTHOP), the default: the relay feeds the "
        "host directly and all of the plane's EVs share its queue; --no-last-hop: DSCP 11",
    )
    p.add_argument(
        "-t",
        "--time",
        type=parse_seconds,
        metavar="SEC",
        help="run for SEC seconds (default: until SIGINT or SIGTERM)",
    )
    p.add_argument(
        "--realtime",
        action="store_true",
        help="run under SCHED_FIFO (root): on a busy host, scheduling delays would otherwise "
        "add queueing the emulated link does not have (see max_release_lateness_seconds)",
    )
    p.add_argument("-J", "--json", action="store_true", help="one JSON document on exit")
    p.set_defaults(func=run)


def config_from(ns: argparse.Namespace) -> SwitchConfig:
    """Check the flag combination; raises UsageError with a one-line message."""
    if ns.forward[1] == 0:
        raise UsageError("--forward needs the server's port (1..65535)")
    threshold = ns.queue // 4 if ns.ecn_threshold is None else ns.ecn_threshold
    if threshold > ns.queue:
        raise UsageError(
            f"--ecn-threshold ({threshold}) must not exceed --queue ({ns.queue}); "
            "set it equal to the queue to never mark"
        )
    if ns.time is not None and ns.time <= 0:
        raise UsageError("-t must be more than 0 seconds")
    if ns.queue > 1 << 30:
        raise UsageError(f"--queue must be at most 1G, got {ns.queue}")
    return SwitchConfig(
        listen=ns.listen,
        forward=ns.forward,
        rate_bps=ns.rate,
        reverse_rate_bps=ns.reverse_rate,
        queue_bytes=ns.queue,
        ecn_threshold=threshold,
        priority_bytes=ns.priority_queue,
        trim=not ns.no_trim,
        trim_size=ns.trim_size,
        last_hop=ns.last_hop,
    )


def _bind_error(cfg: SwitchConfig, exc: OSError) -> str:
    listen = format_addr(cfg.listen)
    forward = format_addr(cfg.forward)
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve --listen {listen} or --forward {forward}: {exc.strerror}"
    if exc.errno == errno.EADDRINUSE:
        return f"--listen {listen}: address already in use"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"--listen {listen}: not an address of this host"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"--listen {listen}: permission denied"
    if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return f"--forward {forward}: no route to it"
    if exc.errno == errno.EAFNOSUPPORT:
        return f"--listen {listen} / --forward {forward}: address family not supported here"
    return f"cannot open the relay's sockets ({listen} → {forward}): {exc.strerror or exc}"


def _rate_text(bps: float | None) -> str:
    if bps is None:
        return "unlimited"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}bit/s"
    return f"{bps:g} bit/s"


def run(ns: argparse.Namespace) -> int:
    try:
        cfg = config_from(ns)
    except UsageError as exc:
        sys.stderr.write(f"mrc switch: error: {exc}\n")
        return 2
    if ns.realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
        except OSError as exc:
            sys.stderr.write(f"mrc switch: error: --realtime: {exc.strerror} (needs root)\n")
            return 1
    try:
        relay = Relay(cfg)
    except (OSError, ValueError) as exc:
        msg = _bind_error(cfg, exc) if isinstance(exc, OSError) else str(exc)
        sys.stderr.write(f"mrc switch: error: {msg}\n")
        return 1
    try:
        previous = {sig: signal.signal(sig, lambda *_: relay.stop()) for sig in _SIGNALS}
        try:
            fwd = relay.forward
            sys.stderr.write(
                f"mrc switch: listening on {format_addr(relay.listen_addr)}, forwarding to "
                f"{format_addr(relay.forward_addr)} from {format_addr(relay.source_addr)}; "
                f"rate {_rate_text(cfg.rate_bps)} (reverse {_rate_text(cfg.reverse_rate_bps)}), "
                f"queue {fwd.queue_bytes} B, ECN above {fwd.ecn_threshold} B, "
                + (
                    f"trim to {cfg.trim_size} B with DSCP {fwd.dscp}\n"
                    if cfg.trim
                    else "no trimming\n"
                )
            )
            sys.stderr.flush()
            relay.serve(ns.time)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        doc = relay.report()
    finally:
        relay.close()
    if ns.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(_text(doc))
    sys.stdout.flush()
    return 0


def _text(doc: dict[str, Any]) -> str:
    end = doc["end"]
    lines = [f"mrc switch: {end['seconds']:.3f} s, client {end['client'] or '(none)'}"]
    for name in ("forward", "reverse"):
        s = end[name]
        lines.append(
            f"  {name:7s} rx {s['received_packets']} pkts {s['received_bytes']} B, "
            f"tx {s['forwarded_packets']} pkts {s['forwarded_bytes']} B, "
            f"ce {s['ce_marked']}, trimmed {s['trimmed']}, "
            f"dropped queue {s['dropped_queue']} priority {s['dropped_priority']}, "
            f"socket overflow {s['socket_overflow']}, max queue {s['max_queue_bytes']} B, "
            f"mean delay {s['mean_queue_delay_seconds'] * 1e3:.3f} ms"
        )
    if end["errors"]:
        lines.append("  errors: " + ", ".join(f"{k} {v}" for k, v in sorted(end["errors"].items())))
    return "\n".join(lines) + "\n"
