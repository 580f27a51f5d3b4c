"""JSON-RPC 2.0 as the control socket speaks it: error codes, requests, answers, parameters.

Holds the error codes (JSON-RPC's own and the daemon's from -32000 down, docs/DAEMON.md),
`RpcError`, `Request` and `parse_line` (one line of bytes → a request, a batch of them, or the
error to answer), `answer`/`failure` (the answer objects), `encode` (one answer line) and
`Params`, the checked reading of a request's by-name parameters: every bad parameter is an
INVALID_PARAMS error naming it. Sockets, fds and what a method does are `control`'s and
`service`'s.
"""

from __future__ import annotations

import json
import math
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
    "BAD_MEMORY",
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
    "TOO_MANY_OUTSTANDING",
    "UNKNOWN_CONNECTION",
    "UNKNOWN_PEER",
    "UNKNOWN_REGION",
    "Params",
    "Request",
    "RpcError",
    "answer",
    "encode",
    "failure",
    "parse_line",
]

#: Most requests in one batch (each gets an answer object in one line under MAX_LINE).
MAX_BATCH = 1024

_U64 = (1 << 64) - 1


class RpcError(Exception):
    """A request that fails: a JSON-RPC `code`, a one-line message, optional `data`."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        self.code = code
        self.message = " ".join(message.split())
        self.data = data
        super().__init__(self.message)


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    params: dict[str, Any]
    #: None for a notification (no answer); otherwise an int, a string or JSON null.
    id: Any
    notification: bool


def parse_line(line: bytes) -> tuple[list[Request | dict[str, Any]], bool] | dict[str, Any]:
    """One line → (items, is_batch), each item a `Request` or the error answer of a malformed
    one; or, for a line that is not JSON at all (or an empty batch), the one error answer."""
    try:
        doc = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return failure(None, RpcError(PARSE_ERROR, "the line is not UTF-8"))
    except ValueError as exc:
        return failure(None, RpcError(PARSE_ERROR, f"not JSON: {exc}"))
    except RecursionError:
        # json's C decoder recurses once per nesting level: a line nested deeper than the
        # interpreter's limit (100,000 `[`s fit well under MAX_LINE) ends up here.
        return failure(None, RpcError(PARSE_ERROR, "not JSON this server reads: nested too deep"))
    if isinstance(doc, list):
        if not doc:
            return failure(None, RpcError(INVALID_REQUEST, "an empty batch"))
        if len(doc) > MAX_BATCH:
            return failure(None, RpcError(INVALID_REQUEST, f"a batch of more than {MAX_BATCH}"))
        return [_request(item) for item in doc], True
    return [_request(doc)], False


def _request(doc: Any) -> Request | dict[str, Any]:
    if not isinstance(doc, dict):
        return failure(None, RpcError(INVALID_REQUEST, "a request must be a JSON object"))
    req_id = doc.get("id")
    if "id" in doc and not (req_id is None or type(req_id) in (int, str)):
        return failure(None, RpcError(INVALID_REQUEST, "id must be an integer, a string or null"))
    if doc.get("jsonrpc") != "2.0":
        return failure(req_id, RpcError(INVALID_REQUEST, 'jsonrpc must be "2.0"'))
    method = doc.get("method")
    if not isinstance(method, str) or not method:
        return failure(req_id, RpcError(INVALID_REQUEST, "method must be a non-empty string"))
    params = doc.get("params", {})
    if not isinstance(params, dict):
        return failure(
            req_id, RpcError(INVALID_PARAMS, f"{method}: params must be an object (by name)")
        )
    unknown = set(doc) - {"jsonrpc", "method", "params", "id"}
    if unknown:
        return failure(
            req_id, RpcError(INVALID_REQUEST, f"unknown member(s) {', '.join(sorted(unknown))}")
        )
    return Request(method, params, req_id, "id" not in doc)


def answer(req_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "result": result}


def notification(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A message the daemon sends unasked (to a client that subscribed): no id, no answer."""
    return {"jsonrpc": "2.0", "method": method, "params": params}


def failure(req_id: Any, err: RpcError) -> dict[str, Any]:
    error: dict[str, Any] = {"code": err.code, "message": err.message}
    if err.data is not None:
        error["data"] = err.data
    return {"jsonrpc": "2.0", "id": req_id, "error": error}


def encode(doc: Any) -> bytes:
    """One answer line; an answer too long for a line is replaced by an error saying so."""
    line = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    if len(line) > MAX_LINE:
        req_id = doc.get("id") if isinstance(doc, dict) else None
        err = RpcError(RESOURCE_LIMIT, f"the answer would exceed {MAX_LINE} bytes; ask for less")
        line = json.dumps(failure(req_id, err), separators=(",", ":")).encode() + b"\n"
        if len(line) > MAX_LINE:  # the id alone is too long (a request's 1 MiB, escaped)
            line = json.dumps(failure(None, err), separators=(",", ":")).encode() + b"\n"
    return line


class Params:
    """A request's parameters, read by name with checks; `done()` refuses unknown names."""

    def __init__(self, method: str, params: dict[str, Any]) -> None:
        self.method = method
        self._params = params
        self._read: set[str] = set()

    def _get(self, key: str) -> Any:
        self._read.add(key)
        return self._params.get(key)

    def bad(self, key: str, message: str, code: int = INVALID_PARAMS) -> RpcError:
        return RpcError(code, f"{self.method}: {key} {message}", {"key": key})

    def integer(self, key: str, lo: int = 0, hi: int = _U64, *, default: int | None = None) -> int:
        value = self._get(key)
        if value is None:
            if default is not None:
                return default
            raise self.bad(key, "is missing")
        if type(value) is not int or not lo <= value <= hi:
            raise self.bad(key, f"must be an integer {lo}..{hi}, got {_show(value)}")
        return value

    def opt_integer(self, key: str, lo: int = 0, hi: int = _U64) -> int | None:
        if self._params.get(key) is None:
            self._read.add(key)
            return None
        return self.integer(key, lo, hi)

    def text(self, key: str, *, max_len: int = 64, default: str | None = None) -> str:
        value = self._get(key)
        if value is None and default is not None:
            return default
        if value is None:
            raise self.bad(key, "is missing")
        if not isinstance(value, str) or not 1 <= len(value) <= max_len:
            raise self.bad(key, f"must be a string of 1..{max_len} characters")
        return value

    def opt_text(self, key: str, *, max_len: int = 64) -> str | None:
        if self._params.get(key) is None:
            self._read.add(key)
            return None
        return self.text(key, max_len=max_len)

    def seconds(self, key: str, *, hi: float = 60.0) -> float:
        """A timeout: 0 (the default) means answer at once."""
        value = self._get(key)
        if value is None:
            return 0.0
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise self.bad(key, f"must be a number of seconds >= 0, got {_show(value)}")
        return min(float(value), hi)

    def items(self, key: str, *, max_len: int) -> list[Any]:
        value = self._get(key)
        if not isinstance(value, list) or not 1 <= len(value) <= max_len:
            raise self.bad(key, f"must be a list of 1..{max_len} items")
        return value

    def raw(self, key: str) -> Any:
        return self._get(key)

    def done(self) -> None:
        unknown = set(self._params) - self._read
        if unknown:
            key = sorted(unknown)[0]
            raise self.bad(key, "is not a parameter of this method")


def _show(value: Any) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    except RecursionError:  # a value nested just under what the decoder took
        text = "[[[..." if isinstance(value, list) else '{"...'
    return text if len(text) <= 40 else text[:37] + "..."
