"""The transport trace of one session: the EV timeline and the records of `mrc bench --trace`.

aioquic's QuicLogger is the model: whoever wants a trace hands a `TraceCollector` to the
session when it is built (`Endpoint.connect(..., trace=collector)`, or a `TraceLog` to
`Endpoint.listen`, which starts one per accepted session); the session passes it to the parts
it builds, whose hooks record into it with their `now`, each behind a `None` check so a session
without a trace pays nothing. The collector implements `TraceSink` (sink.py) and never holds
the session: the session pushes to it, congestion and drop samples included
(`Session.sample_trace`). docs/DESIGN.md §10 ("Traces") describes the format.

What it keeps:

- the EV timeline: every change of an EV's displayed state (good, skip, retired, probing,
  denied, backup), starting with one "start" record per EV at establishment, at most
  `timeline_max` records (then `timeline_truncated`); always on, it is bounded;
- with `records=True`, a queue of trace records (ev, plane, port, fault, retransmit, drop,
  cc, rtt, suppressed) the owner drains with `records()`. Retransmits, drops and RTT samples
  share a token bucket of `records_per_second` (burst: one second's worth); what it leaves out
  is counted and reported in a `suppressed` record at most once a second. Drops come as
  the session's `drops_by_reason` counts when it is sampled, so each `drop` record carries
  the count of its reason since the last one (coalesced, and no hook on the drop paths).
  RTT samples are thinned to the first per plane in each `cc_sample_seconds`.

It does no I/O and reads no clock: times are the `now` the core and the owner pass in, kept
as is; `record_json` turns them into seconds since the owner's t0. Writing the file is the
owner's job (mrc/cli/bench_trace.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .paths.evs import EvRecord, EvState
from .sink import CcRow

#: At most this many EV timeline records per connection (docs/DESIGN.md §10).
TIMELINE_MAX: Final = 100_000
#: The token bucket shared by retransmit, drop and rtt records.
RECORDS_PER_SECOND: Final = 2000
#: One cc record per plane this often (and at most one rtt record per plane).
CC_SAMPLE_SECONDS: Final = 0.01
#: `suppressed` records at most this often.
SUPPRESSED_EVERY: Final = 1.0

#: (now, kind, fields): one trace record before it is given its `t`.
TraceRecord = tuple[float, str, dict[str, Any]]


def ev_view(rec: EvRecord) -> str:
    """The state an EV is drawn in: MRC's state, with ASSUMED_BAD split by whether a probe is
    outstanding, and a usable EV outside the rotation shown as a backup."""
    state = rec.state
    if state is EvState.ASSUMED_BAD:
        return "probing" if rec.probe_id is not None else "retired"
    if state is EvState.DENIED:
        return "denied"
    if not rec.active:
        return "backup"
    return "skip" if state is EvState.SKIP else "good"


def _reason(old: str | None, new: str, loss: str, signal: str) -> str:
    if new == "retired":
        return loss
    if new == "skip":
        return signal
    if new == "probing":
        return "probe"
    if new == "good" and old in ("retired", "probing"):
        return "restored"
    if new == "good" and old == "skip":
        return "rotated"
    return ""


def t_of(now: float, t0: float) -> float:
    """Seconds since `t0`, 6 decimals; what happened before t0 (the handshake) is at 0."""
    return round(max(0.0, now - t0), 6)


def record_json(rec: TraceRecord, t0: float) -> dict[str, Any]:
    """One record as its JSON line's object: `t` and `kind` first."""
    now, kind, fields = rec
    return {"t": t_of(now, t0), "kind": kind, **fields}


