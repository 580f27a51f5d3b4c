"""The engine over an in-memory ring whose WRITEs complete only when the story says so.

A WRITE lands in the next rank's slot when posted, but its source bytes stay the writer's
until it completes (a retransmission would read them again): `Fabric.complete` checks them
against what was sent, so a call that rewrote a buffer still in flight is caught. The stories:
a small call runs while the previous call's WRITEs are still in flight (it uses the other half
of the local buffer), the call after it waits for them, and a large call waits for all.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

np = pytest.importorskip("numpy", reason="mrc.collective needs numpy (the collective extra)")

from mrc.collective.comm import CollectiveError  # noqa: E402
from mrc.collective.engine import (  # noqa: E402
    DOUBLE_BUFFER,
    MESH_SLOT,
    WORK_OFFSET,
    await_change,
)
from mrc.collective.ring import AsyncRing  # noqa: E402

SLOTS = 4
CHUNK = 64 << 10


class Fabric:
    """`world` in-memory links in a ring; WRITEs complete when `complete` is called."""

    def __init__(self, world: int, *, mesh: bool = False) -> None:
        self.links = [FakeLink(self, r, world, mesh) for r in range(world)]
        #: Source bytes that changed before their WRITE completed: (rank, offset).
        self.overwritten: list[tuple[int, int]] = []
        #: From when on every WRITE completes as soon as it was posted.
        self.at_once = False

    def complete(self, rank: int, upto: int) -> None:
        """Complete rank `rank`'s WRITEs up to its `upto`-th, checking their source bytes."""
        link = self.links[rank]
        while link.completed < upto:
            offset, data = link.in_flight.popleft()
            if bytes(link.local()[offset:offset + len(data)]) != data:
                self.overwritten.append((rank, offset))
            link.completed += 1
        link.changed.set()

    def complete_one_shots(self, rank: int, upto: int) -> None:
        """Complete rank `rank`'s one-shot WRITEs up to its `upto`-th, checking their source."""
        link = self.links[rank]
        while link.mesh_completed < upto:
            half, data = link.mesh_in_flight.popleft()
            at = half * MESH_SLOT
            if bytes(link.mesh_out[at:at + len(data)]) != data:
                self.overwritten.append((rank, -1 - half))
            link.mesh_completed += 1
        link.changed.set()


