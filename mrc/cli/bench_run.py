"""Running `mrc bench`: the server, the client and the one-process demo on real sockets.

Holds `BenchClient` (connects, runs one test, reports it), `run_demo` (a `BenchServer` and a
client in one process), and `run`, which owns the event loop and turns every expected failure
(bad address, bind error, no answer, refused) into one line on stderr and exit status 1. The
server is `bench_server`, the test logic `bench_roles`, the wire agreement `bench_proto`, the
output `bench_report`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from mrc.core.endpoint import Endpoint
from mrc.core.events import ConnectionClosed, ConnectionEstablished, Event
from mrc.core.secure.handshake import Identity, public_key
from mrc.core.session import Session
from mrc.io.endpoint import IoEndpoint
from mrc.io.loop import loop_name, new_event_loop
from mrc.io.planes import SockAddr, resolve_addr
from mrc.node import Node, NodeError, client_binds
from mrc.node.keys import load_identity, load_public_keys

from .bench_options import BenchOptions
from .bench_proto import BenchProtocolError, BenchReply, BenchRequest, RegionRef, slot_count
from .bench_report import (
    Output,
    StartInfo,
    connected_rows,
    fmt_bytes,
    interval_printer,
    json_document,
    security_line,
    summary_lines,
    test_start_info,
)
from .bench_roles import BenchTest
from .bench_server import BenchServer
from .bench_setup import (
    RECEIVER,
    WRITER,
    BenchError,
    TestParams,
    TestSetup,
    record_paths,
)

__all__ = ["BenchClient", "BenchError", "client_node", "run", "run_demo"]


class BenchClient:
    """`mrc bench -c`: one test against a server."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: BenchOptions,
        out: Output,
        node: Node,
        peers: dict[int, SockAddr],
        *,
        demo_fault: tuple[int, float] | None = None,
        plane_paths: Mapping[int, int] | None = None,
    ) -> None:
        self.loop = loop
        self.opts = opts
        self.out = out
        self.peers = peers
        self.node = node
        self.rng = node.rng
        self.core = node.endpoint
        self.io: IoEndpoint[Session] = node.io
        node.on_events = self._on_events
        #: --paths: paths per plane (1 = direct) and the lines that describe them.
        self.plane_paths: dict[int, int] = dict(plane_paths or {})
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
        self.out.line(f"Connecting to host {','.join(opts.server)}, port {opts.port}")
        banner = security_line(opts)
        if banner is not None:
            self.out.line(banner)
        if opts.path_table is not None:
            self.out.line(f"SRv6 paths from {opts.paths} (testbed {opts.path_table.testbed}):")
            for line in self.path_lines:
                self.out.line(f"  {line}")
        self.node.start()
        try:
            config = opts.config(len(self.peers), self.plane_paths)
            session = self.io.connect(config, self.peers, req.encode(), connect_sockets=True)
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
            trace_file=opts.trace_file,
        )
        self.test = test
        self.start_info = StartInfo(
            role="client",
            test_start=test_start_info(opts, test, est),
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


def _resolve_peers(opts: BenchOptions) -> tuple[dict[int, SockAddr], list[str]]:
    peers: dict[int, SockAddr] = {}
    binds: list[str] = []
    for i, host in enumerate(opts.server):
        try:
            family, addr = resolve_addr(host, opts.port)
        except OSError as exc:
            raise BenchError(
                f"cannot resolve {host!r} (plane {i}): {exc.strerror or exc}"
            ) from None
        peers[i] = addr
        binds.append("::" if family == socket.AF_INET6 else "0.0.0.0")
    return peers, opts.bind or binds


def secure(opts: BenchOptions) -> None:
    """--security: the run's identity, from --key or made for this run, accepting the keys
    --peer-key names (any key without it: tampering is caught, impersonation is not)."""
    if opts.security == "none":
        return
    peers = None if opts.peer_key is None else [opts.peer_key]
    if opts.key is not None:
        opts.identity = load_identity(opts.key, peers)
    else:
        allowed = None if opts.peer_key is None else load_public_keys(opts.peer_key)
        opts.identity = Identity.generate(allowed, entropy=os.urandom)


def _endpoint(identity: Identity | None) -> Endpoint:
    return Endpoint(rng=random.Random(), identity=identity)


async def _serve(opts: BenchOptions) -> int:
    loop = asyncio.get_running_loop()
    assert opts.bind is not None
    endpoint = _endpoint(opts.identity)
    node = Node(
        loop,
        opts.bind,
        opts.port,
        table=opts.path_table,
        payload_mtu=opts.payload_mtu,
        serve=True,
        rng=endpoint.rng,
        endpoint=endpoint,
        secured=opts.security != "none",
        ev_encoding=opts.ev_encoding,
    )
    server = BenchServer(loop, opts, Output(json_mode=opts.json), node)
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, server.stop)
    try:
        server.start()
        await server.stopped
    finally:
        server.close()
    return 1 if opts.one_off and server.failures else 0


