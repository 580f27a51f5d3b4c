"""`python -m tools.compare`: build the testbed, run every comparison, print, write JSON, tear down.

The order is fixed: iperf3, MPTCP, aioquic, raw UDP, mrc, mrc on pure Python (throughput),
then the MPTCP and mrc failover runs (one MPTCP run and `--repeat` mrc runs for each `--fault`
kind: link-down, then blackhole), then the round trips (UDP and TCP ping-pong, `mrc bench
--latency`) and the `mrc bench --sweep` of message sizes (`latency`). A run that fails is
recorded as `{"error": …}` with a one-line reason on stderr and the others go on; the exit
status is then 1. `--rounds N` runs the mrc throughput rows (plain, pure, auth, encrypt) N
times, alternated round by round, and keeps every round: each row shows its median round, and
a variant's ratio to the plain run is the median of the rounds' ratios (`report.ratios`): on a
shared host one run's goodput moves by a third from minute to minute. Whatever happens (an
error, Ctrl-C, SIGTERM, SIGHUP), every child process is stopped and the testbed is removed
with `tools.testbed`'s `down` before the command returns. Not root: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import re
import secrets
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, NoReturn

from tools.compare import failover, latency, procs, report, runs
from tools.compare.procs import ProcError
from tools.testbed import build, topology
from tools.testbed.model import TestbedError
from tools.testbed.runner import Runner

NOT_ROOT = "compare: needs root (network namespaces, MPTCP endpoints); run as root or with sudo"
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`8G`, `512M`, `4GiB` (1024-based), `2GB`, `1e9`-free integers; kB/MB/GB are SI."""
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 8G, 512M, 2GB)")
    num, unit, suffix = float(m.group(1)), m.group(2).upper(), m.group(3)
    base = 1000 if suffix.upper() == "B" else 1024
    value = int(num * base ** " KMGT".index(unit or " "))
    if value <= 0:
        raise argparse.ArgumentTypeError("the size must be positive")
    return value


FAULTS = ("link-down", "blackhole")


def _faults(text: str) -> list[str]:
    """`link-down`, `blackhole` or both, comma-separated, each once."""
    kinds = [x.strip() for x in text.split(",") if x.strip()]
    bad = [k for k in kinds if k not in FAULTS]
    if bad or not kinds or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"bad fault list {text!r} (one or more of {', '.join(FAULTS)}, each once)")
    return kinds


def fault_key(transport: str, kind: str, kinds: Sequence[str]) -> str:
    """Where a failover result goes in compare.json: the first fault kind under the
    transport's own name (what `mrc plot` and the older goals read), others suffixed."""
    return transport if kind == kinds[0] else f"{transport}-{kind}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"compare: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


RUNS = ("iperf3", "mptcp", "aioquic", "raw_udp", "mrc", "mrc_pure", "mrc_auth", "mrc_encrypt",
        "failover-mptcp", "failover-mrc", "latency-udp", "latency-tcp", "latency-mrc",
        "sweep-mrc")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m tools.compare",
                description="mrc against iperf3, MPTCP, aioquic and a raw-UDP ceiling on a "
                            "netns pair testbed, plus a failover comparison (root only).")
    p.add_argument("-n", "--bytes", type=parse_size, default=parse_size("8G"),
                   help="bytes each transport moves (default 8G = 8 GiB; K/M/G 1024-based)")
    p.add_argument("-o", "--output", default="compare.json", help="JSON file (compare.json)")
    p.add_argument("--planes", type=int, default=4, help="planes of the pair testbed (4)")
    p.add_argument("--quic-max-seconds", type=float, default=15.0,
                   help="aioquic stops sending after this long and reports what moved (15)")
    p.add_argument("--failover-seconds", type=float, default=3.0,
                   help="length of each failover transfer (3)")
    p.add_argument("--fault-after", type=float, default=1.0,
                   help="seconds into the failover transfer the plane fails (1)")
    p.add_argument("--fail-plane", type=int, default=0, help="plane that fails (0)")
    p.add_argument("--fault", type=_faults, default=list(FAULTS),
                   help="how it fails, one case each, comma-separated (link-down: both ends "
                        "down; blackhole: nftables drop both ways); default link-down,blackhole")
    p.add_argument("--repeat", type=int, default=10,
                   help="mrc failover runs per fault (10; the goal is <= 10 ms in 10 of 10)")
    p.add_argument("--rounds", type=int, default=1,
                   help="alternated rounds of the mrc throughput rows; medians reported (1)")
    p.add_argument("--only", help=f"comma-separated subset of: {', '.join(RUNS)}")
    p.add_argument("--run-timeout", type=float, default=240.0,
                   help="deadline of each run in seconds (240)")
    p.add_argument("--logs", metavar="DIR",
                   help="also keep the raw documents and 1 ms byte logs of each run here")
    p.add_argument("--mrc-args", default="",
                   help="extra `mrc bench` client arguments, e.g. '--flowcell 8'")
    return p


