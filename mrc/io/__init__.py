"""The I/O layer: the only part of `mrc` that touches sockets and the event loop.

Holds plane sockets (`planes`), SRv6 path tables and per-path send sockets (`srv6`), the
endpoint that drives the sans-I/O core on them (`endpoint`) and event-loop setup (`loop`). The
protocol itself lives in `mrc.core`; what to do with connections (benchmarks, the daemon) lives
in `mrc.cli` and `mrc.daemon`.
"""

from __future__ import annotations

from .endpoint import CoreEndpoint, CoreSession, Fault, IoEndpoint
from .loop import freeze_heap, loop_name, new_event_loop
from .pathtable import PathEntry, PathTable, PathTableError, SrPath
from .planes import (
    DEFAULT_BUFFER_BYTES,
    ECT0,
    LOCAL_DROP_ERRNOS,
    PLANE_DOWN_ERRNOS,
    PlaneSocket,
    SockAddr,
    resolve_addr,
)
from .srv6 import PathMtuError, PathSockets

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "ECT0",
    "LOCAL_DROP_ERRNOS",
    "PLANE_DOWN_ERRNOS",
    "CoreEndpoint",
    "CoreSession",
    "Fault",
    "IoEndpoint",
    "PathEntry",
    "PathMtuError",
    "PathSockets",
    "PathTable",
    "PathTableError",
    "PlaneSocket",
    "SockAddr",
    "SrPath",
    "freeze_heap",
    "loop_name",
    "new_event_loop",
    "resolve_addr",
]
