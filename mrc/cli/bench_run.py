"""Running `mrc bench`: the server, the client and the one-process demo on real sockets.

Holds `BenchServer` (listens on every plane, accepts tests whose private data parses, runs
them, reports each, survives any input), `BenchClient` (connects, runs one test, reports it),
`run_demo`, and `run`, which owns the event loop and turns every expected failure (bad address,
bind error, no answer, refused) into one line on stderr and exit status 1. The test logic is in
`bench_roles`, the wire agreement in `bench_proto`, the output format in `bench_report`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import socket
import sys
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, TextIO

from mrc.core.endpoint import Endpoint
from mrc.core.events import ConnectionClosed, ConnectionEstablished, Event
from mrc.core.memory import RegionTable
from mrc.core.session import Session
from mrc.io.endpoint import IoEndpoint
from mrc.io.loop import loop_name, new_event_loop
from mrc.io.planes import PlaneSocket, SockAddr, resolve_addr

from .bench import BenchOptions
from .bench_proto import (
    BenchProtocolError,
    BenchReply,
    BenchRequest,
    RegionRef,
    slot_count,
)
from .bench_report import (
    StartInfo,
    interval_header,
    interval_line,
    json_document,
    summary_lines,
)
from .bench_roles import RECEIVER, WRITER, BenchTest, IntervalSample, TestParams, TestSetup


class BenchError(Exception):
    """An expected failure: one line on stderr, exit status 1."""


class Output:
    """Text lines as they come, or one JSON document per test (-J)."""

    def __init__(self, *, json_mode: bool, quiet: bool = False, stream: TextIO | None = None):
        self.json_mode = json_mode
        self.quiet = quiet
        self.stream = stream or sys.stdout

    def line(self, text: str) -> None:
        if not self.json_mode and not self.quiet:
            self.stream.write(text + "\n")
            self.stream.flush()

    def doc(self, doc: dict[str, Any]) -> None:
        if self.json_mode and not self.quiet:
            self.stream.write(json.dumps(doc, indent=2) + "\n")
            self.stream.flush()


def _fmt(addr: SockAddr | Any) -> tuple[str, int]:
    return (str(addr[0]), int(addr[1])) if isinstance(addr, tuple) else (str(addr), 0)


def bind_planes(hosts: list[str], port: int) -> dict[int, PlaneSocket]:
    planes: dict[int, PlaneSocket] = {}
    try:
        for i, host in enumerate(hosts):
            try:
                planes[i] = PlaneSocket(i, host, port)
            except socket.gaierror as exc:
                raise BenchError(f"cannot resolve {host!r} (plane {i}): {exc.strerror}") from None
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise BenchError(f"cannot bind {host} port {port} (plane {i}): {reason}") from None
    except BaseException:
        for s in planes.values():
            s.close()
        raise
    return planes


def _interval_printer(out: Output) -> Callable[[BenchTest, IntervalSample], None]:
    printed: set[int] = set()

    def show(test: BenchTest, sample: IntervalSample) -> None:
        if id(test) not in printed:
            printed.add(id(test))
            out.line(interval_header([p for p, _, _ in sample.planes], test.role))
        out.line(interval_line(sample, test.role))

    return show


def _connected_rows(test: BenchTest) -> list[dict[str, Any]]:
    rows = []
    for p, sock in sorted(test.io.planes.items()):
        lh, lp = _fmt(sock.local_addr)
        rh, rp = _fmt(test.session.peer_addrs.get(p, ("", 0)))
        rows.append({"plane": p, "local_host": lh, "local_port": lp,
                     "remote_host": rh, "remote_port": rp})
    return rows


def _test_start(opts: BenchOptions, test: BenchTest, est: ConnectionEstablished) -> dict[str, Any]:
    p = test.params
    return {
        "protocol": "MRC",
        "num_streams": 1,
        "num_planes": bin(est.plane_mask).count("1"),
        "blksize": p.msg_size,
        "omit": 0,
        "duration": p.duration,
        "bytes": p.total_bytes,
        "blocks": 0,
        "reverse": int(test.role == WRITER) if opts.role == "server" else int(opts.reverse),
        "verify": p.verify,
        "interval": opts.interval,
        "payload_mtu": est.payload_mtu,
        "ev_per_plane": est.ev_per_plane,
        "mpr": est.mpr,
        "plane_mask": est.plane_mask,
        "inject": [f"plane-down={pl}@{at:g}" for pl, at in p.injects],
        "one_off": int(opts.one_off),
        "port": opts.port,
        "tos": 2,
    }


class BenchServer:
    """`mrc bench -s`: serves tests until stopped (or one test with -1)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: BenchOptions,
        out: Output,
        planes: dict[int, PlaneSocket],
        *,
        max_tests: int = 8,
        start_timeout: float = 5.0,
    ) -> None:
        self.loop = loop
        self.opts = opts
        self.out = out
        self.rng = random.Random()
        self.core = Endpoint(rng=self.rng, regions=RegionTable(self.rng))
        self.io: IoEndpoint[Session] = IoEndpoint(
            loop, self.core, planes, self._on_event, on_error=self._on_error
        )
        self.config = opts.config(len(planes))
        self.max_tests = max_tests
        self.start_timeout = start_timeout
        self.pending: dict[int, tuple[TestSetup, BenchRequest, float]] = {}
        self.tests: dict[int, BenchTest] = {}
        self.starts: dict[int, StartInfo] = {}
        self.stopped: asyncio.Future[None] = loop.create_future()
        self.failures = 0
        self.completed = 0
        self._drops_mark: Counter[str] = Counter()
        self._errors = 0
        self._show = _interval_printer(out)

    def start(self) -> None:
        self.io.listen(self.config, self._accept)
        self.io.start()
        self._banner()

    def _banner(self) -> None:
        addrs = ", ".join(_fmt(s.local_addr)[0] for s in self.io.planes.values())
        port = _fmt(next(iter(self.io.planes.values())).local_addr)[1]
        self.out.line("-" * 59)
        self.out.line(f"Server listening on {port} ({len(self.io.planes)} planes: {addrs})")
        self.out.line("-" * 59)

    def close(self) -> None:
        for test in self.tests.values():
            test.cancel()
            if not test.session.is_closed:
                test.session.close(self.io.now())
                self.io.flush(test.session)
            test.setup.release()
        for setup, _, _ in self.pending.values():
            setup.release()
        self.tests.clear()
        self.pending.clear()
        self.io.close()

    def stop(self) -> None:
        if not self.stopped.done():
            self.stopped.set_result(None)

    def _on_error(self, message: str) -> None:
        self._errors += 1
        if self._errors <= 10 or self._errors % 1000 == 0:
            sys.stderr.write(f"mrc bench: {message} (#{self._errors}, continuing)\n")

    def _extra_drops(self) -> Counter[str]:
        return Counter(self.core.drops) - self._drops_mark

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
        if req.cookie in self.pending or len(self.tests) + len(self.pending) >= self.max_tests:
            return None
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
        reply = BenchReply(req.cookie, setup.ref(setup.inbox), setup.ref(setup.data))
        self.pending[req.cookie] = (setup, req, now)
        return reply.encode()

    # -- events ------------------------------------------------------------------------------

    def _on_event(self, session: Session, event: Event) -> None:
        test = self.tests.get(id(session))
        if test is not None:
            test.on_event(event)
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
        )
        self.tests[id(session)] = test
        self.starts[id(session)] = StartInfo(
            role="server", test_start=_test_start(self.opts, test, est), event_loop=loop_name(self.loop)
        )
        test.start()

    def _announce(self, test: BenchTest) -> None:
        host, port = _fmt(test.session.peer_addrs.get(min(test.session.peer_addrs), ("?", 0)))
        self.out.line(
            f"Accepted connection from {host}, port {port} "
            f"(qpn {test.session.qpn:#08x}, peer qpn {test.session.peer_qpn:#08x})"
        )
        for row in _connected_rows(test):
            self.out.line(
                f"[  5] local {row['local_host']} port {row['local_port']} connected to "
                f"{row['remote_host']} port {row['remote_port']} (plane {row['plane']})"
            )

    def _done(self, test: BenchTest) -> None:
        if not test.started_data:
            # Never got going (a stray REQUEST, a client that vanished): nothing to report.
            if not test.session.is_closed:
                test.session.close(self.io.now())
                self.io.flush(test.session)
            return
        test.final_sample()
        start = self.starts.get(id(test.session))
        if start is not None:
            start.connected = _connected_rows(test)
        if self.out.json_mode and start is not None:
            self.out.doc(json_document(test, start))
        else:
            self._announce(test)
            for line in summary_lines(test):
                self.out.line(line)
            self._banner()
        self._drops_mark = Counter(self.core.drops)
        if test.error or test.integrity() == "mismatch" or test.write_errors:
            self.failures += 1
        self.completed += 1
        if self.opts.one_off:
            self.loop.call_later(0.2, self.stop)

    def _closed(self, session: Session, test: BenchTest) -> None:
        self.tests.pop(id(session), None)
        self.starts.pop(id(session), None)
        test.cancel()
        test.setup.release()


