"""`mrc.collective` on real daemons on loopback planes (2, 3 and 4 of them, started once per
world size) and over TCP: every collective, op and dtype against numpy, sizes that do not
divide by the rank count and arrays of many chunks; small calls one-shot over either; ranks
that disagree, bad arguments, a rank killed mid-collective: one clear CollectiveError on every
rank, within its timeout."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy", reason="mrc.collective needs numpy (the collective extra)")

from mrc.collective import CollectiveError, open_mrc, open_mrc_async, open_tcp  # noqa: E402
from mrc.collective.engine import ONE_SHOT_MAX  # noqa: E402
from mrc.collective.launch import DaemonSpec, environ, loopback_daemons  # noqa: E402
from mrc.collective.mrc_link import MESH_STAGING  # noqa: E402
from mrc.collective.ring import Ring, stop_loop  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: Small chunks and few slots, so a few thousand elements already take many pipelined chunks
#: and the credits wrap the slots many times.
CHUNK, SLOTS = 4096, 4


def parallel(world: int, fn: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """fn(rank) in one thread per rank; each result, or the exception it raised."""
    out: list[Any] = [None] * world

    def run(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as exc:  # handed back to the test
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a rank hung"
    return out


def ok(results: list[Any]) -> list[Any]:
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


class Ring3:
    """A world of daemons and the communicators of one test."""

    def __init__(self, specs: list[DaemonSpec]) -> None:
        self.specs = specs
        self.world = len(specs)
        self.groups = 0

    def open(self, timeout: float = 20.0) -> list[Ring]:
        self.groups += 1
        group = f"t{os.getpid()}g{self.groups}"
        peers = [s.host for s in self.specs]
        return ok(parallel(self.world, lambda r: open_mrc(
            self.specs[r].socket, r, self.world, peers, timeout=timeout, group=group,
            chunk_bytes=CHUNK, slots=SLOTS)))


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda w: f"{w}ranks")
def daemons(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ring3]:
    with loopback_daemons(request.param, tmp_path_factory.mktemp("coll"), secure=False) as s:
        yield Ring3(s)


def close_all(comms: list[Ring]) -> None:
    for c in comms:
        c.close()


def data_of(rank: int, count: int, dtype: str) -> Any:
    rng = np.random.default_rng(rank * 7919 + count)
    return rng.integers(-1000, 1000, count).astype(dtype)


def check_everything(comms: list[Any], world: int) -> None:
    """Every collective against numpy: float32 with every op at sizes from one element to
    several chunks per segment (not dividing by the rank count), the other dtypes at one."""
    many = world * (CHUNK // 4) + 3  # float32: two chunks per segment, sizes uneven

    def cases() -> Iterator[tuple[str, int, tuple[str, ...]]]:
        for count in (1, world * 3 + 1, many):
            yield "float32", count, ("sum", "max", "min")
        for dtype in ("float64", "int32", "int64"):
            yield dtype, world * 3 + 1, ("sum",)

    def body(r: int) -> None:
        comm = comms[r]
        for dtype, count, ops in cases():
            parts = [data_of(k, count, dtype) for k in range(world)]
            stack = np.stack(parts)
            mine = parts[r].reshape(-1, 1) if count % 2 else parts[r]
            for op in ops:
                fn = {"sum": np.sum, "max": np.max, "min": np.min}[op]
                got = comm.all_reduce(mine, op, timeout=20)
                want = fn(stack, axis=0).astype(dtype).reshape(mine.shape)
                assert got.dtype == mine.dtype and np.array_equal(got, want), (op, count)
            op = ops[-1]
            fn = {"sum": np.sum, "max": np.max, "min": np.min}[op]
            rs = comm.reduce_scatter(parts[r], op, timeout=20)
            assert np.array_equal(rs, np.array_split(fn(stack, axis=0).astype(dtype),
                                                     world)[r])
            ag = comm.all_gather(mine, timeout=20)
            assert ag.shape == (world, *mine.shape)
            assert np.array_equal(ag.reshape(world, -1), stack)
            root = count % world
            bc = comm.broadcast(mine, root, timeout=20)
            assert np.array_equal(bc.reshape(-1), parts[root])
        comm.barrier(timeout=20)

    ok(parallel(world, body, timeout=100))


def test_every_collective_against_numpy(daemons: Ring3) -> None:
    comms = daemons.open()
    try:
        check_everything(comms, daemons.world)
    finally:
        close_all(comms)


def test_small_calls_take_one_hop(daemons: Ring3) -> None:
    """An all-reduce within a chunk, an all-gather and a barrier of at most 64 KiB per rank:
    every rank writes every other rank directly (docs/COLLECTIVE.md §6), nothing goes round
    the ring, and the results are numpy's, at a size that does not divide by the ranks."""
    world = daemons.world
    comms = daemons.open()
    count = 2 * world + 1

    def body(r: int) -> None:
        comm = comms[r]
        parts = [data_of(k, count, "float32") for k in range(world)]
        for _ in range(3):  # both halves of the slots, then the first again
            got = comm.all_reduce(parts[r], "sum", timeout=20)
            assert np.array_equal(got, np.sum(np.stack(parts), axis=0).astype("float32"))
        assert np.array_equal(comm.all_gather(parts[r], timeout=20), np.stack(parts))
        comm.barrier(timeout=20)

    try:
        ok(parallel(world, body))
        for r, comm in enumerate(comms):
            link: Any = comm.link
            assert link.arrived == 0 and link.credit == 0
            assert link.mesh_arrived == [0 if k == r else 5 for k in range(world)]
    finally:
        close_all(comms)


