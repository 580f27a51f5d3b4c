"""Spray policies: which EV carries the next packet (DESIGN.md §4).

A policy sits behind the small `SprayPolicy` ABC and is chosen by name from a registry, like
aioquic's congestion controllers. Policies only order EVs; which EVs are usable comes from the
`PathTable` (states, planes) and is re-read whenever its `version` changes.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

from .errors import LocalProtocolError
from .paths import PathTable, ev_plane


class SprayPolicy(ABC):
    def __init__(self, paths: PathTable, rng: random.Random) -> None:
        self.paths = paths
        self.rng = rng

    @abstractmethod
    def next_ev(self) -> int | None:
        """The EV for the next packet, or None when no plane is usable."""

    def other_ev(self, avoid_ev: int, avoid_plane: int | None = None) -> int | None:
        """An EV for a retransmission: not `avoid_ev`, and off `avoid_plane` when possible."""
        first = None
        for _ in range(64):
            ev = self.next_ev()
            if ev is None:
                return None
            if first is None:
                first = ev
            if ev != avoid_ev and (avoid_plane is None or ev_plane(ev) != avoid_plane):
                return ev
        if avoid_plane is not None:
            return self.other_ev(avoid_ev)
        return first


class ObliviousSpray(SprayPolicy):
    """Rotate through every EV of every UP plane in a fresh pseudo-random order each round.

    Planes take turns packet by packet, so each carries an equal share (MRC's rule for
    symmetric fabrics); inside a plane the EV order is shuffled per round.
    """

    def __init__(self, paths: PathTable, rng: random.Random) -> None:
        super().__init__(paths, rng)
        self._round: deque[int] = deque()
        self._version = -1

    def _refill(self) -> None:
        active = self.paths.active_evs()
        columns = []
        for plane in sorted(active):
            evs = list(active[plane])
            self.rng.shuffle(evs)
            columns.append(evs)
        self.rng.shuffle(columns)
        depth = max((len(c) for c in columns), default=0)
        self._round.extend(c[i] for i in range(depth) for c in columns if i < len(c))
        self._version = self.paths.version

    def next_ev(self) -> int | None:
        if self._version != self.paths.version:
            self._round.clear()
        if not self._round:
            self._refill()
            if not self._round:
                return None
        return self._round.popleft()


_REGISTRY: dict[str, Callable[[PathTable, random.Random], SprayPolicy]] = {
    "oblivious": ObliviousSpray,
}


def register_spray(name: str, factory: Callable[[PathTable, random.Random], SprayPolicy]) -> None:
    _REGISTRY[name] = factory


def spray_names() -> list[str]:
    return sorted(_REGISTRY)


def make_spray(name: str, paths: PathTable, rng: random.Random) -> SprayPolicy:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise LocalProtocolError(
            f"unknown spray policy {name!r} (known: {', '.join(spray_names())})"
        ) from None
    return factory(paths, rng)
