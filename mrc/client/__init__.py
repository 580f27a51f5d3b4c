"""`mrc.client`: the application library of the mrc peer daemon (docs/DESIGN.md §9).

A program registers shared memory with its host's daemon, swaps region handles with its peers
(small messages through the daemons), posts WRITEs and WRITE_WITH_IMMs into their regions and
waits for completions and immediates, in the style of verbs and NIXL::

    from mrc.client import Client, RegionHandle

    with Client("/run/mrc/mrc.sock") as client:
        region = client.register_region(1 << 20)
        client.bind("demo")
        handle = RegionHandle.from_json(client.recv_message("demo").data)
        with client.connect("hostb") as conn:
            ids = [conn.write(region, 0, 1 << 20, handle, imm=1)]
            assert all(c.ok for c in conn.wait(ids, timeout=10))

`AsyncClient` is the same with coroutines. Every failure is a `ClientError(code, message)`
with a one-line message and the control protocol's JSON-RPC code (`mrc.client.rpc`).
This package holds the API; the daemon side lives in `mrc.daemon`.
"""

from __future__ import annotations

from .aio import AsyncClient, AsyncConnection, AsyncRegion
from .objects import MAX_MESSAGE, MAX_WRITE, Completion, Immediate, Message, RegionHandle, Write
from .rpc import ClientError
from .sync import DEFAULT_SOCKET, Client, Connection, Region, default_socket

__all__ = [
    "DEFAULT_SOCKET",
    "MAX_MESSAGE",
    "MAX_WRITE",
    "AsyncClient",
    "AsyncConnection",
    "AsyncRegion",
    "Client",
    "ClientError",
    "Completion",
    "Connection",
    "Immediate",
    "Message",
    "Region",
    "RegionHandle",
    "Write",
    "default_socket",
]