def test_a_small_call_is_one_control_request(daemons: Ring3) -> None:
    """A one-shot call posts its W - 1 WRITEs in one JSON-RPC batch (one line to the daemon,
    one back), and the daemon pushes the completions and immediates: no request per WRITE
    and none for a completion or an arrival; the staging slots wrap several times and every
    result is numpy's (docs/COLLECTIVE.md §6)."""
    world = daemons.world
    comms = daemons.open()
    calls = 4 * MESH_STAGING + 1
    count = world + 2
    asked: list[list[tuple[str, ...]]] = [[] for _ in range(world)]

    def counting(r: int) -> None:
        link: Any = comms[r].link
        client = link.client
        one, batch = client._call, client._call_batch

        async def call(c: Any) -> Any:
            asked[r].append((c.method,))
            return await one(c)

        async def call_batch(cs: Any) -> Any:
            asked[r].append(tuple(c.method for c in cs))
            return await batch(cs)

        client._call, client._call_batch = call, call_batch

    def body(r: int) -> None:
        parts = [data_of(k, count, "float64") for k in range(world)]
        want = np.sum(np.stack(parts), axis=0)
        for _ in range(calls):
            assert np.array_equal(comms[r].all_reduce(parts[r], timeout=20), want)

    try:
        for r in range(world):
            counting(r)
        ok(parallel(world, body))
        for r in range(world):
            assert asked[r] == [("write",) * (world - 1)] * calls, asked[r]
    finally:
        close_all(comms)


async def test_write_batch_and_poll_completions(daemons: Ring3) -> None:
    """What one-shot calls stand on (`AsyncClient.write_batch`, `poll_completions`): WRITEs
    on two connections in one request, their completions in one long-poll; a bad post
    raises its error before anything is sent."""
    if daemons.world != 3:
        pytest.skip("one world size is enough for the client's batch")
    from mrc.client import AsyncClient, ClientError, Write

    a, b, c = daemons.specs
    ca, cb, cc = [await AsyncClient.open(s.socket) for s in (a, b, c)]
    try:
        src = await ca.register_region(4096, "batch-src")
        rb, rc = await cb.register_region(4096, "batch-b"), await cc.register_region(4096, "c")
        to_b, to_c = await ca.connect(b.host), await ca.connect(c.host)
        src.buf[:8] = b"12345678"
        ids, done = await ca.write_batch([(to_b, [Write(src, 0, 8, rb.handle, 0, 7)]),
                                          (to_c, [Write(src, 0, 8, rc.handle, 8),
                                                  Write(src, 0, 8, rc.handle, 16)])],
                                         completions=True)
        assert [len(i) for i in ids] == [1, 2] and done == []
        got: list[Any] = []
        while len(got) < 3:
            got += await ca.poll_completions(timeout=5.0)
        assert sorted(x.id for x in got) == sorted(ids[0] + ids[1])
        assert all(x.ok for x in got)
        assert bytes(rb.buf[:8]) == b"12345678" == bytes(rc.buf[16:24])
        assert [i.imm for i in await cb.wait_immediates(rb, timeout=5.0)] == [7]
        # A post the client can tell is wrong raises before anything is sent.
        with pytest.raises(ClientError, match="outside the handle"):
            await ca.write_batch([(to_b, [Write(src, 0, 8, rb.handle, 0)]),
                                  (to_c, [Write(src, 0, 8, rc.handle, 4095)])])
        assert to_b.outstanding == 0 and to_c.outstanding == 0
    finally:
        for client in (ca, cb, cc):
            await client.close()


