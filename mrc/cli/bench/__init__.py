"""`mrc bench`: the benchmark command (docs/DESIGN.md §10), shaped like iperf3.

Holds the argparse definition with iperf3's flags and `run`: the flags become checked, frozen
options (`options.options_from`; a bad combination is one line on stderr and exit status 2),
and the module of the mode being run takes them (`modes.entry`: bulk, sweep, latency, daemon or
demo, each with its client, server and roles). Everything after parsing (the --trace file,
keys, sockets, the test itself) is that module's.

The package, from the bottom: `proto` (the bench's own agreement between client and server:
private data, slots, the --verify pattern, the results exchange), `events`, `options`,
`setup`, `trace`, `state` (what a run opens: trace file, identity), `writer` and `receiver`
(the rule each side follows), `stream` (one in-process test on a session), `report`, `host`
(a side's node), `runner` (a side on its event loop), then the modes: `client`, `server`,
`sweep`, `latency`, `demo`, `daemon`, and `modes`, their table. No module imports one above it.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from mrc.cli import COMMANDS
from mrc.core.cc.control import cc_names
from mrc.core.config import (
    DEFAULT_FLOWCELL,
    MAX_FLOWCELL,
    MAX_PAYLOAD_MTU,
    MIN_PAYLOAD_MTU,
    SECURITY_LEVELS,
)
from mrc.core.paths.balance import balance_names
from mrc.core.paths.spray import spray_names
from mrc.node.host import EV_ENCODINGS

from ...units import UsageError, int_range, parse_seconds, parse_size
from .modes import entry
from .options import (
    CORE,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_DURATION,
    DEFAULT_ITERATIONS,
    DEFAULT_LATENCY_SIZE,
    DEFAULT_PORT,
    SWEEP_SECONDS,
    options_from,
    sweep_sizes,
)
from .proto import MAX_MESSAGES

__all__ = ["add_parser", "parse_inject", "parse_sweep_sizes", "run"]


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
        type=int_range(0, 65535, "port"),
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
        type=int_range(1, MAX_MESSAGES, "iterations"),
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
        type=int_range(MIN_PAYLOAD_MTU, MAX_PAYLOAD_MTU, "payload MTU"),
        default=CORE.payload_mtu,
        metavar="N",
        help=f"payload bytes per packet (default {CORE.payload_mtu})",
    )
    p.add_argument(
        "--ev-per-plane",
        type=int_range(1, 255, "EVs per plane"),
        default=CORE.ev_per_plane,
        metavar="N",
        help=f"EVs per plane (default {CORE.ev_per_plane})",
    )
    p.add_argument(
        "--mpr",
        type=int_range(1, 255, "MPR"),
        default=CORE.mpr,
        metavar="N",
        help=f"window in units of 128 packets (default {CORE.mpr})",
    )
    p.add_argument(
        "--flowcell",
        type=int_range(1, MAX_FLOWCELL, "flowcell"),
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
        default=CORE.spray,
        help=f"spray policy of the side that writes (default {CORE.spray}, MRC's retirement "
        "rule)",
    )
    p.add_argument(
        "--plane-balance",
        choices=balance_names(),
        default=CORE.plane_balance,
        help="how the writing side shares packets between planes: equal (MRC's rule, the "
        "default) or adaptive (weighted by each plane's measured delivery rate)",
    )
    p.add_argument(
        "--cc",
        choices=cc_names(),
        default=CORE.cc,
        help=f"congestion control of the side that writes: nscc (UEC NSCC) or none (the MPR "
        f"window only); default {CORE.cc}",
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
        default=DEFAULT_CONNECT_TIMEOUT,
        metavar="SEC",
        help=f"client: give up when the server has not answered (default "
        f"{DEFAULT_CONNECT_TIMEOUT:g})",
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
        "writes to the server on the daemon's peer PEER (mrc.cli.bench.daemon)",
    )
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    try:
        opts = options_from(ns)
    except UsageError as exc:
        sys.stderr.write(f"mrc bench: error: {exc}\n")
        return 2
    return entry(opts)(opts)
