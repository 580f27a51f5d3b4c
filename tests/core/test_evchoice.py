"""Which EV a packet takes (mrc.core.send.evchoice): the plane balance's pick or the spray
rotation, past planes at their own cap or suspected silent; resends off the EV and plane that
lost them; the plane that answered last for a stall probe (docs/DESIGN.md §4, §6)."""

from __future__ import annotations

import random
from collections import Counter

from mrc.core.cc.control import make_cc
from mrc.core.config import SessionConfig
from mrc.core.paths.balance import make_balance
from mrc.core.paths.planes import PlaneState, PlaneTable, ev_plane
from mrc.core.paths.spray import make_spray
from mrc.core.send.evchoice import EvChoice
from mrc.core.send.inflight import InFlight

MTU = 1024
T = 1.0
# Four planes of 8 EVs; NSCC caps each plane at 4 packets to start.
CONFIG = SessionConfig(
    plane_mask=0b1111, ev_per_plane=8, payload_mtu=MTU, cc="nscc", cc_max_cwnd=256 * MTU,
    plane_initial_cap=4 * MTU,
)  # fmt: skip


class Setup:
    def __init__(self, balance: str) -> None:
        self.paths = PlaneTable(CONFIG, random.Random(3))
        spray = make_spray("bitmap", self.paths, random.Random(4))
        #: Planes suspected silent, as silence.py keeps them.
        self.suspected: dict[int, float] = {}
        self.flight = InFlight(
            CONFIG, make_cc("nscc", CONFIG), [], self.paths.planes, self.suspected
        )
        self.choice = EvChoice(
            self.paths, spray, make_balance(balance, self.paths), self.flight, self.suspected
        )

    def planes_of_next(self, count: int) -> Counter[int | None]:
        evs = [self.choice.next_ev(T) for _ in range(count)]
        return Counter(None if ev is None else ev_plane(ev) for ev in evs)


def test_the_rotation_passes_planes_at_their_cap_or_suspected_and_waits_when_all_are() -> None:
    s = Setup("equal")
    assert s.planes_of_next(40) == {0: 10, 1: 10, 2: 10, 3: 10}
    s.flight.add(1, 4 * MTU)  # plane 1 at its cap
    s.suspected[2] = T + 0.05
    assert not s.choice.plane_open(1) and not s.choice.plane_open(2)
    assert s.planes_of_next(40) == {0: 20, 3: 20}
    s.flight.add(0, 4 * MTU)
    s.flight.add(3, 4 * MTU)
    assert s.choice.next_ev(T) is None
    # Plane 2's suspicion ends: it is the one plane left.
    del s.suspected[2]
    assert s.planes_of_next(8) == {2: 8}


def test_a_balanced_plane_at_its_cap_gives_its_turn_to_the_others() -> None:
    s = Setup("adaptive")
    assert s.planes_of_next(8) == {0: 2, 1: 2, 2: 2, 3: 2}
    s.flight.add(1, 4 * MTU)
    assert s.planes_of_next(9) == {0: 3, 2: 3, 3: 3}
    for plane in (0, 2, 3):
        s.flight.add(plane, 4 * MTU)
    assert s.choice.next_ev(T) is None


def test_a_resend_goes_on_its_preferred_plane_else_off_the_ev_and_plane_that_lost_it() -> None:
    s = Setup("equal")
    # A packet lost on an EV of plane 0.
    lost_ev = next(ev for ev in iter(lambda: s.choice.next_ev(T), None) if ev_plane(ev) == 0)
    preferred = s.choice.resend_ev(lost_ev, 0, 3, T)
    assert preferred is not None and ev_plane(preferred) == 3
    # No preference: never plane 0 (the lost EV's), never plane 1 (at its cap).
    s.flight.add(1, 4 * MTU)
    resends = [s.choice.resend_ev(lost_ev, 0, None, T) for _ in range(40)]
    assert Counter(None if ev is None else ev_plane(ev) for ev in resends) == {2: 20, 3: 20}
    # Every other plane at its cap: the resend still goes (off plane 0), caps only shape it.
    for plane in (2, 3):
        s.flight.add(plane, 4 * MTU)
    late = [s.choice.resend_ev(lost_ev, 0, None, T) for _ in range(12)]
    assert all(ev is not None and ev_plane(ev) in (1, 2, 3) for ev in late)


def test_the_stall_probe_plane_is_the_usable_one_that_answered_last() -> None:
    s = Setup("equal")
    planes = s.paths.planes
    assert s.choice.freshest(0) is None  # nothing answered yet
    planes[0].proven_at, planes[1].proven_at, planes[2].proven_at = 1.0, 1.5, 1.2
    assert (s.choice.freshest(1), s.choice.freshest(0)) == (2, 1)
    s.paths.set_state(1, PlaneState.DOWN, "test")
    assert s.choice.freshest(0) == 2
