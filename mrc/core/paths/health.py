"""Path health of one session: probes, plane DOWN/UP, port announcements (docs/DESIGN.md §4).

Four kinds of probing live here, all answered by the peer at once:

- retired (ASSUMED_BAD) EVs get a RELIABILITY_PROBE at 10 ms doubling to 1 s; after an answer,
  confirming probes at 10 ms; three clean answers restore the EV (the EV table counts them);
- a plane at its EV floor, or one the sender suspects silent (silence.py), has its EVs
  probed every 10 ms: each answer missing (older than the plane's RTO) while the peer
  answers elsewhere is a loss on the EV the probe went on, which retires it; at the floor,
  or on a plane that never answered anything, three missing in a row take the plane DOWN;
  an answer ends a suspected plane's probing;
- a DOWN plane is probed at 10 ms doubling to 1 s and comes back after three answers; so are
  the planes the peer withdrew, once no plane is usable (posted work that finds no usable
  plane for `give_up_after` ends the connection: `gave_up`);
- reverse EVs (what our SACKs, NACKs and answers ride on) are validated with EV_PROBE on every
  plane nothing else proved in the last interval; a plane whose EV_PROBEs stop being answered
  is dead to us both ways, so we clear its PORTSTATE bit and announce it.

Planes also leave the rotation when the peer announces it cannot receive on them (PORTSTATE in
its SACKs, PORT_STATUS; on an unsecured connection never all of them at once), and return when
it announces them again. Repeated ICMP unreachable errors io reads take a plane that never
answered DOWN (`unreachable`). The plane and EV tables hold the state; the sender declares a
plane's packets lost (`on_down`); the session routes inputs, among them a loss at a plane's
floor that the EV table reports (`floor_reached`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from ...wire.bth import ENDPOINT_QPN, Opcode
from ...wire.packet import EndpointPacket, ProbePacket
from ...wire.probe import EETH, ERTH, PETH, EndpointOp
from ..config import SessionConfig
from ..events import Event, PlaneDown, PlaneUp, PortStateChanged
from ..send.records import tx_timestamp
from ..sink import TraceSink
from ..stats import SessionStats
from ..timers import Timer, TimerTable
from ..transmit import Addr, Transmit
from .evs import EvSignal, ev_plane
from .planes import PlaneState, PlaneTable

#: Probes remembered for matching answers; older ones count as unanswered anyway.
MAX_PROBES_REMEMBERED: Final = 1024
#: Unanswered EV_PROBEs in a row that take a reverse EV out of the rotation.
REVERSE_MISSES: Final = 2
#: Hard ICMP errors about a plane that never answered that take it DOWN (`unreachable`).
UNREACHABLE_REPORTS: Final = 3
#: What a probe was for: a plane (DOWN or at its floor), a retired EV, a reverse EV.
PLANE: Final = 0
EV: Final = 1
REVERSE: Final = 2


class PlaneMonitor:
    def __init__(
        self,
        config: SessionConfig,
        *,
        paths: PlaneTable,
        timers: TimerTable,
        stats: SessionStats,
        events: deque[Event],
        peer_addrs: dict[int, Addr],
        out: list[Transmit],
        next_psn: Callable[[], int],
        send_seq: Callable[[], int],
        on_down: Callable[[int], None],
        peer_qpn: int,
        trace: TraceSink | None = None,
    ) -> None:
        self.config = config
        self.paths = paths
        self.evs = paths.evs
        self.timers = timers
        self.stats = stats
        self.events = events
        self.peer_addrs = peer_addrs
        self.out = out
        self.next_psn = next_psn
        self.send_seq = send_seq
        self.on_down = on_down
        self.peer_qpn = peer_qpn
        self._probe_id = 0
        #: probe_id → (kind, plane, ev, sent at)
        self._probes: dict[int, tuple[int, int, int, float]] = {}
        self._announced = paths.port_mask()
        #: The peer's receive mask in force, the cack_psn of the announcement that set it,
        #: and the newest cack_psn any SACK carried (to order PORTSTATE against PORT_STATUS).
        self._peer_mask = config.plane_mask
        self._mask_cack: int | None = None
        self._seen_cack: int | None = None
        #: Planes the sender suspects silent, probed until they answer or go DOWN.
        self._suspected: set[int] = set()
        #: Until then only SACKs agreeing with the last PORT_STATUS count (`peer_ports`).
        self._announced_until = 0.0
        #: Since when posted work has had no usable plane (`gave_up`).
        self._stuck_since: float | None = None
        #: Records plane and port changes (trace.py); None: no trace.
        self.trace = trace

    # -- inputs -------------------------------------------------------------------------------

    def local_status(self, plane: int, up: bool, now: float) -> None:
        """io/ or sim/ saw the local link go down (a send error) or come back."""
        if not up:
            self.down(plane, "local", now)
        elif not self.paths.is_up(plane):
            # Probe at once; answers bring it back (docs/DESIGN.md §4).
            self._start_probing(plane, now)

    def unreachable(self, plane: int, now: float) -> None:
        """io/ read a hard ICMP error (port, host or network unreachable) about a datagram we
        sent to the peer on `plane`. Unauthenticated news from the network, so it counts only
        against a plane that never answered anything, and only repeated: the
        `UNREACHABLE_REPORTS`-th takes it DOWN at once, where its probes would take three
        probe intervals (docs/DESIGN.md §4). A plane that answered once is judged by its
        answers alone, so a forged ICMP error cannot take a working plane down."""
        pl = self.paths.planes.get(plane)
        if pl is None or pl.state is not PlaneState.UP or not pl.never_answered:
            return
        pl.unreachable += 1
        if pl.unreachable >= UNREACHABLE_REPORTS:
            self.down(plane, "unreachable", now)

    def floor_reached(self, plane: int, now: float) -> None:
        """A loss hit a plane at its EV floor: probe its last EVs every 10 ms."""
        pl = self.paths.planes[plane]
        if pl.state is PlaneState.UP and not pl.probing:
            pl.probing = True
            self._start_probing(plane, now)

    def suspect(self, plane: int, now: float) -> None:
        """The sender suspects `plane` silent while the peer answers elsewhere (silence.py):
        probe it every 10 ms, as a plane at its EV floor."""
        pl = self.paths.planes[plane]
        if pl.state is PlaneState.UP:
            self._suspected.add(plane)
            if not pl.probing:
                pl.probing = True
                self._start_probing(plane, now)

    def down(self, plane: int, reason: str, now: float) -> None:
        self._suspected.discard(plane)
        was = self.paths.usable(plane)
        if not self.paths.set_state(plane, PlaneState.DOWN, reason):
            return
        self.paths.planes[plane].probing = False
        self._usable_changed(plane, was, reason, now)
        self._start_probing(plane, now + self.config.probe_interval)
        self._announce_if_changed()

    def peer_ports(self, mask: int, now: float, cack: int | None = None) -> None:
        """The peer announced the planes it can receive on: PORTSTATE in a SACK whose
        cack_psn is `cack`, or PORT_STATUS / an EETH (`cack` None).

        SACKs travel on several planes and overtake each other, so a SACK's PORTSTATE may
        change the mask only if its cack_psn is newer than that of the announcement that
        last changed it; otherwise a late SACK would undo a fresh PORT_STATUS. A PORT_STATUS
        has no cack_psn, and SACKs sent before it may carry newer ones than we have seen: for
        `min_rto` after it, only a SACK that agrees with it counts (and dates it).
        """
        if cack is not None:
            if self._seen_cack is None or 0 < (cack - self._seen_cack) & 0xFFFFFF < 1 << 23:
                self._seen_cack = cack
            if now < self._announced_until:
                if mask == self._peer_mask:
                    self._announced_until = 0.0
                    self._mask_cack = cack
                return
            if mask == self._peer_mask:
                return
            if (
                self._mask_cack is not None
                and not 0 < (cack - self._mask_cack) & 0xFFFFFF < 1 << 23
            ):
                return  # no newer than the announcement in force: stale
        if mask == self._peer_mask:
            return
        if not self.config.secured and self._leaves_none(mask):
            # Unauthenticated, and it would leave nothing to send on: one forged datagram
            # from the peer's address would wedge the connection (issue 35). Not taken; if the
            # peer really cannot receive, our data goes unanswered and the RTO, the floor and
            # the probes take the planes DOWN on evidence of our own (docs/DESIGN.md §4).
            self.stats.drops_by_reason["port_status_leaves_none"] += 1
            return
        self._peer_mask = mask
        self._mask_cack = cack if cack is not None else self._seen_cack
        if cack is None:
            self._announced_until = now + self.config.min_rto
        for plane in self.paths.planes:
            was = self.paths.usable(plane)
            if self.paths.set_peer_up(plane, bool(mask >> plane & 1)):
                if self.trace is not None:
                    self.trace.port(plane, bool(mask >> plane & 1), now)
                self._usable_changed(plane, was, "peer cannot receive", now)

    def on_timer(self, plane: int, now: float) -> None:
        """PLANE_PROBE of `plane` is due: judge the last probe, send the next."""
        pl = self.paths.planes[plane]
        if plane not in self.peer_addrs or (pl.state is PlaneState.UP and not pl.probing):
            return
        usable = self.paths.usable(plane)
        if (
            pl.state is PlaneState.UP
            and not self.evs.planes[plane].at_floor
            and plane not in self._suspected
            and (usable or self.any_usable())
        ):
            # EVs came back above the floor, the plane answered, or (withdrawn by the peer)
            # another plane carries the data again.
            pl.probing = False
            return
        if pl.probe_outstanding:
            # Unanswered = older than the plane's RTO: a busy receiver is not a dead plane.
            overdue = pl.probe_sent_at + self.paths.probe_timeout(plane)
            if now < overdue:
                self.timers.set(Timer.PLANE_PROBE, overdue, plane)
                return
            pl.answers = 0
            if pl.state is PlaneState.DOWN or self._answered_later_elsewhere(
                plane, pl.probe_sent_at
            ):
                pl.unanswered += 1
                if usable:
                    # A packet lost on its EV while the peer answers elsewhere: MRC's rule
                    # retires the EV (docs/DESIGN.md §4), so a dead plane's EVs fall to the
                    # floor even once no data is left to lose there, and an ECMP plane
                    # loses only the EVs hashed onto its dead switch.
                    self.evs.signal(pl.probe_ev, EvSignal.LOSS, now=now, seq=self.send_seq(),
                                    reason="probe unanswered")
            if pl.state is PlaneState.UP and pl.unanswered >= self.config.restore_answers:
                # The floor EVs stopped answering: the plane is DOWN (docs/DESIGN.md §4). A
                # plane only suspected silent is not taken DOWN by its probes: behind a dead
                # switch of an ECMP fabric only some of its EVs are dead, and three probes
                # may all hash there (a silent tier-1 took its plane DOWN so); its dead EVs
                # go to the RTO and the floor, and an answer ends the suspicion. Unless the
                # plane never answered anything: its data went out on all its EVs and not
                # one came back, so no path of it works, and waiting for the floor kept a
                # plane dead from the start in the rotation for rounds of RTOs.
                if self.evs.planes[plane].at_floor:
                    self.down(plane, "probes unanswered", now)
                    return
                if pl.never_answered:
                    self.down(plane, "never answered", now)
                    return
        evs = self.evs.rotation(plane) if usable else self.evs.all_evs(plane)
        pl.probe_ev = evs[self._probe_id % len(evs)]
        self._send_probe(PLANE, plane, pl.probe_ev, now)
        pl.probe_outstanding = True
        pl.probe_sent_at = now
        self.timers.set(Timer.PLANE_PROBE, now + pl.probe_interval, plane)
        if not usable:
            # Unanswered probes of a DOWN (or withdrawn) plane back off, 10 ms doubling to
            # 1 s (docs/DESIGN.md §4).
            pl.probe_interval = min(pl.probe_interval * 2, self.config.probe_max_interval)

    def on_ev_timer(self, now: float) -> None:
        """EV_PROBE is due: probe every retired EV whose turn it is."""
        planes = {p for p in self.paths.planes if self.paths.usable(p)}
        for rec in self.evs.probes_due(now, planes):
            probe_id = self._send_probe(EV, rec.plane, rec.ev, now)
            self.evs.probe_sent(rec, probe_id, now)
        self.arm_ev_timer()

    def arm_ev_timer(self) -> None:
        planes = {p for p in self.paths.planes if self.paths.usable(p)}
        due = self.evs.next_probe_due(planes)
        if due is None:
            self.timers.cancel(Timer.EV_PROBE)
        else:
            self.timers.set(Timer.EV_PROBE, due)

    def on_answer(self, probe_id: int, clean: bool, now: float) -> None:
        """A SACK with PR answered RELIABILITY_PROBE `probe_id` (docs/WIRE.md §4); `clean` = it
        came back without a congestion mark."""
        entry = self._probes.pop(probe_id, None)
        if entry is None:
            return
        kind, plane, ev, sent_at = entry
        self.stats.probes_answered += 1
        pl = self.paths.planes[plane]
        pl.proven_at = now
        pl.answered_sent_at = max(pl.answered_sent_at, sent_at)
        if kind == EV:
            self.evs.probe_answered(ev, probe_id, clean, now, self.send_seq())
            self.arm_ev_timer()
            return
        pl.probe_outstanding = False
        pl.unanswered = 0
        if pl.state is PlaneState.UP:
            self._suspected.discard(plane)
            return  # a floor or suspicion probe answered: the plane still works
        pl.answers += 1
        if pl.answers >= self.config.restore_answers:
            was = self.paths.usable(plane)
            self.paths.set_state(plane, PlaneState.UP)
            self.evs.planes[plane].at_floor = False
            self.timers.cancel(Timer.PLANE_PROBE, plane)
            self._usable_changed(plane, was, "", now)
            self._announce_if_changed()
        else:
            # Confirming probes go at the base interval (docs/DESIGN.md §4).
            pl.probe_interval = self.config.probe_interval
            self.timers.set(Timer.PLANE_PROBE, now + pl.probe_interval, plane)

    # -- reverse EVs --------------------------------------------------------------------------

    def traffic_received(self, now: float) -> None:
        """Data arrived: keep validating our reverse EVs while it flows (docs/DESIGN.md §4)."""
        if self.timers.get(Timer.REVERSE_PROBE) is None:
            self.timers.set(Timer.REVERSE_PROBE, now + self.config.probe_interval)

    def on_reverse_timer(self, now: float) -> None:
        """EV_PROBE one reverse EV of every plane that nothing proved in the last interval.

        Each plane's reverse EVs take turns, so every one is validated; one whose probes go
        unanswered twice in a row leaves the reverse rotation, and a plane whose reverse EVs
        are all bad is dead to us both ways (docs/DESIGN.md §4).
        """
        interval = self.config.probe_interval
        keep = False
        for plane, pl in self.paths.planes.items():
            if plane not in self.peer_addrs or pl.state is not PlaneState.UP:
                continue
            if pl.reverse_probe_id is not None:
                if now < pl.reverse_probe_sent_at + self.paths.probe_timeout(plane):
                    keep = True
                    continue
                self._probes.pop(pl.reverse_probe_id, None)
                pl.reverse_probe_id = None
                ev = pl.reverse_probe_ev
                if self._answered_later_elsewhere(plane, pl.reverse_probe_sent_at):
                    pl.reverse_misses[ev] = pl.reverse_misses.get(ev, 0) + 1
                if pl.reverse_misses.get(ev, 0) >= REVERSE_MISSES:
                    pl.reverse_bad.add(ev)
                    if len(pl.reverse_bad) == len(pl.reverse_evs):
                        # Our sends on it fail; whether we can still receive on it is told
                        # by what arrives. A plane with one dead path of several still
                        # carries the peer's data, and must stay in our PORTSTATE; one that
                        # brought nothing while the others did is dead both ways (a peer
                        # that stalled everywhere indicts no plane).
                        pl.reverse_dead = True
                        pl.silent = self._heard_later_elsewhere(plane, pl.reverse_probe_sent_at)
                        self._announce_if_changed()
            if now - pl.proven_at < interval and not pl.reverse_bad:
                continue
            probe_id = self._next_probe_id()
            ev = pl.next_reverse_probe()
            pl.reverse_probe_id = probe_id
            pl.reverse_probe_ev = ev
            pl.reverse_probe_sent_at = now
            self._probes[probe_id] = (REVERSE, plane, ev, now)
            self._endpoint_request(plane, EndpointOp.EV_PROBE, probe_id, now, ev=ev)
            keep = True
        if keep:
            self.timers.set(Timer.REVERSE_PROBE, now + interval)

    def on_ev_probe_answer(self, plane: int, probe_id: int, now: float) -> None:
        """An EETH answered our EV_PROBE: that reverse EV works, and so does the plane."""
        entry = self._probes.pop(probe_id, None)
        if entry is None or entry[0] != REVERSE:
            return
        _, plane, ev, sent_at = entry
        pl = self.paths.planes[plane]
        pl.answered_sent_at = max(pl.answered_sent_at, sent_at)
        pl.proven_at = now
        if pl.reverse_probe_id == probe_id:
            pl.reverse_probe_id = None
            # A host that only receives has no data RTT: its probes give the plane one.
            pl.rtt.sample(max(0.0, now - pl.reverse_probe_sent_at))
        pl.reverse_misses.pop(ev, None)
        pl.reverse_bad.discard(ev)
        if pl.reverse_dead:
            pl.reverse_dead = pl.silent = False
            self._announce_if_changed()

    # -- telling the peer -----------------------------------------------------------------

    def announce_ports(self, now: float = 0.0) -> None:
        """PORT_STATUS to the peer's QPN on every UP plane; also tells a responder the
        requester is alive."""
        self._announced = self.paths.port_mask()
        for plane in self.paths.up_planes():
            if plane in self.peer_addrs:
                self._endpoint_request(plane, EndpointOp.PORT_STATUS, 0, now)

    def _announce_if_changed(self) -> None:
        mask = self.paths.port_mask()
        changed = mask ^ self._announced
        if changed:
            for plane in sorted(self.paths.planes):
                if changed >> plane & 1:
                    self.events.append(PortStateChanged(plane=plane, up=bool(mask >> plane & 1)))
            self.announce_ports()

    def _endpoint_request(
        self, plane: int, op: EndpointOp, probe_id: int, now: float, *, ev: int | None = None
    ) -> None:
        pkt = EndpointPacket(
            opcode=Opcode.ENDPOINT_REQUEST,
            dest_qp=self.peer_qpn,
            ev=self.paths.planes[plane].reverse_ev() if ev is None else ev,
            header=ERTH(
                op=op,
                port_status_mask=self.paths.port_mask(),
                tx_timestamp=tx_timestamp(now),
            ),
            p_key=self.config.p_key,
            probe_id=probe_id,  # in BTH.PSN (docs/WIRE.md §4)
        )
        self.out.append(Transmit(plane, self.peer_addrs[plane], pkt.encode(), pkt.ev))

    def answer_endpoint(
        self, header: ERTH, plane: int, ev: int, probe_id: int, to_qp: int = 0
    ) -> None:
        """Answer an ENDPOINT_REQUEST that came in on `plane` with `ev`, echoing its
        `probe_id`: that validates the peer's reverse path (docs/DESIGN.md §4). One sent to
        the connectionless QPN 0x2 (`to_qp`) is answered there."""
        if plane not in self.peer_addrs or plane not in self.paths.planes:
            return
        # The peer judges the EV it probed by this answer, so the answer takes the mirror of
        # that path (same selector: path tables list a plane's paths in the same order both
        # ways). Any other EV of ours could sit on a path that just died and make every
        # reverse EV of the plane look dead to the peer, though its other paths work.
        if ev_plane(ev) != plane:
            ev = self.paths.planes[plane].reverse_ev()
        answer = EndpointPacket(
            opcode=Opcode.ENDPOINT_RESPONSE,
            dest_qp=ENDPOINT_QPN if to_qp == ENDPOINT_QPN else self.peer_qpn,
            ev=ev,
            header=EETH(
                op=header.op,
                port_status_mask=self.paths.port_mask(),
                tx_timestamp=header.tx_timestamp,
            ),
            p_key=self.config.p_key,
            probe_id=probe_id,
        )
        self.out.append(Transmit(plane, self.peer_addrs[plane], answer.encode(), answer.ev))

    # -- helpers ----------------------------------------------------------------------------

    def _answered_later_elsewhere(self, plane: int, sent_at: float) -> bool:
        """The peer answered something sent on another plane no earlier than `sent_at`: so
        silence on `plane` is the plane's fault, not a stalled peer's (docs/DESIGN.md §6)."""
        planes = self.paths.planes.items()
        return any(p.answered_sent_at >= sent_at for n, p in planes if n != plane)

    def _heard_later_elsewhere(self, plane: int, since: float) -> bool:
        """Data or acknowledgements arrived on another plane since `since`, but not on
        `plane`."""
        planes = self.paths.planes
        if planes[plane].heard_at >= since:
            return False
        return any(p.heard_at >= since for n, p in planes.items() if n != plane)

    def any_usable(self) -> bool:
        """Some plane carries data: UP, and the peer receives on it."""
        usable = self.paths.usable
        return any(usable(p) for p in self.paths.planes)

    def gave_up(self, busy: bool, now: float) -> bool:
        """With posted work (`busy`) and no usable plane for `give_up_after`, the connection
        fails (docs/DESIGN.md §6): nothing else would ever end its WRITEs, as no data is in
        flight to time out. Asked on every PLANE_PROBE, which keeps running meanwhile."""
        if not busy or self.any_usable():
            self._stuck_since = None
            return False
        if self._stuck_since is None:
            self._stuck_since = now
        return now - self._stuck_since >= self.config.give_up_after

    def _leaves_none(self, mask: int) -> bool:
        """A peer mask of `mask` would take the last usable plane out of the rotation."""
        planes = self.paths.planes
        up = PlaneState.UP
        return self.any_usable() and not any(
            pl.state is up and mask >> p & 1 for p, pl in planes.items()
        )

    def _usable_changed(self, plane: int, was: bool, reason: str, now: float) -> None:
        now_usable = self.paths.usable(plane)
        if self.trace is not None and was != now_usable:
            self.trace.plane(plane, now_usable, reason if was else "", now)
        if was and not now_usable:
            self.events.append(PlaneDown(plane=plane, reason=reason))
            self.on_down(plane)
            if not self.any_usable():
                # Nothing left to send on: keep probing the planes the peer withdrew too
                # (DOWN ones are probed already), so that the connection either finds a
                # plane or gives up (`gave_up`) rather than wait with no timer armed.
                for p, pl in self.paths.planes.items():
                    if pl.state is PlaneState.UP and not pl.probing and p in self.peer_addrs:
                        pl.probing = True
                        self._start_probing(p, now + self.config.probe_interval)
        elif now_usable and not was:
            self.events.append(PlaneUp(plane=plane))
            self.arm_ev_timer()

    def _start_probing(self, plane: int, at: float) -> None:
        pl = self.paths.planes[plane]
        pl.probe_outstanding = False
        pl.unanswered = 0
        pl.probe_interval = self.config.probe_interval
        self.timers.set(Timer.PLANE_PROBE, at, plane)

    def _next_probe_id(self) -> int:
        self._probe_id = (self._probe_id + 1) & 0xFFFF
        if len(self._probes) >= MAX_PROBES_REMEMBERED:
            self._probes.pop(next(iter(self._probes)))
        return self._probe_id

    def _send_probe(self, kind: int, plane: int, ev: int, now: float) -> int:
        probe_id = self._next_probe_id()
        pkt = ProbePacket(
            dest_qp=self.peer_qpn,
            psn=self.next_psn(),
            ev=ev,
            peth=PETH(probe_id=probe_id, tx_timestamp=tx_timestamp(now)),
            p_key=self.config.p_key,
        )
        self._probes[probe_id] = (kind, plane, ev, now)
        self.stats.probes_sent += 1
        self.out.append(Transmit(plane, self.peer_addrs[plane], pkt.encode(), ev))
        return probe_id
