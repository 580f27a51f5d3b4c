"""The ring all-gather example (tools/examples) on `up clos`: a daemon per host in its
namespace, one rank per host writing 64 MiB around the ring through the daemons, a tier-1
switch (both of its links) taken down once an eighth of the data moved. Every rank must end
verified, byte for byte, and every daemon must stop cleanly on SIGTERM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testbed_support import ROOT, env, requires_root, skip_without_features, tb, unique

pytestmark = requires_root


def test_allgather_survives_a_tier1_failure(tmp_path: Path) -> None:
    skip_without_features()
    extra = {"MRC_TESTBED_STATE_DIR": str(tmp_path / "state"),
             "MRC_TESTBED_PREFIX": unique("ag") + "-"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tools.examples.allgather_testbed", "-J", "--size", "64M",
             "--work", str(tmp_path / "work")],
            capture_output=True, text=True, env=env(**extra), cwd=ROOT, timeout=400,
            check=False)
    finally:  # the prefix is ours alone: whatever a crash left behind goes too
        tb("down", "--all", extra_env=extra, check=False)
    assert proc.stdout.strip(), proc.stderr
    doc = json.loads(proc.stdout)
    ranks = doc["ranks"]
    detail = json.dumps(ranks)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], detail
    assert all(r["verified"] and r["bad_chunks"] == [] for r in ranks), detail
    assert all(r["bytes_written"] == 3 * (64 << 20) for r in ranks), detail
    assert doc["fault"]["links"] == ["t0r1p1-t1bp1", "t0r2p1-t1bp1"]
    # The switch went down mid-run: at least a quarter of the ring's bytes left the hosts after
    # both of its links were down (counted by the daemons' planes).
    ring = 4 * 3 * (64 << 20)
    fault = doc["fault"]
    after = doc["bytes_sent_total"] - fault["bytes_sent_when_down"]
    assert fault["ranks_running"] and after >= ring // 4, (fault, doc["bytes_sent_total"])
    assert doc["verified"] is True and proc.returncode == 0, proc.stderr
    assert doc["daemon_exits"] == [0, 0, 0, 0], proc.stderr
    # Each daemon's planes carried the ring's traffic: 3 chunks of 64 MiB out of every host.
    for d in doc["daemons"]:
        sent = sum(p["bytes_sent"] for p in d["planes"])
        assert sent >= 3 * (64 << 20), (d["host"], d["planes"])
