"""The ring plans without I/O: every rank's plan run in a simulated ring whose WRITEs read their
source only when delivered (at a random later time), so a plan that sends a chunk before it
was reduced gives a wrong result; checked against numpy for 1..5 ranks, sizes below, at and
not dividing by the rank count, one and many chunks. (The hazards, a receive waiting for an
earlier send of the same range to complete, are the daemon's rule that a WRITE's bytes stay
unchanged until it completes; in a ring the causality of the steps already orders them, so
the simulation cannot catch their absence.)"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import pytest

np = pytest.importorskip("numpy", reason="mrc.collective needs numpy (the collective extra)")

from mrc.collective.comm import CollectiveError  # noqa: E402
from mrc.collective.schedule import (  # noqa: E402
    Header,
    Plan,
    plan_all_gather,
    plan_all_reduce,
    plan_broadcast,
    plan_reduce_scatter,
    reduce_into,
    segments,
)


def simulate(plans: list[Plan], works: list[Any], op: str, seed: int) -> None:
    """Run the plans; a send is copied out of its rank's buffer only when delivered."""
    world = len(plans)
    rng = random.Random(seed)
    posted = [0] * world
    applied = [0] * world
    delivered = [0] * world  # sends of rank r delivered (= completed)
    wire: list[deque[tuple[int, int]]] = [deque() for _ in range(world)]  # r -> r+1
    inbox: list[list[Any]] = [[] for _ in range(world)]  # arrived chunks at r, in order
    for _ in range(100000):
        busy = False
        for r in rng.sample(range(world), world):
            plan, work = plans[r], works[r]
            while applied[r] < len(inbox[r]):
                off, n, reduce = plan.recvs[applied[r]]
                hazard = plan.recv_hazard[applied[r]]
                if hazard >= 0 and delivered[r] <= hazard:
                    break
                data = inbox[r][applied[r]]
                if reduce:
                    reduce_into(op, work[off:off + n], data)
                else:
                    work[off:off + n] = data
                applied[r] += 1
                busy = True
            while posted[r] < len(plan.sends) and applied[r] >= plan.send_dep[posted[r]]:
                wire[r].append(plan.sends[posted[r]])
                posted[r] += 1
                busy = True
            if wire[r] and rng.random() < 0.5:
                off, n = wire[r].popleft()
                inbox[(r + 1) % world].append(work[off:off + n].copy())
                delivered[r] += 1
                busy = True
        if not busy and not any(wire):
            break
    for r in range(world):
        assert applied[r] == len(plans[r].recvs), f"rank {r} stalled"
        assert posted[r] == len(plans[r].sends)


CASES = [(w, n, chunk) for w in (1, 2, 3, 4, 5) for n in (1, 3, 7, 64, 101)
         for chunk in (1, 4, 1000)]


@pytest.mark.parametrize(("world", "count", "chunk"), CASES)
def test_plans_against_numpy(world: int, count: int, chunk: int) -> None:
    rng = np.random.default_rng(world * 1000 + count)
    data = [rng.integers(-50, 50, count).astype(np.float64) for _ in range(world)]
    seed = world * 7 + count
    # all-reduce, each op
    for op, fn in (("sum", np.sum), ("max", np.max), ("min", np.min)):
        plans = [plan_all_reduce(count, world, r, chunk) for r in range(world)]
        works = [d.copy() for d in data]
        simulate(plans, works, op, seed)
        for r in range(world):
            assert np.array_equal(works[r], fn(np.stack(data), axis=0)), (op, r)
    # reduce-scatter: rank r holds array_split part r
    plans = [plan_reduce_scatter(count, world, r, chunk) for r in range(world)]
    works = [d.copy() for d in data]
    simulate(plans, works, "sum", seed)
    want = np.array_split(np.sum(np.stack(data), axis=0), world)
    for r in range(world):
        off, n = segments(count, world)[r]
        assert np.array_equal(works[r][off:off + n], want[r])
    # all-gather
    plans = [plan_all_gather(count, world, r, chunk) for r in range(world)]
    works = []
    for r in range(world):
        w = np.zeros(world * count)
        w[r * count:(r + 1) * count] = data[r]
        works.append(w)
    simulate(plans, works, "sum", seed)
    for r in range(world):
        assert np.array_equal(works[r], np.concatenate(data))
    # broadcast from the last rank
    root = world - 1
    plans = [plan_broadcast(count, world, r, root, chunk) for r in range(world)]
    works = [data[r].copy() if r == root else np.zeros(count) for r in range(world)]
    simulate(plans, works, "sum", seed)
    for r in range(world):
        assert np.array_equal(works[r], data[root])


def test_segments_split_like_numpy() -> None:
    for count in (0, 1, 5, 17):
        for world in (1, 3, 4):
            parts = np.array_split(np.arange(count), world)
            assert [n for _, n in segments(count, world)] == [len(p) for p in parts]


def test_header_names_the_disagreement() -> None:
    mine = Header(3, "all_reduce", "sum", "float32", 0, 4, 10, (10,), 1)
    mine.check(mine.encode(), "x")  # agrees: no error
    cases = [
        (Header(3, "all_reduce", "max", "float32", 0, 4, 10, (10,), 0), "op max"),
        (Header(3, "all_reduce", "sum", "float64", 0, 4, 10, (10,), 0), "dtype float64"),
        (Header(3, "all_gather", "sum", "float32", 0, 4, 10, (10,), 0), "collective all_gather"),
        (Header(3, "all_reduce", "sum", "float32", 0, 4, 12, (12,), 0), "element count 12"),
        (Header(4, "all_reduce", "sum", "float32", 0, 4, 10, (10,), 0), "collective #4"),
        (Header(3, "all_reduce", "sum", "float32", 0, 4, 10, (2, 5), 0), "another shape"),
    ]
    for theirs, words in cases:
        with pytest.raises(CollectiveError, match=words):
            mine.check(theirs.encode(), "all_reduce #3")
    with pytest.raises(CollectiveError, match="not a header"):
        mine.check(bytes(64), "all_reduce #3")
