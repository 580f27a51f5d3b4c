"""The data of every `mrc plot` panel, from hand-built bench -J documents and traces.

The run in plotdocs.py: two planes at 1 Gbit/s each; at 0.02 s a fault on plane 1, whose two
EVs are retired by timeouts at 0.022 and 0.025 s; EV 20 is probed at 0.03 and restored at
0.035; plane 0's EV 10 is skipped for an ECN mark at 0.036; EV 11 is a spare throughout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from plotdocs import (
    EVENTS,
    INTERVALS,
    TIMELINE,
    bench_doc,
    client_doc,
    ev,
    interval,
    trace_lines,
    write_json,
    write_trace,
)

from mrc.plot import PlotError, load
from mrc.plot.series import (
    EvRow,
    Mark,
    Segment,
    ev_panel,
    failover,
    goodput,
    marks,
    panels,
    total_window,
    windows,
)


@pytest.fixture
def client(tmp_path: Path) -> Path:
    return write_json(tmp_path / "client.json", client_doc())


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "run.trace", trace_lines())


def test_goodput_per_plane_from_intervals(client: Path) -> None:
    rates = goodput(load(str(client)))
    assert [r.plane for r in rates] == [0, 1]
    assert rates[0].starts == (0.0, 0.01, 0.02, 0.03)
    assert rates[0].ends == (0.01, 0.02, 0.03, 0.04)
    assert rates[0].gbps == pytest.approx((1.0, 1.0, 2.0, 2.0))
    # the faulted plane: nothing in the interval after the fault, then half a gigabit
    assert rates[1].gbps == pytest.approx((1.0, 1.0, 0.0, 0.5))


def test_goodput_from_a_trace_is_the_same(client: Path, trace: Path) -> None:
    """The trace's cumulative bytes_sent, differenced between its 10 ms cc samples, give the
    very intervals the -J reports."""
    from_json, from_trace = goodput(load(str(client))), goodput(load(str(trace)))
    assert [(r.plane, r.starts, r.ends) for r in from_trace] == [
        (r.plane, r.starts, r.ends) for r in from_json
    ]
    for a, b in zip(from_trace, from_json, strict=True):
        assert a.gbps == pytest.approx(b.gbps)


def test_zero_width_interval_left_out(tmp_path: Path) -> None:
    doc = bench_doc([interval(0.0, 0.01, [1_250_000, 0]), interval(0.01, 0.01, [5, 5]),
                     interval(0.01, 0.02, [0, 1_250_000])], [])
    rates = goodput(load(str(write_json(tmp_path / "z.json", doc))))
    assert rates[0].starts == (0.0, 0.01) and rates[1].gbps == pytest.approx((0.0, 1.0))


def test_marks_fold_a_burst_of_retirements_into_one(client: Path) -> None:
    assert marks(load(str(client))) == [
        Mark(0.02, "fault", 1, 1, "fault: plane 1"),
        Mark(0.022, "path-retired", 1, 2, "2 EVs retired on plane 1 (timeout)"),
    ]


def test_marks_from_a_trace_add_its_plane_changes(trace: Path) -> None:
    assert marks(load(str(trace))) == [
        Mark(0.02, "fault", 1, 1, "fault: plane 1"),
        Mark(0.022, "path-retired", 1, 2, "2 EVs retired on plane 1 (timeout)"),
        Mark(0.023, "plane-down", 1, 1, "plane 1 down"),
        Mark(0.034, "plane-up", 1, 1, "plane 1 up"),
    ]


def test_retirements_further_apart_than_a_burst_are_two_marks(tmp_path: Path) -> None:
    events = [ev(0.1, "path-retired", 0, 1, "timeout"), ev(0.13, "path-retired", 0, 2, "timeout"),
              ev(0.14, "path-retired", 0, 3, "loss"), ev(0.2, "path-retired", 0, 4, "timeout"),
              ev(0.21, "plane-down", None)]
    got = marks(load(str(write_json(tmp_path / "b.json", bench_doc(INTERVALS, events)))))
    assert [(m.t, m.kind, m.count, m.label) for m in got] == [
        (0.1, "path-retired", 2, "2 EVs retired on plane 0 (timeout)"),
        (0.14, "path-retired", 1, "1 EV retired on plane 0 (loss)"),
        (0.2, "path-retired", 1, "1 EV retired on plane 0 (timeout)"),
        (0.21, "plane-down", 1, "all planes down"),
    ]


EXPECTED_ROWS = (EvRow(0, 10), EvRow(0, 11), EvRow(1, 20), EvRow(1, 21))
EXPECTED_SEGMENTS = (
    Segment(0, 0.0, 0.036, "good"),
    Segment(0, 0.036, 0.04, "skip"),
    Segment(1, 0.0, 0.04, "backup"),
    Segment(2, 0.0, 0.022, "good"),
    Segment(2, 0.022, 0.03, "retired"),
    Segment(2, 0.03, 0.035, "probing"),
    Segment(2, 0.035, 0.04, "good"),
    Segment(3, 0.0, 0.025, "good"),
    Segment(3, 0.025, 0.04, "retired"),
)


def test_ev_timeline_rows_by_plane_and_state_segments(client: Path) -> None:
    tl = ev_panel(load(str(client)))
    assert tl.rows == EXPECTED_ROWS
    assert tl.segments == EXPECTED_SEGMENTS
    assert (tl.source, tl.truncated) == ("ev_timeline", False)


def test_ev_timeline_from_a_trace_is_the_same_picture(client: Path, trace: Path) -> None:
    a, b = ev_panel(load(str(client))), ev_panel(load(str(trace)))
    assert (b.rows, b.segments) == (a.rows, a.segments)
    assert b.source == "trace"


def test_a_truncated_timeline_ends_at_its_last_change(tmp_path: Path) -> None:
    doc = bench_doc(INTERVALS, [], timeline=TIMELINE[:6])
    doc["end"]["mrc"]["ev_timeline_truncated"] = True
    tl = ev_panel(load(str(write_json(tmp_path / "cut.json", doc))))
    assert (tl.truncated, tl.end) == (True, 0.025)
    assert tl.segments == (
        Segment(0, 0.0, 0.025, "good"),
        Segment(1, 0.0, 0.025, "backup"),
        Segment(2, 0.0, 0.022, "good"),
        Segment(2, 0.022, 0.025, "retired"),
        Segment(3, 0.0, 0.025, "good"),
        Segment(3, 0.025, 0.025, "retired"),
    )


def test_repeated_state_continues_its_segment(tmp_path: Path) -> None:
    timeline = [*TIMELINE[:4], {"t": 0.01, "ev": 21, "plane": 1, "state": "good", "reason": ""}]
    tl = ev_panel(load(str(write_json(tmp_path / "r.json",
                                      bench_doc(INTERVALS, [], timeline=timeline)))))
    assert [s for s in tl.segments if s.row == 3] == [Segment(3, 0.0, 0.04, "good")]


def test_ev_timeline_derived_from_events_without_ev_timeline(tmp_path: Path) -> None:
    """A -J without end.mrc.ev_timeline: the EV table gives the rows, path-retired and
    path-restored the changes."""
    evs = [{"ev": e, "plane": p, "state": "good"} for e, p in ((10, 0), (20, 1), (21, 1))]
    doc = bench_doc(INTERVALS, EVENTS, evs=evs)
    tl = ev_panel(load(str(write_json(tmp_path / "d.json", doc))))
    assert tl.source == "events"
    assert tl.rows == (EvRow(0, 10), EvRow(1, 20), EvRow(1, 21))
    assert tl.segments == (
        Segment(0, 0.0, 0.04, "good"),
        Segment(1, 0.0, 0.022, "good"),
        Segment(1, 0.022, 0.035, "retired"),
        Segment(1, 0.035, 0.04, "good"),
        Segment(2, 0.0, 0.025, "good"),
        Segment(2, 0.025, 0.04, "retired"),
    )


def test_windows_per_plane_and_the_connection_window(client: Path) -> None:
    run = load(str(client))
    w = windows(run)
    assert [x.plane for x in w] == [0, 1]
    assert w[0].t == (0.01, 0.02, 0.03, 0.04)
    assert w[0].cwnd == (100_000, 110_000, 120_000, 130_000)
    assert w[0].in_flight == (50_000, 55_000, 70_000, 80_000)
    assert w[1].cwnd == (200_000, 210_000, 0, 50_000)
    assert total_window(run) == ((0.01, 0.02, 0.03, 0.04), (300_000, 320_000, 120_000, 180_000))


def test_windows_without_a_cc(tmp_path: Path) -> None:
    """`--cc none`: the -J's cap is null; the bytes in flight are still drawn."""
    doc = bench_doc([interval(0.0, 0.01, [10, 20], caps=[None, None], in_flight=[5, 6]),
                     interval(0.01, 0.02, [10, 20], caps=[None, None], in_flight=[7, 8])], [])
    run = load(str(write_json(tmp_path / "none.json", doc)))
    w = windows(run)
    assert [(x.plane, x.t, x.cwnd, x.in_flight) for x in w] == [
        (0, (0.01, 0.02), (None, None), (5, 7)), (1, (0.01, 0.02), (None, None), (6, 8))]
    assert run.skipped == 0 and len(goodput(run)) == 2


