"""The text report's event lines (mrc/cli/bench/events.py): bursts fold, flaps read as one line."""

from __future__ import annotations

from typing import Any

from mrc.cli.bench.events import FLAP_NOTE, event_lines


def ev(t: float, kind: str, plane: int | None = 2, detail: str = "", side: str = "local",
       ev: int | None = None) -> dict[str, Any]:  # fmt: skip
    return {"t": t, "event": kind, "plane": plane, "ev": ev, "detail": detail, "side": side}


def test_the_demo_burst_of_retirements_is_one_line() -> None:
    # What `make demo` recorded: the fault, 13 EVs retired at 0.277 s, one at 0.289 s, twelve
    # at 0.294 s, then the plane goes down and the peer announces its port down.
    events = [ev(0.257, "fault", detail="plane-down injected (40% of the bytes sent)")]
    events += [ev(0.277, "path-retired", detail="timeout", ev=i) for i in range(13)]
    events += [ev(0.289, "path-retired", detail="timeout", ev=13)]
    events += [ev(0.294, "path-retired", detail="timeout", ev=i) for i in range(14, 26)]
    events += [ev(0.309, "plane-down", detail="peer cannot receive")]
    events += [ev(0.311, "port-down", side="remote", detail="announced to the peer")]
    assert event_lines(events) == [
        "event:   0.257 s  plane 2: plane-down injected (40% of the bytes sent)",
        "event:   0.277 s  26 EVs retired on plane 2 (timeout) over 17 ms",
        "event:   0.309 s  plane 2 down: peer cannot receive",
        "event:   0.311 s  plane 2: the peer told us it cannot receive",
    ]


def test_bursts_split_by_plane_reason_and_time() -> None:
    events = [
        ev(1.000, "path-retired", plane=0, detail="timeout"),
        ev(1.001, "path-retired", plane=1, detail="timeout"),
        ev(1.002, "path-retired", plane=0, detail="loss"),
        ev(1.040, "path-retired", plane=0, detail="timeout"),
        # 60 ms after the first of its burst: a new burst.
        ev(1.060, "path-retired", plane=0, detail="timeout"),
        ev(1.500, "path-restored", plane=0),
        ev(1.510, "path-restored", plane=0),
    ]
    assert event_lines(events) == [
        "event:   1.000 s  2 EVs retired on plane 0 (timeout) over 40 ms",
        "event:   1.001 s  1 EV retired on plane 1 (timeout)",
        "event:   1.002 s  1 EV retired on plane 0 (loss)",
        "event:   1.060 s  1 EV retired on plane 0 (timeout)",
        "event:   1.500 s  2 EVs restored on plane 0 (answered their probes) over 10 ms",
    ]


def test_a_flapping_plane_is_one_line_and_explained_once() -> None:
    events = [
        ev(0.309, "plane-down", detail="peer cannot receive"),
        ev(0.3095, "plane-up"),
        ev(0.310, "plane-down", detail="probes unanswered"),
        ev(0.400, "plane-up", plane=1),
        # Another flap later: one line, no second explanation.
        ev(2.000, "plane-down", plane=3, detail="local send error"),
        ev(2.010, "plane-up", plane=3),
    ]
    assert event_lines(events) == [
        "event:   0.309 s  plane 2 down: probes unanswered (flapped down → up → down over 1 ms)",
        FLAP_NOTE,
        "event:   0.400 s  plane 1 up again",
        "event:   2.000 s  plane 3 up (flapped down → up over 10 ms)",
    ]


def test_local_port_announcements_and_peer_events_say_whose_they_are() -> None:
    events = [
        ev(0.5, "port-down", detail="announced to the peer"),
        ev(0.9, "port-up", detail="announced to the peer"),
        ev(1.0, "plane-down", plane=1, side="remote", detail="probes unanswered"),
        ev(1.2, "something-new", plane=None, detail="from a newer peer"),
    ]
    assert event_lines(events) == [
        "event:   0.500 s  plane 2: we told the peer we cannot receive",
        "event:   0.900 s  plane 2: we told the peer we can receive",
        "event:   1.000 s  plane 1 down: probes unanswered (peer)",
        "event:   1.200 s  something-new all planes: from a newer peer",
    ]


def test_no_two_lines_of_a_burst_repeat() -> None:
    events = [ev(0.1 + i * 0.001, "path-retired", detail="timeout", ev=i) for i in range(40)]
    lines = event_lines(events)
    assert lines == ["event:   0.100 s  40 EVs retired on plane 2 (timeout) over 39 ms"]
