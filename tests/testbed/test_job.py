"""tools.job on `up clos`: a short training job over MRC (a daemon and a rank per host, a
1 MiB all-reduce then 50 ms of compute per step), fault-free and with every plane's tier-0 to
tier-1 link flapping every second. No step may fail and every result must verify; the flaps
must have been played while the job ran. The testbed goes down whatever happens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testbed_support import ROOT, env, requires_root, skip_without_features, tb, unique

pytestmark = requires_root


def test_mrc_job_loses_no_step_under_flaps(tmp_path: Path) -> None:
    skip_without_features()
    extra = {"MRC_TESTBED_STATE_DIR": str(tmp_path / "state"),
             "MRC_TESTBED_PREFIX": unique("jb") + "-"}
    out = tmp_path / "job.json"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tools.job", "--fabric", "srv6", "--transport", "mrc",
             "--schedule", "none,flap", "--size", "1M", "--steps", "8", "--compute", "0.05",
             "--fault-start", "1", "--duration", "3", "--grace", "10", "-q",
             "--work", str(tmp_path / "work"), "-o", str(out)],
            capture_output=True, text=True, env=env(**extra), cwd=ROOT, timeout=100,
            check=False)
    finally:  # the prefix is ours alone: whatever a crash left behind goes too
        tb("down", "--all", extra_env=extra, check=False)
    assert out.exists(), proc.stderr
    doc = json.loads(out.read_text())
    runs = {r["schedule"]: r for r in doc["runs"]}
    assert set(runs) == {"none", "flap"}, proc.stderr
    for name, run in runs.items():
        s = run["summary"]
        detail = (name, s, [st["errors"] for st in run["steps"] if st["errors"]])
        assert s["steps"] >= 8 and s["failed"] == 0, detail
        assert s["verified"] == s["steps"], detail
        assert all(r["exit"] == 0 for r in run["ranks"]), run["ranks"]
    flap = runs["flap"]
    played = [e for e in flap["faults"] if "started" in e]
    assert len(played) == len(flap["plan"]["events"]) >= 8, flap["faults"]
    assert not [e for e in flap["faults"] if "error" in e], flap["faults"]
    # the flaps happened while the job ran: steps before the first and after the last
    steps = flap["steps"]
    assert steps[0]["start"] < played[0]["started"] < played[-1]["done"] < steps[-1]["end"]
    assert doc["mrc_lost_nothing"] is True and proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert ["srv6", "flap", "mrc"] in [r[:3] for r in rows], proc.stdout
