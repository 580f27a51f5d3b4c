"""Stories of a plane that goes silent while the peer answers on the others (docs/DESIGN.md §6,
mrc/core/loss/silence.py): the sender suspects it, sends it nothing new, stops counting its bytes
against the window and has it probed. And what a plane that only lags pays: nothing
blamed, and its packets resent only once they close the window. (The tail probe's
stories are in tests/core/test_silence.py.)
"""

from __future__ import annotations

from sim_story import chunks, make_transfer

from mrc.core.events import PathRetired, PlaneDown
from mrc.sim import LinkParams

MiB = 1 << 20


def test_a_plane_silent_at_1gbit_gets_little_and_is_taken_down() -> None:
    """32 MiB over four 1 Gbit/s planes; plane 2 silently dies at 10 ms. Suspected once it
    is an SRTT and a reordering window behind, it takes no new flowcell until it answers
    (or four RTOs pass), its RTO restarts its cap, and the plane monitor probes it. The
    peer, whose own probes there go unanswered, announces it cannot receive there at
    50.1 ms. 482 packets went into the dead plane and 182 were resent (647 and 347 when a
    suspicion lasted one RTO and the cap stayed; 863 and 563 before the suspicion rule). The
    live planes carry equal shares; before the responder answered a message with one datagram
    (docs/DESIGN.md §6) it sent 365 answers more, one ACK was lost behind the dead plane's
    traffic and resent for (`completion`), and the shares were 2653, 2659 and 2581."""
    params = LinkParams(rate_bps=1e9, latency=20e-6, queue_bytes=8 << 20)

    def build(net, a, b):  # type: ignore[no-untyped-def]
        net.set_link(a, 2, False, at=0.010, notify=False)

    t = make_transfer(messages=chunks(32 * MiB, MiB), size=32 * MiB, build=build, params=params)
    t.run()
    t.assert_placed_exactly_once()
    session = t.a.session()
    stats = session.stats
    assert t.a.events_of(PlaneDown) == [PlaneDown(plane=2, reason="peer cannot receive")]
    (down_at,) = [ts for ts, _, e in t.a.events if isinstance(e, PlaneDown)]
    assert round(down_at, 6) == 0.050115
    assert [stats.planes[p].packets_sent for p in range(4)] == [2630, 2631, 482, 2631]
    assert dict(stats.retransmits_by_cause) == {"rto": 182}
    assert stats.probes_answered == 0
    assert len(t.a.events_of(PathRetired)) == 28
    # No LAST went again for an overdue AETH, so nothing arrived twice (before: one did).
    assert t.b.session().stats.drops_by_reason.get("duplicate", 0) == 0


def test_a_plane_read_2ms_late_closing_the_window_is_resent_but_nothing_is_blamed() -> None:
    """At 5 ms the responder reads plane 2's socket 2 ms late while it reads the others:
    what a dead plane looks like at first. Plane 2 is suspected (no new flowcell for a
    while, its bytes off the window) and probed once; the probe is answered. Its packets
    close the PSN window, and once the other planes have had everything answered and a
    reordering window passed, the sender resends them elsewhere (the price of a blackhole
    failover under 10 ms on real sockets: mrc/core/send/sender.py `_resend_silent`): all 256
    arrive twice. Nothing is blamed: no EV retired, every plane up."""

    def build(net, a, b):  # type: ignore[no-untyped-def]
        net.at(0.005, lambda: b.lag(2, 0.002))

    t = make_transfer(messages=chunks(64 * MiB, MiB), size=64 * MiB, build=build)
    t.run()
    t.assert_placed_exactly_once()
    session = t.a.session()
    stats = session.stats
    assert dict(stats.retransmits_by_cause) == {"silent": 256}
    assert t.b.session().stats.drops_by_reason.get("duplicate", 0) == 256
    assert t.a.events_of(PathRetired) == [] and t.a.events_of(PlaneDown) == []
    assert (stats.probes_sent, stats.probes_answered) == (1, 1)
    assert [session.plane_state(p) for p in range(4)] == ["up"] * 4
