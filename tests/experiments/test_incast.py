"""Incast with a victim flow (mrc.experiments.incast): NSCC and trimming against the acceptance
of issue 6, and the `none` runs as the comparison they are.

Seven senders write 2 MiB each to one receiver whose two 100 Gbit/s host links are the
bottleneck; a victim flow crosses the same fabric to a neighbour of the receiver. Each run is
deterministic; the module runs each row once.
"""

from __future__ import annotations

import json

import pytest

from mrc.experiments import incast
from mrc.experiments.incast import IncastOutcome


@pytest.fixture(scope="module")
def alone() -> dict[str, float]:
    return {cc: incast.victim_alone(cc) for cc in ("nscc", "none")}


@pytest.fixture(scope="module")
def runs(alone: dict[str, float]) -> dict[str, IncastOutcome]:
    out = {}
    for cc, trim in incast.ROWS:
        o = incast.incast(cc, trim=trim, victim_alone_bps=alone[cc])
        out[o.row] = o
    return out


def test_the_victim_alone_runs_at_the_rate_of_its_two_planes(alone: dict[str, float]) -> None:
    assert alone["nscc"] >= 0.95 * 200e9
    assert alone["none"] >= 0.95 * 200e9


def test_nscc_with_trimming_fills_the_bottleneck_at_its_target_delay(
    runs: dict[str, IncastOutcome],
) -> None:
    o = runs["nscc+trim"]
    assert o.completed and o.intact
    assert o.bottleneck_bps == 200e9
    assert o.goodput_share >= 0.90
    # NSCC's target is 0.75 × the base RTT it measured (about 9.4 µs on this fabric).
    assert o.target == pytest.approx(0.75 * incast.BASE_RTT, rel=0.1)
    assert 0.5 * o.target <= o.queue_mean <= 1.5 * o.target
    # Congestion is answered by trims, never by losses: no EV was ever retired.
    assert o.trims > 0 and o.drops == 0
    assert set(o.retransmits) == {"nack_trimmed"}
    assert o.evs_retired == 0 and o.planes_down == 0
    assert o.victim_share >= 0.90


def test_nscc_without_trimming_loses_packets_but_keeps_its_planes(
    runs: dict[str, IncastOutcome],
) -> None:
    o = runs["nscc"]
    assert o.completed and o.intact
    assert o.trims == 0 and o.drops > 0
    assert o.goodput_share >= 0.80
    assert o.planes_down == 0


@pytest.mark.parametrize("row", ["none+trim", "none"])
def test_without_congestion_control_the_run_completes_and_reports_its_cost(
    runs: dict[str, IncastOutcome], row: str
) -> None:
    o = runs[row]
    assert o.completed and o.intact
    nscc = runs["nscc+trim" if o.trim else "nscc"]
    # The comparison row: every number is there, and the fixed window costs far more
    # retransmissions (trims or losses) than NSCC for the same bytes.
    assert sum(o.retransmits.values()) > 5 * sum(nscc.retransmits.values())
    assert (o.trims if o.trim else o.drops) > 0
    assert o.evs_retired >= 0 and o.planes_down >= 0 and o.victim_share > 0


def test_the_command_prints_one_row_per_run(
    runs: dict[str, IncastOutcome],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(incast, "victim_alone", lambda cc: 1.0)
    monkeypatch.setattr(
        incast, "incast", lambda cc, *, trim, **kw: runs[cc + ("+trim" if trim else "")]
    )
    assert incast.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:]] == ["nscc+trim", "nscc", "none+trim", "none"]
    assert incast.main(["-J"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["row"] for r in doc["results"]] == ["nscc+trim", "nscc", "none+trim", "none"]
