"""One rank of a collective benchmark as a process: `python -m mrc.collective.rank ...`.

    python -m mrc.collective.rank --transport mrc --rank 0 --world 4 \\
        --socket /run/mrc/mrc.sock --peers h1,h2,h3,h4 --group bench1 \\
        -o all_reduce -d float -r sum -b 8 -e 64M -f 2 -n 20 -w 5
    python -m mrc.collective.rank --transport tcp --rank 0 --world 4 \\
        --addresses 10.0.0.1:5000,10.0.0.2:5000,... -o all_reduce ...
    python -m mrc.collective.rank --transport mrc --mode ring-write --bytes 256M ...

Opens a communicator (`open_mrc` or `open_tcp`), then in `bench` mode, for each size from
`-b` to `-e` (times `-f`): `-w` warm-up calls, then `-n` timed calls, each after an untimed
barrier, each result checked against what numpy computes from every rank's input (the inputs
are a function of rank, size and iteration, so every rank knows them all). It prints one JSON
line per size: {"rank", "op", "size", "count", "type", "redop", "times": [seconds per timed
call], "wrong": results that differ}. `ring-write` mode (MRC only) measures the ring's ceiling
instead: every rank streams plain WRITEs of the chunk size into the next rank's slots, all at
once, and prints {"rank", "ring_write": {"bytes", "seconds"}}. A failure prints {"rank",
"error"} and exits 1. Sizes follow nccl-tests: the whole array for all_reduce, broadcast and
reduce_scatter (its input), world × the per-rank input for all_gather (its output).

The launcher that starts one of these per rank is `launch`; the table is `mrc collective-bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from ..units import parse_size
from .comm import CollectiveError
from .mrc_link import MrcLink, open_mrc
from .ring import Ring, run_blocking
from .tcp_link import open_tcp

__all__ = ["TYPES", "bench_sizes", "expected", "inputs", "main"]

#: nccl-tests' type names → numpy dtypes.
TYPES = {"float": "float32", "double": "float64", "int32": "int32", "int64": "int64"}
BENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def bench_sizes(begin: int, end: int, factor: int) -> list[int]:
    sizes = []
    size = begin
    while size <= end:
        sizes.append(size)
        size *= factor
    return sizes


def inputs(rank: int, count: int, dtype: str, iteration: int) -> np.ndarray[Any, Any]:
    """Rank `rank`'s input: small integers (exact in every dtype, sums included), negative
    ones too (so max and min differ from sum), shifted by the iteration."""
    base = (np.arange(count, dtype=np.int64) * (rank + 3) + 7 * rank) % 97 - 48
    return (base + iteration).astype(dtype)


def expected(op: str, redop: str, world: int, rank: int, count: int, dtype: str,
             iteration: int, root: int) -> np.ndarray[Any, Any]:
    """What rank `rank` must get back."""
    if op == "broadcast":
        return inputs(root, count, dtype, iteration)
    if op == "all_gather":
        return np.stack([inputs(r, count, dtype, iteration) for r in range(world)])
    stack = np.stack([inputs(r, count, dtype, iteration) for r in range(world)])
    full: np.ndarray[Any, Any]
    if redop == "sum":
        full = stack.sum(axis=0).astype(dtype)
    elif redop == "max":
        full = stack.max(axis=0)
    else:
        full = stack.min(axis=0)
    if op == "reduce_scatter":
        part: np.ndarray[Any, Any] = np.array_split(full, world)[rank]
        return part
    return full


def _call(comm: Ring, op: str, data: np.ndarray[Any, Any], redop: str, root: int,
          timeout: float) -> np.ndarray[Any, Any]:
    if op == "all_reduce":
        return comm.all_reduce(data, redop, timeout=timeout)
    if op == "all_gather":
        return comm.all_gather(data, timeout=timeout)
    if op == "reduce_scatter":
        return comm.reduce_scatter(data, redop, timeout=timeout)
    return comm.broadcast(data, root, timeout=timeout)


def run_bench(comm: Ring, ns: argparse.Namespace) -> None:
    dtype = TYPES[ns.datatype]
    size_of = np.dtype(dtype).itemsize
    world, rank = comm.world, comm.rank
    for size in bench_sizes(ns.minbytes, ns.maxbytes, ns.stepfactor):
        count = max(1, size // size_of)
        per_rank = max(1, count // world) if ns.op == "all_gather" else count
        total = per_rank * world if ns.op == "all_gather" else count
        times: list[float] = []
        wrong = 0
        for it in range(ns.warmup + ns.iters):
            data = inputs(rank, per_rank, dtype, it)
            want = expected(ns.op, ns.redop, world, rank, per_rank, dtype, it, ns.root)
            comm.barrier(timeout=ns.timeout)
            t0 = time.perf_counter()
            got = _call(comm, ns.op, data, ns.redop, ns.root, ns.timeout)
            t1 = time.perf_counter()
            if it >= ns.warmup:
                times.append(t1 - t0)
                wrong += int(got.shape != want.shape or not np.array_equal(got, want))
        print(json.dumps({"rank": rank, "op": ns.op, "size": total * size_of, "count": total,
                          "type": ns.datatype, "redop": ns.redop if ns.op in (
                              "all_reduce", "reduce_scatter") else "none",
                          "root": ns.root if ns.op == "broadcast" else -1,
                          "times": times, "wrong": wrong}), flush=True)


def _open(ns: argparse.Namespace) -> Ring:
    if ns.transport == "mrc":
        if not ns.socket or not ns.peers:
            raise CollectiveError("--transport mrc needs --socket and --peers")
        return open_mrc(ns.socket, ns.rank, ns.world, ns.peers.split(","), timeout=ns.timeout,
                        group=ns.group, chunk_bytes=ns.chunk, slots=ns.slots)
    if not ns.addresses:
        raise CollectiveError(f"--transport {ns.transport} needs --addresses")
    addrs = []
    for item in ns.addresses.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise CollectiveError(f"--addresses: expected HOST:PORT, got {item!r}")
        addrs.append((host.strip("[]"), int(port)))
    return open_tcp(ns.rank, ns.world, addrs, mptcp=ns.transport == "mptcp",
                    timeout=ns.timeout, chunk_bytes=ns.chunk, slots=ns.slots)


def run_ring_write(comm: Ring, ns: argparse.Namespace) -> None:
    link = comm.link
    if not isinstance(link, MrcLink):
        raise CollectiveError("--mode ring-write measures the MRC daemons (--transport mrc)")
    comm.barrier(timeout=ns.timeout)
    loop = comm.loop
    nbytes, seconds = run_blocking(loop, link.stream(ns.bytes, ns.timeout))
    comm.barrier(timeout=ns.timeout)
    print(json.dumps({"rank": comm.rank, "ring_write": {"bytes": nbytes, "seconds": seconds}}),
          flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mrc.collective.rank",
                                description="One rank of a collective benchmark.")
    p.add_argument("--transport", choices=("mrc", "tcp", "mptcp"), default="mrc")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--socket", help="mrc: this host's daemon control socket")
    p.add_argument("--peers", help="mrc: every rank's daemon host name, comma-separated")
    p.add_argument("--group", default="bench", help="mrc: the message endpoint prefix")
    p.add_argument("--addresses", help="tcp/mptcp: HOST:PORT of every rank, comma-separated")
    p.add_argument("--chunk", type=parse_size, default=1 << 20, help="chunk bytes (1M)")
    p.add_argument("--slots", type=int, default=8, help="receive slots per rank (8)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per call (60)")
    p.add_argument("--mode", choices=("bench", "ring-write"), default="bench")
    p.add_argument("-o", "--op", choices=BENCH_OPS, default="all_reduce")
    p.add_argument("-d", "--datatype", choices=tuple(TYPES), default="float")
    p.add_argument("-r", "--redop", choices=("sum", "max", "min"), default="sum")
    p.add_argument("--root", type=int, default=0)
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=1 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--bytes", type=parse_size, default=256 << 20,
                   help="ring-write: bytes each rank writes (256M)")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.stepfactor < 2 or ns.iters < 1 or ns.warmup < 0:
        sys.stderr.write("rank: -f must be at least 2, -n at least 1, -w at least 0\n")
        return 2
    comm: Ring | None = None
    try:
        comm = _open(ns)
        if ns.mode == "ring-write":
            run_ring_write(comm, ns)
        else:
            run_bench(comm, ns)
    except CollectiveError as exc:
        print(json.dumps({"rank": ns.rank, "error": str(exc)}), flush=True)
        return 1
    except (OSError, ValueError, MemoryError) as exc:  # not the collective's: still one line
        print(json.dumps({"rank": ns.rank, "error": f"{type(exc).__name__}: {exc}"}),
              flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if comm is not None:
            comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
