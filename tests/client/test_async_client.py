"""`mrc.client.AsyncClient` against the stand-in daemon: the same operations with coroutines,
several requests in flight on one control connection (answers matched by id), and the one-line
errors of the blocking client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_daemon import FakeDaemon

from mrc.client import AsyncClient, ClientError, Write, rpc


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    d = FakeDaemon(str(tmp_path / "mrc.sock"))
    yield d
    d.close()


async def test_register_write_wait_and_immediates(daemon: FakeDaemon) -> None:
    async with AsyncClient(daemon.path) as client:
        src = await client.register_region(4096, name="src")
        dst = await client.register_region(4096)
        src.buf[:5] = b"abcde"
        assert daemon.regions[src.id][1][:5] == b"abcde"
        async with await client.connect("self") as conn:
            ids = await conn.write_many([Write(src, 0, 5, dst.handle, 10, imm=3),
                                         Write(src, 1, 2, dst.handle)])
            done = await conn.wait(ids, timeout=5)
            assert [(c.id, c.status, c.bytes) for c in done] == [
                (ids[0], "ok", 5), (ids[1], "ok", 2)]
            assert bytes(dst.buf[10:15]) == b"abcde" and bytes(dst.buf[0:2]) == b"bc"
            imms = await client.wait_immediates(timeout=5)
            assert [(i.region, i.imm) for i in imms] == [(dst.id, 3)]
        async with dst:
            pass
        assert dst.closed and dst.id not in daemon.regions


async def test_requests_in_flight_together_get_their_own_answers(daemon: FakeDaemon) -> None:
    daemon.hold = True
    client = await AsyncClient.open(daemon.path)
    try:
        src = await client.register_region(4096)
        conn = await client.connect("self")
        (wid,) = await conn.write_many([Write(src, 0, 8, src.handle)])
        # A long-poll for the completion is in flight while status and views are answered.
        waiting = asyncio.ensure_future(conn.wait([wid], timeout=5))
        status, regions = await asyncio.gather(client.status(), client.regions())
        assert status["host"] == "fake" and regions[0]["region"] == src.id
        assert not waiting.done()
        daemon.release()
        assert [c.id for c in await waiting] == [wid]
    finally:
        await client.close()
    assert client.closed


async def test_errors_are_one_line_and_the_client_stays_usable(
    daemon: FakeDaemon, tmp_path: Path
) -> None:
    with pytest.raises(ClientError, match="no mrc daemon socket") as err:
        await AsyncClient.open(str(tmp_path / "missing.sock"))
    assert err.value.code == rpc.UNREACHABLE
    async with AsyncClient(daemon.path) as client:
        with pytest.raises(ClientError) as err:
            await client.connect("nobody")
        assert (err.value.code, str(err.value)) == (rpc.UNKNOWN_PEER, "unknown peer 'nobody'")
        src = await client.register_region(4096)
        conn = await client.connect("self")
        with pytest.raises(ClientError, match="write 0: length 0 outside") as err:
            await conn.write(src, 0, 0, src.handle)
        assert err.value.code == rpc.INVALID_PARAMS
        await client.bind("ep")
        await client.send_message("self", "ep", b"hi")
        msg = await client.recv_message("ep", timeout=5)
        assert msg is not None and msg.data == b"hi"
        assert await client.recv_message("ep", timeout=0.05) is None
        daemon.close()
        with pytest.raises(ClientError) as err:
            await client.status()
        assert err.value.code == rpc.CLOSED


async def test_register_region_names_the_peers_that_may_write_it(daemon: FakeDaemon) -> None:
    async with AsyncClient(daemon.path) as client:
        await client.register_region(4096, peers=["b"])
        assert daemon.requests[-1] == ("register_region", {"size": 4096, "peers": ["b"]})
        with pytest.raises(ClientError, match="peers must be a list"):
            await client.register_region(4096, peers="b")
