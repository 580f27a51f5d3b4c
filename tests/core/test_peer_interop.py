"""A session talking to a peer that builds control packets the way other MRC implementations do
(docs/WIRE.md §4, revision 1.1): AETH syndromes as IBTA defines them, no V bit on the RTT echo,
endpoint probe ids in BTH.PSN. Stories in virtual time after a real handshake."""

from __future__ import annotations

import struct

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import WriteCompleted
from mrc.core.session import Session
from mrc.sim import LinkParams, Network
from mrc.wire.ack import AETH, SETH, CCState
from mrc.wire.bth import ENDPOINT_QPN, Opcode
from mrc.wire.packet import AckPacket, DataPacket, EndpointPacket, SackPacket, decode_packet
from mrc.wire.probe import EETH, ERTH, EndpointOp

REPLY = struct.Struct(">QI")


class RttSink:
    """A session's trace that keeps only its RTT samples (`mrc.core.sink.TraceSink`): the
    seam through which the sender reports each sample it takes, compiled or pure."""

    recording = True

    def __init__(self) -> None:
        self.rtts: list[float] = []

    def rtt(self, plane: int, ev: int, rtt: float, now: float) -> None:
        self.rtts.append(rtt)

    def evs_started(self, evs: object, now: float) -> None: ...
    def evs_changed(self, ev: object, now: float, loss: str, signal: str) -> None: ...
    def ev_changed(self, rec: object, now: float, signal: str = "") -> None: ...
    def plane(self, plane: int, up: bool, reason: str, now: float) -> None: ...
    def port(self, plane: int, up: bool, now: float) -> None: ...
    def retransmit(self, psn: int, ev: int, plane: int, cause: str, now: float) -> None: ...
    def cc_due(self, now: float) -> bool:
        return False

    def sample(self, now: float, drops: object = None, cc: object = None) -> None: ...


class Story:
    """`a` writes into `b`'s region; after the handshake, `a`'s packets are taken off the wire
    and `b`'s answers are written by hand, as a peer of another make would send them."""

    def __init__(self) -> None:
        self.net = Network(seed=5)
        a, b = self.net.pair(2, LinkParams(latency=10e-6))
        self.a = a
        region = b.regions.register(bytearray(1 << 16))
        cfg = SessionConfig(plane_mask=0b11, payload_mtu=1024, initial_psn=500)
        b.listen(cfg, accept=lambda _: REPLY.pack(region.base_va, region.rkey))
        self.trace = RttSink()
        self.sa: Session = a.connect(b, cfg, trace=self.trace)  # type: ignore[arg-type]
        self.net.drive(0.001)
        self.src = a.regions.register(bytearray(b"x" * 4096))
        self.va, self.rkey = region.base_va, region.rkey
        self.events: list[object] = []

    def write_one_packet(self, now: float) -> DataPacket:
        """Post a 100-byte WRITE and take its one data packet off `a`'s outputs."""
        self.sa.post_write(self.src, 0, 100, self.va, self.rkey)
        data = [decode_packet(t.data) for t in self.sa.datagrams_to_send(now)]
        (pkt,) = [p for p in data if isinstance(p, DataPacket)]
        return pkt

    def deliver(self, packet: bytes, now: float, plane: int = 0) -> list[object]:
        """Hand `packet` to `a`; return what `a` sends, decoded (its events go to `events`)."""
        sessions = self.a.endpoint.receive_datagrams(plane, [(packet, "b", 2)], now)
        out: list[object] = [
            decode_packet(t.data) for s in sessions for t in s.datagrams_to_send(now)
        ]
        while (event := self.sa.next_event()) is not None:
            self.events.append(event)
        return out


@pytest.fixture
def story() -> Story:
    return Story()


def sack_for(s: Story, pkt: DataPacket, *, valid: bool, echo: int) -> bytes:
    """The SACK another implementation sends for `pkt`: type/next 0, V never set."""
    return SackPacket(
        dest_qp=s.sa.qpn, cack_psn=(pkt.psn + 1) & 0xFFFFFF, ev=0x01000003,
        seth=SETH(ack_psn_offset=-1, entropy=pkt.ev, cack_psn=(pkt.psn + 1) & 0xFFFFFF,
                  sack_offset=0, sack_bitmap=0),
        cc=CCState(tx_timestamp=echo, valid=valid, rcvd_bytes=100), port_state=None,
    ).encode()  # fmt: skip


def test_an_echo_without_the_v_bit_still_gives_an_rtt_sample(story: Story) -> None:
    t0 = story.net.now
    pkt = story.write_one_packet(t0)
    assert pkt.tx_timestamp
    # 30 µs later the peer's SACK echoes the packet's timestamp but leaves V clear.
    story.deliver(sack_for(story, pkt, valid=False, echo=pkt.tx_timestamp), t0 + 30e-6)
    assert story.trace.rtts == [pytest.approx(30e-6)]


def test_an_absent_echo_gives_no_rtt_sample(story: Story) -> None:
    t0 = story.net.now
    pkt = story.write_one_packet(t0)
    # V clear and the echo 0: the peer did not echo; nothing to sample.
    story.deliver(sack_for(story, pkt, valid=False, echo=0), t0 + 30e-6)
    assert story.trace.rtts == []
    assert story.sa.stats.bytes_acked == 100  # the SACK was taken, without a sample


@pytest.mark.parametrize(("syndrome", "status"), [(0x1F, 0), (0x00, 0), (0x05, 0),
                                                  (0x62, 0x62), (0x20, 0x20)])  # fmt: skip
