"""The MRC paper's experiments at 16 hosts × 4 planes (mrc.experiments.paper): MRC's outcomes,
the RoCE baseline's failures exactly where its single paths cross a fault, and the command line.

One module-scoped run of every experiment for both protocols (about 25 s on two busy cores);
each test reads its own experiment's numbers from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mrc.experiments import paper
from mrc.experiments.paper_experiments import REFERENCE
from mrc.experiments.paper_run import MiB, Scale, permutation
from mrc.experiments.paper_verdict import CLAIMS, Results, Verdict, verdict

SCALE = Scale(hosts=16, planes=4, tier1=4, hosts_per_rack=4, flow_bytes=2 * MiB)
FLOWS = permutation(SCALE)


@pytest.fixture(scope="module")
def runs() -> tuple[Results, dict[str, Verdict]]:
    results, verdicts = paper.run_all(list(CLAIMS), SCALE, jobs=1)
    return results, {v.experiment: v for v in verdicts}


def mrc(runs: tuple[Results, Any], name: str) -> dict[str, Any]:
    return runs[0][name]["mrc"]


def roce(runs: tuple[Results, Any], name: str) -> dict[str, Any]:
    return runs[0][name]["roce"]


def clean(m: dict[str, Any]) -> None:
    """Every flow done, none failed, every byte placed."""
    assert (m["completed"], m["failed"], m["bytes_lost"]) == (m["flows"], 0, 0)


def rack(host: int) -> int:
    return host // SCALE.hosts_per_rack


def roce_crossing(m: dict[str, Any], hit: Any) -> set[int]:
    """Flows with a RoCE QP whose one path (plane, tier-1 route) `hit(flow, plane, route)`."""
    return {
        i for i, routes in enumerate(m["routes"]) for plane, route in routes
        if hit(FLOWS[i], plane, route)
    }  # fmt: skip


def test_references_complete_for_both(runs: tuple[Results, Any]) -> None:
    clean(mrc(runs, REFERENCE))
    clean(roce(runs, REFERENCE))
    # RoCE's single ECMP paths collide and go-back-N repays every drop: its fault-free
    # permutation is already far below MRC's.
    assert roce(runs, REFERENCE)["aggregate_bps"] < mrc(runs, REFERENCE)["aggregate_bps"] / 2


def test_ev_loss_retires_the_ev_at_once_and_keeps_line_rate(runs: tuple[Results, Any]) -> None:
    m, r = mrc(runs, "ev_loss"), roce(runs, "ev_loss")
    clean(m)
    assert m["victim_drops"] >= 1 and m["victim_times_retired"] == 1
    # Retired on the first loss, within one RTO of it (not after repeated losses).
    assert 0 < m["retired_after"] <= SCALE.rto + SCALE.base_rtt
    assert m["line_share"] >= 0.85
    clean(r)
    assert r["line_share"] < 0.5 * m["line_share"]


def test_nic_down_costs_mrc_one_plane_and_kills_the_roce_qps_on_it(
    runs: tuple[Results, Any],
) -> None:
    m, r = mrc(runs, "nic_down"), roce(runs, "nic_down")
    clean(m)
    assert 0.6 <= runs[1]["nic_down"].mrc <= 0.9  # (P-1)/P = 0.75
    into0 = next(i for i, f in enumerate(FLOWS) if f.dst == 0)
    # RoCE: the QP of plane 0 from host 0 and the one into host 0 exhaust their retries.
    assert set(r["failed_flows"]) == {0, into0}
    assert r["bytes_lost"] > 0


def test_nic_flap_halves_the_flapping_host(runs: tuple[Results, Any]) -> None:
    m, r = mrc(runs, "nic_flap"), roce(runs, "nic_flap")
    clean(m)
    assert 0.35 <= runs[1]["nic_flap"].mrc <= 0.9
    into0 = next(i for i, f in enumerate(FLOWS) if f.dst == 0)
    assert set(r["failed_flows"]) <= {0, into0}
    assert runs[1]["nic_flap"].roce < runs[1]["nic_flap"].mrc


def test_t0t1_downs_lose_nothing_for_mrc_and_every_crossing_roce_qp(
    runs: tuple[Results, Any],
) -> None:
    m, r = mrc(runs, "t0t1_downs"), roce(runs, "t0t1_downs")
    clean(m)
    assert m["links_down"] == 8 and len(m["cables"]) == 8
    down = {tuple(c) for c in r["cables"]}
    crossing = roce_crossing(
        r, lambda f, p, k: (p, rack(f.src), k) in down or (p, rack(f.dst), k) in down
    )
    # Static single paths: exactly the flows with a QP through a dead cable fail.
    assert set(r["failed_flows"]) == crossing and crossing


def test_t0t1_flaps_lose_nothing_for_mrc(runs: tuple[Results, Any]) -> None:
    m, r = mrc(runs, "t0t1_flaps"), roce(runs, "t0t1_flaps")
    clean(m)
    assert m["links_flapping"] == 8
    flapping = {tuple(c) for c in r["cables"]}
    crossing = roce_crossing(
        r, lambda f, p, k: (p, rack(f.src), k) in flapping or (p, rack(f.dst), k) in flapping
    )
    assert set(r["failed_flows"]) <= crossing


def test_tier0_lost_takes_its_share_only(runs: tuple[Results, Any]) -> None:
    m, r = mrc(runs, "tier0_lost"), roce(runs, "tier0_lost")
    clean(m)
    v = runs[1]["tier0_lost"]
    assert 0.6 <= v.mrc <= 0.9  # (P-1)/P = 0.75 for flows from or into rack 0
    rack0 = {i for i, f in enumerate(FLOWS) if rack(f.src) == 0 or rack(f.dst) == 0}
    assert set(m["affected"]) == rack0
    # Flows elsewhere keep at least 85 % of their reference rate.
    ref = mrc(runs, REFERENCE)["steady_bps"]
    others = [i for i in range(len(FLOWS)) if i not in rack0]
    assert sum(m["unaffected_bps"]) >= 0.85 * sum(ref[i] for i in others)
    # RoCE: every flow from or into rack 0 has a plane-0 QP, and each of those dies.
    assert set(r["failed_flows"]) == rack0


def test_tier1_lost_loses_nothing(runs: tuple[Results, Any]) -> None:
    m, r = mrc(runs, "tier1_lost"), roce(runs, "tier1_lost")
    clean(m)
    assert m["retransmits"] > 0 and m["evs_retired"] > 0  # it did cost packets, not flows
    assert runs[1]["tier1_lost"].mrc >= 0.9 * m["capacity_left"]
    crossing = roce_crossing(r, lambda f, p, k: (p, k) == (0, 0))
    assert set(r["failed_flows"]) == crossing and crossing


def test_one_percent_loss_leaves_mrc_usable_and_roce_not(runs: tuple[Results, Any]) -> None:
    m, r = mrc(runs, "loss1"), roce(runs, "loss1")
    clean(m)
    assert m["line_share"] >= 0.25
    assert r["line_share"] < m["line_share"] / 3


def test_incast_victim_untouched_under_mrc_only(runs: tuple[Results, Any]) -> None:
    m, r = mrc(runs, "incast"), roce(runs, "incast")
    clean(m)
    clean(r)  # DCQCN slows the victim; nothing is lost for good
    assert m["incast_senders"] == 7 and m["flows"] == 8
    assert runs[1]["incast"].mrc >= 0.9
    assert runs[1]["incast"].roce < 0.75


def test_every_outcome_holds_at_this_scale(runs: tuple[Results, Any]) -> None:
    failing = {n: v.why for n, v in runs[1].items() if not v.holds}
    assert failing == {}


def test_a_failed_mrc_flow_fails_the_verdict(runs: tuple[Results, Any]) -> None:
    results: Results = {n: dict(r) for n, r in runs[0].items()}
    results["tier1_lost"]["mrc"] = dict(results["tier1_lost"]["mrc"], completed=15, failed=1)
    v = verdict("tier1_lost", results)
    assert not v.holds and v.mrc_done == "15/16"


def test_cli_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--hosts", "8", "--hosts-per-rack", "4", "--planes", "2", "--flow", "0.5",
            "--only", "ev_loss", "-j", "1", "-J", "--plot", str(tmp_path)]  # fmt: skip
    assert paper.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scale"]["hosts"] == 8 and doc["scale"]["tier1"] == 4
    (v,) = doc["verdicts"]
    assert v["experiment"] == "ev_loss" and v["mrc_done"] == "1/1"
    assert set(doc["runs"]["ev_loss"]) == {"mrc", "roce"}
    pytest.importorskip("matplotlib")
    assert (tmp_path / "ev_loss.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hosts", "15"], "do not fill racks"),
        (["--only", "nope"], "unknown experiment 'nope'"),
        (["--hosts", "4", "--hosts-per-rack", "4"], "at least two racks"),
        (["-j", "0"], "-j needs at least 1"),
        (["--planes", "300"], "at most 256 planes"),
        (["--flow", "0.001"], "at least one packet"),
        (["--json-file", "/nonexistent/dir/x.json"], "cannot write /nonexistent/dir/x.json"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert paper.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
