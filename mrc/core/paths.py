"""Planes and EVs of one connection: which paths exist, which are in rotation, their RTTs.

An EV is `plane 8 | selector 24` (WIRE.md §3). On direct planes there is one route per plane,
so the selector only spreads load; with a path table (SRv6, sim Clos) route = selector mod the
plane's path count (DESIGN.md §4). This module keeps the per-plane state (UP/DOWN, RFC 6298
estimator, probing schedule) and the EV lists; it does not choose EVs (spray.py) and does not
decide when a plane fails (the sender and session do).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .config import SessionConfig


def ev_plane(ev: int) -> int:
    return ev >> 24 & 0xFF


def make_ev(plane: int, selector: int) -> int:
    return (plane & 0xFF) << 24 | (selector & 0xFFFFFF)


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
        self.rto = min(self.max_rto, max(self.min_rto, self.srtt + max(1e-6, 4 * self.rttvar)))

    @property
    def current(self) -> float:
        """The RTO in force, backoff included."""
        return min(self.max_rto, self.rto * (1 << self.backoff))


@dataclass(slots=True)
class Plane:
    number: int
    evs: list[int]
    reverse_evs: list[int]
    rtt: RttEstimator
    state: PlaneState = PlaneState.UP
    down_reason: str = ""
    #: UP but under suspicion (an RTO while other planes progressed): being probed.
    suspect: bool = False
    #: A probe went out on this plane and has not been answered yet; when it left.
    probe_outstanding: bool = False
    probe_sent_at: float = 0.0
    #: Probes in a row that went unanswered; three take a suspect plane DOWN.
    unanswered: int = 0
    #: DOWN planes: clean answers in a row toward restoration.
    answers: int = 0
    #: Interval to the next probe (10 ms, doubling to 1 s while a DOWN plane stays silent).
    probe_interval: float = 0.0
    #: Rotation index into reverse_evs for SACKs / probe answers.
    reverse_next: int = 0

    def reverse_ev(self) -> int:
        ev = self.reverse_evs[self.reverse_next % len(self.reverse_evs)]
        self.reverse_next += 1
        return ev


class PathTable:
    """All planes of a connection and their EVs."""

    def __init__(self, config: SessionConfig) -> None:
        self.planes: dict[int, Plane] = {}
        for p in config.planes:
            evs = [make_ev(p, s) for s in range(config.ev_per_plane)]
            self.planes[p] = Plane(
                number=p,
                evs=evs,
                reverse_evs=list(evs),
                rtt=RttEstimator(config.min_rto, config.max_rto, config.initial_rto),
            )
        #: Bumped whenever the set of usable EVs changes, so spray policies can rebuild.
        self.version = 0

    def up_planes(self) -> list[int]:
        return [p.number for p in self.planes.values() if p.state is PlaneState.UP]

    def is_up(self, plane: int) -> bool:
        pl = self.planes.get(plane)
        return pl is not None and pl.state is PlaneState.UP

    def set_state(self, plane: int, state: PlaneState, reason: str = "") -> bool:
        """Change a plane's state; True if it changed."""
        pl = self.planes[plane]
        if pl.state is state:
            return False
        pl.state = state
        pl.down_reason = reason
        pl.answers = 0
        pl.suspect = False
        pl.unanswered = 0
        self.version += 1
        return True

    def set_suspect(self, plane: int, suspect: bool) -> bool:
        """Take an UP plane out of the rotation while it is probed, or put it back."""
        pl = self.planes[plane]
        if pl.suspect == suspect or pl.state is not PlaneState.UP:
            return False
        pl.suspect = suspect
        pl.unanswered = 0
        self.version += 1
        return True

    def active_evs(self) -> dict[int, list[int]]:
        """EVs in rotation, by UP plane that is not under suspicion."""
        return {
            p.number: p.evs
            for p in self.planes.values()
            if p.state is PlaneState.UP and not p.suspect
        }

    def reverse_plane(self, preferred: int) -> int | None:
        """The plane to answer on: the preferred one if UP, else the first UP plane."""
        if self.is_up(preferred):
            return preferred
        up = self.up_planes()
        return up[0] if up else None
