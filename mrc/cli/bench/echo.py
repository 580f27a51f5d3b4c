"""The server's role in `mrc bench --latency`: write every message back as its immediate
arrives.

Holds `LatencyEcho`, which `server.BenchServer` runs on a session whose REQUEST named the
latency test kind (`proto`): each `ImmediateReceived(imm=k)` is answered at once with a
WRITE_WITH_IMM of the same size and imm k into the client's region, and a client that falls
silent ends the test. A message with imm `IMM_END` (the client is done) is answered instead
with this side's summary (echoes, CPU seconds since the first message) written into the
client's results inbox with imm `IMM_RESULTS` (`proto`). The client's role that times the
round trips is `latency.LatencyPing`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from mrc.core.events import ConnectionClosed, Event, ImmediateReceived, WriteCompleted
from mrc.core.session import Session
from mrc.io.endpoint import IoEndpoint

from .proto import IMM_END, IMM_RESULTS, RegionRef, encode_summary
from .report import host_port
from .setup import TestSetup

__all__ = ["LatencyEcho"]


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
        peer_results: RegionRef | None = None,
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
        #: The client's results inbox: this side's summary goes there when it is done.
        self.peer_results = peer_results
        #: Process CPU seconds at the first message (None before it).
        self.cpu0: float | None = None
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
        if type(event) is ImmediateReceived:
            self._heard = self.io.now()
            if self.session.is_closed:
                return
            if self.cpu0 is None:
                self.cpu0 = time.process_time()
            if event.imm == IMM_END and self.peer_results:
                self._send_summary()
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

    def cpu_seconds(self) -> float:
        """Process CPU seconds since the first message (0 before it)."""
        return 0.0 if self.cpu0 is None else time.process_time() - self.cpu0

    def _send_summary(self) -> None:
        """The client is done: write the echo count and CPU seconds into its results inbox."""
        assert self.peer_results is not None
        body = encode_summary({"echoes": self.echoes, "cpu_seconds": self.cpu_seconds()})
        if len(body) > self.peer_results.length:
            return  # an inbox too small for it: the client reports no server CPU
        self.setup.outbox.view[: len(body)] = body
        self.session.post_write(
            self.setup.outbox, 0, len(body), self.peer_results.va, self.peer_results.rkey,
            imm=IMM_RESULTS,
        )  # fmt: skip
        self.io.flush(self.session)

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
