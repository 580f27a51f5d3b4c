"""tools.job's pure parts: the fault schedules at exact times, the step merge, percentiles,
the summary against a baseline and the table. No testbed, no processes."""

from __future__ import annotations

import pytest

from tools.job import stats
from tools.job.schedule import Fabric, FaultEvent, ScheduleError, build

CLOS = Fabric(planes=4, racks=2, tier1=2, hosts=4)


def test_flap_every_second_staggered_over_the_planes() -> None:
    s = build("flap", CLOS, 2.0, 2.0)
    assert s.name == "flap"
    downs = [(e.at, e.links) for e in s.events if e.action == "down"]
    assert downs == [
        (2.0, ("t0r1p0-t1ap0",)), (2.25, ("t0r2p1-t1ap1",)), (2.5, ("t0r1p2-t1ap2",)),
        (2.75, ("t0r2p3-t1ap3",)), (3.0, ("t0r1p0-t1ap0",)), (3.25, ("t0r2p1-t1ap1",)),
        (3.5, ("t0r1p2-t1ap2",)), (3.75, ("t0r2p3-t1ap3",)),
    ]
    ups = [(e.at, e.links[0]) for e in s.events if e.action == "up"]
    assert ups[:2] == [(2.5, "t0r1p0-t1ap0"), (2.75, "t0r2p1-t1ap1")]
    assert len(ups) == len(downs)
    # the first link's up and the third link's down share 2.5 s: the up comes first
    at_25 = [(e.action, e.links[0]) for e in s.events if e.at == 2.5]
    assert at_25 == [("up", "t0r1p0-t1ap0"), ("down", "t0r1p2-t1ap2")]
    assert s.span == 4.25  # the last up
    assert [e.at for e in s.events] == sorted(e.at for e in s.events)


def test_flap_period_and_down_time() -> None:
    s = build("flap", Fabric(planes=1), 0.0, 3.0, period=1.5, down=0.1)
    assert [(e.at, e.action) for e in s.events] == [
        (0.0, "down"), (0.1, "up"), (1.5, "down"), (1.6, "up")]
    with pytest.raises(ScheduleError, match="down"):
        build("flap", CLOS, 0.0, 3.0, period=1.0, down=1.0)


def test_reboot_one_tier1_after_another() -> None:
    s = build("reboot", CLOS, 1.0, 10.0)
    assert [(e.at, e.action, e.label) for e in s.events] == [
        (1.0, "down", "reboot t1ap0"), (3.0, "up", "reboot t1ap0"),
        (3.5, "down", "reboot t1bp0"), (5.5, "up", "reboot t1bp0"),
        (6.0, "down", "reboot t1ap1"), (8.0, "up", "reboot t1ap1"),
        (8.5, "down", "reboot t1bp1"), (10.5, "up", "reboot t1bp1"),
    ]
    assert s.events[0].links == ("t0r1p0-t1ap0", "t0r2p0-t1ap0")
    assert s.events[-1].links == ("t0r1p1-t1bp1", "t0r2p1-t1bp1")
    assert s.span == 10.5
    three = build("reboot", Fabric(planes=2, racks=3, tier1=1), 0.0, 1.0, reboots=2, hold=1.0,
                  gap=0.0)
    assert [(e.at, e.action, e.links) for e in three.events] == [
        (0.0, "down", ("t0r1p0-t1ap0", "t0r2p0-t1ap0", "t0r3p0-t1ap0")),
        (1.0, "up", ("t0r1p0-t1ap0", "t0r2p0-t1ap0", "t0r3p0-t1ap0")),
        (1.0, "down", ("t0r1p1-t1ap1", "t0r2p1-t1ap1", "t0r3p1-t1ap1")),
        (2.0, "up", ("t0r1p1-t1ap1", "t0r2p1-t1ap1", "t0r3p1-t1ap1")),
    ]
    with pytest.raises(ScheduleError, match="9 switches asked, the fabric has 8"):
        build("reboot", CLOS, 0.0, 1.0, reboots=9)


def test_host_link_down_for_the_rest_of_the_run() -> None:
    s = build("host-link", CLOS, 2.0, 10.0)
    assert s.events == (FaultEvent(2.0, "down", ("h2-p0",), "h2-p0 lost"),)
    assert s.span == 12.0
    assert build("host-link", CLOS, 0.0, 1.0, link="h4-p3").events[0].links == ("h4-p3",)
    for bad in ("h5-p0", "h1-p4", "t0r1p0-t1ap0", "h-p0", "h1"):
        with pytest.raises(ScheduleError, match="not a host's plane link"):
            build("host-link", CLOS, 0.0, 1.0, link=bad)


