"""`BenchOptions`: the parameters of one `mrc bench` run, after the flags were checked.

Kept apart from the argument parser (`bench`) so that the modules that run a test (`bench_run`,
`bench_server`, `bench_report`) depend on the options and not on the command line: imports flow
one way, `bench → bench_run → bench_server | bench_report → bench_options`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mrc.core.config import SessionConfig
from mrc.core.secure.handshake import Identity
from mrc.io.pathtable import PathTable
from mrc.node.host import SPORT_POOL

from .bench_trace import TraceFile

DEFAULT_PORT = 4791
DEFAULT_MSG_SIZE = 1 << 20
DEFAULT_CC = SessionConfig().cc
#: Packets per flowcell (one GSO batch on one EV); capped by what one sendmsg holds.
DEFAULT_FLOWCELL = 64


#: Reverse EVs per plane when a fabric hashes the EV (flow label or source port).
HASHED_REVERSE_EVS = 8

@dataclass(slots=True)
class BenchOptions:
    role: str
    server: list[str] = field(default_factory=list)
    bind: list[str] | None = None
    port: int = DEFAULT_PORT
    duration: float = 0.0
    total_bytes: int = 0
    msg_size: int = DEFAULT_MSG_SIZE
    interval: float = 1.0
    json: bool = False
    one_off: bool = False
    reverse: bool = False
    payload_mtu: int = 4096
    ev_per_plane: int = 16
    mpr: int = 8
    spray: str = "bitmap"
    plane_balance: str = "equal"
    cc: str = DEFAULT_CC
    flowcell: int = DEFAULT_FLOWCELL
    verify: bool = False
    injects: list[tuple[int, float]] = field(default_factory=list)
    connect_timeout: float = 5.0
    #: --paths: the file name and the table read from it.
    paths: str | None = None
    path_table: PathTable | None = None
    #: --security, --key FILE, --peer-key FILE|BASE64 (docs/DESIGN.md §8).
    security: str = "none"
    key: str | None = None
    peer_key: str | None = None
    #: The identity the run uses when secured (from --key, or made for this run).
    identity: Identity | None = None
    #: --ev-encoding: where datagrams carry their EV besides the EVXH (docs/DESIGN.md §4).
    ev_encoding: str = "evxh"
    #: --trace FILE: its name, and the file once opened (before connecting).
    trace: str | None = None
    trace_file: TraceFile | None = None
    #: --latency: a WRITE_WITH_IMM ping-pong of `iterations` round trips (0 = for `duration`).
    latency: bool = False
    iterations: int = 0
    #: --sweep: one test per message size in `sweep_sizes` (`duration`/`total_bytes` each).
    sweep: bool = False
    sweep_sizes: tuple[int, ...] = ()

    def config(self, planes: int, plane_paths: Mapping[int, int] | None = None) -> SessionConfig:
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