def test_windows_from_a_trace(trace: Path) -> None:
    w = windows(load(str(trace)))
    assert w[1].t == (0.0, 0.01, 0.02, 0.03, 0.04)
    assert w[1].cwnd == (0, 200_000, 210_000, 0, 50_000)
    assert w[1].in_flight == (0, 60_000, 65_000, 0, 10_000)


def compare_doc(**series: dict[str, object]) -> dict[str, object]:
    return {"tool": "tools.compare", "version": 1,
            "failover": {k: {"fault_at_s": v["fault_at_s"], "series": v} for k, v in
                         series.items()}}


def test_failover_aligned_at_each_fault(tmp_path: Path) -> None:
    doc = compare_doc(
        mrc={"bin_seconds": 0.01, "t0": 1.98, "fault_at_s": 2.0, "bps": [4e9, 4e9, 3e9, 3e9]},
        mptcp={"bin_seconds": 0.01, "t0": 0.0, "fault_at_s": 0.02, "bps": [8e9, 8e9, 0.0]},
    )
    run = load(str(write_json(tmp_path / "compare.json", doc)))
    got = failover(run)
    assert [a.transport for a in got] == ["mptcp", "mrc"]
    assert got[0].t == pytest.approx((-0.02, -0.01, 0.0))
    assert got[0].gbps == (8.0, 8.0, 0.0)
    assert got[1].t == pytest.approx((-0.02, -0.01, 0.0, 0.01))
    assert got[1].gbps == (4.0, 4.0, 3.0, 3.0)
    assert panels(run, "all") == ["failover"]


