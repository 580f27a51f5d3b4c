"""tools.compare without a testbed: failover arithmetic, the MPTCP receiver's log, sizes,
the report, and the root check."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from tools.compare import analysis, cli, mptcp, report
from tools.compare.analysis import Window

RATE = 1e9  # bits/s of the synthetic transfers
PER_MS = int(RATE / 8 / 1000)


def series(seconds: float, fault: float, stall: float, after: float) -> list[Window]:
    """1 ms windows from t=10 s: RATE until the fault, nothing for `stall`, then `after`×RATE."""
    out = []
    for i in range(int(seconds * 1000)):
        t = i / 1000
        if t < fault:
            n = PER_MS
        elif t < fault + stall:
            n = 0
        else:
            n = int(PER_MS * after)
        out.append(Window(10 + t, 10 + t + 0.001, n))
    return out


def test_steady_transfer_has_no_gap_and_no_loss() -> None:
    m = analysis.failover(series(6, 2.0, 0.0, 1.0), 12.0)
    assert m["pre_bps"] == pytest.approx(RATE, rel=0.01)
    assert m["longest_gap_s"] == 0.0
    assert m["to_half_s"] == 0.0
    assert m["lost_in_first_s"] == pytest.approx(0.0, abs=0.01)
    assert m["post_vs_3_of_4"] == pytest.approx(4 / 3, rel=0.01)


def test_stall_then_three_planes() -> None:
    m = analysis.failover(series(6, 2.0, 0.2, 0.75), 12.0)
    assert m["longest_gap_s"] == pytest.approx(0.2, abs=0.0015)
    assert m["longest_gap_at_s"] == pytest.approx(0.0, abs=0.0015)
    assert m["fault_gap_s"] == pytest.approx(0.2, abs=0.0015)
    assert m["pre_gap_s"] == 0.0
    assert m["to_half_s"] == pytest.approx(0.2, abs=0.011)
    assert m["lost_in_first_s"] == pytest.approx(0.2 + 0.8 * 0.25, abs=0.01)
    assert m["post_vs_3_of_4"] == pytest.approx(1.0, rel=0.01)


def test_trickle_between_stalls_is_not_recovery() -> None:
    w = series(6, 2.0, 1.0, 1.0)
    for k in (200, 400, 600, 800):  # one busy millisecond every 200 ms during the stall
        i = 2000 + k
        w[i] = Window(w[i].start, w[i].end, PER_MS)
    m = analysis.failover(w, 12.0)
    assert m["to_half_s"] == pytest.approx(1.0, abs=0.011)
    assert m["longest_gap_s"] == pytest.approx(0.2, abs=0.002)


def test_exact_gaps_override_the_bins() -> None:
    w = series(6, 2.0, 0.0, 1.0)
    gaps = [[1.0, 0.05], [2.1, 0.25], [3.5, 0.01]]  # [start after the first byte, length]
    m = analysis.failover(w, 12.0, exact=gaps, first=10.0)
    assert m["longest_gap_s"] == 0.25
    assert m["longest_gap_at_s"] == pytest.approx(0.1)
    assert m["fault_gap_s"] == 0.25
    assert m["pre_gap_s"] == 0.05


def test_sampler_windows_and_plane_shares() -> None:
    doc = {"t": [0.0, 0.001, 0.002, 0.003], "ifaces": ["p0", "p1"],
           "rx": [[0, 10, 20, 20], [0, 5, 5, 15]]}
    total, per_iface = analysis.sampler_windows(doc)
    assert [w.bytes for w in total] == [15, 10, 10]
    assert analysis.plane_shares(per_iface, 0.0, 0.003) == [20, 15]
    assert analysis.first_data(total, 12) == 0.001


def test_mptcp_receiver_summary() -> None:
    times = array("d", [5.0, 5.0005, 5.0015, 5.2, 5.2001])
    sizes = array("q", [100, 100, 100, 100, 100])
    s = mptcp.summarize(times, sizes)
    assert s["bytes"] == 500
    assert s["bins_ms"][0] == 200 and s["bins_ms"][1] == 100 and s["bins_ms"][200] == 200
    assert s["gaps"] == [[pytest.approx(0.0015), pytest.approx(0.1985)]]


@pytest.mark.parametrize(("text", "value"), [("8G", 8 << 30), ("512M", 512 << 20),
                                             ("2GB", 2 * 10**9), ("4GiB", 4 << 30),
                                             ("1000", 1000)])
def test_parse_size(text: str, value: int) -> None:
    assert cli.parse_size(text) == value


def test_report_text_and_goals() -> None:
    doc: dict[str, Any] = {
        "params": {"fault": "link-down", "fail_plane": 0, "fault_after": 2.0,
                   "failover_seconds": 6.0},
        "throughput": {
            "iperf3": {"goodput_bps": 10e9, "bytes": 8 << 30, "seconds": 6.9,
                       "cpu_s_per_gb": 0.5, "retransmits": 3},
            "aioquic": {"error": "aioquic client: boom"},
            "mrc": {"goodput_bps": 4e9, "bytes": 8 << 30, "seconds": 17.0, "cpu_s_per_gb": 2.0,
                    "integrity": "ok", "retransmits": 0},
            "mrc_auth": {"goodput_bps": 3.4e9, "bytes": 8 << 30, "seconds": 20.0,
                         "cpu_s_per_gb": 2.4, "integrity": "ok", "retransmits": 0},
            "mrc_encrypt": {"goodput_bps": 2.6e9, "bytes": 8 << 30, "seconds": 26.0,
                            "cpu_s_per_gb": 3.1, "integrity": "ok", "retransmits": 2},
        },
        "failover": {"mrc": {"pre_bps": 4e9, "longest_gap_s": 0.004, "longest_gap_at_s": None,
                             "fault_gap_s": 0.004, "pre_gap_s": 0.002, "to_half_s": 0.0,
                             "lost_in_first_s": 0.01, "post_bps": 3.9e9,
                             "post_vs_3_of_4": 1.3, "fault": "link-down",
                             "runs_within_10ms": 10,
                             "runs": [{"longest_gap_s": 0.004, "integrity": "ok"}] * 10},
                     "mptcp": {"error": "mptcp client: exit status 1: x"}},
    }
    doc["ratios"] = report.ratios(doc["throughput"])
    doc["goals"] = report.goals(doc)
    assert doc["ratios"]["mrc/iperf3"] == pytest.approx(0.4)
    assert doc["ratios"]["mrc/aioquic"] is None
    met = {g["goal"]: g["met"] for g in doc["goals"]}
    assert met["mrc goodput >= 0.30 x iperf3"] is True
    assert met["mrc goodput >= 0.4 x iperf3"] is True
    assert met["mrc goodput >= 30 x aioquic"] is None  # aioquic failed
    assert met["mrc CPU s/GB <= 1.5 x raw-UDP ceiling's"] is None  # no raw-UDP run
    assert met["mrc failover (link-down): longest gap <= 10 ms in 10 of 10 runs"] is True
    assert met["mrc failover (blackhole): longest gap <= 10 ms in 10 of 10 runs"] is None
    assert met["mrc encrypt goodput >= 20 x aioquic"] is None
    assert doc["ratios"]["mrc_encrypt/mrc"] == pytest.approx(0.65)
    assert doc["ratios"]["mrc_auth/mrc"] == pytest.approx(0.85)
    assert met["mrc encrypt goodput >= 0.5 x mrc none"] is True
    assert met["mrc auth goodput >= 0.55 x mrc none"] is True
    # CPU s/GB: encrypt 3.1 / 2.0, auth 2.4 / 2.0.
    assert doc["ratios"]["cpu mrc_encrypt/mrc"] == pytest.approx(1.55)
    assert doc["ratios"]["cpu mrc_auth/mrc"] == pytest.approx(1.2)
    assert met["mrc encrypt CPU s/GB <= 2 x mrc none's"] is True
    assert met["mrc auth CPU s/GB <= 2 x mrc none's"] is True
    text = report.text(doc)
    (enc_row,) = [ln for ln in text.splitlines() if ln.startswith("mrc --verify --security encr")]
    assert "2.60 Gbit/s" in enc_row and "0.650" in enc_row and "integrity ok" in enc_row
    assert "FAILED: aioquic client: boom" in text
    assert "4.00 Gbit/s" in text


def test_rounds_row_is_the_median_round_and_ratios_are_the_medians_of_each_rounds() -> None:
    def run(gbps: float, cpu: float) -> dict[str, Any]:
        return {"goodput_bps": gbps * 1e9, "bytes": 1 << 30, "seconds": 1.0,
                "cpu_s_per_gb": cpu, "integrity": "ok", "retransmits": 0}

    # Round 2 ran on a slow host minute: every row of it is slow, so its ratios hold.
    plain = [run(12.0, 1.5), run(6.0, 3.0), run(14.0, 1.4)]
    auth = [run(6.0, 2.7), run(3.0, 6.0), run(8.4, 2.1)]
    enc = [run(5.4, 3.0), {"error": "mrc bench: boom"}, run(7.0, 2.8)]
    tp = {"mrc": report.median_round(plain), "mrc_auth": report.median_round(auth),
          "mrc_encrypt": report.median_round(enc)}
    assert tp["mrc"]["goodput_bps"] == 12e9 and tp["mrc_auth"]["goodput_bps"] == 6e9
    assert tp["mrc_encrypt"]["goodput_bps"] == 5.4e9  # the lower of the two that ran
    assert [r.get("goodput_bps") for r in tp["mrc_encrypt"]["rounds"]] == [5.4e9, None, 7e9]
    assert tp["mrc_encrypt"]["rounds"][1] == {"error": "mrc bench: boom"}
    ratios = report.ratios(tp)
    # auth/none per round 0.5, 0.5, 0.6; the ratio of the median rows would say 0.5 too, but
    # encrypt's would say 5.4/12 = 0.45 where its rounds say 0.45 and 0.5 (median 0.475).
    assert ratios["mrc_auth/mrc"] == pytest.approx(0.5)
    assert ratios["mrc_encrypt/mrc"] == pytest.approx(0.475)
    assert ratios["cpu mrc_auth/mrc"] == pytest.approx(1.8)  # 1.8, 2.0, 1.5
    assert ratios["cpu mrc_encrypt/mrc"] == pytest.approx(2.0)  # 3.0 / 1.5, 2.8 / 1.4
    text = report.text({"throughput": tp, "ratios": ratios})
    (enc_row,) = [ln for ln in text.splitlines() if ln.startswith("mrc --verify --security encr")]
    assert "median of 2 of 3 rounds, 5.40 Gbit/s to 7.00 Gbit/s" in enc_row
    assert "0.475" in enc_row


def test_not_root_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    assert cli.main(["-o", "/nonexistent/x.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0]


def test_failover_runs_listed_and_judged_per_kind_of_fault() -> None:
    """Ten link-down runs all within 10 ms, ten blackhole runs with one at 12.5 ms and one
    failed: each kind gets its own goal row and a line with every run's gap, and where a gap
    over 10 ms began (s after the fault)."""
    blackhole = [{"longest_gap_s": 0.003, "longest_gap_at_s": 0.002, "integrity": "ok"}] * 8 + [
        {"longest_gap_s": 0.0125, "longest_gap_at_s": 0.731, "integrity": "ok"},
        {"error": "mrc client: exit status 1"},
    ]
    doc: dict[str, Any] = {
        "params": {"fault": ["link-down", "blackhole"], "fail_plane": 0, "fault_after": 1.0,
                   "failover_seconds": 3.0},
        "failover": {
            "mrc": {"fault": "link-down", "longest_gap_s": 0.002, "runs_within_10ms": 10,
                    "runs": [{"longest_gap_s": 0.002, "integrity": "ok"}] * 10},
            "mrc-blackhole": {"fault": "blackhole", "longest_gap_s": 0.003,
                              "runs_within_10ms": 8, "runs": blackhole},
        },
    }
    doc["goals"] = report.goals(doc)
    got = {g["goal"]: (g["value"], g["met"]) for g in doc["goals"]}
    assert got["mrc failover (link-down): longest gap <= 10 ms in 10 of 10 runs"] == (10, True)
    assert got["mrc failover (blackhole): longest gap <= 10 ms in 10 of 10 runs"] == (8, False)
    text = report.text(doc)
    assert ("  mrc blackhole, 10 runs, longest gap (ms): 3.0 3.0 3.0 3.0 3.0 3.0 3.0 3.0 "
            "12.5@+0.731s FAILED; <= 10 ms in 8 of 10") in text.splitlines()
    assert "[NOT met] mrc failover (blackhole): longest gap <= 10 ms in 10 of 10 runs: 8" in text
    assert "failover: link-down, blackhole of plane 0 1.0 s into a 3.0 s transfer" in text


def test_fault_kinds_parse_and_key() -> None:
    assert cli.parser().parse_args([]).fault == ["link-down", "blackhole"]
    assert cli.parser().parse_args(["--fault", "blackhole"]).fault == ["blackhole"]
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--fault", "blackhole,blackhole"])
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--fault", "unplug"])
    assert cli.fault_key("mrc", "blackhole", ["link-down", "blackhole"]) == "mrc-blackhole"
    assert cli.fault_key("mrc", "blackhole", ["blackhole"]) == "mrc"


def test_failover_goal_needs_every_run_and_ten_of_them() -> None:
    """15 of 25 runs within 10 ms is not "10 of 10"; 4 of 4 is too few to say; a blackhole
    case alone leaves the link-down goal unjudged."""
    def doc(within: int, n: int) -> dict[str, Any]:
        runs = [{"longest_gap_s": 0.005, "integrity": "ok"}] * n
        return {"failover": {"mrc": {"fault": "blackhole", "runs_within_10ms": within,
                                     "runs": runs}}}

    def met(d: dict[str, Any]) -> tuple[Any, Any]:
        got = {g["goal"]: (g["value"], g["met"]) for g in report.goals(d)}
        assert got["mrc failover (link-down): longest gap <= 10 ms in 10 of 10 runs"] == (
            None, None)
        return got["mrc failover (blackhole): longest gap <= 10 ms in 10 of 10 runs"]

    assert met(doc(15, 25)) == (15, False)
    assert met(doc(4, 4)) == (4, False)
    assert met(doc(10, 10)) == (10, True)
    assert met(doc(25, 25)) == (25, True)
