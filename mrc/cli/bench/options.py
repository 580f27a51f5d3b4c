"""`BenchOptions`: what one `mrc bench` run was asked to do, checked once, then frozen.

Holds the options object (each field with its meaning), the defaults the bench's flags start
from, and `options_from`, which turns the parsed flags into options or raises `UsageError`
with a one-line reason. Nothing changes an options object after `options_from` built it: what
a run opens or makes from them (the --trace file, the identity of a secured run) is
`state.RunState`'s, and a sweep's per-size options are new objects (`dataclasses.replace`).

The transport defaults are the core's (`SessionConfig`, `DEFAULT_FLOWCELL`) and the port the
wire's (`ROCE_PORT`): the daemon reads the same ones, so `mrc bench` and a daemon left at its
defaults run alike. The argparse definition is the package's (`mrc.cli.bench`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from mrc.core.config import DEFAULT_FLOWCELL, MAX_FLOWCELL, SessionConfig
from mrc.core.errors import LocalProtocolError
from mrc.io.pathtable import PathTable, PathTableError
from mrc.node.host import SPORT_POOL
from mrc.wire.bth import ROCE_PORT

from ...units import UsageError
from .proto import MAX_INJECTS, MAX_MESSAGE_SIZE

__all__ = [
    "CORE",
    "DEFAULT_PORT",
    "MODES",
    "BenchOptions",
    "UsageError",
    "default_flowcell",
    "options_from",
    "sweep_sizes",
]

#: The core's defaults: payload MTU, EVs per plane, MPR, spray, plane balance, cc.
CORE: Final = SessionConfig()
DEFAULT_PORT: Final = ROCE_PORT
DEFAULT_MSG_SIZE: Final = 1 << 20
DEFAULT_DURATION: Final = 10.0
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
#: --demo moves this much unless -t or -n says otherwise.
DEMO_BYTES: Final = 256 << 20
DEMO_PLANES: Final = 4
MAX_PLANES: Final = 32
#: --latency: round trips, and the message size, unless --iterations/-t and -l say otherwise.
DEFAULT_ITERATIONS: Final = 10_000
DEFAULT_LATENCY_SIZE: Final = 64
#: --sweep: `ib_write_bw -a`'s range cut to what a bulk transport is for: 4 KiB .. 16 MiB,
#: and seconds per size (13 sizes, so a sweep takes about 15 s with the handshakes).
DEFAULT_SWEEP: Final = (4 << 10, 16 << 20)
SWEEP_SECONDS: Final = 1.0
#: Reverse EVs per plane when a fabric hashes the EV (flow label or source port).
HASHED_REVERSE_EVS: Final = 8
#: The ways to run the bench (`modes.MODES` names each one's client, server and roles).
MODES: Final = ("bulk", "sweep", "latency", "daemon", "demo")
#: Flags of the in-process bench that name transport settings, with their defaults; with
#: --daemon they are the daemon's configuration's.
TRANSPORT_FLAGS: Final[tuple[tuple[str, str, Any], ...]] = (
    ("-B", "bind", None),
    ("-R", "reverse", False),
    ("--demo", "demo", False),
    ("--paths", "paths", None),
    ("--inject", "inject", []),
    ("-p", "port", DEFAULT_PORT),
    ("--payload-mtu", "payload_mtu", CORE.payload_mtu),
    ("--ev-per-plane", "ev_per_plane", CORE.ev_per_plane),
    ("--mpr", "mpr", CORE.mpr),
    ("--flowcell", "flowcell", None),
    ("--spray", "spray", CORE.spray),
    ("--plane-balance", "plane_balance", CORE.plane_balance),
    ("--cc", "cc", CORE.cc),
)


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """One run's options, checked. Build them with `options_from` (or `dataclasses.replace`
    of checked ones)."""

    #: "server" (-s), "client" (-c) or "demo" (--demo: both in this process).
    role: str
    #: "bulk", "sweep", "latency", "daemon" or "demo" (`MODES`).
    mode: str = "bulk"
    #: -c: the server's address on each plane (with --daemon: the one peer's name).
    server: tuple[str, ...] = ()
    #: -B: the local address on each plane (None: any, as the route to the server picks).
    bind: tuple[str, ...] | None = None
    #: -p: the UDP port (the server's, for a client).
    port: int = DEFAULT_PORT
    #: -t: seconds to transmit (0 = by bytes, or by iterations).
    duration: float = 0.0
    #: -n: bytes to transmit (0 = by time).
    total_bytes: int = 0
    #: -l: the message (WRITE) size in bytes.
    msg_size: int = DEFAULT_MSG_SIZE
    #: -i: seconds between interval reports (0 = none).
    interval: float = 1.0
    #: -J: one JSON document at the end instead of text lines.
    json: bool = False
    #: -1: the server serves one test, then exits.
    one_off: bool = False
    #: -R: the server writes, the client receives.
    reverse: bool = False
    #: --payload-mtu, --ev-per-plane, --mpr, --spray, --plane-balance, --cc, --flowcell: the
    #: transport's settings on the side that writes (`config`).
    payload_mtu: int = CORE.payload_mtu
    ev_per_plane: int = CORE.ev_per_plane
    mpr: int = CORE.mpr
    spray: str = CORE.spray
    plane_balance: str = CORE.plane_balance
    cc: str = CORE.cc
    flowcell: int = DEFAULT_FLOWCELL
    #: --verify: the receiver checks every message's bytes.
    verify: bool = False
    #: --inject plane-down=P@SEC: (plane, seconds after the start) blackholes of the writer.
    injects: tuple[tuple[int, float], ...] = ()
    #: --connect-timeout: a client gives up on a server that does not answer this long.
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    #: --paths: the file name, and the SRv6 path table read from it when the flags were checked.
    paths: str | None = None
    path_table: PathTable | None = field(default=None, compare=False)
    #: --security, --key FILE, --peer-key FILE|BASE64 (docs/DESIGN.md §8).
    security: str = "none"
    key: str | None = None
    peer_key: str | None = None
    #: --ev-encoding: where datagrams carry their EV besides the EVXH (docs/DESIGN.md §4).
    ev_encoding: str = "evxh"
    #: --trace FILE: the file's name (the open file is the run state's).
    trace: str | None = None
    #: --iterations: a latency test's round trips (0 = for `duration`).
    iterations: int = 0
    #: --sweep-sizes: the message sizes a sweep runs, one test each.
    sweep_sizes: tuple[int, ...] = ()
    #: --daemon SOCK: the control socket of the daemon the run goes through.
    daemon: str | None = None

    @property
    def latency(self) -> bool:
        return self.mode == "latency"

    @property
    def sweep(self) -> bool:
        return self.mode == "sweep"

    def config(self, planes: int, plane_paths: Mapping[int, int] | None = None) -> SessionConfig:
        """The session settings on `planes` planes (`plane_paths`: paths per plane)."""
        counts = plane_paths or {}
        ports = SPORT_POOL if self.ev_encoding == "udp" else 1
        return SessionConfig(
            plane_mask=(1 << planes) - 1,
            payload_mtu=self.payload_mtu,
            mpr=self.mpr,
            ev_per_plane=self.ev_per_plane,
            spray=self.spray,
            plane_balance=self.plane_balance,
            cc=self.cc,
            flowcell=self.flowcell,
            # EVs that pick a source port are spread evenly over the pool, as over paths.
            plane_paths=tuple(counts.get(p, ports) for p in range(planes)),
            security=self.security,
            # A fabric that hashes the flow label or the source port spreads a plane's reverse
            # path over paths we cannot see: validate several reverse EVs (docs/DESIGN.md §4).
            reverse_evs=HASHED_REVERSE_EVS if self.ev_encoding != "evxh" else 1,
            ev_encoding=self.ev_encoding,
        ).validate()

    def inject_specs(self) -> list[str]:
        return [f"plane-down={p}@{at:g}" for p, at in self.injects]


def sweep_sizes(lo: int, hi: int) -> tuple[int, ...]:
    """lo, 2·lo, 4·lo … up to hi (both powers of two, lo <= hi)."""
    for name, v in (("first", lo), ("last", hi)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"the {name} sweep size must be a power of two, got {v}")
    if lo > hi:
        raise ValueError(f"sweep sizes run upwards: {lo} > {hi}")
    out = []
    size = lo
    while size <= hi:
        out.append(size)
        size <<= 1
    return tuple(out)


def default_flowcell() -> int:
    """--flowcell's default: MRC_FLOWCELL when set (so a whole test suite can run per-packet
    spraying), else the core's DEFAULT_FLOWCELL."""
    raw = os.environ.get("MRC_FLOWCELL", "").strip()
    if not raw:
        return DEFAULT_FLOWCELL
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_FLOWCELL:
        raise UsageError(f"MRC_FLOWCELL must be 1..{MAX_FLOWCELL}, got {raw!r}")
    return int(raw)