def test_none_and_bad_names() -> None:
    assert build("none", CLOS, 2.0, 10.0).events == ()
    with pytest.raises(ScheduleError, match="unknown schedule"):
        build("storm", CLOS, 0.0, 1.0)
    with pytest.raises(ScheduleError, match="start"):
        build("flap", CLOS, -1.0, 1.0)


def test_schedule_json() -> None:
    doc = build("reboot", CLOS, 0.0, 1.0, reboots=1).to_json()
    assert doc == {"name": "reboot", "span": 2.0, "events": [
        {"at": 0.0, "action": "down", "links": ["t0r1p0-t1ap0", "t0r2p0-t1ap0"],
         "label": "reboot t1ap0"},
        {"at": 2.0, "action": "up", "links": ["t0r1p0-t1ap0", "t0r2p0-t1ap0"],
         "label": "reboot t1ap0"}]}


def _rec(step: int, start: float, end: float, ok: bool = True, verified: bool = True,
         error: str | None = None) -> dict[str, object]:
    return {"step": step, "start": start, "end": end, "ok": ok, "verified": verified,
            "error": error}


def test_percentile_nearest_rank() -> None:
    assert stats.percentile([], 50) is None
    assert stats.percentile([3.0], 99) == 3.0
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 50) == 50.0
    assert stats.percentile(values, 99) == 99.0
    assert stats.percentile(values[:20], 99) == 20.0


def test_merge_takes_the_slowest_rank_and_every_rank_must_agree() -> None:
    a = [_rec(0, 0.0, 0.2), _rec(1, 0.2, 0.5), _rec(2, 0.5, 0.7)]
    b = [_rec(0, 0.01, 0.25), _rec(1, 0.25, 0.45, ok=False, verified=False, error="timeout"),
         _rec(2, 0.45, 0.7, verified=False)]
    c = [_rec(0, 0.0, 0.2), _rec(1, 0.2, 0.5)]
    steps = stats.merge_steps([a, b, c])
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert steps[0] == {"step": 0, "start": 0.0, "end": 0.25, "seconds": 0.24, "ok": True,
                        "verified": True, "restarted": False, "errors": []}
    assert steps[1]["ok"] is False and steps[1]["errors"] == ["timeout"]
    assert steps[1]["seconds"] == 0.3
    assert steps[2]["ok"] is False and steps[2]["verified"] is False
    assert steps[2]["errors"] == ["1 rank(s) did not report the step"]


def test_summary_against_the_baseline() -> None:
    base_steps = [{"seconds": round(0.1 + i / 1000, 3), "ok": True, "verified": True}
                  for i in range(20)]
    base = stats.summarize(base_steps, 20, None)
    assert base["p50"] == 0.109 and base["p99"] == 0.119 and base["max"] == 0.119
    assert base["slow"] is None and base["goal"] is None and base["failed"] == 0
    faulty = [*base_steps[:18], {"seconds": 0.125, "ok": True, "verified": True},
              {"seconds": 5.0, "ok": False, "verified": False}]
    s = stats.summarize(faulty, 22, base)
    assert s["failed"] == 1 and s["unrun"] == 2  # one failed, two never reached
    assert s["slow"] == 2  # > 1.1 x 0.109
    assert s["verified"] == 19 and s["p99"] == 5.0 and s["goal"] is False
    good = stats.summarize([*base_steps[:19], {"seconds": 0.13, "ok": True, "verified": True}],
                           20, base)
    assert good["p99_ratio"] == round(0.13 / 0.119, 3) and good["goal"] is True
    table = stats.table([{"fabric": "srv6", "schedule": "flap", "transport": "mrc",
                          "summary": good}])
    lines = table.splitlines()
    assert lines[0].split() == ["fabric", "schedule", "transport", "steps", "p50", "ms", "p99",
                                "ms", "max", "ms", "slow", "failed", "unrun", "verified",
                                "p99/ff"]
    assert lines[1].split() == ["srv6", "flap", "mrc", "20", "109", "130", "130", "1", "0", "0",
                                "20/20", "1.09"]


def test_rank_data_sums_exactly() -> None:
    np = pytest.importorskip("numpy")
    from tools.job.rank import RESIDUE, contribution, expected

    base = np.arange(1 << 12, dtype=np.float32) % RESIDUE
    for world in (2, 4, 7):
        for step in (0, 5, 12, 13, 1000):
            parts = [contribution(np, base, r, step, vote=r == 1) for r in range(world)]
            total = np.sum(parts, axis=0, dtype=np.float32)
            assert np.array_equal(total[:-1], expected(np, base, world, step))
            assert total[-1] == 1.0  # one rank voted to stop
            # a rank's array differs from the next step's: a stale result cannot verify
            assert not np.array_equal(parts[0], contribution(np, base, 0, step + 1, False))
