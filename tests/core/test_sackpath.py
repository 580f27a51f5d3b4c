"""The one SACK reader (mrc.core.send.sackpath): the common SACK read from its bytes does what
decoding it does, and everything else is left to the decoder (docs/WIRE.md §4)."""

from __future__ import annotations

from test_flowcell import PSN0, Pair, data_transmits

from mrc.core.send.sackpath import on_decoded, take_sack
from mrc.wire.errors import DecodeError
from mrc.wire.fast import encode_sack
from mrc.wire.packet import SackPacket, decode_packet

MARK_SKIP_ONCE, MARK_ALWAYS_SKIP = 1, 2


def _story(pair: Pair) -> list[bytes]:
    """SACKs for a 16-packet WRITE in two flowcells: plain, marked, PR, with PORTSTATE, and
    four the strict decoder refuses (mark 3, wrong P_Key, a byte too many, TVer 1)."""
    txs = data_transmits(pair.pull())
    assert len(txs) == 2
    qp, ev0, ev1 = pair.sa.qpn, txs[0].ev, txs[1].ev

    def sack(cack: int, **kw: int) -> bytes:
        fields = {"ack_psn_offset": -1, "entropy": ev0, "sack_offset": 0, "sack_bitmap": 0}
        fields.update(kw)
        return encode_sack(dest_qp=qp, cack_psn=cack, ev=ev0, **fields)  # type: ignore[arg-type]

    bad_mark = bytearray(sack(PSN0 + 2))
    bad_mark[17] |= 0x60  # SETH m = 3
    bad_tver = bytearray(sack(PSN0 + 2))
    bad_tver[1] = 1
    return [
        sack(PSN0 + 2, sack_bitmap=0x3 << 60, tx_timestamp=txs[0].data[22] << 8 | txs[0].data[23]),
        sack(PSN0 + 4, m=MARK_SKIP_ONCE, ack_psn_offset=1, entropy=ev1, sack_offset=-4,
             sack_bitmap=0xFF << 48),
        sack(PSN0 + 4, pr=True, ack_psn_offset=3),
        sack(PSN0 + 5, port_state=0b01, m=MARK_ALWAYS_SKIP, entropy=ev1),
        bytes(bad_mark),
        sack(PSN0 + 9, p_key=0x7FFF),
        sack(PSN0 + 9) + b"\0",
        bytes(bad_tver),
        sack(PSN0 + 16, sack_offset=-16),
    ]  # fmt: skip


def _state(pair: Pair) -> tuple[object, ...]:
    s = pair.sa
    sender = s.sender
    assert sender is not None and s.planes is not None
    return (
        sender.una, sender.flight.bytes, s.stats.bytes_acked, dict(s.stats.drops_by_reason),
        [(e["ev"], e["state"]) for e in s.ev_stats(pair.net.now)], s.planes._peer_mask,
        s.cc.window, [m.acked for m in sender.outstanding],
        [tx.data for tx in s.datagrams_to_send(pair.net.now)],
    )  # fmt: skip


def test_take_sack_takes_the_common_layouts_and_leaves_the_rest() -> None:
    pair = Pair(payload_mtu=1024, flowcell=8)
    pair.post(0, 16 * 1024)
    story = _story(pair)
    sender, planes = pair.sa.sender, pair.sa.planes
    assert sender is not None and planes is not None
    took = [take_sack(d, 0xFFFF, sender, planes, pair.net.now) for d in story]
    assert took == [True, True, True, True, False, False, False, False, True]


def test_a_sack_story_ends_alike_read_from_its_bytes_and_decoded() -> None:
    """Two writers, one story: one takes each SACK as its session does (the common ones read
    from their bytes), the other has each decoded and handed to the one SACK reader
    (`on_decoded`), counting what the decoder refuses as the session would. Both end alike."""
    ends = []
    for from_bytes in (True, False):
        pair = Pair(payload_mtu=1024, flowcell=8)
        pair.post(0, 16 * 1024)
        sender, planes = pair.sa.sender, pair.sa.planes
        assert sender is not None and planes is not None
        drops = pair.sa.stats.drops_by_reason
        for data in _story(pair):
            pair.net.drive(pair.net.now + 0.0001)
            if from_bytes:
                pair.sa.receive_datagrams(0, [(data, 0)], pair.net.now)
                continue
            try:
                pkt = decode_packet(data)
            except DecodeError as exc:
                drops[f"decode_{exc.field}"] += 1
                continue
            if pkt.p_key != 0xFFFF:
                drops["p_key"] += 1
                continue
            assert isinstance(pkt, SackPacket)
            on_decoded(pkt, sender, planes, pair.net.now)
        ends.append(_state(pair))
    assert ends[0] == ends[1]
    una, flight, acked, drops_end, *_ = ends[0]
    assert (una, flight, acked) == (PSN0 + 16, 0, 16 * 1024)
    assert drops_end == {"decode_m": 1, "p_key": 1, "decode_length": 1, "decode_tver": 1}
