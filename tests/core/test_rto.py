"""Stories of the RTO (docs/DESIGN.md §6) in virtual time: stalls are not losses.

A writer `a` and a responder `b` over simulated planes at 1 Gbit/s. The stalls are the
simulator's `pause`: a paused host reads nothing and runs no timer until it resumes. The
simulator reads what waited before it runs a due timer (as io does); the stories of a stalled
writer resume it the other way round, timer first, as a driver whose event loop runs due
timers before it polls its sockets would: the core must not take its own stall for a loss.
"""

from __future__ import annotations

import struct

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, Event, PathRetired, PlaneDown, WriteCompleted
from mrc.core.session import Session
from mrc.sim import Host, LinkParams, Network
from mrc.wire.bth import Opcode
from mrc.wire.packet import DataPacket, decode_packet

MiB = 1 << 20
REPLY = struct.Struct(">QI")
GIG = LinkParams(rate_bps=1e9, latency=20e-6, queue_bytes=8 << 20)


class Story:
    """`a` writes `size` bytes into `b` in `msg`-byte WRITEs, posted once connected."""

    def __init__(self, *, size: int, msg: int, planes: int = 4) -> None:
        self.net = Network(seed=3)
        self.a, self.b = self.net.pair(planes, GIG)
        self.src = bytes((i * 7 + (i >> 12)) & 0xFF for i in range(size))
        self.dst = bytearray(size)
        src_region = self.a.regions.register(bytearray(self.src))
        dst_region = self.b.regions.register(self.dst)
        cfg = SessionConfig(plane_mask=(1 << planes) - 1)
        self.b.listen(cfg, accept=lambda _: REPLY.pack(dst_region.base_va, dst_region.rkey))
        self.count = -(-size // msg)

        def on_event(host: Host, session: Session, event: Event) -> None:
            if isinstance(event, ConnectionEstablished):
                va, rkey = REPLY.unpack(event.private_data)
                for off in range(0, size, msg):
                    n = min(msg, size - off)
                    session.post_write(src_region, off, n, va + off, rkey, None)

        self.a.connect(self.b, cfg, on_event=on_event)

    @property
    def sa(self) -> Session:
        return self.a.session()

    def done(self) -> bool:
        return len(self.a.events_of(WriteCompleted)) == self.count

    def run(self, timeout: float = 5.0) -> None:
        assert self.net.drive_until(self.done, timeout=timeout)
        assert self.dst == self.src
        assert all(e.status == 0 for e in self.a.events_of(WriteCompleted))

    def duplicates_at_b(self) -> int:
        return self.b.session().stats.drops_by_reason["duplicate"]

    def stall_writer_timer_first(self, at: float, seconds: float) -> None:
        """At `at`, `a` stops for `seconds`; when it resumes, its due timer runs before it
        reads the acknowledgements that waited in its sockets meanwhile."""
        a = self.a
        resume = a._resume

        def timer_then_read() -> None:
            a.paused_until = None
            for session in list(a.endpoint.sessions.values()):
                a._on_timer(session)
            resume()

        a._resume = timer_then_read  # type: ignore[method-assign]
        self.net.at(at, lambda: a.pause(seconds))

    def watch_resends(self) -> list[tuple[float, int]]:
        """(time, PSN) of every data packet `a` puts on a link with the RTX bit."""
        seen: list[tuple[float, int]] = []
        net = self.net

        def watch(data: bytes) -> bool:
            if data[0] in _DATA:
                pkt = decode_packet(data)
                assert isinstance(pkt, DataPacket)
                if pkt.rtx:
                    seen.append((net.now, pkt.psn))
            return False

        for link in self.a.links.values():
            link.params.drop_if = watch
        return seen


_DATA = {int(op) for op in Opcode if op.name.startswith("WRITE_")}


def test_a_writer_stalled_50ms_whose_timer_runs_before_its_reads_declares_no_loss() -> None:
    """t = 20 ms: the writer stops for 50 ms with four planes full of packets. Its peer goes
    on answering; 50 ms of SACKs wait unread. On resume the RTOs of every plane are 45 ms
    overdue and run first: each finds nothing heard since it was due, so it is this host's
    own stall, and each looks again 1 ms (reorder_min) later, after the reads. The SACKs
    then acknowledge everything: no resend, no EV retired, nothing arrives twice (before
    this rule: 4 resends at 70 ms, 4 duplicates)."""
    s = Story(size=16 * MiB, msg=MiB)
    resends = s.watch_resends()
    s.stall_writer_timer_first(0.020, 0.050)
    s.run()
    stats = s.sa.stats
    assert resends == []
    assert stats.retransmits_by_cause["rto"] == 0
    assert stats.retransmits_by_cause["rack"] == 0
    assert s.a.events_of(PathRetired) == []
    assert s.duplicates_at_b() == 0


def test_a_writer_stalled_50ms_that_reads_before_its_timer_judges_with_the_sacks_read() -> None:
    """The same stall resumed as io resumes (every socket read before a due timer runs): the
    SACKs that waited re-arm every RTO from the packets still out, none of them is late with
    nothing heard, and nothing is resent either."""
    s = Story(size=16 * MiB, msg=MiB)
    resends = s.watch_resends()
    s.net.at(0.020, lambda: s.a.pause(0.050))
    s.run()
    assert resends == []
    assert dict(s.sa.stats.retransmits_by_cause) == {}
    assert s.duplicates_at_b() == 0


def test_a_writer_stalled_while_its_peer_went_silent_still_resends_after_reorder_min() -> None:
    """The same stall, but every plane from `b` to `a` is cut at 19 ms and restored at
    150 ms: nothing waits in the writer's sockets. The overdue RTOs look again 1 ms after the
    resume (t = 71 ms) and, with nothing heard anywhere, the plane holding the connection's
    oldest packet resends it: one probe, then one per RTO of the probing plane (81, 101,
    141, 221 ms), never two at once. Before these rules: 24 resends at 70 ms, as every
    plane's expiry fired again at once for each backoff step."""
    s = Story(size=16 * MiB, msg=MiB)
    resends = s.watch_resends()
    net = s.net

    def cut(_: bytes) -> bool:
        return 0.019 <= net.now < 0.150

    for link in s.b.links.values():
        link.params.drop_if = cut
    s.stall_writer_timer_first(0.020, 0.050)
    s.run()
    probes = [round(t, 6) for t, _ in resends if t < 0.3]
    assert probes == [0.071, 0.081, 0.101, 0.141, 0.221]
    assert s.a.events_of(PlaneDown) == []


def test_a_peer_stalled_50ms_gets_one_probe_per_expiry_not_one_per_plane() -> None:
    """t = 20 ms: the responder stops for 50 ms. Nothing sent later is acknowledged anywhere,
    so this is a stalled peer: the RTO of the plane holding the oldest packet resends it
    (the probe), the other planes' RTOs only back off, and the next probe waits for the
    probe's own RTO: at 25 ms (5 ms after the last acknowledgement), 35 ms and 55 ms. Every
    probe arrives as a duplicate (the originals waited in the peer's socket), so their
    number is the cost of the stall: 16 before this rule (one per plane and expiry, the
    backed-off expiries counted from the oldest's send time), 3 now; no path is blamed."""
    s = Story(size=16 * MiB, msg=MiB)
    resends = s.watch_resends()
    s.net.at(0.020, lambda: s.b.pause(0.050))
    s.run()
    stats = s.sa.stats
    assert [round(t, 6) for t, _ in resends] == [0.025001, 0.035001, 0.055001]
    assert stats.retransmits_by_cause["rto"] == 3
    assert s.duplicates_at_b() == 3
    assert s.a.events_of(PathRetired) == []
    assert s.a.events_of(PlaneDown) == []


def test_a_plane_read_late_after_the_peers_stall_is_not_taken_for_a_dead_one() -> None:
    """t = 20 ms: the responder stops for 34 ms. When it resumes (54 ms) it reads planes 0, 1
    and 3 at once and plane 2's socket 3 ms later (57 ms). At 55 ms plane 2's RTO (backed
    off twice by the stall) finds the plane silent for 35 ms, longer than its RTO, while the
    peer answers on the other planes: what a dead plane looks like. But the peer has been
    answering for 1 ms only: plane 2's silence counts from then, so it waits, and its SACKs
    come at 57 ms. Before this rule: 104 packets resent at 55 ms, all of them twice at the
    peer, and 16 EVs retired. Left: the stall's two probes (25, 35 ms)."""
    s = Story(size=16 * MiB, msg=MiB)
    resends = s.watch_resends()
    b = s.b
    s.net.at(0.020, lambda: b.pause(0.034))
    s.net.at(0.0535, lambda: b.lag(2, 0.0035))  # plane 2 is read from 57 ms
    s.run()
    assert [round(t, 6) for t, _ in resends] == [0.025001, 0.035001]
    assert s.sa.stats.retransmits_by_cause["rto"] == 2
    assert s.duplicates_at_b() == 2
    assert s.a.events_of(PathRetired) == []


def test_a_lost_tail_is_recovered_by_the_probe_within_one_rto_and_two_round_trips() -> None:
    """One 64 KiB WRITE over two planes; its LAST packet is lost once. No later packet on its
    EV, or anywhere, is ever acknowledged, so RACK cannot see it: the RTO of its plane
    (held until an RTO after the last acknowledgement: the window, not the path) resends it,
    and the WRITE completes one round trip later."""
    s = Story(size=64 * 1024, msg=64 * 1024, planes=2)
    lost: list[float] = []
    resent: list[float] = []
    net = s.net

    def lose_last_once(data: bytes) -> bool:
        if data[0] != Opcode.WRITE_LAST:
            return False
        pkt = decode_packet(data)
        assert isinstance(pkt, DataPacket)
        if pkt.rtx:
            resent.append(net.now)
            return False
        if not lost:
            lost.append(net.now)
            return True
        return False

    for link in s.a.links.values():
        link.params.drop_if = lose_last_once
    s.run()
    ((done_at, _, _),) = [e for e in s.a.events if isinstance(e[2], WriteCompleted)]
    rto = max(pl.rtt.rto for pl in s.sa.paths.planes.values())
    srtt = max(pl.rtt.srtt or 0.0 for pl in s.sa.paths.planes.values())
    assert len(lost) == 1 and len(resent) == 1
    assert s.sa.stats.retransmits_by_cause["rto"] == 1
    # The resend waits for the RTO after the last acknowledgement (about one RTT after the
    # lost packet left), and the completion comes about one RTT after the resend.
    assert lost[0] + rto <= resent[0] <= lost[0] + rto + 2 * srtt + 0.001
    assert resent[0] < done_at <= resent[0] + 2 * srtt + 0.001
    assert s.a.events_of(PathRetired) == []
