"""`mrc bench --trace FILE`: one test's transport trace as JSON Lines (docs/DESIGN.md §10).

Holds `TraceFile` (the file, opened before connecting so a bad path fails at once; a server
rewrites it for each test it traces, one test at a time) and `TraceWriter` (one test: the
header at the test's t0, then every `cc_sample_seconds` a sample of the collector and its
records, flushed to disk every `FLUSH_SECONDS`, and the `end` line last). What is recorded, the
rate limit and the timeline bound are the collector's (mrc/core/trace.py); when the test starts
and ends is `stream`'s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from mrc.core.session import Session
from mrc.core.trace import TraceCollector, record_json

__all__ = ["TraceFile", "TraceFileError", "TraceWriter", "start_trace"]

FORMAT = "mrc-trace"
VERSION = 1
#: The file is flushed this often while a test runs (and at its end).
FLUSH_SECONDS = 0.05


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


class TraceFileError(Exception):
    """The --trace file cannot be opened: one line, exit status 1."""


class TraceFile:
    """The `--trace` file of this run; `role` ("client" or "server") goes in its headers."""

    def __init__(self, path: str, role: str) -> None:
        self.path = path
        self.role = role
        try:
            self._file: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 (kept open)
        except OSError as exc:
            raise TraceFileError(f"--trace {path}: {exc.strerror or exc}") from None
        self.busy = False

    def claim(self) -> IO[str] | None:
        """The file, emptied, for one test; None while another test writes it."""
        if self.busy or self._file.closed:
            return None
        self.busy = True
        self._file.seek(0)
        self._file.truncate()
        return self._file

    def release(self) -> None:
        self.busy = False

    def close(self) -> None:
        self._file.close()


def start_trace(
    trace_file: TraceFile | None,
    collector: TraceCollector,
    session: Session,
    *,
    t0: float,
    clock: Callable[[], float],
    loop: asyncio.AbstractEventLoop,
) -> TraceWriter | None:
    """A writer for a test starting at `t0`, if there is a --trace file and it is free."""
    out = trace_file.claim() if trace_file is not None else None
    if trace_file is None or out is None:
        return None
    return TraceWriter(trace_file, out, collector, session, t0=t0, clock=clock, loop=loop)


class TraceWriter:
    """Writes one test's trace into a claimed `TraceFile` while the test runs."""

    def __init__(
        self,
        trace_file: TraceFile,
        out: IO[str],
        collector: TraceCollector,
        session: Session,
        *,
        t0: float,
        clock: Callable[[], float],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.trace_file = trace_file
        self.out = out
        self.collector = collector
        self.session = session
        self.t0 = t0
        self.clock = clock
        self.loop = loop
        self.lines = 0
        #: Closed, or stopped by a write error: nothing more goes to the file.
        self.done = False
        self._flushed_at = t0
        self._handle: asyncio.TimerHandle | None = None
        header = {
            "format": FORMAT,
            "version": VERSION,
            "role": trace_file.role,
            "qpn": session.qpn,
            "peer_qpn": session.peer_qpn,
            "planes": sorted(session.paths.planes),
            "ev_per_plane": session.config.ev_per_plane,
            "start_unix": round(time.time() - (clock() - t0), 6),
            "limits": {
                "records_per_second": collector.records_per_second,
                "cc_sample_seconds": collector.cc_sample_seconds,
            },
        }
        if self._write([header]):
            self._schedule()

    def _schedule(self) -> None:
        # On the grid of t0: a late tick does not push every later sample back.
        step = self.collector.cc_sample_seconds
        delay = step - (self.clock() - self.t0) % step
        self._handle = self.loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        now = self.clock()
        if self._drain(now) and self._flush(now, FLUSH_SECONDS):
            self._schedule()

    def close(self, now: float) -> None:
        """The test is over: the last sample, its records, the `end` line; the file is free
        for the next test."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self.done:
            return
        if self._drain(now):
            total = self.collector.suppressed_total
            if self._write([{"t": 0.0, "kind": "end", "records": 0, "suppressed": total}]):
                self._flush(now, 0.0)
        self.done = True
        self.trace_file.release()

    def _drain(self, now: float) -> bool:
        if self.session.trace is self.collector:
            self.session.sample_trace(now)  # the session pushes its cc and drop samples
        else:
            self.collector.sample(now)
        return self._write([record_json(r, self.t0) for r in self.collector.records()])

    def _write(self, objs: list[dict[str, Any]]) -> bool:
        if objs and objs[-1].get("kind") == "end":
            # The end line counts every line written, itself and the header included.
            objs[-1]["t"] = round(max(0.0, self.clock() - self.t0), 6)
            objs[-1]["records"] = self.lines + len(objs)
        try:
            self.out.write("".join(_line(o) for o in objs))
        except OSError as exc:
            return self._failed(exc)
        self.lines += len(objs)
        return True

    def _flush(self, now: float, every: float) -> bool:
        if now - self._flushed_at < every:
            return True
        self._flushed_at = now
        try:
            self.out.flush()
        except OSError as exc:
            return self._failed(exc)
        return True

    def _failed(self, exc: OSError) -> bool:
        """A full disk or a vanished file: say so once and stop tracing; the test goes on."""
        sys.stderr.write(f"mrc bench: --trace {self.trace_file.path}: {exc.strerror or exc}\n")
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.done = True
        self.trace_file.release()
        return False
