"""The receiving side of test_secure_loopback, as its own process (a sender and a receiver in
one event loop starve each other's sockets): listens on 127.0.0.2-3 with security and a lowered
rekey threshold, notes the time of every data packet it verifies, and prints one JSON line when
the connection closes.

    python tests/node/secure_peer.py LEVEL REKEY_SHIFT SIZE SKIP

Prints `{"port": P}` once listening, then the result line, which judges the packets after the
first SKIP (a warm-up: on loopback the first window or two of a connection stall for reasons
of their own, with or without security)."""

from __future__ import annotations

import asyncio
import json
import random
import struct
import sys

from mrc.core.config import SessionConfig
from mrc.core.endpoint import Endpoint
from mrc.core.events import ConnectionClosed, ConnectionEstablished, Event
from mrc.core.secure.handshake import Identity
from mrc.core.session import Session
from mrc.io.loop import new_event_loop
from mrc.node import Node

SERVER_KEY, CLIENT_KEY = b"\x0a" * 32, b"\x0b" * 32
BINDS = ["127.0.0.2", "127.0.0.3"]
REGION = struct.Struct(">QI")


def main() -> None:
    level, shift, size, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    loop = new_event_loop()
    identity = Identity(SERVER_KEY, [Identity(CLIENT_KEY).public_key], entropy=random.randbytes)
    endpoint = Endpoint(rng=random.Random(), identity=identity)
    opens: list[tuple[float, int]] = []
    done: asyncio.Future[Session] = loop.create_future()

    def on_event(session: Session, event: Event) -> None:
        if isinstance(event, ConnectionEstablished) and session.channel is not None:
            protection = session.channel.protection
            verify_at = protection.open_at

            # Every packet opens through `open_at` (`open` calls it for a single datagram).
            def recording_open_at(
                buf: memoryview, at: int, size: int, header: int, slot: bool = False
            ) -> bool:
                ok = verify_at(buf, at, size, header, slot)
                if ok and header:
                    opens.append((node.now(), protection.replay.top >> shift))
                return ok

            protection.open_at = recording_open_at  # type: ignore[method-assign]
        elif isinstance(event, ConnectionClosed) and not done.done():
            done.set_result(session)

    node = Node(loop, BINDS, 0, serve=True, rng=endpoint.rng, endpoint=endpoint,
                on_event=on_event)  # fmt: skip
    dst = node.regions.register(bytearray(size))
    config = SessionConfig(plane_mask=0b11, security=level, rekey_shift=shift)
    node.listen(config, lambda _: REGION.pack(dst.base_va, dst.rkey))
    node.start()
    print(json.dumps({"port": node.port}), flush=True)
    session = loop.run_until_complete(asyncio.wait_for(done, 60))
    node.close()
    gaps = [opens[i][0] - opens[i - 1][0] for i in range(skip + 1, len(opens))]
    changes = [i for i in range(skip + 1, len(opens)) if opens[i][1] != opens[i - 1][1]]
    # The gap each epoch change opened, and the longest of the 8 packets after it.
    near = [opens[j][0] - opens[j - 1][0] for i in changes
            for j in range(i, min(len(opens), i + 8))]  # fmt: skip
    result = {
        "verified": len(opens),
        "epoch_changes": len(changes),
        "worst_gap_at_change": max(near, default=0.0),
        "worst_gap": max(gaps, default=0.0),
        "bytes_placed": session.stats.bytes_placed,
        "drops": dict(session.stats.drops_by_reason),
        "content": bytes(dst.view[::4096]).hex(),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