async def test_the_asyncio_flavour(daemons: Ring3) -> None:
    """`open_mrc_async`: both ranks' communicators as coroutines on one event loop."""
    if daemons.world != 2:
        pytest.skip("one world size is enough for the asyncio flavour")
    peers = [s.host for s in daemons.specs]
    rings = await asyncio.gather(*(open_mrc_async(
        daemons.specs[r].socket, r, 2, peers, timeout=20, group=f"aio{os.getpid()}",
        chunk_bytes=CHUNK, slots=SLOTS) for r in range(2)))
    try:
        arrays = [np.arange(2001, dtype=np.float64) * (r + 1) for r in range(2)]
        got = await asyncio.gather(*(rings[r].all_reduce(arrays[r], "max", timeout=20)
                                     for r in range(2)))
        for g in got:
            assert np.array_equal(g, arrays[1])
        gathered = await asyncio.gather(*(rings[r].all_gather(arrays[r], timeout=20)
                                          for r in range(2)))
        assert np.array_equal(gathered[0], np.stack(arrays))
        await asyncio.gather(*(rings[r].barrier(timeout=20) for r in range(2)))
    finally:
        await asyncio.gather(*(r.close() for r in rings))


def test_ranks_that_disagree_all_fail(daemons: Ring3) -> None:
    world = daemons.world
    comms = daemons.open()
    try:
        def body(r: int) -> Any:
            dtype = "float64" if r == world - 1 else "float32"
            return comms[r].all_reduce(np.ones(10, dtype), timeout=10)

        t0 = time.monotonic()
        out = parallel(world, body)
        assert time.monotonic() - t0 < 12
        for r in out:
            assert isinstance(r, CollectiveError), r
        msgs = " | ".join(str(e) for e in out)
        assert "with dtype float" in msgs and "float64" in msgs and "float32" in msgs, msgs
        # The communicator is spent: the next call says why at once.
        with pytest.raises(CollectiveError, match="failed earlier"):
            comms[0].barrier(timeout=5)
    finally:
        close_all(comms)


def test_bad_arguments_are_one_line_errors(daemons: Ring3) -> None:
    """A bad argument is a CollectiveError at the caller, and the other ranks are told: their
    next call fails at once naming it (the communicator is spent, as after any failure)."""
    world = daemons.world
    if world != 2:
        pytest.skip("one world size is enough for argument checks")
    bad: list[tuple[Callable[[Ring], Any], str]] = [
        (lambda c: c.all_reduce([1.0, 2.0]), "expected a numpy array, got list"),  # type: ignore
        (lambda c: c.all_reduce(np.ones(3, np.complex64)), "dtype complex64"),
        (lambda c: c.all_reduce(np.ones(3), "prod"), "op must be one of"),
        (lambda c: c.broadcast(np.ones(3), world), "root must be a rank"),
        (lambda c: c.all_gather(np.ones(3), timeout=-1), "timeout must be"),
    ]
    for call, words in bad:
        comms = daemons.open()
        try:
            with pytest.raises(CollectiveError, match=words):
                call(comms[0])
            t0 = time.monotonic()
            with pytest.raises(CollectiveError, match=f"rank 0 .*failed: .*{words}"):
                comms[1].barrier(timeout=10)
            assert time.monotonic() - t0 < 5
        finally:
            close_all(comms)
    peers = [s.host for s in daemons.specs]
    with pytest.raises(CollectiveError, match="rank must be"):
        open_mrc(daemons.specs[0].socket, world, world, peers)
    with pytest.raises(CollectiveError, match=r"should be on r1 but the daemon .* is r0"):
        open_mrc(daemons.specs[0].socket, 1, world, peers, timeout=3)
    with pytest.raises(CollectiveError, match="no mrc daemon socket"):
        open_mrc("/nonexistent/mrc.sock", 0, world, peers)
    with pytest.raises(CollectiveError, match="no hello from rank 1"):
        open_mrc(daemons.specs[0].socket, 0, world, peers, timeout=1, group="alone")


