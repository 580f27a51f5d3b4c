"""compare.json's failover series (`tools.compare.analysis.series`): receiver byte logs in
10 ms bins on the clock of the run's `fault_at_s`, and `mrc plot` reading them back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrc.plot import load
from mrc.plot.series import failover
from tools.compare import analysis
from tools.compare.analysis import Window

PER_MS = 125_000  # bytes per ms at 1 Gbit/s


def ms_log(start: float, per_ms: list[int]) -> list[Window]:
    return [Window(start + i / 1000, start + (i + 1) / 1000, n) for i, n in enumerate(per_ms)]


def test_mptcp_like_1ms_bins_fold_into_10ms() -> None:
    """3 ms of nothing, then 1 Gbit/s for 50 ms, the fault at 10.053 s, 20 ms without a
    byte, then half the rate for 30 ms."""
    log = ms_log(10.0, [0] * 3 + [PER_MS] * 50 + [0] * 20 + [PER_MS // 2] * 30)
    s = analysis.series(log, 10.053)
    assert s["bin_seconds"] == 0.01 and s["t0"] == 0.0
    # the clock starts at the first byte (10.003 s), as failover()'s fault_at_s does
    assert s["fault_at_s"] == pytest.approx(0.05)
    assert analysis.failover(log, 10.053)["fault_at_s"] == pytest.approx(s["fault_at_s"])
    assert s["bps"] == [1_000_000_000] * 5 + [0, 0] + [500_000_000] * 3


def test_wide_and_zero_width_windows_spread_by_overlap() -> None:
    """mrc's receiver intervals: a late one 15 ms wide shares its bytes with the bins it
    covers; a zero-width one counts where it ends."""
    log = [Window(5.0, 5.01, 1_000_000), Window(5.01, 5.025, 1_500_000),
           Window(5.025, 5.025, 40_000), Window(5.025, 5.03, 500_000)]
    s = analysis.series(log, 5.02)
    assert s["fault_at_s"] == pytest.approx(0.02)
    # bin 1 = 10 ms of the 15 ms window (1 MB); bin 2 = its last 5 ms, the zero-width
    # window and the 5 ms one: 0.5 MB + 40 kB + 0.5 MB
    assert s["bps"] == [800_000_000, 800_000_000, 832_000_000]


def test_no_data() -> None:
    assert analysis.series(ms_log(1.0, [0, 0]), 1.0) == {"error": "no data in the log"}


def test_mrc_plot_draws_them_aligned(tmp_path: Path) -> None:
    mptcp = analysis.series(ms_log(0.0, [PER_MS] * 20 + [0] * 10 + [PER_MS] * 10), 0.02)
    mrc = analysis.series(ms_log(3.0, [PER_MS] * 30 + [PER_MS // 4] * 10), 3.03)
    doc = {"tool": "tools.compare", "version": 1,
           "failover": {"mptcp": {"series": mptcp}, "mrc": {"series": mrc}}}
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(doc))
    got = {a.transport: a for a in failover(load(str(path)))}
    assert got["mptcp"].t == pytest.approx((-0.02, -0.01, 0.0, 0.01))
    assert got["mptcp"].gbps == (1.0, 1.0, 0.0, 1.0)
    assert got["mrc"].t == pytest.approx((-0.03, -0.02, -0.01, 0.0))
    assert got["mrc"].gbps == (1.0, 1.0, 1.0, 0.25)
