"""The sans-I/O core on its own: two sessions wired back to back in one process, no sockets.

    python -m tools.bench_core [-l 1M] [-n 256M] [--planes 4] [--imm] [--repeat 5]
                               [--security none|auth|encrypt]
    python -m tools.bench_core --latency [-l 64] [--iterations 10000] [--repeat 5]

The writer posts `-l`-byte WRITEs (with an immediate each under `--imm`, as `mrc bench --verify`
sends them) until `-n` bytes are acknowledged; every transmit goes to the other side's core
endpoint at once, as io reads it: one read, a GRO batch whole with its segment size. The clock is
virtual (it advances 20 µs a round), so no timer fires early and nothing is lost. As under
io, a side pulls its transmits 64 packets at a time, a receive call gets about 64 datagrams,
and the heap is frozen (`mrc.io.loop.freeze_heap`) once the connection is up. With `--security
auth` or `encrypt` the two sides hold fixed static keys and the connection is secured as the
daemon's are (docs/WIRE.md §7): the figures then include the cipher's calls on each side.

What it measures is the CPU time each side spends inside the core (posting, framing,
receiving, acknowledging, completing), timed around each call with `perf_counter`: the part of
a packet's cost the io layer and the kernel do not add. The host's own speed drifts, so
compare two builds by alternating runs, and take each run's best of `--repeat`. Prints one
JSON document: µs per data packet and per message on each side, for the best run and for
every run.

`--latency` is `mrc bench --latency` without sockets: one `-l`-byte WRITE_WITH_IMM in flight,
answered by one back as soon as its immediate is delivered, `--iterations` times. Each side runs
what io runs on a wake-up (the read handed to `Endpoint.receive_reads`, then the shared output
loop, `mrc.core.flush.Flusher`, over the sessions that got input, its timer armed and its
events delivered), so the figure is the core's CPU per round trip on each side, the part of
`mrc bench --latency`'s `cpu_*_us_per_round_trip` that io, uvloop and the kernel do not add.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any, Final

import mrc
from mrc.core.config import DEFAULT_FLOWCELL, SessionConfig
from mrc.core.endpoint import Endpoint
from mrc.core.events import Event, ImmediateReceived, WriteCompleted
from mrc.core.flush import Flusher, SendResult
from mrc.core.memory import RegionTable
from mrc.core.secure.handshake import Identity
from mrc.core.session import Session
from mrc.core.transmit import Transmit
from mrc.io.loop import freeze_heap

ROUND = 20e-6  # virtual seconds per round
PULL = 64  # packets per pull and datagrams per receive call, as io's defaults
RING = 64  # receive slots per plane, as io's ring (mrc/io/planes.py)
MAX_ROUNDS = 10_000_000


class _Side:
    """One endpoint and the CPU seconds spent in its calls."""

    def __init__(self, name: str, seed: int, identity: Identity | None = None) -> None:
        rng = random.Random(seed)
        self.endpoint = Endpoint(rng=rng, regions=RegionTable(rng), identity=identity)
        self.name = name
        self.seconds = 0.0
        self.addr = {p: (name, p) for p in range(64)}
        self.transmits = 0
        #: Per plane, io's ring of receive slots and the next one to read into.
        self._rings: dict[int, list[memoryview]] = {}
        self._next: dict[int, int] = {}

    def slot(self, plane: int, data: bytes | memoryview) -> tuple[memoryview, int]:
        """`data` read into this side's next receive slot of `plane`, as io's `recvmsg_into`
        fills its ring, from the first slot at each receive call (a slot grows if a batch does
        not fit): the slot and the length."""
        ring = self._rings.setdefault(plane, [memoryview(bytearray(0)) for _ in range(RING)])
        k = self._next.get(plane, 0)
        self._next[plane] = (k + 1) % RING
        n = len(data)
        if len(ring[k]) < n:
            ring[k] = memoryview(bytearray(n))
        ring[k][:n] = data
        return ring[k], n

    def deliver(self, txs: list[Transmit], to: _Side, now: float) -> int:
        """Hand `txs` to `to` as io reads them, one read per transmit (a GRO batch whole, with
        its segment size), reads of about `PULL` datagrams to a receive call (timed as
        `to`'s); returns how many were data packets."""
        self.transmits += len(txs)
        calls: dict[int, list[tuple[memoryview, Any, int, int, int]]] = {}
        counts: dict[int, int] = {}
        data_packets = 0
        for tx in txs:
            # Into a receive slot of the receiver's own, as io reads (not timed): writable, so
            # an encrypted payload is decrypted where it lies (aead.py), not staged. A plane's
            # call goes in before the ring comes round to its first read.
            seg = tx.segment_size or 0
            held = -(-len(tx.data) // seg) if seg else 1
            reads = calls.setdefault(tx.plane, [])
            if reads and (counts.get(tx.plane, 0) + held > PULL or len(reads) == RING):
                to.receive(tx.plane, reads, now)
                reads.clear()
                counts[tx.plane] = 0
            slot, n = to.slot(tx.plane, tx.data)
            reads.append((slot, self.addr[tx.plane], 0, seg, n))
            counts[tx.plane] = counts.get(tx.plane, 0) + held
            if slot[0] < 0xD0:  # opcodes below ACKNOWLEDGE are data
                data_packets += held
        for plane, reads in calls.items():
            if reads:
                to.receive(plane, reads, now)
        return data_packets

    def receive(
        self, plane: int, reads: list[tuple[memoryview, Any, int, int, int]], now: float
    ) -> None:
        """One receive call, timed as this side's."""
        t = time.perf_counter()
        self.receive_reads(plane, reads, now)
        self.seconds += time.perf_counter() - t

    def receive_reads(
        self, plane: int, reads: list[tuple[memoryview, Any, int, int, int]], now: float
    ) -> list[Session]:
        """The endpoint's receive call (not timed here); the next call's reads go into the
        ring from its first slot, as io's next drain does."""
        sessions = self.endpoint.receive_reads(plane, reads, now)
        self._next[plane] = 0
        return sessions


#: The two sides' static keys under `--security` (fixed: the bench measures, it protects nothing).
_KEYS: Final = (b"\x0a" * 32, b"\x0b" * 32)


def _identities(security: str) -> tuple[Identity | None, Identity | None]:
    if security == "none":
        return None, None
    pa, pb = (Identity(k).public_key for k in _KEYS)
    rnd = random.Random(3).randbytes
    return Identity(_KEYS[0], [pb], entropy=rnd), Identity(_KEYS[1], [pa], entropy=rnd)


def run(
    msg_size: int, total: int, planes: int, imm: bool, mtu: int, flowcell: int,
    security: str = "none",
) -> dict[str, Any]:  # fmt: skip
    """One transfer; returns its figures."""
    ida, idb = _identities(security)
    a, b = _Side("a", 1, ida), _Side("b", 2, idb)
    config = SessionConfig(
        plane_mask=(1 << planes) - 1, payload_mtu=mtu, flowcell=flowcell, security=security
    ).validate()
    slots = max(2, -(-4 * mtu * config.window // msg_size))
    # Written once before they are registered, as the bench pre-faults its regions.
    dst = b.endpoint.regions.register(bytearray(b"\x01") * (slots * msg_size))
    src = a.endpoint.regions.register(bytearray(b"\x01") * msg_size)
    b.endpoint.listen(config, lambda _pd: b"")
    now = 0.0
    sa = a.endpoint.connect(config, b.addr, b"", now)
    frozen = False
    messages = -(-total // msg_size)
    posted = completed = immediates = packets = 0
    rounds = 0
    while True:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise RuntimeError(f"no end after {MAX_ROUNDS} rounds")
        for side, other in ((a, b), (b, a)):
            # Each pull goes to the peer at once, as io sends a round before framing the next
            # (holding a whole round's buffers would time the allocator's page faults).
            arrived = other.deliver(other.endpoint.datagrams_to_send(), side, now)
            for s in list(other.endpoint.sessions.values()):
                while True:
                    t = time.perf_counter()
                    txs = s.datagrams_to_send(now, PULL)
                    other.seconds += time.perf_counter() - t
                    if not txs:
                        break
                    arrived += other.deliver(txs, side, now)
            if side is b:
                packets += arrived
            # Timers and events of every session: a pull (above) may raise events too.
            t = time.perf_counter()
            for s in list(side.endpoint.sessions.values()):
                timer = s.get_timer()
                if timer is not None and timer <= now:
                    s.handle_timer(now)
                while (event := s.next_event()) is not None:
                    if type(event) is WriteCompleted:
                        completed += 1
                    elif type(event) is ImmediateReceived:
                        immediates += 1
            side.seconds += time.perf_counter() - t
        if not frozen and sa.sender is not None:
            freeze_heap()
            frozen = True
        if sa.is_closed:
            raise RuntimeError("the writer's session closed")
        if completed >= messages:
            break
        t = time.perf_counter()
        if sa.sender is not None:
            while posted < messages and posted - completed < slots:
                n = posted
                length = min(msg_size, total - n * msg_size)
                sa.post_write(
                    src,
                    0,
                    length,
                    dst.base_va + n % slots * msg_size,
                    dst.rkey,
                    imm=n if imm else None,
                )
                posted += 1
        a.seconds += time.perf_counter() - t
        now += ROUND
    stats = sa.stats
    return {
        "rounds": rounds,
        "messages": completed,
        "immediates": immediates,
        "data_packets_received": packets,
        "retransmits": stats.retransmits,
        # The writer's connection as it ran: secured (a SecureChannel) or not.
        "secured": sa.channel is not None,
        "transmits": a.transmits,
        "sender_seconds": round(a.seconds, 6),
        "receiver_seconds": round(b.seconds, 6),
        "sender_us_per_packet": round(a.seconds / packets * 1e6, 3),
        "receiver_us_per_packet": round(b.seconds / packets * 1e6, 3),
        "sender_us_per_message": round(a.seconds / completed * 1e6, 3),
        "receiver_us_per_message": round(b.seconds / completed * 1e6, 3),
    }


#: Virtual seconds a hop takes in `--latency` (one side's turn: what it was sent arrives).
HOP = 100e-6


class _PingSink:
    """One side's end of the output loop in `--latency`: transmits queue for the other side,
    the armed deadline is kept, events go to the round-trip handler."""

    def __init__(self, side: _Side, handler: Any) -> None:
        self.side = side
        self.handler = handler
        self.queue: list[Transmit] = []
        self.deadlines: dict[int, tuple[Session, float]] = {}

    def send(self, tx: Transmit, now: float) -> SendResult:
        self.queue.append(tx)
        return SendResult.SENT

    def arm(self, session: Session, deadline: float | None, now: float) -> None:
        if deadline is None:
            self.deadlines.pop(id(session), None)
        else:
            self.deadlines[id(session)] = (session, deadline)

    def deliver(self, session: Session, events: list[Event], now: float) -> None:
        self.handler(session, events)


def pingpong(size: int, iterations: int, planes: int, security: str = "none") -> dict[str, Any]:
    """`--latency`: `iterations` round trips of one `size`-byte WRITE_WITH_IMM each way; the
    CPU each side spends in the core per round trip (receive, output loop, timers, events)."""
    ida, idb = _identities(security)
    a, b = _Side("a", 1, ida), _Side("b", 2, idb)
    config = SessionConfig(plane_mask=(1 << planes) - 1, security=security).validate()
    regions = {
        side.name: (
            side.endpoint.regions.register(bytearray(b"\x01") * size),
            side.endpoint.regions.register(bytearray(size)),
        )
        for side in (a, b)
    }
    done = [0]

    def answer(side: _Side, peer: _Side) -> Any:
        src = regions[side.name][0]
        dst = regions[peer.name][1]

        def handler(session: Session, events: list[Event]) -> None:
            for event in events:
                if type(event) is ImmediateReceived:
                    if side is a:
                        done[0] += 1
                        if done[0] >= iterations:
                            continue
                    session.post_write(src, 0, size, dst.base_va, dst.rkey, imm=event.imm + 1)
                    flushers[side.name].flush(session)

        return handler

    sinks = {a.name: _PingSink(a, answer(a, b)), b.name: _PingSink(b, answer(b, a))}
    now = [0.0]
    flushers = {name: Flusher(sink, lambda: now[0]) for name, sink in sinks.items()}
    b.endpoint.listen(config, lambda _pd: b"")
    sa = a.endpoint.connect(config, b.addr, b"", now[0])
    flushers[a.name].flush(sa)
    started = False
    frozen = False
    measured: dict[str, float] = {}
    rounds = 0
    while done[0] < iterations:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise RuntimeError(f"no end after {MAX_ROUNDS} rounds")
        for side, peer in ((b, a), (a, b)):
            sink, flusher = sinks[side.name], flushers[side.name]
            peer_sink = sinks[peer.name]
            txs = peer_sink.queue + peer.endpoint.datagrams_to_send()
            peer_sink.queue = []
            reads: dict[int, list[tuple[memoryview, Any, int, int, int]]] = {}
            for tx in txs:
                # Into a receive slot of the side's own, as io's `recvmsg_into` fills (not
                # timed; a round trip's few reads never fill the ring).
                slot, n = side.slot(tx.plane, tx.data)
                reads.setdefault(tx.plane, []).append(
                    (slot, peer.addr[tx.plane], 0, tx.segment_size or 0, n)
                )
            t = time.perf_counter()
            touched: dict[int, Session] = {}
            for plane, batch in reads.items():
                for s in side.receive_reads(plane, batch, now[0]):
                    touched.setdefault(id(s), s)
            for key, (s, deadline) in list(sink.deadlines.items()):
                if deadline <= now[0]:
                    del sink.deadlines[key]
                    s.handle_timer(now[0])
                    touched.setdefault(key, s)
            for s in touched.values():
                flusher.flush(s)
            side.seconds += time.perf_counter() - t
        now[0] += HOP
        if not started and sa.sender is not None and b.endpoint.sessions:
            started = True
            freeze_heap()
            frozen = True
            a.seconds = b.seconds = 0.0
            measured["start"] = now[0]
            dst = regions[b.name][1]
            t = time.perf_counter()
            sa.post_write(regions[a.name][0], 0, size, dst.base_va, dst.rkey, imm=0)
            flushers[a.name].flush(sa)
            a.seconds += time.perf_counter() - t
        if sa.is_closed:
            raise RuntimeError("the client's session closed")
    assert frozen
    return {
        "round_trips": done[0],
        "virtual_seconds": round(now[0] - measured["start"], 6),
        "retransmits": sa.stats.retransmits,
        "secured": sa.channel is not None,
        "client_us_per_round_trip": round(a.seconds / done[0] * 1e6, 3),
        "server_us_per_round_trip": round(b.seconds / done[0] * 1e6, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.bench_core", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "-l", "--length", default=None, help="message (WRITE) size (1M; 64 with --latency)"
    )
    p.add_argument("-n", "--bytes", default="256M", help="bytes per run (256M)")
    p.add_argument("--planes", type=int, default=4, help="planes (4)")
    p.add_argument("--payload-mtu", type=int, default=4096, help="payload bytes a packet (4096)")
    p.add_argument(
        "--flowcell",
        type=int,
        default=DEFAULT_FLOWCELL,
        help=f"packets per flowcell ({DEFAULT_FLOWCELL}, as mrc bench)",
    )
    p.add_argument("--imm", action="store_true", help="an immediate on every WRITE (as --verify)")
    p.add_argument("--repeat", type=int, default=5, help="runs; the best is reported (5)")
    p.add_argument(
        "--security",
        choices=("none", "auth", "encrypt"),
        default="none",
        help="packet protection (none; auth and encrypt as the daemon's connections)",
    )
    p.add_argument(
        "--latency", action="store_true", help="round trips of one WRITE_WITH_IMM each way"
    )
    p.add_argument(
        "--iterations", type=int, default=10_000, help="round trips a --latency run (10000)"
    )
    args = p.parse_args(argv)
    if args.latency:
        return _latency_main(args)
    try:
        size, total = _size(args.length or "1M"), _size(args.bytes)
    except ValueError as exc:
        print(f"bench_core: {exc}", file=sys.stderr)
        return 2
    if size < 1 or total < size or args.repeat < 1 or not 1 <= args.planes <= 8:
        print("bench_core: need 1 <= -l <= -n, --repeat >= 1, 1..8 planes", file=sys.stderr)
        return 2
    runs = [
        run(size, total, args.planes, args.imm, args.payload_mtu, args.flowcell, args.security)
        for _ in range(args.repeat)
    ]
    fields = {"msg_size": size, "bytes": total, "planes": args.planes, "imm": args.imm}
    return _print(fields, args.security, runs, ("sender_seconds", "receiver_seconds"))


def _print(fields: dict[str, Any], security: str, runs: list[dict[str, Any]],
           costs: tuple[str, str]) -> int:  # fmt: skip
    """The JSON document: `fields`, every run and the best (the least of the two `costs`)."""
    best = min(runs, key=lambda r: r[costs[0]] + r[costs[1]])
    doc = {"implementation": mrc.implementation(), **fields, "security": security,
           "best": best, "runs": runs}  # fmt: skip
    print(json.dumps(doc, indent=2))
    return 0


def _latency_main(args: argparse.Namespace) -> int:
    try:
        size = _size(args.length or "64")
    except ValueError as exc:
        print(f"bench_core: {exc}", file=sys.stderr)
        return 2
    if size < 1 or args.iterations < 1 or args.repeat < 1 or not 1 <= args.planes <= 8:
        print("bench_core: need -l >= 1, --iterations >= 1, --repeat >= 1, 1..8 planes",
              file=sys.stderr)  # fmt: skip
        return 2
    runs = [pingpong(size, args.iterations, args.planes, args.security) for _ in range(args.repeat)]
    fields = {"latency": True, "msg_size": size, "iterations": args.iterations,
              "planes": args.planes}  # fmt: skip
    return _print(fields, args.security, runs,
                  ("client_us_per_round_trip", "server_us_per_round_trip"))  # fmt: skip


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    if t and t[-1] in units:
        return int(t[:-1]) * units[t[-1]]
    if not t.isdigit():
        raise ValueError(f"bad size {text!r} (e.g. 4K, 1M, 256M)")
    return int(t)


if __name__ == "__main__":
    raise SystemExit(main())