def options_from(ns: argparse.Namespace) -> BenchOptions:
    """The options the parsed flags ask for; raises UsageError with a one-line message."""
    if ns.daemon is not None:
        return _daemon_options(ns)
    return _options(ns)


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


def _role(ns: argparse.Namespace) -> str:
    roles = [name for name, on in (("-s", ns.server), ("-c", ns.client), ("--demo", ns.demo)) if on]
    if len(roles) != 1:
        raise UsageError(
            "choose exactly one of -s, -c ADDR[,ADDR...] and --demo"
            if roles
            else "missing role: -s (server), -c ADDR[,ADDR...] (client) or --demo"
        )
    return {"-s": "server", "-c": "client", "--demo": "demo"}[roles[0]]


def _options(ns: argparse.Namespace) -> BenchOptions:
    role = _role(ns)
    if ns.time is not None and ns.bytes is not None:
        raise UsageError("-t and -n are mutually exclusive")
    if ns.interval and ns.interval < 0.01:
        raise UsageError(f"-i must be 0 or at least 0.01, got {ns.interval:g}")
    if ns.time is not None and ns.time <= 0:
        raise UsageError("-t must be more than 0 seconds")
    _check_modes(ns, role)
    mode = "sweep" if ns.sweep else "latency" if ns.latency else "bulk"
    mode = "demo" if role == "demo" else mode
    length = ns.length
    if length is None:
        length = DEFAULT_LATENCY_SIZE if ns.latency else DEFAULT_MSG_SIZE
    if not 1 <= length <= MAX_MESSAGE_SIZE:
        raise UsageError(f"-l must be 1..{MAX_MESSAGE_SIZE} bytes, got {length}")
    if len(ns.inject) > MAX_INJECTS:
        raise UsageError(f"at most {MAX_INJECTS} --inject faults")
    duration: float = ns.time or 0.0
    total_bytes: int = ns.bytes or 0
    iterations: int = ns.iterations or 0
    if ns.latency and not duration and not iterations:
        iterations = DEFAULT_ITERATIONS
    if ns.sweep and not duration and not total_bytes:
        duration = SWEEP_SECONDS
    if ns.security == "none" and (ns.key or ns.peer_key):
        raise UsageError("--key and --peer-key need --security auth or encrypt")
    if role == "demo" and (ns.key or ns.peer_key):
        raise UsageError("--demo makes its own keys; drop --key/--peer-key")
    server = tuple(ns.client or ())
    bind = tuple(ns.bind) if ns.bind else None
    verify: bool = ns.verify
    if role == "server":
        if not bind:
            raise UsageError("-s needs -B ADDR[,ADDR...]: one local address per plane")
        if ns.reverse:
            raise UsageError("-R is a client flag (the client asks the server to write)")
        if ns.time is not None or ns.bytes is not None:
            raise UsageError("-t/-n are client flags")
        planes = len(bind)
    elif role == "client":
        if ns.one_off:
            raise UsageError("-1 is a server flag")
        if bind is not None and len(bind) != len(server):
            raise UsageError(
                f"-B names {len(bind)} addresses but -c names {len(server)}: "
                "give one local address per plane, in the same order"
            )
        if ns.port == 0:
            raise UsageError("-p must name the server's port (1..65535)")
        planes = len(server)
    else:
        if ns.bind or ns.client:
            raise UsageError("--demo picks its own loopback addresses; drop -B/-c")
        planes = DEMO_PLANES
        if not total_bytes and not duration:
            total_bytes = DEMO_BYTES
        verify = True
    if role != "server" and not duration and not total_bytes and not iterations:
        duration = DEFAULT_DURATION
    if planes > MAX_PLANES:
        raise UsageError(f"at most {MAX_PLANES} planes, got {planes}")
    for plane, _ in ns.inject:
        if plane >= planes:
            raise UsageError(f"--inject names plane {plane}, but there are only {planes} planes")
    path_table = None
    if ns.paths is not None:
        if role == "demo":
            raise UsageError("--demo runs on loopback planes; --paths does not apply")
        try:
            path_table = PathTable.load(ns.paths)
        except PathTableError as exc:
            raise UsageError(f"--paths: {exc}") from None
    opts = BenchOptions(
        role=role,
        mode=mode,
        server=server,
        bind=bind,
        port=ns.port,
        duration=duration,
        total_bytes=total_bytes,
        msg_size=length,
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
        verify=verify,
        injects=tuple(ns.inject),
        connect_timeout=ns.connect_timeout,
        paths=ns.paths,
        path_table=path_table,
        security=ns.security,
        key=ns.key,
        peer_key=ns.peer_key,
        ev_encoding=ns.ev_encoding,
        trace=ns.trace,
        iterations=iterations,
        sweep_sizes=(ns.sweep_sizes or sweep_sizes(*DEFAULT_SWEEP)) if ns.sweep else (),
    )
    try:
        opts.config(planes)
    except LocalProtocolError as exc:
        raise UsageError(str(exc)) from None
    return opts


