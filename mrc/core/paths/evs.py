"""The EV table of one connection: entropy values, their states, backups and probe schedule.

docs/DESIGN.md §4: every plane has `ev_per_plane` active EVs plus a backup pool. An EV is
`plane 8 | selector 24` (docs/WIRE.md §3) and its path is `selector mod paths-of-the-plane`;
selectors are drawn at random (so connections do not synchronise) in equal numbers per path,
the active ones starting at a per-connection offset among the paths.
States follow MRC's table (docs/DESIGN.md §4) kept as data in `TRANSITIONS`: GOOD,
SKIP (an ECN echo or a TRIMMED NACK, until the rotation has passed it), ASSUMED_BAD (a loss:
retired at once, replaced by a backup of the same plane, probed back), DENIED (the operator).
Losses stop retiring EVs once a plane is down to `min_active` usable EVs (MRC's
`ev_min_active`): the last ones keep carrying data and `on_floor` asks for them to be probed.

This module keeps the states, counters and the retired EVs' probe schedule. It does not send
probes (health.py), does not infer losses (sender.py) and does not order EVs (spray.py). What it
tells a trace is the `EvWatcher` protocol below (trace.py implements it); a loss at a plane's
floor goes to the `on_floor` callback its owner hands it.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Protocol

from ..config import SessionConfig
from ..events import Event, PathRestored, PathRetired

#: Bits of an EV's selector that a flow label carries (the plane comes from the socket).
FLOW_LABEL_BITS: Final = 20
#: UEC's skip counter ceiling (docs/DESIGN.md §4): a timeout sets it.
PENALTY_MAX: Final = 15
PENALTY: Final = {"ecn": 1, "trimmed": 4}


def ev_plane(ev: int) -> int:
    return ev >> 24 & 0xFF


def make_ev(plane: int, selector: int) -> int:
    return (plane & 0xFF) << 24 | (selector & 0xFFFFFF)


class EvState(Enum):
    GOOD = "good"
    SKIP = "skip"
    ASSUMED_BAD = "assumed_bad"
    DENIED = "denied"


class EvSignal(Enum):
    ECN = "ecn"  # a SACK echoed this EV with mark SKIP_ONCE
    TRIMMED = "trimmed"  # NACK TRIMMED (not the last hop)
    LOSS = "loss"  # a packet sent on it was lost (docs/DESIGN.md §6)
    ALWAYS_SKIP = "always_skip"  # a SACK echoed it with mark ALWAYS_SKIP
    ROTATED = "rotated"  # the rotation passed it: its skip is used up
    RESTORED = "restored"  # three clean probe answers in a row
    DENY = "deny"
    ALLOW = "allow"


G: Final = EvState.GOOD
S: Final = EvState.SKIP
B: Final = EvState.ASSUMED_BAD
D: Final = EvState.DENIED

#: MRC's EV state machine (docs/DESIGN.md §4). Pairs not listed leave the state alone.
TRANSITIONS: Final[dict[tuple[EvState, EvSignal], EvState]] = {
    (G, EvSignal.ECN): S,
    (G, EvSignal.TRIMMED): S,
    (G, EvSignal.LOSS): B,
    (G, EvSignal.ALWAYS_SKIP): B,
    (S, EvSignal.ECN): S,
    (S, EvSignal.TRIMMED): S,
    (S, EvSignal.LOSS): B,
    (S, EvSignal.ALWAYS_SKIP): B,
    (S, EvSignal.ROTATED): G,
    (B, EvSignal.RESTORED): G,
    (G, EvSignal.DENY): D,
    (S, EvSignal.DENY): D,
    (B, EvSignal.DENY): D,
    (D, EvSignal.ALLOW): G,
}

USABLE: Final = (G, S)


@dataclass(eq=False, slots=True)
class EvRecord:
    ev: int
    plane: int
    path: int
    state: EvState = G
    #: In the plane's active set (carries data while usable); else a backup or retired.
    active: bool = False
    #: Skip counter: the rotation passes over the EV while it is positive.
    penalty: int = 0
    #: The sender's send sequence number at the last state change: losses of packets sent
    #: before it say nothing about the EV's new state (docs/DESIGN.md §4).
    changed_seq: int = 0
    packets_sent: int = 0
    retransmits: int = 0
    times_retired: int = 0
    #: ECN echoes and TRIMMED NACKs that put it in SKIP (or added to its counter).
    times_skipped: int = 0
    retired_at: float | None = None
    seconds_retired: float = 0.0
    #: Probing while ASSUMED_BAD: interval in force, next probe, outstanding probe id,
    #: clean answers in a row.
    probe_interval: float = 0.0
    probe_due: float | None = None
    probe_id: int | None = None
    clean: int = 0


@dataclass(eq=False, slots=True)
class PlaneEvs:
    plane: int
    npaths: int
    active: list[EvRecord]
    backups: deque[EvRecord]
    #: A loss was not acted on because the plane is at its floor.
    at_floor: bool = False

    def usable(self) -> list[EvRecord]:
        return [r for r in self.active if r.state in USABLE]


class EvWatcher(Protocol):
    """What the EV table tells the keeper of an EV timeline (trace.py's `TraceCollector`)."""

    def evs_changed(self, ev: EvRecord, now: float, loss: str, signal: str) -> None:
        """A signal changed the state of `ev` (and maybe of a backup of its plane)."""

    def ev_changed(self, rec: EvRecord, now: float, signal: str = "") -> None:
        """One EV's probe or skip counter changed."""


class EvTable:
    """Every EV of a connection, by plane."""

    def __init__(
        self,
        config: SessionConfig,
        rng: random.Random,
        events: deque[Event],
        *,
        npaths: dict[int, int] | None = None,
        on_floor: Callable[[int, float], None] | None = None,
        trace: EvWatcher | None = None,
    ) -> None:
        self.config = config
        self.events = events
        self.by_ev: dict[int, EvRecord] = {}
        self.planes: dict[int, PlaneEvs] = {}
        self.min_active = config.min_active
        #: Bumped whenever an EV enters or leaves a rotation, so spray policies rebuild.
        self.version = 0
        #: Set when an EV was retired: its probe schedule needs a timer (health.py arms it
        #: once `take_probes_changed` says so).
        self.probes_changed = False
        #: Called with (plane, now) when a loss hits a plane at its floor (health.py probes it).
        self.on_floor = on_floor
        #: Records state changes for the EV timeline (trace.py); None: no trace.
        self.trace = trace
        per_plane = config.ev_per_plane
        total = per_plane + config.backups_per_plane
        # A flow label holds 20 bits of the EV: selectors must fit (docs/WIRE.md §3).
        bits = FLOW_LABEL_BITS if config.ev_encoding == "flowlabel" else 24
        for p in config.planes:
            n = max(1, (npaths or {}).get(p, config.paths_of(p)))
            records = [
                EvRecord(ev=make_ev(p, sel), plane=p, path=sel % n)
                for sel in _selectors(rng, n, total, bits)
            ]
            for r in records[:per_plane]:
                r.active = True
            for r in records:
                self.by_ev[r.ev] = r
            self.planes[p] = PlaneEvs(p, n, records[:per_plane], deque(records[per_plane:]))

    # -- reading --------------------------------------------------------------------------

    def rotation(self, plane: int) -> list[int]:
        """The EVs of `plane` that carry data (active, GOOD or SKIP)."""
        return [r.ev for r in self.planes[plane].usable()]

    def all_evs(self, plane: int) -> list[int]:
        pe = self.planes[plane]
        return [r.ev for r in pe.active] + [r.ev for r in pe.backups]

    def path_of(self, ev: int) -> int:
        rec = self.by_ev.get(ev)
        return rec.path if rec is not None else 0

    def state_of(self, ev: int) -> EvState | None:
        rec = self.by_ev.get(ev)
        return rec.state if rec is not None else None

    # -- signals ----------------------------------------------------------------------------

    def signal(
        self,
        ev: int,
        sig: EvSignal,
        *,
        now: float,
        seq: int,
        sent_seq: int | None = None,
        reason: str = "",
    ) -> bool:
        """Apply `sig` to `ev`; True if its state changed.

        `seq` is the sender's send sequence now; `sent_seq` that of the packet the signal is
        about, if any: a signal about a packet sent before the EV's last state change is
        ignored (docs/DESIGN.md §4).
        """
        rec = self.by_ev.get(ev)
        if rec is None:
            return False
        if sent_seq is not None and sent_seq <= rec.changed_seq:
            return False
        new = TRANSITIONS.get((rec.state, sig))
        if new is None:
            return False
        old = rec.state
        if new is S:
            rec.penalty = min(PENALTY_MAX, rec.penalty + PENALTY.get(sig.value, 1))
            rec.times_skipped += 1
            if old is S:
                return False
        elif new is B:
            pe = self.planes[rec.plane]
            if rec.active and len(pe.usable()) <= self.min_active:
                # At the floor the last EVs keep carrying data; planes.py probes them and
                # takes the plane DOWN if they stop answering (docs/DESIGN.md §4).
                rec.penalty = PENALTY_MAX
                pe.at_floor = True
                if self.on_floor is not None:
                    self.on_floor(rec.plane, now)
                return False
        rec.state = new
        rec.changed_seq = seq
        if new is G:
            rec.penalty = 0
        if new is B:
            self._retire(rec, now, reason or sig.value)
        elif new is G and old is B:
            self._restore(rec, now)
        elif new is D:
            self._deny(rec, now)
        elif new is G and old is D:
            self._place(rec)
        if self.trace is not None:
            self.trace.evs_changed(rec, now, reason or sig.value, sig.value)
        return True

    def pass_over(self, ev: int, *, now: float, whole: bool = False) -> None:
        """The rotation landed on a penalised EV and skipped it: one skip (or all) used up;
        a SKIP EV whose counter reaches 0 is GOOD again (MRC: "next rotation")."""
        rec = self.by_ev[ev]
        rec.penalty = 0 if whole else rec.penalty - 1
        if rec.penalty <= 0:
            rec.penalty = 0
            if rec.state is S:
                rec.state = G
                if self.trace is not None:
                    self.trace.ev_changed(rec, now)

    def count_sent(self, ev: int, rtx: bool, packets: int = 1) -> None:
        rec = self.by_ev.get(ev)
        if rec is not None:
            rec.packets_sent += packets
            if rtx:
                rec.retransmits += packets

    # -- probing retired EVs ------------------------------------------------------------------

    def take_probes_changed(self) -> bool:
        """Whether an EV was retired since the last call (its probes need the timer)."""
        changed = self.probes_changed
        self.probes_changed = False
        return changed

    def probes_due(self, now: float, planes: set[int]) -> list[EvRecord]:
        return [
            r
            for r in self.by_ev.values()
            if r.state is B and r.plane in planes and r.probe_due is not None and r.probe_due <= now
        ]

    def next_probe_due(self, planes: set[int]) -> float | None:
        return min(
            (
                r.probe_due
                for r in self.by_ev.values()
                if r.state is B and r.plane in planes and r.probe_due is not None
            ),
            default=None,
        )

    def probe_sent(self, rec: EvRecord, probe_id: int, now: float) -> None:
        if rec.probe_id is not None:
            # The previous probe went unanswered: back off, 10 ms doubling to 1 s.
            rec.clean = 0
            rec.probe_interval = min(rec.probe_interval * 2, self.config.probe_max_interval)
        rec.probe_id = probe_id
        rec.probe_due = now + rec.probe_interval
        if self.trace is not None:
            self.trace.ev_changed(rec, now)

    def probe_answered(self, ev: int, probe_id: int, clean: bool, now: float, seq: int) -> None:
        rec = self.by_ev.get(ev)
        if rec is None or rec.state is not B or rec.probe_id != probe_id:
            return
        rec.probe_id = None
        rec.clean = rec.clean + 1 if clean else 0
        if rec.clean >= self.config.restore_answers:
            self.signal(ev, EvSignal.RESTORED, now=now, seq=seq)
            return
        # After an answer, confirming probes go at the base interval (docs/DESIGN.md §4).
        rec.probe_interval = self.config.probe_interval
        rec.probe_due = now + rec.probe_interval
        if self.trace is not None:
            self.trace.ev_changed(rec, now)

    # -- reports ----------------------------------------------------------------------------

    def report(self, now: float) -> list[dict[str, Any]]:
        """`end.mrc.evs[]` of `mrc bench -J` (docs/DESIGN.md §10), every EV that carried or was
        retired, in EV order."""
        rows = []
        for ev in sorted(self.by_ev):
            r = self.by_ev[ev]
            if not (r.packets_sent or r.times_retired or r.active):
                continue
            retired = r.seconds_retired + (now - r.retired_at if r.retired_at is not None else 0)
            rows.append(
                {
                    "ev": ev,
                    "plane": r.plane,
                    "path": r.path,
                    "state": r.state.value if r.active or r.state is not G else "backup",
                    "packets_sent": r.packets_sent,
                    "retransmits": r.retransmits,
                    "times_retired": r.times_retired,
                    "seconds_retired": round(retired, 6),
                }
            )
        return rows

    # -- helpers ----------------------------------------------------------------------------

    def _retire(self, rec: EvRecord, now: float, reason: str) -> None:
        pe = self.planes[rec.plane]
        if rec.active:
            pe.active.remove(rec)
            rec.active = False
            self._promote_backup(pe)
        rec.times_retired += 1
        rec.retired_at = now
        rec.probe_id = None
        rec.clean = 0
        rec.probe_interval = self.config.probe_interval
        rec.probe_due = now + rec.probe_interval
        self.probes_changed = True
        self.version += 1
        self.events.append(PathRetired(ev=rec.ev, plane=rec.plane, reason=reason))

    def _promote_backup(self, pe: PlaneEvs) -> None:
        """Fill the slot an EV left: the backup on the path with the fewest retired EVs, so a
        dead path's EVs are not replaced by more EVs on the same dead path."""
        if not pe.backups:
            return
        bad: dict[int, int] = {}
        for r in self.by_ev.values():
            if r.plane == pe.plane and r.state is B:
                bad[r.path] = bad.get(r.path, 0) + 1
        best = min(pe.backups, key=lambda r: bad.get(r.path, 0))
        pe.backups.remove(best)
        best.active = True
        pe.active.append(best)

    def _restore(self, rec: EvRecord, now: float) -> None:
        if rec.retired_at is not None:
            rec.seconds_retired += now - rec.retired_at
            rec.retired_at = None
        rec.probe_due = rec.probe_id = None
        self._place(rec)
        pe = self.planes[rec.plane]
        if len(pe.usable()) > self.min_active:
            pe.at_floor = False
        self.events.append(PathRestored(ev=rec.ev, plane=rec.plane))

    def _place(self, rec: EvRecord) -> None:
        """Bring a restored or allowed EV back into the active set: into a free slot, or in
        place of an active EV on the path that holds the most. While a path looked bad its
        retired EVs were replaced on other paths (`_promote_backup`); its EVs coming back move
        the stand-ins out again, so every path keeps its equal share (docs/DESIGN.md §4)."""
        pe = self.planes[rec.plane]
        if len(pe.active) >= self.config.ev_per_plane:
            counts = Counter(r.path for r in pe.active)
            fullest = max(counts, key=counts.__getitem__)
            if counts[fullest] - counts[rec.path] < 2:
                pe.backups.append(rec)
                return
            # The latest to join that path's share: the stand-in, as a rule.
            out = next(r for r in reversed(pe.active) if r.path == fullest)
            pe.active.remove(out)
            out.active = False
            pe.backups.append(out)
        rec.active = True
        pe.active.append(rec)
        self.version += 1

    def _deny(self, rec: EvRecord, now: float) -> None:
        pe = self.planes[rec.plane]
        if rec.active:
            pe.active.remove(rec)
            rec.active = False
            self._promote_backup(pe)
            self.version += 1
        elif rec in pe.backups:
            pe.backups.remove(rec)
        if rec.retired_at is not None:
            rec.seconds_retired += now - rec.retired_at
            rec.retired_at = None
        rec.probe_due = rec.probe_id = None


def _selectors(rng: random.Random, npaths: int, count: int, bits: int = 24) -> list[int]:
    """`count` distinct random selectors of `bits` bits, the i-th on path (offset + i) mod
    `npaths`, so every path gets an equal share and the active set (the first
    `ev_per_plane`) starts at a per-connection offset (docs/DESIGN.md §4). The offset comes from
    the first random draw, so it costs no extra draw: a plane with more paths than active EVs
    has each connection's active EVs on a different run of paths, and over many connections
    every path carries its share. Flow-label selectors (20 bits) are never 0: a label of 0
    means "no label"."""
    out: list[int] = []
    seen: set[int] = set()
    top = ((1 << bits) - npaths) // npaths
    low = 0 if bits == 24 else 1
    offset = 0
    for i in range(count):
        while True:
            draw = rng.randint(low, top)
            if i == 0:
                offset = draw % npaths
            sel = draw * npaths + (offset + i) % npaths
            if sel not in seen:
                seen.add(sel)
                out.append(sel)
                break
    return out
