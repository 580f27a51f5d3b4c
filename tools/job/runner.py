"""Running the job: one run (a transport under a fault schedule) and the whole matrix.

`run_one` starts a rank per host inside its namespace (`python -m tools.job.rank`; for mrc a
daemon per host first, `Bed.daemons`), waits until every rank has opened its communicator and
run a warm-up all-reduce, hands them all the same start time T0, plays the schedule
(`inject.Injector`) and collects every rank's step lines until they stop. Around the run it
reads how many bytes each tier-1 switch forwarded (so the JSON shows which switches the run's
traffic crossed: TCP must meet the faulted ones) and, for TCP and MPTCP, how many connections
(MPTCP: subflows) each host held on each plane a moment into the run. After it every fault is
cleared, whatever happened.

`run_matrix` does that for every fabric (SRv6 clos, `--ecmp 1` clos), transport and schedule,
the fault-free run of each transport first: its p50 and p99 are the baseline the other runs of
that transport are measured against (`stats.summarize`).

What it leaves to others: the rank's loop (`rank`), the testbed and daemons (`fabric`), the
schedules (`schedule`), the figures (`stats`), the command line (`cli`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import stats
from .fabric import ROOT, Bed, JobError, clos, env, processes
from .inject import Injector
from .rank import PORT_GENERATIONS
from .schedule import Schedule, build

TRANSPORTS = ("mrc", "tcp", "mptcp")
FABRICS = {"srv6": 0, "ecmp": 1}
#: seconds between the last rank's ready line and T0 (time to hand every rank its `go`)
START_MARGIN = 0.5


@dataclass(frozen=True)
class JobConfig:
    """What every run of the job does (the command line's options)."""

    hosts: int = 4
    size: int = 4 << 20
    steps: int = 20
    compute: float = 0.1
    timeout: float = 5.0
    restart: float = 6.0
    open_timeout: float = 60.0
    fault_start: float = 2.0
    duration: float = 10.0
    tail: float = 1.0
    grace: float = 30.0
    period: float = 1.0
    down: float = 0.5
    reboots: int = 4
    hold: float = 2.0
    gap: float = 0.5
    link: str = "h2-p0"
    port: int = 29500

    def schedule(self, name: str, bed: Bed) -> Schedule:
        return build(name, bed.fabric, self.fault_start, self.duration, period=self.period,
                     down=self.down, reboots=self.reboots, hold=self.hold, gap=self.gap,
                     link=self.link)

    def until(self, bed: Bed, schedules: list[str]) -> float:
        """How long every run lasts at least: the longest of `schedules` played out, plus the
        tail (the fault-free run too, so the baseline covers as long a time)."""
        spans = [self.schedule(n, bed).span for n in schedules]
        return round(max(spans, default=0.0) + self.tail, 6)


class Collector:
    """Reads one rank's stdout lines in a thread: its ready line, its steps, its end."""

    def __init__(self, rank: int, proc: subprocess.Popen[str], err: Path) -> None:
        self.rank = rank
        self.proc = proc
        self.err = err  # the rank's stderr, a file: nothing to drain while it runs
        self.ready = threading.Event()
        self.steps: list[dict[str, Any]] = []
        self.done: dict[str, Any] | None = None
        self.junk = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                self.junk += 1
                continue
            if not isinstance(doc, dict):
                self.junk += 1
            elif "ready" in doc:
                self.ready.set()
            elif "step" in doc:
                self.steps.append(doc)
            elif "done" in doc:
                self.done = doc

    def stderr_tail(self) -> str:
        try:
            err = self.err.read_text(errors="replace")
        except OSError:
            err = ""
        return " | ".join(err.strip().splitlines()[-3:])[-400:]


def _rank_argv(bed: Bed, transport: str, rank: int, hosts: list[str], cfg: JobConfig,
               until: float, socks: dict[str, Path], tag: str) -> list[str]:
    argv = [sys.executable, "-m", "tools.job.rank", "--transport", transport, "--rank",
            str(rank), "--world", str(len(hosts)), "--size", str(cfg.size), "--steps",
            str(cfg.steps), "--until", str(until), "--deadline", str(until + cfg.grace),
            "--compute", str(cfg.compute), "--timeout", str(cfg.timeout), "--restart",
            str(cfg.restart), "--open-timeout", str(cfg.open_timeout)]
    if transport == "mrc":
        argv += ["--socket", str(socks[hosts[rank]]), "--peers", ",".join(hosts), "--tag", tag]
    else:  # one path: every rank listens on its plane-0 address
        argv += ["--addresses", ",".join(bed.addresses[h][0] for h in hosts),
                 "--port", str(cfg.port)]
    return bed.in_ns(hosts[rank], *argv)


def run_one(bed: Bed, transport: str, schedule: Schedule, cfg: JobConfig, until: float,
            log: Callable[[str], None]) -> dict[str, Any]:
    """One run: `transport` through `schedule` on `bed`, lasting at least `until` seconds and
    `cfg.steps` steps; the run's JSON (no summary yet)."""
    hosts = bed.hosts[:cfg.hosts]
    tag = secrets.token_hex(2)
    doc: dict[str, Any] = {"fabric": bed.kind, "testbed": bed.name, "transport": transport,
                           "schedule": schedule.name, "plan": schedule.to_json(),
                           "hosts": hosts, "until": until, "deadline": until + cfg.grace}
    if transport == "tcp":
        doc["path"] = "one: every connection between plane-0 addresses (plane 0's fabric)"
    elif transport == "mptcp":
        doc["path"] = "a subflow per plane: plane 0 first, then one per announced address"
    with contextlib.ExitStack() as stack:
        socks: dict[str, Path] = {}
        if transport == "mrc":
            socks = stack.enter_context(bed.daemons(hosts))
        procs = stack.enter_context(processes())
        collectors = []
        for rank in range(len(hosts)):
            err = bed.work / f"{bed.name}-{transport}-{schedule.name}-r{rank}.err"
            with err.open("w") as fh:
                proc = subprocess.Popen(
                    _rank_argv(bed, transport, rank, hosts, cfg, until, socks, tag),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fh, text=True,
                    cwd=ROOT, env=env())
            procs.append(proc)
            collectors.append(Collector(rank, proc, err))
        _wait_ready(collectors, cfg.open_timeout + 30)
        t0 = time.monotonic() + START_MARGIN
        for c in collectors:
            assert c.proc.stdin is not None
            c.proc.stdin.write(f"go {t0!r}\n")
            c.proc.stdin.flush()
        before = bed.tier1_bytes()
        doc["loadavg_before"] = os.getloadavg()[0]  # the host is shared: how busy it was
        injector = Injector(bed.name, schedule, t0)
        injector.start()
        log(f"  {bed.kind} {transport} {schedule.name}: T0 set, running >= {until:g} s")
        try:
            if transport != "mrc":
                time.sleep(max(0.0, t0 + min(1.0, cfg.fault_start / 2) - time.monotonic()))
                top = cfg.port + PORT_GENERATIONS * len(hosts)
                doc["connections"] = {h: bed.established(h, cfg.port, top) for h in hosts}
            end_by = t0 + until + cfg.grace + cfg.restart + 30
            for c in collectors:
                try:
                    c.proc.wait(timeout=max(0.1, end_by - time.monotonic()))
                except subprocess.TimeoutExpired:
                    c.proc.kill()
                    c.proc.wait()
        finally:
            injector.stop()
            bed.clear_faults()
        doc["loadavg_after"] = os.getloadavg()[0]
        doc["tier1_bytes"] = {k: v - before.get(k, 0) for k, v in bed.tier1_bytes().items()}
        doc["faults"] = injector.played
        for c in collectors:
            c.thread.join(5)
        doc["ranks"] = [{"rank": c.rank, "host": hosts[c.rank], "exit": c.proc.returncode,
                         "steps": len(c.steps), "done": c.done, "junk_lines": c.junk,
                         "stderr": c.stderr_tail()} for c in collectors]
        doc["steps"] = stats.merge_steps([c.steps for c in collectors])
    return doc


def _wait_ready(collectors: list[Collector], timeout: float) -> None:
    """Until every rank is ready; a rank that exits first ends the wait with every exited
    rank's last error line (the first to fail usually explains the others)."""
    deadline = time.monotonic() + timeout
    for c in collectors:
        while not c.ready.wait(0.2):
            if c.proc.poll() is not None:
                time.sleep(0.5)  # let the others that are failing too say why
                why = "; ".join(f"rank {d.rank} exited {d.proc.returncode}: {d.stderr_tail()}"
                                for d in collectors if d.proc.poll() is not None)
                raise JobError(f"a rank ended before every rank was ready: {why}")
            if time.monotonic() > deadline:
                raise JobError(f"rank {c.rank} not ready after {timeout:g} s")


def run_matrix(fabrics: list[str], transports: list[str], schedules: list[str],
               cfg: JobConfig, work: Path, name: str | None,
               log: Callable[[str], None]) -> dict[str, Any]:
    """Every run; the job's JSON document."""
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    order = ["none", *[s for s in schedules if s != "none"]]
    for fabric in fabrics:
        with clos(name, FABRICS[fabric], work, cfg.hosts) as bed:
            if len(bed.hosts) < cfg.hosts:
                raise JobError(f"testbed {bed.name} has {len(bed.hosts)} hosts, the job wants "
                               f"{cfg.hosts}")
            log(f"{bed.kind}: testbed {bed.name}, hosts {', '.join(bed.hosts[:cfg.hosts])}")
            for transport in transports:
                if transport == "mptcp":
                    why = bed.mptcp_setup()
                    if why:
                        notes.append(f"{bed.kind} mptcp skipped: {why}")
                        continue
                baseline: dict[str, Any] | None = None
                for sched in order:
                    plan = cfg.schedule(sched, bed)
                    try:
                        run = run_one(bed, transport, plan, cfg, cfg.until(bed, schedules), log)
                    except JobError as exc:  # this run never started; the others still run
                        log(f"    {bed.kind} {transport} {sched}: {exc}")
                        notes.append(f"{bed.kind} {transport} {sched} did not run: {exc}")
                        bed.clear_faults()
                        run = {"fabric": bed.kind, "testbed": bed.name, "transport": transport,
                               "schedule": sched, "plan": plan.to_json(), "error": str(exc),
                               "steps": [], "faults": []}
                    run["summary"] = stats.summarize(run["steps"], cfg.steps, baseline)
                    if sched == "none":
                        baseline = run["summary"]
                        if "none" not in schedules:
                            continue
                    runs.append(run)
                    s = run["summary"]
                    log(f"    {len(run['steps'])} steps, p50 {s['p50']}, p99 {s['p99']}, "
                        f"failed {s['failed']}, verified {s['verified']}")
                if transport == "mptcp":
                    bed.mptcp_clear()
    mrc_runs = [r for r in runs if r["transport"] == "mrc" and r["schedule"] != "none"]
    return {
        "tool": "tools.job",
        "version": 1,
        "config": asdict(cfg) | {"fabrics": fabrics, "transports": transports,
                                 "schedules": schedules},
        "definitions": {
            "step": "an all-reduce of `size` bytes (float32) then `compute` seconds of sleep; "
                    "its time is the slowest rank's",
            "slow": f"steps slower than {stats.SLOW_FACTOR} x the same transport's fault-free "
                    "p50",
            "failed": "steps whose all-reduce raised, timed out, gave a wrong result or a "
                      "rank did not report; the job then restarts the communicator",
            "unrun": "of the `steps` wanted, those not reached before the run's deadline",
            "goal": f"no failed step, every result verified, p99 <= {stats.P99_FACTOR} x the "
                    "fault-free p99",
        },
        "runs": runs,
        "notes": notes,
        "mrc_goal_met": bool(mrc_runs) and all(r["summary"]["goal"] for r in mrc_runs),
        "mrc_lost_nothing": all(r["summary"]["failed"] == 0 and r["summary"]["unrun"] == 0
                                and r["summary"]["verified"] == r["summary"]["steps"]
                                for r in runs if r["transport"] == "mrc"),
    }
