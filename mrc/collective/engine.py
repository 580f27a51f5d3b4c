"""The pipeline: one rank's part of a collective, driven over a transport's `Link`.

`Engine.run(plan, ...)` walks a `schedule.Plan`: it applies receive items as their chunks land
in the receive slots (the header first, checked against this rank's own call), posts send
items as soon as their dependencies are met and the next rank has a free slot for them, and
returns when everything was applied and posted; `begin` waits for the sends to complete
before the next call writes the buffers again. A call whose work buffer is at most
`DOUBLE_BUFFER` bytes alternates with the previous small call between two halves of the local
buffer (header and work), so it only waits for the sends of the call before that one: the
previous call's last WRITEs (and the barrier's before a timed call) complete while this call
already runs. Item counters run over the communicator's
life, not per collective: item c lands in slot c mod `slots` of the next rank, and that
rank's credit (how many items it has applied) is what lets the sender reuse a slot, so a slot
is never overwritten unread, across collectives too. Credits go back in batches of half the
slots (fewer than all of them, so a ring cannot stall with every rank holding back a credit:
docs/COLLECTIVE.md §2).

The `Link` protocol is what this module needs from a transport (`mrc_link` over the daemons,
`tcp_link` over sockets): a local buffer (header at 0, the work buffer at `WORK_OFFSET`), the
posting of items into the next rank's slots, the slots themselves, credits back to the
previous rank, and a wait that returns when any counter moved or raises a `CollectiveError`
for a failure, an abort from another rank, or the deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, cast

import numpy as np

from .comm import CollectiveError
from .schedule import HEADER, Header, Plan, reduce_into

__all__ = ["DOUBLE_BUFFER", "MESH_SLOT", "ONE_SHOT_MAX", "WORK_OFFSET", "Engine", "Link",
           "MeshLink", "await_change"]

#: Where the work buffer starts in the local buffer (the header staging area is before it).
WORK_OFFSET = 4096
#: Work buffers of at most this many bytes are double-buffered (see the module docstring):
#: two halves of it fit the local buffer a link starts with (WORK_OFFSET + 1 MiB).
DOUBLE_BUFFER = 512 << 10
#: Where the header of the second half is staged (the first is at 0).
_HEADER_B = WORK_OFFSET // 2
#: A one-shot call's message (docs/COLLECTIVE.md §6): the header padded to MESH_HEADER bytes,
#: then the array, of at most ONE_SHOT_MAX bytes.
MESH_HEADER = 64
ONE_SHOT_MAX = 64 << 10
MESH_SLOT = MESH_HEADER + ONE_SHOT_MAX


class Link(Protocol):
    """A rank's transport to its ring neighbours (see the module docstring)."""

    rank: int
    world: int
    slots: int
    chunk_bytes: int
    #: Items of the previous rank landed in our slots, in order (counted from the start).
    arrived: int
    #: Items the next rank has applied (we may post items below credit + slots).
    credit: int
    #: Our posted items whose sends completed, in order.
    completed: int
    #: The last credit we gave the previous rank.
    credited: int

    def local(self) -> memoryview: ...

    async def reserve(self, work_bytes: int) -> None: ...

    async def post(self, items: list[tuple[int, int, int]]) -> None:
        """Send items (counter, local offset, bytes) into the next rank's slots, in order."""

    def slot(self, counter: int) -> memoryview: ...

    async def give_credit(self, applied: int) -> None: ...

    async def wait(self, deadline: float, waiting: Callable[[], str], *, chunks: bool = False,
                   credit: bool = False, completions: bool = False) -> None:
        """Until a counter moved, or raise a CollectiveError. What the caller waits for:
        `chunks` (arrived), `credit`, `completions` (completed: fetch them now); a
        neighbour that left only matters for what is still wanted from it."""

    async def abort(self, reason: str) -> None: ...

    async def close(self) -> None: ...


class MeshLink(Link, Protocol):
    """A link that can also write every other rank at once (one-shot calls, when `mesh`):
    a slot per sending rank and call parity at each rank; the sender waits for its own
    WRITEs of an earlier call (n - 4 over MRC) to complete before it stages call n in their
    place."""

    mesh: bool
    #: One-shot messages of each rank landed here, in order (counted from the start).
    mesh_arrived: list[int]

    async def mesh_send(self, seq: int, payload: bytes, deadline: float,
                        waiting: Callable[[], str]) -> None: ...

    def mesh_slot(self, sender: int, seq: int) -> memoryview: ...

    def mesh_unfinished(self) -> int:
        """Our one-shot WRITEs not completed yet."""


