"""`mrc bench --daemon SOCK`: the benchmark as two applications of their hosts' daemons.

`mrc bench -s --daemon SOCK [-1]` serves tests through the local daemon; `mrc bench -c PEER
--daemon SOCK -n 1G -l 1M --verify` writes to the server application on the daemon's peer
PEER. So the measurement crosses the real service path: control socket, shared-memory regions,
the daemon's MRC connection (docs/DESIGN.md §9, §10). Both print iperf3-like lines or, with
-J, one JSON document with goodput, integrity and the daemon's per-plane byte counts moved
during the test.

The two sides write and check by the same rules as the in-process test (`writer.WritePlan`,
`receiver.Verifier`); what is this module's is how they travel, through `mrc.client`, and
their agreement, carried as small JSON messages through the daemons (no side channel):

- the client binds a reply endpoint `bench-<cookie>` and sends `request` (message size, byte
  count or duration, pattern seed, verify, reply endpoint) to the endpoint "bench" of the peer;
- the server registers a DATA region of `slots` × message size and answers `ready` with its
  handle and `slots` (or `error`);
- the client WRITEs message n into slot n mod slots, keeping up to a window of WRITEs
  outstanding (`write_many`, one request for many). With verify, message n holds
  `proto.Pattern` bytes and is a WRITE_WITH_IMM carrying n; the server checks the slot when
  the immediate arrives and returns `credit` (messages checked so far) every quarter of the
  slots, and the client never posts n before message n - slots was checked: a slot is never
  overwritten before its check, even though completions reach the client before the server
  app has looked (its daemon queues the immediate);
- once every WRITE completed the client sends `end` (messages, bytes, seconds, write errors);
  the server, once it has checked them all, answers `results`.

Holds `Progress` (interval samples), `run_writer` and `serve_one` (the two sides), the output,
and `main`; the flags were checked by `options` (the transport flags of the in-process bench
are the daemon's configuration here). Every expected failure is one line on stderr and exit
status 1.
"""

from __future__ import annotations

import json
import random
import secrets
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mrc
from mrc.client import Client, ClientError, Message, RegionHandle, Write
from mrc.client.rpc import METHOD_NOT_FOUND, TOO_MANY_OUTSTANDING

from ...units import fmt_bytes, fmt_rate
from .options import BenchOptions
from .proto import MAX_MESSAGE_SIZE, MAX_MESSAGES, Pattern
from .receiver import Verifier
from .report import RULE, STREAM_ID
from .writer import WritePlan

__all__ = [
    "ENDPOINT",
    "BenchFailed",
    "Progress",
    "TestResult",
    "main",
    "plane_bytes",
    "run_writer",
    "serve_one",
]

ENDPOINT = "bench"
VERSION = 1
#: WRITEs per `write_many` request.
BATCH = 64
#: Bytes the writer keeps in flight (as whole messages, at least 2, at most MAX_WINDOW).
WINDOW_BYTES = 32 << 20
MAX_WINDOW = 1024
#: Bytes of the server's DATA region (as whole slots, at least 2).
SLOT_BYTES = 64 << 20
MAX_SLOTS = 1024
#: A test that moves nothing for this long is abandoned (a peer that died or went silent).
STALL = 30.0
#: Long-poll of the loops: short enough to keep interval lines and credits timely.
TICK = 0.05


class BenchFailed(Exception):
    """The test could not run or finish; one line."""


