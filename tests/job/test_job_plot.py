"""`mrc plot` on a tools.job document: the panels read from it (fault bands paired per link
set, a link left down reaching the end), one-line errors for broken documents, and a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mrc.plot import PlotError, plot_file
from mrc.plot.job import is_job_file, read_job


def _run(fabric: str, schedule: str, transport: str, faults: list[dict[str, Any]],
         bad: int | None = None) -> dict[str, Any]:
    steps = [{"step": i, "start": i * 0.3, "seconds": 5.0 if i == bad else 0.25,
              "ok": i != bad, "verified": i != bad} for i in range(20)]
    return {"fabric": fabric, "schedule": schedule, "transport": transport, "steps": steps,
            "faults": faults, "summary": {"p50": 0.25}}


def _doc(tmp_path: Path) -> Path:
    flap: list[dict[str, Any]] = [
        {"at": 1.0, "action": "down", "links": ["a"], "label": "flap a", "started": 1.001},
        {"at": 1.5, "action": "up", "links": ["a"], "label": "flap a", "started": 1.502},
        {"error": "stopped before its time"}]
    lost = [{"at": 2.0, "action": "down", "links": ["h2-p0"], "label": "h2-p0 lost"}]
    runs = [_run("srv6", "none", "mrc", []), _run("srv6", "none", "tcp", []),
            _run("srv6", "flap", "mrc", flap), _run("srv6", "flap", "tcp", flap, bad=4),
            _run("srv6", "host-link", "tcp", lost, bad=7)]
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"tool": "tools.job", "version": 1, "runs": runs}, indent=1))
    return path


def test_panels_and_fault_bands(tmp_path: Path) -> None:
    path = _doc(tmp_path)
    assert is_job_file(str(path))
    panels = read_job(str(path))
    assert [(p.fabric, p.schedule, [r.transport for r in p.runs]) for p in panels] == [
        ("srv6", "none", ["mrc", "tcp"]), ("srv6", "flap", ["mrc", "tcp"]),
        ("srv6", "host-link", ["tcp"])]
    assert panels[1].faults == [(1.001, 1.502, "flap a")]
    assert panels[2].faults == [(2.0, None, "h2-p0 lost")]
    tcp = panels[1].runs[1]
    assert tcp.good.count(False) == 1 and tcp.seconds[4] == 5.0 and tcp.p50 == 0.25


def test_broken_documents_are_one_line(tmp_path: Path) -> None:
    p = tmp_path / "j.json"
    p.write_text('{"tool": "tools.job", "runs": [{"fabric": "srv6"}]}')
    with pytest.raises(PlotError, match=r"runs\[0\] is malformed"):
        read_job(str(p))
    p.write_text('{"tool": "tools.job", "runs": []}')
    with pytest.raises(PlotError, match="without runs"):
        read_job(str(p))
    p.write_text('{"tool": "tools.job", "runs": [')
    with pytest.raises(PlotError, match="not JSON"):
        read_job(str(p))
    assert not is_job_file(str(tmp_path / "missing.json"))


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = _doc(tmp_path)
    line = plot_file(str(path), str(tmp_path / "job.png"))
    assert line == f"wrote {tmp_path / 'job.png'} (job: 3 step-time panels)"
    assert (tmp_path / "job.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(PlotError, match="step-time panels only"):
        plot_file(str(path), str(tmp_path / "x.png"), "goodput")
