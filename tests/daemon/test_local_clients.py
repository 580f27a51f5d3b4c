"""Local clients against one real daemon, as the hostile ones of issue 35 would act: clients
(some in processes forked from the test and given uid 65534 or 65533, so they need root) cannot
see each other's R_Keys or connections, are held to the per-client and per-uid quotas and to
`control.allowed_uids`; a sparse 1 GiB memfd does not grow the daemon's memory; a region
registered for named peers refuses a WRITE from any other peer (through two secured daemons).

These are here and not in `tools/hostile`: that harness attacks a live transfer with forged
datagrams on the wire and has no control socket or uid in it (docs/DESIGN.md §9)."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .daemonproc import PLANES_A, PLANES_B, DaemonProc, Memfd, RawClient, free_port, toml_config
from .test_security import key_for, secured_config

MIB = 1 << 20
BAD_PARAMS, UNKNOWN_PEER, UNKNOWN_CONNECTION = -32602, -32001, -32003
RESOURCE_LIMIT, PERMISSION_DENIED = -32009, -32010
NOBODY, OTHER, STRANGER = 65534, 65533, 65532
#: Addresses where nobody answers: a connect to this peer stays "connecting" for seconds.
SILENT = ["127.0.0.9", "127.0.0.10"]
LIMITS = """drain_seconds = 1
max_regions_per_client = 2
max_region_bytes_per_uid = 3145728
max_regions_per_uid = 3
max_connections_per_client = 1
max_endpoints_per_client = 1
max_endpoints_per_uid = 2
max_clients_per_uid = 3"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="clients of other uids need root")


