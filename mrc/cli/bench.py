"""`mrc bench`: the command line of the benchmark (docs/DESIGN.md §10) and its validation.

Holds the argparse definition with iperf3's flags, the size/time parsers, `options_from` (flags
to checked `BenchOptions`, see `bench_options`) and `run`, which hands them to `bench_run`. Bad
flags end here with one line on stderr and exit status 2; a --trace file that cannot be opened
with exit status 1, before anything connects; everything after parsing (sockets, the test
itself) is `bench_run`'s.

The bench's own agreement between client and server (private data, slots, the --verify
pattern, the results exchange) is documented in `bench_proto`.

Byte counts follow iperf3: `K`, `M`, `G`, `T` (and `KiB`, `MiB`, …) are powers of 1024; `kB`,
`MB`, `GB`, `TB` are powers of 1000.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from mrc.cli import COMMANDS
from mrc.core.cc.control import cc_names
from mrc.core.config import MAX_FLOWCELL, MAX_PAYLOAD_MTU, MIN_PAYLOAD_MTU, SECURITY_LEVELS
from mrc.core.errors import LocalProtocolError
from mrc.core.paths.balance import balance_names
from mrc.core.paths.spray import spray_names
from mrc.io.pathtable import PathTable, PathTableError
from mrc.node.host import EV_ENCODINGS

from . import bench_modes, bench_run
from .bench_latency import DEFAULT_ITERATIONS, DEFAULT_LATENCY_SIZE
from .bench_options import (
    DEFAULT_CC,
    DEFAULT_FLOWCELL,
    DEFAULT_MSG_SIZE,
    DEFAULT_PORT,
    BenchOptions,
)
from .bench_proto import MAX_INJECTS, MAX_MESSAGE_SIZE, MAX_MESSAGES
from .bench_setup import BenchError
from .bench_sweep import DEFAULT_SWEEP, SWEEP_SECONDS, sweep_sizes
from .bench_trace import TraceFile

DEFAULT_DURATION = 10.0
DEMO_BYTES = 256 << 20

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


class UsageError(Exception):
    """A bad combination of flags; reported as one line with exit status 2."""


def parse_size(text: str) -> int:
    """'256M' → 268435456, '1GiB', '1.5K', '4096', '10MB' (10**7)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (try 256M, 1G, 64KiB)")
    unit = m.group(2).lower()
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"unknown size suffix {m.group(2)!r} in {text!r}")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"byte count must be positive: {text!r}")
    return value


def parse_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value != value or value < 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be a finite number >= 0: {text!r}")
    return value


