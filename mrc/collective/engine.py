"""The pipeline: one rank's part of a collective, driven over a transport's `Link`.

`Engine.run(plan, ...)` walks a `schedule.Plan`: it applies receive items as their chunks land
in the receive slots (the header first, checked against this rank's own call), posts send
items as soon as their dependencies are met and the next rank has a free slot for them, and
returns when everything was applied and posted; `drain` waits for the sends to complete
before the next call writes the buffers again. Item counters run over the communicator's
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
from typing import Any, Protocol

import numpy as np

from .comm import CollectiveError
from .schedule import HEADER, Header, Plan, reduce_into

__all__ = ["WORK_OFFSET", "Engine", "Link", "await_change"]

#: Where the work buffer starts in the local buffer (the header staging area is before it).
WORK_OFFSET = 4096


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
            local[:HEADER] = header.encode()
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
                    batch.append((base_s, 0, HEADER))
                else:
                    dep = plan.send_dep[s - 1]
                    if dep and p - 1 < dep:
                        break
                    off, n = plan.sends[s - 1]
                    batch.append((base_s + s, WORK_OFFSET + off * size, n * size))
                s += 1
            if batch:
                await link.post(batch)
                self.posted = base_s + s
                moved = True
            # After the sends: the next hop of the ring does not wait for our credit.
            if self.applied - link.credited >= self.batch:
                await link.give_credit(self.applied)
            if p == n_recv and s == n_send:
                # Our last sends may still be in flight: `drain` waits for them before the
                # buffers are written again (the next call), not here.
                return work
            if not moved:
                await link.wait(
                    deadline, waiting,
                    chunks=p < n_recv and link.arrived <= base_r + p,
                    credit=s < n_send and base_s + s >= link.credit + link.slots,
                    completions=p < n_recv and link.arrived > base_r + p)  # a hazard

    async def drain(self, deadline: float) -> None:
        """Wait until every item posted has completed (its source bytes are free again)."""
        link = self.link
        while link.completed < self.posted:
            await link.wait(deadline, lambda: "waiting for the previous call's WRITEs to "
                                              "complete", completions=True)

    def work_view(self, dtype: np.dtype[Any], elems: int) -> np.ndarray[Any, Any]:
        return np.frombuffer(self.link.local(), dtype, elems, WORK_OFFSET)


def check_deadline(timeout: float | None, default: float, now: float) -> float:
    """The deadline of a call given its `timeout` (None: the communicator's default)."""
    t = default if timeout is None else timeout
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < float("inf"):
        raise CollectiveError(f"timeout must be a positive number of seconds, got {t!r}")
    return now + float(t)
