"""`python -m tools.job`: the command line over `runner`, and the printed summary table.

Parses and checks the options (bad ones are one line and exit status 2 before anything runs),
checks root, runs the matrix, writes the JSON (`-o`) and prints the table (or the JSON with
`-J`). Exit status 0 when every MRC run lost no step and verified every result, 1 otherwise or
when the run could not be set up (one line on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from mrc.units import parse_size

from . import stats
from .fabric import JobError
from .runner import FABRICS, TRANSPORTS, JobConfig, run_matrix
from .schedule import SCHEDULES, Fabric, ScheduleError, build


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"job: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def _list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: want a comma list of "
                                             f"{', '.join(choices)}")
        return list(dict.fromkeys(items))
    return parse


def _parser() -> argparse.ArgumentParser:
    d = JobConfig()
    p = _Parser(prog="python -m tools.job",
                description="A training job (all-reduce, then compute, in a loop) on the clos "
                "testbed, fault-free and under the MRC paper's fault schedules, over MRC, TCP "
                "and MPTCP (root).")
    p.add_argument("--fabric", type=_list(tuple(FABRICS)), default=list(FABRICS),
                   help="srv6 (the static SRv6 clos), ecmp (up clos --ecmp 1); default both")
    p.add_argument("--transport", type=_list(TRANSPORTS), default=list(TRANSPORTS),
                   help="mrc, tcp, mptcp (default all)")
    p.add_argument("--schedule", type=_list(SCHEDULES), default=list(SCHEDULES),
                   help="none, flap, reboot, host-link (default all; none always runs first: "
                   "it is the baseline)")
    p.add_argument("--name", help="use this running clos testbed (one --fabric only)")
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"ranks, one per host ({d.hosts})")
    p.add_argument("--size", type=parse_size, default=d.size, help="bytes per all-reduce (4M)")
    p.add_argument("--steps", type=int, default=d.steps,
                   help=f"at least this many steps per run ({d.steps}); a run also lasts until "
                   "the longest schedule has played out")
    p.add_argument("--compute", type=float, default=d.compute,
                   help=f"compute time per step, s ({d.compute:g})")
    p.add_argument("--timeout", type=float, default=d.timeout,
                   help=f"per all-reduce, s ({d.timeout:g}); a step that takes longer fails")
    p.add_argument("--restart", type=float, default=d.restart,
                   help=f"after a failed step, ranks reopen at the next multiple of this, s "
                   f"({d.restart:g})")
    p.add_argument("--fault-start", type=float, default=d.fault_start,
                   help=f"first fault, s after the first step ({d.fault_start:g})")
    p.add_argument("--duration", type=float, default=d.duration,
                   help=f"how long flaps go on and the lost link stays down, s ({d.duration:g})")
    p.add_argument("--period", type=float, default=d.period, help="flap period, s (1)")
    p.add_argument("--down", type=float, default=d.down, help="down part of a flap, s (0.5)")
    p.add_argument("--reboots", type=int, default=d.reboots, help="tier-1 switches rebooted (4)")
    p.add_argument("--hold", type=float, default=d.hold, help="a reboot's down time, s (2)")
    p.add_argument("--gap", type=float, default=d.gap, help="between reboots, s (0.5)")
    p.add_argument("--host-link", default=d.link, help=f"the lost link ({d.link})")
    p.add_argument("--grace", type=float, default=d.grace,
                   help=f"a run that cannot finish stops this long after it should have, s "
                   f"({d.grace:g})")
    p.add_argument("--work", help="directory for configs, sockets and logs (default: a temp dir)")
    p.add_argument("-o", "--output", help="write the JSON here (mrc plot reads it)")
    p.add_argument("-J", "--json", action="store_true", help="print the JSON, not the table")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _config(ns: argparse.Namespace) -> JobConfig:
    cfg = JobConfig(hosts=ns.hosts, size=ns.size, steps=ns.steps, compute=ns.compute,
                    timeout=ns.timeout, restart=ns.restart, fault_start=ns.fault_start,
                    duration=ns.duration, grace=ns.grace, period=ns.period, down=ns.down,
                    reboots=ns.reboots, hold=ns.hold, gap=ns.gap, link=ns.host_link)
    if not 2 <= cfg.hosts <= 64 or cfg.steps < 1:
        raise JobError("want 2 … 64 --hosts and --steps >= 1")
    if cfg.compute < 0 or cfg.timeout <= 0 or cfg.restart <= cfg.timeout * 0.5 or cfg.grace < 0:
        raise JobError("want --compute >= 0, --timeout > 0, --restart > timeout/2, --grace >= 0")
    fabric = Fabric(hosts=cfg.hosts)
    try:  # every schedule, checked before anything is built
        for name in SCHEDULES:
            build(name, fabric, cfg.fault_start, cfg.duration, period=cfg.period, down=cfg.down,
                  reboots=cfg.reboots, hold=cfg.hold, gap=cfg.gap, link=cfg.link)
    except ScheduleError as exc:
        raise JobError(str(exc)) from None
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        cfg = _config(ns)
        if ns.name and len(ns.fabric) != 1:
            raise JobError("--name takes one running testbed: give one --fabric")
    except JobError as exc:
        sys.stderr.write(f"job: {exc}\n")
        return 2
    if os.geteuid() != 0:
        sys.stderr.write("job: needs root (network namespaces)\n")
        return 2

    def log(line: str) -> None:
        if not ns.quiet:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    try:
        with contextlib.ExitStack() as stack:
            work = Path(ns.work) if ns.work else Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="mrc-job-")))
            work.mkdir(parents=True, exist_ok=True)
            doc = run_matrix(ns.fabric, ns.transport, ns.schedule, cfg, work, ns.name, log)
    except JobError as exc:
        sys.stderr.write(f"job: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("job: interrupted\n")
        return 130
    if ns.output:
        try:
            Path(ns.output).write_text(json.dumps(doc, indent=1) + "\n")
        except OSError as exc:
            sys.stderr.write(f"job: cannot write {ns.output}: {exc.strerror}\n")
            return 1
    if ns.json:
        print(json.dumps(doc, indent=1))
    else:
        print(stats.table(doc["runs"]))
        for note in doc["notes"]:
            print(f"note: {note}")
        lost = ("no step lost, every result verified" if doc["mrc_lost_nothing"]
                else "LOST STEPS or unverified results")
        goal = "met" if doc["mrc_goal_met"] else "NOT met"
        print(f"mrc: {lost}; p99 goal (<= {stats.P99_FACTOR} x fault-free) {goal}")
    return 0 if doc["mrc_lost_nothing"] else 1
