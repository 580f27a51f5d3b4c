"""The daemon's pieces in-process: the JSON-RPC codec and parameter checks, the method table, the
daemons' hello, write statuses, sd_notify, memfd mapping and its deferred unmapping, and the
metrics page."""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from mrc.daemon import rpc
from mrc.daemon.clients import ClientState
from mrc.daemon.conns import Hello, write_status
from mrc.daemon.methods import METHODS
from mrc.daemon.notify import Notifier
from mrc.daemon.rpc import Params, RpcError, parse_line
from mrc.daemon.shm import SharedMapping, Unmapper


def test_parse_line_tells_requests_notifications_and_errors_apart() -> None:
    items, batch = parse_line(b'{"jsonrpc":"2.0","id":"x","method":"status"}')
    assert not batch and items == [rpc.Request("status", {}, "x", False)]
    items, batch = parse_line(b'[{"jsonrpc":"2.0","method":"a","params":{"k":1}}, 3]')
    assert batch and items[0] == rpc.Request("a", {"k": 1}, None, True)
    assert isinstance(items[1], dict) and items[1]["error"]["code"] == rpc.INVALID_REQUEST
    bad = parse_line(b"{")
    assert isinstance(bad, dict) and bad["error"]["code"] == rpc.PARSE_ERROR and bad["id"] is None
    too_many = parse_line(json.dumps([{}] * (rpc.MAX_BATCH + 1)).encode())
    assert isinstance(too_many, dict) and "batch of more than" in too_many["error"]["message"]


def test_params_name_the_bad_key() -> None:
    p = Params("write", {"connection": -1})
    with pytest.raises(RpcError) as err:
        p.integer("connection")
    assert err.value.code == rpc.INVALID_PARAMS and err.value.data == {"key": "connection"}
    assert err.value.message == f"write: connection must be an integer 0..{(1 << 64) - 1}, got -1"
    p = Params("completions", {"timeout": 1e9, "max": True})
    assert p.seconds("timeout") == 60.0  # a long-poll waits at most a minute
    with pytest.raises(RpcError, match="max must be an integer"):
        p.opt_integer("max", 1, 10)  # a boolean is not a number here
    p = Params("status", {"verbose": 1})
    with pytest.raises(RpcError, match="status: verbose is not a parameter of this method"):
        p.done()


def test_an_answer_too_long_for_a_line_becomes_an_error() -> None:
    line = rpc.encode(rpc.answer(4, "x" * rpc.MAX_LINE))
    doc = json.loads(line)
    assert len(line) < 200 and doc["id"] == 4 and doc["error"]["code"] == rpc.RESOURCE_LIMIT


def test_the_method_table_is_the_documented_protocol() -> None:
    doc = (Path(__file__).resolve().parents[2] / "mrc/docs/DAEMON.md").read_text(encoding="utf-8")
    section = doc[doc.index("### Methods") : doc.index("### Ownership")]
    documented = set(re.findall(r"`(\w+) \{", section))
    assert "register_region" in documented and "evs" in documented  # the section was read
    assert set(METHODS) == documented


def test_the_hello_round_trips_and_refuses_anything_else() -> None:
    plain = Hello("app", "host-a", 0x1122334455667788)
    mail = Hello("mail", "b", 7, (0x1000, 0xDEADBEEF, 67_000))
    for hello in (plain, mail):
        assert Hello.decode(hello.encode()) == hello
    data = mail.encode()
    assert data[:4] == b"MRCd" and len(data) == 4 + 1 + 1 + 8 + 1 + 1 + 16
    for broken in (b"", data[:-1], b"XRCd" + data[4:], data[:4] + b"\x02" + data[5:],
                   data[:5] + b"\x09" + data[6:], plain.encode() + b"\0"):
        assert Hello.decode(broken) is None


def test_write_status_reads_ibta_syndromes() -> None:
    assert [write_status(s) for s in (0x00, 0x1F)] == ["ok", "ok"]
    assert [write_status(s) for s in (0x62, 0x80, 0x81, 0x20)] == ["remote_access_error"] * 4


def test_notifier_sends_to_a_path_or_an_abstract_name(tmp_path: Any) -> None:
    path = str(tmp_path / "notify")
    for name, bind in ((path, path), ("@mrc-unit-notify", "\0mrc-unit-notify")):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
            listener.bind(bind)
            n = Notifier({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "3000000"})
            assert n.enabled and n.watchdog_interval == 1.5
            n.ready("serving x")
            got = listener.recv(4096).decode().splitlines()
            assert got[:2] == ["READY=1", "STATUS=serving x"]
            n.stopping("bye")
            assert listener.recv(4096).decode().splitlines() == ["STOPPING=1", "STATUS=bye"]
    silent = Notifier({})
    assert not silent.enabled and not silent.notify("READY=1")
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert not gone.notify("READY=1") and gone.errors == 1
    other = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval is None  # the watchdog of another process


