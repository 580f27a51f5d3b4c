"""The values the client library hands to applications, and the checks of a WRITE's arguments.

Holds `RegionHandle` (what one application gives another: host, region, R_Key, VA, length;
serialisable), `Write` (one WRITE of a `write_many`), `Completion`, `Immediate` and `Message`,
their decoding from the daemon's answers (a malformed one is a `BAD_ANSWER`, never a KeyError),
and `write_params`: a WRITE checked on the client before it costs a round trip, with the same
limits the daemon applies (docs/DESIGN.md §2, docs/WIRE.md §4). Memory and sockets are
the business of `memory`, `sync` and `aio`.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from mrc.control import U64_MAX

from .rpc import BAD_ANSWER, INVALID_PARAMS, OUT_OF_BOUNDS, ClientError

__all__ = [
    "MAX_MESSAGE",
    "MAX_WRITE",
    "STATUSES",
    "Completion",
    "Immediate",
    "Message",
    "RegionHandle",
    "Write",
    "check_endpoint",
    "check_timeout",
    "write_params",
]

#: Largest WRITE (the daemon's limit, a RETH DMA length of 2^31).
MAX_WRITE = 1 << 31
#: Largest small message, decoded.
MAX_MESSAGE = 4096
STATUSES = ("ok", "remote_access_error", "connection_lost", "cancelled")
_U32 = (1 << 32) - 1


def _int(obj: dict[str, Any], key: str, lo: int, hi: int, what: str, code: int) -> int:
    value = obj.get(key)
    if type(value) is not int or not lo <= value <= hi:
        raise ClientError(code, f"{what}: {key} must be an integer {lo}..{hi}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RegionHandle:
    """A registered region as a peer application needs it to write there."""

    host: str
    region: int
    rkey: int
    va: int
    length: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "region": self.region,
            "rkey": self.rkey,
            "va": self.va,
            "length": self.length,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, obj: Any, code: int = INVALID_PARAMS) -> RegionHandle:
        """Check a handle from anywhere (a peer's message, a file); `code` says whose mistake
        a bad one is (INVALID_PARAMS for the caller's, BAD_ANSWER for the daemon's)."""
        if not isinstance(obj, dict):
            raise ClientError(code, f"region handle must be an object, got {type(obj).__name__}")
        host = obj.get("host")
        if not isinstance(host, str) or not host:
            raise ClientError(code, f"region handle: host must be a non-empty string, got {host!r}")
        what = "region handle"
        handle = cls(
            host=host,
            region=_int(obj, "region", 0, U64_MAX, what, code),
            rkey=_int(obj, "rkey", 0, _U32, what, code),
            va=_int(obj, "va", 0, U64_MAX, what, code),
            length=_int(obj, "length", 0, U64_MAX, what, code),
        )
        if handle.va + handle.length > 1 << 64:
            raise ClientError(code, "region handle: va + length overflows 64 bits")
        return handle

    @classmethod
    def from_json(cls, text: str | bytes) -> RegionHandle:
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise ClientError(INVALID_PARAMS, f"region handle is not JSON: {exc}") from None
        return cls.from_dict(obj)


@dataclass(frozen=True, slots=True)
class Write:
    """One WRITE of `Connection.write_many`: `length` bytes at `offset` of the local `region`
    to `remote_offset` of the peer's region, a WRITE_WITH_IMM when `imm` is set. `region` is
    the client's Region object (typed loosely so both client flavours share this)."""

    region: Any
    offset: int
    length: int
    remote: RegionHandle
    remote_offset: int = 0
    imm: int | None = None


def write_params(index: int, region_id: int, region_size: int, w: Write) -> dict[str, Any]:
    """The `write` RPC's entry for `w` (the index-th of its call) after the checks the daemon
    would make, so a bad WRITE fails here with the same code and one line naming it."""
    where = f"write {index}"
    for key in ("offset", "length", "remote_offset"):
        if type(getattr(w, key)) is not int:
            raise ClientError(INVALID_PARAMS, f"{where}: {key} must be an integer")
    if not isinstance(w.remote, RegionHandle):
        raise ClientError(INVALID_PARAMS, f"{where}: remote must be a RegionHandle")
    if not 1 <= w.length <= MAX_WRITE:
        raise ClientError(INVALID_PARAMS, f"{where}: length {w.length} outside 1..{MAX_WRITE}")
    if w.offset < 0 or w.offset + w.length > region_size:
        raise ClientError(
            OUT_OF_BOUNDS,
            f"{where}: local range {w.offset}+{w.length} outside the region's {region_size} bytes",
        )
    if w.remote_offset < 0 or w.remote_offset + w.length > w.remote.length:
        raise ClientError(
            OUT_OF_BOUNDS,
            f"{where}: remote range {w.remote_offset}+{w.length} outside the handle's "
            f"{w.remote.length} bytes",
        )
    # The packets carry VA + offset in 64 bits: a handle whose VA sits near the top would
    # wrap (a forged or corrupted handle; a real region never does).
    if w.remote.va + w.remote_offset + w.length > 1 << 64:
        raise ClientError(INVALID_PARAMS, f"{where}: remote VA range overflows 64 bits")
    entry: dict[str, Any] = {
        "region": region_id,
        "offset": w.offset,
        "length": w.length,
        "remote": w.remote.to_dict(),
        "remote_offset": w.remote_offset,
    }
    if w.imm is not None:
        if type(w.imm) is not int or not 0 <= w.imm <= _U32:
            raise ClientError(INVALID_PARAMS, f"{where}: imm {w.imm!r} outside 0..{_U32}")
        entry["imm"] = w.imm
    return entry


def check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if not isinstance(timeout, int | float) or not timeout >= 0 or timeout == float("inf"):
        raise ClientError(INVALID_PARAMS, f"timeout must be a finite number >= 0, got {timeout!r}")
    return float(timeout)


def check_endpoint(endpoint: str) -> str:
    if not isinstance(endpoint, str) or not endpoint or len(endpoint) > 64:
        raise ClientError(INVALID_PARAMS, f"endpoint must be a 1..64 character name: {endpoint!r}")
    return endpoint


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ClientError(BAD_ANSWER, f"{what}: expected an object, got {type(value).__name__}")
    return value


def answer_list(result: Any, key: str) -> list[dict[str, Any]]:
    """`result[key]` as a list of objects, or a BAD_ANSWER naming the key."""
    items = _obj(result, key).get(key)
    if not isinstance(items, list):
        raise ClientError(BAD_ANSWER, f"the daemon's answer lacks the list {key!r}")
    return [_obj(item, key) for item in items]


@dataclass(frozen=True, slots=True)
class Completion:
    """A WRITE's outcome, per connection in posting (MSN) order."""

    id: int
    connection: int
    status: str
    bytes: int

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def decode(cls, obj: dict[str, Any]) -> Completion:
        status = obj.get("status")
        if status not in STATUSES:
            raise ClientError(BAD_ANSWER, f"completion with unknown status {status!r}")
        what = "completion"
        return cls(
            id=_int(obj, "id", 0, U64_MAX, what, BAD_ANSWER),
            connection=_int(obj, "connection", 0, U64_MAX, what, BAD_ANSWER),
            status=str(status),
            bytes=_int(obj, "bytes", 0, U64_MAX, what, BAD_ANSWER),
        )


@dataclass(frozen=True, slots=True)
class Immediate:
    """The immediate of a WRITE_WITH_IMM that landed in one of this client's regions."""

    region: int
    imm: int
    peer: str
    connection: int

    @classmethod
    def decode(cls, obj: dict[str, Any]) -> Immediate:
        what = "immediate"
        return cls(
            region=_int(obj, "region", 0, U64_MAX, what, BAD_ANSWER),
            imm=_int(obj, "imm", 0, _U32, what, BAD_ANSWER),
            peer=str(obj.get("peer", "")),
            connection=_int(obj, "connection", 0, U64_MAX, what, BAD_ANSWER),
        )


@dataclass(frozen=True, slots=True)
class Message:
    """A small message an application on `peer` sent to an endpoint this client bound."""

    peer: str
    data: bytes

    @classmethod
    def decode(cls, obj: dict[str, Any]) -> Message:
        raw = obj.get("data")
        if not isinstance(raw, str):
            raise ClientError(BAD_ANSWER, "message without base64 data")
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise ClientError(BAD_ANSWER, "message data is not base64") from None
        return cls(peer=str(obj.get("peer", "")), data=data)


def encode_message(data: bytes) -> str:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ClientError(INVALID_PARAMS, f"message data must be bytes, got {type(data).__name__}")
    if len(data) > MAX_MESSAGE:
        raise ClientError(
            INVALID_PARAMS, f"message of {len(data)} bytes exceeds {MAX_MESSAGE} bytes"
        )
    return base64.b64encode(bytes(data)).decode("ascii")
