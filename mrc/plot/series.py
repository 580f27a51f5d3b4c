"""What each panel of `mrc plot` shows, as plain data computed from a `Run`.

One function per panel: `goodput` (Gbit/s per plane per interval), `marks` (faults and
plane/port changes, and each burst of path retirements as one mark with its count),
`ev_timeline` (EV rows grouped by plane and state segments, the same function whatever the
input), `windows` (congestion window or cap and bytes in flight per plane) and `failover`
(mrc and MPTCP goodput on one axis, aligned at the fault). Each raises `PlotError` with one
line saying what the input lacks. `panels` picks what `--what` asks for. The drawing
(`draw.py`) uses only these, so tests check the figure's data here, not pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .model import EvChange, PlotError, Run

__all__ = [
    "PANELS",
    "STATES",
    "Aligned",
    "EvRow",
    "EvTimeline",
    "Mark",
    "PlaneRate",
    "PlaneWindow",
    "Segment",
    "ev_panel",
    "ev_timeline",
    "failover",
    "goodput",
    "marks",
    "panels",
    "total_window",
    "windows",
]

PANELS = ("goodput", "evs", "cc", "failover")
#: retirements on one plane for one reason this close to the first of a burst are one mark:
#: the text report's rule (BURST in mrc/cli/bench/events.py), not imported so that mrc.plot
#: does not load the command line it is loaded by
BURST = 0.05
#: EV states in the order the legend lists them (the contract's names)
STATES = ("good", "skip", "retired", "probing", "denied", "backup")
#: single events drawn as a line each; path retirements are folded into bursts
_SINGLE = {
    "fault": "fault",
    "plane-down": "down",
    "plane-up": "up",
    "port-down": "port down",
    "port-up": "port up",
}


@dataclass(frozen=True)
class PlaneRate:
    plane: int
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    gbps: tuple[float, ...]


@dataclass(frozen=True)
class Mark:
    t: float
    kind: str  # a key of _SINGLE, or "path-retired" for a burst
    plane: int | None
    count: int
    label: str


@dataclass(frozen=True)
class EvRow:
    plane: int
    ev: int


@dataclass(frozen=True)
class Segment:
    row: int  # index into EvTimeline.rows
    start: float
    end: float
    state: str


@dataclass(frozen=True)
class EvTimeline:
    rows: tuple[EvRow, ...]
    segments: tuple[Segment, ...]
    source: str
    truncated: bool
    end: float  # the states are known up to here: the test end, or the last change if cut


@dataclass(frozen=True)
class PlaneWindow:
    plane: int
    t: tuple[float, ...]
    cwnd: tuple[int | None, ...]  # None where the plane has no window (--cc none)
    in_flight: tuple[int, ...]


@dataclass(frozen=True)
class Aligned:
    transport: str
    t: tuple[float, ...]  # start of each bin, seconds relative to that run's fault
    gbps: tuple[float, ...]


def goodput(run: Run) -> list[PlaneRate]:
    """Gbit/s per plane per interval: the -J intervals' per-plane bytes, or the differences of
    a trace's cumulative `bytes_sent` between `cc` samples. Zero-width intervals are left out."""
    per: dict[int, list[tuple[float, float, float]]] = {}
    if run.kind == "bench":
        if not run.intervals:
            raise PlotError(f"{run.path}: no intervals: run mrc bench with -i")
        for iv in run.intervals:
            width = iv.end - iv.start
            for plane, n in iv.plane_bytes.items():
                if width > 0:
                    per.setdefault(plane, []).append((iv.start, iv.end, n * 8 / width / 1e9))
    elif run.kind == "trace":
        last: dict[int, tuple[float, int]] = {}
        for c in sorted(run.cc, key=lambda c: c.t):
            if c.bytes_sent is None:
                continue
            prev = last.get(c.plane)
            if prev is not None and c.t > prev[0]:
                rate = max(0, c.bytes_sent - prev[1]) * 8 / (c.t - prev[0]) / 1e9
                per.setdefault(c.plane, []).append((prev[0], c.t, rate))
            last[c.plane] = (c.t, c.bytes_sent)
        if not per:
            raise PlotError(f"{run.path}: no goodput: the trace has no cc records with "
                            "bytes_sent")
    else:
        raise PlotError(f"{run.path}: compare.json has failover series only "
                        "(use --what failover)")
    return [PlaneRate(p, tuple(s for s, _, _ in v), tuple(e for _, e, _ in v),
                      tuple(g for _, _, g in v)) for p, v in sorted(per.items())]


def marks(run: Run) -> list[Mark]:
    """The events the time panels mark: one per fault and plane or port change, and one per
    burst of EVs retired on one plane for one reason (within the text report's BURST of the
    first, docs/DESIGN.md §10), labelled with the count."""
    out: list[Mark] = []
    bursts: dict[tuple[int | None, str], tuple[int, list[float]]] = {}
    for e in sorted(run.events, key=lambda e: e.t):
        where = f"plane {e.plane}" if e.plane is not None else "all planes"
        if e.kind in _SINGLE:
            label = f"{where} {_SINGLE[e.kind]}" if e.kind != "fault" else f"fault: {where}"
            out.append(Mark(e.t, e.kind, e.plane, 1, label))
            continue
        if e.kind != "path-retired":
            continue
        key = (e.plane, e.detail)
        open_burst = bursts.get(key)
        if open_burst is None or e.t - open_burst[1][0] > BURST:
            open_burst = bursts[key] = (len(out), [])
            out.append(Mark(e.t, "path-retired", e.plane, 0, ""))
        idx, times = open_burst
        times.append(e.t)
        what = f"{len(times)} EVs" if len(times) > 1 else "1 EV"
        reason = f" ({e.detail})" if e.detail else ""
        out[idx] = Mark(times[0], "path-retired", e.plane, len(times),
                        f"{what} retired on {where}{reason}")
    return out


