"""tools/htsim (the htsim cross-check): reading htsim's output, the side-by-side table, and
one-line errors. The real 1,024-host run is `python -m tools.htsim`, not part of the tests."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tools.htsim.compare import Side, main, percentile, run_htsim, table

MATRIX = "Nodes 4\nConnections 3\n0->1 id 1 start 0 size 100\n1->2 id 2 start 0 size 100\n"
MATRIX += "2->0 id 3 start 0 size 100\n"
LOG = """Packet size (MTU) is 4150
Flow Uec_0_1 flowId 1 uecSrc 0 finished at 100.5 total messages 1
Flow Uec_1_2 flowId 2 uecSrc 1 finished at 120.25 total messages 1
Flow Uec_2_0 flowId 3 uecSrc 2 finished at 110 total messages 1
.EVENTS 1234 WALL 0.5 EPS 2468
Done
New: 30 Rtx: 2 RTS: 0 Bounced: 0 ACKs: 11 NACKs: 1 Pulls: 0 sleek_pkts: 0
"""


def fake_htsim(tmp_path: Path, body: str) -> Path:
    binary = tmp_path / "htsim_uec"
    binary.write_text(f"#!/bin/sh\ncat <<'EOF'\n{body}EOF\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([1.0, 2.0], 100) == 2.0


def test_reads_htsims_finished_lines_and_totals(tmp_path: Path) -> None:
    cm = tmp_path / "perm.cm"
    cm.write_text(MATRIX)
    side = run_htsim(fake_htsim(tmp_path, LOG), cm, tmp_path / "t.topo", 100, tmp_path / "h.log")
    assert (side.flows, side.finished) == (3, 3)
    assert (side.p50_us, side.p99_us, side.max_us) == (110.0, 120.25, 120.25)
    assert (side.events, side.data_packets) == (1234, 30)
    assert side.detail == {"retransmits": 2, "acks": 11, "nacks": 1}
    assert side.wall_seconds >= 0 and side.cpu_seconds >= 0


def test_table_puts_the_sides_together() -> None:
    a = Side("htsim", 3, 3, 100.0, 200.0, 210.0, 10.0, 9.0, 144.0, 5, 30)
    b = Side("mrc", 3, 3, 110.0, 220.0, 230.0, 50.0, 45.0, 400.0, 7, 31)
    text = table([a, b])
    assert "FCT p50 (µs)             100.0         110.0" in text.splitlines()
    assert "mrc/htsim p50: 1.100" in text and "mrc/htsim CPU: 5.00" in text


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--htsim-src", str(tmp_path), "--skip-mrc"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tools.htsim: ") and "not an htsim source tree" in err
    assert err.count("\n") == 1
    dc = tmp_path / "sim" / "datacenter"
    dc.mkdir(parents=True)
    (dc / "m.cm").write_text(MATRIX)
    failing = fake_htsim(tmp_path, "")
    failing.write_text("#!/bin/sh\nexit 3\n")
    code = main(["--htsim-src", str(tmp_path), "--htsim-bin", str(failing), "--matrix", "m.cm",
                 "--skip-mrc"])  # fmt: skip
    assert code == 1 and "htsim_uec exited with 3" in capsys.readouterr().err
    ok = fake_htsim(tmp_path, LOG)
    code = main(["--htsim-src", str(tmp_path), "--htsim-bin", str(ok), "--matrix", "m.cm",
                 "--skip-mrc", "-J"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["sides"][0]["p50_us"] == 110.0 and doc["notes"]
