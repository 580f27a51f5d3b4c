"""Stories of one writer and one responder over four simulated planes.

Each test states the fault, drives virtual time, and checks that every byte was placed exactly
once at its own address, that WRITEs completed in MSN order with status ok, and that the
immediates arrived in MSN order.
"""

from __future__ import annotations

from sim_story import Transfer, chunks, make_transfer

from mrc.core.config import SessionConfig
from mrc.core.events import PathRetired, PlaneDown
from mrc.sim import Host, LinkParams, Network
from mrc.wire.bth import Opcode
from mrc.wire.packet import DataPacket, decode_packet

MiB = 1 << 20


def assert_in_order(t: Transfer, first_msn: int = 0) -> None:
    n = len(t.messages)
    expected = [(first_msn + i) & 0xFFFF for i in range(n)]
    assert [c.msn for c in t.completions] == expected
    assert all(c.status == 0 for c in t.completions)
    imms = [
        (m, imm) for m, (_, _, imm) in zip(expected, t.messages, strict=True) if imm is not None
    ]
    assert [(e.msn, e.imm) for e in t.immediates] == imms


def data_packets_sent(t: Transfer) -> int:
    return sum(link.counters["sent"] for link in t.a.links.values())


def test_lossless_transfer_uses_every_plane_and_never_retransmits() -> None:
    t = make_transfer(messages=chunks(8 * MiB, MiB), size=8 * MiB)
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    stats = t.a.session().stats
    assert stats.retransmits == 0
    # 2048 data packets sprayed equally: 512 on each plane.
    assert [stats.planes[p].packets_sent for p in range(4)] == [512] * 4
    assert t.b.session().stats.drops_by_reason == {}


def test_five_percent_loss_on_every_plane_retransmits_only_holes() -> None:
    t = make_transfer(
        messages=chunks(8 * MiB, MiB),
        size=8 * MiB,
        params=LinkParams(rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20, loss=0.05),
    )
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    lost = sum(link.counters["dropped_loss"] for link in t.a.links.values())
    stats = t.a.session().stats
    assert lost > 50
    assert stats.retransmits_by_cause["rack"] > 0
    # Selective: retransmissions stay close to what the network dropped (data and SACKs).
    assert stats.retransmits <= 2 * lost
    # Random loss is not a plane failure.
    assert t.a.events_of(PlaneDown) == []


def test_heavy_reordering_keeps_every_byte_once() -> None:
    t = make_transfer(
        messages=chunks(4 * MiB, 256 * 1024),
        size=4 * MiB,
        params=LinkParams(
            rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20, reorder=0.5, reorder_delay=3e-3
        ),
    )
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    assert sum(link.counters["reordered"] for link in t.a.links.values()) > 400


def test_duplicated_packets_are_counted_and_never_written_twice() -> None:
    t = make_transfer(
        messages=chunks(4 * MiB, MiB),
        size=4 * MiB,
        params=LinkParams(rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20, duplicate=0.2),
    )
    t.run()
    t.net.drive(t.net.now + 0.01)  # let the last duplicates land
    t.assert_placed_exactly_once()
    assert_in_order(t)
    duplicated = sum(link.counters["duplicated"] for link in t.a.links.values())
    retransmitted = t.a.session().stats.retransmits
    drops = t.b.session().stats.drops_by_reason
    assert duplicated > 100
    # Every duplicated data packet (and every resend) is counted once and written never; the
    # writer's 8 control packets (4 REQUEST copies, 4 PORT_STATUS) may be among the duplicated.
    assert duplicated - 8 <= drops["duplicate"] - retransmitted <= duplicated


def test_cable_pull_on_one_plane_moves_its_traffic_to_the_others() -> None:
    sent_on_2: list[int] = []

    def build(net, a, b):  # type: ignore[no-untyped-def]
        # t = 0.5 ms: plane 2's cable is pulled; both hosts see carrier loss at once.
        net.set_link(a, 2, False, at=0.0005)
        net.at(0.0005 + 1e-9, lambda: sent_on_2.append(a.session().stats.planes[2].packets_sent))

    t = make_transfer(messages=chunks(16 * MiB, MiB), size=16 * MiB, build=build)
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    downs = t.a.events_of(PlaneDown)
    assert downs == [PlaneDown(plane=2, reason="local")]
    assert [round(ts, 6) for ts, _, e in t.a.events if isinstance(e, PlaneDown)] == [0.0005]
    stats = t.a.session().stats
    # Nothing more went into plane 2 after the pull; what was in flight there went elsewhere.
    assert stats.planes[2].packets_sent == sent_on_2[0]
    assert stats.retransmits_by_cause["plane_down"] > 0
    assert t.a.session().plane_state(2) == "down"


