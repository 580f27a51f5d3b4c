"""Event-loop setup for the I/O layer: uvloop when it is importable, the stdlib loop otherwise.

Holds `new_event_loop()`, `loop_name()` and `freeze_heap()`. It sets no policy globally and
runs nothing; the endpoint (`mrc.io.endpoint`) and the CLI decide what runs on the loop.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import os
from collections.abc import Callable
from typing import cast

__all__ = ["freeze_heap", "loop_name", "new_event_loop"]


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        module = importlib.import_module("uvloop")
    except ImportError:
        return None
    return cast(Callable[[], asyncio.AbstractEventLoop], module.new_event_loop)


def new_event_loop(*, prefer_uvloop: bool | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when importable (and preferred), else asyncio's default.

    `prefer_uvloop=None` reads the environment: `MRC_LOOP=asyncio` asks for the stdlib loop.
    """
    if prefer_uvloop is None:
        prefer_uvloop = os.environ.get("MRC_LOOP", "").lower() != "asyncio"
    factory = _uvloop_factory() if prefer_uvloop else None
    if factory is not None:
        return factory()
    return asyncio.new_event_loop()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """ "uvloop" or "asyncio" (the stdlib loop), for reports."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


#: Allocations of tracked objects (net of those freed) between young collections, once the
#: heap is frozen; CPython's default is 700.
GC_THRESHOLD0 = 50_000


def freeze_heap() -> None:
    """Move every object alive now out of the cyclic collector's reach (`gc.freeze`).

    Call it once setup is over (modules, sockets, rings, the session), before data flows. A
    full collection walks every tracked object: with the ~24k objects of a running bench that
    took 3-8 ms on this class of machine, during which no packet is read, placed or acked (it
    was the longest stall of a 1 GiB loopback run). Frozen objects are never walked again, so
    the collections left only see what the data path allocated since. It thaws what an earlier
    call froze first, so a server running test after test still frees the cycles of the last.

    It also raises the youngest generation's threshold to `GC_THRESHOLD0`. The data path's
    records, events and tuples are freed by their reference counts, mostly before any
    collection could find them; at the default 700 a 4 KiB-WRITE sender still ran about 250
    young collections a second, 6 % of its CPU (1,010 gen0 and 92 gen1 passes, 225 ms, in a
    4 s run), and with the raised threshold none.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD0)
