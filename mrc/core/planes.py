"""Plane transitions of one session: suspicion, probing, DOWN and UP (DESIGN.md §4).

A plane whose RTO expired while other planes delivered later packets becomes *suspect*: it leaves
the rotation and is probed with RELIABILITY_PROBE. An answer puts it back; three probes in a row
left unanswered for longer than the plane's RTO take it DOWN. A DOWN plane (also after a local
send error) is probed at 10 ms doubling to 1 s and returns after three answers. This module
owns those transitions and the probes; the plane table (paths.py) holds the state, the sender
declares a DOWN plane's packets lost (through `on_down`), and the session routes inputs here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..wire.bth import Opcode
from ..wire.packet import EndpointPacket, ProbePacket
from ..wire.probe import ERTH, PETH, EndpointOp
from .config import SessionConfig
from .events import Event, PlaneDown, PlaneUp
from .paths import PathTable, PlaneState
from .sender import tx_timestamp
from .stats import SessionStats
from .timers import Timer, TimerTable
from .transmit import Addr, Transmit

#: Probes remembered for matching answers; older ones count as unanswered anyway.
MAX_PROBES_REMEMBERED = 256


class PlaneMonitor:
    def __init__(
        self,
        config: SessionConfig,
        *,
        paths: PathTable,
        timers: TimerTable,
        stats: SessionStats,
        events: deque[Event],
        peer_addrs: dict[int, Addr],
        out: list[Transmit],
        next_psn: Callable[[], int],
        on_down: Callable[[int], None],
    ) -> None:
        self.config = config
        self.paths = paths
        self.timers = timers
        self.stats = stats
        self.events = events
        self.peer_addrs = peer_addrs
        self.out = out
        self.next_psn = next_psn
        self.on_down = on_down
        self.peer_qpn = 0
        self._probe_id = 0
        self._probes: dict[int, int] = {}  # probe_id → plane

    # -- inputs -------------------------------------------------------------------------------

    def local_status(self, plane: int, up: bool, now: float) -> None:
        """io/ or sim/ saw the local link go down (a send error) or come back."""
        if not up:
            self.down(plane, "local", now)
        elif not self.paths.is_up(plane):
            # Probe at once; answers bring it back (DESIGN.md §4).
            self._start_probing(plane, now)

    def suspect(self, plane: int, now: float) -> None:
        """An RTO hit this plane while others progressed: probe it before giving it up."""
        if self.paths.set_suspect(plane, True):
            self._start_probing(plane, now)

    def down(self, plane: int, reason: str, now: float) -> None:
        if not self.paths.set_state(plane, PlaneState.DOWN, reason):
            return
        self.events.append(PlaneDown(plane=plane, reason=reason))
        self.on_down(plane)
        self._start_probing(plane, now + self.config.probe_interval)

    def on_timer(self, plane: int, now: float) -> None:
        """PLANE_PROBE of `plane` is due: judge the last probe, send the next."""
        pl = self.paths.planes[plane]
        if plane not in self.peer_addrs or (pl.state is PlaneState.UP and not pl.suspect):
            return
        if pl.probe_outstanding:
            # Unanswered = older than the plane's RTO: a busy receiver is not a dead plane.
            overdue = pl.probe_sent_at + pl.rtt.rto
            if now < overdue:
                self.timers.set(Timer.PLANE_PROBE, overdue, plane)
                return
            pl.unanswered += 1
            pl.answers = 0
            if pl.suspect and pl.unanswered >= self.config.restore_answers:
                # Three probes in a row unanswered: the plane is DOWN (DESIGN.md §4).
                self.down(plane, "probes unanswered", now)
                return
        self._send_probe(plane, now)
        self.timers.set(Timer.PLANE_PROBE, now + pl.probe_interval, plane)
        if pl.state is PlaneState.DOWN:
            # Unanswered probes of a DOWN plane back off, 10 ms doubling to 1 s (DESIGN.md §4).
            pl.probe_interval = min(pl.probe_interval * 2, self.config.probe_max_interval)

    def on_answer(self, probe_id: int, now: float) -> None:
        """A SACK with PR answered probe `probe_id` (WIRE.md §4)."""
        plane = self._probes.pop(probe_id, None)
        if plane is None:
            return
        self.stats.probes_answered += 1
        pl = self.paths.planes[plane]
        pl.probe_outstanding = False
        pl.unanswered = 0
        if pl.state is PlaneState.UP:
            # A suspect plane answered: it carries traffic; the RTO was the peer or a path.
            self.paths.set_suspect(plane, False)
            self.timers.cancel(Timer.PLANE_PROBE, plane)
            return
        pl.answers += 1
        if pl.answers >= self.config.restore_answers:
            self.paths.set_state(plane, PlaneState.UP)
            self.timers.cancel(Timer.PLANE_PROBE, plane)
            self.events.append(PlaneUp(plane=plane))
        else:
            # Confirming probes go at the base interval (DESIGN.md §4).
            pl.probe_interval = self.config.probe_interval
            self.timers.set(Timer.PLANE_PROBE, now + pl.probe_interval, plane)

    # -- telling the peer -----------------------------------------------------------------

    def port_mask(self) -> int:
        """Planes we can receive on (PORTSTATE, WIRE.md §4)."""
        return sum(1 << p for p, pl in self.paths.planes.items() if pl.down_reason != "local")

    def announce_ports(self) -> None:
        """PORT_STATUS to the peer's QPN on every UP plane; also tells a responder the
        requester is alive."""
        for plane in self.paths.up_planes():
            pkt = EndpointPacket(
                opcode=Opcode.ENDPOINT_REQUEST,
                dest_qp=self.peer_qpn,
                ev=self.paths.planes[plane].reverse_ev(),
                header=ERTH(op=EndpointOp.PORT_STATUS, port_status_mask=self.port_mask()),
                p_key=self.config.p_key,
            )
            self.out.append(Transmit(plane, self.peer_addrs[plane], pkt.encode(), pkt.ev))

    # -- helpers ----------------------------------------------------------------------------

    def _start_probing(self, plane: int, at: float) -> None:
        pl = self.paths.planes[plane]
        pl.probe_outstanding = False
        pl.probe_interval = self.config.probe_interval
        self.timers.set(Timer.PLANE_PROBE, at, plane)

    def _send_probe(self, plane: int, now: float) -> None:
        pl = self.paths.planes[plane]
        self._probe_id = (self._probe_id + 1) & 0xFFFF
        ev = pl.evs[self._probe_id % len(pl.evs)]
        pkt = ProbePacket(
            dest_qp=self.peer_qpn,
            psn=self.next_psn(),
            ev=ev,
            peth=PETH(probe_id=self._probe_id, tx_timestamp=tx_timestamp(now)),
            p_key=self.config.p_key,
        )
        self._probes[self._probe_id] = plane
        if len(self._probes) > MAX_PROBES_REMEMBERED:
            self._probes.pop(next(iter(self._probes)))
        pl.probe_outstanding = True
        pl.probe_sent_at = now
        self.stats.probes_sent += 1
        self.out.append(Transmit(plane, self.peer_addrs[plane], pkt.encode(), ev))
