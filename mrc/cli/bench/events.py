"""The text report's event lines: bursts folded into one line, flapping planes explained once.

`mrc bench -J` keeps every event (`end.mrc.events`); a reader of the text report wants what
happened, not thirty copies of it (docs/DESIGN.md §10). Here:

* EVs retired (or restored) on one plane for one reason within `BURST` seconds of the first
  are one line: "14 EVs retired on plane 2 (timeout) over 17 ms";
* a plane's state changes (down/up, or the port state a side announced) that follow each
  other within `BURST` are one line naming the sequence and the state it ended in, and the
  first such line is followed once by what flapping means;
* every other event is one line in words.

Events are the dicts `BenchTest` records (`t`, `event`, `plane`, `ev`, `detail`) plus `side`
("local" or "remote"); they arrive sorted by `t`. What it leaves to others: recording the
events (stream.py) and the rest of the report (report.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Events of one kind, plane and reason this close to the first of a burst fold into it;
#: state changes this close to the previous one make a flap.
BURST = 0.05

_FOLDED = {"path-retired": "retired", "path-restored": "restored"}
#: State-change kinds and the state each one enters; a pair shares one flap chain.
_STATES = {
    "plane-down": ("plane", "down"),
    "plane-up": ("plane", "up"),
    "port-down": ("port", "down"),
    "port-up": ("port", "up"),
}
FLAP_NOTE = (
    "       (flapping: the plane's state changed again within 50 ms of the last change; "
    "only the state it ended in holds, and traffic avoided the plane meanwhile)"
)


@dataclass
class _Group:
    t: float
    kind: str
    plane: Any
    side: str
    detail: str
    times: list[float] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


def event_lines(events: Iterable[dict[str, Any]]) -> list[str]:
    """The report's `event:` lines for `events` (sorted by time)."""
    groups: list[_Group] = []
    open_bursts: dict[tuple[str, Any, str, str], _Group] = {}
    open_chains: dict[tuple[str, Any, str], _Group] = {}
    for e in events:
        t = float(e.get("t") or 0.0)
        kind = str(e.get("event", "?"))
        plane = e.get("plane")
        side = str(e.get("side", "local"))
        detail = str(e.get("detail") or "")
        if kind in _FOLDED:
            key = (kind, plane, side, detail)
            g = open_bursts.get(key)
            if g is None or t - g.t > BURST:
                g = open_bursts[key] = _Group(t, kind, plane, side, detail)
                groups.append(g)
            g.times.append(t)
        elif kind in _STATES:
            what, state = _STATES[kind]
            chain = (what, plane, side)
            g = open_chains.get(chain)
            if g is None or t - g.times[-1] > BURST:
                g = open_chains[chain] = _Group(t, what, plane, side, detail)
                groups.append(g)
            g.times.append(t)
            g.states.append(state)
            g.details.append(detail)
        else:
            g = _Group(t, kind, plane, side, detail, times=[t])
            groups.append(g)
    lines: list[str] = []
    explained = False
    for g in groups:
        where = "" if g.side == "local" or g.kind == "port" else " (peer)"
        lines.append(f"event: {g.t:7.3f} s  {_describe(g)}{where}")
        if len(g.states) > 1 and not explained:
            lines.append(FLAP_NOTE)
            explained = True
    return lines


def _describe(g: _Group) -> str:
    plane = f"plane {g.plane}" if g.plane is not None else "all planes"
    span = g.times[-1] - g.times[0]
    over = f" over {span * 1e3:.0f} ms" if span >= 0.0005 else ""
    if g.kind in _FOLDED:
        n = len(g.times)
        what = f"{n} EVs" if n > 1 else "1 EV"
        reason = f" ({g.detail})" if g.detail else ""
        if g.kind == "path-restored":
            reason = reason or " (answered their probes)"
        return f"{what} {_FOLDED[g.kind]} on {plane}{reason}{over}"
    if g.states:
        last = g.states[-1]
        reason = next((d for s, d in zip(reversed(g.states), reversed(g.details), strict=True)
                       if s == last and d), "")  # fmt: skip
        if g.kind == "plane":
            end = f"{plane} {last}" + (f": {reason}" if reason else "")
        else:
            can = "can" if last == "up" else "cannot"
            who = "we told the peer we" if g.side == "local" else "the peer told us it"
            end = f"{plane}: {who} {can} receive"
        if len(g.states) == 1:
            return end if g.kind == "port" or last == "down" else f"{plane} up again"
        seq = " → ".join(g.states)
        return f"{end} (flapped {seq}{over})"
    if g.kind == "fault":
        return f"{plane}: {g.detail}" if g.detail else f"fault on {plane}"
    return f"{g.kind} {plane}" + (f": {g.detail}" if g.detail else "")
