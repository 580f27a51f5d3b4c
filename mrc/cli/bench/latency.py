"""`mrc bench --latency`: a WRITE_WITH_IMM ping-pong, reported like perftest's ib_write_lat.

Holds the client's role in the latency test kind of `proto` (`LatencyPing`: post message k,
time its echo, repeat), the percentile math (`percentile`, `latency_stats`), the text and `-J`
output of a latency run, and `main`, the latency mode's client: its node is `host`'s, its loop
`runner`'s. The server's role, which writes every message back as soon as its immediate
arrives, is `echo.LatencyEcho`, run by `server`. Times are round trips (ib_write_lat prints
half of one). Each side's CPU per round trip is reported too: the client's own, and the
server's from the summary it writes back when the client sends `IMM_END` (`proto`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
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
from mrc.core.session import Session
from mrc.io.endpoint import IoEndpoint
from mrc.io.loop import freeze_heap, loop_name

from . import runner
from .host import client_node, on_signals
from .options import BenchOptions
from .proto import (
    IMM_END,
    IMM_RESULTS,
    KIND_LATENCY,
    MAX_MESSAGES,
    BenchProtocolError,
    BenchReply,
    BenchRequest,
    RegionRef,
    decode_summary,
)
from .report import Output, connected_rows, implementation
from .setup import BenchError, TestSetup
from .state import RunState

__all__ = [
    "PERCENTILES",
    "LatencyPing",
    "latency_stats",
    "main",
    "percentile",
]

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


#: Seconds the client waits for the server's summary after its last round trip.
SUMMARY_TIMEOUT = 1.0


class LatencyPing:
    """The client's half: post message k, wait for the echo with imm k, time it, repeat; then
    ask the server for its summary (imm `IMM_END`) and wait for it (imm `IMM_RESULTS`) up to
    `SUMMARY_TIMEOUT`. A server that echoes `IMM_END` like any message (an older one) or does
    not answer in time leaves `server` None."""

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
        cpu_clock: Callable[[], float] = time.process_time,
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
        self.cpu_clock = cpu_clock
        #: This process's CPU seconds over the round trips (from `start` to the last echo).
        self.cpu_seconds = 0.0
        #: The server's summary (`echoes`, `cpu_seconds`), once it came.
        self.server: dict[str, Any] | None = None
        self._cpu0 = 0.0
        #: The round trips are over: waiting for the server's summary.
        self._summing = False
        self._k = 0
        self._sent_at = 0.0
        self._watch: asyncio.TimerHandle | None = None

    def start(self) -> None:
        freeze_heap()
        self.t0 = self.clock()
        self._cpu0 = self.cpu_clock()
        self._post(self._k)

    def _post(self, imm: int) -> None:
        assert self.setup.source is not None
        self._sent_at = self.clock()
        self.session.post_write(
            self.setup.source,
            0,
            self.setup.params.msg_size,
            self.peer_data.va,
            self.peer_data.rkey,
            imm=imm,
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
        if self._summing:
            self._end(self.t_end)  # no summary: the server's CPU stays unknown
        elif self._k == k:
            self.fail(f"no echo of message {k} within {self.answer_timeout:g} s")
        else:
            self._arm()

    def on_event(self, event: Event) -> None:
        if self.done:
            return
        if type(event) is ImmediateReceived:
            # The hot path first: the echo of the message in flight.
            now = self.clock()
            if event.imm != self._k or self._summing:
                self._other_immediate(event)
                return
            self.samples.append(now - self._sent_at)
            self._k += 1
            if self._finished(now):
                self._summary(now)
            else:
                self._post(self._k)
        elif isinstance(event, WriteCompleted) and event.status:
            self.write_errors += 1
            self.fail(f"a WRITE completed with status {event.status:#x}")
        elif isinstance(event, ConnectionClosed):
            self.fail(f"connection closed: {event.reason}")

    def _finished(self, now: float) -> bool:
        if self.iterations:
            return self._k >= self.iterations
        return now - self.t0 >= self.duration or self._k >= MAX_MESSAGES

    def _summary(self, now: float) -> None:
        """The round trips are over: stop the clocks, ask the server for its summary."""
        self.t_end = now
        self.cpu_seconds = self.cpu_clock() - self._cpu0
        self._summing = True
        self.cancel()
        self._watch = self.io.loop.call_later(SUMMARY_TIMEOUT, self._overdue, self._k)
        self._post(IMM_END)

    def _other_immediate(self, event: ImmediateReceived) -> None:
        if not self._summing:
            self.fail(f"echo with imm {event.imm}, expected {self._k}")
        elif event.imm == IMM_RESULTS:
            try:
                self.server = decode_summary(self.setup.inbox.view)
            except BenchProtocolError:
                self.server = None
            self._end(self.t_end)
        elif event.imm == IMM_END:
            self._end(self.t_end)  # an older server echoed it: no summary

    def cpu_per_round_trip(self) -> tuple[float | None, float | None]:
        """(client, server) CPU microseconds per round trip; None where unknown."""
        n = len(self.samples)
        if not n:
            return None, None
        server = None
        if self.server is not None:
            cpu, echoes = self.server.get("cpu_seconds"), self.server.get("echoes")
            if isinstance(cpu, (int, float)) and isinstance(echoes, int) and echoes > 0:
                server = round(cpu / echoes * 1e6, 2)
        return round(self.cpu_seconds / n * 1e6, 2), server

    def _end(self, now: float) -> None:
        self.t_end = now
        self.done = True
        self.cancel()
        self.on_done(self)

    def fail(self, reason: str) -> None:
        if self.done:
            return
        self.error = reason
        self._end(self.t_end if self._summing else self.clock())

    def cancel(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None


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
    cpu_client, cpu_server = ping.cpu_per_round_trip()
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
                # Process CPU per round trip, each side (the server's from its summary).
                "cpu_client_us_per_round_trip": cpu_client,
                "cpu_server_us_per_round_trip": cpu_server,
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


async def _client(opts: BenchOptions, state: RunState) -> int:
    """`mrc bench -c ADDR --latency`: one ping-pong test, then its table or -J document."""
    loop = asyncio.get_running_loop()
    out = Output(json_mode=opts.json)
    where = f"{','.join(opts.server)} port {opts.port}"
    setup: TestSetup | None = None
    session: Session | None = None
    ping: LatencyPing | None = None
    established: asyncio.Future[ConnectionEstablished] = loop.create_future()
    finished: asyncio.Future[None] = loop.create_future()

    def on_event(_session: Session, event: Event) -> None:
        if ping is not None:
            ping.on_event(event)
        elif isinstance(event, ConnectionEstablished) and not established.done():
            established.set_result(event)
        elif isinstance(event, ConnectionClosed) and not established.done():
            if event.reason.startswith("rejected"):
                msg = (
                    f"{where} refused the latency test ({event.reason}): the server is busy or "
                    "an mrc bench without --latency (bench protocol 1)"
                )
            else:
                msg = f"no answer from {where} ({event.reason})"
            established.set_exception(BenchError(msg))

    def interrupt() -> None:
        if ping is not None:
            ping.fail("interrupted")
        elif not established.done():
            established.set_exception(BenchError("interrupted"))

    node, peers, counts = client_node(loop, opts, state, on_event=on_event)
    on_signals(loop, interrupt)
    try:
        setup = TestSetup.latency(node.endpoint.regions, opts.msg_size)
        req = BenchRequest(
            cookie=node.rng.getrandbits(64),
            msg_size=opts.msg_size,
            duration=opts.duration if not opts.iterations else 0.0,
            results=setup.ref(setup.inbox),
            data=setup.ref(setup.data),
            kind=KIND_LATENCY,
            iterations=opts.iterations,
        )
        out.line(
            f"Connecting to host {','.join(opts.server)}, port {opts.port} (latency test; "
            f"{implementation()})"
        )
        node.start()
        try:
            config = opts.config(len(peers), counts)
            session = node.io.connect(config, peers, req.encode(), connect_sockets=True)
        except OSError as exc:
            raise BenchError(f"cannot reach {where}: {exc.strerror or exc}") from None
        est = await _established(node.io, session, established, opts.connect_timeout, where)
        try:
            reply = BenchReply.decode(est.private_data)
        except BenchProtocolError as exc:
            raise BenchError(f"{where} is not an mrc bench server ({exc})") from None
        if reply.cookie != req.cookie or reply.data.length < opts.msg_size:
            raise BenchError(f"{where} answered for another test")

        def done(_ping: LatencyPing) -> None:
            if not finished.done():
                finished.set_result(None)

        ping = LatencyPing(
            node.io,
            session,
            setup,
            reply.data,
            iterations=opts.iterations,
            duration=opts.duration,
            on_done=done,
        )
        rows = connected_rows(ping)
        ping.start()
        await finished
        return _latency_report(opts, out, ping, est, rows)
    finally:
        if ping is not None:
            ping.cancel()
        if session is not None and not session.is_closed and not node.io.closed:
            session.close(node.io.now())
            node.io.flush(session)
        if setup is not None:
            setup.release()
        for fut in (established, finished):
            if not fut.done():
                fut.cancel()
        node.close()


async def _established(
    io: IoEndpoint[Session],
    session: Session,
    fut: asyncio.Future[ConnectionEstablished],
    timeout: float,
    where: str,
) -> ConnectionEstablished:
    """The handshake's end, or one line: refused on every plane, rejected every time it was
    asked (a REJECT is a hint the requester retries past, docs/WIRE.md §6), or no answer."""
    deadline = io.now() + timeout
    while not fut.done():
        if io.now() >= deadline:
            fut.cancel()  # the attempt's own end, later, has nobody to tell
            if session.stats.drops_by_reason["cm_reject_hint"]:
                raise BenchError(
                    f"{where} refused the latency test (rejected every attempt for "
                    f"{timeout:g} s): the server is busy or an mrc bench without --latency "
                    "(bench protocol 1)"
                )
            raise BenchError(f"no answer from {where} within {timeout:g} s")
        refused = [s.counters["econnrefused"] for s in io.planes.values()]
        if refused and all(refused):
            raise BenchError(f"connection refused by {where} (is `mrc bench -s` running there?)")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(fut), 0.05)
    return fut.result()


def _latency_report(
    opts: BenchOptions,
    out: Output,
    ping: LatencyPing,
    est: ConnectionEstablished,
    rows: list[dict[str, Any]],
) -> int:
    if out.json_mode:
        out.doc(document(opts, ping, est, rows))
    elif ping.samples:
        stats = latency_stats(ping.samples)
        for line in text_lines(opts.msg_size, stats, len(ping.samples)):
            out.line(line)
        cli, srv = ping.cpu_per_round_trip()
        out.line(f"CPU per round trip: client {cli:.1f} us, server "
                 f"{'unknown' if srv is None else f'{srv:.1f} us'}")
    if ping.error:
        sys.stderr.write(f"mrc bench: latency test failed: {ping.error}\n")
        return 1
    return 0


def main(opts: BenchOptions) -> int:
    """`mrc bench -c ADDR[,ADDR...] --latency`: one ping-pong test."""
    return runner.run(opts, _client)