def client_node(
    loop: asyncio.AbstractEventLoop, opts: BenchOptions
) -> tuple[Node, dict[int, SockAddr], dict[int, int]]:
    """A client's node on fresh sockets, the server's address on each plane, and the SRv6
    paths per plane (--paths; empty without). The caller closes the node."""
    peers, binds = _resolve_peers(opts)
    table = opts.path_table
    if table is not None and opts.bind is None:
        binds = client_binds(table, opts.server, binds)
    endpoint = _endpoint(opts.identity)
    node = Node(
        loop, binds, 0, table=table, payload_mtu=opts.payload_mtu, rng=endpoint.rng,
        endpoint=endpoint, secured=opts.security != "none", ev_encoding=opts.ev_encoding,
    )  # fmt: skip
    try:
        counts = node.open_paths(peers) if table is not None else {}
    except BaseException:
        node.close()
        raise
    return node, peers, counts


async def _client(opts: BenchOptions) -> int:
    loop = asyncio.get_running_loop()
    node, peers, counts = client_node(loop, opts)
    client = BenchClient(
        loop, opts, Output(json_mode=opts.json), node, peers, plane_paths=counts
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, client.interrupt)
    try:
        return await client.run()
    finally:
        client.close()


DEMO_SERVER = [f"127.0.0.{i}" for i in (2, 3, 4, 5)]
DEMO_CLIENT = [f"127.0.0.{i}" for i in (6, 7, 8, 9)]


async def run_demo(opts: BenchOptions, *, fault: tuple[int, float] = (2, 0.4)) -> int:
    """Server and client in this process on 4 loopback planes, a plane blackholed midway."""
    loop = asyncio.get_running_loop()
    node: Node | None = None
    # Secured: the two sides make keys for this run and each accepts only the other's.
    server_id = client_id = None
    if opts.security != "none":
        server_key, client_key = os.urandom(32), os.urandom(32)
        server_id = Identity(server_key, [public_key(client_key)], entropy=os.urandom)
        client_id = Identity(client_key, [public_key(server_key)], entropy=os.urandom)
        opts.identity = client_id
    for _ in range(50):
        port = random.randrange(20000, 60000)
        endpoint = _endpoint(server_id)
        try:
            node = Node(loop, DEMO_SERVER, port, serve=True, rng=endpoint.rng, endpoint=endpoint)
            break
        except NodeError:
            continue
    if node is None:
        raise BenchError("no free UDP port on 127.0.0.2-5 for the demo server")
    server_opts = BenchOptions(
        role="server",
        bind=DEMO_SERVER,
        port=port,
        interval=opts.interval,
        payload_mtu=opts.payload_mtu,
        ev_per_plane=opts.ev_per_plane,
        mpr=opts.mpr,
        spray=opts.spray,
        plane_balance=opts.plane_balance,
        cc=opts.cc,
        flowcell=opts.flowcell,
        one_off=True,
        security=opts.security,
        identity=server_id,
    )
    server = BenchServer(loop, server_opts, Output(json_mode=False, quiet=True), node)
    server.start()
    client_opts = BenchOptions(
        **{
            **_fields(opts),
            "role": "client",
            "server": DEMO_SERVER,
            "bind": DEMO_CLIENT,
            "port": port,
        }
    )
    out = Output(json_mode=opts.json)
    amount = fmt_bytes(opts.total_bytes).strip() if opts.total_bytes else f"{opts.duration:g} s"
    out.line(
        f"mrc bench --demo: server {DEMO_SERVER[0]}-{DEMO_SERVER[-1].rsplit('.', 1)[1]}, "
        f"client {DEMO_CLIENT[0]}-{DEMO_CLIENT[-1].rsplit('.', 1)[1]} (4 planes), {amount}, "
        f"--verify, plane {fault[0]} blackholed once {fault[1]:.0%} of the bytes are through"
    )
    endpoint = _endpoint(client_id)
    client_node = Node(loop, DEMO_CLIENT, 0, rng=endpoint.rng, endpoint=endpoint)
    peers = {i: (h, port) for i, h in enumerate(DEMO_SERVER)}
    client = BenchClient(loop, client_opts, out, client_node, dict(peers), demo_fault=fault)
    try:
        rc = await client.run()
    finally:
        client.close()
        await asyncio.sleep(0.05)
        server.close()
    if server.io.internal_errors:
        sys.stderr.write(
            f"mrc bench: {server.io.internal_errors} internal error(s) in the transport of the "
            f"demo server (first: {server.io.first_internal_error})\n"
        )
        return 70
    return rc


def _fields(opts: BenchOptions) -> dict[str, Any]:
    return {name: getattr(opts, name) for name in opts.__slots__}


ClientMain = Callable[[BenchOptions], Coroutine[Any, Any, int]]


def run(opts: BenchOptions, client: ClientMain | None = None) -> int:
    """Run the chosen role on a fresh event loop; expected failures become one stderr line.
    `client` replaces the stream test's client (--sweep and --latency bring their own)."""
    coro: Coroutine[Any, Any, int]
    try:
        secure(opts)
    except NodeError as exc:
        sys.stderr.write(f"mrc bench: {exc}\n")
        return 1
    if opts.role == "server":
        coro = _serve(opts)
    elif opts.role == "client":
        coro = (client or _client)(opts)
    else:
        coro = run_demo(opts)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coro)
    except (BenchError, NodeError) as exc:
        sys.stderr.write(f"mrc bench: {exc}\n")
        return 1
    except MemoryError:
        sys.stderr.write("mrc bench: out of memory for the test regions (try a smaller -l)\n")
        return 1
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
