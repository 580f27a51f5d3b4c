"""Plane balance: how a connection's new packets are shared between its planes (docs/DESIGN.md §4).

A policy sits behind the small `PlaneBalance` ABC and is chosen by name (`plane_balance` in the
config, `--plane-balance` on the command line):

- `equal` (MRC's rule, the default): every usable plane carries the same share. The spray
  policy's own rotation already interleaves planes packet by packet, so this policy leaves the
  choice to it.
- `adaptive` [beyond MRC]: planes are weighted by their measured delivery rate, for testbeds
  and degraded fabrics whose planes differ. Every epoch (10 ms, or the largest SRTT when
  longer) each plane's delivered bytes give a rate (EWMA); a plane whose acknowledgements come
  back no slower than the others' beyond a margin is probed upward (weight = rate × 1.25), one
  whose own queue grows keeps weight = rate, which is then its capacity. A stride scheduler
  turns the weights into a packet order; a floor keeps every usable plane measured.

It only orders planes: which planes are usable comes from the `PlaneTable`, which EV of a plane
carries a packet from the spray policy, how much may be in flight from the window and CC.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..errors import LocalProtocolError
from .planes import PlaneTable

#: Adaptive: the shortest epoch, the probing gain, a plane's least share of the total weight,
#: and the delay margin (absolute floor, fraction of the fastest plane's RTT) that marks a
#: plane's own queue.
EPOCH: Final = 0.010
PROBE_GAIN: Final = 1.25
MIN_SHARE: Final = 0.02
MARGIN_FLOOR: Final = 0.0005
MARGIN_FRACTION: Final = 0.25
RATE_EWMA: Final = 0.5


def always_open(plane: int) -> bool:
    """No plane has a cap of its own."""
    return True


class PlaneBalance(ABC):
    def __init__(self, paths: PlaneTable) -> None:
        self.paths = paths

    @abstractmethod
    def next_plane(self, now: float, is_open: Callable[[int], bool] = always_open) -> int | None:
        """The plane for the next new packet; None leaves it to the spray policy.
        `is_open(plane)`: the plane has room in its own cap (planeq.py) now."""

    def on_acked(self, plane: int, nbytes: int, rtt: float, now: float) -> None:  # noqa: B027
        """An acknowledgement newly covered `nbytes` sent on `plane`; the oldest took `rtt`."""

    def shares(self) -> dict[int, float]:
        """Each usable plane's intended share of new packets (for reports)."""
        planes = self.paths.active_evs()
        return {p: 1 / len(planes) for p in planes} if planes else {}


class EqualBalance(PlaneBalance):
    """MRC's rule: equal shares (the spray rotation interleaves the planes)."""

    def next_plane(self, now: float, is_open: Callable[[int], bool] = always_open) -> int | None:
        return None


@dataclass(slots=True)
class _PlaneRate:
    rate: float | None = None  # bytes per second, EWMA over epochs
    weight: float = 1.0
    pass_: float = 0.0  # stride scheduler position
    bytes: int = 0  # delivered this epoch
    rtt_sum: float = 0.0
    rtt_n: int = 0
    base_rtt: float | None = None


class AdaptiveBalance(PlaneBalance):
    """Planes weighted by their measured delivery rate, probed upward while uncongested."""

    def __init__(self, paths: PlaneTable) -> None:
        super().__init__(paths)
        self._planes: dict[int, _PlaneRate] = {}
        self._usable: list[int] = []
        self._version = -1
        self._epoch_start: float | None = None

    def _state(self, plane: int) -> _PlaneRate:
        st = self._planes.get(plane)
        if st is None:
            st = self._planes[plane] = _PlaneRate()
        return st

    def next_plane(self, now: float, is_open: Callable[[int], bool] = always_open) -> int | None:
        if self._version != self.paths.version:
            usable = sorted(p for p, evs in self.paths.active_evs().items() if evs)
            # A plane that (re)joins starts level with the others, not with a burst.
            floor = min((self._state(p).pass_ for p in self._usable if p in usable), default=0.0)
            for p in usable:
                if p not in self._usable:
                    self._state(p).pass_ = floor
            self._usable = usable
            self._version = self.paths.version
        if not self._usable:
            return None
        if self._epoch_start is None:
            self._epoch_start = now
        planes = self._planes
        best = min(self._usable, key=lambda p: planes[p].pass_)
        if not is_open(best):
            # A plane at its own cap gives its turn to the others (the sender waits if all
            # are). Asked only then: this runs once per flowcell.
            open_planes = [p for p in self._usable if p != best and is_open(p)]
            if open_planes:
                best = min(open_planes, key=lambda p: planes[p].pass_)
        st = planes[best]
        st.pass_ += 1.0 / st.weight
        return best

    def on_acked(self, plane: int, nbytes: int, rtt: float, now: float) -> None:
        st = self._state(plane)
        st.bytes += nbytes
        st.rtt_sum += rtt
        st.rtt_n += 1
        if st.base_rtt is None or rtt < st.base_rtt:
            st.base_rtt = rtt
        start = self._epoch_start
        if start is None:
            self._epoch_start = now
            return
        srtt = max((p.rtt.srtt or 0.0 for p in self.paths.planes.values()), default=0.0)
        if now - start >= max(EPOCH, srtt):
            self._end_epoch(now - start)
            self._epoch_start = now

    def _end_epoch(self, seconds: float) -> None:
        planes = [self._planes[p] for p in self._usable if p in self._planes]
        sampled = [st for st in planes if st.rtt_n]
        if sampled:
            # Queueing of a plane's own: its delay above its base, beyond the least such
            # delay among the planes (a busy host delays every plane alike).
            excess = {id(st): st.rtt_sum / st.rtt_n - (st.base_rtt or 0.0) for st in sampled}
            least = min(excess.values())
            fastest = min(st.rtt_sum / st.rtt_n for st in sampled)
            margin = max(MARGIN_FLOOR, MARGIN_FRACTION * fastest)
            for st in sampled:
                sample = st.bytes / seconds
                st.rate = sample if st.rate is None else (
                    RATE_EWMA * st.rate + (1 - RATE_EWMA) * sample
                )
                congested = excess[id(st)] - least > margin
                st.weight = max(st.rate, 1.0) * (1.0 if congested else PROBE_GAIN)
        total = sum(st.weight for st in planes)
        for st in planes:
            st.weight = max(st.weight, MIN_SHARE * total)
        # Weights become shares, and every plane's stride restarts level with the others,
        # so the new weights take effect at once whatever the old ones were.
        total = sum(st.weight for st in planes)
        for st in planes:
            st.weight /= total
            st.pass_ = 0.0
            st.bytes, st.rtt_sum, st.rtt_n = 0, 0.0, 0

    def shares(self) -> dict[int, float]:
        planes = {p: self._planes[p].weight for p in self._usable if p in self._planes}
        total = sum(planes.values())
        return {p: w / total for p, w in planes.items()} if total else super().shares()


BalanceFactory = Callable[[PlaneTable], PlaneBalance]

_REGISTRY: Final[dict[str, BalanceFactory]] = {"equal": EqualBalance, "adaptive": AdaptiveBalance}


def balance_names() -> list[str]:
    return sorted(_REGISTRY)


def make_balance(name: str, paths: PlaneTable) -> PlaneBalance:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise LocalProtocolError(
            f"unknown plane balance {name!r} (known: {', '.join(balance_names())})"
        ) from None
    return factory(paths)
