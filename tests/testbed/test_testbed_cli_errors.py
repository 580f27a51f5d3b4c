"""Bad input to `python -m tools.testbed`: one line on stderr, a non-zero exit, no traceback,
and nothing changed (no namespace, no state file, the state file of a testbed untouched).

These run without root: a private state directory and namespace prefix isolate them, a state
file written by hand stands in for a testbed, and `MRC_TESTBED_EUID` simulates a normal user.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest
from testbed_support import namespaces, tb, unique

from tools.testbed import build, topology

NOT_ROOT = "testbed: needs root (network namespaces); run as root or with sudo"


@pytest.fixture
def sandbox(tmp_path: Path) -> dict[str, str]:
    state = tmp_path / "state"
    return {"MRC_TESTBED_STATE_DIR": str(state), "MRC_TESTBED_PREFIX": unique("mrcE") + "-"}


def _fake_testbed(sandbox: dict[str, str], name: str) -> Path:
    """A state file for a pair testbed that was never built (fault and exec read only it)."""
    topo = topology.load("pair")
    pre = sandbox["MRC_TESTBED_PREFIX"]
    data = {"name": name, "prefix": pre, "state": "up", "created": "-",
            "namespaces": {n: f"{pre}{name}-{n}" for n in topo.nodes},
            "topology": topo.to_dict(), "faults": {}, "flaps": {}}
    d = Path(sandbox["MRC_TESTBED_STATE_DIR"])
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def _ours(sandbox: dict[str, str]) -> list[str]:
    if shutil.which("ip") is None:
        return []
    return [ns for ns in namespaces() if ns.startswith(sandbox["MRC_TESTBED_PREFIX"])]


def _fails(sandbox: dict[str, str], *args: str, code: int | None = None,
           extra: dict[str, str] | None = None) -> str:
    proc = tb(*args, extra_env={**sandbox, **(extra or {})}, check=False)
    assert proc.returncode != 0, proc.stdout
    if code is not None:
        assert proc.returncode == code, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("testbed: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    return lines[0]


def _state_files(sandbox: dict[str, str]) -> list[str]:
    d = Path(sandbox["MRC_TESTBED_STATE_DIR"])
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_unknown_topology(sandbox: dict[str, str]) -> None:
    line = _fails(sandbox, "up", "ring", code=1)
    assert "unknown topology 'ring'" in line and "clos, pair" in line
    assert _state_files(sandbox) == [] and _ours(sandbox) == []


def test_malformed_toml(sandbox: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text('kind = "pair"\n[params\nplanes = 2\n')
    line = _fails(sandbox, "up", str(bad), code=1)
    assert "malformed TOML" in line and "broken.toml" in line
    assert _state_files(sandbox) == [] and _ours(sandbox) == []


def test_invalid_topology_value(sandbox: dict[str, str]) -> None:
    line = _fails(sandbox, "up", "clos", "--tier1", "40", code=1)
    assert "--tier1: 40 outside 1 … 26" in line
    assert _state_files(sandbox) == [] and _ours(sandbox) == []


def test_not_root(sandbox: dict[str, str]) -> None:
    line = _fails(sandbox, "up", "pair", code=2, extra={"MRC_TESTBED_EUID": "1000"})
    assert line == NOT_ROOT
    assert _state_files(sandbox) == [] and _ours(sandbox) == []
    for args in (("down", "--all"), ("exec", "--name", "x", "h1", "--", "true")):
        if args[0] == "exec":
            _fake_testbed(sandbox, "x")
        assert _fails(sandbox, *args, code=2, extra={"MRC_TESTBED_EUID": "1000"}) == NOT_ROOT


def test_unknown_link_and_node_change_nothing(sandbox: dict[str, str]) -> None:
    name = unique()
    path = _fake_testbed(sandbox, name)
    before = path.read_bytes()
    line = _fails(sandbox, "fault", "--name", name, "link-down", "h1-p9", code=1)
    assert f"unknown link 'h1-p9' in testbed {name}" in line
    _fails(sandbox, "fault", "--name", name, "loss", "h2:p7", "5", code=1)
    line = _fails(sandbox, "exec", "--name", name, "h9", "--", "true", code=1)
    assert "unknown node 'h9'" in line
    # a known link, but no root: refused before anything is run
    line = _fails(sandbox, "fault", "--name", name, "link-down", "h1-p0", code=2,
                  extra={"MRC_TESTBED_EUID": "1000"})
    assert line == NOT_ROOT
    assert path.read_bytes() == before


def test_missing_testbed(sandbox: dict[str, str]) -> None:
    assert "no testbed is up" in _fails(sandbox, "status", code=1)
    assert "no testbed named 'nosuch'" in _fails(sandbox, "paths", "nosuch", code=1)
    assert "bad testbed name" in _fails(sandbox, "up", "pair", "--name", "a-b", code=1)


def test_usage_errors_are_one_line(sandbox: dict[str, str]) -> None:
    assert "(see python -m tools.testbed up --help)" in _fails(sandbox, "up", code=2)
    _fails(sandbox, "fault", "explode", "h1-p0", code=2)
    _fails(sandbox, "down", "x", "--all", code=2)


@pytest.mark.skipif(os.geteuid() != 0, reason="checks a value only after the root check")
def test_bad_rate_and_loss(sandbox: dict[str, str]) -> None:
    name = unique()
    path = _fake_testbed(sandbox, name)
    before = path.read_bytes()
    assert "bad rate 'fast'" in _fails(sandbox, "fault", "--name", name, "rate", "h1-p0", "fast")
    assert "want a percentage" in _fails(sandbox, "fault", "--name", name, "loss", "h1-p0", "120")
    assert path.read_bytes() == before


def _save_many(state: str, name: str, n: int) -> None:
    os.environ["MRC_TESTBED_STATE_DIR"] = state
    for i in range(n):
        build.save_state({"name": name, "writer": os.getpid(), "i": i})


def test_two_processes_saving_one_state_file_both_succeed(tmp_path: Path) -> None:
    """Two `fault` commands run together on one testbed (one per link, as the all-gather
    example does) both write its state file; each must land whole, neither may fail."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), "tb", 300)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    doc = json.loads((tmp_path / "tb.json").read_text())
    assert doc["i"] == 299 and doc["writer"] in {p.pid for p in procs}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tb.json"]  # no temporary left