def parse_inject(text: str) -> tuple[int, float]:
    """'plane-down=2@1.5' → (2, 1.5)."""
    m = re.fullmatch(r"\s*plane-down\s*=\s*(\d+)\s*@\s*([0-9.]+)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"--inject wants plane-down=PLANE@SECONDS, got {text!r}")
    try:
        at = float(m.group(2))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad time in --inject {text!r}") from None
    return int(m.group(1)), at


def parse_sweep_sizes(text: str) -> tuple[int, ...]:
    """'4K-16M' → (4096, 8192, …, 16777216): the powers of two from A to B."""
    lo, sep, hi = text.partition("-")
    if not sep:
        raise argparse.ArgumentTypeError(f"--sweep-sizes wants A-B (e.g. 4K-16M), got {text!r}")
    try:
        return sweep_sizes(parse_size(lo), parse_size(hi))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _addr_list(text: str) -> list[str]:
    items = [a.strip() for a in text.split(",")]
    if not items or any(not a for a in items):
        raise argparse.ArgumentTypeError(f"empty address in {text!r}")
    return items


def _int_range(lo: int, hi: int, what: str) -> type[int]:
    def conv(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{what} must be {lo}..{hi}, got {value}")
        return value

    conv.__name__ = what
    return conv  # type: ignore[return-value]


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "bench",
        help=COMMANDS["bench"],
        description="Measure MRC throughput between a server (-s) and a client (-c), "
        "iperf3-style; the number of planes is the number of addresses.",
    )
    role = p.add_argument_group("role")
    role.add_argument("-s", "--server", action="store_true", help="run as the server")
    role.add_argument(
        "-c",
        "--client",
        metavar="ADDR[,ADDR...]",
        type=_addr_list,
        help="run as a client of the server at these addresses, one per plane",
    )
    role.add_argument(
        "--demo",
        action="store_true",
        help="server and client in this process on 4 loopback planes: 256 MiB, --verify, "
        "plane 2 blackholed midway",
    )
    p.add_argument(
        "-B",
        "--bind",
        metavar="ADDR[,ADDR...]",
        type=_addr_list,
        help="local address on each plane (same count and order as -c; required with -s)",
    )
    p.add_argument(
        "-p",
        "--port",
        type=_int_range(0, 65535, "port"),
        default=DEFAULT_PORT,
        help=f"UDP port (default {DEFAULT_PORT})",
    )
    p.add_argument(
        "-t",
        "--time",
        type=parse_seconds,
        metavar="SEC",
        help=f"seconds to transmit (default {DEFAULT_DURATION:g})",
    )
    p.add_argument(
        "-n",
        "--bytes",
        type=parse_size,
        metavar="BYTES",
        help="bytes to transmit instead of a time (K/M/G = 1024-based, kB/MB/GB SI)",
    )
    p.add_argument(
        "-l",
        "--length",
        type=parse_size,
        metavar="BYTES",
        default=None,
        help=f"message (WRITE) size (default 1M; {DEFAULT_LATENCY_SIZE} with --latency)",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="client: one test per message size, 4K..16M in powers of two (ib_write_bw -a "
        f"style), -t (default {SWEEP_SECONDS:g} s) or -n per size; one table row each",
    )
    p.add_argument(
        "--sweep-sizes",
        type=parse_sweep_sizes,
        metavar="A-B",
        help="with --sweep: the sizes from A to B (powers of two, e.g. 64K-1M)",
    )
    p.add_argument(
        "--latency",
        action="store_true",
        help="client: WRITE_WITH_IMM ping-pong (the server writes each message back as its "
        "immediate arrives); round-trip min/p50/p99/p99.9/max in microseconds",
    )
    p.add_argument(
        "--iterations",
        type=_int_range(1, MAX_MESSAGES, "iterations"),
        metavar="N",
        help=f"with --latency: round trips to time (default {DEFAULT_ITERATIONS}; or -t SEC)",
    )
    p.add_argument(
        "-i",
        "--interval",
        type=parse_seconds,
        metavar="SEC",
        default=1.0,
        help="seconds between interval reports, >= 0.01; 0 disables (default 1)",
    )
    p.add_argument("-J", "--json", action="store_true", help="one JSON document at the end")
    p.add_argument("-1", "--one-off", action="store_true", help="server: one test, then exit")
    p.add_argument("-R", "--reverse", action="store_true", help="reverse: the server writes")
    p.add_argument(
        "--payload-mtu",
        type=_int_range(MIN_PAYLOAD_MTU, MAX_PAYLOAD_MTU, "payload MTU"),
        default=4096,
        metavar="N",
        help="payload bytes per packet (default 4096)",
    )
    p.add_argument(
        "--ev-per-plane",
        type=_int_range(1, 255, "EVs per plane"),
        default=16,
        metavar="N",
        help="EVs per plane (default 16)",
    )
    p.add_argument(
        "--mpr",
        type=_int_range(1, 255, "MPR"),
        default=8,
        metavar="N",
        help="window in units of 128 packets (default 8)",
    )
    p.add_argument(
        "--flowcell",
        type=_int_range(1, MAX_FLOWCELL, "flowcell"),
        default=None,
        metavar="N",
        help="packets the writing side sends on one EV as one GSO batch (a flowcell; two "
        "batches when a full LAST_IMM among them is 4 bytes longer than the rest), at most "
        "65507 // (payload MTU + headers) and 64 of them: 15 at the default MTU 4096. 1 = an "
        f"EV and a system call per packet. Default {DEFAULT_FLOWCELL}, as many as one call "
        "holds: on 4 loopback planes with --verify it moved 1.9-2.5x the bytes of 1 at MTU "
        "4096 (3.6-4.9 vs 1.9-2.0 Gbit/s), more than 4 or 8, and 1.3x those of 16 at MTU 1024; "
        "the environment variable MRC_FLOWCELL changes the default",
    )
    p.add_argument(
        "--spray",
        choices=spray_names(),
        default="bitmap",
        help="spray policy of the side that writes (default bitmap, MRC's retirement rule)",
    )
    p.add_argument(
        "--plane-balance",
        choices=balance_names(),
        default="equal",
        help="how the writing side shares packets between planes: equal (MRC's rule, the "
        "default) or adaptive (weighted by each plane's measured delivery rate)",
    )
    p.add_argument(
        "--cc",
        choices=cc_names(),
        default=DEFAULT_CC,
        help=f"congestion control of the side that writes: nscc (UEC NSCC) or none (the MPR "
        f"window only); default {DEFAULT_CC}",
    )
    p.add_argument(
        "--verify", action="store_true", help="check every message's bytes on the receiver"
    )
    p.add_argument(
        "--inject",
        type=parse_inject,
        action="append",
        default=[],
        metavar="plane-down=P@SEC",
        help="lab fault: the sender's io drops everything for plane P from SEC on (repeatable)",
    )
    p.add_argument(
        "--paths",
        metavar="FILE",
        help="SRv6 path table written by the testbed (JSON): one send socket per path, "
        "each with its segment list; a plane's EVs are spread over its paths",
    )
    p.add_argument(
        "--ev-encoding",
        choices=EV_ENCODINGS,
        default="evxh",
        help="where datagrams carry their EV for the fabric to hash: evxh (only an MRC header "
        "of ours, the default), flowlabel (the IPv6 flow label instead; IPv6 planes; agreed "
        "with the peer) or udp (it also picks the UDP source port, from 128 sockets per plane; "
        "both sides must say udp); not with --paths",
    )
    p.add_argument(
        "--security",
        choices=SECURITY_LEVELS,
        default="none",
        help="per-packet protection: none (the default, as iperf3), auth (an AES-256-GCM tag "
        "on every packet) or encrypt (payloads encrypted too); both sides must agree",
    )
    p.add_argument(
        "--key",
        metavar="FILE",
        help="this side's private key file (mrc keygen; mode 0600); without it a secured run "
        "makes a key for this run",
    )
    p.add_argument(
        "--peer-key",
        metavar="FILE|BASE64",
        help="the peer's public key(s): the client accepts only this server, the server only "
        "these clients; without it a secured run protects against tampering, not "
        "impersonation",
    )
    p.add_argument(
        "--connect-timeout",
        type=parse_seconds,
        default=5.0,
        metavar="SEC",
        help="client: give up when the server has not answered (default 5)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="write a transport trace of the test to FILE (JSON Lines: EV and plane states, "
        "retransmits, drops, RTT and congestion samples; rate-limited; read by mrc plot)",
    )
    p.add_argument(
        "--daemon",
        metavar="SOCK",
        help="run through the mrc daemon at this control socket: -s serves tests, -c PEER "
        "writes to the server on the daemon's peer PEER (see bench_daemon)",
    )
    p.set_defaults(func=run)


def default_flowcell() -> int:
    """--flowcell's default: MRC_FLOWCELL when set (so a whole test suite can run per-packet
    spraying), else DEFAULT_FLOWCELL."""
    raw = os.environ.get("MRC_FLOWCELL", "").strip()
    if not raw:
        return DEFAULT_FLOWCELL
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_FLOWCELL:
        raise UsageError(f"MRC_FLOWCELL must be 1..{MAX_FLOWCELL}, got {raw!r}")
    return int(raw)


def _check_modes(ns: argparse.Namespace, role: str) -> None:
    """--sweep and --latency: client modes, each with the flags that make sense for it."""
    if ns.sweep_sizes is not None and not ns.sweep:
        raise UsageError("--sweep-sizes needs --sweep")
    if ns.iterations is not None and not ns.latency:
        raise UsageError("--iterations needs --latency")
    if not (ns.sweep or ns.latency):
        return
    mode = "--sweep" if ns.sweep else "--latency"
    if ns.sweep and ns.latency:
        raise UsageError("--sweep and --latency are separate tests; choose one")
    if role != "client":
        raise UsageError(f"{mode} is a client flag (the server serves it as it is)")
    clashes = [("-R", ns.reverse), ("--trace", ns.trace is not None), ("--inject", ns.inject)]
    if ns.sweep:
        clashes.append(("-l", ns.length is not None))
    else:
        clashes += [("--verify", ns.verify), ("-n", ns.bytes is not None)]
        if ns.time is not None and ns.iterations is not None:
            raise UsageError("--latency runs -t SEC or --iterations N, not both")
    for flag, on in clashes:
        if on:
            raise UsageError(f"{flag} does not apply with {mode}")


def options_from(ns: argparse.Namespace) -> BenchOptions:
    """Check the flag combination; raises UsageError with a one-line message."""
    roles = [name for name, on in (("-s", ns.server), ("-c", ns.client), ("--demo", ns.demo)) if on]
    if len(roles) != 1:
        raise UsageError(
            "choose exactly one of -s, -c ADDR[,ADDR...] and --demo"
            if roles
            else "missing role: -s (server), -c ADDR[,ADDR...] (client) or --demo"
        )
    role = {"-s": "server", "-c": "client", "--demo": "demo"}[roles[0]]
    if ns.time is not None and ns.bytes is not None:
        raise UsageError("-t and -n are mutually exclusive")
    if ns.interval and ns.interval < 0.01:
        raise UsageError(f"-i must be 0 or at least 0.01, got {ns.interval:g}")
    if ns.time is not None and ns.time <= 0:
        raise UsageError("-t must be more than 0 seconds")
    _check_modes(ns, role)
    if ns.length is None:
        ns.length = DEFAULT_LATENCY_SIZE if ns.latency else DEFAULT_MSG_SIZE
    if not 1 <= ns.length <= MAX_MESSAGE_SIZE:
        raise UsageError(f"-l must be 1..{MAX_MESSAGE_SIZE} bytes, got {ns.length}")
    if len(ns.inject) > MAX_INJECTS:
        raise UsageError(f"at most {MAX_INJECTS} --inject faults")
    opts = BenchOptions(
        role=role,
        server=list(ns.client or []),
        bind=list(ns.bind) if ns.bind else None,
        port=ns.port,
        duration=ns.time or 0.0,
        total_bytes=ns.bytes or 0,
        msg_size=ns.length,
        interval=ns.interval,
        json=ns.json,
        one_off=ns.one_off,
        reverse=ns.reverse,
        payload_mtu=ns.payload_mtu,
        ev_per_plane=ns.ev_per_plane,
        mpr=ns.mpr,
        spray=ns.spray,
        plane_balance=ns.plane_balance,
        cc=ns.cc,
        flowcell=ns.flowcell if ns.flowcell is not None else default_flowcell(),
        verify=ns.verify,
        injects=list(ns.inject),
        connect_timeout=ns.connect_timeout,
        security=ns.security,
        ev_encoding=ns.ev_encoding,
        key=ns.key,
        peer_key=ns.peer_key,
        trace=ns.trace,
        latency=ns.latency,
        iterations=ns.iterations or 0,
        sweep=ns.sweep,
        sweep_sizes=(ns.sweep_sizes or sweep_sizes(*DEFAULT_SWEEP)) if ns.sweep else (),
    )
    if opts.latency and not opts.duration and not opts.iterations:
        opts.iterations = DEFAULT_ITERATIONS
    if opts.sweep and not opts.duration and not opts.total_bytes:
        opts.duration = SWEEP_SECONDS
    if opts.security == "none" and (opts.key or opts.peer_key):
        raise UsageError("--key and --peer-key need --security auth or encrypt")
    if role == "demo" and (opts.key or opts.peer_key):
        raise UsageError("--demo makes its own keys; drop --key/--peer-key")
    if role == "server":
        if not opts.bind:
            raise UsageError("-s needs -B ADDR[,ADDR...]: one local address per plane")
        if opts.reverse:
            raise UsageError("-R is a client flag (the client asks the server to write)")
        if ns.time is not None or ns.bytes is not None:
            raise UsageError("-t/-n are client flags")
        planes = len(opts.bind)
    elif role == "client":
        if opts.one_off:
            raise UsageError("-1 is a server flag")
        if opts.bind is not None and len(opts.bind) != len(opts.server):
            raise UsageError(
                f"-B names {len(opts.bind)} addresses but -c names {len(opts.server)}: "
                "give one local address per plane, in the same order"
            )
        if opts.port == 0:
            raise UsageError("-p must name the server's port (1..65535)")
        planes = len(opts.server)
    else:
        if ns.bind or ns.client:
            raise UsageError("--demo picks its own loopback addresses; drop -B/-c")
        planes = 4
        if not opts.total_bytes and not opts.duration:
            opts.total_bytes = DEMO_BYTES
        opts.verify = True
    if role != "server" and not opts.duration and not opts.total_bytes and not opts.iterations:
        opts.duration = DEFAULT_DURATION
    if planes > 32:
        raise UsageError(f"at most 32 planes, got {planes}")
    for plane, _ in opts.injects:
        if plane >= planes:
            raise UsageError(f"--inject names plane {plane}, but there are only {planes} planes")
    if ns.paths is not None:
        if role == "demo":
            raise UsageError("--demo runs on loopback planes; --paths does not apply")
        try:
            opts.path_table = PathTable.load(ns.paths)
        except PathTableError as exc:
            raise UsageError(f"--paths: {exc}") from None
        opts.paths = ns.paths
    try:
        opts.config(planes)
    except LocalProtocolError as exc:
        raise UsageError(str(exc)) from None
    return opts


def run(ns: argparse.Namespace) -> int:
    if ns.daemon is not None and ns.trace is not None:
        sys.stderr.write("mrc bench: error: --trace does not apply with --daemon\n")
        return 2
    if ns.daemon is not None:
        if ns.sweep or ns.latency:
            sys.stderr.write("mrc bench: error: --sweep/--latency do not apply with --daemon\n")
            return 2
        if ns.length is None:
            ns.length = DEFAULT_MSG_SIZE
        if ns.ev_encoding != "evxh":
            sys.stderr.write("mrc bench: error: --ev-encoding does not apply with --daemon\n")
            return 2
        if ns.security != "none" or ns.key or ns.peer_key:
            sys.stderr.write(
                "mrc bench: error: --security/--key/--peer-key do not apply with --daemon "
                "(the daemon's config secures its connections)\n"
            )
            return 2
        from . import bench_daemon  # only here: the daemon client's imports cost every run

        return bench_daemon.run(ns)
    try:
        opts = options_from(ns)
    except UsageError as exc:
        sys.stderr.write(f"mrc bench: error: {exc}\n")
        return 2
    if opts.trace is not None:
        try:
            opts.trace_file = TraceFile(opts.trace, "server" if opts.role == "server" else "client")
        except BenchError as exc:
            sys.stderr.write(f"mrc bench: {exc}\n")
            return 1
    client = None
    if opts.sweep:
        client = bench_modes.sweep_client
    elif opts.latency:
        client = bench_modes.latency_client
    try:
        return bench_run.run(opts, client)
    finally:
        if opts.trace_file is not None:
            opts.trace_file.close()
