"""Hand-built inputs of `mrc plot`: a bench -J document and a trace, in the shapes the bench
writes (docs/DESIGN.md §10), small enough that every number in the tests can be checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def interval(start: float, end: float, plane_bytes: list[int], *,
             caps: list[int | None] | None = None,
             in_flight: list[int] | None = None, snd_cwnd: int | None = None,
             sender: bool = True) -> dict[str, Any]:
    planes: list[dict[str, Any]] = []
    for p, n in enumerate(plane_bytes):
        rec: dict[str, Any] = {"plane": p, "bytes": n, "packets": n // 4096}
        if caps is not None and in_flight is not None:
            rec["in_flight"], rec["cap"] = in_flight[p], caps[p]
        planes.append(rec)
    s: dict[str, Any] = {"start": start, "end": end, "seconds": end - start,
                         "bytes": sum(plane_bytes), "sender": sender, "retransmits": 0}
    if snd_cwnd is not None:
        s["snd_cwnd"] = snd_cwnd
    return {"sum": s, "planes": planes}


def ev(t: float, event: str, plane: int | None, ev_id: int | None = None,
       detail: str = "") -> dict[str, Any]:
    return {"t": t, "event": event, "plane": plane, "ev": ev_id, "detail": detail}


def bench_doc(intervals: list[dict[str, Any]], events: list[dict[str, Any]], *,
              role: str = "client", timeline: list[dict[str, Any]] | None = None,
              evs: list[dict[str, Any]] | None = None, seconds: float = 0.04) -> dict[str, Any]:
    mrc: dict[str, Any] = {
        "integrity": "ok",
        "planes": [{"plane": p, "state": "up"} for p in range(2)],
        "evs": list(evs or []),
        "events": list(events),  # copies: a test may append to its document
    }
    if timeline is not None:
        mrc["ev_timeline"] = list(timeline)
        mrc["ev_timeline_truncated"] = False
    return {
        "start": {"role": role, "test_start": {"num_planes": 2, "interval": 0.01}},
        "intervals": list(intervals),
        "end": {"sum_sent": {"start": 0.0, "end": seconds, "seconds": seconds}, "mrc": mrc},
    }


#: Two planes, two EVs each (10 on plane 0, 20 and 21 on plane 1) and a spare (11 on plane 0):
#: plane 1's EVs are retired by timeouts 3 ms apart after a fault at 0.02 s, one probed back.
TIMELINE = [
    {"t": 0.0, "ev": 10, "plane": 0, "state": "good", "reason": "start"},
    {"t": 0.0, "ev": 11, "plane": 0, "state": "backup", "reason": "start"},
    {"t": 0.0, "ev": 20, "plane": 1, "state": "good", "reason": "start"},
    {"t": 0.0, "ev": 21, "plane": 1, "state": "good", "reason": "start"},
    {"t": 0.022, "ev": 20, "plane": 1, "state": "retired", "reason": "timeout"},
    {"t": 0.025, "ev": 21, "plane": 1, "state": "retired", "reason": "timeout"},
    {"t": 0.03, "ev": 20, "plane": 1, "state": "probing", "reason": "probe"},
    {"t": 0.035, "ev": 20, "plane": 1, "state": "good", "reason": "restored"},
    {"t": 0.036, "ev": 10, "plane": 0, "state": "skip", "reason": "ecn"},
]

EVENTS = [
    ev(0.02, "fault", 1, detail="plane-down injected at 0.02 s"),
    ev(0.022, "path-retired", 1, 20, "timeout"),
    ev(0.025, "path-retired", 1, 21, "timeout"),
    ev(0.035, "path-restored", 1, 20),
]

INTERVALS = [
    # 1.25 MB per plane per 10 ms: 1 Gbit/s each; plane 1 gets nothing after the fault
    interval(0.0, 0.01, [1_250_000, 1_250_000], caps=[100_000, 200_000],
             in_flight=[50_000, 60_000], snd_cwnd=300_000),
    interval(0.01, 0.02, [1_250_000, 1_250_000], caps=[110_000, 210_000],
             in_flight=[55_000, 65_000], snd_cwnd=320_000),
    interval(0.02, 0.03, [2_500_000, 0], caps=[120_000, 0], in_flight=[70_000, 0],
             snd_cwnd=120_000),
    interval(0.03, 0.04, [2_500_000, 625_000], caps=[130_000, 50_000],
             in_flight=[80_000, 10_000], snd_cwnd=180_000),
]


def client_doc() -> dict[str, Any]:
    return bench_doc(INTERVALS, EVENTS, timeline=TIMELINE)


def trace_lines() -> list[dict[str, Any]]:
    """A trace of the same run: header, the same EV changes, plane and fault records, cc
    samples every 10 ms whose cumulative bytes_sent give the same per-plane goodput."""
    head = {"format": "mrc-trace", "version": 1, "role": "client", "qpn": 1, "peer_qpn": 2,
            "planes": [0, 1], "ev_per_plane": 2, "start_unix": 1795526032.0,
            "limits": {"records_per_second": 2000, "cc_sample_seconds": 0.01}}
    recs: list[dict[str, Any]] = [head]
    sent = [0, 0]
    recs += [{"t": 0.0, "kind": "cc", "plane": p, "cwnd": 0, "in_flight": 0, "bytes_sent": 0}
             for p in range(2)]
    for iv in INTERVALS:
        for p in iv["planes"]:
            sent[p["plane"]] += p["bytes"]
            recs.append({"t": iv["sum"]["end"], "kind": "cc", "plane": p["plane"],
                         "cwnd": p["cap"], "in_flight": p["in_flight"],
                         "bytes_sent": sent[p["plane"]]})
    recs += [{"kind": "ev", **r} for r in TIMELINE]
    recs.append({"t": 0.02, "kind": "fault", "plane": 1, "detail": "plane-down injected"})
    recs.append({"t": 0.021, "kind": "retransmit", "psn": 7, "ev": 20, "plane": 1,
                 "cause": "rto"})
    recs.append({"t": 0.023, "kind": "plane", "plane": 1, "state": "down",
                 "reason": "peer cannot receive"})
    recs.append({"t": 0.031, "kind": "a-kind-of-a-later-mrc", "x": 1})
    recs.append({"t": 0.034, "kind": "plane", "plane": 1, "state": "up", "reason": ""})
    recs.sort(key=lambda r: r.get("t", -1.0))
    recs.append({"t": 0.04, "kind": "end", "records": len(recs) + 1, "suppressed": 0})
    return recs


def write_trace(path: Path, recs: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + tail, encoding="utf-8")
    return path


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return path
