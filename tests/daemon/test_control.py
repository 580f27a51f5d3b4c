"""The control socket against bad input: every malformed, oversized, unknown or ill-typed request
gets its JSON-RPC error and the client stays connected; fds that are not a region's memfd are
refused and closed; a second daemon on the same socket, a stale socket file and a thousand
clients connecting at once are handled with one line or a counted refusal."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .daemonproc import PLANES_A, DaemonProc, Memfd, RawClient, free_port, toml_config

PARSE, INVALID_REQUEST, NO_METHOD, BAD_PARAMS = -32700, -32600, -32601, -32602
UNKNOWN_PEER, UNKNOWN_REGION, UNKNOWN_CONNECTION, BAD_MEMORY = -32001, -32002, -32003, -32004


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    tmp = tmp_path_factory.mktemp("ctl")
    port = free_port()
    d = DaemonProc(tmp, "a", toml_config("a", PLANES_A, port, tmp / "a.sock", {}))
    try:
        d.wait_ready()
        yield d
    finally:
        d.stop()


@pytest.fixture
def client(daemon: DaemonProc) -> Iterator[RawClient]:
    with daemon.client() as c:
        yield c


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def still_serves(c: RawClient) -> None:
    assert c.call("status")["host"] == "a"


def test_a_line_that_is_not_json_is_a_parse_error(client: RawClient) -> None:
    client.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": \n')
    answer = client.line()
    assert answer["id"] is None and answer["error"]["code"] == PARSE
    client.send_raw(b"\xff\xfe\n")
    assert client.line()["error"]["code"] == PARSE
    still_serves(client)


@pytest.mark.parametrize("opening", [b"[", b'{"a":'])
def test_a_line_nested_100000_deep_is_a_parse_error_and_the_next_is_answered(
    client: RawClient, opening: bytes
) -> None:
    # 100,000 levels fit in one line (under 1 MiB) and pass any recursion limit of the parser.
    client.send_raw(opening * 100_000 + b"\n")
    answer = client.line()
    assert answer["id"] is None and answer["error"]["code"] == PARSE
    assert "nested too deep" in answer["error"]["message"]
    still_serves(client)


@pytest.mark.parametrize(
    ("request_doc", "code", "words"),
    [
        (42, INVALID_REQUEST, "JSON object"),
        ([], INVALID_REQUEST, "empty batch"),
        ({"jsonrpc": "1.0", "id": 5, "method": "status"}, INVALID_REQUEST, '"2.0"'),
        ({"jsonrpc": "2.0", "id": 5, "method": 7}, INVALID_REQUEST, "method"),
        ({"jsonrpc": "2.0", "id": [5], "method": "status"}, INVALID_REQUEST, "id"),
        ({"jsonrpc": "2.0", "id": 5, "method": "status", "x": 1}, INVALID_REQUEST, "x"),
        ({"jsonrpc": "2.0", "id": 5, "method": "status", "params": [1]}, BAD_PARAMS, "by name"),
        ({"jsonrpc": "2.0", "id": 5, "method": "reboot"}, NO_METHOD, "'reboot'"),
        ({"jsonrpc": "2.0", "id": 5, "method": "status", "params": {"x": 1}}, BAD_PARAMS, "x"),
        ({"jsonrpc": "2.0", "id": 5, "method": "deregister_region", "params": {"region": "1"}},
         BAD_PARAMS, "region must be an integer"),
        ({"jsonrpc": "2.0", "id": 5, "method": "deregister_region", "params": {"region": 99}},
         UNKNOWN_REGION, "no region 99"),
        ({"jsonrpc": "2.0", "id": 5, "method": "completions", "params": {"timeout": -1}},
         BAD_PARAMS, "timeout"),
        ({"jsonrpc": "2.0", "id": 5, "method": "completions", "params": {"connection": 3}},
         UNKNOWN_CONNECTION, "no connection 3"),
        ({"jsonrpc": "2.0", "id": 5, "method": "write",
          "params": {"connection": 3, "writes": [{}]}}, UNKNOWN_CONNECTION, "no connection 3"),
        ({"jsonrpc": "2.0", "id": 5, "method": "connect", "params": {}}, BAD_PARAMS,
         "peer is missing"),
        ({"jsonrpc": "2.0", "id": 5, "method": "connect", "params": {"peer": "zz"}},
         UNKNOWN_PEER, "'zz'"),
        ({"jsonrpc": "2.0", "id": 5, "method": "register_region", "params": {"size": 4096}},
         BAD_MEMORY, "memfd"),
        ({"jsonrpc": "2.0", "id": 5, "method": "recv_message", "params": {"endpoint": "e"}},
         BAD_PARAMS, "not bound"),
        ({"jsonrpc": "2.0", "id": 5, "method": "send_message",
          "params": {"peer": "zz", "endpoint": "e", "data": ""}}, UNKNOWN_PEER, "'zz'"),
        ({"jsonrpc": "2.0", "id": 5, "method": "evs", "params": {"connection": 8}},
         UNKNOWN_CONNECTION, "8"),
    ],
)
def test_a_bad_request_gets_its_error_and_the_client_stays(
    client: RawClient, request_doc: Any, code: int, words: str
) -> None:
    client.send_raw(json.dumps(request_doc).encode() + b"\n")
    answer = client.line()
    assert answer["jsonrpc"] == "2.0"
    assert answer["error"]["code"] == code, answer
    assert words in answer["error"]["message"], answer
    if isinstance(request_doc, dict) and type(request_doc.get("id")) is int:
        assert answer["id"] == request_doc["id"]
    still_serves(client)


def test_batches_are_answered_as_arrays_and_notifications_not_at_all(client: RawClient) -> None:
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "status"},
        {"jsonrpc": "2.0", "method": "status"},  # a notification: no answer object
        {"jsonrpc": "2.0", "id": 2, "method": "nope"},
        "junk",
    ]
    client.send_raw(json.dumps(batch).encode() + b"\n")
    answers = client.line()
    assert isinstance(answers, list) and len(answers) == 3
    assert answers[0]["id"] == 1 and answers[0]["result"]["host"] == "a"
    assert answers[1]["id"] == 2 and answers[1]["error"]["code"] == NO_METHOD
    assert answers[2]["id"] is None and answers[2]["error"]["code"] == INVALID_REQUEST
    client.send_raw(b'{"jsonrpc": "2.0", "method": "status"}\n')
    # The next line answers the next request: the notification had none.
    assert client.call("peers") == []


def test_an_oversized_line_is_refused_and_skipped(client: RawClient) -> None:
    client.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": "' + b"x" * (1 << 20) + b'"}\n')
    answer = client.line()
    assert answer["error"]["code"] == INVALID_REQUEST and "1048576" in answer["error"]["message"]
    still_serves(client)
    # The same, arriving in pieces: refused once, the rest of the line thrown away.
    for _ in range(3):
        client.send_raw(b"y" * (600 << 10))
    client.send_raw(b"\n")
    assert client.line()["error"]["code"] == INVALID_REQUEST
    still_serves(client)


def test_an_fd_with_any_other_request_is_refused_and_closed(
    daemon: DaemonProc, client: RawClient
) -> None:
    still_serves(client)
    before = fd_count(daemon.proc.pid)
    mem = Memfd(4096)
    try:
        err = client.error("status", {}, fd=mem.fd)
        assert err["code"] == BAD_PARAMS and "only register_region" in err["message"]
        line = b'[{"jsonrpc": "2.0", "id": 1, "method": "register_region", '
        line += b'"params": {"size": 8}}]\n'
        client.send_raw(line, [mem.fd])
        answers = client.line()
        assert answers[0]["error"]["code"] == BAD_PARAMS
        # Two fds with one register_region: refused as well.
        client.send_raw(
            b'{"jsonrpc": "2.0", "id": 9, "method": "register_region", "params": {"size": 8}}\n',
            [mem.fd, mem.fd],
        )
        assert client.line()["error"]["message"] == "one fd per register_region request"
    finally:
        mem.close()
    still_serves(client)
    assert fd_count(daemon.proc.pid) == before


def test_memory_that_is_not_a_usable_memfd_is_refused(
    daemon: DaemonProc, client: RawClient, tmp_path: Path
) -> None:
    still_serves(client)
    before = fd_count(daemon.proc.pid)
    plain = tmp_path / "plain"
    plain.write_bytes(b"\0" * 8192)
    r, w = os.pipe()
    small = Memfd(4096)
    unsealed = Memfd(4096, sealing=False)
    fd = os.open(plain, os.O_RDWR)
    try:
        cases = [
            (fd, 4096, "not a memfd"),
            (r, 4096, "not a memfd (not a regular file)"),
            (small.fd, 8192, "holds 4096 bytes, fewer than the 8192 asked"),
            (unsealed.fd, 4096, "cannot be sealed"),
        ]
        for sent, size, words in cases:
            err = client.error("register_region", {"size": size}, fd=sent)
            assert err["code"] == BAD_MEMORY and words in err["message"], err
        err = client.error("register_region", {"size": 0}, fd=small.fd)
        assert err["code"] == BAD_PARAMS and "size" in err["message"]
    finally:
        for x in (fd, r, w):
            os.close(x)
        small.close()
        unsealed.close()
    assert client.call("regions") == []
    assert fd_count(daemon.proc.pid) == before


def test_register_and_deregister_a_region(daemon: DaemonProc, client: RawClient) -> None:
    still_serves(client)
    before = fd_count(daemon.proc.pid)
    mem = Memfd(1 << 16)
    try:
        result = mem.register(client, "buf")
        handle = result["handle"]
        assert handle["host"] == "a" and handle["region"] == result["region"]
        assert handle["length"] == 1 << 16 and 0 < handle["rkey"] < 1 << 32
        assert handle["va"] % 4096 == 0
        rows = client.call("regions")
        assert [(r["region"], r["name"], r["length"], r["rkey"]) for r in rows] == [
            (result["region"], "buf", 1 << 16, handle["rkey"])
        ]
        # The fd that came was closed; Python's mmap keeps a duplicate of its own.
        assert fd_count(daemon.proc.pid) == before + 1
        assert client.call("deregister_region", {"region": result["region"]}) == {}
        assert client.call("regions") == []
        assert fd_count(daemon.proc.pid) == before  # unmapped
        err = client.error("deregister_region", {"region": result["region"]})
        assert err["code"] == UNKNOWN_REGION
    finally:
        mem.close()


def test_another_clients_region_is_not_yours(daemon: DaemonProc, client: RawClient) -> None:
    mem = Memfd(4096)
    try:
        region = mem.register(client)["region"]
        with daemon.client() as other:
            assert other.error("deregister_region", {"region": region})["code"] == UNKNOWN_REGION
        # Closing a client deregisters its regions.
        client.close()
        with daemon.client() as third:
            deadline = time.monotonic() + 5
            while third.call("regions") and time.monotonic() < deadline:
                time.sleep(0.01)
            assert third.call("regions") == []
    finally:
        mem.close()


def test_a_second_daemon_on_the_same_socket_fails_with_one_line(daemon: DaemonProc) -> None:
    tmp = Path(tempfile.mkdtemp(dir=daemon.tmp))
    config = toml_config("a2", ["127.0.0.4"], free_port(), daemon.socket_path, {})
    second = DaemonProc(tmp, "a2", config)
    try:
        assert second.wait(15) == 1
        lines = second.log().splitlines()
        assert lines[-1] == f"mrc daemon: another daemon is serving {daemon.socket_path}"
    finally:
        second.stop()
    with daemon.client() as c:
        still_serves(c)


def test_a_stale_socket_file_is_replaced_and_a_plain_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens: what a crashed daemon leaves
    d = DaemonProc(tmp_path, "s", toml_config("s", ["127.0.0.4"], free_port(), path, {}))
    try:
        d.wait_ready()
        with RawClient(path) as c:
            assert c.call("status")["host"] == "s"
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    finally:
        d.stop()
    plain = tmp_path / "plain.sock"
    plain.write_text("not a socket")
    d = DaemonProc(tmp_path, "p", toml_config("p", ["127.0.0.4"], free_port(), plain, {}))
    try:
        assert d.wait(15) == 1
        assert d.log().splitlines()[-1] == (
            f"mrc daemon: {plain} exists and is not a socket; remove it or change control.socket"
        )
    finally:
        d.stop()


def test_a_thousand_clients_at_once_stay_bounded(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    path = tmp_path / "many.sock"
    config = toml_config("m", ["127.0.0.4"], free_port(), path, {},
                         limits="max_clients = 50\ndrain_seconds = 1")
    d = DaemonProc(tmp_path, "m", config)
    socks: list[socket.socket] = []
    try:
        d.wait_ready()
        refused_at_connect = 0
        for _ in range(1000):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(str(path))
            except OSError as exc:
                # A full listen backlog refuses at once (EAGAIN): counted on our side.
                assert exc.errno in (errno.EAGAIN, errno.ECONNREFUSED), exc
                refused_at_connect += 1
                s.close()
                continue
            socks.append(s)
        refused_lines = held = 0
        deadline = time.monotonic() + 20
        pending = list(socks)
        while pending and time.monotonic() < deadline:
            still = []
            for s in pending:
                try:
                    data = s.recv(4096)
                except BlockingIOError:
                    still.append(s)
                    continue
                except ConnectionResetError:
                    refused_lines += 1
                    continue
                if data:
                    answer = json.loads(data.split(b"\n")[0])
                    assert answer["error"]["code"] == -32009
                    assert "max_clients = 50" in answer["error"]["message"]
                    refused_lines += 1
            pending = still
            if len(pending) <= 50:
                break
            time.sleep(0.05)
        held = len(pending)
        assert held <= 50
        assert held + refused_lines + refused_at_connect == 1000
        for s in socks:
            s.close()
        socks.clear()
        # Everyone gone: a new client is served, and the refusals were counted.
        deadline = time.monotonic() + 10
        while True:
            try:
                with RawClient(path) as c:
                    status = c.call("status")
                break
            except (EOFError, AssertionError, ConnectionError):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert status["control"]["refused_clients"] >= refused_lines
        assert status["control"]["accepted_clients"] <= 1000 - refused_lines + 50
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
        d.stop()


def test_a_client_that_does_not_read_is_paused_then_served(daemon: DaemonProc) -> None:
    with daemon.client() as slow, daemon.client() as other:
        request = b'{"jsonrpc": "2.0", "id": 1, "method": "status"}\n'
        count = 20000  # about 13 MiB of answers, past the 4 MiB where reading pauses
        slow.sock.setblocking(False)
        sent = 0
        data = request * count
        deadline = time.monotonic() + 20
        while sent < len(data):
            try:
                sent += slow.sock.send(data[sent:])
            except BlockingIOError:
                # Both socket buffers are full: the daemon stopped reading this client.
                assert time.monotonic() < deadline
                still_serves(other)  # and serves everyone else meanwhile
                break
        slow.sock.settimeout(20)
        answers = 0
        while answers < count:
            if sent < len(data):
                slow.sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    sent += slow.sock.send(data[sent:])
                slow.sock.settimeout(20)
            answer = slow.line()
            assert answer["result"]["host"] == "a"
            answers += 1
        assert sent == len(data)
        assert slow.call("status")["control"]["paused_clients"] >= 1


def test_an_fd_belongs_to_the_line_it_was_sent_with(daemon: DaemonProc, client: RawClient) -> None:
    mem = Memfd(4096)
    try:
        # A request without an fd, then register_region with one, back to back: however the
        # daemon's reads cut the stream, the fd goes with the second line.
        status = b'{"jsonrpc": "2.0", "id": 1, "method": "status"}\n'
        register = b'{"jsonrpc": "2.0", "id": 2, "method": "register_region", '
        register += b'"params": {"size": 4096}}\n'
        client.send_raw(status)
        client.send_raw(register, [mem.fd])
        first, second = client.line(), client.line()
        assert first["id"] == 1 and "result" in first
        assert second["id"] == 2 and second["result"]["handle"]["length"] == 4096
        # The fd with the first half of its line, the rest in another send.
        half = len(register) // 2
        register = register.replace(b'"id": 2', b'"id": 3')
        client.send_raw(register[:half], [mem.fd])
        time.sleep(0.05)
        client.send_raw(register[half:] + status)
        third, fourth = client.line(), client.line()
        assert third["id"] == 3 and third["result"]["handle"]["length"] == 4096
        assert fourth["id"] == 1 and "result" in fourth
        assert len(client.call("regions")) == 2
    finally:
        mem.close()
