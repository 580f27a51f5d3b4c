"""The host layer: one machine's planes, SRv6 paths, sockets, core endpoint and region table.

`Node` is what `mrc bench`, the peer daemon and the examples build on (docs/DESIGN.md §1):
it sits above `mrc.io` (sockets, the event loop) and `mrc.core` (the protocol) and below the
programs that decide what connections are for. Set-up problems are `NodeError`s with one line.
"""

from __future__ import annotations

from .errors import NodeError
from .host import EventHandler, EventsHandler, Node, bind_planes, resolve_peer
from .paths import client_binds, client_paths, path_counts, server_paths

__all__ = [
    "EventHandler",
    "EventsHandler",
    "Node",
    "NodeError",
    "bind_planes",
    "client_binds",
    "client_paths",
    "path_counts",
    "resolve_peer",
    "server_paths",
]