def _machine(bed_ns: str) -> dict[str, Any]:
    info: dict[str, Any] = {"kernel": platform.release(), "cpus": os.cpu_count(),
                            "python": platform.python_version(),
                            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    probes: dict[str, Callable[[], str]] = {
        "iperf3": lambda: procs.run(None, ["iperf3", "--version"]).splitlines()[0],
        "tcp_congestion": lambda: procs.run(
            bed_ns, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]).strip(),
        "git": lambda: procs.run(None, ["git", "-C", procs.REPO_ROOT, "describe", "--always",
                                        "--dirty"]).strip(),
    }
    for key, probe in probes.items():
        with contextlib.suppress(ProcError, IndexError):
            info[key] = probe()
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        info["aioquic"] = version("aioquic")
    with contextlib.suppress(Exception):
        import mrc

        info["mrc"] = mrc.__version__
        info["mrc_implementation"] = mrc.implementation()
    return info


def _busy() -> float:
    """CPU seconds all processes on the machine have used (all CPUs, from /proc/stat)."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    # user nice system idle iowait irq softirq steal: process time only (irq and softirq
    # time, much of it the kernel's work for our own packets, is left out here as it is left
    # out of the processes' rusage).
    busy = fields[0] + fields[1] + fields[2] + (fields[7] if len(fields) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _say(msg: str) -> None:
    print(f"compare: {msg}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    only = set(RUNS) if not args.only else {x.strip() for x in args.only.split(",")}
    unknown = only - set(RUNS)
    if unknown:
        _say(f"unknown run(s) {', '.join(sorted(unknown))}; choose from {', '.join(RUNS)}")
        return 2
    if args.repeat < 1 or args.rounds < 1:
        _say("--repeat and --rounds must be >= 1")
        return 2
    if not 0 <= args.fail_plane < args.planes or args.planes < 2:
        _say("--planes must be >= 2 and --fail-plane one of them")
        return 2
    if os.geteuid() != 0:
        print(NOT_ROOT, file=sys.stderr)
        return 2
    missing = [t for t in ("ip", "ss", "sysctl") if shutil.which(t) is None]
    if missing:
        _say(f"missing {' '.join(missing)} (make sysdeps, or apt-get install iproute2 procps)")
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: a background
        signal.signal(sig, _interrupt)  # job starts with it ignored
    runner = Runner()
    name = f"cmp{secrets.token_hex(3)}"
    t_start = time.monotonic()
    doc: dict[str, Any] = {"tool": "tools.compare", "version": 1,
                           "started": datetime.datetime.now(datetime.UTC).isoformat(
                               timespec="seconds"),
                           "params": {"bytes": args.bytes, "planes": args.planes,
                                      "quic_max_seconds": args.quic_max_seconds,
                                      "failover_seconds": args.failover_seconds,
                                      "fault_after": args.fault_after,
                                      "fail_plane": args.fail_plane, "fault": args.fault,
                                      "repeat": args.repeat, "rounds": args.rounds,
                                      "mrc_args": args.mrc_args, "runs": sorted(only)},
                           "throughput": {}, "failover": {}, "latency": {}, "sweep": {},
                           "errors": []}
    rc = 0
    state = None
    try:
        topo = topology.load("pair", {"planes": args.planes})
        _say(f"building testbed {name} (pair, {args.planes} planes)")
        state = build.up(topo, name, runner)
        h1, h2 = state.topo.nodes["h1"], state.topo.nodes["h2"]
        bed = runs.Bed(name=name, ns1=state.ns("h1"), ns2=state.ns("h2"),
                       a1=[str(h1.plane_addr(p, 4)) for p in range(args.planes)],
                       a2=[str(h2.plane_addr(p, 4)) for p in range(args.planes)],
                       timeout=args.run_timeout,
                       ifaces=[f"p{p}" for p in range(args.planes)], logs=args.logs)
        doc["testbed"] = {"name": name, "topology": "pair", "planes": args.planes,
                          "mtu": topology.DEFAULT_MTU, "h1": bed.a1, "h2": bed.a2}
        doc["machine"] = _machine(bed.ns1)
        extra = shlex.split(args.mrc_args)
        n = args.bytes
        fo_args = (args.failover_seconds, args.fail_plane)
        # (run name for --only, section, key in the section, the run)
        plan: list[tuple[str, str, str, Callable[[], dict[str, Any]]]] = [
            ("iperf3", "throughput", "iperf3", lambda: runs.run_iperf3(bed, n)),
            ("mptcp", "throughput", "mptcp", lambda: runs.run_mptcp(bed, n)),
            ("aioquic", "throughput", "aioquic",
             lambda: runs.run_quic(bed, n, args.quic_max_seconds)),
            ("raw_udp", "throughput", "raw_udp", lambda: runs.run_raw(bed, n)),
            ("mrc", "throughput", "mrc", lambda: runs.run_mrc(bed, n, extra)),
            ("mrc_pure", "throughput", "mrc_pure",
             lambda: runs.run_mrc(bed, n, extra, pure=True)),
            ("mrc_auth", "throughput", "mrc_auth", lambda: runs.run_mrc(bed, n, extra, "auth")),
            ("mrc_encrypt", "throughput", "mrc_encrypt",
             lambda: runs.run_mrc(bed, n, extra, "encrypt")),
        ]
        for kind in args.fault:
            plan.append(("failover-mptcp", "failover", fault_key("mptcp", kind, args.fault),
                         functools.partial(failover.run_mptcp, bed, *fo_args, kind,
                                           args.fault_after, state, runner)))
            plan.append(("failover-mrc", "failover", fault_key("mrc", kind, args.fault),
                         functools.partial(failover.run_mrc_repeated, bed, *fo_args, kind,
                                           args.fault_after, state, runner, extra,
                                           args.repeat, _say)))
        plan += [
            ("latency-udp", "latency", "udp", lambda: latency.run_pingpong(bed, "udp")),
            ("latency-tcp", "latency", "tcp", lambda: latency.run_pingpong(bed, "tcp")),
            ("latency-mrc", "latency", "mrc", lambda: latency.run_mrc_latency(bed, extra)),
            ("sweep-mrc", "sweep", "mrc", lambda: latency.run_mrc_sweep(bed, extra)),
        ]
        if only & {"mptcp", "failover-mptcp"}:
            runs.mptcp_setup(bed)
        todo = [step for step in plan if step[0] in only]
        rowed = [step for step in todo if step[0] in report.ROUNDED]
        if rowed and args.rounds > 1:
            # The mrc rows are adjacent in the plan: their rounds go where they stood.
            at = todo.index(rowed[0])
            rest = [step for step in todo if step[0] not in report.ROUNDED]
            todo = rest[:at] + rowed * args.rounds + rest[at:]
        rounds: dict[str, list[dict[str, Any]]] = {}
        for i, (run, section, short, fn) in enumerate(todo, 1):
            key = run if section != "failover" else f"{run} ({short})"
            if args.rounds > 1 and run in report.ROUNDED:
                key = f"{run} (round {len(rounds.get(short, [])) + 1}/{args.rounds})"
            _say(f"[{i}/{len(todo)}] {key} …")
            t0 = time.monotonic()
            busy0 = _busy()
            try:
                result = fn()
            except (ProcError, TestbedError, OSError) as e:
                result = {"error": str(e)}
            except (KeyError, ValueError, TypeError, IndexError) as e:
                result = {"error": f"unexpected output ({e.__class__.__name__}: {e})"}
            finally:
                procs.kill_all()
            result["wall_seconds"] = round(time.monotonic() - t0, 2)
            result["host_cpu_busy_s"] = round(_busy() - busy0, 2)
            if "cpu_seconds" in result:
                result["other_load_cpu_s"] = round(
                    max(0.0, result["host_cpu_busy_s"] - result["cpu_seconds"]), 2)
            if args.rounds > 1 and run in report.ROUNDED:
                rounds.setdefault(short, []).append(result)
                doc[section][short] = report.median_round(rounds[short])
            else:
                doc[section][short] = result
            if "error" in result:
                rc = 1
                doc["errors"].append(f"{key}: {result['error']}")
                _say(f"[{i}/{len(todo)}] {key} FAILED: {result['error']}")
            elif section == "throughput":
                _say(f"[{i}/{len(todo)}] {key}: {report.rate(result['goodput_bps'])}, "
                     f"{result['cpu_s_per_gb']} CPU s/GB ({result['wall_seconds']} s)")
            elif section == "latency":
                _say(f"[{i}/{len(todo)}] {key}: p50 {result['p50']} us, p99 {result['p99']} us "
                     f"({result['wall_seconds']} s)")
            elif section == "sweep":
                _say(f"[{i}/{len(todo)}] {key}: 4 KiB {result['writes_per_s_4k']} WRITEs/s, "
                     f"64K/1M goodput {result['goodput_64k_over_1m']} "
                     f"({result['wall_seconds']} s)")
            elif "runs" in result:
                _say(f"[{i}/{len(todo)}] {key}: longest gap <= 10 ms in "
                     f"{result['runs_within_10ms']} of {len(result['runs'])} runs "
                     f"({result['wall_seconds']} s)")
            else:
                _say(f"[{i}/{len(todo)}] {key}: gap {result['longest_gap_s'] * 1e3:.1f} ms, "
                     f"post {report.rate(result['post_bps'])} ({result['wall_seconds']} s)")
    except KeyboardInterrupt:
        _say("interrupted; cleaning up")
        doc["errors"].append("interrupted")
        rc = 130
    except TestbedError as e:
        _say(f"testbed: {e}")
        doc["errors"].append(f"testbed: {e}")
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip cleanup
        procs.kill_all()
        if state is not None or name in build.names():
            try:
                build.down(name, runner)
                _say(f"testbed {name} down")
            except TestbedError as e:
                _say(f"could not remove testbed {name}: {e} "
                     f"(python -m tools.testbed down {name})")
                rc = rc or 1
        signal.signal(signal.SIGINT, signal.default_int_handler)
    doc["ratios"] = report.ratios(doc["throughput"])
    doc["goals"] = report.goals(doc)
    doc["seconds_total"] = round(time.monotonic() - t_start, 1)
    try:
        with open(args.output, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    except OSError as e:
        _say(f"cannot write {args.output}: {e.strerror}")
        rc = rc or 1
    if any(doc[k] for k in ("throughput", "failover", "latency", "sweep")):
        print(report.text(doc))
    _say(f"wrote {args.output} ({doc['seconds_total']} s in all)")
    return rc
