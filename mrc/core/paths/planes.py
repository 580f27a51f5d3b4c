"""Planes of one connection: their state, RTT estimators, probing and reverse EVs.

A plane is UP or DOWN by our own judgement (local link, unanswered probes) and, separately,
usable only while the peer announces it can receive on it (PORTSTATE / PORT_STATUS,
docs/DESIGN.md §4). Each plane keeps an RFC 6298 estimator for its RTO, the state of its probes, and
a small set of reverse EVs (for SACKs, NACKs and probe answers) validated with EV_PROBE.
The EVs that carry data, their states and backups live in the `EvTable` (evs.py), which this
table owns; which EV goes next is the spray policy's choice (spray.py), and when a plane fails
is decided by the plane monitor (planes.py).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from ..config import SessionConfig
from ..events import Event
from .evs import EvTable, EvWatcher, ev_plane, make_ev

__all__ = ["Plane", "PlaneState", "PlaneTable", "RttEstimator", "ev_plane", "make_ev"]


class PlaneState(Enum):
    UP = "up"
    DOWN = "down"


@dataclass(slots=True)
class RttEstimator:
    """RFC 6298 §2 for one plane, with exponential backoff (§5.5)."""

    min_rto: float
    max_rto: float
    rto: float
    srtt: float | None = None
    rttvar: float = 0.0
    backoff: int = 0

    def sample(self, r: float) -> None:
        # Karn: a sample from a first transmission ends the backoff (RFC 6298 §5, note 2).
        self.backoff = 0
        if self.srtt is None:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r
        # RFC 6298 §2.3 with the clock-granularity term G read as a quarter of SRTT (the
        # reordering window of docs/DESIGN.md §6): a path with no jitter at all (the simulator)
        # must not time out at the very instant its acknowledgements are due.
        spread = max(4 * self.rttvar, self.srtt / 4)
        self.rto = min(self.max_rto, max(self.min_rto, self.srtt + spread))

    @property
    def current(self) -> float:
        """The RTO in force, backoff included."""
        return min(self.max_rto, self.rto * (1 << self.backoff))


@dataclass(slots=True)
class Plane:
    number: int
    rtt: RttEstimator
    state: PlaneState = PlaneState.UP
    down_reason: str = ""
    #: The peer can receive on this plane (its PORTSTATE / PORT_STATUS bit).
    peer_up: bool = True
    #: Our floor EVs (or a DOWN plane) are being probed with RELIABILITY_PROBE.
    probing: bool = False
    probe_outstanding: bool = False
    probe_sent_at: float = 0.0
    #: The EV the outstanding plane probe went on (an UP plane's: unanswered, it is a loss there).
    probe_ev: int = 0
    #: Probes in a row that went unanswered; three take a probed plane DOWN.
    unanswered: int = 0
    #: DOWN planes: answers in a row toward restoration.
    answers: int = 0
    #: Interval to the next probe (10 ms, doubling to 1 s while a DOWN plane stays silent).
    probe_interval: float = 0.0
    #: Reverse EVs (SACK/NACK/probe answers) and their EV_PROBE validation (docs/DESIGN.md §4).
    reverse_evs: list[int] = field(default_factory=list)
    #: Reverse EVs whose EV_PROBEs went unanswered: left out until one is answered.
    reverse_bad: set[int] = field(default_factory=set)
    #: Unanswered EV_PROBEs in a row, per reverse EV.
    reverse_misses: dict[int, int] = field(default_factory=dict)
    reverse_next: int = 0
    reverse_probe_next: int = 0
    #: When something last proved that our packets on this plane reach the peer, and the
    #: send time of the latest packet of ours on this plane the peer answered.
    proven_at: float = 0.0
    answered_sent_at: float = 0.0
    #: When an acknowledgement last covered a first transmission of ours on this plane.
    acked_at: float = 0.0
    #: When data or an acknowledgement last arrived from the peer on this plane.
    heard_at: float = 0.0
    reverse_probe_id: int | None = None
    reverse_probe_ev: int = 0
    reverse_probe_sent_at: float = 0.0
    #: The plane's EVs name paths (a path table or `plane_paths`: several known paths), listed
    #: in the same order both ways, so an answer may take the mirror of the EV a packet just
    #: came in on: a path that packet proved (docs/DESIGN.md §4, "Reverse path").
    mirror: bool = False
    #: Every reverse EV of this plane is bad: our SACKs, NACKs and answers go elsewhere.
    reverse_dead: bool = False
    #: ... and nothing arrived on it since the last unanswered EV_PROBE went out: the plane
    #: is dead to us both ways, so its PORTSTATE bit is cleared (docs/DESIGN.md §4).
    silent: bool = False
    #: Hard ICMP errors (port, host or network unreachable) io reported for our sends to the
    #: peer on this plane while it had never answered (docs/DESIGN.md §4).
    unreachable: int = 0

    @property
    def never_answered(self) -> bool:
        """Nothing of ours on this plane was ever answered: no RTT sample, no acknowledgement,
        no probe answer (a peer address no one listens on, a path dead from the start)."""
        return self.rtt.srtt is None and not self.acked_at and not self.proven_at

    def reverse_ev(self) -> int:
        """The next reverse EV in rotation, skipping bad ones while a good one is left."""
        evs = self.reverse_evs
        for _ in range(len(evs)):
            ev = evs[self.reverse_next % len(evs)]
            self.reverse_next += 1
            if ev not in self.reverse_bad:
                return ev
        return evs[self.reverse_next % len(evs)]

    def next_reverse_probe(self) -> int:
        """The reverse EV to validate next: every one in turn, bad ones included."""
        ev = self.reverse_evs[self.reverse_probe_next % len(self.reverse_evs)]
        self.reverse_probe_next += 1
        return ev


class PlaneTable:
    """All planes of a connection and, through `evs`, their EVs."""

    def __init__(
        self,
        config: SessionConfig,
        rng: random.Random | None = None,
        events: deque[Event] | None = None,
        *,
        on_floor: Callable[[int, float], None] | None = None,
        trace: EvWatcher | None = None,
    ) -> None:
        """`on_floor` and `trace` go to the EV table (evs.py)."""
        self.events: deque[Event] = events if events is not None else deque()
        evs = EvTable(config, rng or random.Random(0), self.events, on_floor=on_floor, trace=trace)
        self.evs = evs
        self.planes: dict[int, Plane] = {}
        for p in config.planes:
            # One reverse EV per path of the plane (at least one), from its active set; a plane
            # with one known path gets `reverse_evs` of them (SessionConfig).
            pe = self.evs.planes[p]
            reverse: list[int] = []
            seen: set[int] = set()
            for r in pe.active:
                if r.path not in seen:
                    seen.add(r.path)
                    reverse.append(r.ev)
            if len(seen) == 1:
                reverse = [r.ev for r in pe.active[: config.reverse_evs]]
            self.planes[p] = Plane(
                number=p,
                rtt=RttEstimator(config.min_rto, config.max_rto, config.initial_rto),
                reverse_evs=reverse or [make_ev(p, 0)],
                mirror=len(seen) > 1,
            )
        self._version = 0

    @property
    def version(self) -> int:
        """Changes whenever the set of EVs in rotation changes (spray policies rebuild)."""
        return self._version + self.evs.version

    def up_planes(self) -> list[int]:
        return [p.number for p in self.planes.values() if p.state is PlaneState.UP]

    def is_up(self, plane: int) -> bool:
        pl = self.planes.get(plane)
        return pl is not None and pl.state is PlaneState.UP

    def usable(self, plane: int) -> bool:
        """We send data on `plane`: it is UP and the peer can receive on it."""
        pl = self.planes.get(plane)
        return pl is not None and pl.state is PlaneState.UP and pl.peer_up

    def set_state(self, plane: int, state: PlaneState, reason: str = "") -> bool:
        """Change a plane's state; True if it changed."""
        pl = self.planes[plane]
        if pl.state is state:
            return False
        pl.state = state
        pl.down_reason = reason
        pl.answers = 0
        pl.unanswered = 0
        pl.unreachable = 0
        self._version += 1
        return True

    def set_peer_up(self, plane: int, up: bool) -> bool:
        pl = self.planes[plane]
        if pl.peer_up == up:
            return False
        pl.peer_up = up
        self._version += 1
        return True

    def active_evs(self) -> dict[int, list[int]]:
        """EVs in rotation, by usable plane."""
        return {p: self.evs.rotation(p) for p in self.planes if self.usable(p)}

    def reverse_plane(self, preferred: int) -> int | None:
        """The plane to answer on: the preferred one if it works, else the first that does."""
        pl = self.planes.get(preferred)
        if pl is not None and pl.state is PlaneState.UP and not pl.reverse_dead:
            return preferred
        for p in self.planes.values():
            if p.state is PlaneState.UP and not p.reverse_dead:
                return p.number
        return preferred if self.is_up(preferred) else None

    def probe_timeout(self, plane: int) -> float:
        """How long a probe on `plane` may go unanswered: the plane's RTO once it has RTT
        samples, else the largest RTO a plane with samples has, else the initial RTO."""
        est = self.planes[plane].rtt
        if est.srtt is not None:
            return est.rto
        known = [p.rtt.rto for p in self.planes.values() if p.rtt.srtt is not None]
        return max(known) if known else est.rto

    def port_mask(self) -> int:
        """Planes we can receive on (PORTSTATE, docs/WIRE.md §4): not locally down, and not silent
        both ways (our EV_PROBEs unanswered and nothing arriving)."""
        return sum(
            1 << p
            for p, pl in self.planes.items()
            if pl.down_reason != "local" and not pl.silent
        )
