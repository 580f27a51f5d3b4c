"""`mrc collective-bench`: collectives timed like nccl-tests' `all_reduce_perf`.

    mrc collective-bench -b 8 -e 128M -f 2 -o all_reduce -d float -n 20 -w 5 [-J]
        [--ranks 4] [--transport mrc|tcp|mptcp] [--testbed [NAME]]
        [--ring-write-baseline] [--latency-baseline]

Starts the ranks itself: on loopback planes (one daemon per rank with throw-away keys) or on
the hosts of a running testbed (one daemon each), and prints a row per size (size, count,
type, redop, root, time, algbw, busbw, #wrong) as nccl-tests does, or with -J one JSON
document with the rows, the baselines and the goals they were checked against. Parses and
prints only; the run is `mrc.collective.bench`. Needs numpy (`pip install 'mrc[collective]'`).
Failures are one line on stderr and exit status 1; results that differ from numpy's exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mrc.cli import COMMANDS
from mrc.units import parse_size

_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
_TYPES = ("float", "double", "int32", "int64")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "collective-bench",
        help=COMMANDS["collective-bench"],
        description="Time a collective over a sweep of sizes as nccl-tests does (time, algbw, "
        "busbw, #wrong: every result is checked against numpy), with the ranks started here: "
        "one daemon and one rank per loopback host, or per testbed host with --testbed.",
    )
    p.add_argument("-b", "--minbytes", type=parse_size, default=8, help="smallest size (8)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20, help="largest size (32M)")
    p.add_argument("-f", "--stepfactor", type=_positive, default=2, help="size factor (2)")
    p.add_argument("-o", "--op", choices=_OPS, default="all_reduce", help="the collective")
    p.add_argument("-d", "--datatype", choices=_TYPES, default="float", help="element type")
    p.add_argument("-r", "--redop", choices=("sum", "max", "min"), default="sum",
                   help="reduction (all_reduce, reduce_scatter)")
    p.add_argument("--root", type=_positive, default=0, help="broadcast root (0)")
    p.add_argument("-n", "--iters", type=_positive, default=20, help="timed calls per size")
    p.add_argument("-w", "--warmup", type=_positive, default=5, help="warm-up calls per size")
    p.add_argument("--ranks", type=_positive, default=4, help="ranks (4)")
    p.add_argument("--transport", choices=("mrc", "tcp", "mptcp"), default="mrc")
    p.add_argument("--testbed", nargs="?", const="", default=None, metavar="NAME",
                   help="run on the hosts of a running testbed (default name if none given)")
    p.add_argument("--hosts", default="", help="with --testbed: the hosts, comma-separated")
    p.add_argument("--paths", default=None,
                   help="with --testbed: the SRv6 path table (default: the testbed's own)")
    p.add_argument("--security", choices=("encrypt", "none"), default="encrypt",
                   help="the daemons' security (encrypt, with throw-away keys)")
    p.add_argument("--chunk", type=parse_size, default=1 << 20, help="chunk/slot bytes (1M)")
    p.add_argument("--slots", type=_positive, default=8, help="receive slots per rank (8)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per call (60)")
    p.add_argument("--ring-write-baseline", type=parse_size, nargs="?", const=256 << 20, default=0,
                   metavar="BYTES", help="also measure every rank writing to the next at once "
                   "(BYTES each, 256M): the per-link rate busbw is held against")
    p.add_argument("--latency-baseline", action="store_true",
                   help="also run mrc bench --latency on loopback planes (its p50 bounds the "
                   "small all-reduces)")
    p.add_argument("-J", "--json", action="store_true", help="one JSON document")
    p.set_defaults(func=run)


def _table(doc: dict[str, Any]) -> list[str]:
    cfg = doc["config"]
    where = "testbed hosts" if cfg["launch"] == "testbed" else "loopback planes"
    lines = [f"# mrc collective-bench: {cfg['op']}, {cfg['ranks']} ranks over "
             f"{cfg['transport']} ({where}), chunk {cfg['chunk']} B x {cfg['slots']} slots",
             "#",
             f"# {'size':>10} {'count':>11} {'type':>7} {'redop':>6} {'root':>5} "
             f"{'time':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>7}",
             f"# {'(B)':>10} {'(elements)':>11} {'':>7} {'':>6} {'':>5} "
             f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} {'':>7}"]
    for r in doc["rows"]:
        lines.append(f"  {r['size']:>10} {r['count']:>11} {r['type']:>7} {r['redop']:>6} "
                     f"{r['root']:>5} {r['time_us']:>10.1f} {r['algbw_GBps']:>7.3f} "
                     f"{r['busbw_GBps']:>7.3f} {r['wrong']:>7}")
    wrong = sum(r["wrong"] for r in doc["rows"])
    lines.append(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}")
    if doc["rows"]:
        avg = sum(r["busbw_GBps"] for r in doc["rows"]) / len(doc["rows"])
        lines.append(f"# Avg bus bandwidth    : {avg:.4f}")
    rw = doc.get("ring_write")
    if rw:
        lines.append(f"# ring write (every rank to the next at once): "
                     f"{rw['mean_link_GBps']:.4f} GB/s per link (min {rw['min_link_GBps']:.4f})")
    lat = doc.get("latency_baseline")
    if lat:
        lines.append(f"# mrc bench --latency (8 B round trip): p50 {lat['p50']} us, "
                     f"p99 {lat.get('p99')} us")
    rtt = doc.get("daemon_round_trip")
    if rtt:
        lines.append(f"# app to app through two daemons (8 B round trip): p50 {rtt['p50']} us, "
                     f"p99 {rtt.get('p99')} us")
    for name, g in doc.get("goals", {}).items():
        lines.append(f"# goal {name}: " + ", ".join(f"{k} {v}" for k, v in g.items()))
    return lines


def run(ns: argparse.Namespace) -> int:
    try:
        from mrc.collective import CollectiveError
        from mrc.collective.bench import BenchConfig
        from mrc.collective.bench import run as run_bench
    except ImportError as exc:
        sys.stderr.write(f"mrc collective-bench: {exc}\n")
        return 1
    if ns.stepfactor < 2 or ns.iters < 1 or ns.ranks < 2 or ns.slots < 2:
        sys.stderr.write("mrc collective-bench: error: -f and --slots must be at least 2, "
                         "-n at least 1, --ranks at least 2\n")
        return 2
    if ns.minbytes > ns.maxbytes:
        sys.stderr.write("mrc collective-bench: error: -b is larger than -e\n")
        return 2
    if ns.root >= ns.ranks:
        sys.stderr.write(f"mrc collective-bench: error: --root must be below --ranks "
                         f"({ns.ranks})\n")
        return 2
    cfg = BenchConfig(
        op=ns.op, datatype=ns.datatype, redop=ns.redop, root=ns.root, minbytes=ns.minbytes,
        maxbytes=ns.maxbytes, stepfactor=ns.stepfactor, iters=ns.iters, warmup=ns.warmup,
        ranks=ns.ranks, transport=ns.transport,
        launch="testbed" if ns.testbed is not None else "loopback",
        testbed_name=ns.testbed or None,
        hosts=[h for h in ns.hosts.split(",") if h], paths=ns.paths,
        secure=ns.security == "encrypt", chunk=ns.chunk, slots=ns.slots, timeout=ns.timeout,
        ring_write=ns.ring_write_baseline, latency_baseline=ns.latency_baseline,
    )
    try:
        doc = run_bench(cfg)
    except CollectiveError as exc:
        sys.stderr.write(f"mrc collective-bench: {exc}\n")
        return 1
    if ns.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(_table(doc)) + "\n")
    return 1 if any(r["wrong"] for r in doc["rows"]) else 0
