"""Planes dead from the start, and a connection left with no plane (docs/DESIGN.md §4, §6).

Stories in virtual time: a writer `a` and a responder `b` over four simulated planes at
1 Gbit/s (20 µs each way). "Dead from the start" is `a`'s links of planes 1-3 dropping
everything `a` sends from t = 0: the REQUEST copies, the data, the probes. The plane monitor's
own rules are told in explicit time below, on a `PlaneMonitor` driven by hand.
"""

from __future__ import annotations

import random
import struct
from collections import deque

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import (
    ConnectionClosed,
    ConnectionEstablished,
    Event,
    PlaneDown,
    WriteCompleted,
)
from mrc.core.paths.health import UNREACHABLE_REPORTS, PlaneMonitor
from mrc.core.paths.planes import PlaneState, PlaneTable
from mrc.core.session import Session
from mrc.core.stats import SessionStats
from mrc.core.timers import Timer, TimerTable
from mrc.core.transmit import Transmit
from mrc.sim import Host, LinkParams, Network
from mrc.sim.link import Delivery
from mrc.wire.bth import ENDPOINT_QPN, Opcode
from mrc.wire.packet import EndpointPacket
from mrc.wire.probe import ERTH, EndpointOp

MiB = 1 << 20
REPLY = struct.Struct(">QI")
GIG = LinkParams(rate_bps=1e9, latency=20e-6, queue_bytes=8 << 20)


