"""`mrc bench --sweep`: the message sizes of a sweep, one row per size, and the sweep's output.

Holds `sweep_sizes` (powers of two from A to B, as perftest's `ib_write_bw -a` walks them),
`sweep_row` (one finished stream test as a row: Gbit/s, WRITEs completed per second, both
sides' CPU, retransmits, integrity), the text table in the shape of ib_write_bw's and the `-J`
document with its `sweep` list. Each size is an ordinary stream test of `bench_proto` on its
own connection (the protocol names one message size per test); running them is
`bench_modes`'s, the test itself `bench_roles`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .bench_options import BenchOptions
from .bench_report import fmt_bytes
from .bench_roles import BenchTest

__all__ = ["DEFAULT_SWEEP", "SWEEP_SECONDS", "sweep_document", "sweep_row", "sweep_sizes"]

#: `ib_write_bw -a`'s range cut to what a bulk transport is for: 4 KiB .. 16 MiB.
DEFAULT_SWEEP = (4 << 10, 16 << 20)
#: Seconds per size by default: 13 sizes, so a sweep takes about 15 s with the handshakes.
SWEEP_SECONDS = 1.0
HEAD = (
    f" {'#bytes':<9}{'#messages':>10}{'seconds':>9}{'Gbit/s':>9}{'msgs/s':>11}"
    f"{'CPU% cli':>10}{'CPU% srv':>10}{'retrans':>9}  integrity"
)


def sweep_sizes(lo: int, hi: int) -> tuple[int, ...]:
    """lo, 2·lo, 4·lo … up to hi (both powers of two, lo <= hi)."""
    for name, v in (("first", lo), ("last", hi)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"the {name} sweep size must be a power of two, got {v}")
    if lo > hi:
        raise ValueError(f"sweep sizes run upwards: {lo} > {hi}")
    out = []
    size = lo
    while size <= hi:
        out.append(size)
        size <<= 1
    return tuple(out)


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
        f"Sweep to host {','.join(opts.server)}, port {opts.port}: WRITEs of "
        f"{fmt_bytes(sizes[0]).strip()} .. {fmt_bytes(sizes[-1]).strip()} "
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
