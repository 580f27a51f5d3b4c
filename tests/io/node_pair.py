"""Two `Node`s on loopback moving one WRITE, for the io tests of EV encodings: the server `a`
listens, the client `b` (built with `recorder(events)` as its event handler) connects through a
relay (a tap the test reads) and writes `size` bytes; returns the client's session after
checking every byte arrived."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, Event, WriteCompleted
from mrc.core.session import Session
from mrc.node import Node, resolve_peer


def recorder(events: list[Event]) -> Callable[[Session, Event], None]:
    """An event handler that records into `events` (the client's, for `move_one_write`)."""
    return lambda _session, event: events.append(event)


def move_one_write(
    loop: asyncio.AbstractEventLoop,
    a: Node,
    b: Node,
    events: list[Event],
    config: SessionConfig,
    relay: tuple[str, int],
    size: int,
    *,
    check: Callable[[Session], None] | None = None,
) -> Session:
    """`b` connects to `a` through `relay` with `config` and writes `size` bytes into a region
    of `a`, `events` the list `b`'s handler records into; `check` runs on the established
    session before the write. Closes both nodes."""
    try:
        dst = a.regions.register(bytearray(size))
        src = b.regions.register(bytearray(bytes(range(256)) * (size // 256)))
        a.listen(config, lambda private: b"ok")
        a.start()
        b.start()
        session = b.connect(config, resolve_peer([relay[0]], relay[1]), b"")

        async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
            end = loop.time() + timeout
            while not cond():
                assert loop.time() < end, "timed out"
                await asyncio.sleep(0.002)

        loop.run_until_complete(until(lambda: any(isinstance(e, ConnectionEstablished)
                                                  for e in events)))  # fmt: skip
        if check is not None:
            check(session)
        session.post_write(src, 0, size, dst.base_va, dst.rkey)
        b.flush(session)
        loop.run_until_complete(until(lambda: any(isinstance(e, WriteCompleted) for e in events)))
        assert bytes(dst.view) == bytes(src.view)
        return session
    finally:
        b.close()
        a.close()
