"""The `mrc bench` application protocol: CM private data, slots, the --verify pattern, results.

`mrc bench` runs on top of plain MRC WRITEs; this module holds everything both ends must agree on
and nothing that touches sockets, the loop or the terminal (`stream` runs a test, `report`
prints it; `writer` and `receiver` hold the rule each side follows).

Handshake (CM private data, at most 256 bytes, big-endian, version byte first):

- REQUEST (client → server), `BenchRequest`: version, flags (bit 0 reverse, bit 1 verify),
  the test kind (16 bits, version 2 only; version 1 leaves it 0), a random 64-bit cookie naming
  the test, the message size, the duration in ms (0 = by bytes),
  the byte count (0 = by time), the pattern seed, then two region references (base VA 64, R_Key
  32, length 32): the client's RESULTS inbox and, with -R, the client's DATA region; then up to 8
  injected faults (plane 8, at_ms 32) for the writer to apply (used with -R, where the server
  writes).
- REPLY (server → client), `BenchReply`: the request's version, status 0, the cookie, the
  server's RESULTS inbox and, without -R, the server's DATA region.

A DATA region is `slots` × message size (`slot_count`: enough for 4 windows, at least 2, at
most 256 MiB). Message n goes to slot n mod slots; the writer reuses a slot only after the
`WriteCompleted` of the message that used it, so it never has more than `slots` messages in
flight. With --verify, message n's bytes are `Pattern.offset(n)`.. of a seeded random stream (a
function of n AND of the position, so a packet placed at the wrong offset or a stale slot is
caught) and the message is a WRITE_WITH_IMM carrying n; the receiver checks the slot when
`ImmediateReceived(imm=n)` arrives. Without --verify messages are plain WRITEs.

End of test: the writer, once every message completed, WRITEs its own summary (4-byte length +
JSON) into the receiver's RESULTS inbox with imm `IMM_END`; the receiver answers with its summary
into the writer's inbox with imm `IMM_RESULTS`. With -R the client first sends `IMM_GO` (a tiny
WRITE into the server's inbox) so the server starts writing only once the client is connected.
Then the client closes.

Test kinds: version 1 knows only the stream test above, and a client still sends its stream
tests as version 1 so that older servers serve them. Version 2 names the kind: 0 stream, 1
latency. A server refuses (rejects the connection) a version or kind it does not know, so a
client asking an older server for a latency test gets one clear refusal, not a stream test.

Latency (`latency`): a WRITE_WITH_IMM ping-pong. The REQUEST carries the client's DATA
region (the server's echoes land there), the iteration count in the byte-count field (0 = by
time) and no flags; the REPLY the server's DATA region. The client writes message k (imm k)
into the server's region; the server, on `ImmediateReceived(imm=k)`, writes the same number of
bytes with imm k back. One message is in flight at a time, so one slot each way is enough.
When done the client sends one more message with imm `IMM_END`; the server answers it with its
summary (JSON: `echoes`, `cpu_seconds` since the first message) written into the client's
RESULTS inbox with imm `IMM_RESULTS` (an older server echoes it like any message), and the
client closes.
"""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
#: The first version that names a test kind.
VERSION_KINDS = 2
KIND_STREAM = 0
KIND_LATENCY = 1
KIND_NAMES = {KIND_STREAM: "stream", KIND_LATENCY: "latency"}
IMM_END = 0xFFFF_FFFF
IMM_RESULTS = 0xFFFF_FFFE
IMM_GO = 0xFFFF_FFFD
#: Message numbers stay below the reserved immediates.
MAX_MESSAGES = 0xFFFF_FF00
RESULTS_BYTES = 64 << 10
MAX_MESSAGE_SIZE = 256 << 20
MAX_REGION_BYTES = 256 << 20
MAX_INJECTS = 8

FLAG_REVERSE = 0x01
FLAG_VERIFY = 0x02

_REF = struct.Struct(">QII")
_REQ_HEAD = struct.Struct(">BBHQIIQI")
_REP_HEAD = struct.Struct(">BBHQ")
_INJECT = struct.Struct(">BI")
_LEN = struct.Struct(">I")


class BenchProtocolError(ValueError):
    """Private data or a summary that does not parse."""


