"""The collective benchmark as a whole run: daemons, ranks, baselines, rows, goals.

`run(BenchConfig)` starts the daemons (`launch`: loopback planes or the testbed's hosts) for
`--transport mrc`, or picks one TCP address per rank for tcp/mptcp, runs one
`mrc.collective.rank` per rank over the size sweep, and turns their JSON lines into rows as
nccl-tests prints them: for each size the time of a call (per timed iteration the slowest
rank's, averaged over the iterations), algbw = size / time, busbw = algbw × the collective's
factor (all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1) and #wrong
(results that differed from numpy's, summed over ranks and iterations). With the same
daemons, in the same run, it can measure the two baselines the goals are stated against
(docs/COLLECTIVE.md §5): the ring's ceiling (every rank streaming plain WRITEs to the next
at once: the per-link rate) and `mrc bench --latency`'s round-trip p50 on loopback planes;
with the latter also an application-to-application WRITE_WITH_IMM round trip through two of
the daemons (what one hop of the ring costs at least).
Returns one JSON-able document; printing it is `mrc.cli.collective_bench`'s.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mrc.client import AsyncClient, ClientError, Write, rpc

from .comm import CollectiveError
from .launch import (
    DaemonSpec,
    environ,
    loopback_daemons,
    rank_command,
    run_ranks,
    testbed_daemons,
    testbed_hosts,
)
from .mrc_link import MESH_MAX_WORLD

__all__ = ["BUS_FACTOR", "BenchConfig", "bus_factor", "run"]

#: busbw / algbw per collective, as nccl-tests (n = ranks).
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
#: The goals' sizes: busbw at this size against the ring's ceiling, latency up to that one.
GOAL_BUSBW_SIZE = 64 << 20
GOAL_LATENCY_MAX = 64 << 10


def bus_factor(op: str, ranks: int) -> float:
    return BUS_FACTOR[op](ranks)


@dataclass
class BenchConfig:
    op: str = "all_reduce"
    datatype: str = "float"
    redop: str = "sum"
    root: int = 0
    minbytes: int = 8
    maxbytes: int = 1 << 20
    stepfactor: int = 2
    iters: int = 20
    warmup: int = 5
    ranks: int = 4
    transport: str = "mrc"
    launch: str = "loopback"
    testbed_name: str | None = None
    hosts: list[str] = field(default_factory=list)
    paths: str | None = None
    secure: bool = True
    chunk: int = 1 << 20
    slots: int = 8
    timeout: float = 60.0
    ring_write: int = 0
    latency_baseline: bool = False
    latency_iterations: int = 2000


def _rank_args(cfg: BenchConfig) -> list[str]:
    return ["-o", cfg.op, "-d", cfg.datatype, "-r", cfg.redop, "--root", str(cfg.root),
            "-b", str(cfg.minbytes), "-e", str(cfg.maxbytes), "-f", str(cfg.stepfactor),
            "-n", str(cfg.iters), "-w", str(cfg.warmup), "--chunk", str(cfg.chunk),
            "--slots", str(cfg.slots), "--timeout", str(cfg.timeout)]


def _mrc_commands(specs: list[DaemonSpec], group: str, args: list[str]) -> list[list[str]]:
    peers = ",".join(s.host for s in specs)
    return [rank_command(spec, ["--transport", "mrc", "--rank", str(i), "--world",
                                str(len(specs)), "--socket", spec.socket, "--peers", peers,
                                "--group", group, *args])
            for i, spec in enumerate(specs)]


def _errors(outs: list[list[dict[str, Any]]]) -> None:
    """Raise the cause when ranks failed: a rank's own error before those that only relay
    another rank's failure or the loss of a neighbour."""
    errs = [(i, str(o["error"])) for i, lines in enumerate(outs) for o in lines if "error" in o]
    if errs:
        relays = (" failed: ", "closed its connection", "connection failed")
        errs.sort(key=lambda e: any(r in e[1] for r in relays))
        i, msg = errs[0]
        more = f" ({len(errs) - 1} more ranks failed)" if len(errs) > 1 else ""
        raise CollectiveError(f"rank {i}: {msg}{more}")


