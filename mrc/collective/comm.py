"""What a communicator is: the collectives' interface, their error, and their vocabulary.

A communicator joins `world` ranks (processes, one per host in practice) in a ring and runs
collectives on numpy arrays. Every rank calls the same collectives in the same order with
arrays of the same shape and dtype (the root's array alone counts for `broadcast`); a rank
that disagrees, dies, or whose daemon or connection goes makes every surviving rank raise one
`CollectiveError` within its timeout, never hang. After a `CollectiveError` the communicator
is spent: `close()` it and open a new one (as NCCL's communicators after an abort).

    class Communicator(Protocol):
        rank: int          # this process's place in the ring, 0..world-1
        world: int         # how many ranks
        def all_reduce(array, op="sum", *, timeout=None) -> ndarray      # same shape as array
        def all_gather(array, *, timeout=None) -> ndarray                # (world, *array.shape)
        def reduce_scatter(array, op="sum", *, timeout=None) -> ndarray  # this rank's part
        def broadcast(array, root=0, *, timeout=None) -> ndarray         # the root's array
        def barrier(*, timeout=None) -> None
        def close() -> None

`reduce_scatter` reduces the flattened array and returns rank r's part of it, the parts cut
as `numpy.array_split(flat, world)` does (the first `size % world` parts one element longer),
so sizes that do not divide by the rank count work; `numpy.concatenate` of every rank's result
is the all-reduce. Results are new arrays: the caller's array is only read. `op` is one of
`OPS` (sum, max, min), dtypes those of `DTYPES` (float32, float64, int32, int64). `timeout`
(seconds) bounds the whole call; None takes the communicator's default.

The factories, each returning a blocking `Communicator` (every rank calls its own):

- `mrc.collective.open_mrc(socket_path, rank, world, peers, *, timeout=30.0, group="mrc",
  chunk_bytes=..., slots=...)`: over the MRC daemons' application API. `peers[i]` is the
  daemon host name of rank i (the name the other daemons list it under; own entry included,
  it is checked against the local daemon's `status`). Neighbouring ranks need different
  daemons that list each other as peers. The ranks find each other through the daemons'
  message service only (endpoint `<group>.<rank>`), so `group` must be the same on every rank
  and differ between communicators that run at once on the same daemons. `timeout` bounds the
  bootstrap and is the collectives' default.
- `mrc.collective.open_tcp(rank, world, addresses, *, mptcp=False, timeout=30.0,
  chunk_bytes=..., slots=...)`: the same ring and one-shot calls over TCP (or MPTCP), a
  connection to every other rank (ring neighbours only above 64 ranks, docs/COLLECTIVE.md §2);
  `addresses[i]` is the (host, port) rank i listens on.

`open_mrc_async` and `open_tcp_async` return the coroutine twin (`AsyncCommunicator`: the
same methods as coroutines, `await comm.close()`), for code already running an event loop;
the blocking communicators drive one on a private loop and must not be called from a running
one.

A rank as a process: `python -m mrc.collective.rank --transport mrc|tcp|mptcp ...` (see
`mrc.collective.rank`); `mrc.collective.launch` starts those for a whole ring, on loopback
planes or on the testbed's hosts. The algorithm, the slot/credit protocol and the error
semantics are described in docs/COLLECTIVE.md.

This module holds the interface only; the ring is `ring` and `engine`, the transports
`mrc_link` and `tcp_link`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "COLLECTIVES",
    "DTYPES",
    "OPS",
    "AsyncCommunicator",
    "CollectiveError",
    "Communicator",
]

#: Reduction operations, by name.
OPS = ("sum", "max", "min")
#: Element types, by numpy name.
DTYPES = ("float32", "float64", "int32", "int64")
#: The collectives, by name (`-o` of `mrc collective-bench`).
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")


class CollectiveError(Exception):
    """A collective failed: a bad argument, ranks that disagree, a rank or daemon gone, a
    timeout. One line naming the collective, its sequence number and the reason."""


class Communicator(Protocol):
    rank: int
    world: int

    def all_reduce(self, array: np.ndarray[Any, Any], op: str = "sum", *,
                   timeout: float | None = None) -> np.ndarray[Any, Any]: ...

    def all_gather(self, array: np.ndarray[Any, Any], *,
                   timeout: float | None = None) -> np.ndarray[Any, Any]: ...

    def reduce_scatter(self, array: np.ndarray[Any, Any], op: str = "sum", *,
                       timeout: float | None = None) -> np.ndarray[Any, Any]: ...

    def broadcast(self, array: np.ndarray[Any, Any], root: int = 0, *,
                  timeout: float | None = None) -> np.ndarray[Any, Any]: ...

    def barrier(self, *, timeout: float | None = None) -> None: ...

    def close(self) -> None: ...


class AsyncCommunicator(Protocol):
    rank: int
    world: int

    async def all_reduce(self, array: np.ndarray[Any, Any], op: str = "sum", *,
                         timeout: float | None = None) -> np.ndarray[Any, Any]: ...

    async def all_gather(self, array: np.ndarray[Any, Any], *,
                         timeout: float | None = None) -> np.ndarray[Any, Any]: ...

    async def reduce_scatter(self, array: np.ndarray[Any, Any], op: str = "sum", *,
                             timeout: float | None = None) -> np.ndarray[Any, Any]: ...

    async def broadcast(self, array: np.ndarray[Any, Any], root: int = 0, *,
                        timeout: float | None = None) -> np.ndarray[Any, Any]: ...

    async def barrier(self, *, timeout: float | None = None) -> None: ...

    async def close(self) -> None: ...
