"""Congestion control (mrc.core.cc.control, docs/DESIGN.md §7): NSCC's quadrants, its once-per-RTT
decrease, quick adapt, the receiver's `rcv_cwnd_pen`, the window-only `none`, and a sender
that keeps no more in flight than the window allows.

The NSCC stories use two 100 Gbit/s planes and a 10 µs base RTT: a BDP of 250 000 bytes, a
window of at most 375 000, a target queueing delay of 7.5 µs, and UEC's constants scaled by
a = 250 000 / 150 000 (the reference BDP, 100 Gbit/s × 12 µs) and b = 7.5 µs / 12 µs.
"""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest

from mrc.core.cc.control import Nscc, NsccParams, WindowOnly, cc_names, make_cc
from mrc.core.config import SessionConfig
from mrc.core.errors import LocalProtocolError
from mrc.core.events import ConnectionEstablished, Event, WriteCompleted
from mrc.core.session import Session
from mrc.sim import Host, LinkParams, Network
from mrc.wire.packet import SackPacket, decode_packet

MTU = 4096
CONFIG = SessionConfig(
    plane_mask=0b11, payload_mtu=MTU, cc="nscc", cc_plane_rate=100e9, cc_base_rtt=10e-6,
    cc_min_base_rtt=0.0,
)
BASE = 10e-6
T0 = 0.001
US = 1e-6
A = 250_000 / 150_000
B = 7.5 / 12
ALPHA = 4 * MTU * A * B / 7.5e-6
FI = 5 * MTU * A


def ack(cc: Nscc | WindowOnly, now: float, *, delay: float | None = 0.0, ecn: bool = False,
        acked: int = MTU, pen: int = 0, inflight: int = 0) -> None:  # fmt: skip
    """A SACK for `acked` bytes whose triggering packet queued `delay` seconds (None: no
    Karn-valid sample)."""
    rtt = None if delay is None else BASE + delay
    cc.on_ack(now, acked=acked, rtt=rtt, plane=0, ecn=ecn, pen=pen, inflight=inflight)


def started() -> Nscc:
    """An NSCC whose first acknowledgement (at T0, no queueing) measured the base RTT."""
    cc = make_cc("nscc", CONFIG)
    assert isinstance(cc, Nscc)
    ack(cc, T0)
    return cc


def test_the_constants_are_uecs_at_the_reference_and_scale_with_the_bdp() -> None:
    ref = SessionConfig(plane_mask=0b1, payload_mtu=MTU, cc_plane_rate=100e9)
    p = NsccParams.scaled(ref, 12e-6)
    assert p.bdp == pytest.approx(150_000)
    assert p.target == pytest.approx(9e-6)
    assert p.maxwnd == pytest.approx(225_000)
    assert p.fi == pytest.approx(5 * MTU)
    assert p.fi_scale == pytest.approx(0.25)
    assert p.eta == pytest.approx(0.15 * MTU)
    assert p.alpha == pytest.approx(4 * MTU * 0.75 / 9e-6)
    assert p.qa_threshold == pytest.approx(36e-6)
    # Two planes and 10 µs: a = 5/3, b = 0.625.
    q = NsccParams.scaled(CONFIG, BASE)
    assert (q.bdp, q.maxwnd, q.target) == pytest.approx((250_000, 375_000, 7.5e-6))
    assert (q.fi, q.eta, q.alpha) == pytest.approx((FI, 0.15 * MTU * A, ALPHA))


def test_the_first_window_is_one_and_a_half_bdp_and_the_measured_rtt_rescales_it() -> None:
    cc = make_cc("nscc", replace(CONFIG, cc_base_rtt=40e-6))
    assert isinstance(cc, Nscc)
    assert cc.cwnd == pytest.approx(1.5 * 40e-6 * 25e9)  # 1.5 MB at the assumed 40 µs
    assert cc.base_rtt is None
    ack(cc, T0)  # the first sample: 10 µs
    assert cc.base_rtt == pytest.approx(BASE)
    assert cc.cwnd == pytest.approx(375_000)  # clamped to 1.5 × the real BDP
    ack(cc, T0 + US, delay=5 * US)  # a larger RTT never raises the base
    assert cc.base_rtt == pytest.approx(BASE)


