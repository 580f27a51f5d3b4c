"""`mrc bench --flowcell` over 4 loopback planes, as real processes: an EV per packet (1) and
the bench's default (GSO batches of one EV), both with every byte verified; and the --verify
pattern check itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from benchproc import Server, client

from mrc.cli.bench.options import default_flowcell
from mrc.cli.bench.proto import Pattern


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server("-J")
    yield srv
    rc, _out, err = srv.stop()
    assert rc == 0, err
    assert "Traceback" not in err and "internal error" not in err, err


@pytest.mark.parametrize("flowcell", [None, 1], ids=["default", "per-packet"])
def test_flowcell_moves_verified_bytes(server: Server, flowcell: int | None) -> None:
    args = ["-J", "-n", "32M", "--verify", "-i", "0"]
    if flowcell is not None:
        args += ["--flowcell", str(flowcell)]
    proc = client(server.port, *args)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc["start"]["test_start"]["flowcell"] == (flowcell or default_flowcell())
    m = doc["end"]["mrc"]
    assert m["integrity"] == "ok" and m["messages_verified"] == 32
    assert doc["end"]["sum_received"]["bytes"] == 32 << 20
    # Every plane carried data (a plane its receiver serves last may queue on its own, and
    # NSCC's plane guard then gives some of its turns away), and GSO was never refused.
    assert all(row["bytes_sent"] > 2 << 20 for row in m["planes"]), m["planes"]
    assert not any("gso" in name for c in m["socket_counters"].values() for name in c)


def test_the_verify_pattern_matches_only_its_own_bytes() -> None:
    pattern = Pattern(seed=3, msg_size=1 << 16)
    good = bytearray(pattern.expected(5, 1 << 16))
    assert pattern.matches(memoryview(good), 5)
    assert pattern.matches(memoryview(good)[:100], 5)  # a short last message
    assert not pattern.matches(memoryview(good), 6)
    good[40000] ^= 1
    assert not pattern.matches(memoryview(good), 5)
