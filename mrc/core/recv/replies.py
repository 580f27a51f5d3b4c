"""`Replies`: the packets a receiver answers with — RELIABILITY_SACK, RELIABILITY_NACK and
ACKNOWLEDGE — encoded and put on a reverse EV of the right plane (docs/DESIGN.md §4, §6).

What to answer and when (the triggers, the scoreboard a SACK's bitmap is read from, which
message outcomes an ACK coalesces) is receiver.py's; the reverse EVs themselves are paths.py's.
"""

from __future__ import annotations

import struct
from typing import Final

from ...wire.ack import NETH, NackReason, SackMark, Syndrome
from ...wire.bth import EVX_BIT, PSN_MASK, Opcode
from ...wire.packet import NackPacket, encode_sack
from ..config import SessionConfig
from ..paths.evs import ev_plane
from ..paths.planes import PlaneTable
from ..stats import SessionStats
from ..transmit import Addr, Transmit

#: ACKNOWLEDGE: BTH (opcode, TVer byte, P_Key, EVX | DestQP, PSN word), EVXH, AETH.
_ACK_LAYOUT: Final = struct.Struct(">BBHIIII")
_PACK_ACK: Final = _ACK_LAYOUT.pack
_ACK_OP: Final = Opcode.ACKNOWLEDGE.value
_ACK: Final = int(Syndrome.ACK)
_NAK_REMOTE_ACCESS: Final = int(Syndrome.NAK_REMOTE_ACCESS)


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
        #: Per plane, the EV the latest answered packet came in on (planes whose EVs mirror).
        self._proven: dict[int, int] = {}

    def arrived(self, plane: int, ev: int) -> None:
        """A packet came in on `plane` over `ev`: on a plane whose EVs mirror, answers without
        an EV of their own (an ACK) take that path (`route`)."""
        if ev_plane(ev) == plane:
            self._proven[plane] = ev

    def route(self, plane: int, force: bool, ev: int | None = None) -> tuple[int, int] | None:
        """(plane, reverse EV) to answer a packet that came in on `plane` over `ev`: that plane
        itself when `force`, else the plane paths.py picks; None while the peer has no address
        there. On a plane whose EVs name paths the answer takes the mirror of `ev`, or of the
        EV the latest packet noted there came in on: that packet just proved the path, where the
        next reverse EV in turn may sit on one that died since a probe last proved it (a
        flapping tier-1 link lost every other answer: docs/DESIGN.md §4)."""
        out_plane = plane if force else self.paths.reverse_plane(plane)
        if out_plane is None or out_plane not in self.peer_addrs:
            return None
        pl = self.paths.planes[out_plane]
        if out_plane == plane and pl.mirror:
            if ev is not None and ev_plane(ev) == plane:
                self._proven[plane] = ev
                return plane, ev
            proven = self._proven.get(plane)
            if proven is not None:
                return plane, proven
        return out_plane, pl.reverse_ev()

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

    def nack(self, reason: NackReason, psn: int, entropy: int, tx_ts: int, plane: int) -> None:
        """A NACK for the data packet `psn` that came on EV `entropy` with TSETH timestamp
        `tx_ts` (-1: none)."""
        route = self.route(plane, False, entropy)
        if route is None:
            return
        out_plane, ev = route
        neth = NETH(nack_reason=reason, entropy=entropy, nack_psn=psn, tx_timestamp=max(tx_ts, 0))
        data = NackPacket(
            dest_qp=self.dest_qp, psn=psn, ev=ev, neth=neth, p_key=self.config.p_key
        ).encode()
        self.stats.nacks_sent += 1
        self.emit(out_plane, ev, data)

    def acknowledge(self, status: int, msn: int, plane: int, cack: int) -> None:
        route = self.route(plane, False)
        if route is None:
            return
        out_plane, ev = route
        # IBTA syndromes (docs/WIRE.md §4): an ACK, or a remote access error for a message a
        # region refused (one answer whatever the cause, receiver.py).
        syndrome = _NAK_REMOTE_ACCESS if status else _ACK
        # The bytes of AckPacket(…, AETH(syndrome, msn)).encode() in one pack call: every
        # small message's one answer (docs/DESIGN.md §6); the values are ours and in range.
        data = _PACK_ACK(
            _ACK_OP, 0, self.config.p_key, EVX_BIT | self.dest_qp, cack & PSN_MASK, ev,
            syndrome << 24 | msn,
        )  # fmt: skip
        self.emit(out_plane, ev, data)

    def emit(self, plane: int, ev: int, data: bytes) -> None:
        ps = self.stats.plane(plane)
        ps.packets_sent += 1
        ps.bytes_sent += len(data)
        self.out.append(Transmit(plane=plane, addr=self.peer_addrs[plane], data=data, ev=ev))