def test_no_ecn_and_low_delay_increases_in_proportion_to_the_room_below_target() -> None:
    cc = started()
    cc.cwnd = 100_000.0  # as if an earlier decrease had cut it
    # Nine SACKs 1 µs apart, each for one packet that queued 3 µs (4.5 µs below target).
    for k in range(1, 10):
        ack(cc, T0 + k * US, delay=3 * US)
    # The ninth passes the 8-MTU adjustment threshold: the increase is applied as inc / cwnd.
    assert cc.cwnd == pytest.approx(100_000 + 9 * ALPHA * MTU * 4.5e-6 / 100_000)
    grown = cc.cwnd
    # ECN with a low delay: the path is switched (EV SKIP), the window stays; only eta, the
    # constant growth applied once per base RTT, is added when the period ends at 11 µs.
    for k in range(10, 19):
        ack(cc, T0 + k * US, delay=3 * US, ecn=True)
    assert cc.cwnd == pytest.approx(grown + 0.15 * MTU * A)


def test_no_ecn_and_high_delay_increases_fairly_once_the_fabric_marks() -> None:
    cc = started()
    # A marked SACK at no queueing: this fabric marks its queues (the EV is skipped instead).
    ack(cc, T0 + 0.5 * US, ecn=True, acked=0)
    cc.cwnd = 100_000.0
    # Queueing above target without a mark: not this flow's queue; a fair share of growth.
    for k in range(1, 10):
        ack(cc, T0 + k * US, delay=8 * US)
    assert cc.cwnd == pytest.approx(100_000 + 9 * FI * MTU / 100_000)


def test_before_any_mark_a_long_delay_reads_as_a_mark() -> None:
    cc = make_cc("nscc", replace(CONFIG, cc_delay_mark=15e-6))
    assert isinstance(cc, Nscc)
    ack(cc, T0)
    assert cc.cwnd == pytest.approx(375_000)
    # No mark yet (a tbf or a plain Linux router marks nothing). 10 µs of queueing, above
    # target but below cc_delay_mark: someone else's queue, as in UEC; the average stays.
    for k in range(1, 5):
        ack(cc, T0 + k * 0.1 * US, delay=10 * US, acked=0)
    assert cc.avg_delay == pytest.approx(0.0125 * BASE / 4 * (1 + 0.9875 + 0.9875**2 + 0.9875**3))
    # 20 µs reads as a mark: the average delay tracks it, and once it passes the target the
    # window decreases as in the ECN quadrant.
    avg = cc.avg_delay
    decreased = None
    for k in range(5, 60):
        ack(cc, T0 + k * 0.1 * US, delay=20 * US, acked=0)
        avg += 0.0125 * (20e-6 - avg)
        if avg > 7.5e-6 and decreased is None:
            decreased = 375_000 * (1 - 0.8 * (avg - 7.5e-6) / avg)
    assert decreased is not None and cc.cwnd == pytest.approx(decreased)


def test_a_whole_window_at_no_delay_grows_it_fast() -> None:
    cc = started()
    cc.cwnd = 8 * MTU
    fast = 0.25 * A * MTU  # fi_scale × one packet
    # Seven more SACKs at no queueing: a proportional increase builds up, not applied yet.
    for k in range(1, 8):
        ack(cc, T0 + k * 0.1 * US)
    assert cc.cwnd == 8 * MTU
    # The eighth completes more than a window (the first SACK at T0 counts) at (almost) no
    # queueing, below 10 µs / 12: fast increase, fi_scale × its bytes at once.
    ack(cc, T0 + 0.8 * US)
    assert cc.cwnd == pytest.approx(8 * MTU + fast)
    # The ninth too, and it passes 8 MTUs since the last adjustment: what built up is applied.
    ack(cc, T0 + 0.9 * US)
    grown = 8 * MTU + 2 * fast
    assert cc.cwnd == pytest.approx(grown + 7 * ALPHA * MTU * 7.5e-6 / grown)
    before = cc.cwnd
    ack(cc, T0 + 1.0 * US)
    ack(cc, T0 + 1.1 * US)
    assert cc.cwnd == pytest.approx(before + 2 * fast)
    # One SACK that queued ends it: back to proportional increase, nothing applied at once.
    before = cc.cwnd
    ack(cc, T0 + 1.2 * US, delay=2 * US)
    assert cc.cwnd == before


