"""One rank of the training job: a loop of steps, each an all-reduce then a fixed compute time.

    python -m tools.job.rank --transport mrc --rank R --world W --socket S --peers h1,h2,...
    python -m tools.job.rank --transport tcp|mptcp --rank R --world W --addresses a1,a2,...

Started by `runner` inside the rank's host namespace. It opens its communicator
(`mrc.collective`), runs one warm-up all-reduce, prints `{"ready": R}` and waits for the line
`go T0` on stdin (T0 a `time.monotonic()` value: every namespace shares the clock). From T0 it
runs steps back to back and prints one JSON line per step: `step`, `start`, `collective` and
`end` (seconds after T0), `ok`, `verified`, `error`, `restarted`.

The data: rank r's array holds `i mod 251 + (r + 1)(s mod 13 + 1)` at element i in step s
(float32, exact in every sum), so every element of the all-reduced result is checked against
its known value. One more element carries the rank's vote to stop: the job ends after the step
whose sum of votes is non-zero, so every rank stops after the same step. A rank votes once it
has run `--steps` steps and `--until` seconds have passed, or `--deadline` has.

A failed step (the collective raised `CollectiveError`, timed out, or the result was wrong)
counts as failed and the job goes on with a new communicator, as NCCL jobs restart theirs:
the rank closes the spent one and opens the next at the next restart slot (every `--restart`
seconds after T0, so ranks that failed at slightly different moments meet on the same
generation: the mrc `group` and the TCP ports follow the slot number), then the ranks agree on
the next step by an all-reduce of `max` over their step numbers (a rank that finished a step
the others lost moves them forward; the steps skipped count as failed). The failed step's end
is when the new communicator is ready: the job stood still until then.

At the end every rank passes a barrier before it closes its communicator: a rank can have its
result while its last chunks to the next rank are still in flight, and closing at once would
cancel them (a barrier that fails is reported in the last line, `teardown`, not as a step). A
failed mrc step also records the local daemon's view of the connections that had WRITEs
outstanding (`daemon`: per path, its EVs' states and retransmits).

What it leaves to others: the collectives (`mrc.collective`), the fabric and the faults
(`runner`, `inject`), the figures (`stats`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

from mrc.client import Client, ClientError

RESIDUE = 251  # the data's pattern: small integers, exact in float32 sums of a few ranks
CYCLE = 13
#: TCP ports: rank i of generation g listens on --port + (g mod this) x world + i
PORT_GENERATIONS = 50


class RankError(Exception):
    """Bad arguments or a missing dependency; one line."""


def expected(np: Any, base: Any, world: int, step: int) -> Any:
    """The all-reduced payload of step `step` (without the vote element)."""
    return base * np.float32(world) + np.float32((step % CYCLE + 1) * world * (world + 1) // 2)


def contribution(np: Any, base: Any, rank: int, step: int, vote: bool) -> Any:
    """Rank `rank`'s array in step `step`: the payload, then its stop vote."""
    arr = np.empty(base.size + 1, dtype=np.float32)
    arr[:-1] = base
    arr[:-1] += np.float32((rank + 1) * (step % CYCLE + 1))
    arr[-1] = 1.0 if vote else 0.0
    return arr