def test_a_killed_rank_fails_every_other_rank(daemons: Ring3,
                                              tmp_path: Path) -> None:
    """The last rank is a process running all-reduces; it is killed mid-way. Every other rank
    gets one CollectiveError within its timeout (much sooner: the others are told)."""
    world = daemons.world
    if world != 3:
        pytest.skip("one world size is enough for the kill test")
    group = f"kill{os.getpid()}"
    peers = ",".join(s.host for s in daemons.specs)
    last = world - 1
    args = ["--transport", "mrc", "--rank", str(last), "--world", str(world), "--socket",
            daemons.specs[last].socket, "--peers", peers, "--group", group, "--chunk",
            str(CHUNK), "--slots", str(SLOTS), "-o", "all_reduce", "-b", "256K", "-e", "256K",
            "-n", "100000", "-w", "0", "--timeout", "10"]
    proc = subprocess.Popen([sys.executable, "-m", "mrc.collective.rank", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=environ(), cwd=ROOT)
    try:
        comms = ok(parallel(last, lambda r: open_mrc(
            daemons.specs[r].socket, r, world, peers.split(","), timeout=20, group=group,
            chunk_bytes=CHUNK, slots=SLOTS)))
        timeout = 6.0
        killed_at: list[float] = []

        def body(r: int) -> tuple[float, Any]:
            # The rank process's sequence: barrier, then the timed all-reduce, repeated.
            from mrc.collective.rank import inputs
            it = 0
            try:
                while True:
                    comms[r].barrier(timeout=timeout)
                    comms[r].all_reduce(inputs(r, 65536, "float32", it), timeout=timeout)
                    it += 1
                    if it == 3 and r == 0:
                        proc.send_signal(signal.SIGKILL)
                        killed_at.append(time.monotonic())
            except CollectiveError as exc:
                return time.monotonic(), exc

        out = parallel(last, body, timeout=30)
        for when, exc in out:
            assert isinstance(exc, CollectiveError)
            assert when - killed_at[0] < timeout + 2.0, exc
        close_all(comms)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_daemon_that_goes_fails_every_rank(tmp_path: Path) -> None:
    """Three daemons of their own (this one is killed): the ranks loop over all-reduces and
    the last rank's daemon gets SIGKILL; every rank raises one CollectiveError, in time."""
    timeout = 5.0
    with loopback_daemons(3, tmp_path, secure=False) as specs:
        peers = [s.host for s in specs]
        comms = ok(parallel(3, lambda r: open_mrc(specs[r].socket, r, 3, peers, timeout=20,
                                                  group="gone", chunk_bytes=CHUNK,
                                                  slots=SLOTS)))
        killed_at: list[float] = []

        def body(r: int) -> tuple[float, Any]:
            it = 0
            try:
                while True:
                    comms[r].all_reduce(np.full(20000, r, np.float32), timeout=timeout)
                    it += 1
                    if it == 3 and r == 0:
                        proc = specs[2].proc
                        assert proc is not None
                        proc.send_signal(signal.SIGKILL)
                        killed_at.append(time.monotonic())
            except CollectiveError as exc:
                return time.monotonic(), exc

        try:
            out = parallel(3, body, timeout=40)
            for when, exc in out:
                assert isinstance(exc, CollectiveError)
                assert when - killed_at[0] < timeout + 2.0, exc
        finally:
            close_all(comms)


def _tcp_addresses(world: int) -> list[tuple[str, int]]:
    out = []
    for _ in range(world):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            out.append(("127.0.0.1", int(s.getsockname()[1])))
    return out


def test_tcp_against_numpy_and_a_closed_rank() -> None:
    world = 3
    addrs = _tcp_addresses(world)
    comms = ok(parallel(world, lambda r: open_tcp(r, world, addrs, timeout=20,
                                                  chunk_bytes=CHUNK, slots=SLOTS)))
    try:
        check_everything(comms, world)
        # A rank that goes away: its neighbours see the socket close, the abort goes round.
        comms[2].close()
        out = parallel(2, lambda r: comms[r].all_reduce(np.ones(1000), timeout=10))
        for exc in out:
            assert isinstance(exc, CollectiveError)
            assert "rank 2" in str(exc) or "rank 1 failed" in str(exc) or \
                "rank 0 failed" in str(exc), exc
    finally:
        close_all(comms)


def test_collective_bench_command(tmp_path: Path) -> None:
    """`mrc collective-bench` end to end: 2 loopback daemons, the JSON rows, nothing wrong."""
    proc = subprocess.run(
        [sys.executable, "-m", "mrc", "collective-bench", "--ranks", "2", "-b", "8", "-e", "64K",
         "-f", "32", "-n", "2", "-w", "1", "--security", "none", "-J",
         "--ring-write-baseline", "4M"],
        capture_output=True, text=True, env=environ(), cwd=ROOT, timeout=90, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["size"] for r in doc["rows"]] == [8, 256, 8192]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in doc["rows"])
    assert doc["rows"][-1]["busbw_GBps"] == pytest.approx(doc["rows"][-1]["algbw_GBps"], 0.01)
    assert doc["ring_write"]["mean_link_GBps"] > 0
    assert doc["goals"]["busbw_vs_ring_write"]["ratio"] > 0


