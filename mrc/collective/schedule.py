"""The ring's plans, sans I/O: which chunk each rank sends and receives at each step, and when.

A collective becomes a `Plan` over one rank's *work buffer* (the array being built, in
elements): an ordered list of send items (a range of the work buffer to WRITE into the next
rank's receive slot) and of receive items (a range the incoming chunk is reduced into or copied
to). The dependencies make the pipeline: send item j may go once `send_dep[j]` receive items
have been applied (the chunk it carries has been reduced or has arrived), and receive item j
may be applied once send item `recv_hazard[j]` has completed (the range it overwrites is not
still being read by an earlier WRITE).

- ring reduce-scatter: W - 1 steps; at step s rank r sends segment r - s - 1 and reduces
  segment r - s - 2 into its own (mod W), so after the last step segment r is complete;
- ring all-gather: W - 1 steps; at step s rank r sends segment r - s and receives r - s - 1;
- all-reduce: that reduce-scatter then that all-gather (its step 0 sends the segment just
  completed);
- broadcast: a pipeline root → root + 1 → ... → root - 1, every chunk forwarded as it lands.

Segments are `numpy.array_split`'s parts (sizes need not divide by W); every segment is cut
into the same number K of chunks of at most `chunk_elems` elements, so in a ring send item j
depends on receive item j - K. Also here: the per-collective header (what every rank checks
its neighbour agrees on) and the reductions. Moving bytes is `engine`'s.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .comm import COLLECTIVES, DTYPES, OPS, CollectiveError

__all__ = [
    "HEADER",
    "Header",
    "Plan",
    "Range",
    "plan_all_gather",
    "plan_all_reduce",
    "plan_broadcast",
    "plan_reduce_scatter",
    "reduce_into",
    "reduce_rows",
    "segments",
]

#: (element offset, element count) in the work buffer.
Range = tuple[int, int]

_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_HEADER = struct.Struct("!4sIBBBBHHQIH")
_MAGIC = b"MRCc"
#: Bytes of a header on the wire.
HEADER = _HEADER.size


@dataclass(frozen=True, slots=True)
class Header:
    """What every rank's call must agree on; sent as the first item of each collective."""

    seq: int
    kind: str
    op: str
    dtype: str
    root: int
    world: int
    count: int
    shape: tuple[int, ...]
    rank: int

    def encode(self) -> bytes:
        return _HEADER.pack(_MAGIC, self.seq & 0xFFFFFFFF, COLLECTIVES.index(self.kind),
                            OPS.index(self.op), DTYPES.index(self.dtype), 0, self.root,
                            self.world, self.count, _shape_crc(self.shape), self.rank)

    def same_call(self, data: bytes | memoryview) -> bool:
        """Whether `data` is a header of this very call (its sequence number): another rank's
        header of a later call is not a disagreement."""
        try:
            magic, seq = _HEADER.unpack(bytes(data[:HEADER]))[:2]
        except struct.error:
            return False
        return bool(magic == _MAGIC and seq == self.seq & 0xFFFFFFFF)

    def check(self, data: bytes | memoryview, what: str) -> None:
        """Raise a CollectiveError naming the first field `data` (the previous rank's header)
        disagrees on."""
        try:
            magic, seq, kind, op, dtype, _, root, world, count, crc, rank = _HEADER.unpack(
                bytes(data[:HEADER]))
        except struct.error:
            raise CollectiveError(f"{what}: a malformed header arrived") from None
        if magic != _MAGIC:
            raise CollectiveError(f"{what}: the chunk that arrived is not a header (the ranks "
                                  "are out of step)")
        theirs = f"rank {rank}"
        if seq != self.seq & 0xFFFFFFFF:
            raise CollectiveError(f"{what}: {theirs} is at collective #{seq}, this rank at "
                                  f"#{self.seq}")
        fields = (
            ("collective", _name(COLLECTIVES, kind), self.kind),
            ("op", _name(OPS, op), self.op),
            ("dtype", _name(DTYPES, dtype), self.dtype),
            ("root", root, self.root),
            ("world", world, self.world),
            ("element count", count, self.count),
        )
        for field, got, mine in fields:
            if got != mine:
                raise CollectiveError(f"{what}: {theirs} called it with {field} {got}, this "
                                      f"rank with {mine}")
        if crc != _shape_crc(self.shape):
            raise CollectiveError(f"{what}: {theirs} passed an array of another shape than "
                                  f"this rank's {self.shape}")


