"""Spray policies: which EV carries the next packet (docs/DESIGN.md §4).

A policy sits behind the small `SprayPolicy` ABC and is chosen by name from a registry, like
aioquic's congestion controllers. Policies only order EVs: which EVs are in rotation comes from
the `PlaneTable` (plane states) and its `EvTable` (EV states), re-read whenever their `version`
changes. Retirement on loss is MRC's rule and lives in the EV table, so every policy here runs
with it; the policies differ in how they use GOOD and SKIP EVs:

- `oblivious`: a fresh pseudo-random order each round, planes taking turns packet by packet
  (equal plane shares); a SKIP EV is passed over once, for that one rotation;
- `bitmap` (UEC's skip counters, the default): the same rotation, but an EV's skip counter
  (ECN +1, TRIMMED +4, a loss at the floor = 15) is decremented each time the rotation lands
  on it, and it is skipped until the counter is 0, at most one round of skips per pick;
- `reps` (recycled entropy): reuse EVs whose packets came back clean (oldest first), else
  explore a random EV (planes still taking turns); after a loss, freeze on known-good EVs for
  10 ms, then explore 16 random EVs.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

from ..errors import LocalProtocolError
from .evs import EvState
from .planes import PlaneTable, ev_plane

#: REPS (docs/DESIGN.md §4): freeze after a loss, then explore this many EVs.
REPS_FREEZE: Final = 0.010
REPS_EXPLORE: Final = 16

T = TypeVar("T")


def shuffle(rng: random.Random, x: list[T]) -> None:
    """`rng.shuffle(x)`, the same permutation from the same state (CPython's Fisher-Yates
    with `getrandbits` rejection sampling), in compiled code: the interpreted one cost a
    quarter of choosing a flowcell's EV."""
    getrandbits = rng.getrandbits
    for i in range(len(x) - 1, 0, -1):
        n = i + 1
        k = n.bit_length()
        j = getrandbits(k)
        while j >= n:
            j = getrandbits(k)
        x[i], x[j] = x[j], x[i]


class SprayPolicy(ABC):
    def __init__(self, paths: PlaneTable, rng: random.Random) -> None:
        self.paths = paths
        self.evs = paths.evs
        self.rng = rng

    @abstractmethod
    def next_ev(self, now: float) -> int | None:
        """The EV for the next packet, or None when no plane is usable."""

    @abstractmethod
    def next_ev_on(self, plane: int, now: float) -> int | None:
        """The EV for the next packet on `plane` (a plane balance chose it), or None."""

    def on_acked(self, evs: Iterable[int], ce_ev: int | None, now: float) -> None:  # noqa: B027
        """First transmissions on `evs` were acknowledged; `ce_ev` came back ECN-marked."""

    def on_loss(self, ev: int, now: float) -> None:  # noqa: B027
        """A packet sent on `ev` was declared lost (RACK or RTO)."""

    def other_ev(self, avoid_ev: int, avoid_plane: int | None, now: float) -> int | None:
        """An EV for a retransmission: not `avoid_ev`, and off `avoid_plane` when possible."""
        first = None
        for _ in range(64):
            ev = self.next_ev(now)
            if ev is None:
                return None
            if first is None:
                first = ev
            if ev != avoid_ev and (avoid_plane is None or ev_plane(ev) != avoid_plane):
                return ev
        if avoid_plane is not None:
            return self.other_ev(avoid_ev, None, now)
        return first


class ObliviousSpray(SprayPolicy):
    """Rotate through every EV of every usable plane in a fresh pseudo-random order per round."""

    #: Skips an EV's counter loses when the rotation lands on it (None = all of them).
    step: int | None = None

    def __init__(self, paths: PlaneTable, rng: random.Random) -> None:
        super().__init__(paths, rng)
        self._round: deque[int] = deque()
        self._version = -1
        self._size = 0
        #: One rotation per plane, for packets a plane balance placed (`next_ev_on`).
        self._plane_rounds: dict[int, deque[int]] = {}
        self._plane_version = -1

    def _refill(self) -> None:
        active = self.paths.active_evs()
        columns: list[list[int]] = []
        depth = 0
        for plane in sorted(active):
            evs = list(active[plane])
            shuffle(self.rng, evs)
            columns.append(evs)
            depth = max(depth, len(evs))
        shuffle(self.rng, columns)
        rnd = self._round
        for i in range(depth):
            for c in columns:
                if i < len(c):
                    rnd.append(c[i])
        self._size = len(rnd)
        self._version = self.paths.version

    def _next(self) -> int | None:
        if self._version != self.paths.version:
            self._round.clear()
        if not self._round:
            self._refill()
            if not self._round:
                return None
        return self._round.popleft()

    def next_ev(self, now: float) -> int | None:
        # Once per flowcell: the common case (the rotation's next EV, not penalised) without
        # `_pick`'s bound method and loop; otherwise `_pick` goes on where this left off.
        if self._round and self._version == self.paths.version:
            ev = self._round.popleft()
            if not self.evs.by_ev[ev].penalty:
                return ev
            self.evs.pass_over(ev, now=now, whole=self.step is None)
            return self._pick(self._next, self._size - 1, now)
        return self._pick(self._next, self._size, now)

    def _pick(self, take: Callable[[], int | None], size: int, now: float) -> int | None:
        by_ev = self.evs.by_ev
        ev = take()
        # A penalised EV is passed over; after a whole round of skips the next one goes anyway.
        for _ in range(size):
            if ev is None:
                return None
            if not by_ev[ev].penalty:
                return ev
            self.evs.pass_over(ev, now=now, whole=self.step is None)
            ev = take()
        return ev

    def next_ev_on(self, plane: int, now: float) -> int | None:
        if self._plane_version != self.paths.version:
            self._plane_rounds.clear()
            self._plane_version = self.paths.version
        rounds = self._plane_rounds.setdefault(plane, deque())

        def take() -> int | None:
            if not rounds:
                evs = self.evs.rotation(plane) if self.paths.usable(plane) else []
                shuffle(self.rng, evs)
                rounds.extend(evs)
            return rounds.popleft() if rounds else None

        return self._pick(take, len(self.evs.rotation(plane)), now)


