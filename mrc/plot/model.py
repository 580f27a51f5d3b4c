"""The normalised data `mrc plot` draws, whatever file it came from.

Holds the records every loader produces (`Run` and its parts) and `PlotError`, the one-line
error every step raises for bad input. The loaders (`bench.py` for `mrc bench -J`, `trace.py`
for `--trace` files, `load.py` for the dispatch and compare.json) fill a `Run`; `series.py`
turns it into what each panel shows and `draw.py` draws that. Times are seconds since the
test's t0, the clock of `end.mrc.events` and the intervals (docs/DESIGN.md §10). The field
readers at the end (`num`, `integer`, `opt_int`, `text`) are what the loaders check records with:
a wrong type raises `BadRecord`, which a loader counts as a skipped record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BadRecord",
    "CcSample",
    "EvChange",
    "Event",
    "FailoverSeries",
    "Interval",
    "PlotError",
    "Run",
    "integer",
    "num",
    "opt_int",
    "text",
]


class PlotError(Exception):
    """Bad or unsuitable input: the message is one line, shown as is."""


@dataclass(frozen=True)
class Interval:
    """One `-J` interval: bytes per plane in [start, end) and the window state at its end."""

    start: float
    end: float
    plane_bytes: dict[int, int]
    in_flight: dict[int, int] = field(default_factory=dict)
    cap: dict[int, int | None] = field(default_factory=dict)
    snd_cwnd: int | None = None


@dataclass(frozen=True)
class Event:
    """One transport event (`end.mrc.events[]` or its trace equivalent)."""

    t: float
    kind: str  # fault, plane-down, plane-up, port-down, port-up, path-retired, path-restored …
    plane: int | None
    ev: int | None
    detail: str


@dataclass(frozen=True)
class EvChange:
    """One EV state change (`end.mrc.ev_timeline[]` or a trace's `ev` record)."""

    t: float
    ev: int
    plane: int
    state: str  # good, skip, retired, probing, denied, backup
    reason: str


@dataclass(frozen=True)
class CcSample:
    """The window state of one plane at time t (a trace `cc` record or a `-J` interval's end)."""

    t: float
    plane: int
    cwnd: int | None  # None: no window of its own (`--cc none` reports a null cap)
    in_flight: int
    bytes_sent: int | None = None  # cumulative; traces only


@dataclass(frozen=True)
class FailoverSeries:
    """`failover.<transport>.series` of compare.json: goodput bins on the run's own clock."""

    transport: str
    bin_seconds: float
    t0: float
    fault_at_s: float
    bps: tuple[float, ...]


@dataclass
class Run:
    """Everything one input file offers; empty lists where the input has no such data."""

    path: str
    kind: str  # "bench", "trace" or "compare"
    role: str = ""  # "client" / "server" for bench and trace inputs
    sender: bool | None = None  # did this side send the data (its interval bytes are sent)
    planes: tuple[int, ...] = ()
    intervals: list[Interval] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    ev_timeline: list[EvChange] = field(default_factory=list)
    #: where ev_timeline came from: "ev_timeline", "trace", "events" (derived from path
    #: retirements and restorations when the -J has no ev_timeline) or "" (none)
    ev_source: str = ""
    ev_truncated: bool = False
    cc: list[CcSample] = field(default_factory=list)
    failover: dict[str, FailoverSeries] = field(default_factory=dict)
    duration: float = 0.0
    #: records left out because they were malformed (a counted drop, reported by the CLI)
    skipped: int = 0
    notes: list[str] = field(default_factory=list)


class BadRecord(Exception):
    """A record with a missing or mistyped field: skipped and counted, not fatal."""


def num(d: dict[str, Any], key: str) -> float:
    v = d.get(key)
    # bool is an int to Python but never a number in these documents; json reads NaN and
    # Infinity, which no axis can hold
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise BadRecord(key)
    return float(v)


def integer(d: dict[str, Any], key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRecord(key)
    return v


def opt_int(d: dict[str, Any], key: str) -> int | None:
    return None if d.get(key) is None else integer(d, key)


def text(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise BadRecord(key)
    return v
