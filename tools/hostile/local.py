"""The `local` family: hostile clients of a real daemon's control socket (issue 35).

`run_local(opts)` starts one `mrc daemon` (`localproc.LocalDaemon`: real process, real Unix
socket, mode 0660 group nogroup, `allowed_uids` the hostile and the victim uid, small quotas),
then runs each case of `CASES` against it. A case's attacker connects as the hostile uid
(65534 by default), its victim as another (65533), both from processes forked and given those
uids, so the daemon tells them apart by SO_PEERCRED as it would any two users' programs. After
each case every client it opened is closed and the case is judged on four counts:

- **survived**: the daemon still runs and a well-behaved client (a new connection of the
  victim's uid) gets `status` answered and can register, see and deregister a region;
- **clear**: every error the daemon answered is one line (a JSON-RPC error object whose message
  has no line break) with a known code, the attack drew the error (or the counted drop, in the
  `control` counters of `status`) the case expects, and nothing it should not have;
- **no leak**: the hostile uid saw none of another client's rows, R_Keys or VAs, and could not
  use, close or take another client's region, connection or endpoint;
- **no traceback**: the daemon's log since the case began holds no Python traceback and no
  `internal error`, and its `internal_errors` counter did not move; its open fds are back to
  what they were (it keeps no fd a client sent).

`figures` is the JSON-ready record (`cases` by name, each with its `problems` and `leaks`),
`verdict` its exit status, `text` a few lines. `--hostile-uid 0` runs the attacker as root,
which the daemon counts as an admin (docs/DAEMON.md): the isolation cases must then fail, which
shows the harness sees a leak when there is one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from mrc.control import (
    BAD_MEMORY,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_LINE,
    METHOD_NOT_FOUND,
    NOT_CONNECTED,
    OUT_OF_BOUNDS,
    PARSE_ERROR,
    PERMISSION_DENIED,
    RESOURCE_LIMIT,
    SHUTTING_DOWN,
    TOO_MANY_OUTSTANDING,
    UNKNOWN_CONNECTION,
    UNKNOWN_PEER,
    UNKNOWN_REGION,
)
from tools.hostile.localproc import Client, LocalDaemon, LocalError, Memfd, connect_as
from tools.hostile.procs import free_port

MIB = 1 << 20
GIB = 1 << 30
HOSTILE, VICTIM, STRANGER = 65534, 65533, 65532
#: The daemon's planes, and a peer nobody answers at (a connect to it stays "connecting").
PLANES = ["127.0.0.40", "127.0.0.41"]
SILENT = ["127.0.0.42", "127.0.0.43"]
KNOWN_CODES = frozenset({
    PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR, UNKNOWN_PEER,
    UNKNOWN_REGION, UNKNOWN_CONNECTION, BAD_MEMORY, OUT_OF_BOUNDS, TOO_MANY_OUTSTANDING,
    NOT_CONNECTED, SHUTTING_DOWN, RESOURCE_LIMIT, PERMISSION_DENIED,
})  # fmt: skip
#: The quotas the cases run into (small, so each takes a few requests).
LIMITS = {
    "drain_seconds": 1,
    "max_clients_per_uid": 4,
    "max_regions_per_client": 2,
    "max_regions_per_uid": 3,
    "max_region_bytes_per_uid": 3 * GIB,
    "max_connections_per_client": 1,
    "max_connections_per_uid": 2,
    "max_endpoints_per_client": 1,
    "max_endpoints_per_uid": 2,
}
#: Longest one case may take before it is stopped (a hung answer is a failed case).
CASE_SECONDS = 30.0
#: How much a sparse GiB may grow the daemon's resident memory.
SPARSE_GROWTH = 32 * MIB


class CaseTimeout(Exception):
    pass


@dataclass(slots=True)
class LocalOptions:
    cases: list[str] = field(default_factory=lambda: list(CASES))
    hostile_uid: int = HOSTILE
    victim_uid: int = VICTIM
    stranger_uid: int = STRANGER


@dataclass(slots=True)
class Check:
    """What one case found, filled in by the case and by the runner."""

    name: str
    problems: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    #: Control counters (of `status`) the attack must have moved, and by at least how much.
    counted: dict[str, int] = field(default_factory=dict)
    #: Errors the attack drew, by code name (for the report).
    drew: dict[str, int] = field(default_factory=dict)
    #: What the case measured (for the report).
    measured: dict[str, float] = field(default_factory=dict)

    def problem(self, text: str) -> None:
        self.problems.append(" ".join(text.split())[:400])

    def leak(self, text: str) -> None:
        self.leaks.append(" ".join(text.split())[:400])

    def ok(self, answer: dict[str, Any], what: str) -> Any:
        """The result of `answer`, or None with a problem noted."""
        if "result" not in answer:
            self.problem(f"{what}: refused: {answer.get('error')}")
            return None
        return answer["result"]

    def refused(self, answer: Any, code: int, what: str, *words: str,
                breach: bool = False) -> None:
        """`answer` must be an error of `code` whose message holds `words`. An answer that
        is a result is a leak when `breach` (the attacker got at another client's object)."""
        err = answer.get("error") if isinstance(answer, dict) else None
        if not isinstance(err, dict):
            text = f"{what}: answered {json.dumps(answer)[:200]} instead of error {code}"
            (self.leak if breach else self.problem)(text)
            return
        got = err.get("code")
        name = _CODE_NAMES.get(got, str(got)) if isinstance(got, int) else str(got)
        self.drew[name] = self.drew.get(name, 0) + 1
        message = str(err.get("message"))
        if err.get("code") != code:
            self.problem(f"{what}: error {err.get('code')} ({message}) instead of {code}")
        missing = [w for w in words if w not in message]
        if missing:
            self.problem(f"{what}: the error {message!r} does not say {missing[0]!r}")


_CODE_NAMES = {
    PARSE_ERROR: "parse_error", INVALID_REQUEST: "invalid_request",
    METHOD_NOT_FOUND: "unknown_method", INVALID_PARAMS: "invalid_params",
    INTERNAL_ERROR: "internal_error", UNKNOWN_PEER: "unknown_peer",
    UNKNOWN_REGION: "unknown_region", UNKNOWN_CONNECTION: "unknown_connection",
    BAD_MEMORY: "bad_memory", OUT_OF_BOUNDS: "out_of_bounds",
    TOO_MANY_OUTSTANDING: "too_many_outstanding", NOT_CONNECTED: "not_connected",
    SHUTTING_DOWN: "shutting_down", RESOURCE_LIMIT: "resource_limit",
    PERMISSION_DENIED: "permission_denied",
}  # fmt: skip


class Env:
    """The daemon under attack and what the running case opened (closed after it)."""

    def __init__(self, daemon: LocalDaemon, opts: LocalOptions) -> None:
        self.daemon = daemon
        self.hostile = opts.hostile_uid
        self.victim = opts.victim_uid
        self.stranger = opts.stranger_uid
        self.clients: list[Client] = []
        self.memfds: list[Memfd] = []
        self.admin = self.connect(os.geteuid(), "admin", keep=True)

    def connect(self, uid: int, name: str, *, keep: bool = False) -> Client:
        """A control client of `uid`."""
        client = Client(connect_as(self.daemon.socket_path, uid)[0], uid, name)
        if not keep:
            self.clients.append(client)
        return client

    def flood(self, uid: int, n: int, name: str) -> list[Client]:
        socks = connect_as(self.daemon.socket_path, uid, n)
        clients = [Client(s, uid, f"{name} {i}", timeout=3.0) for i, s in enumerate(socks)]
        self.clients += clients
        return clients

    def memfd(self, size: int, **kw: Any) -> Memfd:
        m = Memfd(size, **kw)
        self.memfds.append(m)
        return m

    def register(self, client: Client, size: int, name: str = "r",
                 mem: Memfd | None = None) -> dict[str, Any]:
        """Register a (sparse) memfd of `size` for `client`: the whole answer."""
        m = mem or self.memfd(size)
        return client.request("register_region", {"size": size, "name": name}, fd=m.fd)

    def counters(self) -> dict[str, int]:
        control = self.admin.request("status")["result"]["control"]
        return {str(k): int(v) for k, v in control.items()}

    def close_case(self) -> list[dict[str, Any]]:
        """Close the case's clients and memfds; the error objects they were answered."""
        errors = [e for c in self.clients for e in c.errors]
        for c in self.clients:
            c.close()
        for m in self.memfds:
            m.close()
        self.clients, self.memfds = [], []
        return errors

    def settle(self, timeout: float = 5.0) -> bool:
        """Until the daemon let go of the closed clients (only the admin is left)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.admin.request("status")["result"]["clients"] <= 1:
                return True
            time.sleep(0.02)
        return False


# -- the cases ----------------------------------------------------------------------------------


def _secrets(rows: list[dict[str, Any]]) -> set[str]:
    return {str(v) for r in rows for k, v in r.items() if k in ("rkey", "va")}


def _foreign_rows(c: Check, who: str, rows: Any, own: set[int], what: str,
                  key: str) -> None:
    if not isinstance(rows, list):
        c.problem(f"{who} {what}: not a list: {rows!r}"[:300])
        return
    for row in rows:
        if row.get(key) not in own:
            c.leak(f"{who} sees {what} row of owner {row.get('owner')}: "
                   f"{json.dumps(row)[:200]}")


def view_regions(env: Env, c: Check) -> None:
    """The hostile uid lists the regions (and every other view): it sees its own rows, not
    another uid's, not another client of its own uid's, not the daemon's."""
    victim = env.connect(env.victim, "victim")
    mine = env.connect(env.hostile, "hostile")
    twin = env.connect(env.hostile, "hostile twin")
    regs = {}
    for who, client in (("victim", victim), ("hostile", mine), ("twin", twin),
                        ("admin", env.admin)):
        answer = env.register(client, 4096, f"{who}-secret")
        regs[who] = c.ok(answer, f"{who} register_region")
    if None in regs.values():
        return
    try:
        everything = c.ok(env.admin.request("regions"), "admin regions")
        secrets = _secrets(everything or [])
        for who, client in (("hostile", mine), ("twin", twin)):
            own = {regs[who]["region"]}
            rows = c.ok(client.request("regions"), f"{who} regions")
            _foreign_rows(c, who, rows, own, "region", "region")
            if isinstance(rows, list) and own - {r.get("region") for r in rows}:
                c.problem(f"{who} does not see its own region")
            foreign = secrets - _secrets(rows if isinstance(rows, list) else [])
            for method in ("status", "peers", "planes", "connections", "evs"):
                text = json.dumps(c.ok(client.request(method), f"{who} {method}"))
                shown = [s for s in foreign if s in text]
                if shown:
                    c.leak(f"{who}'s {method} shows another client's R_Key or VA {shown[0]}")
    finally:
        env.admin.request("deregister_region", {"region": regs["admin"]["region"]})


def _pending_connect(env: Env, client: Client) -> int:
    """Open a connection of `client`'s to the silent peer (its connect answer never comes in
    the case's time); its id, as the admin sees it."""
    before = {r["connection"] for r in env.admin.request("connections")["result"]}
    client.send_raw(client.line_of("connect", {"peer": "z"}))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = {r["connection"] for r in env.admin.request("connections")["result"]}
        if now - before:
            return int(min(now - before))
        time.sleep(0.02)
    raise TimeoutError("the victim's connection did not show")


def view_connections(env: Env, c: Check) -> None:
    """The victim's connection (still in its handshake) is not in the hostile uid's
    `connections` or `evs`, and asking for it by id is `unknown connection`."""
    victim = env.connect(env.victim, "victim")
    conn = _pending_connect(env, victim)
    mine = env.connect(env.hostile, "hostile")
    _foreign_rows(c, "hostile", c.ok(mine.request("connections"), "connections"), set(),
                  "connection", "connection")
    _foreign_rows(c, "hostile", c.ok(mine.request("evs"), "evs"), set(), "evs", "connection")
    c.refused(mine.request("evs", {"connection": conn}), UNKNOWN_CONNECTION,
              "evs of the victim's connection", breach=True)


def foreign_objects(env: Env, c: Check) -> None:
    """The hostile uid uses the victim's region, connection and endpoint by id and name (and
    tries every id up to the highest in use): each is refused as unknown, and the victim's
    objects are as they were."""
    victim = env.connect(env.victim, "victim")
    mem = env.memfd(4096, fill=4096)
    reg = c.ok(env.register(victim, 4096, "victim", mem), "victim register_region")
    c.ok(victim.request("bind", {"endpoint": "victim-ep"}), "victim bind")
    conn = _pending_connect(env, victim)
    if reg is None:
        return
    rid = reg["region"]
    mine = env.connect(env.hostile, "hostile")
    mine_conn = _pending_connect(env, mine)
    own = c.ok(env.register(mine, 4096, "hostile"), "hostile register_region")
    handle = reg["handle"]
    write = {"region": rid, "offset": 0, "length": 4096, "remote": handle}
    tries: list[tuple[str, dict[str, Any], int]] = [
        ("deregister_region", {"region": rid}, UNKNOWN_REGION),
        ("immediates", {"region": rid}, UNKNOWN_REGION),
        ("immediates", {"region": rid, "timeout": 0.1}, UNKNOWN_REGION),
        ("completions", {"connection": conn}, UNKNOWN_CONNECTION),
        ("disconnect", {"connection": conn}, UNKNOWN_CONNECTION),
        ("evs", {"connection": conn}, UNKNOWN_CONNECTION),
        ("write", {"connection": conn, "writes": [write]}, UNKNOWN_CONNECTION),
        ("bind", {"endpoint": "victim-ep"}, INVALID_PARAMS),
        ("recv_message", {"endpoint": "victim-ep"}, INVALID_PARAMS),
        ("recv_message", {"endpoint": "victim-ep", "timeout": 0.1}, INVALID_PARAMS),
    ]
    for method, params, code in tries:
        c.refused(mine.request(method, params), code, f"{method} {json.dumps(params)[:80]}",
                  breach=True)
    # Its own connection is still connecting: a write on it is refused before any region is
    # looked at, so the victim's region id is tried on its own as the local region too.
    c.refused(mine.request("write", {"connection": mine_conn, "writes": [write]}),
              NOT_CONNECTED, "write on its own connection from the victim's region")
    # Guessing: every region and connection id in use, and a few past them.
    top_region = max([rid] + ([own["region"]] if own else []))
    for guess in range(1, top_region + 4):
        if own is None or guess != own["region"]:
            c.refused(mine.request("deregister_region", {"region": guess}), UNKNOWN_REGION,
                      f"deregister_region {guess}", breach=True)
    for guess in range(1, max(conn, mine_conn) + 4):
        if guess != mine_conn:
            c.refused(mine.request("disconnect", {"connection": guess}), UNKNOWN_CONNECTION,
                      f"disconnect {guess}", breach=True)
    # The victim's objects are as they were.
    rows = c.ok(victim.request("regions"), "victim regions") or []
    if [(r["region"], r["rkey"]) for r in rows] != [(rid, handle["rkey"])]:
        c.leak(f"the victim's regions changed: {rows}")
    if bytes(mem.map[:4096]) != b"\x5a" * 4096:
        c.leak("the victim's region's bytes changed")
    conns = c.ok(victim.request("connections"), "victim connections") or []
    if [(r["connection"], r["state"]) for r in conns] != [(conn, "connecting")]:
        c.leak(f"the victim's connection changed: {conns}")
    c.ok(victim.request("recv_message", {"endpoint": "victim-ep"}), "victim recv_message")


def region_quota(env: Env, c: Check) -> None:
    """Two clients of the hostile uid register sparse memfds past the per-client count, the
    per-uid bytes and the per-uid count: each refusal names its key; the victim's uid can
    still register; the sparse gigabytes do not grow the daemon."""
    a = env.connect(env.hostile, "hostile a")
    b = env.connect(env.hostile, "hostile b")
    rss = env.daemon.rss()
    c.ok(env.register(a, GIB), "a's first GiB")
    c.ok(env.register(a, GIB), "a's second GiB")
    c.refused(env.register(a, 4096), RESOURCE_LIMIT, "a's third region",
              "max_regions_per_client = 2")
    c.refused(env.register(b, 2 * GIB), RESOURCE_LIMIT, "b's 2 GiB",
              f"max_region_bytes_per_uid ({3 * GIB})")
    c.ok(env.register(b, 4096), "b's first region (the uid's third)")
    c.refused(env.register(b, 4096), RESOURCE_LIMIT, "the uid's fourth region",
              "max_regions_per_uid = 3")
    c.refused(env.register(b, 1 << 40, mem=env.memfd(4096)), RESOURCE_LIMIT,
              "a TiB region", "max_region")
    victim = env.connect(env.victim, "victim")
    c.ok(env.register(victim, GIB), "the victim's GiB while the hostile uid is at its quota")
    grown = env.daemon.rss() - rss
    c.measured["daemon_growth_mib"] = round(grown / MIB, 1)
    if grown > SPARSE_GROWTH:
        c.problem(f"3 sparse GiB grew the daemon by {grown >> 20} MiB")


def endpoint_quota(env: Env, c: Check) -> None:
    """Endpoints past the per-client and per-uid quotas are refused naming the key; the
    victim's uid can still bind."""
    a, b, third = (env.connect(env.hostile, f"hostile {n}") for n in "abc")
    c.ok(a.request("bind", {"endpoint": "q-one"}), "bind q-one")
    c.ok(a.request("bind", {"endpoint": "q-one"}), "bind q-one again")
    c.refused(a.request("bind", {"endpoint": "q-two"}), RESOURCE_LIMIT, "a's second endpoint",
              "max_endpoints_per_client = 1")
    c.ok(b.request("bind", {"endpoint": "q-three"}), "b's endpoint")
    c.refused(third.request("bind", {"endpoint": "q-four"}), RESOURCE_LIMIT,
              "the uid's third endpoint", "max_endpoints_per_uid = 2")
    c.refused(third.request("bind", {"endpoint": "x" * 65}), INVALID_PARAMS, "a long name")
    victim = env.connect(env.victim, "victim")
    c.ok(victim.request("bind", {"endpoint": "q-victim"}), "the victim's endpoint")


def connection_quota(env: Env, c: Check) -> None:
    """connect past the per-client and per-uid quotas is refused at once (the allowed ones
    wait for a silent peer); the victim's uid can still connect."""
    a, b, third = (env.connect(env.hostile, f"hostile {n}") for n in "abc")
    _pending_connect(env, a)
    c.refused(a.request("connect", {"peer": "z"}), RESOURCE_LIMIT, "a's second connect",
              "max_connections_per_client = 1")
    _pending_connect(env, b)
    c.refused(third.request("connect", {"peer": "z"}), RESOURCE_LIMIT, "the uid's third",
              "max_connections_per_uid = 2")
    c.refused(third.request("connect", {"peer": "nobody"}), UNKNOWN_PEER, "an unknown peer")
    victim = env.connect(env.victim, "victim")
    _pending_connect(env, victim)
    rows = c.ok(victim.request("connections"), "victim connections") or []
    if len(rows) != 1:
        c.problem(f"the victim's connect did not count as its own: {rows}")


def _first_lines(clients: list[Client]) -> list[Any]:
    """Each client's first answer line, asking `status` first (None: closed with no line)."""
    for cl in clients:
        with contextlib.suppress(OSError):
            cl.send_raw(cl.line_of("status", req_id=0))
    out: list[Any] = []
    for cl in clients:
        try:
            out.append(cl.line())
        except (OSError, EOFError):
            out.append(None)
    return out


def client_flood(env: Env, c: Check) -> None:
    """100 connections of the hostile uid at once: max_clients_per_uid of them are served,
    every other one gets one `resource limit` line and is closed, counted; the victim's uid
    still gets in."""
    n = 100
    cap = LIMITS["max_clients_per_uid"]
    first = _first_lines(env.flood(env.hostile, n, "flood"))
    served = sum(1 for d in first if isinstance(d, dict) and "result" in d)
    refused = [d for d in first if isinstance(d, dict) and "error" in d]
    for d in refused:
        c.refused(d, RESOURCE_LIMIT, "a flooding connection", f"max_clients_per_uid = {cap}")
    if served != cap or len(refused) != n - cap:
        c.problem(f"{served} served and {len(refused)} refused of {n} (expected {cap} and "
                  f"{n - cap}); {sum(1 for d in first if d is None)} closed without a line")
    c.counted["refused_clients_uid"] = n - cap
    victim = env.connect(env.victim, "victim")
    c.ok(victim.request("status"), "the victim's status during the flood")


def stranger_uid(env: Env, c: Check) -> None:
    """A uid not in control.allowed_uids (the socket's mode lets it connect) gets one
    `permission denied` line and is closed, 20 times over, counted."""
    clients = env.flood(env.stranger, 20, "stranger")
    for doc in _first_lines(clients):
        c.refused(doc, PERMISSION_DENIED, "a stranger's connection",
                  f"uid {env.stranger} is not in control.allowed_uids", breach=True)
    for cl in clients:
        try:
            extra = cl.line(0.5)
            c.leak(f"a refused stranger got a second line: {extra!r}"[:300])
        except (OSError, EOFError):
            pass
    c.counted["refused_uid"] = 20


def _exchange(c: Check, cl: Client, line: bytes, expect: int | set[int] | None, what: str,
              fds: list[int] | None = None) -> None:
    """Send `line`, then a status request: besides status's answer there must be one error
    of code `expect` (any of them, for a set; None: no line at all), and status must be
    answered."""
    sentinel = 10**9 + cl.next_id()
    cl.send_raw(line, fds)
    cl.send_raw(cl.line_of("status", req_id=sentinel))
    got: list[Any] = []
    answered: Any = None
    # A method that waits (send_message, a long-poll) may answer after the status.
    while answered is None or (expect is not None and not got):
        doc = cl.line()
        if isinstance(doc, dict) and doc.get("id") == sentinel:
            answered = doc
        else:
            got.append(doc)
    if "result" not in answered:
        c.problem(f"{what}: the next request was refused: {answered}")
    if expect is None:
        if got:
            c.problem(f"{what}: answered {json.dumps(got)[:200]}; a notification gets none")
        return
    if len(got) != 1:
        c.problem(f"{what}: {len(got)} answer lines instead of 1: {json.dumps(got)[:200]}")
        return
    for item in got[0] if isinstance(got[0], list) else got:  # a batch: each item an error
        code = expect
        if isinstance(expect, set):
            err = item.get("error") if isinstance(item, dict) else None
            got_code = err.get("code") if isinstance(err, dict) else None
            code = got_code if got_code in expect else min(expect)
        assert isinstance(code, int)
        c.refused(item, code, what)


def _req(method: str, params: Any = None, req_id: Any = 1, **extra: Any) -> bytes:
    doc: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
    if params is not None:
        doc["params"] = params
    doc.update(extra)
    return json.dumps(doc).encode() + b"\n"


def nested_json(env: Env, c: Check) -> None:
    """Lines nested 100,000 deep (arrays, objects, inside a request's params) are parse
    errors and the client's next request is answered; values nested just under the parser's
    limit are refused as bad params."""
    cl = env.connect(env.hostile, "hostile")
    deep = 100_000
    _exchange(c, cl, b"[" * deep + b"\n", PARSE_ERROR, "100,000 [")
    _exchange(c, cl, b'{"a":' * deep + b"\n", PARSE_ERROR, "100,000 {")
    head = b'{"jsonrpc":"2.0","id":5,"method":"status","params":{"x":'
    _exchange(c, cl, head + b"[" * deep + b"]" * deep + b"}}\n", PARSE_ERROR,
              "params nested 100,000 deep")
    # Just under what the decoder takes: the values reach the methods, which must refuse
    # them as parameters (and not fail showing them in the error).
    for depth in (500, 900, *range(940, 1000, 3)):
        value = "[" * depth + "]" * depth
        for method, key in (("register_region", "size"), ("deregister_region", "region"),
                            ("bind", "endpoint"), ("completions", "timeout")):
            line = (f'{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{{"{key}":'
                    f"{value}}}}}\n").encode()
            expect = BAD_MEMORY if method == "register_region" else INVALID_PARAMS
            _exchange(c, cl, line, {expect, INVALID_PARAMS, PARSE_ERROR},
                      f"{method} {key} nested {depth} deep")
    c.counted["malformed_requests"] = 3


def malformed_lines(env: Env, c: Check) -> None:
    """Lines that are not requests, each answered by one error of the right code (or, for a
    notification, by nothing), the client staying connected."""
    cl = env.connect(env.hostile, "hostile")
    many = b"[" + b",".join([b"1"] * 1025) + b"]\n"
    status = {"jsonrpc": "2.0", "method": "status"}
    cases: list[tuple[bytes, int | None, str]] = [
        (b"\xff\xfe\xfd\n", PARSE_ERROR, "not UTF-8"),
        (b"not json\n", PARSE_ERROR, "not JSON"),
        (b'{"jsonrpc":"2.0","id":1,"method":"status"}{"id":2}\n', PARSE_ERROR, "two values"),
        (b'{"jsonrpc":"2.0","id":1,"method":"status"\n', PARSE_ERROR, "cut short"),
        (_req("deregister_region", None).replace(b'"id": 1', b'"id": 1' + b"0" * 5000),
         PARSE_ERROR, "a 5000-digit id"),
        (b"[]\n", INVALID_REQUEST, "an empty batch"),
        (many, INVALID_REQUEST, "a batch of 1025"),
        (b"42\n", INVALID_REQUEST, "a number"),
        (b'"status"\n', INVALID_REQUEST, "a string"),
        (b"[1, 2, 3]\n", INVALID_REQUEST, "a batch of numbers"),
        (json.dumps({"id": 1, "method": "status"}).encode() + b"\n", INVALID_REQUEST,
         "no jsonrpc"),
        (_req("status", req_id=1.5), INVALID_REQUEST, "a fractional id"),
        (_req("status", req_id={"a": 1}), INVALID_REQUEST, "an object id"),
        (_req("status", extra=1), INVALID_REQUEST, "an unknown member"),
        (_req("", {}), INVALID_REQUEST, "an empty method"),
        (_req("status", []), INVALID_PARAMS, "params by position"),
        (_req("no_such_method"), METHOD_NOT_FOUND, "an unknown method"),
        (_req("\udcff"), METHOD_NOT_FOUND, "a lone surrogate method"),
        (_req("__init__"), METHOD_NOT_FOUND, "a Python name as method"),
        (_req("status", {"x": 1}), INVALID_PARAMS, "an unknown parameter"),
        (_req("completions", {"timeout": float("inf")}).replace(b"Infinity", b"1e999"),
         INVALID_PARAMS, "an infinite timeout"),
        (_req("completions", {"timeout": -1}), INVALID_PARAMS, "a negative timeout"),
        (_req("completions", {"max": 0}), INVALID_PARAMS, "max 0"),
        (_req("deregister_region", {"region": -1}), INVALID_PARAMS, "a negative id"),
        (_req("deregister_region", {"region": 2**64}), INVALID_PARAMS, "an id of 2^64"),
        (_req("deregister_region", {"region": True}), INVALID_PARAMS, "a boolean id"),
        (_req("write", {"connection": 1, "writes": "x"}), UNKNOWN_CONNECTION,
         "a write on nothing"),
        (_req("bind", {"endpoint": ""}), INVALID_PARAMS, "an empty endpoint"),
        (_req("send_message", {"peer": "z", "endpoint": "e", "data": "!!"}), INVALID_PARAMS,
         "bad base64"),
        (_req("register_region", {"size": 4096}), BAD_MEMORY, "a region without its fd"),
        (b"[" + json.dumps(status | {"id": 1}).encode() + b", 5]\n", INVALID_REQUEST,
         "a batch with a number"),
        (json.dumps(status).encode() + b"\n", None, "a notification"),
        (json.dumps({"jsonrpc": "2.0", "method": "nope"}).encode() + b"\n", None,
         "a notification of an unknown method"),
        (b"\n\n  \t \r\n", None, "blank lines"),
    ]
    for line, code, what in cases:
        if what == "a batch with a number":
            _batch(c, cl, line, what)
        else:
            _exchange(c, cl, line, code, what)
    # An id that fills the line, escaped to six bytes a character in the answer: the answer
    # must still be one line of at most 1 MiB.
    big = json.dumps({"jsonrpc": "2.0", "id": "\u20ac" * 340_000, "method": "nope"},
                     ensure_ascii=False).encode() + b"\n"
    _exchange(c, cl, big, {METHOD_NOT_FOUND, RESOURCE_LIMIT}, "an id of 340,000 euro signs")
    if cl.longest > MAX_LINE:
        c.problem(f"an answer line of {cl.longest} bytes, more than {MAX_LINE}")
    c.measured["longest_answer_line"] = cl.longest
    c.counted["malformed_requests"] = 10


def _batch(c: Check, cl: Client, line: bytes, what: str) -> None:
    """A batch of a good request and a bad item: one array line, one answer each."""
    sentinel = 10**9 + cl.next_id()
    cl.send_raw(line)
    cl.send_raw(cl.line_of("status", req_id=sentinel))
    doc = cl.line()
    if not (isinstance(doc, list) and len(doc) == 2 and "result" in doc[0]):
        c.problem(f"{what}: answered {json.dumps(doc)[:200]}")
    else:
        c.refused(doc[1], INVALID_REQUEST, what)
    if cl.answer(sentinel).get("result") is None:
        c.problem(f"{what}: the next request was not answered")


def oversized_line(env: Env, c: Check) -> None:
    """A 3 MiB line (sent in pieces, an fd riding on one of them) is one `invalid request`
    and skipped to its newline; the next request is answered; no fd is kept."""
    cl = env.connect(env.hostile, "hostile")
    chunk = b"x" * (256 << 10)
    m = env.memfd(4096)
    sentinel = 10**9 + cl.next_id()
    for i in range(12):
        cl.send_raw(chunk, [m.fd] if i == 5 else None)
    cl.send_raw(b"\n" + cl.line_of("status", req_id=sentinel))
    lines = []
    while True:
        doc = cl.line()
        if isinstance(doc, dict) and doc.get("id") == sentinel:
            break
        lines.append(doc)
    if len(lines) != 1:
        c.problem(f"{len(lines)} answers to one oversized line: {json.dumps(lines)[:200]}")
    for doc in lines:
        c.refused(doc, INVALID_REQUEST, "a 3 MiB line", f"longer than {MAX_LINE} bytes")
    # Just at the limit: MAX_LINE bytes with the newline is a line (not JSON here).
    _exchange(c, cl, b" " * (MAX_LINE - 2) + b"x\n", PARSE_ERROR, "a line of exactly 1 MiB")
    _exchange(c, cl, b" " * (MAX_LINE - 1) + b"x\n", INVALID_REQUEST, "a line of 1 MiB + 1")
    c.counted["oversized_lines"] = 2


def bad_fds(env: Env, c: Check) -> None:
    """fds on the wrong line, too many fds, an fd in a batch, a notification or junk: each
    refused and closed by the daemon, which keeps none of them."""
    cl = env.connect(env.hostile, "hostile")
    m = env.memfd(4096)
    reg = {"size": 4096}
    _exchange(c, cl, cl.line_of("status"), INVALID_PARAMS, "an fd with status", [m.fd])
    _exchange(c, cl, cl.line_of("register_region", reg), INVALID_PARAMS, "two fds",
              [m.fd, m.fd])
    _exchange(c, cl, cl.line_of("register_region", reg), INVALID_PARAMS, "5 fds (cut)",
              [m.fd] * 5)
    _exchange(c, cl, b"[" + cl.line_of("register_region", reg).strip() + b"]\n",
              INVALID_PARAMS, "an fd with a batch", [m.fd])
    _exchange(c, cl, b"junk\n", PARSE_ERROR, "an fd with junk", [m.fd])
    _exchange(c, cl, json.dumps({"jsonrpc": "2.0", "method": "register_region",
                                 "params": reg}).encode() + b"\n", None,
              "an fd with a notification", [m.fd])
    for _ in range(50):  # fds that could pile up in the daemon if it kept them
        _exchange(c, cl, cl.line_of("status"), INVALID_PARAMS, "an fd with status", [m.fd])
    c.counted["refused_fds"] = 50


def bad_memfds(env: Env, c: Check) -> None:
    """register_region with an fd that is no usable memfd: `bad memory`, one line each."""
    cl = env.connect(env.hostile, "hostile")
    r, w = os.pipe()
    zero = os.open("/dev/zero", os.O_RDONLY)
    plain = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
    plain.truncate(8192)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    unsealable = env.memfd(8192, sealing=False)
    short = env.memfd(4096)
    write_sealed = os.memfd_create("sealed", os.MFD_ALLOW_SEALING)
    os.ftruncate(write_sealed, 8192)
    fcntl.fcntl(write_sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
    future_sealed = os.memfd_create("future", os.MFD_ALLOW_SEALING)
    os.ftruncate(future_sealed, 8192)
    fcntl.fcntl(future_sealed, fcntl.F_ADD_SEALS, 0x0010)  # F_SEAL_FUTURE_WRITE
    readonly_src = env.memfd(8192)
    readonly = os.open(f"/proc/self/fd/{readonly_src.fd}", os.O_RDONLY)
    try:
        for fd, what in ((r, "a pipe"), (zero, "/dev/zero"), (plain.fileno(), "a file"),
                         (sock.fileno(), "a socket"), (unsealable.fd, "an unsealable memfd"),
                         (short.fd, "a memfd of 4096 for 8192"),
                         (write_sealed, "a write-sealed memfd"),
                         (future_sealed, "a future-write-sealed memfd"),
                         (readonly, "a read-only memfd")):
            _exchange(c, cl, cl.line_of("register_region", {"size": 8192}), BAD_MEMORY, what,
                      [fd])
        for size, what in ((0, "size 0"), (-1, "size -1"), (1 << 41, "size 2^41"),
                           ("8192", "size as text")):
            _exchange(c, cl, cl.line_of("register_region", {"size": size}), INVALID_PARAMS,
                      what, [short.fd])
    finally:
        for fd in (r, w, zero, write_sealed, future_sealed, readonly):
            os.close(fd)
        plain.close()
        sock.close()


def sparse_memfd(env: Env, c: Check) -> None:
    """A sparse GiB memfd registered by the hostile uid: the daemon's resident memory does not
    grow by it (no MAP_POPULATE), and the daemon keeps answering meanwhile."""
    cl = env.connect(env.hostile, "hostile")
    before = env.daemon.rss()
    c.ok(env.register(cl, GIB, "sparse"), "a sparse GiB")
    for _ in range(10):  # a few turns of the daemon's loop (its prefault steps)
        c.ok(cl.request("status"), "status")
        time.sleep(0.02)
    grown = env.daemon.rss() - before
    c.measured["daemon_growth_mib"] = round(grown / MIB, 1)
    if grown > SPARSE_GROWTH:
        c.problem(f"a sparse GiB grew the daemon by {grown >> 20} MiB")


def long_polls(env: Env, c: Check) -> None:
    """65 long-polls at once: the one past 64 is refused, one line; the client's other
    requests are answered meanwhile; closing it ends its waits."""
    cl = env.connect(env.hostile, "hostile")
    for _ in range(65):
        cl.send_raw(cl.line_of("completions", {"timeout": 30}))
    got = cl.line()
    c.refused(got, RESOURCE_LIMIT, "the 65th long-poll", "long-polls")
    c.ok(cl.request("status", timeout=3.0), "status while 64 long-polls wait")


def slow_reader(env: Env, c: Check) -> None:
    """A client that sends batches of requests and reads no answer: the daemon stops reading
    it (counted `paused_clients`) instead of buffering without end, and serves the others
    meanwhile."""
    cl = env.connect(env.hostile, "hostile")
    # 512 answers of status stay well under a line's 1 MiB (a longer one would be replaced
    # by a short error, and the unread answers would pile up slower).
    batch = b"[" + b",".join(
        cl.line_of("status", req_id=i).strip() for i in range(512)
    ) + b"]\n"
    before = env.counters().get("paused_clients", 0)
    sent = 0
    paused = False
    deadline = time.monotonic() + 10
    cl.sock.setblocking(False)
    try:
        while time.monotonic() < deadline and not paused:
            if select.select([], [cl.sock], [], 0.1)[1]:
                with contextlib.suppress(BlockingIOError):
                    sent += cl.sock.send(batch[sent % len(batch):])
            else:  # its socket is full: has the daemon stopped reading it?
                paused = env.counters().get("paused_clients", 0) > before
    finally:
        cl.sock.setblocking(True)
    c.measured["bytes_sent_unread"] = sent
    victim = env.connect(env.victim, "victim")
    started = time.monotonic()
    c.ok(victim.request("status", timeout=3.0), "a victim's status while the reader sleeps")
    waited = time.monotonic() - started
    c.measured["victim_wait_seconds"] = round(waited, 3)
    if waited > 2.0:
        c.problem(f"the victim waited {waited:.1f} s")
    c.counted["paused_clients"] = 1


def subscriptions(env: Env, c: Check) -> None:
    """`subscribe` naming no kind, a kind not `true`, or an unknown key is one invalid-params
    line; once subscribed, a long-poll for what is pushed is refused the same way and the
    client is served as before (its pushes go through the same bounded output as its
    answers: slow_reader)."""
    cl = env.connect(env.hostile, "hostile")
    for params in ({}, {"immediates": False}, {"completions": 1}, {"immediates": "yes"},
                   {"immediates": True, "messages": True}, [True]):
        _exchange(c, cl, _req("subscribe", params), INVALID_PARAMS, f"subscribe {params}")
    c.ok(cl.request("subscribe", {"immediates": True}, timeout=3.0), "subscribe")
    c.ok(cl.request("subscribe", {"immediates": True, "completions": True}, timeout=3.0),
         "subscribe again, and to completions")
    _exchange(c, cl, _req("immediates", {"timeout": 1}), INVALID_PARAMS,
              "a subscriber's immediates long-poll")
    _exchange(c, cl, _req("completions", {"timeout": 1}), INVALID_PARAMS,
              "a subscriber's completions long-poll")


CASES: dict[str, Callable[[Env, Check], None]] = {
    "view_regions": view_regions,
    "view_connections": view_connections,
    "foreign_objects": foreign_objects,
    "region_quota": region_quota,
    "endpoint_quota": endpoint_quota,
    "connection_quota": connection_quota,
    "client_flood": client_flood,
    "stranger_uid": stranger_uid,
    "nested_json": nested_json,
    "malformed_lines": malformed_lines,
    "oversized_line": oversized_line,
    "bad_fds": bad_fds,
    "bad_memfds": bad_memfds,
    "sparse_memfd": sparse_memfd,
    "long_polls": long_polls,
    "slow_reader": slow_reader,
    "subscriptions": subscriptions,
}


# -- the run ------------------------------------------------------------------------------------


def config(socket_path: str, port: int, opts: LocalOptions) -> str:
    allowed = sorted({opts.hostile_uid, opts.victim_uid})
    lines = [
        'host = "hostile-local"',
        f"port = {port}",
        'security = "none"',
        *(f'[[planes]]\naddress = "{a}"' for a in PLANES),
        f'[[peers]]\nname = "z"\naddresses = {json.dumps(SILENT)}',
        "[control]",
        f'socket = "{socket_path}"',
        'mode = "0660"',
        'group = "nogroup"',
        f"allowed_uids = {json.dumps(allowed)}",
        "[limits]",
        *(f"{k} = {v}" for k, v in LIMITS.items()),
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise CaseTimeout(f"the case took more than {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _well_behaved(env: Env) -> str | None:
    """Why a new client of the victim's uid is not served as it should be (None: it is)."""
    try:
        cl = env.connect(env.victim, "well-behaved")
        try:
            if "result" not in cl.request("status"):
                return "status refused"
            m = env.memfd(4096)
            reg = cl.request("register_region", {"size": 4096, "name": "probe"}, fd=m.fd)
            if "result" not in reg:
                return f"register_region refused: {reg.get('error')}"
            rows = cl.request("regions").get("result")
            if [r.get("region") for r in rows or []] != [reg["result"]["region"]]:
                return f"its regions view is {rows}"
            if "result" not in cl.request("deregister_region",
                                          {"region": reg["result"]["region"]}):
                return "deregister_region refused"
        finally:
            env.close_case()
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _one_case(env: Env, name: str) -> dict[str, Any]:
    daemon = env.daemon
    check = Check(name)
    log_at = daemon.log_size()
    before = env.counters()
    fds = daemon.fds()
    started = time.monotonic()
    try:
        with _time_limit(CASE_SECONDS):
            CASES[name](env, check)
    except Exception as exc:  # whatever it is, the case failed and the others still run
        check.problem(f"the case stopped: {type(exc).__name__}: {exc}")
    errors = env.close_case()
    seconds = time.monotonic() - started
    alive = daemon.returncode is None
    why = _well_behaved(env) if alive else f"the daemon ended (exit {daemon.returncode})"
    try:
        settled = alive and env.settle()
        after = env.counters() if alive else before
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        why = why or f"the admin client lost the daemon: {type(exc).__name__}: {exc}"
        alive = settled = False
        after = before
    if alive and not settled:
        check.problem("the daemon still counts the case's clients 5 s after they closed")
    for key, least in check.counted.items():
        moved = after.get(key, 0) - before.get(key, 0)
        if moved < least:
            check.problem(f"counter {key} moved by {moved}, expected at least {least}")
    bad_lines = [e for e in errors if not _one_line(e)]
    for e in bad_lines[:3]:
        check.problem(f"an error that is not one line with a known code: {json.dumps(e)[:200]}")
    log = daemon.log(log_at)
    tracebacks = log.count("Traceback (most recent call last)")
    internal = [ln.strip() for ln in log.splitlines() if "internal error" in ln]
    internal_counted = after.get("internal_errors", 0) - before.get("internal_errors", 0)
    fds_after = daemon.fds()
    if alive and settled and fds_after > fds:
        check.problem(f"the daemon holds {fds_after - fds} more fd(s) than before the case")
    survived = alive and why is None
    clean = tracebacks == 0 and not internal and internal_counted == 0
    return {
        "ok": survived and clean and not check.problems and not check.leaks,
        "survived": survived,
        "clear": not check.problems,
        "leaked": bool(check.leaks),
        "traceback": not clean,
        "seconds": round(seconds, 3),
        "errors_drawn": dict(sorted(check.drew.items())),
        "counted": {k: after.get(k, 0) - before.get(k, 0) for k in sorted(check.counted)},
        "measured": check.measured,
        "problems": check.problems[:20] + ([why] if why else []),
        "leaks": check.leaks[:20],
        "daemon_log": (internal[:3] + ([f"{tracebacks} traceback(s)"] if tracebacks else [])),
    }


def _one_line(err: dict[str, Any]) -> bool:
    message = err.get("message")
    return (
        err.get("code") in KNOWN_CODES
        and isinstance(message, str)
        and 0 < len(message) <= 500
        and "\n" not in message
        and "\r" not in message
    )


def _port() -> int:
    for _ in range(50):
        port = free_port(PLANES[0])
        with contextlib.ExitStack() as stack:
            try:
                for addr in PLANES[1:]:
                    s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                    s.bind((addr, port))
            except OSError:
                continue
            return port
    raise LocalError("no UDP port free on the daemon's plane addresses")


def run_local(opts: LocalOptions) -> dict[str, Any]:
    """Run the chosen cases at one daemon; their figures (LocalError: could not start)."""
    tmp = tempfile.mkdtemp(prefix="mrc-hostile-local-")
    os.chmod(tmp, 0o711)  # the other uids go through to the socket
    daemon: LocalDaemon | None = None
    cases: dict[str, Any] = {}
    started = time.monotonic()
    try:
        daemon = LocalDaemon(tmp, config(os.path.join(tmp, "mrc.sock"), _port(), opts))
        daemon.wait_ready()
        env = Env(daemon, opts)
        try:
            for name in opts.cases:
                if daemon.returncode is not None:
                    cases[name] = {"ok": False, "survived": False, "leaks": [],
                                   "problems": ["not run: the daemon had ended"]}
                    continue
                try:
                    cases[name] = _one_case(env, name)
                except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
                    cases[name] = {"ok": False, "survived": False, "leaks": [], "problems": [
                        f"the harness lost the daemon: {type(exc).__name__}: {exc}"]}
        finally:
            env.close_case()
            env.admin.close()
        exit_status = daemon.stop()
        log = daemon.log()
    finally:
        if daemon is not None:
            daemon.stop()
        _rmtree(tmp)
    crashes = []
    if daemon.killed:
        crashes.append("the daemon did not stop within 10 s of SIGTERM (killed)")
    elif exit_status != 0:
        crashes.append(f"the daemon exited with status {exit_status} on SIGTERM")
    if "Traceback (most recent call last)" in log:
        crashes.append("a Python traceback in the daemon's log")
    return {
        "hostile_uid": opts.hostile_uid,
        "victim_uid": opts.victim_uid,
        "seconds": round(time.monotonic() - started, 3),
        "daemon": {"exit": exit_status},
        "crashes": crashes,
        "cases": cases,
        "failed": [n for n, c in cases.items() if not c["ok"]],
        "leaks": sum(len(c.get("leaks", [])) for c in cases.values()),
    }


def _rmtree(path: str) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        for f in files:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, f))
        for d in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, d))
    with contextlib.suppress(OSError):
        os.rmdir(path)


def verdict(fig: dict[str, Any]) -> int:
    """0 when every case passed and the daemon stopped cleanly; 1 otherwise."""
    return 1 if fig["crashes"] or fig["failed"] else 0


def text(fig: dict[str, Any]) -> str:
    cases = fig["cases"]
    lines = [
        f"local: {len(cases)} case(s) against a daemon in {fig['seconds']:.1f} s, hostile uid "
        f"{fig['hostile_uid']}: {len(cases) - len(fig['failed'])} passed, "
        f"{len(fig['failed'])} failed, {fig['leaks']} leak(s)",
        f"crashes: {len(fig['crashes'])}" + "".join(f"\n  {c}" for c in fig["crashes"]),
    ]
    for name, case in cases.items():
        if not case["ok"]:
            for why in case.get("leaks", []) + case.get("problems", []) + case.get(
                "daemon_log", []
            ):
                lines.append(f"  {name}: {why}")
    return "\n".join(lines)