def test_silent_blackhole_on_one_plane_is_resent_around_and_its_evs_retired_by_probes() -> None:
    def build(net, a, b):  # type: ignore[no-untyped-def]
        net.set_link(a, 2, False, at=0.0005, notify=False)

    t = make_transfer(messages=chunks(64 * MiB, MiB), size=64 * MiB, build=build)
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    # Plane 2, silent while the others answer, was suspected (mrc/core/loss/silence.py): no new
    # flowcell went there and its bytes stopped holding the window. Once its packets closed
    # the PSN window and every other plane had all it carried answered, they were resent
    # elsewhere without waiting for its RTO (sender.py `_resend_silent`), so the transfer
    # ended at 19.05 ms (27.9 ms by the RTO, 41.99 ms before suspicion) with 214 packets sent
    # into plane 2 (376, 693).
    assert round(t.net.now, 6) == 0.019051
    session = t.a.session()
    stats = session.stats
    assert stats.planes[2].packets_sent == 214
    assert dict(stats.retransmits_by_cause) == {"silent": 82}
    # No path was blamed by the resend; the plane monitor's probes of the suspected plane,
    # unanswered while the peer answered elsewhere, retired the EVs they went on.
    t.net.drive(t.net.now + 0.05)
    retired = t.a.events_of(PathRetired)
    assert [(e.plane, e.reason) for e in retired] == [(2, "probe unanswered")] * 2
    retired_at = [round(ts, 6) for ts, _, e in t.a.events if isinstance(e, PathRetired)]
    assert retired_at == [0.01152, 0.02152]
    # Once the transfer is over nothing answers on the other planes either: no evidence
    # takes the plane DOWN (before, the RTO had retired its EVs down to the floor during
    # the longer transfer, and three probes unanswered took it DOWN at 31.5 ms): it stays
    # UP, two EVs short, until the next transfer meets its silence again.
    assert t.a.events_of(PlaneDown) == []
    assert stats.probes_answered == 0
    assert session.plane_state(2) == "up"


def test_an_outage_of_every_plane_ends_its_backoff_when_the_peer_answers_again() -> None:
    """Every plane of the writer goes silent from 1 ms to 15 ms: the whole window is lost, and
    the SACKs of what arrived just before. The RTO's stall probes (one packet for the whole
    connection, backing off) find the peer again at 16 ms, and that answer ends the backoff
    and the holds of the silence on every plane: the planes' RTOs judge again on their own
    evidence, the lost window goes out again and the transfer ends at 57.4 ms (57.3 while
    every ACK came with its block's SACK). The RTOs and
    the closed-window rule (where a plane answered later flowcells on other EVs) retire
    48 EVs, which their probes bring back. Before, each backed-off probe's answer
    freed only what it brought back, and the transfer ended at 579.5 ms; while another
    plane's overdue packet counted as a stalled peer even though something sent after it
    had been acknowledged, each plane waited for the others and it ended at 92.6 ms."""

    def build(net, a, b):  # type: ignore[no-untyped-def]
        for plane in range(4):
            net.set_link(a, plane, False, at=0.001, notify=False)
            net.set_link(a, plane, True, at=0.015, notify=False)

    t = make_transfer(messages=chunks(32 * MiB, MiB), size=32 * MiB, build=build)
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    assert round(t.net.now, 6) == 0.057365
    session = t.a.session()
    assert dict(session.stats.retransmits_by_cause) == {"rto": 444, "silent": 147}
    assert t.b.session().stats.drops_by_reason.get("duplicate", 0) == 1
    assert len(t.a.events_of(PathRetired)) == 48 and t.a.events_of(PlaneDown) == []
    assert [session.plane_state(p) for p in range(4)] == ["up"] * 4


def test_psn_wraps_around_two_to_the_24() -> None:
    config = SessionConfig(plane_mask=0b1111, initial_psn=(1 << 24) - 700)
    t = make_transfer(
        messages=chunks(8 * MiB, MiB),
        size=8 * MiB,
        config=config,
        params=LinkParams(rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20, loss=0.02),
    )
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    # 2048 packets from 2^24 - 700: the sender's next PSN wrapped to 1348.
    assert t.a.session().sender.next_psn == 2048 - 700  # type: ignore[union-attr]
    assert t.b.session().receiver.cack == 2048 - 700  # type: ignore[union-attr]


def test_msn_wraps_around_two_to_the_16() -> None:
    first = (1 << 16) - 40
    config = SessionConfig(plane_mask=0b1111, initial_msn=first)
    t = make_transfer(messages=chunks(100 * 1000, 1000), size=100 * 1000, config=config)
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t, first_msn=first)
    assert t.completions[39].msn == 0xFFFF and t.completions[40].msn == 0


def test_window_never_exceeds_mpr_times_128() -> None:
    # MPR 1: 128 PSNs. 3000 packets through slow planes keep the window full for a while.
    config = SessionConfig(plane_mask=0b11, mpr=1, payload_mtu=1024)
    t = make_transfer(
        messages=chunks(3000 * 1024, 64 * 1024),
        size=3000 * 1024,
        planes=2,
        config=config,
        params=LinkParams(rate_bps=1e9, latency=50e-6),
    )
    widest = 0
    while not t.done():
        assert t.net.drive_bounded(50) > 0
        sender = t.a.session().sender
        if sender is not None:
            widest = max(widest, (sender.next_psn - sender.una) & 0xFFFFFF)
    assert widest == 128
    t.assert_placed_exactly_once()
    assert_in_order(t)
    assert t.b.session().stats.drops_by_reason["out_of_window"] == 0