class FakeLink:
    def __init__(self, fabric: Fabric, rank: int, world: int, mesh: bool) -> None:
        self.fabric = fabric
        self.mesh = mesh
        self.mesh_arrived = [0] * world
        self.mesh_posted = 0
        self.mesh_completed = 0
        self.mesh_in_flight: deque[tuple[int, bytes]] = deque()
        self.mesh_out = bytearray(2 * MESH_SLOT)
        self.mesh_in = memoryview(bytearray(world * 2 * MESH_SLOT))
        self.rank = rank
        self.world = world
        self.slots = SLOTS
        self.chunk_bytes = CHUNK
        self.arrived = 0
        self.credit = 0
        self.completed = 0
        self.credited = 0
        self.posted = 0
        self.changed = asyncio.Event()
        self.in_flight: deque[tuple[int, bytes]] = deque()
        self._local = memoryview(bytearray(WORK_OFFSET + (1 << 20)))
        self._recv = memoryview(bytearray(SLOTS * CHUNK))

    def _peer(self, step: int) -> FakeLink:
        return self.fabric.links[(self.rank + step) % self.world]

    def local(self) -> memoryview:
        return self._local

    async def reserve(self, work_bytes: int) -> None:
        if WORK_OFFSET + work_bytes > len(self._local):
            assert not self.in_flight, "the local buffer was replaced under WRITEs in flight"
            self._local = memoryview(bytearray(WORK_OFFSET + work_bytes))

    async def post(self, items: list[tuple[int, int, int]]) -> None:
        nxt = self._peer(1)
        for counter, offset, nbytes in items:
            assert counter == nxt.arrived and counter < self.credit + SLOTS
            data = bytes(self._local[offset:offset + nbytes])
            at = (counter % SLOTS) * CHUNK
            nxt._recv[at:at + nbytes] = data
            nxt.arrived += 1
            self.in_flight.append((offset, data))
            self.posted += 1
        nxt.changed.set()
        if self.fabric.at_once:
            self.fabric.complete(self.rank, self.posted)

    def slot(self, counter: int) -> memoryview:
        at = (counter % SLOTS) * CHUNK
        return self._recv[at:at + CHUNK]

    async def mesh_send(self, seq: int, payload: bytes, deadline: float,
                        waiting: Callable[[], str]) -> None:
        half = seq % 2
        # The staging half was last used by call seq - 2: wait for its WRITEs.
        while any(h == half for h, _ in self.mesh_in_flight):
            await self.wait(deadline, waiting)
        self.mesh_out[half * MESH_SLOT:half * MESH_SLOT + len(payload)] = payload
        for r in range(self.world):
            if r != self.rank:
                peer = self.fabric.links[r]
                assert peer.mesh_arrived[self.rank] == seq
                at = (self.rank * 2 + half) * MESH_SLOT
                peer.mesh_in[at:at + len(payload)] = payload
                peer.mesh_arrived[self.rank] += 1
                peer.changed.set()
                self.mesh_in_flight.append((half, payload))
                self.mesh_posted += 1

    def mesh_slot(self, sender: int, seq: int) -> memoryview:
        at = (sender * 2 + seq % 2) * MESH_SLOT
        return self.mesh_in[at:at + MESH_SLOT]

    def mesh_unfinished(self) -> int:
        return self.mesh_posted - self.mesh_completed

    async def give_credit(self, applied: int) -> None:
        self.credited = applied
        prev = self._peer(-1)
        prev.credit = max(prev.credit, applied)
        prev.changed.set()

    async def wait(self, deadline: float, waiting: Callable[[], str], *, chunks: bool = False,
                   credit: bool = False, completions: bool = False) -> None:
        await await_change(self.changed, deadline, waiting, lambda: None)

    async def abort(self, reason: str) -> None:
        return None

    async def close(self) -> None:
        return None


def inputs(world: int, count: int, scale: int) -> list[Any]:
    return [np.arange(count, dtype=np.float32) * scale + r for r in range(world)]


async def all_reduce(rings: list[AsyncRing], arrays: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*(ring.all_reduce(a) for ring, a in
                                       zip(rings, arrays, strict=True))))


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


@pytest.mark.parametrize("world", [2, 3, 4])
async def test_a_small_call_runs_while_the_last_ones_writes_are_in_flight(world: int) -> None:
    fabric = Fabric(world)
    rings = [AsyncRing(link, timeout=2.0) for link in fabric.links]
    count = 2 * world + 1  # does not divide by the rank count

    first = inputs(world, count, 1)
    for got in await all_reduce(rings, first):
        assert np.array_equal(got, sum(first))
    after_first = [link.posted for link in fabric.links]
    assert all(link.completed == 0 for link in fabric.links)

    # Nothing completed: the second call stages its header and work in the other half.
    second = inputs(world, count, 10)
    for got in await all_reduce(rings, second):
        assert np.array_equal(got, sum(second))
    assert all(link.completed == 0 for link in fabric.links)

    # The third call is back in the first call's half: it waits for the first call's WRITEs.
    third = inputs(world, count, 100)
    tasks = [asyncio.create_task(ring.all_reduce(a)) for ring, a in
             zip(rings, third, strict=True)]
    await settle()
    assert not any(t.done() for t in tasks)
    for r in range(world):
        fabric.complete(r, after_first[r])
    for got in await asyncio.gather(*tasks):
        assert np.array_equal(got, sum(third))
    for r, link in enumerate(fabric.links):
        fabric.complete(r, link.posted)
    assert fabric.overwritten == []