class TraceCollector:
    """The EV timeline of a session and, with `records=True`, its trace records."""

    def __init__(
        self,
        *,
        records: bool = False,
        records_per_second: int = RECORDS_PER_SECOND,
        cc_sample_seconds: float = CC_SAMPLE_SECONDS,
        timeline_max: int = TIMELINE_MAX,
    ) -> None:
        if records_per_second < 1 or cc_sample_seconds <= 0 or timeline_max < 0:
            raise ValueError("trace limits must be positive")
        self.recording = records
        self.records_per_second = records_per_second
        self.cc_sample_seconds = cc_sample_seconds
        self.timeline_max = timeline_max
        #: (now, ev, plane, state, reason), in time order.
        self.timeline: list[tuple[float, int, int, str, str]] = []
        self.timeline_truncated = False
        #: Records left out by the rate limit: since the last `suppressed` record, and in all.
        self.suppressed: Counter[str] = Counter()
        self.suppressed_total = 0
        #: Hooks and samples are taken until `detach`.
        self.live = True
        self._queue: list[TraceRecord] = []
        self._views: dict[int, str] = {}
        self._by_plane: dict[int, list[EvRecord]] = {}
        self._tokens = float(records_per_second)
        self._tokens_at: float | None = None
        self._suppressed_at: float | None = None
        self._next_cc: float | None = None
        self._rtt_next: dict[int, float] = {}
        self._drops_seen: dict[str, int] = {}
        #: Faults the owner scheduled, recorded once a sample reaches their time.
        self._faults: list[TraceRecord] = []

    # -- hooks of the core ----------------------------------------------------------------------

    def evs_started(self, evs: Sequence[EvRecord], now: float) -> None:
        """The session is established with `evs`: one "start" record each, in EV order."""
        if not self.live:
            return
        self._by_plane = {}
        for rec in sorted(evs, key=lambda r: r.ev):
            self._by_plane.setdefault(rec.plane, []).append(rec)
            view = self._views[rec.ev] = ev_view(rec)
            self._ev_record(now, rec, view, "start")

    def evs_changed(self, ev: EvRecord, now: float, loss: str, signal: str) -> None:
        """A signal changed the state of `ev`, and maybe of a backup that took or gave up its
        place: record `ev`, then every other EV of its plane whose displayed state changed."""
        if self.timeline_truncated or not self.live:
            return
        if ev.state is EvState.SKIP:
            # ECN and trims only penalise the EV: no other EV moves (and they come often).
            self.ev_changed(ev, now, signal)
            return
        views = self._views
        for rec in (ev, *self._by_plane.get(ev.plane, ())):
            view = ev_view(rec)
            old = views.get(rec.ev)
            if view != old:
                views[rec.ev] = view
                self._ev_record(now, rec, view, _reason(old, view, loss, signal))

    def ev_changed(self, rec: EvRecord, now: float, signal: str = "") -> None:
        """One EV's probe or skip counter changed; record it if its displayed state did."""
        if self.timeline_truncated or not self.live:
            return
        view = ev_view(rec)
        old = self._views.get(rec.ev)
        if view != old:
            self._views[rec.ev] = view
            self._ev_record(now, rec, view, _reason(old, view, "", signal))

    def plane(self, plane: int, up: bool, reason: str, now: float) -> None:
        """The plane became usable for data or stopped being usable."""
        if not self.live:
            return
        state = "up" if up else "down"
        self._queue.append((now, "plane", {"plane": plane, "state": state, "reason": reason}))

    def port(self, plane: int, up: bool, now: float) -> None:
        """The peer announced it can (or cannot) receive on `plane`."""
        if self.live:
            self._queue.append((now, "port", {"plane": plane, "up": up}))

    def retransmit(self, psn: int, ev: int, plane: int, cause: str, now: float) -> None:
        if self.live and self._take(now, "retransmit"):
            fields = {"psn": psn, "ev": ev, "plane": plane, "cause": cause}
            self._queue.append((now, "retransmit", fields))

    def rtt(self, plane: int, ev: int, rtt: float, now: float) -> None:
        if not self.live or now < self._rtt_next.get(plane, 0.0):
            return
        self._rtt_next[plane] = now + self.cc_sample_seconds
        if self._take(now, "rtt"):
            fields = {"plane": plane, "ev": ev, "rtt": round(rtt, 9)}
            self._queue.append((now, "rtt", fields))

    def cc_due(self, now: float) -> bool:
        """A congestion sample is due (every `cc_sample_seconds`)."""
        due = self._next_cc
        return self.recording and self.live and (due is None or now >= due)

    # -- calls of the owner -------------------------------------------------------------------

    def detach(self) -> None:
        """Stop recording (the owner's test is over); what was recorded stays."""
        self.live = False

    def fault(self, plane: int, detail: str, at: float) -> None:
        """A fault the owner injected or scheduled for `at` (a bench `--inject`): recorded by
        the first sample at or after `at`, so records stay in time order (a test that ends
        first never had it)."""
        if self.recording:
            self._faults.append((at, "fault", {"plane": plane, "detail": detail}))
            self._faults.sort(key=lambda r: r[0])

    def sample(
        self,
        now: float,
        drops: Mapping[str, int] | None = None,
        cc: Sequence[CcRow] | None = None,
    ) -> None:
        """Take what is due at `now`: the faults whose time came, the drops counted since the
        last sample (`drops`: the session's counters as they stand), the congestion rows `cc`
        (the session gives them when `cc_due`), and a `suppressed` record once a second when
        something was left out. The owner calls it through `Session.sample_trace`, or
        directly when no session is traced any more."""
        if not self.recording:
            return
        while self._faults and self._faults[0][0] <= now:
            self._queue.append(self._faults.pop(0))
        if self.live and drops is not None:
            self._sample_drops(now, drops)
        due = self._next_cc
        if self.live and cc is not None and (due is None or now >= due):
            for plane, window, in_flight, sent in cc:
                fields = {
                    "plane": plane,
                    "cwnd": round(window),
                    "in_flight": in_flight,
                    "bytes_sent": sent,
                }
                self._queue.append((now, "cc", fields))
            step = self.cc_sample_seconds
            # On the grid while the caller keeps up; a late caller starts a new one.
            self._next_cc = now + step if due is None or due + step <= now else due + step
        if self.suppressed and (
            self._suppressed_at is None or now - self._suppressed_at >= SUPPRESSED_EVERY
        ):
            self._suppressed_at = now
            self._queue.append((now, "suppressed", {"counts": dict(self.suppressed)}))
            self.suppressed.clear()

    def records(self) -> list[TraceRecord]:
        """The records queued since the last call, in the order they were made."""
        out, self._queue = self._queue, []
        out.sort(key=lambda r: r[0])  # a fault released late, among records made meanwhile
        return out

    def ev_timeline(self, t0: float) -> list[dict[str, Any]]:
        """`end.mrc.ev_timeline` of `mrc bench -J`: the timeline, `t` since `t0`."""
        return [
            {"t": t_of(now, t0), "ev": ev, "plane": plane, "state": state, "reason": reason}
            for now, ev, plane, state, reason in self.timeline
        ]

    # -- helpers --------------------------------------------------------------------------------

    def _ev_record(self, now: float, rec: EvRecord, state: str, reason: str) -> None:
        if len(self.timeline) >= self.timeline_max:
            self.timeline_truncated = True
            return
        self.timeline.append((now, rec.ev, rec.plane, state, reason))
        if self.recording:
            fields = {"ev": rec.ev, "plane": rec.plane, "state": state, "reason": reason}
            self._queue.append((now, "ev", fields))

    def _take(self, now: float, kind: str) -> bool:
        """One token of the bucket, or the record is counted as suppressed."""
        rate = self.records_per_second
        if self._tokens_at is not None:
            self._tokens = min(float(rate), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.suppressed[kind] += 1
        self.suppressed_total += 1
        return False

    def _sample_drops(self, now: float, drops: Mapping[str, int]) -> None:
        seen = self._drops_seen
        for reason, count in drops.items():
            new = count - seen.get(reason, 0)
            # Left out by the rate limit, the count waits for the next record of its reason.
            if new > 0 and self._take(now, "drop"):
                seen[reason] = count
                self._queue.append((now, "drop", {"reason": reason, "count": new}))


class TraceLog:
    """A `TraceCollector` for each session a listener accepts (sink.py's `TraceLog`), with the
    same limits; `traces` holds them by QPN until the owner `forget`s one."""

    def __init__(
        self,
        *,
        records: bool = False,
        records_per_second: int = RECORDS_PER_SECOND,
        cc_sample_seconds: float = CC_SAMPLE_SECONDS,
        timeline_max: int = TIMELINE_MAX,
    ) -> None:
        self._limits = (records, records_per_second, cc_sample_seconds, timeline_max)
        self.traces: dict[int, TraceCollector] = {}

    def start_trace(self, qpn: int) -> TraceCollector:
        records, per_second, cc_seconds, timeline_max = self._limits
        trace = TraceCollector(
            records=records,
            records_per_second=per_second,
            cc_sample_seconds=cc_seconds,
            timeline_max=timeline_max,
        )
        self.traces[qpn] = trace
        return trace

    def forget(self, qpn: int) -> None:
        self.traces.pop(qpn, None)
