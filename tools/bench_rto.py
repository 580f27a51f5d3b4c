"""Spurious timeouts on loopback, clean and under CPU hogs, as JSON (not a timed test).

    python -m tools.bench_rto [-n 1G] [--runs 5] [--hogs 2] [--stalls] [--latency N] > out.json

Runs `mrc bench` between four loopback planes on each side (server 127.0.0.2-5, client
127.0.0.6-9, a free port, `--verify`), `--runs` times clean and `--runs` times while `--hogs`
busy-looping CPython processes compete for the cores (started before each run, killed by pid
after it), and reports per run what issue 19 item 4 asks about (docs/DESIGN.md §6):

- `rto`: the client's resends caused by an expired RTO (`retransmits_by_cause.rto`);
- `duplicates`: the server's `duplicate` drops: packets that arrived twice;
- `packets_sent`: the client's data packets, resends included;
- `spurious_rto`: RTO resends that arrived as duplicates, bounded by min(rto, duplicates)
  (a duplicate may also be a RACK or completion resend, so this is an upper bound), and its
  share of `packets_sent` (the goal: 0 clean, under 0.1 % with two hogs).

`--stalls` adds runs whose client, then server, is frozen (SIGSTOP) 50 ms every 200 ms: a
stall of this host, then of the peer. `--latency N` adds N-round-trip `mrc bench --latency`
ping-pongs beside the hogs, each message a tail: every resend there beat the peer's answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.bench_daemon import A_PLANES, B_PLANES, ROOT, env, free_udp_port

MRC = [sys.executable, "-m", "mrc"]
HOG = "while True: pass"


@contextlib.contextmanager
def hogs(count: int) -> Iterator[list[int]]:
    """`count` busy-looping processes, killed (by pid) and reaped on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def stall_loop(pid: int, stall: float, every: float, done: threading.Event) -> None:
    """Freeze `pid` for `stall` seconds every `every` seconds (SIGSTOP/SIGCONT) until
    `done`: a host stall made on purpose, timers fire late and acknowledgements queue."""
    while not done.wait(every):
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stall)
        except ProcessLookupError:
            return
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def one_run(
    size: str, timeout: float, stall: str | None = None, stall_ms: float = 50.0
) -> dict[str, Any]:
    """One transfer: the client's and the server's `-J` reports, reduced to the counts.
    `stall` ("client" or "server") freezes that side `stall_ms` every 200 ms."""
    port = free_udp_port(A_PLANES + B_PLANES)
    servers, clients = ",".join(A_PLANES), ",".join(B_PLANES)
    with tempfile.TemporaryDirectory() as tmp:
        s_out = Path(tmp) / "server.json"
        with s_out.open("w") as sf:
            server = subprocess.Popen(
                [*MRC, "bench", "-s", "-1", "-B", servers, "-p", str(port), "-J"],
                stdout=sf,
                stderr=subprocess.DEVNULL,
                env=env(),
                cwd=ROOT,
                start_new_session=True,
            )
            try:
                time.sleep(1.0)  # the server binds its planes
                argv = [*MRC, "bench", "-c", servers, "-B", clients, "-p", str(port)]
                client = subprocess.Popen(
                    [*argv, "-n", size, "--verify", "-J"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env(),
                    cwd=ROOT,
                )
                done = threading.Event()
                staller = None
                if stall is not None:
                    target = client.pid if stall == "client" else server.pid
                    staller = threading.Thread(
                        target=stall_loop, args=(target, stall_ms / 1e3, 0.2, done)
                    )
                    staller.start()
                try:
                    c_out, c_err = client.communicate(timeout=timeout)
                finally:
                    done.set()
                    if staller is not None:
                        staller.join()
                    if client.poll() is None:
                        client.kill()
                        client.communicate()
                server.wait(timeout=10)
            finally:
                if server.poll() is None:
                    server.send_signal(signal.SIGKILL)
                    server.wait()
        if client.returncode != 0:
            return {"error": (c_err.strip().splitlines() or ["no output"])[-1]}
        c = json.loads(c_out)["end"]
        s = json.loads(s_out.read_text() or "{}").get("end", {})
    cm = c["mrc"]
    sent = sum(int(p["packets_sent"]) for p in cm["planes"])
    dups = int(s.get("mrc", {}).get("drops_by_reason", {}).get("duplicate", 0))
    rto = int(cm["retransmits_by_cause"].get("rto", 0))
    spurious = min(rto, dups)
    return {
        "gbit_s": round(c["sum_received"]["bits_per_second"] / 1e9, 3),
        "integrity": cm["integrity"],
        "packets_sent": sent,
        "rto": rto,
        "rack": int(cm["retransmits_by_cause"].get("rack", 0)),
        "completion": int(cm["retransmits_by_cause"].get("completion", 0)),
        "duplicates": dups,
        "spurious_rto": spurious,
        "spurious_rto_pct": round(100.0 * spurious / sent, 4) if sent else 0.0,
        "longest_stall_seconds": cm.get("longest_stall_seconds"),
    }


def latency_run(iterations: int, timeout: float) -> dict[str, Any]:
    """One WRITE_WITH_IMM ping-pong (`mrc bench --latency`): every message is a tail, so any
    resend is a probe or an RTO that beat the peer's answer."""
    port = free_udp_port(A_PLANES + B_PLANES)
    servers, clients = ",".join(A_PLANES), ",".join(B_PLANES)
    server = subprocess.Popen(
        [*MRC, "bench", "-s", "-1", "-B", servers, "-p", str(port), "-J"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env(),
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        time.sleep(1.0)
        argv = [*MRC, "bench", "-c", servers, "-B", clients, "-p", str(port), "--latency"]
        client = subprocess.run(
            [*argv, "--iterations", str(iterations), "-J"],
            capture_output=True,
            text=True,
            env=env(),
            cwd=ROOT,
            timeout=timeout,
            check=False,
        )
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGKILL)
        server.wait()
    if client.returncode != 0:
        return {"error": (client.stderr.strip().splitlines() or ["no output"])[-1]}
    end = json.loads(client.stdout)["end"]
    lat = end["latency"]
    resends = int(end.get("retransmits", 0))
    return {
        "round_trips": int(lat["samples"]),
        "p50_us": lat["p50"],
        "p99_us": lat["p99"],
        "p99_9_us": lat["p99_9"],
        "max_us": lat["max"],
        "resends": resends,
        "resends_pct": round(100.0 * resends / max(1, int(lat["samples"])), 4),
    }


def summary(runs: list[dict[str, Any]], goal_pct: float) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    worst = max((r["spurious_rto_pct"] for r in ok), default=None)
    return {
        "runs": runs,
        "rto_total": sum(r["rto"] for r in ok),
        "duplicates_total": sum(r["duplicates"] for r in ok),
        "worst_spurious_rto_pct": worst,
        "goal_pct": goal_pct,
        "met": len(ok) == len(runs) and worst is not None and worst <= goal_pct,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_rto", description=__doc__)
    ap.add_argument("-n", default="1G", help="bytes per run (mrc bench -n)")
    ap.add_argument("--runs", type=int, default=5, help="runs clean, and as many with hogs")
    ap.add_argument("--hogs", type=int, default=2, help="busy-looping processes in hog runs")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    ap.add_argument(
        "--stalls",
        action="store_true",
        help="also runs whose client, then server, is frozen 50 ms every 200 ms",
    )
    ap.add_argument(
        "--latency",
        type=int,
        default=0,
        metavar="N",
        help="also N-round-trip --latency ping-pongs beside the hogs (resends per round trip)",
    )
    args = ap.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"clean": [], f"hogs_{args.hogs}": []}
    if args.stalls:
        runs["client_stalls"], runs["server_stalls"] = [], []
    for _ in range(args.runs):
        # Paired: one run of each kind in turn, so drifts in the host hit them alike.
        runs["clean"].append(one_run(args.n, args.timeout))
        with hogs(args.hogs):
            runs[f"hogs_{args.hogs}"].append(one_run(args.n, args.timeout))
        if args.stalls:
            runs["client_stalls"].append(one_run(args.n, args.timeout, "client"))
            runs["server_stalls"].append(one_run(args.n, args.timeout, "server"))
    report: dict[str, Any] = {"size": args.n}
    for kind, got in runs.items():
        report[kind] = summary(got, 0.0 if kind == "clean" else 0.1)
    if args.latency:
        pongs = []
        for _ in range(args.runs):
            with hogs(args.hogs):
                pongs.append(latency_run(args.latency, args.timeout))
        report[f"latency_hogs_{args.hogs}"] = {"runs": pongs}
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
