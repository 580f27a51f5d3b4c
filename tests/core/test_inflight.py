"""The sender's bytes in flight and the room for new packets (mrc.core.send.inflight): the
smallest of the PSN window, the packet cap and CC's window, and per plane NSCC's plane cap
(docs/DESIGN.md §7)."""

from __future__ import annotations

from dataclasses import replace

from mrc.core.cc.control import make_cc
from mrc.core.config import SessionConfig
from mrc.core.send.inflight import InFlight

MTU = 1024
PSN_MOD = 1 << 24
# A 128-PSN window (MPR 1), a 64 KiB window from NSCC, 8 KiB a plane to start.
CONFIG = SessionConfig(
    plane_mask=0b11, payload_mtu=MTU, mpr=1, cc="nscc", cc_max_cwnd=64 * MTU,
    plane_initial_cap=8 * MTU,
)  # fmt: skip


def test_bytes_enter_and_leave_in_all_and_by_plane() -> None:
    flight = InFlight(CONFIG, make_cc("nscc", CONFIG), [], (0, 1))
    flight.add(0, 3000)  # a flowcell
    flight.add(1, MTU)  # a resend
    assert (flight.bytes, flight.planes_now()) == (3000 + MTU, {0: 3000, 1: MTU})
    flight.remove(0, 1000)  # declared lost
    assert (flight.bytes, flight.by_plane) == (2000 + MTU, {0: 2000, 1: MTU})
    # A batch of acknowledgements: the sender took each record's bytes off its plane, then
    # tells the total once.
    flight.by_plane[0] -= 2000
    flight.left(2000)
    assert (flight.bytes, flight.by_plane) == (MTU, {0: 0, 1: MTU})
    # A report is a copy, not the live counts.
    report = flight.planes_now()
    flight.add(0, 10)
    assert report == {0: 0, 1: MTU}


def test_room_is_the_least_of_the_psn_window_the_packet_cap_and_the_window() -> None:
    suspected: dict[int, float] = {}
    records = list(range(10))  # ten PSNs not yet acknowledged
    flight = InFlight(CONFIG, make_cc("nscc", CONFIG), records, (0, 1), suspected)
    # 120 of the 128 PSNs of the window taken, across the PSN wrap (docs/WIRE.md §2); nothing
    # in flight: the PSN window's 8 is the least (the packet cap leaves 118).
    una = PSN_MOD - 8
    next_psn = (una + 120) % PSN_MOD
    assert flight.room(next_psn, una) == 8
    assert flight.room((una + 128) % PSN_MOD, una) == 0
    # 62 KiB in flight of NSCC's 64: two more packets.
    flight.add(0, 60 * MTU)
    flight.add(1, 2 * MTU)
    assert flight.room(next_psn, una) == 2
    flight.add(1, 2 * MTU)
    assert flight.room(next_psn, una) == 0
    # Plane 0 suspected silent (silence.py): its 60 KiB no longer hold the window.
    suspected[0] = 5.0
    assert flight.room(next_psn, una) == 8
    del suspected[0]
    assert flight.room(next_psn, una) == 0
    # The packet cap: max_inflight 12 with ten PSNs unacknowledged leaves two.
    capped = InFlight(replace(CONFIG, max_inflight=12), make_cc("nscc", CONFIG), records, (0, 1))
    assert capped.room(next_psn, una) == 2
    records.extend(range(2))
    assert capped.room(next_psn, una) == 0


def test_a_plane_room_is_narrowed_by_its_own_cap() -> None:
    flight = InFlight(CONFIG, make_cc("nscc", CONFIG), [], (0, 1))
    flight.add(0, 3 * MTU)
    # Plane 0's 8 KiB cap has room for five more packets, plane 1's for eight.
    assert (flight.plane_room(0, 64), flight.plane_room(1, 64)) == (5, 8)
    assert flight.plane_room(0, 2) == 2
    flight.add(0, 5 * MTU)
    assert flight.plane_room(0, 64) == 0
    # Without plane caps (`none`), the room is left as it is.
    none = SessionConfig(plane_mask=0b11, payload_mtu=MTU, cc="none")
    uncapped = InFlight(none, make_cc("none", none), [], (0, 1))
    uncapped.add(0, 100 * MTU)
    assert uncapped.plane_room(0, 7) == 7
