"""Reading one `mrc bench -J` document (client or server) into a `Run`.

The document's keys are those of docs/DESIGN.md §10: `intervals[]` (`sum` and per-plane
`planes[]` with bytes, and on the sending side `in_flight`/`cap` and `sum.snd_cwnd`),
`end.mrc.events[]`, and `end.mrc.ev_timeline[]` where the bench writes it. A -J without an
EV timeline still gets one, derived from the path-retired/path-restored events and the EV
table `end.mrc.evs[]` (`ev_source` "events" says so). Malformed records are skipped and
counted. What it leaves to others: telling a bench document from other inputs (`load.py`)
and what the panels make of the data (`series.py`).
"""

from __future__ import annotations

from typing import Any

from .model import (
    BadRecord,
    CcSample,
    EvChange,
    Event,
    Interval,
    PlotError,
    Run,
    integer,
    num,
    opt_int,
    text,
)

__all__ = ["is_bench", "read_bench"]


def is_bench(doc: Any) -> bool:
    """Does `doc` look like `mrc bench -J` output (iperf3's three top-level keys)?"""
    return isinstance(doc, dict) and isinstance(doc.get("start"), dict) and "end" in doc


def read_bench(path: str, doc: dict[str, Any]) -> Run:
    if doc.get("error"):
        raise PlotError(f"{path}: the bench run failed: {doc['error']}")
    start, end = doc["start"], doc.get("end")
    if not isinstance(end, dict):
        raise PlotError(f"{path}: bench -J document without an 'end' section")
    mrc = end.get("mrc")
    if not isinstance(mrc, dict):
        raise PlotError(f"{path}: bench -J document without 'end.mrc' (not an mrc bench run?)")
    run = Run(path=path, kind="bench", role=str(start.get("role") or ""))
    raw_intervals = doc.get("intervals") or []
    if not isinstance(raw_intervals, list):
        raise PlotError(f"{path}: 'intervals' is not a list")
    for raw in raw_intervals:
        try:
            run.intervals.append(_interval(raw))
        except (BadRecord, AttributeError, TypeError):
            run.skipped += 1
    first = raw_intervals[0] if raw_intervals and isinstance(raw_intervals[0], dict) else {}
    first_sum = first.get("sum")
    sender = first_sum.get("sender") if isinstance(first_sum, dict) else None
    run.sender = sender if isinstance(sender, bool) else None
    run.events = _list(run, mrc.get("events"), _event)
    raw_timeline = mrc.get("ev_timeline")
    if isinstance(raw_timeline, list):
        run.ev_timeline = _list(run, raw_timeline, ev_change)
        run.ev_source = "ev_timeline"
        run.ev_truncated = mrc.get("ev_timeline_truncated") is True
    elif run.sender:
        run.ev_timeline = _derived_timeline(run, mrc.get("evs"))
        run.ev_source = "events" if run.ev_timeline else ""
    for iv in run.intervals:
        for plane in sorted(iv.in_flight):
            run.cc.append(CcSample(iv.end, plane, iv.cap.get(plane), iv.in_flight[plane]))
    raw_planes = mrc.get("planes")
    planes: set[int] = set()
    for p in raw_planes if isinstance(raw_planes, list) else []:
        if isinstance(p, dict) and isinstance(p.get("plane"), int):
            planes.add(p["plane"])
    for iv in run.intervals:
        planes.update(iv.plane_bytes)
    run.planes = tuple(sorted(planes))
    run.duration = _duration(run, end)
    return run


def _list(run: Run, raw: Any, one: Any) -> list[Any]:
    out: list[Any] = []
    for rec in raw if isinstance(raw, list) else []:
        try:
            out.append(one(rec))
        except (BadRecord, AttributeError, TypeError):
            run.skipped += 1
    return out


def _interval(raw: dict[str, Any]) -> Interval:
    s = raw["sum"] if isinstance(raw.get("sum"), dict) else {}
    start, end = num(s, "start"), num(s, "end")
    if end < start:
        raise BadRecord("end")
    plane_bytes: dict[int, int] = {}
    in_flight: dict[int, int] = {}
    cap: dict[int, int | None] = {}
    for p in raw.get("planes") or []:
        plane = integer(p, "plane")
        plane_bytes[plane] = integer(p, "bytes")
        if "in_flight" in p:  # the sending side's; its cap is null without a cc
            in_flight[plane] = integer(p, "in_flight")
            cap[plane] = opt_int(p, "cap")
    return Interval(start, end, plane_bytes, in_flight, cap, opt_int(s, "snd_cwnd"))


def _event(raw: dict[str, Any]) -> Event:
    return Event(num(raw, "t"), text(raw, "event"), opt_int(raw, "plane"), opt_int(raw, "ev"),
                 text(raw, "detail"))


def ev_change(raw: dict[str, Any]) -> EvChange:
    """One record of `end.mrc.ev_timeline` (a trace's `ev` records have the same fields)."""
    return EvChange(num(raw, "t"), integer(raw, "ev"), integer(raw, "plane"),
                    text(raw, "state"), text(raw, "reason"))


def _derived_timeline(run: Run, raw_evs: Any) -> list[EvChange]:
    """The EV timeline a -J without `ev_timeline` implies: every EV of `end.mrc.evs` good from
    0, retired at each path-retired event and good again at each path-restored. Skips, probes
    and backup EVs are not in the events, so this shows retirements only."""
    out = [EvChange(0.0, ev, plane, "good", "start")
           for ev, plane in _ev_table(run, raw_evs)]
    for e in run.events:
        if e.ev is None or e.plane is None:
            continue
        if e.kind == "path-retired":
            out.append(EvChange(e.t, e.ev, e.plane, "retired", e.detail))
        elif e.kind == "path-restored":
            out.append(EvChange(e.t, e.ev, e.plane, "good", "restored"))
    return out


def _ev_table(run: Run, raw_evs: Any) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    for rec in raw_evs if isinstance(raw_evs, list) else []:
        try:
            found.append((integer(rec, "ev"), integer(rec, "plane")))
        except (BadRecord, AttributeError, TypeError):
            run.skipped += 1
    return found


def _duration(run: Run, end: dict[str, Any]) -> float:
    times = [iv.end for iv in run.intervals] + [e.t for e in run.events]
    times += [c.t for c in run.ev_timeline]
    for key in ("sum_sent", "sum_received"):
        s = end.get(key)
        if isinstance(s, dict) and isinstance(s.get("seconds"), int | float):
            times.append(float(s["seconds"]))
    return max(times, default=0.0)