class Story:
    """`a` writes `size` bytes into `b` in `msg`-byte WRITEs, all posted once connected;
    `dead`: `a`'s planes that drop everything from the start."""

    def __init__(
        self, *, size: int, msg: int, planes: int = 4, dead: tuple[int, ...] = (),
        security: str = "none", post: bool = True,
    ) -> None:  # fmt: skip
        self.net = Network(seed=3)
        self.a, self.b = self.net.pair(planes, GIG)
        for p in dead:
            self.a.links[p].params.drop_if = lambda data: True
        self.src = (bytes(range(251)) * (size // 251 + 1))[:size]
        self.dst = bytearray(size)
        self.src_region = self.a.regions.register(bytearray(self.src))
        dst_region = self.b.regions.register(self.dst)
        cfg = SessionConfig(plane_mask=(1 << planes) - 1, security=security)
        self.b.listen(cfg, accept=lambda _: REPLY.pack(dst_region.base_va, dst_region.rkey))
        self.size, self.msg = size, msg
        self.count = -(-size // msg) if post else 0
        self.remote: tuple[int, int] = (0, 0)
        #: When the first acknowledgement reached `a` (on any plane).
        self.first_answer: float | None = None

        def on_event(host: Host, session: Session, event: Event) -> None:
            if isinstance(event, ConnectionEstablished):
                self.remote = REPLY.unpack(event.private_data)
                if post:
                    self.post(session)

        def on_receive(host: Host, plane: int, batch: list[Delivery]) -> None:
            if self.first_answer is None and any(d[0][0] < 0xE0 for d in batch):
                self.first_answer = self.net.now  # not a CM packet: an acknowledgement

        self.a.on_receive = on_receive
        self.a.connect(self.b, cfg, on_event=on_event)

    def post(self, session: Session) -> None:
        va, rkey = self.remote
        for off in range(0, self.size, self.msg):
            n = min(self.msg, self.size - off)
            session.post_write(self.src_region, off, n, va + off, rkey, None)

    def done(self) -> bool:
        return len(self.a.events_of(WriteCompleted)) == self.count

    def downs(self) -> dict[int, tuple[float, str]]:
        return {e.plane: (t, e.reason) for t, _, e in self.a.events if isinstance(e, PlaneDown)}


def elapsed(story: Story, timeout: float) -> float:
    assert story.net.drive_until(story.done, timeout=timeout)
    assert story.dst == story.src
    assert all(e.status == 0 for e in story.a.events_of(WriteCompleted))
    return story.net.now


def test_three_planes_dead_from_the_start_are_down_within_50ms_and_cost_little_time() -> None:
    """16 MiB posted at once, planes 1-3 dead from the first packet. Plane 0's first
    acknowledgement comes within a millisecond; planes 1-3 have no RTT of their own, so they
    are expected when plane 0 answers: a reordering window (1 ms) later they are suspected,
    take no new flowcell, and are probed every 10 ms; never having answered anything, three
    unanswered probes take each DOWN (about 32 ms in), and their packets go to plane 0 at
    once. The transfer takes at most 1.25x a clean run on plane 0 alone (0.8x its rate).
    Now both take 0.1356 s. Before: the planes went DOWN at 0.72 s (EVs retired by rounds
    of 0.1 s RTOs until the floor, 145 RTO resends), and the transfer took 0.80 s, 5.9x the
    clean run."""
    clean = elapsed(Story(size=16 * MiB, msg=16 * MiB, planes=1), 5.0)
    s = Story(size=16 * MiB, msg=16 * MiB, dead=(1, 2, 3))
    took = elapsed(s, 5.0)
    assert s.first_answer is not None and s.first_answer < 0.001
    downs = s.downs()
    assert sorted(downs) == [1, 2, 3]
    for at, reason in downs.values():
        assert reason == "never answered"
        assert at - s.first_answer <= 0.050
    assert took <= clean / 0.8
    # Their packets were resent once they were DOWN; no RTO of theirs ever had to.
    assert s.a.session().stats.retransmits_by_cause["rto"] == 0


def spoofed_port_status(story: Story, mask: int) -> bytes:
    """A PORT_STATUS endpoint request to the connectionless QPN 0x2 with `mask`, as anyone
    able to send from `b`'s address can forge on an unsecured connection."""
    pkt = EndpointPacket(
        opcode=Opcode.ENDPOINT_REQUEST,
        dest_qp=ENDPOINT_QPN,
        ev=0,
        header=ERTH(op=EndpointOp.PORT_STATUS, port_status_mask=mask, tx_timestamp=0),
        p_key=SessionConfig().p_key,
        probe_id=0,
    )
    return pkt.encode()


def test_one_spoofed_port_status_cannot_stall_an_unsecured_connection() -> None:
    """t = 10 ms, connected and idle: a forged PORT_STATUS with mask 0 arrives from `b`'s
    address on plane 0. Taken, it would leave no plane usable; on an unsecured connection
    it is not taken (counted as `port_status_leaves_none`). A 4 MiB WRITE posted at 20 ms
    completes at once. Before: every plane was withdrawn and the WRITE never completed nor
    failed (no timer armed)."""
    s = Story(size=4 * MiB, msg=4 * MiB, post=False)
    s.count = 1
    s.net.drive(0.010)
    s.b.inject(0, s.a.name, spoofed_port_status(s, 0))
    s.net.at(0.020, lambda: (s.post(s.a.session()), s.a.flush(s.a.session())))
    assert s.net.drive_until(s.done, timeout=1.0)
    assert s.net.now < 0.1
    assert s.dst == s.src
    sa = s.a.session()
    assert sa.stats.drops_by_reason["port_status_leaves_none"] == 1
    assert s.a.events_of(PlaneDown) == []
    assert not sa.is_closed


def test_a_connection_with_posted_work_and_no_usable_plane_gives_up() -> None:
    """t = 10 ms, a 16 MiB transfer under way: every one of `a`'s four links is cut for good
    (carrier loss: io reports ENETUNREACH, `plane_status` down). Every plane is DOWN, all in
    flight declared lost, and nothing left to send on: no RTO is armed. The DOWN planes are
    probed, 10 ms doubling to 1 s; the PLANE_PROBE that finds work waiting and no usable
    plane for `give_up_after` (5 s) closes the connection, which fails its WRITEs
    (`connection_lost` at the daemon). Before: no plane, no timer for the WRITEs, and the
    connection waited for ever."""
    s = Story(size=16 * MiB, msg=MiB)
    for p in range(4):
        s.net.set_link(s.a, p, False, at=0.010)
    closed = lambda: s.a.session().is_closed  # noqa: E731
    assert s.net.drive_until(closed, timeout=8.0)
    (event,) = s.a.events_of(ConnectionClosed)
    assert event.reason == "no usable plane"
    # The first probe round after the cut found the work stuck (about 20 ms); the probes
    # run at most 1 s apart, so the close comes within a second of 5 s after that.
    assert 0.010 + 5.0 <= s.net.now <= 0.010 + 5.0 + 1.1
    assert len(s.a.events_of(WriteCompleted)) < 16


# -- the plane monitor's rules, in explicit time -------------------------------------------


class Monitor:
    """A `PlaneMonitor` of four planes over hand-set plane state, with what it sends."""

    def __init__(self, *, secured: bool = False) -> None:
        security = "auth" if secured else "none"
        self.config = SessionConfig(plane_mask=0b1111, security=security)
        self.events: deque[Event] = deque()
        self.paths = PlaneTable(self.config, random.Random(1), self.events)
        self.timers = TimerTable()
        self.stats = SessionStats()
        self.out: list[Transmit] = []
        self.lost: list[int] = []
        self.monitor = PlaneMonitor(
            self.config, paths=self.paths, timers=self.timers, stats=self.stats,
            events=self.events, peer_addrs={p: f"b{p}" for p in range(4)}, out=self.out,
            next_psn=lambda: 0, send_seq=lambda: 0, on_down=self.lost.append, peer_qpn=7,
        )  # fmt: skip

    def answered(self, plane: int, *, srtt: float, sent_at: float, at: float) -> None:
        """`plane` has answered: an RTT sample and a packet sent at `sent_at` acknowledged."""
        pl = self.paths.planes[plane]
        pl.rtt.sample(srtt)
        pl.acked_at = at
        pl.answered_sent_at = sent_at

    def downs(self) -> list[tuple[int, str]]:
        return [(e.plane, e.reason) for e in self.events if isinstance(e, PlaneDown)]


def test_a_suspected_plane_that_never_answered_goes_down_after_three_unanswered_probes() -> None:
    """Plane 0 answers (SRTT 2 ms, RTO 6 ms); plane 1 never answered anything and is
    suspected at t = 1.000 s. Probes go at 1.000, 1.010, 1.020; each is judged unanswered
    at the next one (older than plane 0's RTO while plane 0 answered packets sent later),
    and the third, judged at 1.030, takes plane 1 DOWN though its EVs are far above the
    floor: none of them ever came back. A plane that answered once is only probed (its
    EVs go to the floor first), as a dead switch of an ECMP fabric kills some paths only."""
    m = Monitor()
    for plane in (0, 2):
        m.answered(plane, srtt=0.002, sent_at=0.999, at=1.000)
    assert m.paths.probe_timeout(1) == pytest.approx(0.006)
    assert m.paths.planes[1].never_answered and not m.paths.planes[2].never_answered
    m.monitor.suspect(1, 1.000)
    m.monitor.suspect(2, 1.000)
    for t in (1.000, 1.010, 1.020, 1.030):
        for plane in (0, 2):
            m.paths.planes[plane].answered_sent_at = t  # plane 0 keeps answering
        for plane in (1, 2):
            assert m.timers.get(Timer.PLANE_PROBE, plane) == pytest.approx(t)
            m.monitor.on_timer(plane, t)
        if t < 1.030:
            assert m.downs() == []
    assert m.downs() == [(1, "never answered")]
    assert m.lost == [1]
    assert m.paths.planes[1].state is PlaneState.DOWN
    assert m.paths.planes[2].state is PlaneState.UP


def test_repeated_unreachable_errors_take_a_plane_that_never_answered_down_at_once() -> None:
    """io reports ICMP port unreachable for sends to the peer on planes 1 and 2 at
    t = 1.000, 1.001, 1.002 s. Plane 1 never answered: the third report takes it DOWN at
    1.002 ("unreachable"). Plane 2 answered once (a forged ICMP error must not take a
    working plane down): ignored."""
    m = Monitor()
    m.answered(0, srtt=0.005, sent_at=0.999, at=1.000)
    m.answered(2, srtt=0.005, sent_at=0.999, at=1.000)
    for k in range(UNREACHABLE_REPORTS):
        assert m.downs() == []
        for plane in (1, 2):
            m.monitor.unreachable(plane, 1.000 + k * 0.001)
    assert UNREACHABLE_REPORTS == 3
    assert m.downs() == [(1, "unreachable")]
    assert m.paths.planes[2].state is PlaneState.UP
    # DOWN, it is probed from 10 ms on like any DOWN plane; three answers bring it back.
    assert m.timers.get(Timer.PLANE_PROBE, 1) == pytest.approx(1.012)


def test_a_port_status_leaving_no_plane_is_taken_only_on_a_secured_connection() -> None:
    """t = 1.0 s: PORT_STATUS with mask 0b0001 (the peer receives on plane 0 only) is taken
    on an unsecured connection; then mask 0 would leave nothing to send on: not taken,
    counted. On a secured connection (the PORT_STATUS authenticated) mask 0 is taken."""
    m = Monitor()
    m.monitor.peer_ports(0b0001, 1.0)
    assert [p for p in range(4) if m.paths.usable(p)] == [0]
    m.monitor.peer_ports(0b0000, 1.1)
    assert [p for p in range(4) if m.paths.usable(p)] == [0]
    assert m.stats.drops_by_reason["port_status_leaves_none"] == 1
    secured = Monitor(secured=True)
    secured.monitor.peer_ports(0b0000, 1.0)
    assert [p for p in range(4) if secured.paths.usable(p)] == []


def test_no_usable_plane_with_work_posted_gives_up_after_the_give_up_time() -> None:
    """A secured peer withdraws every plane at t = 1.0 s (an authenticated PORT_STATUS,
    mask 0). The withdrawn planes are probed from 1.010 s, backing off as DOWN planes do;
    `gave_up` asked at each probe finds work waiting: the wait starts at the first ask and
    ends `give_up_after` (5 s) later. Idle, nothing is given up."""
    m = Monitor(secured=True)
    m.monitor.peer_ports(0b0000, 1.0)
    assert all(m.timers.get(Timer.PLANE_PROBE, p) == pytest.approx(1.010) for p in range(4))
    assert not m.monitor.gave_up(False, 1.010)
    assert not m.monitor.gave_up(True, 1.010)
    assert not m.monitor.gave_up(True, 6.009)
    assert m.monitor.gave_up(True, 6.010)
    assert not m.monitor.gave_up(False, 6.011)  # the work ended: the clock starts again
    assert not m.monitor.gave_up(True, 7.0)
