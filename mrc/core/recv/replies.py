"""`Replies`: the packets a receiver answers with — RELIABILITY_SACK, RELIABILITY_NACK and
ACKNOWLEDGE — encoded and put on a reverse EV of the right plane (docs/DESIGN.md §4, §6).

What to answer and when (the triggers, the scoreboard a SACK's bitmap is read from, which
message outcomes an ACK coalesces) is receiver.py's; the reverse EVs themselves are paths.py's.
"""

from __future__ import annotations

from ...wire.ack import AETH, NETH, NackReason, SackMark, Syndrome
from ...wire.packet import AckPacket, DataPacket, NackPacket, encode_sack
from ..config import SessionConfig
from ..paths.planes import PlaneTable
from ..stats import SessionStats
from ..transmit import Addr, Transmit


class Replies:
    """Writes one receiver's answers into `out`, which the session drains at each pull."""

    def __init__(
        self,
        config: SessionConfig,
        *,
        paths: PlaneTable,
        stats: SessionStats,
        peer_addrs: dict[int, Addr],
        dest_qp: int,
    ) -> None:
        self.config = config
        self.paths = paths
        self.stats = stats
        self.peer_addrs = peer_addrs
        #: The peer's QPN, which the handshake named.
        self.dest_qp = dest_qp
        self.out: list[Transmit] = []

    def route(self, plane: int, force: bool) -> tuple[int, int] | None:
        """(plane, reverse EV) to answer a packet that came in on `plane`: that plane itself
        when `force`, else the plane paths.py picks; None while the peer has no address there."""
        out_plane = plane if force else self.paths.reverse_plane(plane)
        if out_plane is None or out_plane not in self.peer_addrs:
            return None
        return out_plane, self.paths.planes[out_plane].reverse_ev()

    def sack(
        self,
        plane: int,
        ev: int,
        *,
        cack: int,
        offset: int,
        entropy: int,
        sack_offset: int,
        bitmap: int,
        ce: bool,
        probe: bool,
        tx_ts: int | None,
        held: int,
        rcvd_bytes: int,
    ) -> None:
        # The bytes of SackPacket(SETH, CCState, port_state).encode(), in one pack call.
        data = encode_sack(
            dest_qp=self.dest_qp,
            cack_psn=cack,
            ev=ev,
            ack_psn_offset=offset,
            entropy=entropy,
            sack_offset=sack_offset,
            sack_bitmap=bitmap,
            m=SackMark.SKIP_ONCE if ce else SackMark.NONE,
            pr=probe,
            mpr=self.config.mpr,
            tx_timestamp=tx_ts or 0,
            valid=tx_ts is not None,
            ooo_count=min(held, 0x7FFF),
            rcvd_bytes=rcvd_bytes,
            # PORTSTATE in every SACK: the planes we can receive on (docs/DESIGN.md §4).
            port_state=self.paths.port_mask(),
            p_key=self.config.p_key,
        )
        self.emit(plane, ev, data)

    def nack(self, reason: NackReason, pkt: DataPacket, plane: int) -> None:
        route = self.route(plane, False)
        if route is None:
            return
        out_plane, ev = route
        neth = NETH(
            nack_reason=reason,
            entropy=pkt.ev,
            nack_psn=pkt.psn,
            tx_timestamp=pkt.tx_timestamp or 0,
        )
        data = NackPacket(
            dest_qp=self.dest_qp, psn=pkt.psn, ev=ev, neth=neth, p_key=self.config.p_key
        ).encode()
        self.stats.nacks_sent += 1
        self.emit(out_plane, ev, data)

    def acknowledge(self, status: int, msn: int, plane: int, cack: int) -> None:
        route = self.route(plane, False)
        if route is None:
            return
        out_plane, ev = route
        data = AckPacket(
            dest_qp=self.dest_qp,
            psn=cack,
            ev=ev,
            # IBTA syndromes (docs/WIRE.md §4): an ACK, or a remote access error for a message
            # that failed BAD_RKEY or OUT_OF_BOUNDS (its NACK said which).
            aeth=AETH(syndrome=Syndrome.NAK_REMOTE_ACCESS if status else Syndrome.ACK, msn=msn),
            p_key=self.config.p_key,
        ).encode()
        self.emit(out_plane, ev, data)

    def emit(self, plane: int, ev: int, data: bytes) -> None:
        ps = self.stats.plane(plane)
        ps.packets_sent += 1
        ps.bytes_sent += len(data)
        self.out.append(Transmit(plane=plane, addr=self.peer_addrs[plane], data=data, ev=ev))
