"""The latency and message-size runs: `mrc bench --latency` next to UDP and TCP ping-pong, and
`mrc bench --sweep` summarised for the small-message goals (issue 36, `report.GOALS`).

Each `run_*` takes the `runs.Bed` (server in h2, client in h1, plane 0 for the single-path
peers) and returns a result dict; failures raise `procs.ProcError` with one line. The
ping-pong programs are `tools.compare.pingpong`; the printed tables and goal checks are
`report`'s.
"""

from __future__ import annotations

from typing import Any

from tools.compare import procs
from tools.compare.procs import Proc, ProcError
from tools.compare.runs import MRC_PORT, Bed, finish, mrc_procs

PING_PORT = 5601
#: Round trips of each latency run (about a second for mrc on this class of machine).
LATENCY_ITERATIONS = 5000
LATENCY_BYTES = 64
#: Seconds per size of the sweep: 13 sizes, about 20 s with the handshakes.
SWEEP_SECONDS = 1.0
#: The sizes the goals read (issue 36): 4 KiB and 64 KiB goodput against 1 MiB's (WRITEs/s at
#: 4 KiB, issue 19's absolute goal, is still reported).
SMALL, MEDIUM, LARGE = 4 << 10, 64 << 10, 1 << 20
KEYS = ("min", "mean", "p50", "p90", "p99", "p99_9", "max", "stdev")


def _pick(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: doc[k] for k in ("samples", *KEYS)}


def run_pingpong(bed: Bed, proto: str, count: int = LATENCY_ITERATIONS,
                 size: int = LATENCY_BYTES) -> dict[str, Any]:
    """The kernel's UDP or TCP round trip over plane 0, blocking sockets, TCP_NODELAY."""
    mod = [bed.python, "-m", "tools.compare.pingpong"]
    port = str(PING_PORT + (proto == "tcp"))
    server = Proc(bed.ns2, [*mod, "serve", proto, "--bind", bed.a2[0], "--port", port],
                  f"{proto} ping-pong server", pipe_stdout=True)
    if server.readline(30) != "READY":
        server.kill()
        raise ProcError(f"{proto} ping-pong server: did not start: {server.stderr_tail()}")
    client = Proc(bed.ns1, [*mod, "ping", proto, "--connect", bed.a2[0], "--port", port,
                            "-l", str(size), "-n", str(count)], f"{proto} ping-pong")
    finish(client, server, bed.timeout)
    doc = client.json()
    return {"bytes": size, "planes": 1, **_pick(doc), "lost": doc.get("lost", 0)}


def run_mrc_latency(bed: Bed, extra: list[str], count: int = LATENCY_ITERATIONS,
                    size: int = LATENCY_BYTES) -> dict[str, Any]:
    """`mrc bench --latency` over every plane (WRITE_WITH_IMM there and back)."""
    what = ["--latency", "--iterations", str(count), "-l", str(size)]
    server, client = mrc_procs(bed, what, extra)
    finish(client, server, bed.timeout)
    doc = client.json()
    bed.keep("mrc-latency-client.json", doc)
    lat = doc["end"]["latency"]
    if doc["end"].get("error"):
        raise ProcError(f"mrc bench --latency: {doc['end']['error']}")
    return {"bytes": size, "planes": bed.planes, **_pick(lat),
            "retransmits": doc["end"].get("retransmits"),
            # CPU per round trip of each side (`mrc bench --latency -J`, the server's through
            # the bench protocol); None from a bench that does not report it.
            "cpu_client_us": lat.get("cpu_client_us_per_round_trip"),
            "cpu_server_us": lat.get("cpu_server_us_per_round_trip")}


def sweep_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The numbers the small-message goals name, from a `--sweep` document's rows: 4 KiB
    WRITEs a second (issue 19), and 4 KiB and 64 KiB goodput over 1 MiB's (issue 36)."""
    by = {r["bytes"]: r for r in rows}
    small = by.get(SMALL, {}).get("messages_per_second")
    small_bps = by.get(SMALL, {}).get("bits_per_second")
    medium = by.get(MEDIUM, {}).get("bits_per_second")
    large = by.get(LARGE, {}).get("bits_per_second")
    return {"writes_per_s_4k": small,
            "goodput_4k_over_1m": round(small_bps / large, 4) if small_bps and large else None,
            "goodput_64k_over_1m": round(medium / large, 4) if medium and large else None}


def run_mrc_sweep(bed: Bed, extra: list[str], seconds: float = SWEEP_SECONDS) -> dict[str, Any]:
    """`mrc bench --sweep --verify`, 4 KiB .. 16 MiB, `seconds` each, against a server that
    serves every size (no -1: each size is its own test)."""
    mod = [bed.python, "-m", "mrc", "bench"]
    server = Proc(bed.ns2, [*mod, "-s", "-B", ",".join(bed.a2), "-p", str(MRC_PORT), "-J"],
                  "mrc sweep server")
    procs.wait_listening(bed.ns2, MRC_PORT, udp=True, proc=server)
    client = Proc(bed.ns1, [*mod, "-c", ",".join(bed.a2), "-B", ",".join(bed.a1),
                            "-p", str(MRC_PORT), "-J", "--sweep", "-t", f"{seconds:g}",
                            "--verify", *extra], "mrc sweep client")
    client.wait(bed.timeout)
    server.kill()
    doc = client.json()
    bed.keep("mrc-sweep-client.json", doc)
    rows = doc["sweep"]
    if doc["end"].get("error"):
        raise ProcError(f"mrc bench --sweep: {doc['end']['error']}")
    bad = [r["bytes"] for r in rows if r["integrity"] != "ok"]
    out = {"rows": rows, **sweep_summary(rows)}
    if bad:
        out["warning"] = f"integrity not ok at {bad}"
    return out
