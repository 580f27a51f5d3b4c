"""Run the ring all-gather example on the clos netns testbed, with a tier-1 switch failing.

    sudo python -m tools.examples.allgather_testbed [--size 64M] [--name TESTBED] [-J]

Brings up `clos` (4 hosts in 2 racks, 4 planes, 2 tier-1 switches per plane; or uses the
testbed `--name`), writes one daemon configuration per host (its 4 plane addresses, the other
hosts as peers, the testbed's SRv6 path table, `security = "none"`: the example measures the
fabric, not the handshake), starts `mrc daemon` inside each host's namespace, then one
`tools.examples.allgather` rank per host. Once data flows it takes a tier-1 switch down (both
of its links) and lets the all-gather finish on the remaining paths. Every rank's JSON line is
collected; the run is `verified` when every rank checked every chunk. Daemons get SIGTERM,
faults are cleared and a testbed it brought up is taken down, whatever happened.

Holds the orchestration only; the example program is `allgather`, the testbed `tools.testbed`,
brought up and given a daemon per host as the training job does it (`tools.job.fabric`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mrc.client import Client, ClientError
from mrc.units import parse_size
from tools.job.fabric import ROOT, JobError, clos, env, processes

FAULT_SWITCH = "t1bp1"  # plane 1's second tier-1 switch
FAULT_LINKS = ("t0r1p1-t1bp1", "t0r2p1-t1bp1")


class HarnessError(Exception):
    """The run failed in a way the harness can name; one line."""


def _sent_bytes(clients: list[Client]) -> int:
    """Bytes the daemons have sent on all their planes (the ring's traffic and its overhead)."""
    return sum(int(p.get("bytes_sent") or 0) for c in clients for p in c.planes())


def _inject(name: str) -> None:
    """Both links of the tier-1 switch down at once (one `testbed fault` per link, together)."""
    procs = [subprocess.Popen([sys.executable, "-m", "tools.testbed", "fault", "--name", name,
                               "link-down", link], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env())
             for link in FAULT_LINKS]
    for link, proc in zip(FAULT_LINKS, procs, strict=True):
        _, err = proc.communicate(timeout=60)
        if proc.returncode:
            raise HarnessError(f"fault link-down {link}: {err.strip()}")


def run(name: str | None, size: int, piece: int, fault: bool, work: Path,
        timeout: float) -> dict[str, Any]:
    with clos(name, 0, work) as bed:
        if len(bed.hosts) < 2:
            raise HarnessError(f"testbed {bed.name} has {len(bed.hosts)} hosts with "
                               f"{bed.planes} planes")
        names = bed.hosts
        exits: dict[str, int | None] = {}
        with bed.daemons(names, exits=exits) as socks, processes() as ranks:
            for rank, host in enumerate(names):
                ranks.append(subprocess.Popen(
                    bed.in_ns(host, sys.executable, "-m", "tools.examples.allgather",
                              "--socket", str(socks[host]), "--rank", str(rank),
                              "--hosts", ",".join(names), "--size", str(size),
                              "--write", str(piece), "--timeout", str(timeout)),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env()))
            start = time.monotonic()
            fault_at = None
            mid_run = False
            sent: dict[str, int] = {}
            if fault:
                # Mid-run: once an eighth of the ring's data has left the hosts, so most of it
                # moves with the switch down (`sent` tells how much did).
                target = len(names) * (len(names) - 1) * size // 8
                with contextlib.ExitStack() as stack:
                    clients = [stack.enter_context(Client(str(socks[h]))) for h in names]
                    while _sent_bytes(clients) < target and time.monotonic() - start < timeout:
                        if all(r.poll() is not None for r in ranks):
                            break
                        time.sleep(0.02)
                    sent["at_fault"] = _sent_bytes(clients)
                    _inject(bed.name)
                    fault_at = round(time.monotonic() - start, 3)
                    mid_run = any(r.poll() is None for r in ranks)
                    sent["fault_done"] = _sent_bytes(clients)
            results = []
            for rank, proc in enumerate(ranks):
                try:
                    out, err = proc.communicate(timeout=timeout + 30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, err = proc.communicate()
                lines = out.decode(errors="replace").strip().splitlines()
                try:
                    results.append(json.loads(lines[-1]))
                except (IndexError, ValueError):
                    results.append({"rank": rank, "verified": False,
                                    "error": err.decode(errors="replace").strip()[-300:]
                                    or f"exited {proc.returncode} without a result"})
            daemon_status = []
            for host in names:
                with contextlib.suppress(ClientError), Client(str(socks[host])) as c:
                    daemon_status.append(c.status())
            sent["total"] = sum(int(p.get("bytes_sent") or 0) for d in daemon_status
                                for p in d.get("planes") or [])
        testbed_name = bed.name
    return {
        "testbed": testbed_name,
        "hosts": names,
        "size": size,
        "fault": {"switch": FAULT_SWITCH, "links": list(FAULT_LINKS), "at_seconds": fault_at,
                  "ranks_running": mid_run, "bytes_sent_at_fault": sent.get("at_fault"),
                  "bytes_sent_when_down": sent.get("fault_done")} if fault else None,
        "bytes_sent_total": sent.get("total"),
        "verified": all(r.get("verified") for r in results) and len(results) == len(names),
        "ranks": results,
        "daemon_exits": [exits.get(h) for h in names],
        "daemons": [{"host": s.get("host"), "planes": s.get("planes")} for s in daemon_status],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.examples.allgather_testbed",
                                description="The ring all-gather on the clos testbed, with a "
                                "tier-1 switch failing mid-run (root).")
    p.add_argument("--name", help="use this running clos testbed instead of bringing one up")
    p.add_argument("--size", type=parse_size, default=64 << 20, help="bytes per host (64M)")
    p.add_argument("--write", type=parse_size, default=1 << 20, help="bytes per WRITE (1M)")
    p.add_argument("--no-fault", action="store_true", help="run without the tier-1 failure")
    p.add_argument("--timeout", type=float, default=120.0, help="per rank (120 s)")
    p.add_argument("--work", help="directory for configs, sockets and logs (default: a temp dir)")
    p.add_argument("-J", "--json", action="store_true", help="one JSON document")
    ns = p.parse_args(argv)
    if os.geteuid() != 0:
        sys.stderr.write("allgather_testbed: needs root (network namespaces)\n")
        return 2
    with contextlib.ExitStack() as stack:
        work = Path(ns.work) if ns.work else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="mrc-allgather-")))
        work.mkdir(parents=True, exist_ok=True)
        try:
            doc = run(ns.name, ns.size, ns.write, not ns.no_fault, work, ns.timeout)
        except (HarnessError, JobError) as exc:
            sys.stderr.write(f"allgather_testbed: {exc}\n")
            return 1
    if ns.json:
        print(json.dumps(doc, indent=1))
    else:
        if doc["fault"]:
            print(f"fault: {FAULT_SWITCH} down at {doc['fault']['at_seconds']} s")
        for r in doc["ranks"]:
            state = "verified" if r.get("verified") else f"FAILED {r.get('error', '')}"
            rate = r.get("goodput_bps", 0) / 1e9
            print(f"rank {r['rank']} {r.get('host', '?')}: {state}"
                  + (f", {r['seconds']} s, {rate:.2f} Gbit/s written" if "seconds" in r else ""))
        print("all-gather: " + ("verified" if doc["verified"] else "NOT verified"))
    return 0 if doc["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
