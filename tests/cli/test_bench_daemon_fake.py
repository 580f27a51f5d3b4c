"""`mrc bench --daemon` against the stand-in daemon of tests/client (both applications on the
one fake host, writing to its peer "self"): the request/ready/credit/end/results agreement,
--verify catching a corrupted message, and -J's keys. Real daemons: test_bench_daemon."""

from __future__ import annotations

import base64
import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))
from fake_daemon import FakeDaemon

from mrc.cli import main


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    d = FakeDaemon(str(tmp_path / "mrc.sock"))
    yield d
    d.close()


def run_pair(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str],
             *client_args: str) -> tuple[int, int, dict[str, Any], dict[str, Any]]:
    codes: dict[str, int] = {}
    server = threading.Thread(target=lambda: codes.setdefault(
        "server", main(["bench", "-s", "--daemon", daemon.path, "-1", "-J"])))
    server.start()
    deadline = time.monotonic() + 10
    while "bench" not in daemon.endpoints and time.monotonic() < deadline:
        time.sleep(0.01)  # the server has bound its endpoint
    try:
        codes["client"] = main(["bench", "-c", "self", "--daemon", daemon.path, "-J",
                                *client_args])
    finally:
        server.join(60)
    docs = [json.loads(part) for part in split_docs(capsys.readouterr().out)]
    by_role = {d["start"]["role"]: d for d in docs}
    return codes["server"], codes["client"], by_role["server"], by_role["client"]


def split_docs(text: str) -> list[str]:
    """The two -J documents, printed one after the other (indented JSON)."""
    docs, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
            if depth == 1:
                start = i
        elif ch == "}":
            depth -= 1
            if depth == 0:
                docs.append(text[start:i + 1])
    return docs


def test_verified_run_through_the_stand_in(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    s, c, server, client = run_pair(daemon, capsys, "-n", "160M", "-l", "1M", "--verify")
    assert (s, c) == (0, 0)
    for doc in (server, client):
        end = doc["end"]
        assert end["mrc"]["integrity"] == "ok"
        assert end["mrc"]["messages_verified"] == 160 and end["mrc"]["messages"] == 160
        assert end["sum_sent"]["bytes"] == end["sum_received"]["bytes"] == 160 << 20
    # 64 slots of 1 MiB for 160 messages: the writer waits for credit, which the server hands
    # back after every 16 or more checked messages.
    sent = [json.loads(base64.b64decode(p["data"])) for m, p in daemon.requests
            if m == "send_message"]
    checked = [m["checked"] for m in sent if m["op"] == "credit"]
    steps = [b - a for a, b in itertools.pairwise(checked)]
    assert checked and checked[0] >= 16 and min(steps, default=16) >= 16, checked
    assert checked[-1] <= 160, checked


def test_verify_catches_a_corrupted_message(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon.corrupt = 1
    s, c, server, client = run_pair(daemon, capsys, "-n", "8M", "-l", "1M", "--verify")
    assert (s, c) == (1, 1)
    for doc in (server, client):
        mrc = doc["end"]["mrc"]
        assert mrc["integrity"] == "mismatch" and mrc["messages_verified"] == 7


def test_plain_writes_count_without_verifying(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    s, c, _, client = run_pair(daemon, capsys, "-n", "1M", "-l", "4K")
    assert (s, c) == (0, 0)
    mrc = client["end"]["mrc"]
    assert mrc["integrity"] == "not-checked" and mrc["messages"] == 256
    assert mrc["writes_per_second"] > 0 and mrc["write_errors"] == {}
    # 256 writes went as write_many calls of at most 64.
    calls = [len(p["writes"]) for m, p in daemon.requests if m == "write"]
    assert sum(calls) == 256 and max(calls) == 64
