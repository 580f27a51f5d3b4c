"""The daemon's pieces in-process: the JSON-RPC codec and parameter checks, the method table, the
daemons' hello, write statuses, sd_notify, memfd mapping and its deferred unmapping, and the
metrics page."""

from __future__ import annotations

import json
import mmap
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from mrc.daemon import rpc
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
