"""The control methods by name: which operation of the service, or which view, answers each.

Holds `METHODS`, the table from each method of docs/DAEMON.md to what answers it (a `Service`
operation for what changes state, a function of `views` for what only reads it), and `Methods`,
the control server's `Dispatcher`: it looks the method up (an unknown name is METHOD_NOT_FOUND),
finds the calling client's state, wraps the parameters for checked reading and calls the entry.
`register_region` is the one method that comes with an fd (the memfd of the region); the control
socket passes an fd with no other.

This module sits above `service` and `views` so that neither needs the other: the views read the
service through their own `views.ServiceState`. What it leaves to others: the socket, framing and
answers (`control`, `rpc`), what each method does (`service`, `views`, `mailbox`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import views
from .clients import ClientState
from .control import ControlClient
from .rpc import METHOD_NOT_FOUND, Params, RpcError
from .service import Service

__all__ = ["METHODS", "Method", "Methods"]

#: One method: the service, the calling client's state, the request's parameters → the result
#: (JSON-able), or an awaitable of it for a method that waits (connect, the long-polls).
Method = Callable[[Service, ClientState, Params], Any]


def _view(read: Callable[[views.ServiceState, Params], Any]) -> Method:
    return lambda svc, cs, p: read(svc, p)


METHODS: dict[str, Method] = {
    "status": _view(views.status),
    # Without its fd: refused (the fd comes with the line; `Methods.dispatch` takes that case).
    "register_region": Service.register_without_fd,
    "deregister_region": Service.deregister_region,
    "connect": Service.connect,
    "disconnect": Service.disconnect,
    "write": Service.write,
    "completions": Service.completions,
    "immediates": Service.immediates,
    "subscribe": Service.subscribe,
    "bind": Service.bind,
    "send_message": Service.send_message,
    "recv_message": Service.recv_message,
    "peers": _view(views.peers),
    # These three show the calling client only its own rows (views.visible).
    "connections": views.connections,
    "planes": _view(views.planes),
    "evs": views.evs,
    "regions": views.regions,
}


class Methods:
    """The control server's dispatcher (`control.Dispatcher`) over one service."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def dispatch(
        self, client: ControlClient, method: str, params: dict[str, Any], fd: int | None
    ) -> Any:
        entry = METHODS.get(method)
        if entry is None:
            raise RpcError(METHOD_NOT_FOUND, f"unknown method {method!r}")
        cs = self.service.client(client)
        p = Params(method, params)
        if fd is not None:
            return self.service.register_region(cs, p, fd)
        return entry(self.service, cs, p)

    def client_gone(self, client: ControlClient) -> None:
        self.service.client_gone(client)
