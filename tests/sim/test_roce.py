"""The RoCE baseline (mrc.sim.roce): go-back-N, the RTO and its retry limit, DCQCN's cut and
recovery, CNPs, and two RoceHosts moving a transfer through the simulator."""

from __future__ import annotations

import pytest

from mrc.sim.link import ECN_CE, LinkParams
from mrc.sim.roce import (
    ACK,
    CNP,
    DATA,
    HEADER,
    NAK,
    RoceDecodeError,
    RoceParams,
    RoceReceiver,
    RoceSender,
    decode,
    encode,
)
from mrc.sim.roce_host import RoceHost, RoceNetwork, connect_roce

MTU = 1000
P = RoceParams(line_rate=8e9, mtu=MTU, window=16, ack_every=4, burst=4, rto=1e-3)
#: One full packet at line rate: (1000 + 32) bytes at 8 Gbit/s.
PKT = (MTU + HEADER) * 8 / 8e9


def psns(out: list[tuple[bytes, int]]) -> list[int]:
    return [decode(d)[3] for d, _ in out]


def test_sender_paces_bursts_at_its_rate() -> None:
    s = RoceSender(1, 2, 10 * MTU, P, now=0.0)
    s.handle_timer(0.0)
    # burst 4: four packets leave at once, the next is due one packet time after the fourth.
    assert psns(s.datagrams_to_send()) == [0, 1, 2, 3]
    assert s.get_timer() == pytest.approx(4 * PKT)
    s.handle_timer(4 * PKT)
    assert psns(s.datagrams_to_send()) == [4, 5, 6, 7]


def test_every_fourth_and_the_last_packet_ask_for_an_ack() -> None:
    s = RoceSender(1, 2, 6 * MTU - 10, P, now=0.0)
    s.handle_timer(0.0)
    s.handle_timer(4 * PKT)
    out = s.datagrams_to_send()
    assert [decode(d)[1] for d, _ in out] == [0, 0, 0, 1, 0, 1]
    assert len(out[-1][0]) == HEADER + MTU - 10  # the last packet carries the remainder


def test_receiver_in_order_ack_hole_nak_once_and_duplicate() -> None:
    r = RoceReceiver(2, 1, P)
    r.receive_data(0, 0, MTU, 0x02, 0.0)
    r.receive_data(1, 1, MTU, 0x02, 0.0)  # A bit: acknowledged
    assert [(decode(d)[0], decode(d)[3]) for d, _ in r.datagrams_to_send()] == [(ACK, 2)]
    r.receive_data(0, 3, MTU, 0x02, 0.0)  # PSN 2 lost: dropped, NAK 2
    r.receive_data(1, 4, MTU, 0x02, 0.0)  # still the hole: no second NAK
    assert [(decode(d)[0], decode(d)[3]) for d, _ in r.datagrams_to_send()] == [(NAK, 2)]
    assert (r.epsn, r.out_of_order, r.bytes_placed) == (2, 2, 2 * MTU)
    r.receive_data(1, 1, MTU, 0x02, 0.0)  # a duplicate that asks: ACK what we have
    assert [(decode(d)[0], decode(d)[3]) for d, _ in r.datagrams_to_send()] == [(ACK, 2)]
    assert r.duplicates == 1


def test_nak_goes_back_to_the_hole() -> None:
    s = RoceSender(1, 2, 16 * MTU, P, now=0.0)
    s.handle_timer(0.0)
    s.handle_timer(4 * PKT)
    s.datagrams_to_send()
    assert s.next_psn == 8
    s.receive(NAK, 3, 5 * PKT)
    # 0-2 acknowledged by the NAK, 3-7 go again; pacing starts over from the hole.
    assert (s.una, s.naks, s.retransmitted) == (3, 1, 5)
    assert psns(s.datagrams_to_send())[0] == 3


def test_ack_for_psns_never_sent_is_ignored() -> None:
    s = RoceSender(1, 2, 16 * MTU, P, now=0.0)
    s.handle_timer(0.0)
    s.receive(ACK, 9, 1e-6)
    assert s.una == 0


def test_rto_goes_back_and_the_qp_fails_after_retry_limit() -> None:
    p = RoceParams(line_rate=8e9, mtu=MTU, window=16, burst=4, rto=1e-3, retry_limit=2)
    s = RoceSender(1, 2, 2 * MTU, p, now=0.0)
    s.handle_timer(0.0)
    assert psns(s.datagrams_to_send()) == [0, 1]
    assert s.rto_at == pytest.approx(1e-3)
    s.handle_timer(1e-3)  # timeout 1: both again
    assert psns(s.datagrams_to_send()) == [0, 1]
    assert (s.timeouts, s.retransmitted, s.failed_at) == (1, 2, None)
    s.handle_timer(2e-3 + 1e-9)
    s.datagrams_to_send()
    s.handle_timer(3e-3 + 2e-9)  # the third timeout in a row without progress
    assert s.failed_at == pytest.approx(3e-3 + 2e-9)
    assert s.finished() and s.get_timer() is None


