"""`mrc plot` on a real run: a bench client and server on the 4 loopback planes, the writer's
plane 2 blackholed 0.8 s in (`--inject plane-down=2@0.8`), `-J -i 0.01 --trace FILE`; then the
figure's data is checked against what happened, and the trace's EV timeline against the -J's
(docs/DESIGN.md §10)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchproc import Server, client

from mrc.cli import main
from mrc.plot import load
from mrc.plot.series import PlaneRate, Segment, ev_panel, goodput, marks

FAULT_AT = 0.8
PLANE = 2


def mean_gbps(rate: PlaneRate, lo: float, hi: float) -> float:
    """The plane's mean over the intervals that lie within [lo, hi]."""
    got = [(e - s, g) for s, e, g in zip(rate.starts, rate.ends, rate.gbps, strict=True)
           if s >= lo and e <= hi]
    return sum(w * g for w, g in got) / sum(w for w, _ in got)


def shape(segments: tuple[Segment, ...], end: float) -> list[tuple[int, float, str, float]]:
    """The segments with the end of each row's last one (the input's test end) as -1."""
    return sorted((s.row, s.start, s.state, -1.0 if s.end >= end else s.end) for s in segments)


def test_plot_of_a_run_with_a_plane_blackholed(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    server = Server("-1")
    trace = tmp_path / "client.trace"
    try:
        proc = client(server.port, "-J", "-t", "2", "-i", "0.01", "--inject",
                      f"plane-down={PLANE}@{FAULT_AT}", "--trace", str(trace))
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    src = tmp_path / "client.json"
    src.write_text(proc.stdout, encoding="utf-8")
    run = load(str(src))

    # one goodput series per plane; all four carry data before the fault, and the
    # blackholed plane nearly nothing from 0.1 s after it to the end
    rates = goodput(run)
    assert [r.plane for r in rates] == [0, 1, 2, 3]
    before = [mean_gbps(r, 0.2, FAULT_AT) for r in rates]
    after = [mean_gbps(r, FAULT_AT + 0.1, run.duration) for r in rates]
    assert min(before) > 0.3 * max(before), before
    others = [g for p, g in enumerate(after) if p != PLANE]
    assert after[PLANE] < 0.02 * min(others), after

    # the fault is marked where it was injected, on its plane
    faults = [m for m in marks(run) if m.kind == "fault"]
    assert [m.plane for m in faults] == [PLANE]
    assert faults[0].t == pytest.approx(FAULT_AT, abs=0.01)

    # the EV timeline shows plane 2's EVs retired after the fault: every EV that a
    # path-retired event names, and none retired before the fault. (On a loaded host the
    # receiver may find the plane silent and withdraw it before any RTO retires an EV: then
    # the plane went down instead, and there is nothing retired to show.)
    tl = ev_panel(run)
    retired = {tl.rows[s.row].ev for s in tl.segments
               if s.state == "retired" and tl.rows[s.row].plane == PLANE}
    named = {e.ev for e in run.events if e.kind == "path-retired" and e.plane == PLANE}
    assert retired >= named, (retired, named, run.ev_source)
    went_down = any(e.kind == "plane-down" and e.plane == PLANE for e in run.events)
    assert named or went_down, run.events
    if retired:
        assert min(s.start for s in tl.segments if s.state == "retired"
                   and tl.rows[s.row].plane == PLANE) >= FAULT_AT
    assert {r.plane for r in tl.rows} == {0, 1, 2, 3}

    # the trace draws the same EV timeline: the same rows and segments, but for the end of
    # the last ones (the trace's last record comes a moment after the -J's test end)
    traced = load(str(trace))
    from_trace = ev_panel(traced)
    assert (tl.source, from_trace.source) == ("ev_timeline", "trace")
    assert from_trace.rows == tl.rows
    assert shape(from_trace.segments, traced.duration) == shape(tl.segments, run.duration)

    rc = main(["plot", str(src), "-o", str(tmp_path / "run.png")])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    assert out == f"wrote {tmp_path / 'run.png'} (goodput, evs, cc)\n"
    assert (tmp_path / "run.png").stat().st_size > 10_000