def slots_for(msg_size: int) -> int:
    return max(2, min(MAX_SLOTS, SLOT_BYTES // msg_size))


def encode(op: str, cookie: str, **fields: Any) -> bytes:
    return json.dumps({"v": VERSION, "op": op, "cookie": cookie, **fields},
                      separators=(",", ":")).encode()


def decode(msg: Message) -> dict[str, Any] | None:
    """A bench message, or None for anything else (ignored, never a traceback)."""
    try:
        obj = json.loads(msg.data)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("v") != VERSION or not isinstance(obj.get("op"), str):
        return None
    return obj


@dataclass(slots=True)
class Progress:
    """Interval samples of one side: bytes moved between reports, printed as they close."""

    interval: float
    show: Callable[[float, float, int], None]
    start: float = field(default_factory=time.monotonic)
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    _last_t: float = 0.0
    _last_bytes: int = 0

    def due(self) -> bool:
        return bool(self.interval) and time.monotonic() - self.start - self._last_t >= self.interval

    def tick(self, total: int, final: bool = False) -> None:
        t = time.monotonic() - self.start
        if not self.interval or (t - self._last_t < self.interval and not final):
            return
        if final and t - self._last_t < 0.001:
            return
        sample = (self._last_t, t, total - self._last_bytes)
        self.samples.append(sample)
        self.show(*sample)
        self._last_t, self._last_bytes = t, total


@dataclass(slots=True)
class TestResult:
    """One side's account of a test, and the other side's as it reported it."""

    role: str
    messages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    messages_verified: int = 0
    mismatches: int = 0
    write_errors: dict[str, int] = field(default_factory=dict)
    verify: bool = False
    peer: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    test_start: dict[str, Any] = field(default_factory=dict)

    def integrity(self) -> str:
        """ok when the receiver checked every message that completed without an error."""
        if not self.verify:
            return "not-checked"
        receiver, writer = (self.peer, self.as_dict()) if self.role == "client" else (
            self.as_dict(), self.peer)
        if receiver.get("mismatches") or receiver.get("messages_verified") != _landed(writer):
            return "mismatch"
        return "ok"

    def as_dict(self) -> dict[str, Any]:
        return {"messages": self.messages, "bytes": self.bytes, "seconds": self.seconds,
                "messages_verified": self.messages_verified, "mismatches": self.mismatches,
                "write_errors": dict(self.write_errors)}


def _wait_for(client: Client, endpoint: str, cookie: str, ops: tuple[str, ...],
              timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        msg = client.recv_message(endpoint, timeout=left)
        obj = decode(msg) if msg is not None else None
        if obj is None or obj.get("cookie") != cookie:
            continue
        if obj["op"] == "error":
            raise BenchFailed(f"the server refused the test: {obj.get('error', '?')}")
        if obj["op"] in ops:
            return obj
    hint = " (is `mrc bench -s --daemon SOCK` running there?)" if "ready" in ops else ""
    raise BenchFailed(f"no {'/'.join(ops)} from the server within {timeout:g} s{hint}")


def run_writer(client: Client, peer: str, *, msg_size: int, total_bytes: int, duration: float,
               verify: bool, wait: float, progress: Progress) -> TestResult:
    """One test as the writing client; raises BenchFailed or ClientError."""
    cookie = secrets.token_hex(8)
    reply = f"bench-{cookie}"
    seed = random.getrandbits(32)
    result = TestResult("client", verify=verify)
    result.test_start = {"blksize": msg_size, "bytes": total_bytes, "duration": duration,
                         "verify": verify, "seed": seed, "peer": peer}
    client.bind(reply)
    # The daemon pushes the completions: the waits for them ask nothing (docs/DAEMON.md,
    # `subscribe`); a daemon without it is asked.
    try:
        client.subscribe(immediates=False)
    except ClientError as exc:
        if exc.code != METHOD_NOT_FOUND:
            raise
    # Everything that costs time before data flows (the MRC handshake, mapping and filling
    # the source) happens before the request, so the server's clock starts with the data.
    conn = client.connect(peer)
    local_slots = slots_for(msg_size) if verify else 1
    local = client.register_region(local_slots * msg_size, "bench-source")
    pattern = Pattern(seed, msg_size) if verify else None
    stream = memoryview(pattern.stream) if pattern is not None else None
    if pattern is None:
        local.buf[:] = random.Random(seed).randbytes(msg_size)
    client.send_message(peer, ENDPOINT, encode(
        "request", cookie, msg_size=msg_size, total_bytes=total_bytes, duration=duration,
        seed=seed, verify=verify, reply=reply))
    ready = _wait_for(client, reply, cookie, ("ready",), wait)
    try:
        handle = RegionHandle.from_dict(ready.get("handle"))
    except ClientError as exc:
        raise BenchFailed(f"the server's ready message: {exc}") from None
    slots = ready.get("slots")
    if type(slots) is not int or not 1 <= slots <= MAX_SLOTS or slots * msg_size > handle.length:
        raise BenchFailed(f"the server's ready message has a bad slot count {slots!r}")
    if verify and slots > local_slots:  # a server with another slot rule: follow it
        local.close()
        local = client.register_region(slots * msg_size, "bench-source")
    plan = WritePlan(msg_size, total_bytes, slots, pattern)
    count = plan.count
    window = max(2, min(MAX_WINDOW, WINDOW_BYTES // msg_size))
    if verify:
        window = min(window, slots)
    inflight: deque[tuple[int, int]] = deque()  # (write id, length) in posting order
    next_n = checked = 0
    errors: Counter[str] = Counter()
    stopping = False
    last_move = progress.start = start = time.monotonic()
    while True:
        now = time.monotonic()
        if duration and now - start >= duration:
            stopping = True
        if now - last_move > STALL:
            raise BenchFailed(f"no WRITE completed for {STALL:g} s")
        batch: list[Write] = []
        while not stopping and len(inflight) + len(batch) < window and len(batch) < BATCH:
            n = next_n + len(batch)
            if not plan.more(n) or (verify and n >= checked + slots):
                break
            length = plan.length(n)
            off = plan.slot_offset(n) if verify else 0  # the source mirrors the slots
            if pattern is not None and stream is not None:
                src = plan.source_offset(n)
                local.buf[off:off + length] = stream[src:src + length]
            batch.append(Write(local, off, length, handle, plan.slot_offset(n), imm=plan.imm(n)))
        if batch:
            try:
                ids = conn.write_many(batch)
            except ClientError as exc:
                # The daemon's cap is lower than our window: settle just under it.
                if exc.code != TOO_MANY_OUTSTANDING or not inflight:
                    raise
                window = max(1, len(inflight))
                continue
            inflight.extend((i, w.length) for i, w in zip(ids, batch, strict=True))
            next_n += len(batch)
        if not inflight and (stopping or next_n == count or next_n >= MAX_MESSAGES):
            break
        if verify and (next_n >= checked + slots // 2 or not inflight):
            while (msg := client.recv_message(reply, timeout=0 if inflight else TICK)):
                obj = decode(msg)
                if obj is not None and obj.get("cookie") == cookie:
                    if obj["op"] == "error":
                        raise BenchFailed(f"the server gave up: {obj.get('error', '?')}")
                    if obj["op"] == "credit" and type(obj.get("checked")) is int:
                        checked = max(checked, obj["checked"])
                        last_move = time.monotonic()
                if not inflight:
                    break
        if inflight:
            for c in conn.poll(timeout=0 if batch else TICK):
                wid, length = inflight.popleft()
                if c.id != wid:
                    raise BenchFailed(f"completion {c.id} came before {wid}: not in posting order")
                result.messages += 1
                last_move = time.monotonic()
                if c.ok:
                    result.bytes += c.bytes
                else:
                    errors[c.status] += 1
                    stopping = True
        progress.tick(result.bytes)
    result.seconds = time.monotonic() - start
    progress.tick(result.bytes, final=True)
    result.write_errors = dict(errors)
    client.send_message(peer, ENDPOINT, encode("end", cookie, **result.as_dict()))
    result.peer = _wait_for(client, reply, cookie, ("results",), STALL)
    conn.close()
    local.close()
    return result


def plane_bytes(client: Client, key: str) -> int:
    """The daemon's `key` counter summed over its planes."""
    planes = client.status().get("planes")
    return sum(int(p.get(key) or 0) for p in planes if isinstance(p, dict)) if isinstance(
        planes, list) else 0


def _landed(end: dict[str, Any]) -> int:
    """Messages of an `end` report that completed without an error (so have an immediate)."""
    errors = end.get("write_errors")
    failed = sum(v for v in errors.values() if type(v) is int) if isinstance(errors, dict) else 0
    return int(end.get("messages") or 0) - failed


def _check_request(obj: dict[str, Any]) -> str:
    """Why a request cannot be served, or ''."""
    ms, total, dur = obj.get("msg_size"), obj.get("total_bytes"), obj.get("duration")
    if type(ms) is not int or not 1 <= ms <= MAX_MESSAGE_SIZE:
        return f"message size {ms!r} outside 1..{MAX_MESSAGE_SIZE}"
    if type(total) is not int or total < 0 or not isinstance(dur, int | float) or dur < 0:
        return "bad byte count or duration"
    if (total > 0) == (dur > 0):
        return "exactly one of byte count and duration must be set"
    if total and -(-total // ms) > MAX_MESSAGES:
        return "too many messages"
    if type(obj.get("seed")) is not int or not isinstance(obj.get("reply"), str):
        return "missing seed or reply endpoint"
    return ""


def serve_one(client: Client, request: Message, progress: Progress) -> TestResult:
    """Answer one request (already received on ENDPOINT) and receive its test."""
    obj = decode(request)
    result = TestResult("server")
    if obj is None or obj.get("op") != "request" or not isinstance(obj.get("cookie"), str):
        raise BenchFailed(f"ignored a message from {request.peer} that is not a bench request")
    cookie, peer = obj["cookie"], request.peer
    problem = _check_request(obj)
    if problem:
        client.send_message(peer, obj.get("reply", "") or ENDPOINT,
                            encode("error", cookie, error=problem))
        raise BenchFailed(f"refused a request from {peer}: {problem}")
    msg_size, total, verify = obj["msg_size"], obj["total_bytes"], bool(obj.get("verify"))
    reply = obj["reply"]
    result.verify = verify
    result.test_start = {"blksize": msg_size, "bytes": total, "duration": obj["duration"],
                         "verify": verify, "seed": obj["seed"], "peer": peer}
    slots = slots_for(msg_size)
    try:
        region = client.register_region(slots * msg_size, "bench-data")
    except ClientError as exc:  # e.g. more than the daemon lets one application map
        client.send_message(peer, reply, encode("error", cookie, error=f"server region: {exc}"))
        raise BenchFailed(f"refused a request from {peer}: {exc}") from None
    pattern = Pattern(obj["seed"], msg_size) if verify else None
    verifier = Verifier(pattern, msg_size, total, slots)
    try:
        client.send_message(peer, reply, encode("ready", cookie, handle=region.handle.to_dict(),
                                                slots=slots))
        base = 0 if pattern is not None else plane_bytes(client, "bytes_received")
        progress.start = start = last_move = last_check = time.monotonic()
        credited = 0
        # Messages a test of a byte count sends (0: a timed test, whose count comes in `end`).
        expected = -(-total // msg_size) if total else 0
        end: dict[str, Any] | None = None
        while True:
            ask = True
            if pattern is not None:
                landed = client.wait_immediates(region, timeout=TICK)
                for imm in landed:
                    result.bytes += verifier.arrived(imm.imm, region.buf)
                    last_move = last_check = time.monotonic()
                result.messages_verified = verifier.verified
                result.mismatches = verifier.mismatches
                checked = verifier.verified + verifier.mismatches
                if checked - credited >= max(1, slots // 4):
                    client.send_message(peer, reply, encode("credit", cookie, checked=checked))
                    credited = checked
                # The endpoint (the test's `end`, another client's request) is asked when a
                # tick brought nothing, at each credit and once all that was expected was
                # checked: not once per arrival.
                ask = not landed or credited == checked or 0 < expected <= checked
            msg = client.recv_message(ENDPOINT, timeout=0 if pattern is not None else TICK) \
                if ask else None
            got = decode(msg) if msg is not None else None
            if got is not None and got.get("cookie") == cookie and got["op"] == "end":
                end = got
                last_move = time.monotonic()
            elif got is not None and got["op"] == "request" and msg is not None:
                client.send_message(msg.peer, str(got.get("reply", ENDPOINT)), encode(
                    "error", str(got.get("cookie")), error="busy with another test"))
            if end is not None and (pattern is None or result.messages_verified
                                    + result.mismatches >= _landed(end)):
                break
            if time.monotonic() - last_move > STALL:
                result.error = f"the client moved nothing for {STALL:g} s"
                break
            if pattern is not None:
                progress.tick(result.bytes)
            elif progress.due():
                # Without immediates the receiver sees no messages: its daemon's planes do.
                progress.tick(plane_bytes(client, "bytes_received") - base)
        # A verified test lasted until its last message was checked (`end` itself may take a
        # tick more to be asked for); an unverified one until its `end`.
        result.seconds = (last_check if pattern is not None else time.monotonic()) - start
        if end is not None:
            result.peer = end
            result.messages = int(end.get("messages", 0))
            if pattern is None:
                result.bytes = int(end.get("bytes", 0))
            client.send_message(peer, reply, encode("results", cookie, **result.as_dict()))
        progress.tick(result.bytes, final=True)
    finally:
        region.close()
    return result


# -- output ---------------------------------------------------------------------------------------


class _Out:
    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode

    def line(self, text: str) -> None:
        if not self.json_mode:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def interval(self, start: float, end: float, nbytes: int) -> None:
        rate = nbytes * 8 / max(1e-9, end - start)
        self.line(f"[{STREAM_ID:3d}] {start:6.2f}-{end:<6.2f} sec  {fmt_bytes(nbytes):>11}  "
                  f"{fmt_rate(rate):>15}")


def _sum(side: dict[str, Any]) -> dict[str, Any]:
    secs = float(side.get("seconds") or 0.0)
    nbytes = int(side.get("bytes") or 0)
    return {"start": 0.0, "end": secs, "seconds": secs, "bytes": nbytes,
            "bits_per_second": nbytes * 8 / secs if secs > 0 else 0.0}


def _plane_deltas(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """The daemon's per-plane counters moved during the test (all its traffic, not only ours:
    on a shared daemon other applications' bytes count too)."""
    keys = ("bytes_sent", "bytes_received", "packets_sent", "packets_received")
    old = {p.get("plane"): p for p in before.get("planes") or [] if isinstance(p, dict)}
    rows = []
    for p in after.get("planes") or []:
        if not isinstance(p, dict):
            continue
        prev = old.get(p.get("plane"), {})
        row = {"plane": p.get("plane"), "local": p.get("local"), "state": p.get("state")}
        row.update({k: int(p.get(k) or 0) - int(prev.get(k) or 0) for k in keys})
        rows.append(row)
    return rows


def report(out: _Out, result: TestResult, progress: Progress, before: dict[str, Any],
           after: dict[str, Any]) -> None:
    local = result.as_dict()
    sent, received = (local, result.peer) if result.role == "client" else (result.peer, local)
    planes = _plane_deltas(before, after)
    integrity = result.integrity()
    if out.json_mode:
        s_sum, r_sum = _sum(sent), _sum(received)
        s_sum["retransmits"] = 0
        doc = {
            "start": {"version": f"mrc {mrc.__version__}", "role": result.role,
                      "implementation": mrc.implementation(),
                      "daemon": {k: before.get(k) for k in ("host", "version", "security")},
                      "timestamp": {"timesecs": int(time.time())},
                      "test_start": result.test_start},
            "intervals": [{"sum": {"start": round(a, 6), "end": round(b, 6),
                                   "seconds": round(b - a, 6), "bytes": n,
                                   "bits_per_second": n * 8 / max(1e-9, b - a),
                                   "sender": result.role == "client"}}
                          for a, b, n in progress.samples],
            "end": {"sum_sent": s_sum, "sum_received": r_sum, "mrc": {
                "integrity": integrity,
                "messages": int(sent.get("messages") or 0),
                "messages_verified": int(received.get("messages_verified") or 0),
                "writes_per_second": (int(sent.get("messages") or 0)
                                      / s_sum["seconds"] if s_sum["seconds"] else 0.0),
                "write_errors": sent.get("write_errors") or {},
                "planes": planes,
                "remote": result.peer,
            }},
        }
        if result.error:
            doc["error"] = result.error
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    out.line(RULE)
    out.line("[ ID] Interval           Transfer     Bitrate")
    for side, word in ((sent, "sender"), (received, "receiver")):
        if side:
            s = _sum(side)
            out.line(f"[{STREAM_ID:3d}] {0.0:6.2f}-{s['seconds']:<6.2f} sec  "
                     f"{fmt_bytes(s['bytes']):>11}  {fmt_rate(s['bits_per_second']):>15}"
                     f"                   {word}")
    msgs = int(sent.get("messages") or 0)
    secs = float(sent.get("seconds") or 0.0)
    out.line(f"writes: {msgs} of {result.test_start.get('blksize')} bytes"
             + (f", {msgs / secs:.0f} writes/s" if secs else ""))
    if integrity == "not-checked":
        out.line("integrity: not-checked (run with --verify)")
    else:
        out.line(f"integrity: {integrity} ({int(received.get('messages_verified') or 0)} "
                 "messages verified)")
    errors = sent.get("write_errors") or {}
    if errors:
        out.line("write errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(errors.items())))
    word = "bytes_sent" if result.role == "client" else "bytes_received"
    out.line("daemon planes: " + ", ".join(
        f"p{p['plane']} {p['state']} {fmt_bytes(p[word]).strip()} {word.split('_')[1]}"
        for p in planes))
    if result.error:
        out.line(f"error: {result.error}")


def _run_client(client: Client, opts: BenchOptions, out: _Out) -> int:
    before = client.status()
    peer = opts.server[0]
    out.line(f"Connecting to peer {peer} through the daemon {before.get('host')} "
             f"({opts.daemon})")
    progress = Progress(opts.interval, out.interval)
    out.line("[ ID] Interval           Transfer     Bitrate")
    result = run_writer(client, peer, msg_size=opts.msg_size,
                        total_bytes=opts.total_bytes, duration=opts.duration,
                        verify=opts.verify, wait=opts.connect_timeout + 10.0, progress=progress)
    report(out, result, progress, before, client.status())
    if result.write_errors:
        sys.stderr.write("mrc bench: some WRITEs completed with an error status\n")
        return 1
    if result.integrity() == "mismatch":
        sys.stderr.write("mrc bench: integrity check failed: received bytes did not match\n")
        return 1
    return 0


def _run_server(client: Client, opts: BenchOptions, out: _Out) -> int:
    client.bind(ENDPOINT)
    # The daemon pushes the immediates: a verified test's checks wait on the socket, not with
    # a request per arrival (docs/DAEMON.md, `subscribe`); a daemon without it is asked.
    try:
        client.subscribe(completions=False)
    except ClientError as exc:
        if exc.code != METHOD_NOT_FOUND:
            raise
    host = client.status().get("host")
    failures = 0
    while True:
        out.line("-" * 60)
        out.line(f"Server listening on endpoint {ENDPOINT!r} of the daemon {host} "
                 f"({opts.daemon})")
        out.line("-" * 60)
        request = client.recv_message(ENDPOINT, timeout=None)
        if request is None:
            continue
        before = client.status()
        progress = Progress(opts.interval, out.interval)
        out.line(f"Accepted a test from peer {request.peer}")
        try:
            result = serve_one(client, request, progress)
        except BenchFailed as exc:
            sys.stderr.write(f"mrc bench: {exc}\n")
            failures += 1
            if opts.one_off:
                return 1
            continue
        report(out, result, progress, before, client.status())
        bad = bool(result.error) or result.integrity() == "mismatch"
        failures += bad
        if opts.one_off:
            return 1 if bad else 0


def main(opts: BenchOptions) -> int:
    """`mrc bench -s|-c PEER --daemon SOCK`: serve tests, or run one, through the daemon."""
    assert opts.daemon is not None
    out = _Out(opts.json)
    try:
        with Client(opts.daemon, connect_timeout=opts.connect_timeout) as client:
            if opts.role == "server":
                return _run_server(client, opts, out)
            return _run_client(client, opts, out)
    except (ClientError, BenchFailed) as exc:
        sys.stderr.write(f"mrc bench: {exc}\n")
        return 1
