"""Reading an `mrc bench --trace FILE` (JSON Lines, docs/DESIGN.md §10) into a `Run`.

Line 1 is the header (`format` "mrc-trace", `version`, `role`, `planes` …); every other line
is one record with `t` and `kind`. Read here: `ev` (the same records as `end.mrc.ev_timeline`),
`plane` and `port` state changes, `fault`, and `cc` samples (cwnd, in_flight and cumulative
bytes_sent per plane, which also give the goodput per plane). Other kinds are ignored, as are
kinds this version does not know (forward compatible within version 1). A truncated last line
is ignored; a malformed record elsewhere is skipped and counted. Refused with one line: a first
line that is not such a header, a newer version, a trace with no records. What it leaves to
others: opening the file (`load.py`) and the panels (`series.py`).
"""

from __future__ import annotations

import json
from typing import Any

from .bench import ev_change
from .model import BadRecord, CcSample, Event, PlotError, Run, integer, num, opt_int, text

__all__ = ["TRACE_FORMAT", "TRACE_VERSION", "is_trace_header", "read_trace"]

TRACE_FORMAT = "mrc-trace"
TRACE_VERSION = 1  # the newest trace version this reader knows


def is_trace_header(first_line: str) -> bool:
    try:
        head = json.loads(first_line)
    except (ValueError, RecursionError):
        return False
    return isinstance(head, dict) and head.get("format") == TRACE_FORMAT


def read_trace(path: str, content: str) -> Run:
    lines = content.splitlines()
    head = _header(path, lines[0] if lines else "")
    run = Run(path=path, kind="trace", role=str(head.get("role") or ""))
    run.sender = run.role == "client" if run.role in ("client", "server") else None
    planes = head.get("planes")
    if isinstance(planes, list):
        run.planes = tuple(p for p in planes if isinstance(p, int) and not isinstance(p, bool))
    records = 0
    last_t = 0.0
    ev_states: dict[int, str] = {}
    body = lines[1:]
    for i, line in enumerate(body):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            if i == len(body) - 1 and not content.endswith("\n"):
                break  # the writer was cut off mid-line: tolerated
            run.skipped += 1
            continue
        try:
            if not isinstance(rec, dict):
                raise BadRecord("record")
            t = num(rec, "t")
            kind = text(rec, "kind")
            _record(run, kind, t, rec, ev_states)
        except (BadRecord, AttributeError, TypeError):
            run.skipped += 1
            continue
        if kind != "end":
            records += 1
        last_t = max(last_t, t)
    if records == 0:
        raise PlotError(f"{path}: no records (the trace has only its header)")
    run.ev_source = "trace" if run.ev_timeline else ""
    run.duration = last_t
    if not run.planes:
        found = {c.plane for c in run.cc} | {c.plane for c in run.ev_timeline}
        run.planes = tuple(sorted(found))
    return run


def _header(path: str, first: str) -> dict[str, Any]:
    try:
        head = json.loads(first)
    except (ValueError, RecursionError):
        head = None
    if not isinstance(head, dict) or head.get("format") != TRACE_FORMAT:
        raise PlotError(f"{path}: not an mrc trace (the first line is not a header with "
                        f'format "{TRACE_FORMAT}")')
    version = head.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise PlotError(f"{path}: trace header without a valid version")
    if version > TRACE_VERSION:
        raise PlotError(f"{path}: trace version {version} is newer than this mrc reads "
                        f"({TRACE_VERSION})")
    return head


def _record(run: Run, kind: str, t: float, rec: dict[str, Any],
            ev_states: dict[int, str]) -> None:
    if kind == "ev":
        change = ev_change(rec)
        run.ev_timeline.append(change)
        before = ev_states.get(change.ev)
        ev_states[change.ev] = change.state
        # the -J's path-retired/path-restored events, so the goodput panel marks them alike:
        # a retirement is a usable EV turning bad, not a failed probe sending it back
        if change.state == "retired" and before not in ("retired", "probing"):
            run.events.append(Event(t, "path-retired", change.plane, change.ev, change.reason))
        elif change.state == "good" and change.reason == "restored":
            run.events.append(Event(t, "path-restored", change.plane, change.ev, ""))
    elif kind == "plane":
        state = text(rec, "state")
        if state not in ("up", "down"):
            raise BadRecord("state")
        run.events.append(Event(t, f"plane-{state}", integer(rec, "plane"), None,
                                text(rec, "reason")))
    elif kind == "port":
        up = rec.get("up")
        if not isinstance(up, bool):
            raise BadRecord("up")
        run.events.append(Event(t, "port-up" if up else "port-down", integer(rec, "plane"),
                                None, ""))
    elif kind == "fault":
        run.events.append(Event(t, "fault", opt_int(rec, "plane"), None, text(rec, "detail")))
    elif kind == "cc":
        run.cc.append(CcSample(t, integer(rec, "plane"), opt_int(rec, "cwnd"),
                               integer(rec, "in_flight"), opt_int(rec, "bytes_sent")))
    # retransmit, drop, rtt, suppressed, end and kinds of later versions: not drawn