class BenchClient:
    """`mrc bench -c`: one test against a server."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: BenchOptions,
        out: Output,
        planes: dict[int, PlaneSocket],
        peers: dict[int, SockAddr],
        *,
        demo_fault: tuple[int, float] | None = None,
    ) -> None:
        self.loop = loop
        self.opts = opts
        self.out = out
        self.peers = peers
        self.rng = random.Random()
        self.core = Endpoint(rng=self.rng, regions=RegionTable(self.rng))
        self.io: IoEndpoint[Session] = IoEndpoint(loop, self.core, planes, self._on_event)
        self.demo_fault = demo_fault
        self.test: BenchTest | None = None
        self.session: Session | None = None
        self._established: asyncio.Future[ConnectionEstablished] = loop.create_future()
        self._finished: asyncio.Future[None] = loop.create_future()
        self.start_info: StartInfo | None = None

    def _on_event(self, session: Session, event: Event) -> None:
        if self.test is not None:
            self.test.on_event(event)
        elif isinstance(event, ConnectionEstablished) and not self._established.done():
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
        self.out.line(f"Connecting to host {','.join(opts.server)}, port {opts.port}")
        self.io.start()
        try:
            session = self.io.connect(
                opts.config(len(self.peers)), self.peers, req.encode(), connect_sockets=True
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
                raise BenchError(f"{self._where()} offered no room for {opts.msg_size}-byte messages")
        test = BenchTest(
            self.io,
            session,
            setup,
            peer_data=peer_data,
            peer_results=reply.results,
            on_done=self._done,
            on_interval=_interval_printer(self.out),
            send_go=opts.reverse,
        )
        self.test = test
        self.start_info = StartInfo(
            role="client",
            test_start=_test_start(opts, test, est),
            connecting_to={"host": ",".join(opts.server), "port": opts.port},
            event_loop=loop_name(self.loop),
        )
        for row in _connected_rows(test):
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
        target = fraction * (test.params.total_bytes or 0)

        def check() -> None:
            if test.done or test.state not in ("running",):
                return
            if test.session.stats.bytes_acked >= target:
                fault = self.io.inject_plane_down(plane, self.io.now())
                test.add_fault(fault, f"plane-down injected ({fraction:.0%} of the bytes sent)")
                return
            self.loop.call_later(0.005, check)

        check()

    def _done(self, test: BenchTest) -> None:
        if not self._finished.done():
            self._finished.set_result(None)

    def _report(self, test: BenchTest) -> int:
        test.final_sample()
        if self.out.json_mode and self.start_info is not None:
            self.start_info.connected = _connected_rows(test)
            self.out.doc(json_document(test, self.start_info))
        else:
            for line in summary_lines(test):
                self.out.line(line)
            self.out.line("")
            self.out.line("mrc Done.")
        if test.session is not None and not test.session.is_closed:
            test.session.close(self.io.now())
            self.io.flush(test.session)
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
        if self.test is not None:
            self.test.cancel()
            self.test.setup.release()
        self.io.close()


def _resolve_peers(opts: BenchOptions) -> tuple[dict[int, SockAddr], list[str]]:
    peers: dict[int, SockAddr] = {}
    binds: list[str] = []
    for i, host in enumerate(opts.server):
        try:
            family, addr = resolve_addr(host, opts.port)
        except OSError as exc:
            raise BenchError(f"cannot resolve {host!r} (plane {i}): {exc.strerror or exc}") from None
        peers[i] = addr
        binds.append("::" if family == socket.AF_INET6 else "0.0.0.0")
    return peers, opts.bind or binds


async def _serve(opts: BenchOptions) -> int:
    loop = asyncio.get_running_loop()
    assert opts.bind is not None
    planes = bind_planes(opts.bind, opts.port)
    server = BenchServer(loop, opts, Output(json_mode=opts.json), planes)
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, server.stop)
    try:
        server.start()
        await server.stopped
    finally:
        server.close()
    return 1 if server.failures else 0


async def _client(opts: BenchOptions) -> int:
    loop = asyncio.get_running_loop()
    peers, binds = _resolve_peers(opts)
    planes = bind_planes(binds, 0)
    client = BenchClient(loop, opts, Output(json_mode=opts.json), planes, peers)
    try:
        return await client.run()
    finally:
        client.close()


DEMO_SERVER = [f"127.0.0.{i}" for i in (2, 3, 4, 5)]
DEMO_CLIENT = [f"127.0.0.{i}" for i in (6, 7, 8, 9)]


async def run_demo(opts: BenchOptions, *, fault: tuple[int, float] = (2, 0.4)) -> int:
    """Server and client in this process on 4 loopback planes, a plane blackholed midway."""
    loop = asyncio.get_running_loop()
    planes: dict[int, PlaneSocket] | None = None
    for _ in range(50):
        port = random.randrange(20000, 60000)
        try:
            planes = bind_planes(DEMO_SERVER, port)
            break
        except BenchError:
            continue
    if planes is None:
        raise BenchError("no free UDP port on 127.0.0.2-5 for the demo server")
    server_opts = BenchOptions(
        role="server", bind=DEMO_SERVER, port=port, interval=opts.interval,
        payload_mtu=opts.payload_mtu, ev_per_plane=opts.ev_per_plane, mpr=opts.mpr,
        one_off=True,
    )
    server = BenchServer(loop, server_opts, Output(json_mode=False, quiet=True), planes)
    server.start()
    client_opts = BenchOptions(**{**_fields(opts), "role": "client", "server": DEMO_SERVER,
                                  "bind": DEMO_CLIENT, "port": port})
    out = Output(json_mode=opts.json)
    out.line(f"mrc bench --demo: 4 loopback planes, {opts.total_bytes or opts.duration} "
             f"{'bytes' if opts.total_bytes else 's'}, --verify, plane {fault[0]} blackholed "
             f"at {fault[1]:.0%} of the transfer")
    client_planes = bind_planes(DEMO_CLIENT, 0)
    peers = {i: (h, port) for i, h in enumerate(DEMO_SERVER)}
    client = BenchClient(loop, client_opts, out, client_planes, dict(peers), demo_fault=fault)
    try:
        return await client.run()
    finally:
        client.close()
        await asyncio.sleep(0.05)
        server.close()


def _fields(opts: BenchOptions) -> dict[str, Any]:
    return {name: getattr(opts, name) for name in opts.__slots__}  # type: ignore[attr-defined]


def run(opts: BenchOptions) -> int:
    """Run the chosen role on a fresh event loop; expected failures become one stderr line."""
    coro: Coroutine[Any, Any, int]
    if opts.role == "server":
        coro = _serve(opts)
    elif opts.role == "client":
        coro = _client(opts)
    else:
        coro = run_demo(opts)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coro)
    except BenchError as exc:
        sys.stderr.write(f"mrc bench: {exc}\n")
        return 1
    except MemoryError:
        sys.stderr.write("mrc bench: out of memory for the test regions (try a smaller -l)\n")
        return 1
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