class BitmapSpray(ObliviousSpray):
    """UEC's skip-counter policy with MRC's retirement rule (the default)."""

    # Typed as in ObliviousSpray: a compiled subclass may not narrow an attribute's type.
    step: int | None = 1


class RepsSpray(SprayPolicy):
    """Recycled entropy (REPS): reuse EVs that came back clean, explore otherwise."""

    def __init__(self, paths: PlaneTable, rng: random.Random) -> None:
        super().__init__(paths, rng)
        self._recycled: deque[int] = deque()
        self._cap = max(8, 2 * len(paths.planes))
        self._freeze_until: float | None = None
        self._explore = 0
        self._version = -1
        self._planes: list[list[int]] = []
        self._turn = 0

    def _usable(self, ev: int) -> bool:
        rec = self.evs.by_ev.get(ev)
        return (
            rec is not None
            and rec.active
            and rec.state is EvState.GOOD
            and self.paths.usable(rec.plane)
        )

    def _random_ev(self) -> int | None:
        if self._version != self.paths.version:
            self._planes = [evs for evs in self.paths.active_evs().values() if evs]
            self._version = self.paths.version
        if not self._planes:
            return None
        self._turn = (self._turn + 1) % len(self._planes)
        return self.rng.choice(self._planes[self._turn])

    def _recycle(self) -> int | None:
        while self._recycled:
            ev = self._recycled.popleft()
            if self._usable(ev):
                return ev
        return None

    def next_ev(self, now: float) -> int | None:
        if self._freeze_until is not None:
            if now < self._freeze_until:
                ev = self._recycle()
                return ev if ev is not None else self._random_ev()
            self._freeze_until = None
            self._recycled.clear()
            self._explore = REPS_EXPLORE
        if self._explore:
            self._explore -= 1
            return self._random_ev()
        ev = self._recycle()
        return ev if ev is not None else self._random_ev()

    def next_ev_on(self, plane: int, now: float) -> int | None:
        if self._freeze_until is not None and now >= self._freeze_until:
            self._freeze_until = None
            self._recycled.clear()
            self._explore = REPS_EXPLORE
        recycled = self._recycled
        if self._explore:
            self._explore -= 1
        else:
            for i, ev in enumerate(recycled):
                if ev_plane(ev) == plane and self._usable(ev):
                    del recycled[i]
                    return ev
        evs = self.evs.rotation(plane) if self.paths.usable(plane) else []
        return self.rng.choice(evs) if evs else None

    def on_acked(self, evs: Iterable[int], ce_ev: int | None, now: float) -> None:
        recycled = self._recycled
        for ev in evs:
            if ev != ce_ev and len(recycled) < self._cap:
                recycled.append(ev)

    def on_loss(self, ev: int, now: float) -> None:
        self._freeze_until = now + REPS_FREEZE


SprayFactory = Callable[[PlaneTable, random.Random], SprayPolicy]

_REGISTRY: Final[dict[str, SprayFactory]] = {
    "oblivious": ObliviousSpray,
    "bitmap": BitmapSpray,
    "reps": RepsSpray,
}


def register_spray(name: str, factory: SprayFactory) -> None:
    _REGISTRY[name] = factory


def spray_names() -> list[str]:
    return sorted(_REGISTRY)


def make_spray(name: str, paths: PlaneTable, rng: random.Random) -> SprayPolicy:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise LocalProtocolError(
            f"unknown spray policy {name!r} (known: {', '.join(spray_names())})"
        ) from None
    return factory(paths, rng)
