"""`mrc ctl`: tables and -J from a daemon's control socket (the stand-in of tests/client), and
one line with exit status 1 when there is no daemon to ask."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))
from fake_daemon import FakeDaemon

from mrc.cli import main
from mrc.cli.ctl import format_table


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    d = FakeDaemon(str(tmp_path / "mrc.sock"))
    yield d
    d.close()


def test_status_json_is_the_daemons_answer(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ctl", "--socket", daemon.path, "-J", "status"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["host"] == "fake"
    assert doc["planes"] == [{"plane": 0, "local": "127.0.0.1", "state": "UP", "bytes_sent": 10,
                              "bytes_received": 20, "packets_sent": 1, "packets_received": 2}]


def test_status_and_views_as_tables(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MRC_SOCKET", daemon.path)
    assert main(["ctl", "status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "host:        fake" in out and "connections: 0" in out
    assert out[-2].split() == ["plane", "local", "state", "bytes_sent", "bytes_received",
                               "packets_sent", "packets_received"]
    assert out[-1].split() == ["0", "127.0.0.1", "UP", "10", "20", "1", "2"]
    assert main(["ctl", "connections"]) == 0
    assert capsys.readouterr().out == "(none)\n"
    assert main(["ctl", "evs", "--connection", "7"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["7", "0x00000001", "0", "GOOD"]
    assert ("evs", {"connection": 7}) in daemon.requests


def test_no_daemon_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ctl", "--socket", str(tmp_path / "none.sock"), "status"]) == 1
    err = capsys.readouterr().err
    assert err == f"mrc ctl: no mrc daemon socket at {tmp_path}/none.sock\n"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "dead.sock"))
    dead.close()
    assert main(["ctl", "--socket", str(tmp_path / "dead.sock"), "-J", "peers"]) == 1
    assert capsys.readouterr().err.endswith("connection refused (is the mrc daemon running?)\n")


def test_unknown_view_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ctl", "bogus"]) == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err
    assert main(["ctl", "--connection", "3", "peers"]) == 2
    assert capsys.readouterr().err == "mrc ctl: error: --connection only applies to evs\n"


def test_table_aligns_numbers_right_and_text_left() -> None:
    rows = [{"peer": "a", "bytes": 5}, {"peer": "bbb", "bytes": 12345, "extra": [1]}]
    assert format_table(rows).splitlines() == [
        "peer  bytes  extra",
        "a         5  -",
        "bbb   12345  [1]",
    ]
