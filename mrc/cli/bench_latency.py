"""`mrc bench --latency`: a WRITE_WITH_IMM ping-pong, reported like perftest's ib_write_lat.

Holds both ends of the latency test kind of `bench_proto` (`LatencyPing`, the client that
times each round trip; `LatencyEcho`, the server's side that writes every message back as soon
as its immediate arrives), the percentile math (`percentile`, `latency_stats`), the text and
`-J` output of a latency run. Sockets, the event loop and the handshake are `bench_modes`'s
(client) and `bench_server`'s (server). Times are round trips (ib_write_lat prints half of
one).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from mrc.core.events import (
    ConnectionClosed,
    ConnectionEstablished,
    Event,
    ImmediateReceived,
    WriteCompleted,
)
from mrc.core.memory import RegionTable
from mrc.core.session import Session
from mrc.io.endpoint import IoEndpoint
from mrc.io.loop import freeze_heap, loop_name

from .bench_options import BenchOptions
from .bench_proto import (
    MAX_MESSAGES,
    RegionRef,
)
from .bench_report import host_port
from .bench_setup import RECEIVER, TestParams, TestSetup

__all__ = [
    "PERCENTILES",
    "LatencyEcho",
    "LatencyPing",
    "allocate",
    "latency_stats",
    "percentile",
]

DEFAULT_ITERATIONS = 10_000
DEFAULT_LATENCY_SIZE = 64
#: The percentiles reported, as (-J key, percent).
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_9", 99.9))


def percentile(ordered: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile of ascending `ordered`: the smallest sample with at least
    `pct` % of the samples at or below it (so every value reported was measured)."""
    if not ordered:
        raise ValueError("no samples")
    if not 0 < pct <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {pct:g}")
    # round() first: 99.9 % of 1000 is 999.0000000000001 in binary, which must not become 1000.
    rank = math.ceil(round(pct / 100 * len(ordered), 9))
    return ordered[max(1, rank) - 1]


def latency_stats(samples: Sequence[float]) -> dict[str, float]:
    """min, mean, the `PERCENTILES`, max and the standard deviation of `samples` (seconds), in
    microseconds rounded to 0.01."""
    ordered = sorted(samples)
    n = len(ordered)
    mean = sum(ordered) / n if n else 0.0
    var = sum((x - mean) ** 2 for x in ordered) / n if n else 0.0
    stats = {"min": ordered[0] if n else 0.0, "mean": mean}
    for key, pct in PERCENTILES:
        stats[key] = percentile(ordered, pct) if n else 0.0
    stats["max"] = ordered[-1] if n else 0.0
    stats["stdev"] = math.sqrt(var)
    return {k: round(v * 1e6, 2) for k, v in stats.items()}


def allocate(regions: RegionTable, msg_size: int) -> TestSetup:
    """Regions of one latency side: the results inbox/outbox, one slot the peer writes into
    (`data`) and one this side writes from (`source`; zeros, never changed, so a message can
    be posted again while the last one is still unacknowledged)."""
    setup = TestSetup.allocate(regions, RECEIVER, TestParams(msg_size=msg_size), 1)
    setup.source = regions.register(bytearray(msg_size))
    return setup


