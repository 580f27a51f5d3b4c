"""`mrc.client` against two real daemons on loopback planes: applications swap a region handle
through the daemons' message service, WRITE and WRITE_WITH_IMM across, and see completions and
immediates in posting order; the asyncio client keeps a long-poll in flight while it posts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from mrc.client import AsyncClient, Client, ClientError, Immediate, RegionHandle, Write, rpc
from tools.bench_daemon import TwoDaemons


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoDaemons]:
    daemons = TwoDaemons(tmp_path_factory.mktemp("daemons"))
    try:
        daemons.start()
        yield daemons
    finally:
        daemons.stop()


def test_handle_swap_write_and_immediates_in_order(pair: TwoDaemons) -> None:
    with Client(str(pair.a.sock)) as a, Client(str(pair.b.sock)) as b:
        dst = a.register_region(4 << 20, name="inbox")
        a.bind("handles")
        b.bind("replies")
        b_src = b.register_region(4 << 20)
        b_src.buf[:] = bytes(range(256)) * (16 << 10)
        # B asks, A answers with its handle: no side channel.
        b.send_message("a", "handles", b"who?")
        ask = a.recv_message("handles", timeout=10)
        assert ask is not None and (ask.peer, ask.data) == ("b", b"who?")
        a.send_message(ask.peer, "replies", dst.handle.to_json().encode())
        got = b.recv_message("replies", timeout=10)
        assert got is not None and got.peer == "a"
        handle = RegionHandle.from_json(got.data)
        assert handle == dst.handle
        with b.connect("a") as conn:
            ids = conn.write_many([Write(b_src, i << 20, 1 << 20, handle, (3 - i) << 20, imm=i)
                                   for i in range(4)])
            done = conn.wait(timeout=30)
            assert [(c.id, c.status, c.bytes) for c in done] == [(i, "ok", 1 << 20)
                                                               for i in ids]
        imms: list[int] = []
        while len(imms) < 4:
            batch = a.wait_immediates(dst, timeout=10)
            assert batch, f"immediates so far {imms}"
            imms += [i.imm for i in batch]
            assert all(i.peer == "b" and i.region == dst.id for i in batch)
        assert imms == [0, 1, 2, 3]
        for i in range(4):
            assert dst.buf[(3 - i) << 20:(4 - i) << 20] == b_src.buf[i << 20:(i + 1) << 20]


def test_receiving_on_an_endpoint_nobody_bound_is_refused(pair: TwoDaemons) -> None:
    with Client(str(pair.a.sock)) as a:
        with pytest.raises(ClientError) as err:
            a.recv_message("never-bound", timeout=0)
        assert err.value.code == rpc.INVALID_PARAMS and "bind it first" in str(err.value)
        assert a.status()["host"] == "a"


async def test_async_clients_across_two_daemons(pair: TwoDaemons) -> None:
    async with AsyncClient(str(pair.a.sock)) as a, AsyncClient(str(pair.b.sock)) as b:
        dst = await a.register_region(1 << 20)
        src = await b.register_region(1 << 20)
        src.buf[:6] = b"async!"
        # A long-poll for immediates is in flight on A while B connects and writes.
        waiting = asyncio.ensure_future(a.wait_immediates(dst, timeout=20))
        async with await b.connect("a") as conn:
            wid = await conn.write(src, 0, 6, dst.handle, 100, imm=77)
            (done,) = await conn.wait([wid], timeout=20)
            assert (done.id, done.status, done.bytes) == (wid, "ok", 6)
        imms = await waiting
        assert [(i.imm, i.peer) for i in imms] == [(77, "b")]
        assert bytes(dst.buf[100:106]) == b"async!"
        views = await asyncio.gather(a.status(), a.regions(), b.connections())
        assert views[0]["regions"] >= 1 and any(r["region"] == dst.id for r in views[1])
        await dst.close()
        assert dst.closed


async def test_a_subscribed_client_gets_its_immediates_pushed(pair: TwoDaemons) -> None:
    async with AsyncClient(str(pair.a.sock)) as a, AsyncClient(str(pair.b.sock)) as b:
        dst = await a.register_region(1 << 20)
        src = await b.register_region(1 << 20)
        src.buf[:8] = b"pushed!!"
        async with await b.connect("a") as conn:
            # One lands before A subscribes: it is pushed first, after the answer.
            (first,) = await conn.write_many([Write(src, 0, 8, dst.handle, 0, imm=1)])
            await conn.wait([first], timeout=20)
            got: list[tuple[int, str, int]] = []
            arrived = asyncio.Event()

            def on_immediates(batch: list[Immediate]) -> None:
                got.extend((i.imm, i.peer, i.region) for i in batch)
                if len(got) >= 4:
                    arrived.set()

            await a.subscribe(completions=False, on_immediates=on_immediates)
            ids = await conn.write_many([Write(src, 0, 8, dst.handle, 8 * k, imm=1 + k)
                                         for k in range(1, 4)])
            await conn.wait(ids, timeout=20)
            await asyncio.wait_for(arrived.wait(), 20)
        assert got == [(k, "b", dst.id) for k in (1, 2, 3, 4)]
        assert bytes(dst.buf[24:32]) == b"pushed!!"
        # Subscribed: a long-poll for them is refused, and so is a second subscription; the
        # client stays usable.
        with pytest.raises(ClientError, match="go to the handler") as err:
            await a.wait_immediates(dst, timeout=1)
        assert err.value.code == rpc.INVALID_PARAMS
        with pytest.raises(ClientError, match="already subscribed"):
            await a.subscribe(completions=False, on_immediates=on_immediates)
        assert (await a.status())["regions"] >= 1


def _requests(c: Client) -> int:
    """Requests the daemon served, this client's `status` included."""
    return int(c.status()["control"]["requests"])


