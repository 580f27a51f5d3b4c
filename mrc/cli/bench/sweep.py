"""`mrc bench --sweep`: one stream test per message size, one row per size, and the output.

Holds `sweep_row` (one finished stream test as a row: Gbit/s, WRITEs completed per second, both
sides' CPU, retransmits, integrity), the text table in the shape of perftest's `ib_write_bw -a`
and the `-J` document with its `sweep` list, and `main`, the sweep mode's client: each size is
an ordinary stream test of `proto` on its own connection (the protocol names one message size
per test), run by a `client.BenchClient`. The sizes are the options' (`options.sweep_sizes`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import sys
from collections.abc import Sequence
from typing import Any

from ...units import fmt_bytes
from . import runner
from .client import BenchClient
from .host import client_node, on_signals
from .options import BenchOptions
from .report import Output, implementation
from .setup import BenchError
from .state import RunState
from .stream import BenchTest

__all__ = ["main", "sweep_document", "sweep_row"]

HEAD = (
    f" {'#bytes':<9}{'#messages':>10}{'seconds':>9}{'Gbit/s':>9}{'msgs/s':>11}"
    f"{'CPU% cli':>10}{'CPU% srv':>10}{'retrans':>9}  integrity"
)


def _peer_cpu(summary: dict[str, Any] | None) -> float | None:
    cpu = (summary or {}).get("cpu_utilization_percent")
    total = cpu.get("host_total") if isinstance(cpu, dict) else None
    return float(total) if isinstance(total, int | float) else None


def sweep_row(test: BenchTest) -> dict[str, Any]:
    """One size's results (the client wrote; rates over the writer's own clock)."""
    secs = test.seconds
    return {
        "bytes": test.params.msg_size,
        "messages": test.messages_completed,
        "bytes_completed": test.bytes_completed,
        "seconds": round(secs, 6),
        "bits_per_second": round(test.bytes_completed * 8 / secs, 1) if secs else 0.0,
        "messages_per_second": round(test.messages_completed / secs, 1) if secs else 0.0,
        "cpu_client_percent": test.cpu()["host_total"],
        "cpu_server_percent": _peer_cpu(test.peer_summary),
        "retransmits": test.session.stats.retransmits,
        "integrity": test.integrity(),
        "error": test.error,
    }


def row_line(row: dict[str, Any]) -> str:
    srv = row["cpu_server_percent"]
    return (
        f" {row['bytes']:<9}{row['messages']:>10}{row['seconds']:>9.2f}"
        f"{row['bits_per_second'] / 1e9:>9.3f}{row['messages_per_second']:>11.0f}"
        f"{row['cpu_client_percent']:>10.1f}{'-' if srv is None else f'{srv:.1f}':>10}"
        f"{row['retransmits']:>9}  {row['integrity']}"
    )


def budget_text(opts: BenchOptions) -> str:
    if opts.total_bytes:
        return f"{fmt_bytes(opts.total_bytes).strip()} per size"
    return f"{opts.duration:g} s per size"


def header_lines(opts: BenchOptions) -> list[str]:
    sizes = opts.sweep_sizes
    verify = ", --verify" if opts.verify else ""
    return [
        f"Sweep to host {','.join(opts.server)}, port {opts.port} ({implementation()}): "
        f"WRITEs of {fmt_bytes(sizes[0]).strip()} .. {fmt_bytes(sizes[-1]).strip()} "
        f"({len(sizes)} sizes), {budget_text(opts)}, one connection each{verify}",
        "-" * len(HEAD),
        HEAD,
    ]


def sweep_document(
    opts: BenchOptions, rows: Sequence[dict[str, Any]], planes: int, error: str | None
) -> dict[str, Any]:
    """The -J document: `start` (what was asked), `sweep` (a row per size, in order), `end`."""
    return {
        "start": {
            "connecting_to": {"host": ",".join(opts.server), "port": opts.port},
            "test_start": {
                "protocol": "MRC",
                "test": "sweep",
                "num_planes": planes,
                "sizes": list(opts.sweep_sizes),
                "duration_per_size": opts.duration,
                "bytes_per_size": opts.total_bytes,
                "verify": opts.verify,
                "payload_mtu": opts.payload_mtu,
                "flowcell": opts.flowcell,
                "cc": opts.cc,
            },
        },
        "sweep": list(rows),
        "end": {"sizes_completed": len(rows), "error": error},
    }


async def _client(opts: BenchOptions, state: RunState) -> int:
    """One stream test per size, each on a fresh connection; a row printed as each ends."""
    loop = asyncio.get_running_loop()
    out = Output(json_mode=opts.json)
    for line in header_lines(opts):
        out.line(line)
    rows: list[dict[str, Any]] = []
    current: BenchClient | None = None
    stop = False

    def interrupt() -> None:
        nonlocal stop
        stop = True
        if current is not None:
            current.interrupt()

    on_signals(loop, interrupt)
    rc = 0
    error: str | None = None
    try:
        for size in opts.sweep_sizes:
            # Interval lines make no sense inside a table; each size reports one row.
            size_opts = dataclasses.replace(opts, msg_size=size, interval=0.0, json=False)
            quiet = Output(json_mode=False, quiet=True)
            opened = functools.partial(client_node, loop, size_opts, state)
            current = BenchClient(loop, size_opts, state, quiet, opened)
            try:
                rc = await current.run()
                test = current.test
            finally:
                current.close()
            if test is None:
                break
            row = sweep_row(test)
            rows.append(row)
            out.line(row_line(row))
            if rc or stop:
                error = test.error or f"exit status {rc} at {size} bytes"
                break
    except BenchError as exc:
        error = str(exc)
        if not rows:
            raise
        sys.stderr.write(f"mrc bench: {exc}\n")
        rc = 1
    out.line("-" * len(HEAD))
    out.doc(sweep_document(opts, rows, len(opts.server), error))
    return rc


def main(opts: BenchOptions) -> int:
    """`mrc bench -c ADDR[,ADDR...] --sweep`: the sizes in turn, a row each."""
    return runner.run(opts, _client)