def test_a_mapping_is_unmapped_only_when_no_view_is_left() -> None:
    fd = os.memfd_create("unit", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 8192)
        with mmap.mmap(fd, 8192) as app:
            m = SharedMapping.open(fd, 8192, "unit")
            m.view[100:104] = b"abcd"
            assert app[100:104] == b"abcd"  # the same pages
            with pytest.raises(OSError):
                os.ftruncate(fd, 4096)  # sealed against shrinking
            held = m.view[0:10]  # a send record's slice
            unmapper = Unmapper()
            unmapper.close(m)
            assert not m.closed and len(unmapper) == 1
            assert bytes(held[:1]) == b"\0"  # still readable: still mapped
            del held
            assert unmapper.sweep() == 0 and m.closed
    finally:
        os.close(fd)


def test_a_memfd_shrunk_while_being_sealed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The size is looked at again once the seal holds: a memfd shrunk between the first look
    and the seal would have the daemon map pages past its end (SIGBUS at the first packet)."""
    import fcntl

    from mrc.daemon import shm

    real_fcntl = fcntl.fcntl

    class RacingFcntl:
        """The application's other thread: shrinks the file just before the seal lands."""

        @staticmethod
        def fcntl(fd: int, cmd: int, arg: int = 0) -> Any:
            os.ftruncate(fd, 4096)
            return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(shm, "fcntl", RacingFcntl)
    fd = os.memfd_create("unit", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 1 << 20)
        with pytest.raises(RpcError) as err:
            SharedMapping.open(fd, 1 << 20, "unit")
        assert err.value.code == rpc.BAD_MEMORY
        assert "shrank to 4096 bytes" in err.value.message
    finally:
        os.close(fd)