def test_ranks_that_share_daemons_go_round_the_ring(tmp_path: Path) -> None:
    """Four ranks on two daemons (neighbours on different ones): no connection to a rank of
    the same daemon, so no one-shot calls; small calls go round the ring and are right."""
    with loopback_daemons(2, tmp_path, secure=False) as specs:
        peers = [specs[r % 2].host for r in range(4)]
        comms = ok(parallel(4, lambda r: open_mrc(specs[r % 2].socket, r, 4, peers,
                                                  timeout=20, group="shared",
                                                  chunk_bytes=CHUNK, slots=SLOTS)))
        parts = [data_of(k, 9, "float32") for k in range(4)]
        try:
            got = ok(parallel(4, lambda r: comms[r].all_reduce(parts[r], timeout=20)))
            for g in got:
                assert np.array_equal(g, np.sum(np.stack(parts), axis=0).astype("float32"))
            for comm in comms:
                link: Any = comm.link
                assert link.mesh is False and link.arrived == 4  # a header and 3 chunks
        finally:
            close_all(comms)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_small_tcp_calls_take_one_hop(world: int) -> None:
    """All-reduces within a chunk (every op, float32 and float64), an all-gather of exactly
    ONE_SHOT_MAX bytes per rank and a barrier: nothing goes round the ring (no chunk arrives,
    no credit comes back), one message from every other rank per call, numpy's results."""
    addrs = _tcp_addresses(world)
    comms = ok(parallel(world, lambda r: open_tcp(r, world, addrs, timeout=20,
                                                  chunk_bytes=CHUNK, slots=SLOTS)))
    count = 2 * world + 1  # not divisible by the rank count
    big = ONE_SHOT_MAX // 4  # float32 elements: the largest one-shot all-gather

    def body(r: int) -> None:
        comm = comms[r]
        for dtype in ("float32", "float64"):
            parts = [data_of(k, count, dtype) for k in range(world)]
            stack = np.stack(parts)
            for op, fn in (("sum", np.sum), ("max", np.max), ("min", np.min)):
                got = comm.all_reduce(parts[r], op, timeout=20)
                assert got.dtype == parts[r].dtype
                assert np.array_equal(got, fn(stack, axis=0).astype(dtype)), (dtype, op)
        parts = [data_of(k, big, "float32") for k in range(world)]
        assert np.array_equal(comm.all_gather(parts[r], timeout=20), np.stack(parts))
        comm.barrier(timeout=20)

    try:
        ok(parallel(world, body))
        for r, comm in enumerate(comms):
            link: Any = comm.link
            assert (link.arrived, link.credit, link.completed) == (0, 0, 0)
            assert link.mesh_arrived == [0 if k == r else 8 for k in range(world)]
    finally:
        close_all(comms)


def test_a_larger_all_gather_still_goes_round_the_tcp_ring() -> None:
    """One element more than a one-shot call carries: the ring (W - 1 hops), right too."""
    world = 3
    addrs = _tcp_addresses(world)
    comms = ok(parallel(world, lambda r: open_tcp(r, world, addrs, timeout=20,
                                                  chunk_bytes=CHUNK, slots=SLOTS)))
    count = ONE_SHOT_MAX // 4 + 1
    parts = [data_of(k, count, "float32") for k in range(world)]
    try:
        got = ok(parallel(world, lambda r: comms[r].all_gather(parts[r], timeout=20)))
        for g in got:
            assert np.array_equal(g, np.stack(parts))
        for comm in comms:
            link: Any = comm.link
            assert link.mesh_arrived == [0] * world
            assert link.arrived > world - 1  # a header and the chunks of W - 1 steps
    finally:
        close_all(comms)


