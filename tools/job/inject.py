"""Playing a fault schedule against a running testbed, on the job's clock, and recording it.

`Injector` runs in a thread of the runner: for each `FaultEvent` it arms the `ip` commands of
a `down` a little ahead (`tools.testbed.faults.ArmedFault`: every end of every link of the
event fails within about a millisecond) and fires them at `T0 + at`; an `up` brings the links
back with their addresses and routes (`faults.link_up`). Each played event is recorded with
its scheduled time and the times the change started and was done (seconds after T0), so the
plot and the JSON show when the fabric really changed. `stop()` ends it early; events not yet
played are left out. Clearing whatever is left down after the run is the runner's job
(`testbed fault clear`).

What it leaves to others: which events (`schedule`), the testbed's commands (`tools.testbed`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from tools.testbed import build, faults
from tools.testbed.model import TestbedError
from tools.testbed.runner import Runner

from .schedule import FaultEvent, Schedule

#: How long before its time a `down` is armed (the tools started and waiting for a script).
ARM_AHEAD = 0.3


class Injector:
    """Plays `schedule` on testbed `name` from monotonic time `t0`, in a thread."""

    def __init__(self, name: str, schedule: Schedule, t0: float) -> None:
        self.name = name
        self.schedule = schedule
        self.t0 = t0
        self.played: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-injector", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _wait(self, t: float) -> bool:
        """Sleep until T0 + t; False when stopped first."""
        return not self._stop.wait(max(0.0, self.t0 + t - time.monotonic()))

    def _run(self) -> None:
        if not self.schedule.events:
            return
        runner = Runner()
        try:
            state = build.resolve(self.name)
        except TestbedError as exc:
            self.played.append({"error": str(exc)})
            return
        for event in self.schedule.events:
            if self._stop.is_set():
                return
            self.played.append(self._play(state, runner, event))

    def _play(self, state: build.State, runner: Runner, event: FaultEvent) -> dict[str, Any]:
        rec: dict[str, Any] = event.to_json()
        try:
            if event.action == "down":
                if not self._wait(event.at - ARM_AHEAD):
                    return rec | {"error": "stopped before its time"}
                armed = [faults.arm_link_down(state, link, runner) for link in event.links]
                try:
                    if not self._wait(event.at):
                        return rec | {"error": "stopped before its time"}
                    rec["started"] = round(time.monotonic() - self.t0, 6)
                    for a in armed:  # a link's ends at once; the next link a few ms later
                        a.fire()
                finally:
                    for a in armed:
                        a.cancel()
            else:
                if not self._wait(event.at):
                    return rec | {"error": "stopped before its time"}
                rec["started"] = round(time.monotonic() - self.t0, 6)
                for link in event.links:
                    faults.link_up(state, link, runner)
        except TestbedError as exc:
            rec["error"] = str(exc)
        rec["done"] = round(time.monotonic() - self.t0, 6)
        return rec
