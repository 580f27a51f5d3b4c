"""The control protocol's framing and codec, shared by the blocking and the asyncio client.

The daemon's control socket speaks newline-delimited JSON-RPC 2.0 over a Unix stream socket
(docs/DESIGN.md §9): one JSON value per line, UTF-8, at most 1 MiB per line; errors carry
JSON-RPC codes, the transport's own from -32000 down. This module holds the error codes,
`ClientError`, the request encoder, `LineReader` (bytes → complete lines, bounded) and the
response decoder. It touches no socket: `sync` and `aio` move the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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

__all__ = [
    "BAD_ANSWER",
    "BAD_MEMORY",
    "CLOSED",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_LINE",
    "METHOD_NOT_FOUND",
    "NOT_CONNECTED",
    "OUT_OF_BOUNDS",
    "PARSE_ERROR",
    "PERMISSION_DENIED",
    "RESOURCE_LIMIT",
    "SHUTTING_DOWN",
    "TIMEOUT",
    "TOO_MANY_OUTSTANDING",
    "UNKNOWN_CONNECTION",
    "UNKNOWN_PEER",
    "UNKNOWN_REGION",
    "UNREACHABLE",
    "ClientError",
    "LineReader",
    "Notification",
    "Response",
    "decode_message",
    "decode_response",
    "decode_responses",
    "encode_batch",
    "encode_request",
]

# Raised by the client itself, never sent by a daemon: kept apart from the daemon's range so a
# caller can tell "the daemon refused" from "the daemon could not be asked".
UNREACHABLE = -32090
CLOSED = -32091
BAD_ANSWER = -32092
TIMEOUT = -32093

_NAMES = {
    PARSE_ERROR: "parse error",
    INVALID_REQUEST: "invalid request",
    METHOD_NOT_FOUND: "unknown method",
    INVALID_PARAMS: "invalid params",
    INTERNAL_ERROR: "internal error",
    UNKNOWN_PEER: "unknown peer",
    UNKNOWN_REGION: "unknown region",
    UNKNOWN_CONNECTION: "unknown connection",
    BAD_MEMORY: "bad memory",
    OUT_OF_BOUNDS: "out of bounds",
    TOO_MANY_OUTSTANDING: "too many outstanding writes",
    NOT_CONNECTED: "not connected",
    SHUTTING_DOWN: "shutting down",
    RESOURCE_LIMIT: "resource limit",
    PERMISSION_DENIED: "permission denied",
    UNREACHABLE: "daemon unreachable",
    CLOSED: "connection to the daemon closed",
    BAD_ANSWER: "bad answer from the daemon",
    TIMEOUT: "timed out",
}


class ClientError(Exception):
    """A refused or failed control request: `code` (JSON-RPC), a one-line `message`, and the
    error's `data` object when the daemon sent one."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code = code
        # One line whatever the daemon sent: callers print it as is.
        self.message = " ".join(str(message).split()) or _NAMES.get(code, "error")
        self.data = data
        super().__init__(code, self.message)

    @property
    def name(self) -> str:
        """The code's short name ("unknown peer", "out of bounds", …)."""
        return _NAMES.get(self.code, f"error {self.code}")

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"ClientError({self.code}, {self.message!r})"