def test_many_concurrent_writes_of_mixed_sizes() -> None:
    sizes = [1, 7, 4095, 4096, 4097, 8192, 20000, 333, 65536, 100]
    messages = []
    offset = 0
    for i in range(400):
        size = sizes[i % len(sizes)]
        messages.append((offset, size, i if i % 3 == 0 else None))
        offset += size + 13  # gaps between messages stay untouched
    t = make_transfer(
        messages=messages,
        size=offset,
        params=LinkParams(
            rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20, loss=0.01, reorder=0.2
        ),
    )
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)


def test_immediates_wait_for_an_earlier_message_whose_last_packet_was_lost() -> None:
    """Message 0's LAST_IMM is lost once; messages 1-9 arrive complete before its resend.
    The responder must still report immediates 0, 1, …, 9 in that order."""
    dropped: list[int] = []

    def lose_first_last_of_msg0(data: bytes) -> bool:
        if data[0] != Opcode.WRITE_LAST_IMM:
            return False
        pkt = decode_packet(data)
        assert isinstance(pkt, DataPacket)
        if pkt.msn == 0 and not dropped:
            dropped.append(pkt.psn)
            return True
        return False

    def build(net, a, b):  # type: ignore[no-untyped-def]
        for link in a.links.values():
            link.params.drop_if = lose_first_last_of_msg0

    t = make_transfer(messages=chunks(10 * 64 * 1024, 64 * 1024), size=10 * 64 * 1024, build=build)
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    assert len(dropped) == 1
    assert t.a.session().stats.retransmits == 1
    # Immediate 0 came first even though message 9 was complete before it.
    times = [ts for ts, _, e in t.b.events if type(e).__name__ == "ImmediateReceived"]
    assert times == sorted(times)


def test_a_stall_after_one_plane_fell_behind_blames_no_path() -> None:
    """t = 10 ms: the receiver starts reading plane 1's socket 2 ms late (the other planes
    are read at once); t = 11 ms: it stalls for 30 ms. When it stopped, it had acknowledged
    packets on planes 0, 2 and 3 sent after plane 1's oldest unacknowledged ones, so plane
    1's RTO finds "later packets acknowledged elsewhere" — yet the other planes have old
    packets out too: the peer stalled, and no path is to blame. The sender resends only the
    oldest packet and backs off; after the stall everything is acknowledged."""
    lag_rto: list[float] = []

    def build(net, a, b):  # type: ignore[no-untyped-def]
        def lag() -> None:
            lag_rto.append(a.session().paths.planes[1].rtt.current)
            b.lag(1, 0.002)

        net.at(0.010, lag)
        net.at(0.011, lambda: b.pause(0.030))

    t = make_transfer(
        messages=chunks(32 * MiB, MiB),
        size=32 * MiB,
        params=LinkParams(rate_bps=1e9, latency=20e-6, queue_bytes=8 << 20),
        build=build,
    )
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    session = t.a.session()
    assert 0.002 < lag_rto[0] < 0.030  # the lag is shorter than the RTO, the stall longer
    assert t.a.events_of(PathRetired) == []
    assert t.a.events_of(PlaneDown) == []
    assert session.stats.retransmits_by_cause["rack"] == 0
    assert 1 <= session.stats.retransmits_by_cause["rto"] <= 12
    assert all(session.paths.usable(p) for p in range(4))


def test_a_host_link_whose_queue_is_full_refuses_whole_flowcells_and_no_path_is_blamed() -> None:
    # The writer's plane-0 link is slow with a 48 KiB queue: a full GSO flowcell (15 × 4 KiB)
    # cannot fit behind anything, so the host refuses it whole, as a full qdisc does (ENOBUFS),
    # and the core resends it at once elsewhere. Nothing was lost on a path, so no EV retires.
    slow = LinkParams(rate_bps=1e9, latency=20e-6, queue_bytes=48 << 10)

    def build(net: Network, a: Host, b: Host) -> None:
        a.links[0].params = slow  # the writer's own link on plane 0, towards b

    t = make_transfer(
        messages=chunks(8 * MiB, MiB),
        size=8 * MiB,
        config=SessionConfig(plane_mask=0b1111, flowcell=64),
        build=build,
    )
    t.run()
    t.assert_placed_exactly_once()
    assert_in_order(t)
    stats = t.a.session().stats
    refused = t.a.links[0].counters["refused_local"]
    assert refused > 0
    assert stats.local_drops == stats.retransmits_by_cause["local"] > 0
    assert stats.local_drops <= refused  # acknowledged or resent records are not counted twice
    assert t.a.links[0].counters["dropped_queue"] == 0  # refused whole, never cut in pieces
    assert not t.a.events_of(PathRetired)
