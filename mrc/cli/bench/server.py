"""`mrc bench -s`: the benchmark server, for every mode that runs in-process.

Holds `BenchServer`: it listens on every plane, accepts a test when the REQUEST's private data
parses (`proto`) and it has room (at most `max_tests` at once), registers that test's regions,
runs it (`stream`, writing or receiving; a latency test is `echo.LatencyEcho`, which answers
each message), reports it (`report`), and survives any input: junk is counted by the core,
stray connections that never run a test are closed after a few seconds and their drops folded
into the next report. Its node comes in from the caller: `main` (`host.server_node`, run by
`runner`) or the demo.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections import Counter
from collections.abc import Callable

from mrc.core.events import ConnectionClosed, ConnectionEstablished, Event
from mrc.core.session import Session
from mrc.core.trace import TraceLog
from mrc.io.endpoint import IoEndpoint
from mrc.io.loop import loop_name
from mrc.node import EventsHandler, Node

from . import runner
from .echo import LatencyEcho
from .host import on_signals, server_node
from .options import BenchOptions
from .proto import KIND_LATENCY, BenchProtocolError, BenchReply, BenchRequest, slot_count
from .report import (
    Output,
    StartInfo,
    connected_rows,
    host_port,
    implementation,
    interval_printer,
    json_document,
    security_line,
    summary_lines,
    test_start_info,
)
from .setup import RECEIVER, WRITER, IntervalSample, TestParams, TestSetup, record_paths
from .state import RunState
from .stream import BenchTest

__all__ = ["BenchServer", "main"]


class BenchServer:
    """`mrc bench -s`: serves tests until stopped (or one test with -1)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: BenchOptions,
        state: RunState,
        out: Output,
        open_node: Callable[[EventsHandler, Callable[[str], None]], Node],
        *,
        max_tests: int = 8,
        start_timeout: float = 5.0,
    ) -> None:
        self.loop = loop
        self.opts = opts
        self.state = state
        self.out = out
        node = open_node(self._on_events, self._on_error)
        self.node = node
        self.rng = node.rng
        self.core = node.endpoint
        self.io: IoEndpoint[Session] = node.io
        #: --paths: lines that describe them for the banner.
        self.path_lines = list(node.path_lines)
        self.config = opts.config(len(node.planes))
        self.max_tests = max_tests
        self.start_timeout = start_timeout
        self.pending: dict[int, tuple[TestSetup, BenchRequest, float]] = {}
        self.tests: dict[int, BenchTest] = {}
        #: --latency tests being served: their sessions just echo (`echo`).
        self.echoes: dict[int, LatencyEcho] = {}
        self.starts: dict[int, StartInfo] = {}
        self.stopped: asyncio.Future[None] = loop.create_future()
        self.failures = 0
        #: io's internal-error count when the last test ended.
        self._internal_mark = 0
        self.completed = 0
        self._drops_mark: Counter[str] = Counter()
        #: Session drops of connections that never ran a test (not reported on their own).
        self._orphan_drops: Counter[str] = Counter()
        self._errors = 0
        self._printer = interval_printer(out)
        self._announced: set[int] = set()

    def start(self) -> None:
        # The EV timeline is always kept (it is bounded); the records only for --trace.
        traces = TraceLog(records=self.state.trace_file is not None)
        self.node.listen(self.config, self._accept, trace=traces)
        self.node.start()
        self._banner()

    def _banner(self) -> None:
        addrs = ", ".join(host_port(s.local_addr)[0] for s in self.io.planes.values())
        port = host_port(next(iter(self.io.planes.values())).local_addr)[1]
        self.out.line("-" * 59)
        n = len(self.io.planes)
        self.out.line(
            f"Server listening on {port} ({n} plane{'s' if n != 1 else ''}: {addrs}; "
            f"{implementation()})"
        )
        for line in self.path_lines:
            self.out.line(line)
        self.out.line(security_line(self.opts, self.state))
        self.out.line("-" * 59)

    def close(self) -> None:
        for test in list(self.tests.values()):
            test.cancel()
            if not test.session.is_closed:
                test.session.close(self.io.now())
                self.io.flush(test.session)
            test.setup.release()
        for echo in list(self.echoes.values()):
            echo.cancel()
            if not echo.session.is_closed:
                echo.session.close(self.io.now())
                self.io.flush(echo.session)
            echo.setup.release()
        self.echoes.clear()
        for setup, _, _ in list(self.pending.values()):
            setup.release()
        self.tests.clear()
        self.pending.clear()
        self.node.close()

    def stop(self) -> None:
        if not self.stopped.done():
            self.stopped.set_result(None)

    def _on_error(self, message: str) -> None:
        self._errors += 1
        if self._errors <= 10 or self._errors % 1000 == 0:
            sys.stderr.write(f"mrc bench: {message} (#{self._errors}, continuing)\n")

    def _extra_drops(self) -> Counter[str]:
        """Endpoint drops since the last report, plus drops of connections never reported."""
        return (Counter(self.core.drops) - self._drops_mark) + self._orphan_drops

    # -- handshake ---------------------------------------------------------------------------

    def _accept(self, private_data: bytes) -> bytes | None:
        now = self.io.now()
        for cookie, (setup, _, at) in list(self.pending.items()):
            if now - at > 10.0:
                setup.release()
                del self.pending[cookie]
        try:
            req = BenchRequest.decode(private_data)
        except BenchProtocolError:
            return None
        busy = len(self.tests) + len(self.echoes) + len(self.pending)
        if req.cookie in self.pending or busy >= self.max_tests:
            return None
        if req.kind == KIND_LATENCY:
            try:
                setup = TestSetup.latency(self.core.regions, req.msg_size)
            except MemoryError:
                return None
            self.pending[req.cookie] = (setup, req, now)
            refs = (setup.ref(setup.inbox), setup.ref(setup.data))
            return BenchReply(req.cookie, *refs, version=req.version).encode()
        role = WRITER if req.reverse else RECEIVER
        params = TestParams(
            msg_size=req.msg_size,
            duration=req.duration,
            total_bytes=req.total_bytes,
            verify=req.verify,
            seed=req.seed,
            interval=self.opts.interval,
            injects=tuple(req.injects) + tuple(self.opts.injects) if req.reverse else (),
        )
        if role == WRITER:
            slots = req.data.length // req.msg_size
        else:
            slots = slot_count(req.msg_size, self.config.payload_mtu, self.config.mpr)
        try:
            setup = TestSetup.allocate(self.core.regions, role, params, slots)
        except MemoryError:
            return None
        reply = BenchReply(
            req.cookie, setup.ref(setup.inbox), setup.ref(setup.data), version=req.version
        )
        self.pending[req.cookie] = (setup, req, now)
        return reply.encode()

    # -- events ------------------------------------------------------------------------------

    def _on_events(self, session: Session, events: list[Event]) -> None:
        test = self.tests.get(id(session))
        if test is not None and not any(isinstance(e, ConnectionClosed) for e in events):
            test.on_events(events)  # the usual batch: completions of a running test
            return
        for event in events:
            self._on_event(session, event)

    def _on_event(self, session: Session, event: Event) -> None:
        echo = self.echoes.get(id(session))
        if echo is not None:
            echo.on_event(event)
            if isinstance(event, ConnectionClosed):
                self._echo_ended(echo)
            return
        test = self.tests.get(id(session))
        if test is not None:
            test.on_events([event])
            if isinstance(event, ConnectionClosed):
                self._closed(session, test)
            return
        if isinstance(event, ConnectionEstablished):
            self._begin(session, event)

    def _begin(self, session: Session, est: ConnectionEstablished) -> None:
        try:
            cookie = BenchRequest.decode(est.private_data).cookie
        except BenchProtocolError:
            cookie = -1
        entry = self.pending.pop(cookie, None)
        if entry is None:
            session.close(self.io.now())
            self.io.flush(session)
            return
        setup, req, _ = entry
        if req.kind == KIND_LATENCY:
            echo = LatencyEcho(self.io, session, setup, req.data, on_end=self._echo_ended,
                               peer_results=req.results)
            self.echoes[id(session)] = echo
            echo.start()
            return
        test = BenchTest(
            self.io,
            session,
            setup,
            peer_data=req.data,
            peer_results=req.results,
            on_done=self._done,
            on_interval=self._show,
            wait_for_go=setup.role == WRITER,
            start_timeout=self.start_timeout,
            extra_drops=self._extra_drops,
            trace_file=self.state.trace_file,
        )
        self.tests[id(session)] = test
        start = StartInfo(
            role="server",
            test_start=test_start_info(self.opts, self.state, test, est),
            event_loop=loop_name(self.loop),
        )
        record_paths(start.test_start, [], self.opts.paths, {})
        self.starts[id(session)] = start
        self._accepted_line(test)
        test.start()

    def _show(self, test: BenchTest, sample: IntervalSample) -> None:
        self._announce(test)
        self._printer(test, sample)

    def _accepted_line(self, test: BenchTest) -> None:
        host, port = host_port(test.session.peer_addrs.get(min(test.session.peer_addrs), ("?", 0)))
        self.out.line(
            f"Accepted connection from {host}, port {port} "
            f"(qpn {test.session.qpn:#08x}, peer qpn {test.session.peer_qpn:#08x})"
        )

    def _announce(self, test: BenchTest) -> None:
        """The per-plane lines, once every plane's REQUEST copy had time to arrive."""
        if id(test) in self._announced:
            return
        self._announced.add(id(test))
        for row in connected_rows(test):
            self.out.line(
                f"[  5] local {row['local_host']} port {row['local_port']} connected to "
                f"{row['remote_host']} port {row['remote_port']} (plane {row['plane']})"
            )

    def _done(self, test: BenchTest) -> None:
        if not test.started_data:
            # Never got going (a stray REQUEST, a client that vanished): nothing to report.
            self._orphan_drops.update(test.session.stats.drops_by_reason)
            if not test.session.is_closed:
                test.session.close(self.io.now())
                self.io.flush(test.session)
            return
        test.final_sample()
        start = self.starts.get(id(test.session))
        if start is not None:
            start.connected = connected_rows(test)
        if self.out.json_mode and start is not None:
            doc = json_document(test, start)
            table = self.opts.path_table
            if table is not None:
                counts = self.node.peer_path_counts(test.session.peer_addrs)
                rows = doc["start"]["connected"] + doc["end"]["mrc"]["planes"]
                record_paths(doc["start"]["test_start"], rows, self.opts.paths, counts)
            self.out.doc(doc)
        else:
            self._announce(test)
            for line in summary_lines(test):
                self.out.line(line)
            self._banner()
        self._drops_mark = Counter(self.core.drops)
        self._orphan_drops = Counter()
        if self.io.internal_errors > self._internal_mark:
            sys.stderr.write(
                f"mrc bench: {self.io.internal_errors - self._internal_mark} internal error(s) "
                f"in the transport during this test (first: {self.io.first_internal_error})\n"
            )
            self._internal_mark = self.io.internal_errors
            self.failures += 1
        elif test.error or test.integrity() == "mismatch" or test.write_errors:
            self.failures += 1
        self.completed += 1
        if self.opts.one_off:
            self.loop.call_later(0.2, self.stop)

    def _echo_ended(self, echo: LatencyEcho) -> None:
        """A latency test ends when its client hangs up (or falls silent): one line (or -J
        document) for it."""
        if self.echoes.pop(id(echo.session), None) is None:
            return
        echo.cancel()
        echo.setup.release()
        if self.out.json_mode:
            self.out.doc(echo.document())
        else:
            self.out.line(echo.line())
            self._banner()
        if echo.error or echo.write_errors:
            self.failures += 1
        self.completed += 1
        if self.opts.one_off:
            self.loop.call_later(0.2, self.stop)

    def _closed(self, session: Session, test: BenchTest) -> None:
        self._announced.discard(id(test))
        self.tests.pop(id(session), None)
        self.starts.pop(id(session), None)
        test.cancel()
        test.setup.release()


async def _serve(opts: BenchOptions, state: RunState) -> int:
    loop = asyncio.get_running_loop()
    server = BenchServer(
        loop,
        opts,
        state,
        Output(json_mode=opts.json),
        functools.partial(server_node, loop, opts, state),
    )
    on_signals(loop, server.stop)
    try:
        server.start()
        await server.stopped
    finally:
        server.close()
    return 1 if opts.one_off and server.failures else 0


def main(opts: BenchOptions) -> int:
    """`mrc bench -s -B ADDR[,ADDR...]`: serve tests until interrupted (one with -1)."""
    return runner.run(opts, _serve)