def test_ecn_and_high_delay_decrease_at_most_once_per_base_rtt() -> None:
    cc = started()
    assert cc.cwnd == pytest.approx(375_000)
    # Marked SACKs 0.1 µs apart, each 20 µs of queueing. The decision uses the average
    # delay (EWMA, gain 0.0125): it passes the 7.5 µs target at the 38th.
    avg = 0.0
    factors: list[tuple[int, float]] = []
    for k in range(1, 61):
        ack(cc, T0 + k * 0.1 * US, delay=20 * US, ecn=True, acked=0)
        avg += 0.0125 * (20e-6 - avg)
        if avg > 7.5e-6 and not factors:
            factors.append((k, 1 - 0.8 * (avg - 7.5e-6) / avg))
    ((k, f),) = factors
    assert k == 38
    # One decrease only, although 22 more marked SACKs came within the same base RTT.
    assert cc.cwnd == pytest.approx(375_000 * f)
    once = cc.cwnd
    # More than a base RTT after the first decrease: the next one (and the per-RTT eta).
    t = T0 + 3.8 * US + 10.1 * US
    ack(cc, t, delay=20 * US, ecn=True, acked=0)
    avg += 0.0125 * (20e-6 - avg)
    assert cc.cwnd == pytest.approx(once * (1 - 0.8 * (avg - 7.5e-6) / avg) + 0.15 * MTU * A)


def test_quick_adapt_after_a_trim_falls_back_to_what_was_achieved() -> None:
    cc = started()
    # The first quick-adapt period ends at T0 + base RTT + target; two packets arrived in it.
    ack(cc, T0 + 5 * US, delay=0.5 * US)
    ack(cc, T0 + 6 * US, delay=0.5 * US)
    # A TRIMMED NACK after the period: far below maxwnd / 8 was achieved, so quick adapt.
    cc.on_nack(T0 + 20 * US, nacked=MTU, lasthop=False, inflight=0)
    assert cc.cwnd == 2 * MTU
    # Another trim in the new period: no second quick adapt, only the trimmed bytes go.
    cc.on_nack(T0 + 21 * US, nacked=MTU, lasthop=True, inflight=0)
    assert cc.cwnd == MTU
    cc.on_nack(T0 + 22 * US, nacked=MTU, lasthop=True, inflight=0)
    assert cc.cwnd == MTU  # never below one packet


def test_after_quick_adapt_trims_of_packets_already_in_flight_are_ignored() -> None:
    cc = started()
    ack(cc, T0 + 5 * US, delay=0.5 * US)
    ack(cc, T0 + 6 * US, delay=0.5 * US)
    # Quick adapt with ten packets in flight: they were sent under the old window.
    cc.on_nack(T0 + 20 * US, nacked=MTU, lasthop=False, inflight=10 * MTU)
    assert cc.cwnd == 2 * MTU
    for k in range(9):
        cc.on_nack(T0 + (21 + k) * US, nacked=MTU, lasthop=False, inflight=(9 - k) * MTU)
    assert cc.cwnd == 2 * MTU
    # The eleventh trim is about a packet sent under the new window.
    cc.on_nack(T0 + 30 * US, nacked=MTU, lasthop=False, inflight=0)
    assert cc.cwnd == MTU


def test_a_loss_quick_adapts_only_a_collapsed_flow() -> None:
    cc = started()
    # A flow delivering its window: a loss (a broken path in MRC) leaves the window alone.
    for k in range(1, 31):
        ack(cc, T0 + k * 0.5 * US, delay=0.5 * US)
    window = cc.cwnd
    cc.on_loss(T0 + 20 * US, lost=MTU, inflight=0)
    assert cc.cwnd == window
    # One SACK of one packet in the next period, then a loss: the flow collapsed.
    ack(cc, T0 + 25 * US, delay=0.5 * US)
    cc.on_loss(T0 + 40 * US, lost=MTU, inflight=0)
    assert cc.cwnd == MTU