def rows_of(cfg: BenchConfig, outs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per size: the slowest rank's time per iteration, averaged; the bandwidths; #wrong."""
    _errors(outs)
    by_size: dict[int, list[dict[str, Any]]] = {}
    for lines in outs:
        for o in lines:
            if "times" in o:
                by_size.setdefault(int(o["size"]), []).append(o)
    rows = []
    n = len(outs)
    for size, per_rank in sorted(by_size.items()):
        if len(per_rank) != n:
            raise CollectiveError(f"size {size}: {len(per_rank)} of {n} ranks reported")
        iters = min(len(o["times"]) for o in per_rank)
        slowest = [max(o["times"][i] for o in per_rank) for i in range(iters)]
        t = sum(slowest) / max(1, iters)
        algbw = size / t / 1e9 if t else 0.0
        first = per_rank[0]
        rows.append({"size": size, "count": first["count"], "type": first["type"],
                     "redop": first["redop"], "root": first["root"],
                     "time_us": round(t * 1e6, 2),
                     "time_min_us": round(min(slowest) * 1e6, 2) if slowest else 0.0,
                     "time_p50_us": round(statistics.median(slowest) * 1e6, 2)
                     if slowest else 0.0,
                     "algbw_GBps": round(algbw, 4),
                     "busbw_GBps": round(algbw * bus_factor(cfg.op, n), 4),
                     "wrong": sum(int(o["wrong"]) for o in per_rank)})
    return rows


def ring_write(cfg: BenchConfig, specs: list[DaemonSpec]) -> dict[str, Any]:
    """Every rank streams `cfg.ring_write` bytes to the next one at once: the per-link rate."""
    group = f"rw{random.randrange(1 << 30):x}"
    args = ["--mode", "ring-write", "--bytes", str(cfg.ring_write), "--chunk", str(cfg.chunk),
            "--slots", str(cfg.slots), "--timeout", str(cfg.timeout)]
    outs = run_ranks(_mrc_commands(specs, group, args), cfg.timeout * 4 + 30)
    _errors(outs)
    per = [o["ring_write"] for lines in outs for o in lines if "ring_write" in o]
    rates = [p["bytes"] / p["seconds"] / 1e9 for p in per if p["seconds"] > 0]
    if len(rates) != len(specs):
        raise CollectiveError("ring-write: not every rank reported")
    return {"bytes_per_rank": cfg.ring_write, "link_GBps": [round(r, 4) for r in rates],
            "mean_link_GBps": round(sum(rates) / len(rates), 4),
            "min_link_GBps": round(min(rates), 4)}


def latency_baseline(iterations: int, timeout: float) -> dict[str, Any]:
    """`mrc bench --latency` (8-byte WRITE_WITH_IMM ping-pong, in-process endpoints) between
    two loopback hosts of two planes each: its round-trip percentiles."""
    base = random.randrange(64, 250)
    server = [f"127.{base}.201.{p}" for p in (1, 2)]
    client = [f"127.{base}.202.{p}" for p in (1, 2)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((server[0], 0))
        port = probe.getsockname()[1]
    mrc = [sys.executable, "-m", "mrc", "bench"]
    srv = subprocess.Popen([*mrc, "-s", "-B", ",".join(server), "-p", str(port), "-1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environ())
    try:
        deadline = time.monotonic() + timeout
        while True:
            cli = subprocess.run([*mrc, "-c", ",".join(server), "-B", ",".join(client), "-p",
                                  str(port), "--latency", "-l", "8", "--iterations",
                                  str(iterations), "-J"], capture_output=True, text=True,
                                 env=environ(), timeout=timeout, check=False)
            if cli.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # the server may not be listening yet
        if cli.returncode:
            raise CollectiveError(f"mrc bench --latency: {cli.stderr.strip()[-300:]}")
        lat = json.loads(cli.stdout)["end"]["latency"]
        return {"bytes": 8, "iterations": iterations,
                **{k: lat[k] for k in ("min", "p50", "p99", "max") if k in lat}}
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait(5)
        if srv.stderr is not None:
            srv.stderr.close()


def daemon_round_trip(a: DaemonSpec, b: DaemonSpec, iterations: int,
                      timeout: float) -> dict[str, Any]:
    """What one hop of the ring costs at least: an 8-byte WRITE_WITH_IMM from an application
    on `a`'s daemon to one on `b`'s, written straight back when its immediate arrives (the
    same API calls a ring hop makes, the immediates pushed as a rank has them; completions,
    waited for only at the end, are left to a long-poll then: pushed, each would be a
    notification and a wake-up nobody waits for); round-trip percentiles in microseconds."""
    return asyncio.run(asyncio.wait_for(_ping_pong(a, b, iterations), timeout))


async def _ping_pong(a: DaemonSpec, b: DaemonSpec, iterations: int) -> dict[str, Any]:
    ca = await AsyncClient.open(a.socket)
    cb = await AsyncClient.open(b.socket)
    try:
        ra = await ca.register_region(4096, "rtt-a")
        rb = await cb.register_region(4096, "rtt-b")
        for client in (ca, cb):
            try:
                await client.subscribe(completions=False)
            except ClientError as exc:  # a daemon without `subscribe` is asked
                if exc.code != rpc.METHOD_NOT_FOUND:
                    raise
        ab = await ca.connect(b.host)
        ba = await cb.connect(a.host)

        async def echo() -> None:
            for i in range(iterations):
                while not await cb.wait_immediates(rb, timeout=5.0):
                    pass
                await ba.write_many([Write(rb, 0, 8, ra.handle, 0, i)])

        task = asyncio.create_task(echo())
        samples = []
        for i in range(iterations):
            t0 = time.perf_counter()
            await ab.write_many([Write(ra, 0, 8, rb.handle, 0, i)])
            while not await ca.wait_immediates(ra, timeout=5.0):
                pass
            samples.append(time.perf_counter() - t0)
        await task
        await ab.wait(timeout=5.0)
        await ba.wait(timeout=5.0)
    except ClientError as exc:
        raise CollectiveError(f"daemon round trip: {exc}") from None
    finally:
        await ca.close()
        await cb.close()
    samples.sort()
    return {"bytes": 8, "iterations": iterations,
            **{k: round(samples[min(len(samples) - 1, int(q * len(samples)))] * 1e6, 2)
               for k, q in (("min", 0.0), ("p50", 0.5), ("p99", 0.99))},
            "max": round(samples[-1] * 1e6, 2)}


def _tcp_addresses(cfg: BenchConfig) -> list[tuple[str, int]]:
    if cfg.launch == "testbed":
        table = testbed_hosts(cfg.testbed_name)
        hosts = cfg.hosts or list(table)[:cfg.ranks]
        return [(table[h][0], 29500 + i) for i, h in enumerate(hosts)]
    base = random.randrange(64, 250)
    out = []
    for i in range(cfg.ranks):
        host = f"127.{base}.{i + 1}.1"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            out.append((host, int(probe.getsockname()[1])))
    return out


@contextmanager
def _daemons(cfg: BenchConfig, workdir: Path) -> Iterator[list[DaemonSpec]]:
    if cfg.launch == "testbed":
        with testbed_daemons(workdir, name=cfg.testbed_name, hosts=cfg.hosts[:cfg.ranks]
                             if cfg.hosts else (), paths=cfg.paths, secure=cfg.secure) as s:
            yield s[:cfg.ranks] if not cfg.hosts else s
    else:
        with loopback_daemons(cfg.ranks, workdir, secure=cfg.secure) as s:
            yield s


def run(cfg: BenchConfig) -> dict[str, Any]:
    """The whole run (see the module docstring); CollectiveError on any failure."""
    if cfg.ring_write and cfg.transport != "mrc":
        raise CollectiveError("the ring-write baseline measures the MRC daemons "
                              "(--transport mrc)")
    doc: dict[str, Any] = {"config": asdict(cfg)}
    # Every call is bounded by cfg.timeout; this only bounds a rank that stops answering.
    budget = 1800.0 + cfg.timeout
    if cfg.latency_baseline:
        doc["latency_baseline"] = latency_baseline(cfg.latency_iterations, 60.0)
    if cfg.transport == "mrc":
        with tempfile.TemporaryDirectory(prefix="mrc-coll-") as tmp, \
                _daemons(cfg, Path(tmp)) as specs:
            cmds = _mrc_commands(specs, f"cb{random.randrange(1 << 30):x}", _rank_args(cfg))
            doc["rows"] = rows_of(cfg, run_ranks(cmds, budget))
            if cfg.ring_write:
                doc["ring_write"] = ring_write(cfg, specs)
            if cfg.latency_baseline:
                doc["daemon_round_trip"] = daemon_round_trip(
                    specs[0], specs[1], min(cfg.latency_iterations, 500), 120.0)
    else:
        addrs = _tcp_addresses(cfg)
        joined = ",".join(f"{h}:{p}" for h, p in addrs)
        prefix: list[list[str]] = [[] for _ in addrs]
        if cfg.launch == "testbed":
            name = ["--name", cfg.testbed_name] if cfg.testbed_name else []
            hosts = cfg.hosts or list(testbed_hosts(cfg.testbed_name))[:cfg.ranks]
            prefix = [[sys.executable, "-m", "tools.testbed", "exec", *name, h, "--"]
                      for h in hosts]
        cmds = [rank_command(DaemonSpec("", "", prefix[i]),
                             ["--transport", cfg.transport, "--rank", str(i), "--world",
                              str(len(addrs)), "--addresses", joined, *_rank_args(cfg)])
                for i in range(len(addrs))]
        doc["rows"] = rows_of(cfg, run_ranks(cmds, budget))
    doc["goals"] = goals(cfg, doc)
    return doc


def goals(cfg: BenchConfig, doc: dict[str, Any]) -> dict[str, Any]:
    """The issue's two fault-free goals, where this run measured what they need."""
    out: dict[str, Any] = {}
    rows = doc.get("rows") or []
    rw = doc.get("ring_write")
    if rw and cfg.op == "all_reduce" and rows:
        at = [r for r in rows if r["size"] == GOAL_BUSBW_SIZE] or [rows[-1]]
        row = at[0]
        ratio = row["busbw_GBps"] / rw["mean_link_GBps"] if rw["mean_link_GBps"] else 0.0
        out["busbw_vs_ring_write"] = {"size": row["size"], "busbw_GBps": row["busbw_GBps"],
                                      "link_GBps": rw["mean_link_GBps"],
                                      "ratio": round(ratio, 3), "goal": 0.7,
                                      "met": ratio >= 0.7}
    lat = doc.get("latency_baseline")
    if lat and cfg.op == "all_reduce":
        bound = 2 * (cfg.ranks - 1) * lat["p50"]
        small = [r for r in rows if r["size"] <= GOAL_LATENCY_MAX]
        out["small_vs_latency"] = {"bound_us": round(bound, 2), "p50_us": lat["p50"],
                                   "worst_us": max((r["time_us"] for r in small), default=0.0),
                                   "ratio": round(max((r["time_us"] for r in small),
                                                      default=0.0) / bound, 3) if bound else 0,
                                   "met": bool(small) and all(r["time_us"] <= bound
                                                              for r in small)}
        rtt = doc.get("daemon_round_trip")
        if rtt:
            # Small all-reduces are one-shot (every rank writes every other at once, one
            # hop; round the ring, W - 1 hops, past MESH_MAX_WORLD ranks), each hop half a
            # round trip through two daemons: the least they can take.
            hops = 1 if cfg.ranks <= MESH_MAX_WORLD else cfg.ranks - 1
            out["small_vs_latency"]["daemon_floor_us"] = round(hops * rtt["p50"] / 2, 2)
    return out