class Rank:
    """The step loop of one rank, over communicators `open_comm(generation)` makes."""

    def __init__(self, ns: argparse.Namespace, np: Any, collective: Any) -> None:
        self.ns = ns
        self.np = np
        self.collective = collective
        self.n = max(1, ns.size // 4)
        self.base = np.arange(self.n, dtype=np.float32) % RESIDUE
        self.t0 = 0.0
        self.comm: Any = None

    def open_comm(self, generation: int, timeout: float) -> Any:
        ns = self.ns
        if ns.transport == "mrc":
            return self.collective.open_mrc(ns.socket, ns.rank, ns.world, ns.peers.split(","),
                                            timeout=timeout, group=f"job{ns.tag}g{generation}")
        hosts = ns.addresses.split(",")
        base = ns.port + (generation % PORT_GENERATIONS) * ns.world
        addrs = [(h, base + i) for i, h in enumerate(hosts)]
        return self.collective.open_tcp(ns.rank, ns.world, addrs,
                                        mptcp=ns.transport == "mptcp", timeout=timeout)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def emit(self, doc: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    def vote(self, done: int) -> bool:
        t = self.now()
        steps, until, deadline = int(self.ns.steps), float(self.ns.until), float(self.ns.deadline)
        return (done >= steps and t >= until) or t >= deadline

    def step(self, s: int, vote: bool) -> tuple[bool, str | None, bool]:
        """Run step `s`'s all-reduce: (verified, error, stop)."""
        np = self.np
        arr = contribution(np, self.base, self.ns.rank, s, vote)
        out = self.comm.all_reduce(arr, "sum", timeout=self.ns.timeout)
        want = expected(np, self.base, self.ns.world, s)
        good = out.shape == arr.shape and bool(np.array_equal(out[:-1], want))
        votes = float(out[-1]) if out.shape == arr.shape else 0.0
        return good, None if good else "result differs from the expected sum", votes > 0

    def daemon_view(self) -> list[dict[str, Any]]:
        """mrc: the local daemon's open application connections that a failed step left with
        writes outstanding, failed or retransmitted (and each plane's state), for the JSON;
        [] otherwise."""
        if self.ns.transport != "mrc":
            return []
        keep = ("peer", "kind", "state", "outstanding", "writes_failed", "retransmits", "planes")
        out = []
        try:
            with Client(self.ns.socket, connect_timeout=1.0) as c:
                for r in c.connections():
                    if (r.get("kind") != "app" or r.get("state") == "closed" or not (
                            r.get("outstanding") or r.get("writes_failed")
                            or r.get("retransmits"))):
                        continue
                    row = {k: r.get(k) for k in keep}
                    # each path's EVs by state, and the retransmits sent on them
                    paths: dict[str, dict[str, int]] = {}
                    for ev in c.evs(int(r["connection"])):
                        key = f"p{ev.get('plane')}/{ev.get('path')}"
                        d = paths.setdefault(key, {"retransmits": 0})
                        d[str(ev.get("state"))] = d.get(str(ev.get("state")), 0) + 1
                        d["retransmits"] += int(ev.get("retransmits") or 0)
                    row["paths"] = paths
                    out.append(row)
        except (ClientError, OSError, KeyError, ValueError) as exc:
            return [{"error": str(exc)}]
        return out

    def drop(self) -> None:
        """Close the spent communicator; one that fails to close is dropped anyway."""
        comm, self.comm = self.comm, None
        if comm is not None:
            with contextlib.suppress(Exception):
                comm.close()

    def restart(self, generation: int, s: int, done: int) -> tuple[int, int, bool]:
        """A new communicator at the next restart slot, and the step every rank goes on with:
        (generation, next step, stop). Ends when the deadline has passed (stop)."""
        np = self.np
        ns = self.ns
        self.drop()
        while True:
            slot = int(self.now() // ns.restart) + 1
            generation = max(generation + 1, slot)
            at = generation * ns.restart
            if at >= ns.deadline:
                return generation, s, True
            time.sleep(max(0.0, at - self.now()))
            try:
                self.comm = self.open_comm(generation, ns.restart * 0.8)
                agreed = self.comm.all_reduce(
                    np.array([s, 1 if self.vote(done) else 0], dtype=np.int64), "max",
                    timeout=ns.timeout)
                return generation, int(agreed[0]), bool(agreed[1])
            except self.collective.CollectiveError:
                self.drop()

    def run(self) -> int:
        ns = self.ns
        self.comm = self.open_comm(0, ns.open_timeout)
        warm = contribution(self.np, self.base, ns.rank, 0, False)
        self.comm.all_reduce(warm, "sum", timeout=ns.open_timeout)
        self.emit({"ready": ns.rank})
        line = sys.stdin.readline().split()
        if len(line) != 2 or line[0] != "go":
            raise RankError(f"expected 'go T0' on stdin, got {' '.join(line)!r}")
        self.t0 = float(line[1])
        time.sleep(max(0.0, -self.now()))
        s, done, generation, restarted = 0, 0, 0, False
        while True:
            vote = self.vote(done + 1)  # after this step, would it have done enough?
            start = self.now()
            raised = False
            try:
                good, error, stop = self.step(s, vote)
            except self.collective.CollectiveError as exc:
                raised = True
                good, error, stop = False, (str(exc).splitlines() or [""])[0][:300], False
            coll = self.now()
            if good:
                time.sleep(ns.compute)
                self.emit({"step": s, "start": round(start, 6), "collective": round(coll, 6),
                           "end": round(self.now(), 6), "ok": True, "verified": True,
                           "error": None, "restarted": restarted})
                restarted = False
                done += 1
                s += 1
                if stop:
                    break
                continue
            # failed: a wrong result is as bad as a lost one; restart either way
            daemon = self.daemon_view()
            generation, nxt, stop = self.restart(generation, s + 1, done + 1)
            self.emit({"step": s, "start": round(start, 6), "collective": round(coll, 6),
                       "end": round(self.now(), 6), "ok": not raised, "verified": False,
                       "error": error, "restarted": restarted}
                      | ({"daemon": daemon} if daemon else {}))
            for skipped in range(s + 1, nxt):
                t = round(self.now(), 6)
                self.emit({"step": skipped, "start": t, "collective": t, "end": t, "ok": False,
                           "verified": False, "error": "skipped: the ranks resynchronised past "
                           "it", "restarted": True})
            restarted = True
            done += nxt - s
            s = max(nxt, s + 1)
            if stop:
                break
        teardown = None
        if self.comm is not None:
            # A rank may have its result while its last chunks to the next rank are still on
            # their way; closing at once would cancel them. Past a barrier every rank has its
            # result. A failed barrier is not a failed step; it is reported in the last line.
            try:
                self.comm.barrier(timeout=ns.timeout)
            except self.collective.CollectiveError as exc:
                teardown = (str(exc).splitlines() or [""])[0][:300]
            self.drop()
        self.emit({"done": ns.rank, "steps": s, "generations": generation + 1,
                   "teardown": teardown})
        return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.job.rank",
                                description="one rank of the training job (see tools.job)")
    p.add_argument("--transport", choices=("mrc", "tcp", "mptcp"), required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--socket", help="mrc: the local daemon's control socket")
    p.add_argument("--peers", help="mrc: every rank's daemon host name, in rank order")
    p.add_argument("--addresses", help="tcp/mptcp: every rank's listen address, in rank order")
    p.add_argument("--port", type=int, default=29500, help="tcp/mptcp: base listen port")
    p.add_argument("--tag", default="", help="mrc: part of the communicator group name")
    p.add_argument("--size", type=int, default=4 << 20, help="bytes per all-reduce (float32)")
    p.add_argument("--steps", type=int, default=30, help="run at least this many steps")
    p.add_argument("--until", type=float, default=0.0, help="... and at least this long (s)")
    p.add_argument("--deadline", type=float, default=120.0, help="stop after this long (s)")
    p.add_argument("--compute", type=float, default=0.05, help="compute time per step (s)")
    p.add_argument("--timeout", type=float, default=5.0, help="per all-reduce (s)")
    p.add_argument("--restart", type=float, default=6.0, help="restart slot (s)")
    p.add_argument("--open-timeout", type=float, default=60.0, help="the first open (s)")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        if not 0 <= ns.rank < ns.world or ns.world < 2:
            raise RankError(f"rank {ns.rank} of world {ns.world}: want 0 <= rank < world, "
                            "world >= 2")
        if ns.transport == "mrc" and not (ns.socket and ns.peers):
            raise RankError("--transport mrc needs --socket and --peers")
        if ns.transport != "mrc" and not ns.addresses:
            raise RankError(f"--transport {ns.transport} needs --addresses")
        if ns.size < 4 or ns.restart <= 0 or ns.timeout <= 0 or ns.compute < 0:
            raise RankError("want --size >= 4, --restart > 0, --timeout > 0, --compute >= 0")
        try:
            import numpy as np

            import mrc.collective as collective
        except ImportError as exc:
            raise RankError(f"needs numpy and mrc.collective ({exc})") from None
        return Rank(ns, np, collective).run()
    except RankError as exc:
        sys.stderr.write(f"job rank: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the first open failed, or a closed stdin: one line, not a trace
        sys.stderr.write(f"job rank {ns.rank}: {type(exc).__name__}: {exc}\n")
        return 1
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
