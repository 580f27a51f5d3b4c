"""`mrc.client.Client` against a stand-in daemon on a real Unix socket with real SCM_RIGHTS.

Stories: a region's memory is shared with the daemon (bytes written by either side are seen by
the other), a WRITE_WITH_IMM lands and its completion and immediate come back, every argument
check of a WRITE is made on the client (nothing reaches the socket) with the daemon's code, the
daemon's refusals come back as one-line `ClientError`s and the client stays usable.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_daemon import CAP, FakeDaemon

from mrc.client import Client, ClientError, RegionHandle, Write, rpc


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    d = FakeDaemon(str(tmp_path / "mrc.sock"))
    yield d
    d.close()


@pytest.fixture
def client(daemon: FakeDaemon) -> Iterator[Client]:
    with Client(daemon.path) as c:
        yield c


def sent(daemon: FakeDaemon, method: str) -> int:
    return sum(1 for m, _ in daemon.requests if m == method)


def test_region_memory_is_shared_with_the_daemon(client: Client, daemon: FakeDaemon) -> None:
    region = client.register_region(1 << 16, name="shared")
    assert region.size == 1 << 16
    assert region.handle == RegionHandle("fake", region.id, 0x1000 + region.id, 1 << 40, 1 << 16)
    region.buf[100:105] = b"hello"
    mapping = daemon.regions[region.id][1]
    assert mapping[100:105] == b"hello"
    mapping[0:3] = b"abc"
    assert bytes(region.buf[0:3]) == b"abc"
    # The fd went with the request, as the only one, and the client closed its copy after.
    assert daemon.requests[-1] == ("register_region", {"size": 1 << 16, "name": "shared"})
    region.close()
    assert region.closed and region.id not in daemon.regions
    with pytest.raises(ClientError, match="closed"):
        region.buf[0] = 1


def test_write_with_imm_lands_and_completes(client: Client, daemon: FakeDaemon) -> None:
    src = client.register_region(8192)
    dst = client.register_region(8192)
    src.buf[0:4096] = bytes(range(256)) * 16
    with client.connect("self") as conn:
        first = conn.write(src, 0, 4096, dst.handle, remote_offset=4096, imm=7)
        second = conn.write(src, 10, 6, dst.handle)
        done = conn.wait([first, second], timeout=5)
        assert [(c.id, c.status, c.bytes) for c in done] == [
            (first, "ok", 4096), (second, "ok", 6)]
        assert bytes(dst.buf[4096:8192]) == bytes(range(256)) * 16
        assert bytes(dst.buf[0:6]) == bytes(range(10, 16))
        imms = client.wait_immediates(dst, timeout=5)
        assert [(i.region, i.imm, i.peer, i.connection) for i in imms] == [
            (dst.id, 7, "self", conn.id)]
        assert client.wait_immediates(timeout=0.05) == []
        assert conn.outstanding == 0


def test_write_into_a_deregistered_region_is_a_remote_access_error(client: Client) -> None:
    src = client.register_region(4096)
    dst = client.register_region(4096)
    handle = dst.handle
    dst.close()
    with client.connect("self") as conn:
        ids = conn.write_many([Write(src, 0, 100, handle), Write(src, 0, 1, handle, imm=1)])
        assert [c.status for c in conn.wait(ids, timeout=5)] == ["remote_access_error"] * 2


@pytest.mark.parametrize(
    ("kwargs", "code", "message"),
    [
        ({"length": 0}, rpc.INVALID_PARAMS, "write 0: length 0 outside 1..2147483648"),
        ({"length": (1 << 31) + 1}, rpc.INVALID_PARAMS, "length 2147483649 outside 1.."),
        ({"offset": 4000, "length": 200}, rpc.OUT_OF_BOUNDS,
         "write 0: local range 4000+200 outside the region's 4096 bytes"),
        ({"offset": -1}, rpc.OUT_OF_BOUNDS, "local range -1+16"),
        ({"remote_offset": 8190}, rpc.OUT_OF_BOUNDS,
         "write 0: remote range 8190+16 outside the handle's 8192 bytes"),
        ({"imm": -1}, rpc.INVALID_PARAMS, "write 0: imm -1 outside 0..4294967295"),
        ({"imm": 1 << 32}, rpc.INVALID_PARAMS, "imm 4294967296 outside"),
        ({"remote": RegionHandle("fake", 9, 1, (1 << 64) - 4096, 8192), "remote_offset": 4090},
         rpc.INVALID_PARAMS, "write 0: remote VA range overflows 64 bits"),
    ],
)
def test_every_write_argument_check_is_made_before_sending(
    client: Client, daemon: FakeDaemon, kwargs: dict[str, object], code: int, message: str
) -> None:
    src = client.register_region(4096)
    dst = client.register_region(8192)
    args: dict[str, object] = {"region": src, "offset": 0, "length": 16, "remote": dst.handle}
    args.update(kwargs)
    with client.connect("self") as conn:
        with pytest.raises(ClientError, match=message.replace("+", r"\+")) as err:
            conn.write_many([Write(**args)])  # type: ignore[arg-type]
        assert err.value.code == code
        assert "\n" not in str(err.value)
        assert sent(daemon, "write") == 0
        assert conn.outstanding == 0


def test_a_bad_write_names_its_index_and_none_of_the_call_is_posted(
    client: Client, daemon: FakeDaemon
) -> None:
    src = client.register_region(4096)
    with client.connect("self") as conn:
        good = Write(src, 0, 16, src.handle)
        with pytest.raises(ClientError, match="write 2: length 0") as err:
            conn.write_many([good, good, Write(src, 0, 0, src.handle)])
        assert err.value.code == rpc.INVALID_PARAMS
        assert sent(daemon, "write") == 0
        assert conn.write_many([good, good]) and conn.outstanding == 2


def test_a_region_of_another_client_or_a_closed_one_is_refused(
    client: Client, daemon: FakeDaemon
) -> None:
    src = client.register_region(4096)
    with Client(daemon.path) as other:
        foreign = other.register_region(4096)
        with client.connect("self") as conn:
            with pytest.raises(ClientError, match="write 0: region is not registered") as err:
                conn.write(foreign, 0, 16, src.handle)
            assert err.value.code == rpc.UNKNOWN_REGION
            src.close()
            with pytest.raises(ClientError, match="not registered"):
                conn.write(src, 0, 16, foreign.handle)
    assert sent(daemon, "write") == 0


def test_outstanding_write_cap_is_the_daemons_and_the_client_stays_usable(
    client: Client, daemon: FakeDaemon
) -> None:
    daemon.hold = True
    src = client.register_region(4096)
    with client.connect("self") as conn:
        ids = conn.write_many([Write(src, i, 1, src.handle) for i in range(CAP)])
        with pytest.raises(ClientError, match="more than 4 outstanding") as err:
            conn.write(src, 0, 1, src.handle)
        assert err.value.code == rpc.TOO_MANY_OUTSTANDING
        assert conn.outstanding == CAP
        # Nothing completes while held: a bounded wait returns what came (nothing).
        assert conn.wait(ids, timeout=0.1) == []
        assert conn.poll() == []
        daemon.release()
        assert [c.id for c in conn.wait(timeout=5)] == ids
        assert conn.outstanding == 0
        assert client.status()["host"] == "fake"


def test_wait_returns_only_the_ids_asked_for_and_keeps_the_rest(client: Client) -> None:
    src = client.register_region(4096)
    with client.connect("self") as conn:
        a, b, c = conn.write_many([Write(src, 0, 1, src.handle)] * 3)
        assert [x.id for x in conn.wait([b], timeout=5)] == [b]
        assert [x.id for x in conn.poll(timeout=1)] == [a, c]
        with pytest.raises(ClientError, match=rf"wait: ids \[{b}\] were not posted"):
            conn.wait([b])


def test_unknown_peer_is_one_line_and_the_client_stays_connected(client: Client) -> None:
    with pytest.raises(ClientError) as err:
        client.connect("nobody")
    assert (err.value.code, str(err.value)) == (rpc.UNKNOWN_PEER, "unknown peer 'nobody'")
    with pytest.raises(ClientError, match="unknown peer") as err:
        client.send_message("nobody", "x", b"hi")
    assert client.connect("self").peer == "self"


def test_small_messages_through_an_endpoint(client: Client, daemon: FakeDaemon) -> None:
    client.bind("handles")
    region = client.register_region(4096)
    client.send_message("self", "handles", region.handle.to_json().encode())
    client.send_message("self", "handles", b"\x00\xff")
    msg = client.recv_message("handles", timeout=5)
    assert msg is not None and msg.peer == "self"
    assert RegionHandle.from_json(msg.data) == region.handle
    # The second came in the same answer and waited in the client.
    requests = len(daemon.requests)
    assert client.recv_message("handles", timeout=5) == msg.__class__("self", b"\x00\xff")
    assert len(daemon.requests) == requests
    assert client.recv_message("handles", timeout=0.05) is None
    with pytest.raises(ClientError, match="message of 4097 bytes exceeds 4096") as err:
        client.send_message("self", "handles", bytes(4097))
    assert err.value.code == rpc.INVALID_PARAMS
    with pytest.raises(ClientError, match="endpoint must be"):
        client.bind("")


def test_views_and_status(client: Client) -> None:
    client.register_region(4096)
    status = client.status()
    assert (status["host"], status["regions"], status["planes"][0]["bytes_sent"]) == (
        "fake", 1, 10)
    conn = client.connect("self")
    assert client.connections() == [
        {"connection": conn.id, "peer": "self", "state": "established"}]
    assert client.peers()[0]["peer"] == "self"
    assert client.planes()[0]["plane"] == 0
    assert conn.evs() == [{"connection": conn.id, "ev": 1, "plane": 0, "state": "GOOD"}]
    assert len(client.regions()) == 1


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '{"host": "", "region": 1, "rkey": 1, "va": 0, "length": 1}',
        '{"host": "a", "region": 1, "rkey": 4294967296, "va": 0, "length": 1}',
        '{"host": "a", "region": -1, "rkey": 1, "va": 0, "length": 1}',
        '{"host": "a", "region": 1, "rkey": 1, "va": 18446744073709551615, "length": 2}',
        '{"host": "a", "region": 1, "rkey": 1, "va": 0}',
        '{"host": "a", "region": "1", "rkey": 1, "va": 0, "length": 1}',
        "not json",
    ],
)
def test_bad_region_handles_are_one_line_errors(text: str) -> None:
    with pytest.raises(ClientError) as err:
        RegionHandle.from_json(text)
    assert err.value.code == rpc.INVALID_PARAMS and "\n" not in str(err.value)


def test_region_handle_round_trips() -> None:
    h = RegionHandle("hosta", 3, 0xDEADBEEF, 1 << 40, 1 << 30)
    assert RegionHandle.from_json(h.to_json()) == h
    assert RegionHandle.from_dict(h.to_dict()) == h


def test_unreachable_sockets_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ClientError, match=f"no mrc daemon socket at {tmp_path}/none") as err:
        Client(str(tmp_path / "none"))
    assert err.value.code == rpc.UNREACHABLE
    # A socket file nobody listens on: refused.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "dead.sock"))
    dead.close()
    with pytest.raises(ClientError, match="connection refused"):
        Client(str(tmp_path / "dead.sock"))


def _connect_as_nobody(path: str) -> tuple[int, str]:
    """Try `Client(path)` in a child that dropped to nobody (root ignores file modes)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code, text = 0, "connected"
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            Client(path).close()
        except ClientError as exc:
            code, text = exc.code, str(exc)
        except BaseException as exc:
            code, text = 1, repr(exc)
        os.write(w, json.dumps([code, text]).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    code, text = json.loads(data)
    return int(code), str(text)


def test_permission_denied_is_one_line(daemon: FakeDaemon) -> None:
    """The control socket is 0600 and belongs to the daemon's user: anyone else is refused."""
    os.chmod(daemon.path, 0o600)
    if os.geteuid() == 0:
        code, text = _connect_as_nobody(daemon.path)
    else:
        os.chmod(daemon.path, 0)
        with pytest.raises(ClientError) as err:
            Client(daemon.path)
        code, text = err.value.code, str(err.value)
    assert (code, text) == (rpc.UNREACHABLE, f"{daemon.path}: permission denied (the control "
                                             "socket belongs to the daemon's user)")


def test_a_bad_answer_and_a_closed_daemon(client: Client, daemon: FakeDaemon) -> None:
    daemon.answer_raw = b"this is not json\n"
    with pytest.raises(ClientError, match="not JSON") as err:
        client.status()
    assert err.value.code == rpc.BAD_ANSWER
    daemon.answer_raw = b'{"jsonrpc": "2.0", "id": 999, "result": {}}\n' + b'{"jsonrpc":"2.0"}\n'
    with pytest.raises(ClientError, match="neither result nor error"):
        client.status()
    assert client.status()["host"] == "fake"
    region = client.register_region(4096)
    daemon.close()
    with pytest.raises(ClientError) as err:
        client.status()
    assert err.value.code == rpc.CLOSED
    assert client.closed
    # The mapping outlives the control connection; closing the region only unmaps it.
    region.buf[0] = 1
    region.close()
    with pytest.raises(ClientError, match="the client is closed"):
        client.status()


def test_daemon_errors_keep_their_code_and_data() -> None:
    line = (b'{"jsonrpc":"2.0","id":3,"error":{"code":-32005,"message":"write 2:\\n out",'
            b'"data":{"key":"writes"}}}')
    resp = rpc.decode_response(line)
    assert resp.id == 3 and resp.error is not None
    assert (resp.error.code, str(resp.error), resp.error.data) == (
        -32005, "write 2: out", {"key": "writes"})
    assert resp.error.name == "out of bounds"


def test_oversized_requests_and_answers_are_refused() -> None:
    with pytest.raises(ClientError, match="exceeds 1048576") as err:
        rpc.encode_request("send", {"x": "a" * (1 << 20)}, 1)
    assert err.value.code == rpc.INVALID_PARAMS
    reader = rpc.LineReader()
    assert reader.feed(b'{"a":1}\n\n{"b"') == [b'{"a":1}']
    with pytest.raises(ClientError, match="line over 1048576") as err:
        reader.feed(b"x" * (1 << 20))
    assert err.value.code == rpc.BAD_ANSWER


def test_bad_sizes_and_timeouts_are_refused_before_sending(
    client: Client, daemon: FakeDaemon
) -> None:
    for size in (0, -1, 1 << 41, 1.5):
        with pytest.raises(ClientError, match="region size must be") as err:
            client.register_region(size)  # type: ignore[arg-type]
        assert err.value.code == rpc.INVALID_PARAMS
    with pytest.raises(ClientError, match="timeout must be a finite number"):
        client.wait_immediates(timeout=float("nan"))
    with pytest.raises(ClientError, match="timeout must be"):
        client.recv_message("x", timeout=-1)
    assert sent(daemon, "register_region") == 0 and sent(daemon, "immediates") == 0


def test_register_region_names_the_peers_that_may_write_it(
    client: Client, daemon: FakeDaemon
) -> None:
    region = client.register_region(4096, name="inbox", peers=["b", "c"])
    assert daemon.requests[-1] == (
        "register_region", {"size": 4096, "name": "inbox", "peers": ["b", "c"]}
    )
    region.close()
    client.register_region(4096)  # default: any configured peer, nothing sent for it
    assert daemon.requests[-1] == ("register_region", {"size": 4096})
    before = len(daemon.requests)
    for bad in ("b", [""], [3], 7):
        with pytest.raises(ClientError, match="peers must be a list") as err:
            client.register_region(4096, peers=bad)  # type: ignore[arg-type]
        assert err.value.code == rpc.INVALID_PARAMS
    assert len(daemon.requests) == before  # checked here: nothing reached the socket


def test_an_answer_nested_too_deep_is_a_bad_answer_not_a_recursion_error() -> None:
    with pytest.raises(ClientError) as err:
        rpc.decode_response(b"[" * 100_000)
    assert err.value.code == rpc.BAD_ANSWER and "nested too deep" in str(err.value)


def test_pushed_immediates_are_handed_out_by_region_and_max_and_dropped_with_their_region(
    client: Client,
) -> None:
    from mrc.client.ops import MAX_PUSHED

    a, b = client.register_region(4096), client.register_region(4096)
    core = client._core
    core.pushes.add("immediates")  # (as `subscribe` leaves it; the stand-in pushes nothing)

    def push(*pairs: tuple[int, int]) -> None:
        core.notified("immediates", {"immediates": [{"region": r, "imm": i, "peer": "self",
                                                     "connection": 1} for r, i in pairs]})

    push((a.id, 1), (b.id, 2), (a.id, 3), (a.id, 4))
    assert [i.imm for i in client.wait_immediates(a, timeout=0, max=2)] == [1, 3]
    assert [i.imm for i in client.wait_immediates(timeout=0)] == [2, 4]  # in arrival order
    assert client.wait_immediates(timeout=0) == []
    push((a.id, 5), (b.id, 6))
    b.close()  # its pushed immediates can never be asked for: they go with it
    assert [i.imm for i in core.pushed] == [5]
    with pytest.raises(ClientError, match="max must be a positive integer"):
        client.wait_immediates(timeout=0, max=0)
    # Unasked, at most MAX_PUSHED wait: the oldest go, counted.
    push(*[(a.id, k) for k in range(MAX_PUSHED + 2)])
    assert len(core.pushed) == MAX_PUSHED and core.pushed_dropped == 3
    assert core.pushed[0].imm == 2