def _daemon_options(ns: argparse.Namespace) -> BenchOptions:
    """--daemon SOCK: the test's own flags only; the transport is the daemon's configuration."""
    if ns.trace is not None:
        raise UsageError("--trace does not apply with --daemon")
    if ns.sweep or ns.latency:
        raise UsageError("--sweep/--latency do not apply with --daemon")
    if ns.ev_encoding != "evxh":
        raise UsageError("--ev-encoding does not apply with --daemon")
    if ns.security != "none" or ns.key or ns.peer_key:
        raise UsageError(
            "--security/--key/--peer-key do not apply with --daemon "
            "(the daemon's config secures its connections)"
        )
    for flag, attr, default in TRANSPORT_FLAGS:
        if getattr(ns, attr, default) != default:
            raise UsageError(
                f"{flag} does not apply with --daemon: the daemon's configuration sets its "
                "transport"
            )
    if ns.server == bool(ns.client):
        raise UsageError("--daemon needs exactly one of -s and -c PEER")
    if ns.client and len(ns.client) != 1:
        raise UsageError("with --daemon, -c names one peer (a name from the daemon's config)")
    if ns.time is not None and ns.bytes is not None:
        raise UsageError("-t and -n are mutually exclusive")
    if ns.interval and ns.interval < 0.01:
        raise UsageError(f"-i must be 0 or at least 0.01, got {ns.interval:g}")
    length = DEFAULT_MSG_SIZE if ns.length is None else ns.length
    if not 1 <= length <= MAX_MESSAGE_SIZE:
        raise UsageError(f"-l must be 1..{MAX_MESSAGE_SIZE} bytes, got {length}")
    role = "server" if ns.server else "client"
    duration: float = ns.time or 0.0
    total_bytes: int = ns.bytes or 0
    if role == "server":
        if ns.time is not None or ns.bytes is not None or ns.verify:
            raise UsageError("-t/-n/--verify are client flags (the client asks for them)")
    else:
        if ns.one_off:
            raise UsageError("-1 is a server flag")
        if ns.time is not None and ns.time <= 0:
            raise UsageError("-t must be more than 0 seconds")
        if not total_bytes and not duration:
            duration = DEFAULT_DURATION
    return BenchOptions(
        role=role,
        mode="daemon",
        server=tuple(ns.client or ()),
        daemon=ns.daemon,
        msg_size=length,
        total_bytes=total_bytes,
        duration=duration,
        interval=ns.interval,
        json=ns.json,
        one_off=ns.one_off,
        verify=ns.verify,
        connect_timeout=ns.connect_timeout,
    )
