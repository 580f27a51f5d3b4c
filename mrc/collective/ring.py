"""The communicators: argument checks, plans run by the engine (or one-shot calls, when the
link has them), results copied out.

`AsyncRing` is the coroutine communicator over any `engine.Link` (`comm.AsyncCommunicator`);
`Ring` is the blocking one (`comm.Communicator`): it runs an `AsyncRing` on an event loop of
its own in a background thread, so the link's long-polls (immediates, completions, messages)
keep being answered between calls however long the caller computes, and each call waits for
its coroutine there. Either way a `CollectiveError` spends the communicator: the other ranks
are told (`Link.abort`) and every later call raises at once.

Transports build the link and wrap it here; this module knows neither daemons nor sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np

from mrc.io.loop import new_event_loop

from .comm import DTYPES, OPS, CollectiveError
from .engine import ONE_SHOT_MAX, Engine, Link, check_deadline
from .schedule import (
    Header,
    Plan,
    plan_all_gather,
    plan_all_reduce,
    plan_broadcast,
    plan_reduce_scatter,
    reduce_rows,
    segments,
)

__all__ = ["AsyncRing", "Ring", "run_blocking"]

T = TypeVar("T")
#: All-reduces of arrays of at most this many bytes (and one chunk) go as an all-gather
#: (docs/COLLECTIVE.md §1): half the hops, for sizes whose time is mostly hops.
SMALL_ALL_REDUCE = 64 << 10
#: How long telling the other ranks about a failure, and closing, may take.
ABORT_SECONDS = 2.0
DRAIN_SECONDS = 10.0
CLOSE_SECONDS = DRAIN_SECONDS + 5.0


def _check_array(array: Any, what: str) -> np.ndarray[Any, Any]:
    if not isinstance(array, np.ndarray):
        raise CollectiveError(f"{what}: expected a numpy array, got {type(array).__name__}")
    if array.dtype.name not in DTYPES or array.dtype.byteorder not in "=|":
        raise CollectiveError(f"{what}: dtype {array.dtype} is not one of {', '.join(DTYPES)} "
                              "(native byte order)")
    return array


def _check_op(op: Any, what: str) -> str:
    if op not in OPS:
        raise CollectiveError(f"{what}: op must be one of {', '.join(OPS)}, got {op!r}")
    return str(op)


class AsyncRing:
    """A communicator over `link` (see `comm`); `timeout` is the default of every call."""

    def __init__(self, link: Link, timeout: float) -> None:
        self.rank = link.rank
        self.world = link.world
        self.timeout = timeout
        self.link = link
        self._engine = Engine(link)
        self._seq = 0
        self._failed: CollectiveError | None = None
        self._abort: asyncio.Task[None] | None = None
        self._closed = False

    async def all_reduce(self, array: np.ndarray[Any, Any], op: str = "sum", *,
                         timeout: float | None = None) -> np.ndarray[Any, Any]:
        return await self._collective("all_reduce", array, op, 0, timeout)

    async def all_gather(self, array: np.ndarray[Any, Any], *,
                         timeout: float | None = None) -> np.ndarray[Any, Any]:
        return await self._collective("all_gather", array, "sum", 0, timeout)

    async def reduce_scatter(self, array: np.ndarray[Any, Any], op: str = "sum", *,
                             timeout: float | None = None) -> np.ndarray[Any, Any]:
        return await self._collective("reduce_scatter", array, op, 0, timeout)

    async def broadcast(self, array: np.ndarray[Any, Any], root: int = 0, *,
                        timeout: float | None = None) -> np.ndarray[Any, Any]:
        return await self._collective("broadcast", array, "sum", root, timeout)

    async def barrier(self, *, timeout: float | None = None) -> None:
        await self._collective("barrier", np.zeros(1, np.int32), "sum", 0, timeout)

    async def _collective(self, kind: str, array: Any, op: str, root: Any,
                          timeout: float | None) -> np.ndarray[Any, Any]:
        seq = self._seq
        what = f"{kind} #{seq} (rank {self.rank} of {self.world})"
        if self._closed:
            raise CollectiveError(f"{what}: the communicator is closed")
        if self._failed is not None:
            raise CollectiveError(f"{what}: the communicator failed earlier: {self._failed}")
        self._seq += 1
        loop = asyncio.get_running_loop()
        try:
            deadline = check_deadline(timeout, self.timeout, loop.time())
            arr = _check_array(array, what)
            op = _check_op(op, what)
            if isinstance(root, bool) or not isinstance(root, int) or not (
                    0 <= root < self.world):
                raise CollectiveError(f"{what}: root must be a rank 0..{self.world - 1}, "
                                      f"got {root!r}")
            return await self._run(kind, arr, op, root, seq, deadline, what)
        except CollectiveError as exc:
            err = exc if str(exc).startswith(what) else CollectiveError(f"{what}: {exc}")
            await self._fail(err)
            raise err from None
        except Exception as exc:  # a transport's OSError or client error: one line
            err = CollectiveError(f"{what}: {type(exc).__name__}: {exc}")
            await self._fail(err)
            raise err from None

    async def _fail(self, exc: CollectiveError) -> None:
        """Spend the communicator and tell the other ranks, in the background: the caller
        gets its error now, not after a dead peer's daemon failed to answer (`close` waits
        for the telling, bounded)."""
        self._failed = exc
        self._abort = asyncio.get_running_loop().create_task(self._tell(str(exc)))

    async def _tell(self, reason: str) -> None:
        # Best effort: the others time out anyway.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.link.abort(reason), ABORT_SECONDS)

    async def _run(self, kind: str, arr: np.ndarray[Any, Any], op: str, root: int, seq: int,
                   deadline: float, what: str) -> np.ndarray[Any, Any]:
        world, rank = self.world, self.rank
        dtype = arr.dtype
        flat = arr.reshape(-1)
        count = flat.size
        chunk = max(1, self.link.chunk_bytes // dtype.itemsize)
        header = Header(seq, kind if kind != "barrier" else "all_gather", op, dtype.name, root,
                        world, count, tuple(arr.shape), rank)
        plan: Plan
        # A small all-reduce is an all-gather of the whole arrays, then a local reduction:
        # W - 1 hops of the ring instead of 2(W - 1), and the same sum on every rank.
        gather = kind in ("all_gather", "barrier") or (
            kind == "all_reduce" and count * dtype.itemsize <= SMALL_ALL_REDUCE
            and count <= chunk)
        if gather:
            plan = plan_all_gather(count, world, rank, chunk)
        elif kind == "all_reduce":
            plan = plan_all_reduce(count, world, rank, chunk)
        elif kind == "reduce_scatter":
            plan = plan_reduce_scatter(count, world, rank, chunk)
        else:
            plan = plan_broadcast(count, world, rank, root, chunk)
        if (gather and self._engine.mesh is not None
                and count * dtype.itemsize <= ONE_SHOT_MAX):
            # One hop instead of W - 1 (docs/COLLECTIVE.md §6).
            rows = await self._engine.one_shot(header, flat, deadline, what)
            if kind == "all_reduce":
                return reduce_rows(op, rows).astype(dtype, copy=False).reshape(arr.shape)
            return rows.reshape((world, *arr.shape))
        await self._engine.begin(plan.work_elems * dtype.itemsize, deadline)
        work = self._engine.work_view(dtype, plan.work_elems)
        if gather:
            work[rank * count:(rank + 1) * count] = flat
        elif kind != "broadcast" or rank == root:
            work[:count] = flat
        if world > 1:
            work = await self._engine.run(plan, header, dtype, op, deadline, what)
        if kind == "all_reduce" and gather:
            rows = work[:world * count].reshape(world, count)
            return reduce_rows(op, rows).astype(dtype, copy=False).reshape(arr.shape)
        if gather:
            return np.array(work[:world * count]).reshape((world, *arr.shape))
        if kind == "reduce_scatter":
            off, n = segments(count, world)[rank]
            return np.array(work[off:off + n])
        return np.array(work[:count]).reshape(arr.shape)

    async def close(self) -> None:
        """Let the last call's WRITEs complete (the next rank may still need them: closing
        cancels what is in flight), bounded by DRAIN_SECONDS, then close the link."""
        if self._closed:
            return
        self._closed = True
        if self._failed is None:
            deadline = asyncio.get_running_loop().time() + DRAIN_SECONDS
            with contextlib.suppress(CollectiveError):
                await self._engine.drain(deadline)
        if self._abort is not None:
            await asyncio.wait([self._abort], timeout=ABORT_SECONDS + 1.0)
        await self.link.close()


def run_blocking(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on `loop` (running in another thread) and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class Ring:
    """The blocking communicator: an `AsyncRing` on a private loop in a daemon thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 ring: AsyncRing) -> None:
        self.loop = loop
        self._thread = thread
        self._ring = ring
        self.rank = ring.rank
        self.world = ring.world
        self.link = ring.link

    @staticmethod
    def start_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        loop = new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="mrc-collective", daemon=True)
        thread.start()
        return loop, thread

    def all_reduce(self, array: np.ndarray[Any, Any], op: str = "sum", *,
                   timeout: float | None = None) -> np.ndarray[Any, Any]:
        return run_blocking(self.loop, self._ring.all_reduce(array, op, timeout=timeout))

    def all_gather(self, array: np.ndarray[Any, Any], *,
                   timeout: float | None = None) -> np.ndarray[Any, Any]:
        return run_blocking(self.loop, self._ring.all_gather(array, timeout=timeout))

    def reduce_scatter(self, array: np.ndarray[Any, Any], op: str = "sum", *,
                       timeout: float | None = None) -> np.ndarray[Any, Any]:
        return run_blocking(self.loop, self._ring.reduce_scatter(array, op, timeout=timeout))

    def broadcast(self, array: np.ndarray[Any, Any], root: int = 0, *,
                  timeout: float | None = None) -> np.ndarray[Any, Any]:
        return run_blocking(self.loop, self._ring.broadcast(array, root, timeout=timeout))

    def barrier(self, *, timeout: float | None = None) -> None:
        run_blocking(self.loop, self._ring.barrier(timeout=timeout))

    def close(self) -> None:
        """Close the link (bounded: a stuck daemon cannot hold it) and stop the loop."""
        if self.loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._ring.close(), self.loop).result(CLOSE_SECONDS)
        except Exception:  # the loop goes anyway; what it held is closed with it
            pass
        finally:
            stop_loop(self.loop, self._thread)

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel what still runs on `loop`, stop it, join its thread and close it."""
    async def _cancel_rest() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    if loop.is_running():
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_rest(), loop).result(5.0)
        loop.call_soon_threadsafe(loop.stop)
    thread.join(5.0)
    if not loop.is_running():
        loop.close()