def _name(names: tuple[str, ...], index: int) -> str:
    return names[index] if index < len(names) else f"#{index}"


def _shape_crc(shape: tuple[int, ...]) -> int:
    return zlib.crc32(repr(tuple(shape)).encode())


@dataclass(frozen=True, slots=True)
class Plan:
    """One rank's part of one collective (see the module docstring)."""

    work_elems: int
    sends: list[Range]
    recvs: list[tuple[int, int, bool]]  # (offset, count, reduce?)
    send_dep: list[int]
    recv_hazard: list[int]


def segments(count: int, world: int) -> list[Range]:
    """`numpy.array_split`'s parts of `count` elements: the first `count % world` one longer."""
    base, extra = divmod(count, world)
    out = []
    off = 0
    for i in range(world):
        n = base + (1 if i < extra else 0)
        out.append((off, n))
        off += n
    return out


def _chunks(seg: Range, k: int) -> list[Range]:
    off, n = seg
    return [(off + o, c) for o, c in segments(n, k)]


def _chunk_count(largest: int, chunk_elems: int) -> int:
    return max(1, -(-largest // max(1, chunk_elems)))


def _hazards(sends: list[Range], send_dep: list[int],
             recvs: list[tuple[int, int, bool]]) -> list[int]:
    """For each receive item, the last send item reading the same range that does not wait
    for that receive (so it was posted before it in the rank's own order), or -1."""
    readers: dict[Range, list[int]] = {}
    for j, rng in enumerate(sends):
        if rng[1]:
            readers.setdefault(rng, []).append(j)
    out = []
    for j, (off, n, _) in enumerate(recvs):
        before = [s for s in readers.get((off, n), ()) if send_dep[s] <= j]
        out.append(max(before) if before else -1)
    return out


def _ring(world: int, rank: int, segs: list[Range], chunk_elems: int,
          phases: list[tuple[int, bool]]) -> Plan:
    """Ring steps over `segs`: each phase is (segment shift a, reduce?) for W - 1 steps in
    which rank r sends segment r - s + a and receives segment r - s - 1 + a."""
    k = _chunk_count(max(n for _, n in segs), chunk_elems)
    cut = [_chunks(seg, k) for seg in segs]
    sends: list[Range] = []
    recvs: list[tuple[int, int, bool]] = []
    for shift, reduce in phases:
        for s in range(world - 1):
            sends.extend(cut[(rank - s + shift) % world])
            recvs.extend((o, n, reduce) for o, n in cut[(rank - s - 1 + shift) % world])
    send_dep = [max(0, j - k + 1) for j in range(len(sends))]
    work = sum(n for _, n in segs)
    return Plan(work, sends, recvs, send_dep, _hazards(sends, send_dep, recvs))


def plan_all_reduce(count: int, world: int, rank: int, chunk_elems: int) -> Plan:
    return _ring(world, rank, segments(count, world), chunk_elems, [(-1, True), (0, False)])


def plan_reduce_scatter(count: int, world: int, rank: int, chunk_elems: int) -> Plan:
    return _ring(world, rank, segments(count, world), chunk_elems, [(-1, True)])


def plan_all_gather(count: int, world: int, rank: int, chunk_elems: int) -> Plan:
    """`count` elements per rank; the work buffer holds world × count, rank r's at r."""
    segs = [(i * count, count) for i in range(world)]
    return _ring(world, rank, segs, chunk_elems, [(0, False)])


def plan_broadcast(count: int, world: int, rank: int, root: int, chunk_elems: int) -> Plan:
    place = (rank - root) % world
    cut = _chunks((0, count), _chunk_count(count, chunk_elems))
    sends: list[Range] = [] if place == world - 1 else list(cut)
    recvs: list[tuple[int, int, bool]] = [] if place == 0 else [(o, n, False) for o, n in cut]
    send_dep = [0 if place == 0 else j + 1 for j in range(len(sends))]
    return Plan(count, sends, recvs, send_dep, [-1] * len(recvs))


def reduce_into(op: str, target: np.ndarray[Any, Any], incoming: np.ndarray[Any, Any]) -> None:
    """target = op(target, incoming), in place."""
    _UFUNCS[op](target, incoming, out=target)


def reduce_rows(op: str, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """op over the rows of `rows` (one per rank, in rank order): a new array."""
    out: np.ndarray[Any, Any] = _UFUNCS[op].reduce(rows, axis=0)
    return out