def test_the_control_socket_set_up_follows_no_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever can write the socket's directory swaps the fresh socket for a symlink to a file
    of theirs between bind and the mode/group set-up: the file must stay as it was."""
    import asyncio
    import grp

    from mrc.daemon.control import ControlError, ControlServer

    victim = tmp_path / "victim"
    victim.write_text("x")
    victim.chmod(0o644)
    path = tmp_path / "ctl.sock"
    real_bind = socket.socket.bind

    def bind_then_swap(sock: socket.socket, addr: Any) -> None:
        real_bind(sock, addr)
        if addr == str(path):
            os.rename(path, tmp_path / "moved.sock")
            os.symlink(victim, path)

    monkeypatch.setattr(socket.socket, "bind", bind_then_swap)

    class NoMethods:
        def dispatch(self, client: Any, method: str, params: dict[str, Any], fd: int | None) -> Any:
            raise AssertionError("no client connects in this test")

        def client_gone(self, client: Any) -> None:
            pass

    loop = asyncio.new_event_loop()
    try:
        group = grp.getgrgid(os.getegid()).gr_name
        server = ControlServer(loop, str(path), NoMethods(), mode=0o660, group=group)
        with pytest.raises(ControlError, match="replaced while binding"):
            server.start()
        assert victim.stat().st_mode & 0o777 == 0o644
        assert path.is_symlink()  # not ours: left alone, not unlinked
    finally:
        loop.close()


def test_messages_for_endpoints_nobody_bound_are_bounded_in_all() -> None:
    """A peer sends to names nobody binds: each name keeps at most MAX_QUEUED, and all of them
    together at most MAX_UNBOUND (the rest dropped, counted); binding one frees its share."""
    import random
    import struct

    from mrc.core.events import ImmediateReceived
    from mrc.core.memory import RegionTable
    from mrc.daemon.config import Limits
    from mrc.daemon.conns import MAIL, Connection
    from mrc.daemon.mailbox import MAX_QUEUED, MAX_UNBOUND, Mailbox
    from mrc.daemon.regions import Regions

    class Host:
        def __init__(self) -> None:
            self.woken: list[int] = []

        async def open_mail(self, peer: str) -> Connection:
            raise AssertionError("nothing is sent in this test")

        def post(self, *args: Any) -> int:
            raise AssertionError("nothing is sent in this test")

        def wake(self, client: int) -> None:
            self.woken.append(client)

    regions = Regions(RegionTable(random.Random(1)), Limits(), frozenset({0}))
    host = Host()
    mailbox = Mailbox(host, regions, lambda: 0.0)
    region = mailbox.new_mailbox("b")
    conn = Connection(1, "b", MAIL, "responder", None, None, 0.0, mailbox_region=region.id)

    def arrive(endpoint: str) -> None:
        name = endpoint.encode()
        slot = bytes([len(name)]) + name + struct.pack(">H", 3) + b"hey"
        region.core.view[: len(slot)] = slot
        mailbox.deliver(conn, region, ImmediateReceived(msn=0, imm=0))

    names = [f"e{i}" for i in range(2 * MAX_UNBOUND // MAX_QUEUED)]
    for name in names:
        for _ in range(MAX_QUEUED):
            arrive(name)
    waiting = sum(len(q) for q in mailbox.queues.values())
    assert waiting == MAX_UNBOUND == mailbox.unbound_messages
    assert mailbox.counters["dropped_unbound_full"] == len(names) * MAX_QUEUED - MAX_UNBOUND
    # A bound endpoint's queue is its client's: it takes what waited there and more arrives.
    mailbox.bind(7, Params("bind", {"endpoint": names[0]}))
    assert mailbox.unbound_messages == MAX_UNBOUND - MAX_QUEUED
    arrive(names[-1])  # an unbound name again has room
    assert mailbox.unbound_messages == MAX_UNBOUND - MAX_QUEUED + 1
    arrive(names[0])  # full at MAX_QUEUED: the oldest goes, counted
    assert len(mailbox.queues[names[0]]) == MAX_QUEUED and host.woken == [7]
    assert mailbox.counters["dropped_queue_full"] == 1


def test_region_quotas_per_client_and_per_uid_and_the_admin_uids() -> None:
    import random

    from mrc.core.memory import RegionTable
    from mrc.daemon.config import Limits
    from mrc.daemon.regions import Regions

    admin = 997  # as the daemon's own uid
    regions = Regions(
        RegionTable(random.Random(1)),
        Limits(max_region_bytes_per_client=8192, max_regions_per_uid=1),
        frozenset({admin, 0}),
    )
    fds = []

    def register(owner: int, uid: int, size: int) -> None:
        fd = os.memfd_create("unit", os.MFD_ALLOW_SEALING)
        fds.append(fd)
        os.ftruncate(fd, size)
        regions.register_shared(owner, uid, fd, size, "q", 0.0)

    try:
        register(1, 1000, 8192)
        with pytest.raises(RpcError, match=r"this client holds 8192 bytes of regions; 4096 more "
                                           r"would exceed max_region_bytes_per_client \(8192\)"):
            register(1, 1000, 4096)
        with pytest.raises(RpcError, match=r"this uid holds 1 regions \(max_regions_per_uid = 1"):
            register(2, 1000, 4096)
        register(3, 1001, 4096)  # another uid
        register(4, admin, 4096)  # an admin uid: held per client only
        register(4, admin, 4096)
        register(5, 0, 4096)  # root too
        register(6, 0, 4096)
        assert len(regions) == 6
    finally:
        regions.close()
        for fd in fds:
            os.close(fd)


class _Owner:
    """What ClientState reads of its control connection; it keeps what it was sent."""

    id, pid, uid = 1, 2, 3

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, doc: Any) -> None:
        self.sent.append(doc)


def test_a_long_poll_answers_at_its_first_item_or_empty_at_its_deadline() -> None:
    loop = asyncio.new_event_loop()
    try:
        state = ClientState(_Owner(), loop)  # type: ignore[arg-type]
        assert state.immediates_when(None, 8, 0.0) == {"immediates": []}  # no wait at all
        # Nothing comes: empty at the deadline, no waiter left.
        t0 = loop.time()
        assert loop.run_until_complete(state.immediates_when(None, 8, 0.05)) == {
            "immediates": []
        }
        assert loop.time() - t0 >= 0.05 and state.waiters == []
        # An item woken in long before the deadline is answered at once.
        item = {"region": 7, "imm": 1, "peer": "b", "connection": 1}

        def arrive() -> None:
            state.immediates.append(item)
            state.wake()

        loop.call_later(0.01, arrive)
        t0 = loop.time()
        got = loop.run_until_complete(state.immediates_when(7, 8, 30.0))
        assert got == {"immediates": [item]} and loop.time() - t0 < 5.0
        assert state.waiters == []
        # A client that goes cancels its long-polls.
        task = loop.create_task(state.immediates_when(None, 8, 30.0))
        loop.call_later(0.01, state.cancel)
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(task)
        assert state.waiters == []
    finally:
        loop.close()


def test_a_subscriber_gets_a_turns_immediates_in_one_notification_after_those_waiting() -> None:
    loop = asyncio.new_event_loop()
    try:
        owner = _Owner()
        state = ClientState(owner, loop)  # type: ignore[arg-type]
        item = [{"region": 7, "imm": i, "peer": "b", "connection": 1} for i in range(5)]
        state.immediates.extend(item[:2])  # landed before the client subscribed
        state.subscribe({"immediates"})
        assert state.pushes == {"immediates"} and not state.immediates and owner.sent == []
        state.push("immediates", item[2])
        state.push("immediates", item[3])  # the same turn of the loop
        loop.run_until_complete(asyncio.sleep(0))
        assert owner.sent == [
            {"jsonrpc": "2.0", "method": "immediates", "params": {"immediates": item[:4]}}
        ]
        state.push("immediates", item[4])  # a later turn: a notification of its own
        loop.run_until_complete(asyncio.sleep(0))
        assert owner.sent[1:] == [
            {"jsonrpc": "2.0", "method": "immediates", "params": {"immediates": item[4:]}}
        ]
    finally:
        loop.close()
