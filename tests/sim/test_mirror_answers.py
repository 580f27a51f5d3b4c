"""Answers take the mirror of the path their data just proved (mrc/core/recv/replies.py
`route`, docs/DESIGN.md §4 "Reverse path"), in explicit time on a simulated Clos.

tools.job's `flap` schedule takes one tier-0 to tier-1 link of a plane down, both ways. The
writer retires the EVs whose packets it loses there at its first RTO; the responder, which sends
only answers, learns that one of its reverse EVs sits on the dead link only when two EV_PROBEs
in a row go unanswered. Before, its SACKs and ACKs took the plane's reverse EVs in turn, so
every other answer on that plane was lost until then, and each lost ACK cost the writer an RTO
and a completion resend.
"""

from __future__ import annotations

from typing import Any

from sim_story import REPLY

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, Event, WriteCompleted
from mrc.core.session import Session
from mrc.sim.link import LinkParams
from mrc.sim.network import Host, Network
from mrc.sim.topology import clos

MiB = 1 << 20


def _one_at_a_time(until: float, down_at: float) -> tuple[list[tuple[float, float]], Any, Any]:
    """h0 writes 1 MiB into h3 (the other rack), the next WRITE 2 ms after each completion,
    until `until`; plane 0's link from h0's tier-0 to its first tier-1 dies at `down_at`."""
    took: list[tuple[float, float]] = []
    posted = [0.0]
    remote: list[int] = []

    def post(session: Session) -> None:
        posted[0] = net.now
        session.post_write(src, 0, MiB, remote[0], remote[1], None)
        a.flush(session)

    def on_event(host: Host, session: Session, event: Event) -> None:
        if isinstance(event, ConnectionEstablished):
            remote.extend(REPLY.unpack(event.private_data))
            post(session)
        elif isinstance(event, WriteCompleted):
            assert event.status == 0
            took.append((posted[0], net.now - posted[0]))
            if net.now < until:
                net.at(net.now + 0.002, lambda: post(session))

    net = Network(seed=3)
    link = LinkParams(rate_bps=10e9, latency=5e-6, queue_bytes=8 << 20)
    fab = clos(net, planes=4, racks=2, hosts_per_rack=2, tier1=2, host_link=link,
               fabric_link=link, handlers={"h0": on_event})  # fmt: skip
    a, b = fab.hosts[0], fab.hosts[3]
    src = a.regions.register(bytearray(MiB))
    dst = b.regions.register(bytearray(MiB))
    cfg = SessionConfig(plane_mask=0b1111, cc_min_base_rtt=0.0, flowcell=1,
                        plane_paths=fab.plane_paths)  # fmt: skip
    b.listen(cfg, accept=lambda _pd: REPLY.pack(dst.base_va, dst.rkey))
    a.connect(b, cfg)
    dead = fab.link(fab.tier0[0][0], fab.tier1[0][0])
    net.set_cable(dead, False, at=down_at, notify=False)
    net.drive(until + 0.1)
    return took, a.session(), fab.link(fab.tier1[0][0], fab.tier0[0][0])


def test_answers_avoid_a_tier1_link_that_died_by_taking_the_path_their_data_proved() -> None:
    """0.2 s of 1 MiB WRITEs one at a time (each 0.26 ms unharmed); at 50 ms plane 0's link
    to its first tier-1 dies both ways. The WRITE in flight loses its packets on the dead EVs
    and completes after one RTO, which retires those EVs; one more (at 61.8 ms) meets a dead EV
    that carried nothing the first time, and is retired the same way. From then on every WRITE
    takes under 0.5 ms: the answers on plane 0 mirror the EVs their data came in on, which avoid the
    dead link, so no ACK is lost and nothing is resent for a completion. Before, answers took
    plane 0's two reverse EVs in turn: 158 were lost on the dead link, two WRITEs waited for a
    completion resend (at 71.5 and 78.8 ms), and 81 WRITEs completed instead of 85."""
    took, writer, back = _one_at_a_time(until=0.2, down_at=0.05)
    slow = [(round(at, 4), round(t * 1e3, 2)) for at, t in took if t > 0.0005]
    assert slow == [(0.0498, 5.23), (0.0618, 5.24)]
    assert len(took) == 85
    assert dict(writer.stats.retransmits_by_cause) == {"rto": 22}
    # Answers lost on the dead link back to h0: those in flight when it died, and those that
    # answered the packets lost there before the writer's RTO took their EVs out.
    assert back.counters["dropped_down"] == 19
