"""Child processes in a testbed namespace: start, wait with a deadline, CPU time, cleanup.

Every process the comparison runs is started as `ip netns exec NS ARGV…` (iproute2 execs the
command in place, so the pid we hold is the program's own) in a session of its own, with its
stdout and stderr in temporary files. `Proc.wait` reaps it with `os.wait4`, which hands back
the child's `rusage`: user + system CPU seconds of that process (and of any children it
reaped), over its whole life, start-up included. A process that outlives its deadline is
killed (SIGTERM, then SIGKILL to its process group) and `ProcError` says so in one line.
`kill_all` stops every process still running; the command calls it on the way out, whatever
the way out is.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import IO, Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIVE: list[Proc] = []


class ProcError(Exception):
    """A run failed: a one-line reason."""


class Proc:
    """One program running in a namespace."""

    def __init__(self, ns: str, argv: Sequence[str], name: str, *, pipe_stdout: bool = False,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self._out: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (lives with self)
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        full = ["ip", "netns", "exec", ns, *argv]
        stdout: Any = subprocess.PIPE if pipe_stdout else self._out
        child_env = dict(os.environ, PYTHONPATH=REPO_ROOT, **(env or {}))
        try:
            self.popen = subprocess.Popen(full, stdout=stdout, stderr=self._err,
                                          stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
                                          start_new_session=True, env=child_env)
        except OSError as e:
            raise ProcError(f"{name}: cannot start {argv[0]}: {e.strerror}") from None
        self.started = time.monotonic()
        self.cpu_seconds: float | None = None
        self.returncode: int | None = None
        self._lines = b""
        _LIVE.append(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """Reap the process if it has ended (recording its CPU time); its exit status or None."""
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.returncode = -1
            return self.returncode
        if pid == 0:
            return None
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        self.returncode = os.waitstatus_to_exitcode(status)
        self.popen.returncode = self.returncode
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)
        return self.returncode

    def wait(self, timeout: float) -> int:
        """Wait up to `timeout` seconds; kill it and raise `ProcError` if it is still running."""
        deadline = time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if time.monotonic() >= deadline:
                self.kill()
                raise ProcError(f"{self.name}: still running after {timeout:.0f} s (killed)")
            self._drain(delay)
            delay = min(delay * 2, 0.02)
        self._drain(0.0)
        assert self.returncode is not None
        return self.returncode

    def _drain(self, wait: float) -> None:
        """Sleep up to `wait` s, reading a piped stdout meanwhile (a full pipe blocks the child)."""
        out = self.popen.stdout
        if out is None:
            time.sleep(wait)
            return
        fd = out.fileno()
        end = time.monotonic() + wait
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                return
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                time.sleep(max(0.0, end - time.monotonic()))
                return
            self._lines += chunk

    def signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)

    def kill(self, grace: float = 1.0) -> None:
        """SIGTERM, then SIGKILL to the process group after `grace` seconds; reaps it."""
        if self.poll() is not None:
            return
        self.signal(signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and self.poll() is None:
            time.sleep(0.01)
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            end = time.monotonic() + 2.0
            while time.monotonic() < end and self.poll() is None:
                time.sleep(0.01)

    def readline(self, timeout: float) -> str | None:
        """One line of a piped stdout, or None after `timeout` seconds or at end of file."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._lines:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._lines += chunk
        line, _, self._lines = self._lines.partition(b"\n")
        return line.decode(errors="replace")

    def stdout(self) -> str:
        """Everything it wrote to stdout (what `readline` has not consumed, when piped)."""
        if self.popen.stdout is not None:
            if self.returncode is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._lines += self.popen.stdout.read()
            return self._lines.decode(errors="replace")
        self._out.seek(0)
        return self._out.read().decode(errors="replace")

    def stderr_tail(self) -> str:
        """The last non-empty line of its stderr (for one-line error messages)."""
        self._err.seek(0)
        lines = [ln.strip() for ln in self._err.read().decode(errors="replace").splitlines()]
        lines = [ln for ln in lines if ln]
        return lines[-1][:300] if lines else ""

    def json(self) -> dict[str, Any]:
        """Its stdout parsed as one JSON document (the last line that parses, for our tools)."""
        text = self.stdout().strip()
        try:
            doc = json.loads(text)
            if isinstance(doc, dict):
                return doc
        except ValueError:
            pass
        for line in reversed(text.splitlines()):
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    return doc
        why = self.stderr_tail() or f"exit status {self.returncode}, no JSON on stdout"
        raise ProcError(f"{self.name}: {why}")

    def check(self) -> None:
        """Raise `ProcError` with its last stderr line if it exited non-zero."""
        if self.returncode not in (0, None):
            why = self.stderr_tail() or "no error output"
            raise ProcError(f"{self.name}: exit status {self.returncode}: {why}")


def kill_all() -> None:
    """Stop every process still running (the command's cleanup path)."""
    for proc in list(_LIVE):
        proc.kill(grace=0.5)
    _LIVE.clear()


def run(ns: str | None, argv: Sequence[str], timeout: float = 20.0) -> str:
    """Run a short command (in namespace `ns` if given) and return its stdout; `ProcError`
    with its first error line when it fails or times out."""
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    try:
        proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ProcError(f"{argv[0]}: timed out after {timeout:.0f} s") from None
    except OSError as e:
        raise ProcError(f"{argv[0]}: {e.strerror}") from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise ProcError(f"{' '.join(argv[:5])}: {msg[0] if msg else proc.returncode}")
    return proc.stdout


def wait_listening(ns: str, port: int, udp: bool, timeout: float = 10.0,
                   proc: Proc | None = None) -> None:
    """Wait until something listens on `port` in `ns` (polls `ss`); `ProcError` otherwise."""
    deadline = time.monotonic() + timeout
    flags = "-Hlun" if udp else "-Hltn"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ProcError(f"{proc.name}: exited before listening: "
                            f"{proc.stderr_tail() or proc.returncode}")
        if run(ns, ["ss", flags, f"sport = :{port}"], timeout=5).strip():
            return
        time.sleep(0.05)
    raise ProcError(f"nothing listening on port {port} after {timeout:.0f} s")


def rx_counters(ns: str) -> dict[str, dict[str, int]]:
    """Per-interface byte and packet counters of a namespace (`ip -s -j link`)."""
    doc = json.loads(run(None, ["ip", "-n", ns, "-s", "-j", "link", "show"]))
    out: dict[str, dict[str, int]] = {}
    for link in doc:
        stats = link.get("stats64", {})
        out[link["ifname"]] = {"rx_bytes": int(stats.get("rx", {}).get("bytes", 0)),
                               "rx_packets": int(stats.get("rx", {}).get("packets", 0)),
                               "tx_bytes": int(stats.get("tx", {}).get("bytes", 0))}
    return out
