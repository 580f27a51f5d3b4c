"""The client coroutines of `mrc bench -c --latency` and `mrc bench -c --sweep`.

Each opens its node (`bench_run.client_node`), runs the handshake of `bench_proto` and hands
the test to its logic: `bench_latency.LatencyPing` for the ping-pong, one `bench_run.BenchClient`
stream test per message size for the sweep (rows and table in `bench_sweep`). `bench_run.run`
runs them on its event loop and turns their `BenchError`s into one line; SIGINT/SIGTERM end
them with what was measured so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
from typing import Any

from mrc.core.events import ConnectionClosed, ConnectionEstablished, Event
from mrc.core.session import Session
from mrc.io.endpoint import IoEndpoint

from . import bench_latency, bench_sweep
from .bench_latency import LatencyPing
from .bench_options import BenchOptions
from .bench_proto import KIND_LATENCY, BenchProtocolError, BenchReply, BenchRequest
from .bench_report import Output, connected_rows
from .bench_run import BenchClient, client_node
from .bench_setup import BenchError, TestSetup

__all__ = ["latency_client", "sweep_client"]


def _on_signals(loop: asyncio.AbstractEventLoop, handler: Any) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)


async def sweep_client(opts: BenchOptions) -> int:
    """One stream test per size, each on a fresh connection; a row printed as each ends."""
    loop = asyncio.get_running_loop()
    out = Output(json_mode=opts.json)
    for line in bench_sweep.header_lines(opts):
        out.line(line)
    rows: list[dict[str, Any]] = []
    current: BenchClient | None = None
    stop = False

    def interrupt() -> None:
        nonlocal stop
        stop = True
        if current is not None:
            current.interrupt()

    _on_signals(loop, interrupt)
    rc = 0
    error: str | None = None
    try:
        for size in opts.sweep_sizes:
            # Interval lines make no sense inside a table; each size reports one row.
            size_opts = dataclasses.replace(opts, msg_size=size, interval=0.0, json=False)
            node, peers, counts = client_node(loop, size_opts)
            quiet = Output(json_mode=False, quiet=True)
            current = BenchClient(loop, size_opts, quiet, node, peers, plane_paths=counts)
            try:
                rc = await current.run()
                test = current.test
            finally:
                current.close()
            if test is None:
                break
            row = bench_sweep.sweep_row(test)
            rows.append(row)
            out.line(bench_sweep.row_line(row))
            if rc or stop:
                error = test.error or f"exit status {rc} at {size} bytes"
                break
    except BenchError as exc:
        error = str(exc)
        if not rows:
            raise
        sys.stderr.write(f"mrc bench: {exc}\n")
        rc = 1
    out.line("-" * len(bench_sweep.HEAD))
    out.doc(bench_sweep.sweep_document(opts, rows, len(opts.server), error))
    return rc


async def latency_client(opts: BenchOptions) -> int:
    """`mrc bench -c ADDR --latency`: one ping-pong test, then its table or -J document."""
    loop = asyncio.get_running_loop()
    node, peers, counts = client_node(loop, opts)
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

    node.on_event = on_event
    _on_signals(loop, interrupt)
    try:
        setup = bench_latency.allocate(node.endpoint.regions, opts.msg_size)
        req = BenchRequest(
            cookie=node.rng.getrandbits(64),
            msg_size=opts.msg_size,
            duration=opts.duration if not opts.iterations else 0.0,
            results=setup.ref(setup.inbox),
            data=setup.ref(setup.data),
            kind=KIND_LATENCY,
            iterations=opts.iterations,
        )
        out.line(f"Connecting to host {','.join(opts.server)}, port {opts.port} (latency test)")
        node.start()
        try:
            config = opts.config(len(peers), counts)
            session = node.io.connect(config, peers, req.encode(), connect_sockets=True)
        except OSError as exc:
            raise BenchError(f"cannot reach {where}: {exc.strerror or exc}") from None
        est = await _established(node.io, established, opts.connect_timeout, where)
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
    fut: asyncio.Future[ConnectionEstablished],
    timeout: float,
    where: str,
) -> ConnectionEstablished:
    """The handshake's end, or one line: refused on every plane, or no answer in time."""
    deadline = io.now() + timeout
    while not fut.done():
        if io.now() >= deadline:
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
        out.doc(bench_latency.document(opts, ping, est, rows))
    elif ping.samples:
        stats = bench_latency.latency_stats(ping.samples)
        for line in bench_latency.text_lines(opts.msg_size, stats, len(ping.samples)):
            out.line(line)
    if ping.error:
        sys.stderr.write(f"mrc bench: latency test failed: {ping.error}\n")
        return 1
    return 0
