"""A small stand-in for the mrc daemon's control socket, to test `mrc.client` on its own.

It speaks the control protocol over a real Unix socket and takes region fds over real
SCM_RIGHTS, maps them, and carries out WRITEs by copying between its own regions: the only
peer it knows is "self" (a connection back to this host), and messages and immediates name
their sender "self" too. `hold` keeps WRITEs outstanding until `release()`, so the
outstanding-write cap and partial waits can be seen; `corrupt` flips a byte of the next
WRITE_WITH_IMMs. `requests` logs every (method, params) it received, so a test can tell a check
made on the client (nothing sent) from one made here. `answer_raw` replaces the next answer
with raw bytes (bad answers).
"""

from __future__ import annotations

import base64
import contextlib
import json
import mmap
import os
import socket
import stat
import threading
import time
from typing import Any

CAP = 4


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class FakeDaemon:
    def __init__(self, path: str, host: str = "fake") -> None:
        self.path = path
        self.host = host
        self.lock = threading.Condition()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.regions: dict[int, tuple[Any, mmap.mmap, int]] = {}  # id -> (owner, map, rkey)
        self.conns: dict[int, Any] = {}
        self.completions: list[dict[str, Any]] = []
        self.held: list[tuple[int, dict[str, Any], Any]] = []
        self.immediates: list[tuple[Any, dict[str, Any]]] = []
        self.endpoints: dict[str, Any] = {}
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.hold = False
        #: WRITE_WITH_IMMs still to land with their first byte flipped (a corrupting fabric).
        self.corrupt = 0
        self.answer_raw: bytes | None = None
        self.next_id = 1
        self.clients = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self.stopped = False
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def close(self) -> None:
        self.stopped = True
        with contextlib.suppress(OSError):  # shutdown wakes the accepting thread
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for s in list(self.socks):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for t in self.threads:
            t.join(timeout=2)
        for _, mm, _ in self.regions.values():
            with contextlib.suppress(BufferError):
                mm.close()

    def release(self) -> None:
        with self.lock:
            for wid, w, owner in self.held:
                self._complete(wid, w, owner)
            self.held.clear()
            self.lock.notify_all()

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    # ---- transport -----------------------------------------------------------------------

    def _accept(self) -> None:
        while not self.stopped:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.socks.append(sock)
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, sock: socket.socket) -> None:
        owner = object()
        buf = b""
        start = 0  # stream offset of buf[0]
        fds: dict[int, int] = {}  # stream offset of the line an fd came with -> fd
        with self.lock:
            self.clients += 1
        try:
            while True:
                data, new_fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
                for fd in new_fds:
                    fds[start + len(buf)] = fd
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line_fd = fds.pop(start) if start in fds else None
                    start += len(line) + 1
                    answer = self._handle(line, line_fd, owner)
                    raw, self.answer_raw = self.answer_raw, None
                    sock.sendall(raw if raw is not None else json.dumps(answer).encode() + b"\n")
        except OSError:
            pass
        finally:
            sock.close()
            with self.lock:
                self.clients -= 1
                for rid in [r for r, v in self.regions.items() if v[0] is owner]:
                    del self.regions[rid]
                for cid in [c for c, o in self.conns.items() if o is owner]:
                    del self.conns[cid]

    def _handle(self, line: bytes, fd: int | None, owner: Any) -> dict[str, Any]:
        req = json.loads(line)
        method, params = req["method"], req.get("params", {})
        try:
            with self.lock:
                self.requests.append((method, params))
            if fd is not None and method != "register_region":
                os.close(fd)
                raise RpcError(-32600, "an fd came with a request other than register_region")
            result = getattr(self, "m_" + method)(params, fd, owner)
            return {"jsonrpc": "2.0", "id": req["id"], "result": result}
        except AttributeError:
            err = {"code": -32601, "message": f"unknown method {method}"}
        except RpcError as exc:
            err = {"code": exc.code, "message": str(exc)}
        return {"jsonrpc": "2.0", "id": req["id"], "error": err}

    # ---- methods -------------------------------------------------------------------------

    def m_status(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        return {"version": "fake", "host": self.host, "pid": os.getpid(), "uptime": 1.0,
                "security": "none", "planes": [
                    {"plane": 0, "local": "127.0.0.1", "state": "UP", "bytes_sent": 10,
                     "bytes_received": 20, "packets_sent": 1, "packets_received": 2}],
                "peers": 1, "connections": len(self.conns), "regions": len(self.regions),
                "clients": self.clients}

    def m_register_region(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        if fd is None:
            raise RpcError(-32602, "register_region needs an fd")
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                raise RpcError(-32004, "fd is not a memfd")
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size < p["size"]:
                raise RpcError(-32004, "memfd smaller than size")
            mm = mmap.mmap(fd, p["size"])
        finally:
            os.close(fd)
        with self.lock:
            rid = self._id()
            rkey = 0x1000 + rid
            self.regions[rid] = (owner, mm, rkey)
        handle = {"host": self.host, "region": rid, "rkey": rkey, "va": 1 << 40,
                  "length": p["size"]}
        return {"region": rid, "handle": handle}

    def m_deregister_region(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        with self.lock:
            if p["region"] not in self.regions or self.regions[p["region"]][0] is not owner:
                raise RpcError(-32002, f"unknown region {p['region']}")
            del self.regions[p["region"]]
        return {}

    def m_connect(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        if p["peer"] != "self":
            raise RpcError(-32001, f"unknown peer {p['peer']!r}")
        with self.lock:
            cid = self._id()
            self.conns[cid] = owner
        return {"connection": cid, "peer": "self", "state": "established"}

    def m_disconnect(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        with self.lock:
            if self.conns.pop(p["connection"], None) is None:
                raise RpcError(-32003, "unknown connection")
        return {}

    def m_write(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        with self.lock:
            if self.conns.get(p["connection"]) is not owner:
                raise RpcError(-32003, "unknown connection")
            if self.hold and len(self.held) + len(p["writes"]) > CAP:
                raise RpcError(-32006, f"write {CAP - len(self.held)}: more than {CAP} "
                                       "outstanding writes on this connection")
            ids = []
            for w in p["writes"]:
                wid = self._id()
                ids.append(wid)
                w = dict(w, connection=p["connection"])
                if self.hold:
                    self.held.append((wid, w, owner))
                else:
                    self._complete(wid, w, owner)
            self.lock.notify_all()
        return {"ids": ids}

    def _complete(self, wid: int, w: dict[str, Any], owner: Any) -> None:
        remote = w["remote"]
        target = self.regions.get(remote["region"])
        status = "ok"
        if target is None or target[2] != remote["rkey"]:
            status = "remote_access_error"
        else:
            src = self.regions[w["region"]][1]
            dst = target[1]
            off, n, roff = w["offset"], w["length"], w["remote_offset"]
            dst[roff:roff + n] = src[off:off + n]
            if "imm" in w and self.corrupt > 0:
                self.corrupt -= 1
                dst[roff] ^= 0xFF
            if "imm" in w:
                self.immediates.append((target[0], {"region": remote["region"], "imm": w["imm"],
                                                    "peer": "self",
                                                    "connection": w["connection"]}))
        self.completions.append({"id": wid, "connection": w["connection"], "status": status,
                                 "bytes": w["length"] if status == "ok" else 0, "owner": owner})

    def _long_poll(self, timeout: float, ready: Any) -> None:
        deadline = time.monotonic() + min(timeout, 5.0)
        while not ready() and time.monotonic() < deadline:
            self.lock.wait(max(0.0, deadline - time.monotonic()))

    def m_completions(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        def mine() -> list[dict[str, Any]]:
            return [c for c in self.completions if c["owner"] is owner
                    and p.get("connection", c["connection"]) == c["connection"]]

        with self.lock:
            self._long_poll(p.get("timeout", 0), mine)
            out = mine()
            for c in out:
                self.completions.remove(c)
        return {"completions": [{k: v for k, v in c.items() if k != "owner"} for c in out]}

    def m_immediates(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        def mine() -> list[tuple[Any, dict[str, Any]]]:
            return [i for i in self.immediates if i[0] is owner
                    and p.get("region", i[1]["region"]) == i[1]["region"]]

        with self.lock:
            self._long_poll(p.get("timeout", 0), mine)
            out = mine()[: p.get("max", 1 << 30)]
            for i in out:
                self.immediates.remove(i)
        return {"immediates": [i[1] for i in out]}

    def m_bind(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        with self.lock:
            self.endpoints[p["endpoint"]] = owner
            self.messages.setdefault(p["endpoint"], [])
        return {}

    def m_send_message(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        if p["peer"] != "self":
            raise RpcError(-32001, f"unknown peer {p['peer']!r}")
        if len(base64.b64decode(p["data"])) > 4096:
            raise RpcError(-32602, "message over 4 KiB")
        with self.lock:
            if p["endpoint"] not in self.endpoints:
                raise RpcError(-32602, f"no endpoint {p['endpoint']!r} at self")
            self.messages[p["endpoint"]].append({"peer": "self", "data": p["data"]})
            self.lock.notify_all()
        return {}

    def m_recv_message(self, p: dict[str, Any], fd: int | None, owner: Any) -> dict[str, Any]:
        with self.lock:
            if self.endpoints.get(p["endpoint"]) is not owner:
                raise RpcError(-32602, f"endpoint {p['endpoint']!r} is not bound here")
            box = self.messages[p["endpoint"]]
            self._long_poll(p.get("timeout", 0), lambda: box)
            out, box[:] = list(box), []
        return {"messages": out}

    def m_peers(self, p: dict[str, Any], fd: int | None, owner: Any) -> list[dict[str, Any]]:
        return [{"peer": "self", "planes": ["127.0.0.1"], "connections": len(self.conns)}]

    def m_connections(self, p: dict[str, Any], fd: int | None, owner: Any) -> list[Any]:
        return [{"connection": c, "peer": "self", "state": "established"} for c in self.conns]

    def m_planes(self, p: dict[str, Any], fd: int | None, owner: Any) -> list[dict[str, Any]]:
        return list(self.m_status(p, fd, owner)["planes"])

    def m_evs(self, p: dict[str, Any], fd: int | None, owner: Any) -> list[dict[str, Any]]:
        return [{"connection": p.get("connection", 0), "ev": 0x00000001, "plane": 0,
                 "state": "GOOD"}]

    def m_regions(self, p: dict[str, Any], fd: int | None, owner: Any) -> list[dict[str, Any]]:
        return [{"region": r, "length": len(v[1]), "rkey": v[2]} for r, v in self.regions.items()]