def test_progress_resets_the_retry_count_and_completion_stops_timers() -> None:
    s = RoceSender(1, 2, 2 * MTU, P, now=0.0)
    s.handle_timer(0.0)
    s.handle_timer(1e-3)
    assert s.retries == 1
    s.receive(ACK, 1, 1.1e-3)
    assert (s.retries, s.una) == (0, 1)
    s.receive(ACK, 2, 1.2e-3)
    assert s.done_at == pytest.approx(1.2e-3) and s.get_timer() is None


def test_dcqcn_cut_once_per_interval_then_fast_recovery_and_additive_increase() -> None:
    s = RoceSender(1, 2, 1000 * MTU, P, now=0.0)
    s.receive(CNP, 0, 10e-6)
    # alpha starts at 1 and becomes (1 - g) + g = 1: the rate halves.
    assert s.rate == pytest.approx(4e9) and s.target == pytest.approx(8e9)
    s.receive(CNP, 0, 20e-6)  # inside cut_interval: alpha rises, the rate stays
    assert s.rate == pytest.approx(4e9) and s.cnps == 2
    t = 20e-6
    for stage in range(1, 6):  # five fast-recovery stages: halfway to the target each time
        t = s.increase_at
        s.handle_timer(t)
        assert s.rate == pytest.approx(8e9 - 4e9 / 2**stage)
    s.handle_timer(s.increase_at)  # additive: the target is capped at line rate
    assert s.target == pytest.approx(8e9)


def test_alpha_decays_without_cnps() -> None:
    s = RoceSender(1, 2, 1000 * MTU, P, now=0.0)
    s.handle_timer(P.alpha_timer)
    assert s.alpha == pytest.approx(1 - P.g)


def test_receiver_sends_one_cnp_per_interval_for_ce_marks() -> None:
    r = RoceReceiver(2, 1, P)
    r.receive_data(0, 0, MTU, 0x02 | ECN_CE, 0.0)
    r.receive_data(0, 1, MTU, 0x02 | ECN_CE, 10e-6)
    r.receive_data(0, 2, MTU, 0x02 | ECN_CE, 60e-6)
    kinds = [decode(d)[0] for d, _ in r.datagrams_to_send()]
    assert kinds == [CNP, CNP] and r.cnps_sent == 2


def test_decode_refuses_short_and_unknown_packets() -> None:
    with pytest.raises(RoceDecodeError, match="shorter than a header"):
        decode(b"\x01" * 10)
    with pytest.raises(RoceDecodeError, match="unknown packet kind 9"):
        decode(bytes([9]) + bytes(40))
    assert decode(encode(DATA, 7, 5, flags=1, payload=3)) == (DATA, 1, 7, 5)


def test_bad_params_are_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        RoceParams(window=0).validate()
    with pytest.raises(ValueError, match="g must be"):
        RoceParams(g=1.5).validate()
    with pytest.raises(ValueError, match="at least one byte"):
        RoceSender(1, 2, 0, P, now=0.0)


def _pair(loss: float = 0.0) -> tuple[RoceNetwork, RoceHost, RoceHost]:
    net = RoceNetwork(seed=3)
    a, b = net.add_host("a"), net.add_host("b")
    assert isinstance(a, RoceHost) and isinstance(b, RoceHost)
    net.link(a, b, 0, LinkParams(rate_bps=8e9, latency=2e-6, queue_bytes=1 << 20, loss=loss))
    return net, a, b


def test_two_hosts_move_a_transfer_at_line_rate() -> None:
    net, a, b = _pair()
    s, r = connect_roce(a, b, 200 * MTU, P, plane=0, ev=0)
    assert net.drive_until(s.finished, timeout=0.1)
    assert s.done_at is not None and r.bytes_placed == 200 * MTU
    assert s.retransmitted == 0 and s.packets_sent == 200
    # 200 packets at line rate plus one round trip for the last ACK.
    assert s.done_at == pytest.approx(200 * PKT + 2 * 2e-6 + (HEADER * 8 / 8e9), rel=0.01)


def test_loss_is_repaired_by_go_back_n() -> None:
    net, a, b = _pair(loss=0.02)
    s, r = connect_roce(a, b, 300 * MTU, P, plane=0, ev=0)
    assert net.drive_until(s.finished, timeout=1.0)
    assert s.done_at is not None and r.bytes_placed == 300 * MTU
    assert s.retransmitted > 0 and s.packets_sent == 300 + s.retransmitted


def test_host_counts_what_it_cannot_use() -> None:
    net, a, b = _pair()
    a.inject(0, "b", b"\x01\x02")
    a.inject(0, "b", encode(DATA, 99, 0, payload=10))
    s, r = connect_roce(a, b, MTU, P, plane=0, ev=0)
    a.inject(0, "b", encode(ACK, r.qpn, 0))  # an ACK to a responder
    net.drive(0.01)
    assert dict(b.roce_counters) == {"roce_malformed": 1, "roce_no_qp": 1, "roce_wrong_kind": 1}
    assert s.done_at is not None