def ev_panel(run: Run) -> EvTimeline:
    """The EV timeline of `run`, or one line saying why it has none."""
    if run.kind == "compare":
        raise PlotError(f"{run.path}: compare.json has no EV timeline (use --what failover)")
    if not run.ev_timeline:
        if run.kind == "trace":
            raise PlotError(f"{run.path}: no EV timeline: the trace has no ev records")
        if run.ev_source == "ev_timeline":
            raise PlotError(f"{run.path}: no EV timeline: end.mrc.ev_timeline is empty (this "
                            "side sent no data)")
        raise PlotError(f"{run.path}: no EV timeline: no end.mrc.ev_timeline, and this side "
                        "sent no data")
    # a timeline cut at the bench's bound says nothing after its last change
    end = max(c.t for c in run.ev_timeline) if run.ev_truncated else run.duration
    return ev_timeline(run.ev_timeline, end, run.ev_source, run.ev_truncated)


def ev_timeline(changes: Sequence[EvChange], end: float, source: str = "",
                truncated: bool = False) -> EvTimeline:
    """Rows (EVs grouped by plane, in the order they first appear) and one segment per
    state an EV held, from its change to the next one or to `end`. A repeated state
    continues the segment it repeats."""
    ordered = sorted(enumerate(changes), key=lambda ic: (ic[1].t, ic[0]))
    per_ev: dict[tuple[int, int], list[EvChange]] = {}
    for _, c in ordered:
        per_ev.setdefault((c.plane, c.ev), []).append(c)
    keys = sorted(per_ev, key=lambda k: k[0])  # stable: first appearance within a plane
    rows = tuple(EvRow(plane, ev) for plane, ev in keys)
    segments: list[Segment] = []
    for row, key in enumerate(keys):
        held = per_ev[key]
        start, state = held[0].t, held[0].state
        for c in held[1:]:
            if c.state == state:
                continue
            segments.append(Segment(row, start, c.t, state))
            start, state = c.t, c.state
        segments.append(Segment(row, start, max(end, start), state))
    return EvTimeline(rows, tuple(segments), source, truncated, end)


def windows(run: Run) -> list[PlaneWindow]:
    """Congestion window (the plane's cap) and bytes in flight per plane over time."""
    if not run.cc:
        if run.kind == "bench":
            raise PlotError(f"{run.path}: no congestion window data: only the sending side's "
                            "intervals carry in_flight and cap (run mrc bench with -i)")
        if run.kind == "trace":
            raise PlotError(f"{run.path}: no congestion window data: the trace has no cc "
                            "records")
        raise PlotError(f"{run.path}: compare.json has failover series only "
                        "(use --what failover)")
    per: dict[int, list[tuple[float, int | None, int]]] = {}
    for c in sorted(run.cc, key=lambda c: c.t):
        per.setdefault(c.plane, []).append((c.t, c.cwnd, c.in_flight))
    return [PlaneWindow(p, tuple(t for t, _, _ in v), tuple(w for _, w, _ in v),
                        tuple(f for _, _, f in v)) for p, v in sorted(per.items())]


def total_window(run: Run) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """The connection's window (`sum.snd_cwnd`) at each -J interval's end; empty for traces."""
    got = [(iv.end, iv.snd_cwnd) for iv in run.intervals if iv.snd_cwnd is not None]
    return tuple(t for t, _ in got), tuple(w for _, w in got if w is not None)


def failover(run: Run) -> list[Aligned]:
    """compare.json's failover runs on one axis: each bin's start minus that run's fault."""
    if run.kind != "compare":
        raise PlotError(f"{run.path}: the failover panel needs a compare.json (make compare)")
    out = []
    for name, s in sorted(run.failover.items()):
        t = tuple(round(s.t0 + i * s.bin_seconds - s.fault_at_s, 9) for i in range(len(s.bps)))
        out.append(Aligned(name, t, tuple(b / 1e9 for b in s.bps)))
    return out


def panels(run: Run, what: str) -> list[str]:
    """The panels to draw: `what` itself (refused with its reason if the input lacks it), or
    for "all" every panel the input supports (refused only if it supports none)."""
    checks = {"goodput": goodput, "evs": ev_panel, "cc": windows, "failover": failover}
    if what != "all":
        if what not in checks:
            raise PlotError(f"unknown panel {what!r} (choose from {', '.join(PANELS)}, all)")
        checks[what](run)
        return [what]
    chosen, why = [], []
    for name in PANELS:
        try:
            checks[name](run)
        except PlotError as exc:
            why.append(str(exc))
            continue
        chosen.append(name)
    if not chosen:
        raise PlotError(why[0])
    return chosen