class LatencyPing:
    """The client's half: post message k, wait for the echo with imm k, time it, repeat."""

    def __init__(
        self,
        io: IoEndpoint[Session],
        session: Session,
        setup: TestSetup,
        peer_data: RegionRef,
        *,
        iterations: int,
        duration: float,
        on_done: Callable[[LatencyPing], None],
        answer_timeout: float = 5.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.io = io
        self.session = session
        self.setup = setup
        self.peer_data = peer_data
        self.iterations = iterations
        self.duration = duration
        self.on_done = on_done
        self.answer_timeout = answer_timeout
        self.clock = clock
        self.samples: list[float] = []
        self.error: str | None = None
        self.done = False
        self.write_errors = 0
        self.t0 = 0.0
        self.t_end = 0.0
        self._k = 0
        self._sent_at = 0.0
        self._watch: asyncio.TimerHandle | None = None

    def start(self) -> None:
        freeze_heap()
        self.t0 = self.clock()
        self._post()

    def _post(self) -> None:
        assert self.setup.source is not None
        self._sent_at = self.clock()
        self.session.post_write(
            self.setup.source,
            0,
            self.setup.params.msg_size,
            self.peer_data.va,
            self.peer_data.rkey,
            imm=self._k,
        )
        self.io.flush(self.session)
        if self._watch is None:
            self._arm()

    def _arm(self) -> None:
        k = self._k
        self._watch = self.io.loop.call_later(self.answer_timeout, self._overdue, k)

    def _overdue(self, k: int) -> None:
        self._watch = None
        if self.done:
            return
        if self._k == k:
            self.fail(f"no echo of message {k} within {self.answer_timeout:g} s")
        else:
            self._arm()

    def on_event(self, event: Event) -> None:
        if self.done:
            return
        if isinstance(event, ImmediateReceived):
            now = self.clock()
            if event.imm != self._k:
                self.fail(f"echo with imm {event.imm}, expected {self._k}")
                return
            self.samples.append(now - self._sent_at)
            self._k += 1
            if self._finished(now):
                self._end(now)
            else:
                self._post()
        elif isinstance(event, WriteCompleted) and event.status:
            self.write_errors += 1
            self.fail(f"a WRITE completed with status {event.status:#x}")
        elif isinstance(event, ConnectionClosed):
            self.fail(f"connection closed: {event.reason}")

    def _finished(self, now: float) -> bool:
        if self.iterations:
            return self._k >= self.iterations
        return now - self.t0 >= self.duration or self._k >= MAX_MESSAGES

    def _end(self, now: float) -> None:
        self.t_end = now
        self.done = True
        self.cancel()
        self.on_done(self)

    def fail(self, reason: str) -> None:
        if self.done:
            return
        self.error = reason
        self._end(self.clock())

    def cancel(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None


class LatencyEcho:
    """The server's half: every immediate that arrives is written straight back. A client
    that falls silent for `idle_timeout` (it died without hanging up) ends the test, so its
    regions do not stay registered for good."""

    def __init__(
        self,
        io: IoEndpoint[Session],
        session: Session,
        setup: TestSetup,
        peer_data: RegionRef,
        *,
        on_end: Callable[[LatencyEcho], None],
        idle_timeout: float = 5.0,
    ) -> None:
        self.io = io
        self.session = session
        self.setup = setup
        self.peer_data = peer_data
        self.on_end = on_end
        self.idle_timeout = idle_timeout
        self.echoes = 0
        self.write_errors = 0
        self.error: str | None = None
        self.t0 = time.perf_counter()
        self._heard = io.now()
        self._watch: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._watch = self.io.loop.call_later(1.0, self._check)

    def cancel(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def _check(self) -> None:
        self._watch = None
        now = self.io.now()
        if now - self._heard <= self.idle_timeout:
            self._watch = self.io.loop.call_later(1.0, self._check)
            return
        self.error = f"no message from the client for {self.idle_timeout:g} s"
        if not self.session.is_closed:
            self.session.close(now)
            self.io.flush(self.session)
        self.on_end(self)

    def on_event(self, event: Event) -> None:
        if isinstance(event, ImmediateReceived):
            self._heard = self.io.now()
            if self.session.is_closed:
                return
            assert self.setup.source is not None
            self.session.post_write(
                self.setup.source,
                0,
                self.setup.params.msg_size,
                self.peer_data.va,
                self.peer_data.rkey,
                imm=event.imm,
            )
            self.echoes += 1
            self.io.flush(self.session)
        elif isinstance(event, WriteCompleted) and event.status:
            self.write_errors += 1
        elif isinstance(event, ConnectionClosed) and event.reason != "disconnect":
            # Our own close after the silence timer keeps the timer's reason.
            self.error = self.error or f"connection closed: {event.reason}"

    def line(self) -> str:
        host, port = host_port(
            self.session.peer_addrs.get(min(self.session.peer_addrs, default=0), ("?", 0))
        )
        status = f", {self.error}" if self.error else ""
        errors = f", {self.write_errors} write errors" if self.write_errors else ""
        return (
            f"Latency test from {host}, port {port}: {self.echoes} echoes of "
            f"{self.setup.params.msg_size} bytes in {time.perf_counter() - self.t0:.2f} s"
            f"{errors}{status}"
        )

    def document(self) -> dict[str, Any]:
        return {
            "latency_server": {
                "echoes": self.echoes,
                "bytes": self.setup.params.msg_size,
                "write_errors": self.write_errors,
                "error": self.error,
            }
        }


# -- the client ---------------------------------------------------------------------------------

COLUMNS = ("min", "p50", "mean", "p90", "p99", "p99_9", "max", "stdev")
HEADS = ("t_min", "t_p50", "t_avg", "t_p90", "t_p99", "t_p99.9", "t_max", "t_stdev")


def text_lines(msg_size: int, stats: dict[str, float], n: int) -> list[str]:
    """ib_write_lat's table, in round-trip microseconds."""
    rule = "-" * 104
    head = " #bytes #iterations " + "".join(f"{h + '[us]':>12}" for h in HEADS)
    row = f" {msg_size:<6} {n:<11} " + "".join(f"{stats[c]:>12.2f}" for c in COLUMNS)
    return [rule, head, row, rule, "(round-trip times: WRITE_WITH_IMM there, and back)"]


def document(
    opts: BenchOptions, ping: LatencyPing, est: ConnectionEstablished, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    stats = latency_stats(ping.samples)
    return {
        "start": {
            "connecting_to": {"host": ",".join(opts.server), "port": opts.port},
            "connected": rows,
            "test_start": {
                "protocol": "MRC",
                "test": "latency",
                "num_planes": bin(est.plane_mask).count("1"),
                "bytes": ping.setup.params.msg_size,
                "iterations": ping.iterations,
                "duration": ping.duration,
                "payload_mtu": est.payload_mtu,
                "cc": opts.cc,
            },
            "event_loop": loop_name(asyncio.get_running_loop()),
        },
        "end": {
            "latency": {
                "unit": "us",
                "round_trip": True,
                "samples": len(ping.samples),
                "seconds": round(ping.t_end - ping.t0, 6),
                **stats,
            },
            "retransmits": ping.session.stats.retransmits,
            # Every datagram this side sent (data, ACKs, probes) per round trip: what a round
            # trip costs beyond its one message.
            "datagrams_sent_per_round_trip": round(
                sum(s.packets_sent for s in ping.io.planes.values()) / max(1, len(ping.samples)),
                2,
            ),
            "error": ping.error,
        },
    }