def test_rcv_cwnd_pen_narrows_the_window_and_leaves_cwnd_alone() -> None:
    cc = started()
    ack(cc, T0 + US, pen=64, delay=None)
    assert cc.cwnd == pytest.approx(375_000)
    assert cc.window == pytest.approx(375_000 * 64 / 128)
    assert cc.can_send(int(cc.window) - MTU) and not cc.can_send(int(cc.window) - MTU + 1)
    ack(cc, T0 + 2 * US, pen=127, delay=None)
    assert cc.window == MTU  # cwnd / 128 is less than a packet: one packet per RTT
    assert cc.can_send(0) and not cc.can_send(1)
    ack(cc, T0 + 3 * US, pen=0, delay=None)  # the receiver lifted it
    assert cc.window == pytest.approx(375_000)


def test_none_is_the_packet_window_in_bytes_and_only_pen_narrows_it() -> None:
    cc = make_cc("none", replace(CONFIG, max_inflight=64))
    assert isinstance(cc, WindowOnly)
    assert cc.window == 64 * MTU
    cc.on_nack(T0, nacked=MTU, lasthop=False, inflight=0)
    cc.on_loss(T0, lost=10 * MTU, inflight=0)
    ack(cc, T0, delay=50 * US, ecn=True)
    assert cc.window == 64 * MTU
    ack(cc, T0, pen=96)
    assert cc.window == 16 * MTU and cc.cwnd == 64 * MTU
    assert make_cc("none", CONFIG).window == 8 * 128 * MTU  # MPR × 128 packets


def test_policies_are_chosen_by_name() -> None:
    assert cc_names() == ["none", "nscc"]
    assert SessionConfig().cc in cc_names()
    with pytest.raises(LocalProtocolError, match=r"unknown congestion control 'cubic'.*nscc"):
        make_cc("cubic", CONFIG)
    with pytest.raises(LocalProtocolError, match="cc_target"):
        SessionConfig(cc_target=0).validate()


# -- in a session ------------------------------------------------------------------------------

REPLY = struct.Struct(">QI")


def run_with_pen(pen: int) -> tuple[int, float, bool]:
    """a writes 4 MiB to b over two 10 Gbit/s planes; every SACK on its way back carries
    `pen` as rcv_cwnd_pen. Returns the most payload bytes a had in flight once the first
    window was acknowledged, NSCC's largest window, and whether the bytes all arrived."""
    net = Network(seed=5)
    a, b = net.pair(2, LinkParams(rate_bps=10e9, latency=20e-6))
    size = 4 << 20
    src = bytes(range(256)) * (size // 256)
    dst = bytearray(size)
    dst_region = b.regions.register(dst)
    src_region = a.regions.register(bytearray(src))
    cfg = SessionConfig(
        plane_mask=0b11, cc="nscc", cc_plane_rate=10e9, cc_base_rtt=50e-6, cc_min_base_rtt=0.0
    )
    b.listen(cfg, accept=lambda _: REPLY.pack(dst_region.base_va, dst_region.rkey))
    done: list[float] = []
    inflight: list[int] = []

    def on_event(host: Host, session: Session, event: Event) -> None:
        if isinstance(event, ConnectionEstablished):
            va, rkey = REPLY.unpack(event.private_data)
            for off in range(0, size, 1 << 20):
                session.post_write(src_region, off, 1 << 20, va + off, rkey)
        elif isinstance(event, WriteCompleted) and len(host.events_of(WriteCompleted)) == 4:
            done.append(net.now)

    def push_back(host: Host, plane: int, batch: list[tuple[bytes, object, int]]) -> None:
        if session.sender is not None and session.stats.bytes_acked > 256 << 10:
            inflight.append(session.sender._in_flight())
        for i, (data, addr, tos) in enumerate(batch):
            pkt = decode_packet(data)
            if isinstance(pkt, SackPacket):
                pkt.cc = replace(pkt.cc, rcv_cwnd_pen=pen)
                batch[i] = (pkt.encode(), addr, tos)

    a.on_receive = push_back
    session = a.connect(b, cfg, on_event=on_event)
    net.drive_until(lambda: bool(done), timeout=1.0)
    assert isinstance(session.cc, Nscc)
    return max(inflight), session.cc.p.maxwnd, bool(done) and bytes(dst) == src


def test_a_receiver_that_asks_for_half_the_window_gets_half_in_flight() -> None:
    free, maxwnd, intact = run_with_pen(0)
    assert intact and 0.9 * maxwnd <= free <= maxwnd
    halved, maxwnd, intact = run_with_pen(64)
    assert intact and 0.45 * maxwnd <= halved <= 0.5 * maxwnd