def _request(method: str, params: Mapping[str, Any], req_id: int | None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": dict(params)}
    if req_id is not None:
        msg["id"] = req_id
    return msg


def _line(doc: Any, what: str) -> bytes:
    try:
        line = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    except (TypeError, ValueError) as exc:
        raise ClientError(INVALID_PARAMS, f"{what}: params are not JSON: {exc}") from None
    if len(line) > MAX_LINE:
        raise ClientError(
            INVALID_PARAMS, f"{what}: request of {len(line)} bytes exceeds {MAX_LINE}"
        )
    return line


def encode_request(method: str, params: Mapping[str, Any], req_id: int | None) -> bytes:
    """One request line (a notification when `req_id` is None); refuses a line over MAX_LINE
    here, with the method named, rather than letting the daemon cut the connection short."""
    return _line(_request(method, params, req_id), method)


def encode_batch(requests: Sequence[tuple[str, Mapping[str, Any], int]]) -> bytes:
    """One line holding a JSON-RPC batch of (method, params, id) requests, answered by the
    daemon with one line holding an array of their answers."""
    if not requests:
        raise ClientError(INVALID_PARAMS, "an empty batch")
    what = "batch of " + ", ".join(dict.fromkeys(m for m, _, _ in requests))
    return _line([_request(m, p, i) for m, p, i in requests], what)


class LineReader:
    """Splits a byte stream into lines; a line longer than MAX_LINE is a `BAD_ANSWER`."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        lines: list[bytes] = []
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end < 0:
                break
            lines.append(bytes(self._buf[start:end]))
            start = end + 1
        if start:
            del self._buf[:start]
        if len(self._buf) > MAX_LINE:
            raise ClientError(BAD_ANSWER, f"the daemon sent a line over {MAX_LINE} bytes")
        return [line for line in lines if line.strip()]

    @property
    def pending(self) -> int:
        return len(self._buf)


@dataclass(frozen=True, slots=True)
class Response:
    """One decoded answer: `id` (None when the daemon could not tell which request failed),
    and either `result` or `error`."""

    id: int | None
    result: Any = None
    error: ClientError | None = None

    def value(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


@dataclass(frozen=True, slots=True)
class Notification:
    """A message the daemon sent unasked, to a client that subscribed (docs/DAEMON.md): its
    `method` and `params`; it answers no request."""

    method: str
    params: dict[str, Any]


def _load(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise ClientError(BAD_ANSWER, f"the daemon sent a line that is not JSON: {exc}") from None
    except RecursionError:
        raise ClientError(BAD_ANSWER, "the daemon sent a line nested too deep to read") from None


def decode_response(line: bytes) -> Response:
    """Decode one answer line; anything that is not a JSON-RPC 2.0 response is a BAD_ANSWER."""
    return _response(_load(line))


def decode_responses(line: bytes) -> list[Response]:
    """Decode one answer line, a single answer or the array answering a batch."""
    return _responses(_load(line))


def decode_message(line: bytes) -> list[Response] | Notification:
    """Decode one line of a client that may have subscribed: a notification, or an answer
    line as `decode_responses` reads it."""
    msg = _load(line)
    if isinstance(msg, dict) and "method" in msg and "id" not in msg:
        method, params = msg["method"], msg.get("params")
        if msg.get("jsonrpc") != "2.0" or not isinstance(method, str) or type(params) is not dict:
            raise ClientError(BAD_ANSWER, "the daemon sent a malformed notification")
        return Notification(method, params)
    return _responses(msg)


def _responses(msg: Any) -> list[Response]:
    if isinstance(msg, list):
        if not msg:
            raise ClientError(BAD_ANSWER, "the daemon answered with an empty array")
        return [_response(m) for m in msg]
    return [_response(msg)]


def _response(msg: Any) -> Response:
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        raise ClientError(BAD_ANSWER, "the daemon sent something that is not a JSON-RPC answer")
    req_id = msg.get("id")
    if req_id is not None and (type(req_id) is not int):
        raise ClientError(BAD_ANSWER, f"the daemon answered with an id of type {type(req_id)}")
    if "error" in msg:
        err = msg["error"]
        if not isinstance(err, dict) or type(err.get("code")) is not int:
            raise ClientError(BAD_ANSWER, "the daemon sent a malformed error object")
        return Response(req_id, error=ClientError(err["code"], err.get("message", ""),
                                                  err.get("data")))
    if "result" not in msg:
        raise ClientError(BAD_ANSWER, "the daemon's answer has neither result nor error")
    return Response(req_id, result=msg["result"])
