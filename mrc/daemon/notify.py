"""systemd's readiness protocol (sd_notify) in a few lines, without a dependency.

Holds `Notifier`: `READY=1` once the daemon serves, `STOPPING=1` when it starts to shut down,
`STATUS=…` lines, and `WATCHDOG=1` at half of `$WATCHDOG_USEC` when the service manager asked
for a watchdog. The messages are datagrams to the Unix socket named by `$NOTIFY_SOCKET`; a name
starting with '@' is in the abstract namespace. Without `$NOTIFY_SOCKET` every call does nothing.
Sending never fails loudly: a service manager that went away must not stop the daemon, so errors
are only counted. What to announce when is the daemon's (`daemon.py`) decision.
"""

from __future__ import annotations

import asyncio
import os
import socket

__all__ = ["Notifier"]


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if raw.startswith("@"):
            self.address = "\0" + raw[1:]
        elif raw.startswith("/"):
            self.address = raw
        self.errors = 0
        self.sent = 0
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID names the process the watchdog is for; another one's is not ours.
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 2e6
        self._watchdog: asyncio.TimerHandle | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *lines: str) -> bool:
        """Send `KEY=VALUE` lines as one datagram; True when it was sent."""
        if self.address is None:
            return False
        data = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(data, self.address)
        except OSError:
            self.errors += 1
            return False
        self.sent += 1
        return True

    def ready(self, status: str) -> None:
        self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self, status: str) -> None:
        self.stop_watchdog()
        self.notify("STOPPING=1", f"STATUS={status}")

    def start_watchdog(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send WATCHDOG=1 every half watchdog interval from now on (when one was asked for)."""
        if self.watchdog_interval is None or self.address is None:
            return
        interval = self.watchdog_interval

        def beat() -> None:
            self.notify("WATCHDOG=1")
            self._watchdog = loop.call_later(interval, beat)

        beat()

    def stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
