"""The hostile harness's `local` family (tools/hostile/local.py): hostile clients of a real
daemon's control socket, as uid 65534 against a victim of uid 65533 (root, to fork clients of
other uids).

The whole family must pass against the daemon as it is; the same cases with the attacker run
as root (an admin uid, who sees every client's rows and is held to no per-uid quota) must
report the victim's region and connection as leaked and fail, which shows the harness sees a
leak when the daemon shows one client's regions to another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from benchproc import ROOT, env

from tools.hostile.local import CASES, LIMITS

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: control clients of other uids"
)


def hostile_local(*args: str, timeout: float = 60) -> tuple[int, dict[str, Any], str]:
    """Run the family; past `timeout` the harness gets SIGTERM (it stops its daemon and
    reports), then SIGKILL (its daemon dies with it), and the test fails."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.hostile", "-J", "--family", "local", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"the harness took more than {timeout} s: {err[-2000:]}") from None
    try:
        fig = json.loads(out)
    except ValueError:
        raise AssertionError(f"no JSON (exit {proc.returncode}): {err[-2000:]}") from None
    return proc.returncode, fig, err


def test_every_local_case_passes_against_the_daemon() -> None:
    rc, fig, err = hostile_local()
    local = fig["local"]
    failed = {n: (c.get("problems"), c.get("leaks")) for n, c in local["cases"].items()
              if not c["ok"]}  # fmt: skip
    assert rc == 0 and not failed and local["crashes"] == [], (failed, local["crashes"], err)
    assert fig["family"] == "local" and "datagrams" not in fig  # no network run
    assert list(local["cases"]) == list(CASES) and local["leaks"] == 0
    assert local["daemon"]["exit"] == 0 and local["seconds"] < 30
    cases = local["cases"]
    for name, case in cases.items():
        assert case["survived"] and case["clear"] and not case["leaked"], name
        assert not case["traceback"] and case["daemon_log"] == [], name
    # Each attack drew its refusal (or its counted drop), not just any answer.
    cap = LIMITS["max_clients_per_uid"]
    assert cases["client_flood"]["counted"]["refused_clients_uid"] == 100 - cap
    assert cases["client_flood"]["errors_drawn"] == {"resource_limit": 100 - cap}
    assert cases["stranger_uid"]["errors_drawn"] == {"permission_denied": 20}
    assert cases["foreign_objects"]["errors_drawn"]["unknown_region"] >= 3
    assert cases["foreign_objects"]["errors_drawn"]["unknown_connection"] >= 5
    assert cases["view_connections"]["errors_drawn"] == {"unknown_connection": 1}
    assert cases["region_quota"]["errors_drawn"] == {"resource_limit": 4}
    assert cases["nested_json"]["errors_drawn"]["parse_error"] >= 3
    assert "internal_error" not in cases["nested_json"]["errors_drawn"]
    assert cases["oversized_line"]["counted"]["oversized_lines"] >= 2
    assert cases["bad_fds"]["counted"]["refused_fds"] >= 50
    assert cases["bad_memfds"]["errors_drawn"]["bad_memory"] == 9
    assert cases["slow_reader"]["counted"]["paused_clients"] >= 1
    assert cases["sparse_memfd"]["measured"]["daemon_growth_mib"] < 32
    assert cases["subscriptions"]["errors_drawn"] == {"invalid_params": 8}


def test_an_attacker_the_daemon_counts_as_admin_is_reported_as_a_leak() -> None:
    rc, fig, err = hostile_local(
        "--hostile-uid", "0", "--cases", "view_regions,view_connections,client_flood"
    )
    local = fig["local"]
    assert rc == 1, err
    assert local["failed"] == ["view_regions", "view_connections", "client_flood"]
    leaks = local["cases"]["view_regions"]["leaks"]
    assert any('"victim-secret"' in leak for leak in leaks), leaks
    assert local["cases"]["view_connections"]["leaked"]
    # Root is held to no per-uid quota: all 100 of its connections are served.
    assert local["cases"]["client_flood"]["counted"]["refused_clients_uid"] == 0
    # The daemon itself was fine throughout.
    assert local["crashes"] == [] and all(c["survived"] for c in local["cases"].values())


def test_an_unknown_case_is_one_line_and_status_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.hostile", "--family", "local", "--cases", "nope"],
        capture_output=True, text=True, timeout=30, env=env(), cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "unknown local case(s) nope" in proc.stderr