async def test_a_large_call_waits_for_every_write_in_flight() -> None:
    fabric = Fabric(2)
    rings = [AsyncRing(link, timeout=2.0) for link in fabric.links]
    small = inputs(2, 3, 1)
    await all_reduce(rings, small)
    await all_reduce(rings, small)
    assert all(link.completed == 0 for link in fabric.links)

    count = DOUBLE_BUFFER // 4 + 1  # float32: one element over the double-buffered size
    large = inputs(2, count, 1)
    tasks = [asyncio.create_task(ring.all_reduce(a)) for ring, a in
             zip(rings, large, strict=True)]
    await settle()
    assert not any(t.done() for t in tasks)
    # The second small call's WRITEs are in the other half, but a large call spans both.
    for r, link in enumerate(fabric.links):
        fabric.complete(r, link.posted - 1)
    await settle()
    assert not any(t.done() for t in tasks)
    fabric.at_once = True  # its own reduce-scatter waits for its WRITEs as it goes
    for r, link in enumerate(fabric.links):
        fabric.complete(r, link.posted)
    for got in await asyncio.gather(*tasks):
        assert np.array_equal(got, sum(large))
    assert fabric.overwritten == []


async def test_in_flight_writes_that_never_complete_time_out_naming_them() -> None:
    fabric = Fabric(2)
    rings = [AsyncRing(link, timeout=0.3) for link in fabric.links]
    small = inputs(2, 3, 1)
    await all_reduce(rings, small)
    await all_reduce(rings, small)
    with pytest.raises(CollectiveError, match=r"all_reduce #2 \(rank 0 of 2\): timed out "
                                              r"waiting for the previous call's WRITEs"):
        await rings[0].all_reduce(small[0])


@pytest.mark.parametrize("world", [2, 3, 4])
async def test_one_shot_calls_take_one_hop_and_reuse_a_slot_two_calls_later(world: int) -> None:
    fabric = Fabric(world, mesh=True)
    rings = [AsyncRing(link, timeout=2.0) for link in fabric.links]
    count = 2 * world + 1  # does not divide by the rank count

    first = inputs(world, count, 1)
    for got in await all_reduce(rings, first):
        assert np.array_equal(got, sum(first))
    gathered = await asyncio.gather(*(ring.all_gather(a) for ring, a in
                                      zip(rings, first, strict=True)))
    for got in gathered:
        assert np.array_equal(got, np.stack(first))
    # Every rank wrote to every other rank directly; nothing went round the ring.
    assert all(link.mesh_posted == 2 * (world - 1) and link.posted == 0
               for link in fabric.links)

    # Call 2 stages in call 0's half: it waits for call 0's WRITEs, not for call 1's.
    third = inputs(world, count, 100)
    tasks = [asyncio.create_task(ring.all_reduce(a, "max")) for ring, a in
             zip(rings, third, strict=True)]
    await settle()
    assert not any(t.done() for t in tasks)
    for r in range(world):
        fabric.complete_one_shots(r, world - 1)
    for got in await asyncio.gather(*tasks):
        assert np.array_equal(got, np.max(np.stack(third), axis=0))
    for r, link in enumerate(fabric.links):
        fabric.complete_one_shots(r, link.mesh_posted)
    assert fabric.overwritten == []


async def test_a_one_shot_call_and_a_ring_call_disagree_by_name() -> None:
    fabric = Fabric(2, mesh=True)
    rings = [AsyncRing(link, timeout=2.0) for link in fabric.links]
    fabric.at_once = True
    small = np.ones(3, np.float32)
    large = np.ones(DOUBLE_BUFFER, np.float32)  # over the one-shot size: a ring call
    results = await asyncio.gather(rings[0].all_reduce(small), rings[1].all_reduce(large),
                                   return_exceptions=True)
    assert [str(e) for e in results] == [
        "all_reduce #0 (rank 0 of 2): rank 1 called it with element count 524288, this rank "
        "with 3",
        "all_reduce #0 (rank 1 of 2): rank 0 called it with element count 3, this rank with "
        "524288",
    ]
