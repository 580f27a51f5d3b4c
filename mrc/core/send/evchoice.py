"""Which EV a packet takes: the next flowcell's, a resend's, and the plane a stall probe goes on.

Holds `EvChoice`, which asks the plane balance (balance.py) and the spray policy (spray.py) and
honours each plane's own cap (NSCC's plane queue guard, read from `InFlight`). What it leaves to
the sender (sender.py): what is sent, its records and its accounting.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from ..paths.balance import PlaneBalance
from ..paths.planes import PlaneTable, ev_plane
from ..paths.spray import SprayPolicy
from .inflight import InFlight


class EvChoice:
    def __init__(
        self, paths: PlaneTable, spray: SprayPolicy, balance: PlaneBalance, flight: InFlight,
        avoid: Container[int] = frozenset(),
    ) -> None:  # fmt: skip
        self.paths = paths
        self.spray = spray
        self.balance = balance
        self.flight = flight
        #: Planes suspected silent (silence.py): no new flowcell and no resend goes there.
        self.avoid = avoid
        # Made once: a bound method built at every flowcell's `next_plane` call cost as much.
        self._is_open: Callable[[int], bool] = self.plane_open

    def plane_open(self, plane: int) -> bool:
        """`plane` is not suspected silent and its own cap lets one more packet go."""
        return plane not in self.avoid and self.flight.plane_room(plane, 1) > 0

    def next_ev(self, now: float) -> int | None:
        """The EV of the next flowcell: on the plane the balance picks, or wherever the spray
        rotation goes next when the balance leaves it to the spray (equal shares). A plane
        at its own cap gives its turn to the next (as a congested plane's EVs are skipped in
        MRC); None when every plane is at its cap."""
        plane = self.balance.next_plane(now, self._is_open)
        if plane is not None:
            return self.spray.next_ev_on(plane, now) if self.plane_open(plane) else None
        for _ in range(4 * len(self.paths.planes)):
            ev = self.spray.next_ev(now)
            if ev is None or self.plane_open(ev_plane(ev)):
                return ev
        return None

    def resend_ev(
        self, avoid_ev: int, avoid_plane: int | None, prefer: int | None, now: float
    ) -> int | None:
        """An EV for a resend: on `prefer` if it has one, else another EV, on a plane with
        room in its own cap if the rotation offers one soon (a burst of resends must not
        overflow a slow plane's queue)."""
        ev = None if prefer is None else self.spray.next_ev_on(prefer, now)
        if ev is not None:
            return ev
        ev = self.spray.other_ev(avoid_ev, avoid_plane, now)
        for _ in range(2 * len(self.paths.planes)):
            if ev is None or self.plane_open(ev_plane(ev)):
                break
            ev = self.spray.other_ev(avoid_ev, avoid_plane, now)
        return ev

    def freshest(self, but: int) -> int | None:
        """The usable plane other than `but` whose answer came last, if any ever came."""
        best, at = None, 0.0
        for n, pl in self.paths.planes.items():
            if n != but and pl.proven_at > at and self.paths.usable(n):
                best, at = n, pl.proven_at
        return best