@dataclass(frozen=True, slots=True)
class RegionRef:
    """A peer region as the handshake names it; `length` 0 = none."""

    va: int = 0
    rkey: int = 0
    length: int = 0

    def encode(self) -> bytes:
        return _REF.pack(self.va, self.rkey, self.length)

    @classmethod
    def decode(cls, data: bytes, offset: int) -> RegionRef:
        va, rkey, length = _REF.unpack_from(data, offset)
        return cls(va, rkey, length)

    def __bool__(self) -> bool:
        return self.length > 0


@dataclass(frozen=True, slots=True)
class BenchRequest:
    cookie: int
    msg_size: int
    duration: float = 0.0
    total_bytes: int = 0
    reverse: bool = False
    verify: bool = False
    seed: int = 0
    results: RegionRef = field(default_factory=RegionRef)
    data: RegionRef = field(default_factory=RegionRef)
    #: (plane, seconds after the test start) faults the writer's io applies.
    injects: tuple[tuple[int, float], ...] = ()
    kind: int = KIND_STREAM
    #: Latency tests: round trips to run (0 = for `duration`); travels in the byte-count field.
    iterations: int = 0

    @property
    def version(self) -> int:
        return VERSION if self.kind == KIND_STREAM else VERSION_KINDS

    def encode(self) -> bytes:
        flags = (FLAG_REVERSE if self.reverse else 0) | (FLAG_VERIFY if self.verify else 0)
        head = _REQ_HEAD.pack(
            self.version,
            flags,
            self.kind,
            self.cookie,
            self.msg_size,
            round(self.duration * 1000),
            self.iterations if self.kind == KIND_LATENCY else self.total_bytes,
            self.seed,
        )
        injects = self.injects[:MAX_INJECTS]
        tail = bytes([len(injects)]) + b"".join(
            _INJECT.pack(p, round(at * 1000)) for p, at in injects
        )
        return head + self.results.encode() + self.data.encode() + tail

    @classmethod
    def decode(cls, data: bytes) -> BenchRequest:
        need = _REQ_HEAD.size + 2 * _REF.size + 1
        if len(data) < need:
            raise BenchProtocolError(f"request private data too short ({len(data)} bytes)")
        version, flags, kind, cookie, msg_size, dur_ms, total, seed = _REQ_HEAD.unpack_from(data)
        if version not in (VERSION, VERSION_KINDS):
            raise BenchProtocolError(
                f"bench protocol version {version}, expected {VERSION} or {VERSION_KINDS}"
            )
        # Version 1 peers wrote 0 in the kind's place; whatever is there, it is a stream test.
        kind = kind if version == VERSION_KINDS else KIND_STREAM
        if kind not in KIND_NAMES:
            raise BenchProtocolError(f"unknown test kind {kind}")
        if flags & ~(FLAG_REVERSE | FLAG_VERIFY):
            raise BenchProtocolError(f"unknown flags {flags:#x}")
        off = _REQ_HEAD.size
        results = RegionRef.decode(data, off)
        data_ref = RegionRef.decode(data, off + _REF.size)
        off += 2 * _REF.size
        count = data[off]
        off += 1
        if count > MAX_INJECTS or len(data) != off + count * _INJECT.size:
            raise BenchProtocolError("bad fault list in request")
        injects = tuple(
            (p, ms / 1000)
            for p, ms in (_INJECT.unpack_from(data, off + i * 5) for i in range(count))
        )
        req = cls(
            cookie=cookie,
            msg_size=msg_size,
            duration=dur_ms / 1000,
            total_bytes=total if kind == KIND_STREAM else 0,
            iterations=total if kind == KIND_LATENCY else 0,
            reverse=bool(flags & FLAG_REVERSE),
            verify=bool(flags & FLAG_VERIFY),
            seed=seed,
            results=results,
            data=data_ref,
            injects=injects,
            kind=kind,
        )
        req.check()
        return req

    def check(self) -> None:
        if not 1 <= self.msg_size <= MAX_MESSAGE_SIZE:
            raise BenchProtocolError(f"message size {self.msg_size} out of range")
        if self.kind == KIND_LATENCY:
            self._check_latency()
            return
        if (self.duration > 0) == (self.total_bytes > 0):
            raise BenchProtocolError("exactly one of duration and byte count must be set")
        if self.results.length < 4:
            raise BenchProtocolError("no results region")
        if self.reverse and self.data.length < self.msg_size:
            raise BenchProtocolError("reverse test without a data region")
        if self.total_bytes and -(-self.total_bytes // self.msg_size) > MAX_MESSAGES:
            raise BenchProtocolError("too many messages")

    def _check_latency(self) -> None:
        if (self.duration > 0) == (self.iterations > 0):
            raise BenchProtocolError("exactly one of duration and iterations must be set")
        if self.iterations > MAX_MESSAGES:
            raise BenchProtocolError("too many iterations")
        if self.reverse or self.verify or self.injects or self.total_bytes:
            raise BenchProtocolError("a latency test takes no flags, faults or byte count")
        if self.data.length < self.msg_size:
            raise BenchProtocolError("latency test without a region for the echoes")
        if self.results.length < 4:
            raise BenchProtocolError("no results region")


@dataclass(frozen=True, slots=True)
class BenchReply:
    cookie: int
    results: RegionRef
    data: RegionRef = field(default_factory=RegionRef)
    #: The request's version, echoed (a version 1 client accepts only 1).
    version: int = VERSION

    def encode(self) -> bytes:
        head = _REP_HEAD.pack(self.version, 0, 0, self.cookie)
        return head + self.results.encode() + self.data.encode()

    @classmethod
    def decode(cls, data: bytes) -> BenchReply:
        if len(data) != _REP_HEAD.size + 2 * _REF.size:
            raise BenchProtocolError(f"reply private data of {len(data)} bytes")
        version, status, _, cookie = _REP_HEAD.unpack_from(data)
        if version not in (VERSION, VERSION_KINDS) or status != 0:
            raise BenchProtocolError(f"bench reply version {version} status {status}")
        results = RegionRef.decode(data, _REP_HEAD.size)
        data_ref = RegionRef.decode(data, _REP_HEAD.size + _REF.size)
        return cls(cookie, results, data_ref, version)


def slot_count(msg_size: int, payload_mtu: int, mpr: int) -> int:
    """Slots of a DATA region: 4 windows' worth and at least 2, within 256 MiB (1 slot if the
    message alone is that large)."""
    window = payload_mtu * mpr * 128
    want = max(2, -(-4 * window // msg_size))
    return max(1, min(want, MAX_REGION_BYTES // msg_size))


def message_length(n: int, msg_size: int, total_bytes: int) -> int:
    """Length of message n (the last one of a byte-count test may be short)."""
    if not total_bytes:
        return msg_size
    return max(0, min(msg_size, total_bytes - n * msg_size))


def message_count(msg_size: int, total_bytes: int) -> int | None:
    return -(-total_bytes // msg_size) if total_bytes else None


class Pattern:
    """The --verify byte stream: message n is `stream[offset(n) : offset(n) + length]`."""

    PERIOD = 1_000_003  # prime: offsets of distinct n (mod PERIOD) never coincide
    STRIDE = 7_919

    def __init__(self, seed: int, msg_size: int) -> None:
        self.stream = bytearray(random.Random(seed).randbytes(self.PERIOD + msg_size))
        self.msg_size = msg_size

    def offset(self, n: int) -> int:
        return (n * self.STRIDE) % self.PERIOD

    def expected(self, n: int, length: int) -> bytearray:
        off = self.offset(n)
        return self.stream[off : off + length]

    def matches(self, data: memoryview, n: int) -> bool:
        # One memcmp against the stream where it lies: copying both sides first (bytes(data)
        # and a slice of the stream) cost ~40x more, page faults of the fresh copies included.
        return self.stream.startswith(data, self.offset(n))


def encode_summary(summary: dict[str, Any], limit: int = RESULTS_BYTES) -> bytes:
    """Length-prefixed compact JSON; drops the event list if it would not fit in `limit`."""
    body = json.dumps(summary, separators=(",", ":"), sort_keys=True).encode()
    if _LEN.size + len(body) > limit and "events" in summary:
        trimmed = dict(summary, events=summary["events"][:20], events_truncated=True)
        body = json.dumps(trimmed, separators=(",", ":"), sort_keys=True).encode()
    if _LEN.size + len(body) > limit:
        body = json.dumps({"error": "summary too large"}).encode()
    return _LEN.pack(len(body)) + body


def decode_summary(view: memoryview) -> dict[str, Any]:
    if len(view) < _LEN.size:
        raise BenchProtocolError("results region too small")
    (n,) = _LEN.unpack_from(view)
    if n > len(view) - _LEN.size:
        raise BenchProtocolError("results length out of range")
    try:
        value = json.loads(bytes(view[_LEN.size : _LEN.size + n]))
    except ValueError as exc:
        raise BenchProtocolError(f"results are not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BenchProtocolError("results are not a JSON object")
    return value
