"""`mrc bench --demo`: a server and a client in this process on four loopback planes.

Holds `main`, the demo mode: a `server.BenchServer` on 127.0.0.2-5 and a `client.BenchClient`
on 127.0.0.6-9, 256 MiB checked byte for byte (unless -t or -n says otherwise), plane 2
blackholed once 40 % of the bytes are through. A secured demo makes a key for each side, each
accepting only the other's. Its banner line says which build runs (compiled or pure Python).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import sys
from collections.abc import Callable

from mrc.core.secure.handshake import Identity, public_key
from mrc.node import EventsHandler, Node, NodeError

from ...units import fmt_bytes
from . import runner
from .client import BenchClient
from .host import ClientNode, endpoint
from .options import BenchOptions
from .report import Output, implementation
from .server import BenchServer
from .setup import BenchError
from .state import RunState

__all__ = ["DEMO_CLIENT", "DEMO_SERVER", "main"]

DEMO_SERVER = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
DEMO_CLIENT = ("127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9")
#: Plane 2 is blackholed once this share of the bytes (or of the time) is through.
FAULT = (2, 0.4)


def _identities(opts: BenchOptions) -> tuple[Identity | None, Identity | None]:
    """(server, client): a key each for a secured demo, each accepting only the other's."""
    if opts.security == "none":
        return None, None
    server_key, client_key = os.urandom(32), os.urandom(32)
    return (
        Identity(server_key, [public_key(client_key)], entropy=os.urandom),
        Identity(client_key, [public_key(server_key)], entropy=os.urandom),
    )


async def _demo(opts: BenchOptions, state: RunState) -> int:
    loop = asyncio.get_running_loop()
    server_id, client_id = _identities(opts)

    def server_node(on_events: EventsHandler, on_error: Callable[[str], None]) -> Node:
        """The demo server's node, on the first free port of a few random ones."""
        for _ in range(50):
            ep = endpoint(server_id)
            try:
                return Node(
                    loop, DEMO_SERVER, random.randrange(20000, 60000), serve=True, rng=ep.rng,
                    endpoint=ep, on_events=on_events, on_error=on_error,
                )  # fmt: skip
            except NodeError:
                continue
        raise BenchError("no free UDP port on 127.0.0.2-5 for the demo server")

    server_opts = dataclasses.replace(
        opts, role="server", server=(), bind=DEMO_SERVER, one_off=True, verify=False,
        duration=0.0, total_bytes=0, json=False, trace=None, injects=(), ev_encoding="evxh",
    )  # fmt: skip
    server_state = RunState(identity=server_id)
    server = BenchServer(
        loop, server_opts, server_state, Output(json_mode=False, quiet=True), server_node
    )
    port = server.node.port
    server.start()
    client_opts = dataclasses.replace(
        opts, role="client", server=DEMO_SERVER, bind=DEMO_CLIENT, port=port
    )
    client_state = RunState(identity=client_id, trace_file=state.trace_file)
    out = Output(json_mode=opts.json)
    amount = fmt_bytes(opts.total_bytes).strip() if opts.total_bytes else f"{opts.duration:g} s"
    plane, share = FAULT
    out.line(
        f"mrc bench --demo: server {DEMO_SERVER[0]}-{DEMO_SERVER[-1].rsplit('.', 1)[1]}, "
        f"client {DEMO_CLIENT[0]}-{DEMO_CLIENT[-1].rsplit('.', 1)[1]} (4 planes), {amount}, "
        f"--verify, plane {plane} blackholed once {share:.0%} of the bytes are through "
        f"({implementation()})"
    )
    def client_node(on_events: EventsHandler) -> ClientNode:
        ep = endpoint(client_id)
        node = Node(loop, DEMO_CLIENT, 0, rng=ep.rng, endpoint=ep, on_events=on_events)
        return ClientNode(node, {i: (h, port) for i, h in enumerate(DEMO_SERVER)}, {})

    client = BenchClient(loop, client_opts, client_state, out, client_node, demo_fault=FAULT)
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


def main(opts: BenchOptions) -> int:
    """`mrc bench --demo`."""
    return runner.run(opts, _demo)
