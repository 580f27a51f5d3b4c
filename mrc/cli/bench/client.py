"""`mrc bench -c`: the stream test's client, and the bulk mode's entry point.

Holds `BenchClient` (connects with the REQUEST of `proto`, runs one test as the writer, or as
the receiver with -R, and reports it) and `main`, which runs it on its node (`host`) through
`runner`. The test itself is `stream`'s, the output `report`'s; the sweep runs one
`BenchClient` per size (`sweep`), the demo one against its own server (`demo`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import Callable

from mrc.core.events import ConnectionClosed, ConnectionEstablished, Event
from mrc.core.session import Session
from mrc.core.trace import TraceCollector
from mrc.io.endpoint import IoEndpoint
from mrc.io.loop import loop_name
from mrc.node import EventsHandler

from . import runner
from .host import ClientNode, client_node, on_signals
from .options import BenchOptions
from .proto import BenchProtocolError, BenchReply, BenchRequest, RegionRef, slot_count
from .report import (
    Output,
    StartInfo,
    connected_rows,
    implementation,
    interval_printer,
    json_document,
    security_line,
    summary_lines,
    test_start_info,
)
from .setup import RECEIVER, WRITER, BenchError, TestParams, TestSetup, record_paths
from .state import RunState
from .stream import BenchTest

__all__ = ["BenchClient", "main"]


class BenchClient:
    """`mrc bench -c`: one test against a server."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: BenchOptions,
        state: RunState,
        out: Output,
        open_node: Callable[[EventsHandler], ClientNode],
        *,
        demo_fault: tuple[int, float] | None = None,
    ) -> None:
        self.loop = loop
        self.opts = opts
        self.state = state
        self.out = out
        node, self.peers, plane_paths = open_node(self._on_events)
        self.node = node
        self.rng = node.rng
        self.core = node.endpoint
        self.io: IoEndpoint[Session] = node.io
        #: --paths: paths per plane (1 = direct) and the lines that describe them.
        self.plane_paths: dict[int, int] = dict(plane_paths)
        self.path_lines = list(node.path_lines)
        self.demo_fault = demo_fault
        self.test: BenchTest | None = None
        self.session: Session | None = None
        self._established: asyncio.Future[ConnectionEstablished] = loop.create_future()
        self._finished: asyncio.Future[None] = loop.create_future()
        self.start_info: StartInfo | None = None

    def _on_events(self, session: Session, events: list[Event]) -> None:
        if self.test is not None:
            self.test.on_events(events)
            return
        for event in events:
            if isinstance(event, ConnectionEstablished) and not self._established.done():
                self._established.set_result(event)
            elif isinstance(event, ConnectionClosed) and not self._established.done():
                self._established.set_exception(BenchError(self._closed_reason(event.reason)))

    def _where(self) -> str:
        return f"{','.join(self.opts.server)} port {self.opts.port}"

    def _closed_reason(self, reason: str) -> str:
        if reason.startswith("rejected"):
            return f"{self._where()}: connection {reason} (server busy or incompatible)"
        return f"no answer from {self._where()} ({reason})"

    async def run(self) -> int:
        opts = self.opts
        role = RECEIVER if opts.reverse else WRITER
        params = TestParams(
            msg_size=opts.msg_size,
            duration=opts.duration,
            total_bytes=opts.total_bytes,
            verify=opts.verify,
            seed=self.rng.getrandbits(32),
            interval=opts.interval,
            injects=() if opts.reverse else tuple(opts.injects),
        )
        slots = slot_count(opts.msg_size, opts.payload_mtu, opts.mpr) if opts.reverse else 0
        setup = TestSetup.allocate(self.core.regions, role, params, slots)
        req = BenchRequest(
            cookie=self.rng.getrandbits(64),
            msg_size=opts.msg_size,
            duration=opts.duration,
            total_bytes=opts.total_bytes,
            reverse=opts.reverse,
            verify=opts.verify,
            seed=params.seed,
            results=setup.ref(setup.inbox),
            data=setup.ref(setup.data),
            injects=tuple(opts.injects) if opts.reverse else (),
        )
        self.out.line(
            f"Connecting to host {','.join(opts.server)}, port {opts.port} ({implementation()})"
        )
        self.out.line(security_line(opts, self.state))
        if opts.path_table is not None:
            self.out.line(f"SRv6 paths from {opts.paths} (testbed {opts.path_table.testbed}):")
            for line in self.path_lines:
                self.out.line(f"  {line}")
        self.node.start()
        try:
            config = opts.config(len(self.peers), self.plane_paths)
            # The EV timeline is always kept (it is bounded); the records only for --trace.
            trace = TraceCollector(records=self.state.trace_file is not None)
            session = self.io.connect(
                config, self.peers, req.encode(), connect_sockets=True, trace=trace
            )
        except OSError as exc:
            raise BenchError(f"cannot reach {self._where()}: {exc.strerror or exc}") from None
        self.session = session
        est = await self._wait_established()
        try:
            reply = BenchReply.decode(est.private_data)
        except BenchProtocolError as exc:
            raise BenchError(f"{self._where()} is not an mrc bench server ({exc})") from None
        if reply.cookie != req.cookie:
            raise BenchError(f"{self._where()} answered for another test")
        peer_data = reply.data if not opts.reverse else RegionRef()
        if role == WRITER:
            setup.slots = peer_data.length // opts.msg_size
            if setup.slots < 1:
                raise BenchError(
                    f"{self._where()} offered no room for {opts.msg_size}-byte messages"
                )
        test = BenchTest(
            self.io,
            session,
            setup,
            peer_data=peer_data,
            peer_results=reply.results,
            on_done=self._done,
            on_interval=interval_printer(self.out),
            send_go=opts.reverse,
            extra_drops=lambda: self.core.drops,  # endpoint drops (junk, unknown QPNs) too
            trace_file=self.state.trace_file,
        )
        self.test = test
        self.start_info = StartInfo(
            role="client",
            test_start=test_start_info(opts, self.state, test, est),
            connecting_to={"host": ",".join(opts.server), "port": opts.port},
            event_loop=loop_name(self.loop),
        )
        record_paths(self.start_info.test_start, [], opts.paths, self.plane_paths)
        for row in connected_rows(test):
            self.out.line(
                f"[  5] local {row['local_host']} port {row['local_port']} connected to "
                f"{row['remote_host']} port {row['remote_port']} (plane {row['plane']})"
            )
        if opts.reverse:
            self.out.line(f"Reverse mode, remote host {','.join(opts.server)} is sending")
        test.start()
        if self.demo_fault is not None:
            self._watch_demo_fault(*self.demo_fault)
        await self._finished
        return self._report(test)

    async def _wait_established(self) -> ConnectionEstablished:
        deadline = self.loop.time() + self.opts.connect_timeout
        while not self._established.done():
            if self.loop.time() >= deadline:
                if self.session is not None and self.session.stats.drops_by_reason["unknown_peer"]:
                    raise BenchError(
                        f"{self._where()} answered with a key that --peer-key does not name"
                    )
                if self.session is not None and self.session.stats.drops_by_reason[
                        "cm_reject_hint"]:  # fmt: skip
                    # A REJECT is a hint the requester retries past (docs/WIRE.md §6).
                    raise BenchError(
                        f"{self._where()} rejected every attempt (busy, or another --security "
                        f"or key) and accepted none within {self.opts.connect_timeout:g} s"
                    )
                raise BenchError(
                    f"no answer from {self._where()} within {self.opts.connect_timeout:g} s"
                )
            refused = [s.counters["econnrefused"] for s in self.io.planes.values()]
            if refused and all(refused):
                raise BenchError(
                    f"connection refused by {self._where()} (is `mrc bench -s` running there?)"
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._established), 0.05)
        return self._established.result()

    def _watch_demo_fault(self, plane: int, fraction: float) -> None:
        test = self.test
        assert test is not None
        target = fraction * test.params.total_bytes

        def due() -> bool:
            if target:
                return test.session.stats.bytes_acked >= target
            return self.io.now() - test.t0 >= fraction * test.params.duration

        def check() -> None:
            if test.done or test.state != "running":
                return
            if due():
                fault = self.io.inject_plane_down(plane, self.io.now())
                what = "of the bytes sent" if target else "of the test time"
                test.add_fault(fault, f"plane-down injected ({fraction:.0%} {what})")
                if self.start_info is not None:
                    at = fault.at - test.t0
                    self.start_info.test_start["inject"].append(f"plane-down={plane}@{at:.3f}")
                return
            self.loop.call_later(0.005, check)

        check()

    def _done(self, test: BenchTest) -> None:
        if not self._finished.done():
            self._finished.set_result(None)

    def interrupt(self) -> None:
        """SIGINT/SIGTERM: end the test now (its partial report still prints)."""
        if self.test is not None:
            self.test.fail("interrupted")
        elif not self._established.done():
            self._established.set_exception(BenchError("interrupted"))

    def _report(self, test: BenchTest) -> int:
        test.final_sample()
        if self.out.json_mode and self.start_info is not None:
            self.start_info.connected = connected_rows(test)
            doc = json_document(test, self.start_info)
            if self.opts.path_table is not None:
                rows = doc["start"]["connected"] + doc["end"]["mrc"]["planes"]
                record_paths(doc["start"]["test_start"], rows, self.opts.paths, self.plane_paths)
            self.out.doc(doc)
        else:
            for line in summary_lines(test):
                self.out.line(line)
            self.out.line("")
            self.out.line("mrc Done.")
        if test.session is not None and not test.session.is_closed:
            test.session.close(self.io.now())
            self.io.flush(test.session)
        if self.io.internal_errors:
            sys.stderr.write(
                f"mrc bench: {self.io.internal_errors} internal error(s) in the transport "
                f"(first: {self.io.first_internal_error})\n"
            )
            return 70
        if test.error:
            sys.stderr.write(f"mrc bench: test failed: {test.error}\n")
            return 1
        if test.integrity() == "mismatch":
            sys.stderr.write("mrc bench: integrity check failed: received bytes did not match\n")
            return 1
        if test.write_errors:
            sys.stderr.write("mrc bench: some WRITEs completed with an error status\n")
            return 1
        return 0

    def close(self) -> None:
        for fut in (self._established, self._finished):
            if not fut.done():
                fut.cancel()  # nobody waits any more; closing must not leave errors behind
        if self.test is not None:
            self.test.cancel()
            self.test.setup.release()
        if self.session is not None and not self.session.is_closed and not self.io.closed:
            self.session.close(self.io.now())  # DISCONNECT, so the server need not time out
            self.io.flush(self.session)
        self.node.close()


async def _client(opts: BenchOptions, state: RunState) -> int:
    loop = asyncio.get_running_loop()
    client = BenchClient(
        loop,
        opts,
        state,
        Output(json_mode=opts.json),
        functools.partial(client_node, loop, opts, state),
    )
    on_signals(loop, client.interrupt)
    try:
        return await client.run()
    finally:
        client.close()


def main(opts: BenchOptions) -> int:
    """`mrc bench -c ADDR[,ADDR...]`: one stream test."""
    return runner.run(opts, _client)