def test_a_subscribed_blocking_client_waits_for_pushes_without_a_request(
    pair: TwoDaemons,
) -> None:
    with Client(str(pair.a.sock)) as a, Client(str(pair.b.sock)) as b:
        dst = a.register_region(1 << 20)
        src = b.register_region(1 << 20)
        with b.connect("a") as conn:
            conn.wait(conn.write_many([Write(src, 0, 8, dst.handle, 0, imm=1)]), timeout=20)
            a.subscribe(completions=False)  # the immediate already waiting is pushed first
            before = _requests(a)
            conn.wait(conn.write_many([Write(src, 0, 8, dst.handle, 8 * k, imm=1 + k)
                                       for k in range(1, 4)]), timeout=20)
            got: list[int] = []
            while len(got) < 4:
                batch = a.wait_immediates(dst, timeout=10)
                assert batch, f"immediates so far {got}"
                got += [i.imm for i in batch]
            assert got == [1, 2, 3, 4]
            assert a.wait_immediates(timeout=0.05) == []
            assert _requests(a) == before + 1  # the second status: no request to wait
        with pytest.raises(ClientError, match="already subscribed to immediates"):
            a.subscribe()


async def test_a_subscribed_async_client_without_a_handler_waits_for_pushes(
    pair: TwoDaemons,
) -> None:
    async with AsyncClient(str(pair.a.sock)) as a, AsyncClient(str(pair.b.sock)) as b:
        dst = await a.register_region(1 << 20)
        src = await b.register_region(1 << 20)
        await a.subscribe(completions=False)
        waiting = asyncio.ensure_future(a.wait_immediates(dst, timeout=20))
        async with await b.connect("a") as conn:
            await conn.wait(await conn.write_many([Write(src, 0, 8, dst.handle, 0, imm=9)]),
                            timeout=20)
        assert [(i.imm, i.peer) for i in await waiting] == [(9, "b")]
        assert await a.wait_immediates(timeout=0.05) == []


def test_pushed_completions_are_waited_for_without_a_request(pair: TwoDaemons) -> None:
    with Client(str(pair.a.sock)) as a, Client(str(pair.b.sock)) as b:
        dst = a.register_region(1 << 20)
        src = b.register_region(1 << 20)
        b.subscribe(immediates=False)
        with b.connect("a") as conn:
            before = _requests(b)
            for k in range(20):  # each completion may well come before its write's answer
                ids = conn.write_many([Write(src, 0, 4096, dst.handle, 4096 * k)])
                (done,) = conn.wait(ids, timeout=20)
                assert (done.id, done.status, done.bytes) == (ids[0], "ok", 4096)
            assert conn.poll(timeout=0.05) == [] and conn.outstanding == 0
            # 20 writes and the second status: no request to wait or poll.
            assert _requests(b) == before + 21
        with pytest.raises(ClientError, match="already subscribed to completions"):
            b.subscribe(immediates=False)


async def test_an_async_client_gets_its_completions_pushed_in_a_batch(pair: TwoDaemons) -> None:
    async with AsyncClient(str(pair.a.sock)) as a, AsyncClient(str(pair.b.sock)) as b:
        dst = await a.register_region(1 << 20)
        src = await b.register_region(1 << 20)
        await b.subscribe(immediates=False)
        async with await b.connect("a") as conn:
            posted: list[int] = []
            got: list[int] = []
            for k in range(10):
                ids, done = await b.write_batch([(conn, [Write(src, 0, 64, dst.handle, 64 * k)])],
                                                completions=True)  # fmt: skip
                posted += ids[0]
                got += [c.id for c in done]
            while len(got) < 10:
                more = await b.poll_completions(timeout=20)
                assert more, got
                got += [c.id for c in more]
            assert got == posted  # each once, in posting order
