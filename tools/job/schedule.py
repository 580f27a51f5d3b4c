"""The fault schedules of the job, taken from the MRC paper and scaled to seconds.

A schedule is a list of `FaultEvent`s (a time in seconds after the job's first step, `down` or
`up`, the testbed links it acts on, a label) computed from the clos fabric's shape alone; the
injector (`inject`) plays it, the runner (`runner`) sizes the job to cover it. Pure: no clock,
no testbed, so the times are checked exactly by the unit tests.

- `none`: no fault (the baseline every other schedule is compared with).
- `flap`: the paper's tier-0 to tier-1 links flapping several times a minute, every second
  here: on each plane p the link `t0r<1 + p mod R>p<p>-t1ap<p>` goes down for `down` seconds of
  every `period`, the planes staggered by `period / P`. Plane 0's is `t0r1p0-t1ap0`, the
  tier-1 that plain IP on plane 0 crosses in the SRv6 fabric (lowest metric), so TCP meets it.
- `reboot`: tier-1 switches rebooted one after another: every link of the switch down for
  `hold` seconds (2), then `gap` seconds before the next; switches in the order t1ap0, t1bp0,
  t1ap1, t1bp1 … (`count` of them, 4 as in the paper).
- `host-link`: one host's plane link (`h2-p0`: a ring member on TCP's plane) down at `start`
  and never brought back during the run ("a NIC link lost").

What it leaves to others: running the events (`inject`), the fabric's names (`tools.testbed`).
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("none", "flap", "reboot", "host-link")


class ScheduleError(ValueError):
    """A schedule that cannot be built; one line."""


@dataclass(frozen=True)
class FaultEvent:
    """One change of the fabric: `links` go `action` ("down" or "up") at `at` seconds."""

    at: float
    action: str
    links: tuple[str, ...]
    label: str

    def to_json(self) -> dict[str, object]:
        return {"at": self.at, "action": self.action, "links": list(self.links),
                "label": self.label}


@dataclass(frozen=True)
class Fabric:
    """The clos shape a schedule is computed for (`up clos` parameters)."""

    planes: int = 4
    racks: int = 2
    tier1: int = 2
    hosts: int = 4

    def tier1_names(self) -> list[str]:
        """Tier-1 switches, plane by plane: t1ap0, t1bp0, t1ap1 …"""
        return [f"t1{chr(ord('a') + k)}p{p}" for p in range(self.planes)
                for k in range(self.tier1)]

    def switch_links(self, switch: str) -> tuple[str, ...]:
        """Every link of a tier-1 switch (one to each rack's tier-0 of its plane)."""
        plane = switch.split("p", 1)[1]
        return tuple(f"t0r{r}p{plane}-{switch}" for r in range(1, self.racks + 1))

    def flap_links(self) -> list[str]:
        """One tier-0 to tier-1 link per plane, alternating the racks."""
        return [f"t0r{1 + p % self.racks}p{p}-t1ap{p}" for p in range(self.planes)]


@dataclass(frozen=True)
class Schedule:
    """A named schedule: its events in time order and the time its faults are over (`span`;
    for `host-link`, the time the run must at least last with the link down)."""

    name: str
    events: tuple[FaultEvent, ...]
    span: float

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "span": self.span,
                "events": [e.to_json() for e in self.events]}


def _ordered(events: list[FaultEvent]) -> tuple[FaultEvent, ...]:
    # an "up" before a "down" at the same instant: a link never stays down by accident
    return tuple(sorted(events, key=lambda e: (e.at, e.action != "up", e.links)))


def flap(fabric: Fabric, start: float, duration: float, period: float = 1.0,
         down: float = 0.5) -> Schedule:
    """Each plane's flap link down for `down` s of every `period` s from `start` (staggered by
    `period / planes`), for `duration` s; every link ends up."""
    if not 0 < down < period:
        raise ScheduleError(f"flap: want 0 < down ({down:g} s) < period ({period:g} s)")
    links = fabric.flap_links()
    events: list[FaultEvent] = []
    for i, link in enumerate(links):
        k = 0
        while True:
            t = round(start + i * period / len(links) + k * period, 6)
            if t >= start + duration:
                break
            events.append(FaultEvent(t, "down", (link,), f"flap {link}"))
            events.append(FaultEvent(round(t + down, 6), "up", (link,), f"flap {link}"))
            k += 1
    span = max((e.at for e in events), default=start)
    return Schedule("flap", _ordered(events), span)


def reboot(fabric: Fabric, start: float, count: int = 4, hold: float = 2.0,
           gap: float = 0.5) -> Schedule:
    """`count` tier-1 switches, one after another: all links down for `hold` s, `gap` s apart."""
    switches = fabric.tier1_names()
    if not 1 <= count <= len(switches):
        raise ScheduleError(f"reboot: {count} switches asked, the fabric has {len(switches)}")
    if hold <= 0 or gap < 0:
        raise ScheduleError(f"reboot: want hold > 0 and gap >= 0 (got {hold:g}, {gap:g})")
    events: list[FaultEvent] = []
    for i, sw in enumerate(switches[:count]):
        t = round(start + i * (hold + gap), 6)
        links = fabric.switch_links(sw)
        events.append(FaultEvent(t, "down", links, f"reboot {sw}"))
        events.append(FaultEvent(round(t + hold, 6), "up", links, f"reboot {sw}"))
    return Schedule("reboot", _ordered(events), events[-1].at)


def host_link(fabric: Fabric, start: float, duration: float, link: str = "h2-p0") -> Schedule:
    """`link` (a host's plane link) down at `start` for the rest of the run (`duration` s at
    least); the runner's cleanup brings it back after the run."""
    host, _, plane = link.partition("-p")
    if (not host.startswith("h") or not host[1:].isdigit() or not plane.isdigit()
            or not 1 <= int(host[1:]) <= fabric.hosts or int(plane) >= fabric.planes):
        raise ScheduleError(f"host-link: {link!r} is not a host's plane link (h1-p0 … "
                            f"h{fabric.hosts}-p{fabric.planes - 1})")
    return Schedule("host-link", (FaultEvent(start, "down", (link,), f"{link} lost"),),
                    round(start + duration, 6))


def build(name: str, fabric: Fabric, start: float, duration: float, *, period: float = 1.0,
          down: float = 0.5, reboots: int = 4, hold: float = 2.0, gap: float = 0.5,
          link: str = "h2-p0") -> Schedule:
    """The schedule called `name` (one of `SCHEDULES`)."""
    if start < 0 or duration <= 0:
        raise ScheduleError(f"want start >= 0 and duration > 0 (got {start:g}, {duration:g})")
    if name == "none":
        return Schedule("none", (), 0.0)
    if name == "flap":
        return flap(fabric, start, duration, period, down)
    if name == "reboot":
        return reboot(fabric, start, reboots, hold, gap)
    if name == "host-link":
        return host_link(fabric, start, duration, link)
    raise ScheduleError(f"unknown schedule {name!r} (one of {', '.join(SCHEDULES)})")
