"""The node one side of `mrc bench` runs on: its sockets, core endpoint and identity.

Holds `server_node` (the -B addresses and port, serving), `client_node` (fresh sockets toward
the server's address on each plane, and the SRv6 paths of --paths) and `on_signals`. Sockets,
path tables and MTU checks are the host layer's (`mrc.node`); what runs on the node is the
mode's (`client`, `server`, `sweep`, `latency`, `demo`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
from collections.abc import Callable
from typing import NamedTuple

from mrc.core.endpoint import Endpoint
from mrc.core.secure.handshake import Identity
from mrc.io.planes import SockAddr, resolve_addr
from mrc.node import EventHandler, EventsHandler, Node, client_binds

from .options import BenchOptions
from .setup import BenchError
from .state import RunState

__all__ = ["ClientNode", "client_node", "endpoint", "on_signals", "server_node"]


class ClientNode(NamedTuple):
    """What `client_node` opens: the node, the server's address on each plane, and the SRv6
    paths per plane (--paths; empty without)."""

    node: Node
    peers: dict[int, SockAddr]
    plane_paths: dict[int, int]


def endpoint(identity: Identity | None) -> Endpoint:
    """A core endpoint whose QPNs, initial PSNs and nonces come from the OS's generator
    (docs/DESIGN.md §8)."""
    return Endpoint(rng=random.Random(), identity=identity, ids=random.SystemRandom())


def on_signals(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> None:
    """SIGINT and SIGTERM call `handler` (where the loop can watch signals)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)


def server_node(
    loop: asyncio.AbstractEventLoop,
    opts: BenchOptions,
    state: RunState,
    on_events: EventsHandler,
    on_error: Callable[[str], None],
) -> Node:
    """`mrc bench -s`: a node serving on the -B addresses and -p port, its events and transport
    errors going to the server that asked for it."""
    assert opts.bind is not None
    ep = endpoint(state.identity)
    return Node(
        loop,
        list(opts.bind),
        opts.port,
        table=opts.path_table,
        payload_mtu=opts.payload_mtu,
        serve=True,
        rng=ep.rng,
        endpoint=ep,
        secured=opts.security != "none",
        ev_encoding=opts.ev_encoding,
        on_events=on_events,
        on_error=on_error,
    )


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
    return peers, list(opts.bind) if opts.bind else binds


def client_node(
    loop: asyncio.AbstractEventLoop,
    opts: BenchOptions,
    state: RunState,
    on_events: EventsHandler | None = None,
    *,
    on_event: EventHandler | None = None,
) -> ClientNode:
    """A client's node on fresh sockets, its events going to `on_event` (one at a time) or
    `on_events` (a flush's worth), with the server's address on each plane and the SRv6 paths
    per plane (--paths; empty without). The caller closes the node."""
    peers, binds = _resolve_peers(opts)
    table = opts.path_table
    if table is not None and opts.bind is None:
        binds = client_binds(table, list(opts.server), binds)
    ep = endpoint(state.identity)
    node = Node(
        loop, binds, 0, table=table, payload_mtu=opts.payload_mtu, rng=ep.rng,
        endpoint=ep, secured=opts.security != "none", ev_encoding=opts.ev_encoding,
        on_event=on_event, on_events=on_events,
    )  # fmt: skip
    try:
        counts = node.open_paths(peers) if table is not None else {}
    except BaseException:
        node.close()
        raise
    return ClientNode(node, peers, counts)
