"""Secured daemons (docs/DESIGN.md §8): each host's key file (created on first start, mode
0600, refused when others may read it or another uid owns it), an allowlist of the peers'
public keys, WRITEs and messages over encrypted connections, and a peer that shows another
peer's key refused."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import pytest

from mrc.node.keys import create_private_key, public_key_text

from .daemonproc import PLANES_A, PLANES_B, DaemonProc, Memfd, free_port

MIB = 1 << 20


def secured_config(host: str, planes: list[str], port: int, tmp: Path,
                   peers: dict[str, tuple[list[str], str]], level: str = "encrypt") -> str:
    lines = [f'host = "{host}"', f"port = {port}", f'security = "{level}"',
             f'key_file = "{tmp / (host + ".key")}"']
    for addr in planes:
        lines += ["[[planes]]", f'address = "{addr}"']
    for name, (addrs, key) in peers.items():
        lines += ["[[peers]]", f'name = "{name}"', f"addresses = {addrs!r}".replace("'", '"'),
                  f'public_key = "{key}"']
    lines += ["[control]", f'socket = "{tmp / (host + ".sock")}"']
    return "\n".join(lines) + "\n"


def key_for(tmp: Path, host: str) -> str:
    return public_key_text(create_private_key(str(tmp / f"{host}.key")))


def test_an_encrypted_pair_moves_writes_and_messages(tmp_path: Path) -> None:
    port = free_port()
    ka, kb = key_for(tmp_path, "a"), key_for(tmp_path, "b")
    a = DaemonProc(tmp_path, "a", secured_config("a", PLANES_A, port, tmp_path,
                                                 {"b": (PLANES_B, kb)}))
    b = DaemonProc(tmp_path, "b", secured_config("b", PLANES_B, port, tmp_path,
                                                 {"a": (PLANES_A, ka)}))
    dst, src = Memfd(4 * MIB), Memfd(4 * MIB)
    try:
        a.wait_ready()
        b.wait_ready()
        assert f"mrc daemon: public key {ka}" in a.log()
        with a.client() as ca, b.client() as cb:
            assert ca.call("status")["security"] == "encrypt"
            handle = dst.register(ca)["handle"]
            source = src.register(cb)["region"]
            src.map[:] = os.urandom(4 * MIB)
            cid = cb.call("connect", {"peer": "a"})["connection"]
            writes = [{"region": source, "offset": i * MIB, "length": MIB, "remote": handle,
                       "remote_offset": i * MIB, "imm": i} for i in range(4)]
            cb.call("write", {"connection": cid, "writes": writes})
            done: list[dict[str, object]] = []
            while len(done) < 4:
                done += cb.call("completions", {"timeout": 2})["completions"]
            assert [d["status"] for d in done] == ["ok"] * 4
            imms: list[int] = []
            while len(imms) < 4:
                imms += [m["imm"] for m in ca.call("immediates", {"timeout": 2})["immediates"]]
            assert imms == [0, 1, 2, 3]
            assert dst.map[:] == src.map[:]
            ca.call("bind", {"endpoint": "e"})
            data = base64.b64encode(b"secret handle").decode()
            cb.call("send_message", {"peer": "a", "endpoint": "e", "data": data})
            got = ca.call("recv_message", {"endpoint": "e", "timeout": 5})["messages"]
            assert got == [{"peer": "b", "data": data}]
    finally:
        dst.close()
        src.close()
        a.stop()
        b.stop()


def test_a_peer_showing_another_peers_key_is_refused(tmp_path: Path) -> None:
    port = free_port()
    ka, kb, kc = key_for(tmp_path, "a"), key_for(tmp_path, "b"), key_for(tmp_path, "c")
    # a accepts b and c; the impostor has c's key but calls itself b.
    a = DaemonProc(tmp_path, "a", secured_config(
        "a", PLANES_A, port, tmp_path,
        {"b": (PLANES_B, kb), "c": (["127.0.0.10", "127.0.0.11"], kc)}))
    impostor_dir = tmp_path / "impostor"
    impostor_dir.mkdir()
    (impostor_dir / "b.key").write_bytes((tmp_path / "c.key").read_bytes())
    os.chmod(impostor_dir / "b.key", 0o600)
    b = DaemonProc(impostor_dir, "b", secured_config("b", PLANES_B, port, impostor_dir,
                                                     {"a": (PLANES_A, ka)}))
    try:
        a.wait_ready()
        b.wait_ready()
        with b.client() as cb:
            answer = cb.request("connect", {"peer": "a"})
            # Its REPLY may reach the impostor before a closes the connection.
            if "result" in answer:
                cid = answer["result"]["connection"]
                deadline = time.monotonic() + 5
                while next(r for r in cb.call("connections") if r["connection"] == cid)[
                        "state"] != "closed":
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
            else:
                assert answer["error"]["code"] == -32007
        with a.client() as ca:
            assert ca.call("connections") == []
        assert "refused a connection claiming to be b: not its key" in a.log()
    finally:
        a.stop()
        b.stop()


def test_key_files_created_at_first_start_and_refused_when_readable(tmp_path: Path) -> None:
    port = free_port()
    config = secured_config("a", PLANES_A, port, tmp_path, {})
    d = DaemonProc(tmp_path, "a", config)
    try:
        d.wait_ready()
        key = tmp_path / "a.key"
        assert key.stat().st_mode & 0o777 == 0o600
        assert f"mrc daemon: created the key file {key}" in d.log()
    finally:
        d.stop()
    os.chmod(tmp_path / "a.key", 0o640)
    d = DaemonProc(tmp_path, "a", config)
    try:
        assert d.wait(15) == 1
        last = d.log().splitlines()[-1]
        assert last.startswith("mrc daemon: ") and str(tmp_path / "a.key") in last
        assert "group" in last or "others" in last, last
    finally:
        d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_a_key_file_owned_by_another_uid_is_refused(tmp_path: Path) -> None:
    port = free_port()
    config = secured_config("a", PLANES_A, port, tmp_path, {})
    key = tmp_path / "a.key"
    create_private_key(str(key))
    os.chown(key, 65534, -1)  # mode 0600 still: only who owns it decides
    d = DaemonProc(tmp_path, "a", config)
    try:
        assert d.wait(15) == 1
        last = d.log().splitlines()[-1]
        assert last.startswith("mrc daemon: ") and str(key) in last
        assert "owned by uid 65534" in last, last
    finally:
        d.stop()