def test_a_killed_tcp_rank_fails_every_other_rank_at_once() -> None:
    """Four ranks over TCP, the last one a process looping barrier + 8-byte all-reduce (all
    one-shot); it is killed after a few calls. Every other rank raises one CollectiveError
    naming it, well within the call's timeout: the one-shot call waits for every rank, and a
    rank whose connection closed while its message is due is gone, not late."""
    world, last, timeout = 4, 3, 8.0
    addrs = _tcp_addresses(world)
    args = ["--transport", "tcp", "--rank", str(last), "--world", str(world), "--addresses",
            ",".join(f"{h}:{p}" for h, p in addrs), "--chunk", str(CHUNK), "--slots",
            str(SLOTS), "-o", "all_reduce", "-b", "8", "-e", "8", "-n", "100000", "-w", "0",
            "--timeout", str(timeout)]
    proc = subprocess.Popen([sys.executable, "-m", "mrc.collective.rank", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=environ(), cwd=ROOT)
    comms: list[Any] = []
    try:
        comms = ok(parallel(last, lambda r: open_tcp(r, world, addrs, timeout=20,
                                                     chunk_bytes=CHUNK, slots=SLOTS)))
        killed_at: list[float] = []

        def body(r: int) -> tuple[float, Any, int]:
            # The rank process's sequence: barrier, then the timed all-reduce, repeated.
            from mrc.collective.rank import inputs
            it = 0
            try:
                while True:
                    comms[r].barrier(timeout=timeout)
                    comms[r].all_reduce(inputs(r, 2, "float32", it), timeout=timeout)
                    it += 1
                    if it == 5 and r == 0:
                        proc.send_signal(signal.SIGKILL)
                        killed_at.append(time.monotonic())
            except CollectiveError as exc:
                return time.monotonic(), exc, it

        out = parallel(last, body, timeout=30)
        for when, exc, it in out:
            assert isinstance(exc, CollectiveError)
            assert "\n" not in str(exc) and "rank 3" in str(exc), exc
            assert it >= 4
            assert when - killed_at[0] < timeout / 2, exc
        for comm in comms:
            link: Any = comm.link
            assert link.arrived == 0  # every call before the kill was one-shot
            assert link.mesh_arrived[last] >= 8
    finally:
        close_all(comms)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_tcp_rank_that_never_comes_fails_the_bootstrap_in_time() -> None:
    """Ranks 0 and 1 of 3 open; rank 2 never does. Both fail within their timeout naming
    rank 2, and close every socket (and loop) they opened."""
    world, timeout = 3, 2.0
    addrs = _tcp_addresses(world)
    stop_loop(*Ring.start_loop())  # what the event loop library opens once per process
    fds = len(os.listdir("/proc/self/fd"))
    t0 = time.monotonic()
    out = parallel(2, lambda r: open_tcp(r, world, addrs, timeout=timeout, chunk_bytes=CHUNK,
                                         slots=SLOTS))
    assert time.monotonic() - t0 < timeout + 3.0
    for r, exc in enumerate(out):
        assert isinstance(exc, CollectiveError), exc
        assert str(exc).startswith(f"rank {r}: ") and "rank 2" in str(exc), exc
    assert len(os.listdir("/proc/self/fd")) == fds



@pytest.mark.parametrize("odd, field", [("dtype", "with dtype float"),
                                         ("broadcast", "with collective ")])
def test_tcp_ranks_that_disagree_in_a_one_shot_call_all_fail(odd: str, field: str) -> None:
    """Three ranks over TCP gather 7 floats (a one-shot call) after a barrier; the last rank
    gathers float64 instead, or broadcasts (round the ring). Every rank raises one
    CollectiveError, the field they disagree on named, well within the timeout."""
    world = 3
    addrs = _tcp_addresses(world)
    comms = ok(parallel(world, lambda r: open_tcp(r, world, addrs, timeout=20,
                                                  chunk_bytes=CHUNK, slots=SLOTS)))

    def body(r: int) -> Any:
        comm = comms[r]
        comm.barrier(timeout=10)
        if r < world - 1:
            return comm.all_gather(np.ones(7, np.float32), timeout=10)
        if odd == "dtype":
            return comm.all_gather(np.ones(7, np.float64), timeout=10)
        return comm.broadcast(np.ones(7, np.float32), timeout=10)

    try:
        t0 = time.monotonic()
        out = parallel(world, body)
        assert time.monotonic() - t0 < 8
        for exc in out:
            assert isinstance(exc, CollectiveError), exc
        msgs = " | ".join(str(e) for e in out)
        assert field in msgs, msgs
        for r, comm in enumerate(comms):
            link: Any = comm.link
            # The barrier went one-shot: a message from every other rank.
            assert link.mesh_arrived[r] == 0 and min(
                n for k, n in enumerate(link.mesh_arrived) if k != r) >= 1
    finally:
        close_all(comms)
