"""Stories of a plane that goes silent while the peer answers on the others (docs/DESIGN.md §6,
mrc/core/silence.py): the sender suspects it, sends it nothing new, stops counting its bytes
against the window and has it probed. And the price a plane that only lags must not pay:
nothing resent, nothing blamed. (The tail probe's stories are in tests/core/test_silence.py.)
"""

from __future__ import annotations

from sim_story import chunks, make_transfer

from mrc.core.events import PathRetired, PlaneDown
from mrc.sim import LinkParams

MiB = 1 << 20


def test_a_plane_silent_at_1gbit_is_taken_down_by_its_own_probes() -> None:
    """32 MiB over four 1 Gbit/s planes; plane 2 silently dies at 10 ms. Suspected once it
    is an SRTT and a reordering window behind, it takes no new flowcell, and the plane
    monitor probes it: three probes unanswered while the peer answers elsewhere take it
    DOWN at 41.0 ms. Before that rule the sender went on spraying it until the peer, whose
    own probes there went unanswered, announced it could not receive on it at 50.1 ms: 863
    packets went into the dead plane (647 now) and 563 were resent (347 now)."""
    params = LinkParams(rate_bps=1e9, latency=20e-6, queue_bytes=8 << 20)

    def build(net, a, b):  # type: ignore[no-untyped-def]
        net.set_link(a, 2, False, at=0.010, notify=False)

    t = make_transfer(messages=chunks(32 * MiB, MiB), size=32 * MiB, build=build, params=params)
    t.run()
    t.assert_placed_exactly_once()
    session = t.a.session()
    stats = session.stats
    assert t.a.events_of(PlaneDown) == [PlaneDown(plane=2, reason="probes unanswered")]
    (down_at,) = [ts for ts, _, e in t.a.events if isinstance(e, PlaneDown)]
    assert round(down_at, 6) == 0.041034
    assert [stats.planes[p].packets_sent for p in range(4)] == [2630, 2630, 647, 2632]
    assert dict(stats.retransmits_by_cause) == {"rto": 344, "plane_down": 3}
    assert stats.probes_answered == 0
    assert len(t.a.events_of(PathRetired)) == 28
    assert t.b.session().stats.drops_by_reason.get("duplicate", 0) == 0


def test_a_plane_read_2ms_late_is_suspected_but_nothing_is_resent_or_blamed() -> None:
    """At 5 ms the responder reads plane 2's socket 2 ms late while it reads the others:
    what a dead plane looks like at first. Plane 2 is suspected (no new flowcell for a
    while, its bytes off the window) and probed once; the probe is answered, and its
    packets are all acknowledged when they are read. Nothing resent, nothing arrives twice,
    no EV retired, every plane up: the same outcome as without the rule."""

    def build(net, a, b):  # type: ignore[no-untyped-def]
        net.at(0.005, lambda: b.lag(2, 0.002))

    t = make_transfer(messages=chunks(64 * MiB, MiB), size=64 * MiB, build=build)
    t.run()
    t.assert_placed_exactly_once()
    session = t.a.session()
    stats = session.stats
    assert dict(stats.retransmits_by_cause) == {}
    assert t.b.session().stats.drops_by_reason.get("duplicate", 0) == 0
    assert t.a.events_of(PathRetired) == [] and t.a.events_of(PlaneDown) == []
    assert (stats.probes_sent, stats.probes_answered) == (1, 1)
    assert [session.plane_state(p) for p in range(4)] == ["up"] * 4
