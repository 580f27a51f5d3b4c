"""A flap that takes flowcells of two planes in one burst, in explicit time (mrc.core.loss.rto,
docs/DESIGN.md §6): the peer answered what was sent after them on the other planes, so each
plane's silence is its own loss, not a stalled peer.

tools.job's `flap` schedule (a tier-0 to tier-1 link of each plane down half of every second,
the planes a quarter period apart) has two planes down at once. Before, each of the two planes'
RTOs took the other's overdue packet for a stalled peer, so the lost packets went out as stall
probes, one per backed-off RTO: an all-reduce step over the daemons waited past its 5 s timeout.
"""

from __future__ import annotations

from sim_story import chunks, make_transfer

from mrc.core.events import PathRetired, PlaneDown

MiB = 1 << 20


def test_two_planes_blackholed_in_one_burst_are_each_found_silent_at_their_first_rto() -> None:
    """8 MiB over four 10 Gbit/s planes (done at 1.77 ms unharmed); plane 1 is silently
    blackholed from 1.3 to 1.8 ms and plane 2 from 1.4 to 1.9 ms, so the last flowcells of
    both are lost while planes 0 and 3 carry the rest of the burst to the peer. At their
    first RTO (6.3 and 6.4 ms) both planes are found silent: their packets go out again, and
    the transfer ends at 6.77 ms. Before, plane 1's expiry at 6.77 ms sent a stall probe and
    plane 2's backed off, then again at 11.8, 21.8, 26.9, 36.9 and 56.9 ms (three probes of
    one packet each) until both were found silent at 61.9 ms: the transfer ended at 62.3 ms."""

    def build(net, a, b):  # type: ignore[no-untyped-def]
        net.set_link(a, 1, False, at=0.0013, notify=False)
        net.set_link(a, 1, True, at=0.0018, notify=False)
        net.set_link(a, 2, False, at=0.0014, notify=False)
        net.set_link(a, 2, True, at=0.0019, notify=False)

    t = make_transfer(messages=chunks(8 * MiB, MiB), size=8 * MiB, build=build)
    t.run()
    t.assert_placed_exactly_once()
    assert [c.status for c in t.completions] == [0] * 8
    assert round(t.net.now, 6) == 0.006765
    session = t.a.session()
    # Every lost packet resent once, by the RTO that found its plane silent; none arrived twice.
    assert dict(session.stats.retransmits_by_cause) == {"rto": 246}
    assert not t.b.session().stats.drops_by_reason
    # The paths the flap cut are retired (their probes bring them back); no plane goes DOWN.
    assert len(t.a.events_of(PathRetired)) == 32 and t.a.events_of(PlaneDown) == []