class UidClient:
    """A control client in a forked process running as `uid` (group nogroup): it takes JSON
    commands on a pipe and answers each with the daemon's whole answer object, or with the
    error line the daemon sent when it refused the client at connect."""

    def __init__(self, path: Path, uid: int) -> None:
        cmd_r, self._cmd = os.pipe()
        self._ans, ans_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.close(self._cmd)
                os.close(self._ans)
                self._serve(path, uid, cmd_r, ans_w)
                code = 0
            finally:
                os._exit(code)
        os.close(cmd_r)
        os.close(ans_w)
        self._reader = os.fdopen(self._ans, "r")
        self.first: dict[str, Any] = json.loads(self._reader.readline())

    @staticmethod
    def _serve(path: Path, uid: int, cmd_r: int, ans_w: int) -> None:
        os.setgroups([])
        os.setgid(grp.getgrnam("nogroup").gr_gid)
        os.setuid(uid)
        out = os.fdopen(ans_w, "w")
        client = RawClient(path, timeout=10)
        # The first line answers a status request (id 0), or it is the one error line (id
        # null) of a client refused at connect, after which the daemon closes.
        with contextlib.suppress(OSError):  # EPIPE: refused, closed already; its line waits
            client.send_raw(b'{"jsonrpc":"2.0","id":0,"method":"status"}\n')
        try:
            first: Any = client.line()
        except (OSError, EOFError) as exc:
            first = {"closed": str(exc)}
        out.write(json.dumps(first) + "\n")
        out.flush()
        regions: list[Memfd] = []
        for line in os.fdopen(cmd_r):
            cmd = json.loads(line)
            fd = None
            if "memfd" in cmd:
                regions.append(Memfd(cmd["memfd"]))
                fd = regions[-1].fd
            try:
                answer = client.request(cmd["method"], cmd["params"], fd)
            except (OSError, EOFError) as exc:
                answer = {"closed": str(exc)}
            out.write(json.dumps(answer) + "\n")
            out.flush()

    def request(self, method: str, params: dict[str, Any] | None = None,
                memfd: int | None = None) -> dict[str, Any]:
        cmd: dict[str, Any] = {"method": method, "params": params or {}}
        if memfd is not None:
            cmd["memfd"] = memfd
        os.write(self._cmd, (json.dumps(cmd) + "\n").encode())
        answer: dict[str, Any] = json.loads(self._reader.readline())
        return answer

    def call(self, method: str, params: dict[str, Any] | None = None,
             memfd: int | None = None) -> Any:
        answer = self.request(method, params, memfd)
        assert "error" not in answer, answer
        return answer["result"]

    def error(self, method: str, params: dict[str, Any] | None = None,
              memfd: int | None = None) -> dict[str, Any]:
        answer = self.request(method, params, memfd)
        assert "error" in answer, answer
        err: dict[str, Any] = answer["error"]
        return err

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._cmd)
        self._reader.close()
        _, status = os.waitpid(self.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


@contextlib.contextmanager
def as_uid(path: Path, uid: int) -> Iterator[UidClient]:
    client = UidClient(path, uid)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    tmp = tmp_path_factory.mktemp("local")
    # The socket's directory must let the other uids through (pytest's are 0700).
    shared = Path(tempfile.mkdtemp(prefix="mrc-uids-"))
    shared.chmod(0o711)
    sock = shared / "a.sock"
    config = toml_config("a", PLANES_A, free_port(), sock, {"z": SILENT}, limits=LIMITS)
    if os.geteuid() == 0:  # only root may give the socket to a group it is not in
        config = config.replace(
            f'socket = "{sock}"',
            f'socket = "{sock}"\nmode = "0660"\ngroup = "nogroup"\n'
            f"allowed_uids = [{NOBODY}, {OTHER}]",
        )
    d = DaemonProc(tmp, "a", config, socket_path=sock)
    try:
        d.wait_ready()
        yield d
    finally:
        d.stop()
        shutil.rmtree(shared, ignore_errors=True)


@needs_root
def test_a_client_sees_only_its_own_regions_and_connections(daemon: DaemonProc) -> None:
    with as_uid(daemon.socket_path, NOBODY) as mallory_a, \
            as_uid(daemon.socket_path, NOBODY) as mallory_b, \
            as_uid(daemon.socket_path, OTHER) as other, daemon.client() as admin:
        mine = mallory_a.call("register_region", {"size": 4096, "name": "a"}, memfd=4096)
        also_mine = mallory_b.call("register_region", {"size": 4096, "name": "b"}, memfd=4096)
        theirs = other.call("register_region", {"size": 4096, "name": "o"}, memfd=4096)
        secret = Memfd(4096)
        root_region = secret.register(admin)
        # The daemon's uid opens a connection (to a silent peer: it stays "connecting").
        admin.send_raw(b'{"jsonrpc":"2.0","id":99,"method":"connect","params":{"peer":"z"}}\n')
        deadline = time.monotonic() + 5
        while not admin.call("connections"):
            assert time.monotonic() < deadline
        conn = admin.call("connections")[0]["connection"]

        def rkeys(rows: list[dict[str, Any]]) -> set[int]:
            return {r["rkey"] for r in rows}

        # A client sees its own rows only: not another uid's, not another client's of its
        # own uid, not the daemon's.
        assert rkeys(mallory_a.call("regions")) == {mine["handle"]["rkey"]}
        assert rkeys(mallory_b.call("regions")) == {also_mine["handle"]["rkey"]}
        assert rkeys(other.call("regions")) == {theirs["handle"]["rkey"]}
        assert mallory_a.call("connections") == [] and other.call("connections") == []
        assert mallory_a.error("evs", {"connection": conn})["code"] == UNKNOWN_CONNECTION
        assert mallory_a.call("evs") == []
        # The daemon's uid (root here) sees every row.
        assert rkeys(admin.call("regions")) == {
            mine["handle"]["rkey"], also_mine["handle"]["rkey"], theirs["handle"]["rkey"],
            root_region["handle"]["rkey"],
        }
        assert [r["connection"] for r in admin.call("connections")] == [conn]
        secret.close()


def settled(daemon: DaemonProc) -> None:
    """Until the daemon let go of the clients of earlier tests (it notices a close when it
    next reads), so their regions, endpoints and connections count no more."""
    with daemon.client() as admin:
        deadline = time.monotonic() + 5
        while admin.call("status")["clients"] > 1:
            assert time.monotonic() < deadline, "earlier clients still counted"
            time.sleep(0.02)


@needs_root
def test_quotas_per_client_and_per_uid_refuse_with_a_clear_error(daemon: DaemonProc) -> None:
    settled(daemon)
    with as_uid(daemon.socket_path, NOBODY) as first, \
            as_uid(daemon.socket_path, NOBODY) as second:
        first.call("register_region", {"size": MIB}, memfd=MIB)
        err = first.error("register_region", {"size": 3 * MIB}, memfd=3 * MIB)
        assert err["code"] == RESOURCE_LIMIT
        assert "max_region_bytes_per_uid (3145728)" in err["message"], err
        first.call("register_region", {"size": MIB}, memfd=MIB)
        err = first.error("register_region", {"size": 4096}, memfd=4096)
        assert err["code"] == RESOURCE_LIMIT and "max_regions_per_client = 2" in err["message"]
        second.call("register_region", {"size": 4096}, memfd=4096)
        err = second.error("register_region", {"size": 4096}, memfd=4096)
        assert err["code"] == RESOURCE_LIMIT and "max_regions_per_uid = 3" in err["message"]
        first.call("bind", {"endpoint": "one"})
        first.call("bind", {"endpoint": "one"})  # binding it again takes nothing more
        err = first.error("bind", {"endpoint": "two"})
        assert err["code"] == RESOURCE_LIMIT and "max_endpoints_per_client = 1" in err["message"]
        second.call("bind", {"endpoint": "two"})
        with as_uid(daemon.socket_path, NOBODY) as third:
            err = third.error("bind", {"endpoint": "three"})
            assert err["code"] == RESOURCE_LIMIT
            assert f"clients of uid {NOBODY} hold 2 endpoints" in err["message"], err
            # A third client of the uid is the last one max_clients_per_uid lets in.
            with as_uid(daemon.socket_path, NOBODY) as fourth:
                assert fourth.first["error"]["code"] == RESOURCE_LIMIT
                assert "max_clients_per_uid = 3" in fourth.first["error"]["message"]
        # One connection per client: the second connect is refused while the first waits.
        with daemon.client() as admin:
            connect = b'{"jsonrpc":"2.0","id":%d,"method":"connect","params":{"peer":"z"}}\n'
            admin.send_raw(connect % 1)
            admin.send_raw(connect % 2)
            answer = admin.line()
            assert answer["id"] == 2 and answer["error"]["code"] == RESOURCE_LIMIT
            assert "max_connections_per_client = 1" in answer["error"]["message"]
    # The quotas are held by live clients only: theirs went with them.
    settled(daemon)
    with as_uid(daemon.socket_path, NOBODY) as again:
        again.call("register_region", {"size": MIB}, memfd=MIB)
        again.call("bind", {"endpoint": "one"})


@needs_root
def test_a_uid_not_in_allowed_uids_is_refused_at_connect(daemon: DaemonProc) -> None:
    with as_uid(daemon.socket_path, STRANGER) as stranger:
        err = stranger.first["error"]
        assert err["code"] == PERMISSION_DENIED
        assert err["message"] == f"uid {STRANGER} is not in control.allowed_uids"
        assert "closed" in stranger.request("status")
    with daemon.client() as admin:
        assert admin.call("status")["control"]["refused_uid"] == 1


def test_peers_of_a_region_need_security_and_configured_names(daemon: DaemonProc) -> None:
    with daemon.client() as c:
        m = Memfd(4096)
        err = c.error("register_region", {"size": 4096, "peers": ["nobody-here"]}, fd=m.fd)
        assert err["code"] == UNKNOWN_PEER and "'nobody-here'" in err["message"]
        err = c.error("register_region", {"size": 4096, "peers": ["z"]}, fd=m.fd)
        assert err["code"] == BAD_PARAMS and 'security = "none"' in err["message"]
        err = c.error("register_region", {"size": 4096, "peers": "z"}, fd=m.fd)
        assert err["code"] == BAD_PARAMS and "peers must be a list" in err["message"]
        m.close()


def rss(pid: int) -> int:
    """Resident bytes of a process (its shared memory mapped in included)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_sparse_gib_memfd_does_not_grow_the_daemons_memory(daemon: DaemonProc) -> None:
    with daemon.client() as c:
        sparse = Memfd(1 << 30)  # sized, never written: no page allocated
        before = rss(daemon.proc.pid)
        region = sparse.register(c, "sparse")
        grown = rss(daemon.proc.pid) - before
        assert grown < 32 * MIB, f"the daemon grew by {grown >> 20} MiB"
        # Pages the application did write are mapped into the daemon (a step per turn of its
        # loop), so packets placed there later take no first-touch fault; the holes stay holes.
        written = Memfd(1 << 30)
        written.map[: 64 * MIB] = b"\1" * (64 * MIB)
        before = rss(daemon.proc.pid)
        other = written.register(c, "written")
        deadline = time.monotonic() + 10
        while rss(daemon.proc.pid) - before < 64 * MIB:
            assert time.monotonic() < deadline, "the written pages were not mapped in"
            time.sleep(0.05)
        c.call("status")  # the loop went on meanwhile
        time.sleep(0.2)
        grown = rss(daemon.proc.pid) - before
        assert grown < 96 * MIB, f"the daemon grew by {grown >> 20} MiB for 64 MiB written"
        for r in (region, other):
            c.call("deregister_region", {"region": r["region"]})
        sparse.close()
        written.close()


def test_a_region_for_named_peers_refuses_a_write_from_another(tmp_path: Path) -> None:
    """a lists b and c; a region of a's registered for c only refuses b's WRITE (remote access
    error at b), while a region for b, and one for any peer, take it."""
    port = free_port()
    ka, kb, kc = key_for(tmp_path, "a"), key_for(tmp_path, "b"), key_for(tmp_path, "c")
    a = DaemonProc(tmp_path, "a", secured_config(
        "a", PLANES_A, port, tmp_path, {"b": (PLANES_B, kb), "c": (SILENT, kc)}))
    b = DaemonProc(tmp_path, "b", secured_config("b", PLANES_B, port, tmp_path,
                                                 {"a": (PLANES_A, ka)}))
    try:
        a.wait_ready()
        b.wait_ready()
        with a.client() as ca, b.client() as cb:
            dst = [Memfd(4096) for _ in range(3)]
            for_c = ca.call("register_region", {"size": 4096, "peers": ["c"]}, fd=dst[0].fd)
            for_b = ca.call("register_region", {"size": 4096, "peers": ["b"]}, fd=dst[1].fd)
            for_any = dst[2].register(ca)
            src = Memfd(4096)
            src.map[:4] = b"mrc!"
            source = src.register(cb)["region"]
            cid = cb.call("connect", {"peer": "a"})["connection"]
            statuses = []
            for target in (for_c, for_b, for_any):
                write = {"region": source, "offset": 0, "length": 4096,
                         "remote": target["handle"]}
                cb.call("write", {"connection": cid, "writes": [write]})
                done: list[Any] = []
                deadline = time.monotonic() + 20
                while not done:
                    assert time.monotonic() < deadline, b.log()
                    done = cb.call("completions", {"connection": cid, "timeout": 1})[
                        "completions"]
                statuses.append(done[0]["status"])
                row = [r for r in cb.call("connections") if r["connection"] == cid]
                if row and row[0]["state"] != "established":  # closed after the error
                    cid = cb.call("connect", {"peer": "a"})["connection"]
            assert statuses == ["remote_access_error", "ok", "ok"]
            assert dst[0].map[:4] == b"\0\0\0\0"
            assert dst[1].map[:4] == b"mrc!" and dst[2].map[:4] == b"mrc!"
            for m in (*dst, src):
                m.close()
    finally:
        a.stop()
        b.stop()


@needs_root
def test_the_socket_path_is_checked_as_a_socket(daemon: DaemonProc) -> None:
    """The daemon's socket is a socket, mode 0660, group nogroup, as configured (set up
    without following a symlink: tests/daemon/test_units.py swaps one in)."""
    st = os.lstat(daemon.socket_path)
    assert st.st_mode & 0o777 == 0o660 and st.st_gid == grp.getgrnam("nogroup").gr_gid
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.socket_path))
