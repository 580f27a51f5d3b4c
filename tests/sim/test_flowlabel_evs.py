"""EVs in the IPv6 flow label instead of EVXH (docs/WIRE.md §3, §6), as stories in the simulator,
whose hosts pass each arrival's label to the core the way io does (`Host.flowlabel`).

Both sides offering it agree on it in CM; then no datagram but CM carries an EVXH, and a
transfer ends byte-identical. One side not offering it keeps EVXH on both. Losses on a plane
retire the EVs they hit: the receiver read them from the labels and echoed them in its SACKs,
and the sender matched them, as with EVXH."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import PathRetired
from mrc.experiments import scenarios
from mrc.sim import Delivery, Host, LinkParams, Network
from mrc.wire.bth import CM_OPCODES, Opcode
from mrc.wire.packet import DataPacket, SackPacket, decode_packet

CM = frozenset(op.value for op in CM_OPCODES)
Seen = list[tuple[str, int, bytes, int]]


def run(a_enc: str, b_enc: str, loss: float = 0.0) -> tuple[
        scenarios.Transfer, Seen, Host, Host]:  # fmt: skip
    net = Network(7)
    a, b = net.pair(4, LinkParams(rate_bps=1e9, latency=5e-6, queue_bytes=8 << 20))
    a.flowlabel = b.flowlabel = True
    seen: Seen = []

    def tap(host: Host, plane: int, batch: list[Delivery]) -> None:
        seen.extend((host.name, plane, bytes(data), word) for data, _src, word in batch)

    a.on_receive = b.on_receive = tap
    if loss:
        # Data packets from a on plane 1 are lost at random.
        rng = random.Random(5)
        a.links[1].params.drop_if = lambda data: len(data) > 1000 and rng.random() < loss
    cfg: SessionConfig = scenarios._config("bitmap")
    t = scenarios.Transfer(net, a, b, replace(cfg, ev_encoding=a_enc), 8 * scenarios.MiB,
                           1 << 20, listen=replace(cfg, ev_encoding=b_enc))  # fmt: skip
    assert net.drive_until(t.done, timeout=5)
    assert bytes(t.dst) == t.src
    return t, seen, a, b


@pytest.mark.parametrize(("a_enc", "b_enc", "agreed"), [
    ("flowlabel", "flowlabel", True),
    ("flowlabel", "evxh", False),
    ("evxh", "flowlabel", False),
])  # fmt: skip
def test_both_sides_must_offer_the_flow_label(a_enc: str, b_enc: str, agreed: bool) -> None:
    t, seen, _, b = run(a_enc, b_enc)
    (sb,) = b.endpoint.sessions.values()
    assert t.session.config.ev_encoding == sb.config.ev_encoding
    assert sb.config.ev_encoding == ("flowlabel" if agreed else "evxh")
    non_cm = [(d, w) for _, _, d, w in seen if d[0] not in CM]
    assert len(non_cm) > 2000  # data one way, SACKs, probes and port status the other
    with_evxh = sum(1 for d, _ in non_cm if d[4] & 1)
    assert with_evxh == (0 if agreed else len(non_cm))
    # b's SACKs name the EVs a's data came on: read from the labels when agreed.
    sent = {ev for ev, r in t.session.paths.evs.by_ev.items() if r.packets_sent}
    echoed = {p.seth.entropy for h, _, d, _ in seen if h == "a" and d[0] not in CM
              for p in [decode_packet(d)] if isinstance(p, SackPacket) and not p.seth.pr}
    assert len(sent) >= 16 and echoed <= sent and len(echoed) >= len(sent) // 2
    if agreed:
        assert all(ev & 0xFFFFF == ev & 0xFFFFFF for ev in sent)  # 20-bit selectors


def test_losses_retire_the_evs_read_back_from_the_labels() -> None:
    t, seen, a, _ = run("flowlabel", "flowlabel", loss=0.01)
    retired = [e for _, _, e in a.events if isinstance(e, PathRetired)]
    assert retired and {e.plane for e in retired} == {1}
    assert all(e.ev in t.session.paths.evs.by_ev for e in retired)
    assert t.session.stats.retransmits > 0
    assert not any(d[4] & 1 for _, _, d, _ in seen if d[0] not in CM)


def test_a_packet_without_evxh_or_label_names_no_ev_and_is_dropped() -> None:
    t, _, _, b = run("flowlabel", "flowlabel")
    (sb,) = b.endpoint.sessions.values()
    placed = sb.stats.bytes_placed
    assert t.session.sender is not None
    # A data packet as a flow-label peer frames it (no EVXH), delivered with no label at all.
    data = DataPacket(Opcode.WRITE_ONLY, dest_qp=sb.qpn, psn=t.session.sender.next_psn,
                      ev=0, a=True, rtx=False, rqmsn=0, msn=0, tx_timestamp=1, va=0, rkey=0,
                      dma_length=4, imm=None, payload=b"data").encode()  # fmt: skip
    stripped = bytes(data[:4]) + bytes((data[4] & 0xFE,)) + data[5:12] + data[16:]
    for s in b.endpoint.receive_datagrams(0, [(stripped, "a", 2)], b.net.now):
        b.flush(s)
    assert sb.stats.drops_by_reason["ev_no_label"] == 1
    assert sb.stats.bytes_placed == placed