def test_panels_the_input_supports(client: Path, trace: Path, tmp_path: Path) -> None:
    assert panels(load(str(client)), "all") == ["goodput", "evs", "cc"]
    assert panels(load(str(trace)), "all") == ["goodput", "evs", "cc"]
    receiver = bench_doc([interval(0.0, 0.01, [10, 20], sender=False)], [], role="server")
    run = load(str(write_json(tmp_path / "server.json", receiver)))
    assert panels(run, "all") == ["goodput"]
    for what, why in (
        ("evs", "no EV timeline: no end.mrc.ev_timeline, and this side sent no data"),
        ("cc", "no congestion window data: only the sending side's intervals carry in_flight "
               "and cap (run mrc bench with -i)"),
        ("failover", "the failover panel needs a compare.json (make compare)"),
    ):
        with pytest.raises(PlotError) as exc:
            panels(run, what)
        assert str(exc.value) == f"{run.path}: {why}"
    receiver["end"]["mrc"]["ev_timeline"] = []  # the bench's: a receiver changes no EV
    run = load(str(write_json(tmp_path / "server.json", receiver)))
    with pytest.raises(PlotError) as exc:
        panels(run, "evs")
    assert str(exc.value) == (f"{run.path}: no EV timeline: end.mrc.ev_timeline is empty "
                              "(this side sent no data)")


def test_a_failed_probe_is_not_a_new_retirement(tmp_path: Path) -> None:
    """In a trace, EV 20 retired → probing → retired (its probe went unanswered) is one
    retirement, as in the -J's path-retired events."""
    recs = trace_lines()
    recs.insert(-1, {"t": 0.033, "kind": "ev", "ev": 21, "plane": 1, "state": "probing",
                     "reason": "probe"})
    recs.insert(-1, {"t": 0.0335, "kind": "ev", "ev": 21, "plane": 1, "state": "retired",
                     "reason": ""})
    recs.sort(key=lambda r: r.get("t", -1.0))
    run = load(str(write_trace(tmp_path / "p.trace", recs)))
    assert [(m.kind, m.count) for m in marks(run) if m.kind == "path-retired"] == [
        ("path-retired", 2)]
    assert [s for s in ev_panel(run).segments if s.row == 3] == [
        Segment(3, 0.0, 0.025, "good"), Segment(3, 0.025, 0.033, "retired"),
        Segment(3, 0.033, 0.0335, "probing"), Segment(3, 0.0335, 0.04, "retired")]
