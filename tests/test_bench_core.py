"""tools/bench_core: the core alone, two sessions back to back in one process."""

from __future__ import annotations

import json

import pytest

from tools import bench_core


def test_a_transfer_counts_every_packet_and_message_and_times_both_sides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench_core.main(["-l", "64K", "-n", "1M", "--imm", "--repeat", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["msg_size"] == 65536 and doc["bytes"] == 1 << 20 and doc["imm"] is True
    assert len(doc["runs"]) == 2 and doc["best"] in doc["runs"]
    for run in doc["runs"]:
        # 16 WRITEs of 16 packets of 4096 bytes, each acknowledged, nothing lost on the way.
        assert run["messages"] == 16 and run["immediates"] == 16
        assert run["data_packets_received"] == 256
        assert run["retransmits"] == 0
        # A flowcell of 64 KiB holds 15 packets: at least 2 transmits a WRITE (its LAST_IMM,
        # 4 bytes longer, starts one of its own).
        assert run["transmits"] >= 32
        assert run["sender_seconds"] > 0 and run["receiver_seconds"] > 0
        assert run["sender_us_per_packet"] == pytest.approx(
            run["sender_seconds"] / 256 * 1e6, rel=1e-3
        )


def test_a_short_last_write_of_a_byte_count_is_sent_as_such(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench_core.main(["-l", "3000", "-n", "10000", "--planes", "1", "--repeat", "1"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["messages"] == 4 and run["data_packets_received"] == 4 and run["immediates"] == 0


@pytest.mark.parametrize(
    "argv", [["-l", "2X"], ["-l", "1M", "-n", "4K"], ["--planes", "9"], ["--repeat", "0"]]
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_core.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_core: ") and err.count("\n") == 1


@pytest.mark.parametrize("security", ["auth", "encrypt"])
def test_a_secured_transfer_runs_through_the_cipher_on_both_sides(
    security: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["-l", "64K", "-n", "512K", "--planes", "2", "--repeat", "1", "--security", security]
    assert bench_core.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    (run,) = doc["runs"]
    assert doc["security"] == security and run["secured"] is True
    assert run["messages"] == 8 and run["data_packets_received"] == 128
    assert run["retransmits"] == 0
    assert run["sender_us_per_packet"] > 0 and run["receiver_us_per_packet"] > 0


@pytest.mark.parametrize("security", ["none", "encrypt"])
def test_latency_runs_one_write_each_way_per_round_trip_and_times_both_sides(
    security: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--latency", "--iterations", "50", "--repeat", "2", "--security", security]
    assert bench_core.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["latency"] is True and doc["msg_size"] == 64 and doc["iterations"] == 50
    assert len(doc["runs"]) == 2 and doc["best"] in doc["runs"]
    for run in doc["runs"]:
        assert run["round_trips"] == 50 and run["retransmits"] == 0
        assert run["secured"] is (security != "none")
        # One hop a side a round (bench_core.HOP): the echo comes back in the same round.
        assert run["virtual_seconds"] == pytest.approx(50 * bench_core.HOP)
        assert run["client_us_per_round_trip"] > 0 and run["server_us_per_round_trip"] > 0


@pytest.mark.parametrize("argv", [["--iterations", "0"], ["-l", "0"], ["--planes", "9"]])
def test_bad_latency_arguments_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_core.main(["--latency", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_core: ") and err.count("\n") == 1