async def await_change(changed: asyncio.Event, deadline: float, waiting: Callable[[], str],
                       failure: Callable[[], CollectiveError | None]) -> None:
    """A link's `wait`, whatever carries it: until `changed` is set or `deadline` (loop time)
    passes, then clear it; raise the link's failure if it has one, or a timeout that says what
    was awaited (`waiting()`)."""
    left = deadline - asyncio.get_running_loop().time()
    if left <= 0:
        raise CollectiveError(f"timed out {waiting()}")
    if not changed.is_set():
        try:
            await asyncio.wait_for(changed.wait(), left)
        except TimeoutError:
            err = failure()
            if err is not None:
                raise err from None
            raise CollectiveError(f"timed out {waiting()}") from None
    changed.clear()
    err = failure()
    if err is not None:
        raise err


class Engine:
    """The item counters of one communicator and the loop that runs a plan."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.posted = 0
        self.applied = 0
        self.batch = max(1, link.slots // 2)
        #: Where this call stages its header and its work buffer in the local buffer.
        self.header_at = 0
        self.work_at = WORK_OFFSET
        #: When the last call was small: its half (0, 1) and `posted` when it began.
        self._last_half: int | None = None
        self._last_start = 0
        self.mesh: MeshLink | None = cast(MeshLink, link) if getattr(link, "mesh", False) \
            else None
        #: One-shot calls run so far.
        self.one_shots = 0

    async def begin(self, work_bytes: int, deadline: float) -> None:
        """Make room for a call of `work_bytes`: wait for the sends that still read the part
        of the local buffer it will write (every earlier one, or for a small call after a
        small one only those before that one) and grow the buffer when needed."""
        link = self.link
        small = (work_bytes <= DOUBLE_BUFFER
                 and len(link.local()) >= WORK_OFFSET + 2 * DOUBLE_BUFFER)
        if small and self._last_half is not None:
            half, upto = 1 - self._last_half, self._last_start
        else:
            half, upto = 0, self.posted
        await self.drain(deadline, upto)
        if not small:
            await link.reserve(work_bytes)
        self._last_half = half if small else None
        self._last_start = self.posted
        self.header_at = _HEADER_B if half else 0
        self.work_at = WORK_OFFSET + half * DOUBLE_BUFFER

    async def run(self, plan: Plan, header: Header, dtype: np.dtype[Any], op: str,
                  deadline: float, what: str) -> np.ndarray[Any, Any]:
        """Run `plan`; returns the work buffer (a view: copy out what you keep). The caller
        filled the work buffer (`work_view`) before."""
        link = self.link
        size = dtype.itemsize
        work = self.work_view(dtype, plan.work_elems)
        local = link.local()
        n_send = len(plan.sends) + 1 if plan.sends else 0
        n_recv = len(plan.recvs) + 1 if plan.recvs else 0
        base_s, base_r = self.posted, self.applied
        s = p = 0
        if n_send:
            local[self.header_at:self.header_at + HEADER] = header.encode()
        prev = (link.rank - 1) % link.world

        def waiting() -> str:
            state = (f" (items sent {self.posted}, completed {link.completed}, credit "
                     f"{link.credit}; arrived {link.arrived}, applied {self.applied})")
            if p < n_recv and link.arrived <= base_r + p:
                return f"waiting for chunk {p} of {n_recv} from rank {prev}{state}"
            if s < n_send and base_s + s >= link.credit + link.slots:
                nxt = (link.rank + 1) % link.world
                return f"waiting for rank {nxt} to free a slot{state}"
            return f"waiting for WRITEs to complete{state}"

        while True:
            moved = False
            while p < n_recv and link.arrived > base_r + p:
                if p == 0:
                    header.check(link.slot(base_r), what)
                else:
                    off, n, reduce = plan.recvs[p - 1]
                    hazard = plan.recv_hazard[p - 1]
                    if hazard >= 0 and link.completed < base_s + hazard + 2:
                        break
                    if n:
                        incoming = np.frombuffer(link.slot(base_r + p), dtype, n)
                        if reduce:
                            reduce_into(op, work[off:off + n], incoming)
                        else:
                            work[off:off + n] = incoming
                p += 1
                moved = True
            self.applied = base_r + p
            batch: list[tuple[int, int, int]] = []
            while s < n_send and base_s + s < link.credit + link.slots:
                if s == 0:
                    batch.append((base_s, self.header_at, HEADER))
                else:
                    dep = plan.send_dep[s - 1]
                    if dep and p - 1 < dep:
                        break
                    off, n = plan.sends[s - 1]
                    batch.append((base_s + s, self.work_at + off * size, n * size))
                s += 1
            if batch:
                await link.post(batch)
                self.posted = base_s + s
                moved = True
            # After the sends: the next hop of the ring does not wait for our credit.
            if self.applied - link.credited >= self.batch:
                await link.give_credit(self.applied)
            if p == n_recv and s == n_send:
                # Our last sends may still be in flight: `begin` waits for them before the
                # buffers are written again (a later call), not here.
                return work
            if not moved:
                if p < n_recv:
                    self._stray_one_shot(header, what)
                await link.wait(
                    deadline, waiting,
                    chunks=p < n_recv and link.arrived <= base_r + p,
                    credit=s < n_send and base_s + s >= link.credit + link.slots,
                    completions=p < n_recv and link.arrived > base_r + p)  # a hazard

    async def drain(self, deadline: float, upto: int | None = None) -> None:
        """Wait until the first `upto` items posted (all of them and every one-shot WRITE
        when None) have completed (their source bytes are free again)."""
        link = self.link
        target = self.posted if upto is None else upto
        while link.completed < target or (upto is None and self.mesh is not None
                                          and self.mesh.mesh_unfinished()):
            await link.wait(deadline, lambda: "waiting for the previous call's WRITEs to "
                                              "complete", completions=True)

    async def one_shot(self, header: Header, flat: np.ndarray[Any, Any], deadline: float,
                       what: str) -> np.ndarray[Any, Any]:
        """All-gather `flat` (at most ONE_SHOT_MAX bytes) in one hop: write it to every
        other rank at once and read theirs; returns the rows (world × count, rank order)."""
        mesh = self.mesh
        assert mesh is not None
        seq = self.one_shots
        self.one_shots += 1
        world, rank = mesh.world, mesh.rank

        def missing() -> list[int]:
            return [r for r in range(world) if r != rank and mesh.mesh_arrived[r] <= seq]

        def waiting() -> str:
            return (f"waiting for one-shot call {seq} from rank(s) "
                    f"{', '.join(map(str, missing()))}")

        await mesh.mesh_send(seq, header.encode().ljust(MESH_HEADER, b"\0") + flat.tobytes(),
                             deadline, lambda: f"waiting for one-shot call {seq - 2}'s WRITEs "
                                               "to complete")
        rows = np.empty((world, flat.size), flat.dtype)
        rows[rank] = flat
        todo = [r for r in range(world) if r != rank]
        while True:
            later = []
            for r in todo:
                if mesh.mesh_arrived[r] > seq:
                    slot = mesh.mesh_slot(r, seq)
                    header.check(slot, what)
                    rows[r] = np.frombuffer(slot, flat.dtype, flat.size, MESH_HEADER)
                else:
                    later.append(r)
            todo = later
            if not todo:
                return rows
            if mesh.arrived > self.applied and header.same_call(mesh.slot(self.applied)):
                # The previous rank began a ring call instead: its header says how it differs.
                header.check(mesh.slot(self.applied), what)
            await mesh.wait(deadline, waiting, chunks=True)

    def _stray_one_shot(self, header: Header, what: str) -> None:
        """While a ring call waits: a rank that began a one-shot call instead disagrees, and
        its header says how."""
        mesh = self.mesh
        if mesh is None:
            return
        for r in range(mesh.world):
            if r != mesh.rank and mesh.mesh_arrived[r] > self.one_shots:
                slot = mesh.mesh_slot(r, self.one_shots)
                if header.same_call(slot):
                    header.check(slot, what)

    def work_view(self, dtype: np.dtype[Any], elems: int) -> np.ndarray[Any, Any]:
        return np.frombuffer(self.link.local(), dtype, elems, self.work_at)


def check_deadline(timeout: float | None, default: float, now: float) -> float:
    """The deadline of a call given its `timeout` (None: the communicator's default)."""
    t = default if timeout is None else timeout
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < float("inf"):
        raise CollectiveError(f"timeout must be a positive number of seconds, got {t!r}")
    return now + float(t)