def test_an_aeth_syndrome_as_ibta_defines_it(story: Story, syndrome: int, status: int) -> None:
    # Any ACK syndrome (bits 7-5 = 000, whatever the credit count: MRC peers send 0x1F)
    # completes the WRITE; an RNR or remote access NAK fails it with that syndrome.
    t0 = story.net.now
    pkt = story.write_one_packet(t0)
    ack = AckPacket(dest_qp=story.sa.qpn, psn=(pkt.psn + 1) & 0xFFFFFF, ev=0x01000003,
                    aeth=AETH(syndrome=syndrome, msn=pkt.msn)).encode()  # fmt: skip
    story.deliver(ack, t0 + 40e-6)
    done = [e for e in story.events if isinstance(e, WriteCompleted)]
    assert done == [WriteCompleted(msn=pkt.msn, status=status)]


def test_an_endpoint_probe_id_travels_in_the_psn(story: Story) -> None:
    # The peer's EV_PROBE names probe id 0x0BAD in BTH.PSN (upper 8 bits set: reserved);
    # the answer echoes it there, in a 36-byte EETH.
    now = story.net.now
    request = bytearray(EndpointPacket(
        opcode=Opcode.ENDPOINT_REQUEST, dest_qp=story.sa.qpn, ev=0x00000002,
        header=ERTH(op=EndpointOp.EV_PROBE, port_status_mask=0b11, tx_timestamp=0x1234),
        probe_id=0x0BAD,
    ).encode())  # fmt: skip
    request[9] = 0xFF
    out = story.deliver(bytes(request), now)
    (answer,) = [p for p in out if isinstance(p, EndpointPacket)]
    assert answer.opcode is Opcode.ENDPOINT_RESPONSE and answer.probe_id == 0x0BAD
    assert answer.header == EETH(op=EndpointOp.EV_PROBE, port_status_mask=0b11,
                                 tx_timestamp=0x1234)  # fmt: skip
    assert len(answer.encode()) == 16 + 36


def test_a_connectionless_endpoint_request_reaches_the_peers_connection(story: Story) -> None:
    # Other implementations send endpoint messages to QPN 0x2, outside any connection: an
    # unsecured connection with that peer on that plane takes them (docs/WIRE.md §4).
    now = story.net.now
    status = EndpointPacket(
        opcode=Opcode.ENDPOINT_REQUEST, dest_qp=ENDPOINT_QPN, ev=0x00000003,
        header=ERTH(op=EndpointOp.PORT_STATUS, port_status_mask=0b01, tx_timestamp=9),
    ).encode()  # fmt: skip
    out = story.deliver(status, now)
    # The peer says it cannot receive on plane 1 any more: the connection stops using it.
    assert not story.sa.paths.usable(1) and story.sa.paths.usable(0)
    (answer,) = [p for p in out if isinstance(p, EndpointPacket)]
    assert answer.dest_qp == ENDPOINT_QPN and answer.opcode is Opcode.ENDPOINT_RESPONSE
    probe = EndpointPacket(
        opcode=Opcode.ENDPOINT_REQUEST, dest_qp=ENDPOINT_QPN, ev=0x00000005,
        header=ERTH(op=EndpointOp.EV_PROBE, port_status_mask=0b01, tx_timestamp=10),
        probe_id=0x77,
    ).encode()  # fmt: skip
    (answer,) = [p for p in story.deliver(probe, now) if isinstance(p, EndpointPacket)]
    assert (answer.dest_qp, answer.probe_id, answer.ev) == (ENDPOINT_QPN, 0x77, 0x00000005)
    # From an address that is no connection's peer: counted, nothing answered.
    sessions = story.a.endpoint.receive_datagrams(0, [(probe, "stranger", 2)], now)
    assert sessions == [] and story.a.endpoint.drops["endpoint_qpn"] == 1


@pytest.mark.parametrize(
    ("shift", "syndrome"),
    [
        (0x400000, 0x62),  # far outside what is in flight, failing the WRITE
        (0x400000, 0x1F),  # far outside, completing it
        (0, 0x1F),  # at the LAST itself: the peer's cack_psn has not passed it
        (2, 0x1F),  # past our next PSN: nothing we sent
    ],
)
def test_an_aeth_whose_psn_does_not_cover_its_message_is_dropped(
    story: Story, shift: int, syndrome: int
) -> None:
    # A blind forgery on an unsecured connection (found by fuzzing: one such ACK settled a
    # message's lost packets as arrived, una passed the peer's cack_psn for good and each
    # new packet drew a PSN_OOR_WINDOW NACK and a resend, without end): an AETH counts only
    # when its BTH.PSN, the responder's cack_psn, lies after its message's LAST and at most
    # at our next PSN. The genuine ACK, 30 µs later, completes the WRITE as ever.
    t0 = story.net.now
    pkt = story.write_one_packet(t0)
    forged = AckPacket(dest_qp=story.sa.qpn, psn=(pkt.psn + shift) & 0xFFFFFF, ev=0x01000003,
                       aeth=AETH(syndrome=syndrome, msn=pkt.msn)).encode()  # fmt: skip
    story.deliver(forged, t0 + 40e-6)
    assert [e for e in story.events if isinstance(e, WriteCompleted)] == []
    assert story.sa.stats.drops_by_reason["aeth_psn"] == 1
    assert story.sa.stats.bytes_acked == 0
    genuine = AckPacket(dest_qp=story.sa.qpn, psn=(pkt.psn + 1) & 0xFFFFFF, ev=0x01000003,
                        aeth=AETH(syndrome=0x1F, msn=pkt.msn)).encode()  # fmt: skip
    story.deliver(genuine, t0 + 70e-6)
    done = [e for e in story.events if isinstance(e, WriteCompleted)]
    assert done == [WriteCompleted(msn=pkt.msn, status=0)]
    assert story.sa.stats.bytes_acked == 100
