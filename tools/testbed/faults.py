"""The fault injector: link down/up, flaps, random loss, blackholes, rate limits, clear.

A fault targets a link by name (`h1-p0`, `t0r1p0-t1ap0`: both ends) or one end as
`node:iface` (`t0r1p0:h1`: that end only). What each does at an end:

- `link-down`/`link-up`: `ip link set dev IF down|up`; on up, the addresses and routes the
  kernel removed with the device are re-installed. Downing both ends (a link name) makes a
  host's sends on that plane fail at once with ENETUNREACH.
- `flap LINK --period MS --count N`: N cycles of down for MS/2 then up for MS/2, in the
  foreground; with `--background` a detached child does it and its pid is recorded, so
  `clear` or `down` stops it (N = 0 flaps until stopped). The link is left up at the end.
- `loss LINK PERCENT` / `blackhole LINK`: an nftables `netdev` table `mrc_testbed` with an
  ingress chain per interface, `numgen random mod 100 < P counter drop` or `counter drop`:
  packets arriving at that end are dropped, so a link name drops in both directions and the
  link stays up (no ENETUNREACH: a silent fault).
- `rate LINK RATE [--latency T]`: a `tbf` root qdisc on each end (egress), replacing any other;
  `latency` bounds its queue (default 50ms).
- `clear [LINK]`: stops flaps, removes the nft chains and tbf qdiscs (restoring the rate the
  topology gave the link), brings the interfaces up and re-installs their routes.

The records of active faults live in the testbed's state file (`build.State.faults`).

Link-down, loss and blackhole reach every end at once: one command per end is started first,
blocked on its script (`ArmedFault`, `runner.Armed`), and all are then handed their scripts
together, so the ends change within about a millisecond of each other rather than one tool
start-up (5–10 ms, more on a busy host) apart. `ARM` lets a caller arm a fault early and fire
it at the instant it measures from (tools/compare's failover runs).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from tools.testbed.build import TBF_LATENCY, State, kill_flap, restore_iface, tbf_line
from tools.testbed.model import Endpoint, Link, TestbedError
from tools.testbed.runner import Armed, Runner, ensure_tools
from tools.testbed.topology import parse_rate

NFT_TABLE = "mrc_testbed"
REPO_ROOT = Path(__file__).resolve().parents[2]


def target(state: State, spec: str) -> tuple[Link, list[Endpoint]]:
    """The link and the end(s) a fault names: a link name, or one end as `node:iface`."""
    links = state.topo.links
    if spec in links:
        link = links[spec]
        return link, [link.a, link.b]
    if spec.count(":") == 1:
        node, iface = spec.split(":")
        n = state.topo.nodes.get(node)
        if n is not None and iface in n.ifaces:
            link = links[n.ifaces[iface].link]
            return link, [Endpoint(node, iface)]
    example = next(iter(links), "h1-p0")
    raise TestbedError(
        f"unknown link '{spec}' in testbed {state.name} (e.g. {example}, or node:iface; "
        f"see status)"
    )


def _record(state: State, ends: list[Endpoint], key: str, value: Any) -> None:
    for end in ends:
        faults = state.faults.setdefault(str(end), {})
        if value is None:
            faults.pop(key, None)
        else:
            faults[key] = value
        if not faults:
            del state.faults[str(end)]


def _set_up(state: State, ends: list[Endpoint], runner: Runner) -> None:
    for end in ends:
        restore_iface(state, end.node, [end.iface], runner)


class ArmedFault:
    """A fault whose commands already run, one per end, each waiting for its script
    (`runner.Armed`): `fire` hands every end its script, so the ends fail within about a
    millisecond of each other, waits for them, records the fault and returns what the CLI
    prints. `cancel` ends it unfired. The CLI arms and fires at once; tools/compare arms
    before the instant it measures from, so starting the tools costs the transfer under
    test nothing at that instant."""

    def __init__(
        self, runner: Runner, tool: str, jobs: list[tuple[str, str]], done: Callable[[], str]
    ) -> None:
        self._done = done
        self._jobs: list[tuple[Armed, str]] = []
        try:
            for ns, script in jobs:
                armed = runner.armed_nft(ns) if tool == "nft" else runner.armed_batch(tool, ns)
                self._jobs.append((armed, script))
        except BaseException:
            self.cancel()
            raise

    def fire(self) -> str:
        try:
            for armed, script in self._jobs:
                armed.fire(script)
            for armed, _ in self._jobs:
                armed.wait()
        finally:
            self.cancel()
        return self._done()

    def cancel(self) -> None:
        for armed, _ in self._jobs:
            armed.cancel()


def _down_jobs(state: State, ends: list[Endpoint]) -> list[tuple[str, str]]:
    return [(state.ns(e.node), f"link set dev {e.iface} down\n") for e in ends]


def _set_down(state: State, ends: list[Endpoint], runner: Runner) -> None:
    ArmedFault(runner, "ip", _down_jobs(state, ends), str).fire()


def arm_link_down(state: State, spec: str, runner: Runner) -> ArmedFault:
    _, ends = target(state, spec)

    def done() -> str:
        _record(state, ends, "down", True)
        state.save()
        return f"{spec}: down ({', '.join(map(str, ends))})"

    return ArmedFault(runner, "ip", _down_jobs(state, ends), done)


def link_down(state: State, spec: str, runner: Runner) -> str:
    return arm_link_down(state, spec, runner).fire()


def link_up(state: State, spec: str, runner: Runner) -> str:
    _, ends = target(state, spec)
    _set_up(state, ends, runner)
    _record(state, ends, "down", None)
    state.save()
    return f"{spec}: up ({', '.join(map(str, ends))})"


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so a stopped flap still leaves its link up."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def flap(state: State, spec: str, period_ms: int, count: int, runner: Runner,
         background: bool = False) -> str:
    """Flap a link: `count` cycles (0: until stopped) of down for half the period, then up."""
    link, ends = target(state, spec)
    if period_ms < 2:
        raise TestbedError(f"--period {period_ms}: want at least 2 ms")
    if count < 0:
        raise TestbedError(f"--count {count}: want 0 (until stopped) or more")
    if background:
        old = state.flaps.get(link.name)
        if old:
            kill_flap(old)
        argv = [sys.executable, "-m", "tools.testbed", "fault", "--name", state.name, "flap",
                spec, "--period", str(period_ms), "--count", str(count)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH"))
                                            if p)
        runner.show("python " + " ".join(argv[1:]) + " &")
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True, cwd=str(REPO_ROOT))
        state.flaps[link.name] = child.pid
        state.save()
        return f"{spec}: flapping every {period_ms} ms in the background (pid {child.pid})"
    half = period_ms / 2000
    done = 0
    start = time.monotonic()  # changes follow a fixed schedule, whatever the commands cost

    def wait_until(t: float) -> None:
        time.sleep(max(0.0, start + t - time.monotonic()))

    with _terminate_as_interrupt():
        try:
            while count == 0 or done < count:
                wait_until(2 * half * done)
                _set_down(state, ends, runner)
                wait_until(2 * half * done + half)
                _set_up(state, ends, runner)
                done += 1
        except KeyboardInterrupt:
            _set_up(state, ends, runner)
    return f"{spec}: flapped {done} times (period {period_ms} ms), now up"


def _chain(iface: str) -> str:
    return "in_" + iface.replace("-", "_")


def _arm_drop(
    state: State, ends: list[Endpoint], rule: str, runner: Runner, done: Callable[[], str]
) -> ArmedFault:
    ensure_tools(["nft"], runner)
    jobs = []
    for end in ends:
        chain = _chain(end.iface)
        script = (
            f"add table netdev {NFT_TABLE}\n"
            f"add chain netdev {NFT_TABLE} {chain} {{ type filter hook ingress device "
            f"\"{end.iface}\" priority 0; policy accept; }}\n"
            f"flush chain netdev {NFT_TABLE} {chain}\n"
            f"add rule netdev {NFT_TABLE} {chain} {rule}\n"
        )
        jobs.append((state.ns(end.node), script))
    return ArmedFault(runner, "nft", jobs, done)


def loss(state: State, spec: str, percent: float, runner: Runner) -> str:
    _, ends = target(state, spec)
    if not 0 <= percent <= 100:
        raise TestbedError(f"loss {percent}: want a percentage 0 … 100")
    if percent >= 100:
        rule = "counter drop"  # numgen's value range stops at mod - 1
    elif percent == int(percent):
        rule = f"numgen random mod 100 < {int(percent)} counter drop"
    else:
        rule = f"numgen random mod 10000 < {round(percent * 100)} counter drop"

    def done() -> str:
        _record(state, ends, "blackhole", None)
        _record(state, ends, "loss", percent)
        state.save()
        return f"{spec}: {percent:g} % random loss arriving at {', '.join(map(str, ends))}"

    return _arm_drop(state, ends, rule, runner, done).fire()


def arm_blackhole(state: State, spec: str, runner: Runner) -> ArmedFault:
    _, ends = target(state, spec)

    def done() -> str:
        _record(state, ends, "loss", None)
        _record(state, ends, "blackhole", True)
        state.save()
        return f"{spec}: blackholed (everything arriving at {', '.join(map(str, ends))} dropped)"

    return _arm_drop(state, ends, "counter drop", runner, done)


def blackhole(state: State, spec: str, runner: Runner) -> str:
    return arm_blackhole(state, spec, runner).fire()


#: The faults a caller can arm ahead of time, by name (tools/compare's failover kinds).
ARM: dict[str, Callable[[State, str, Runner], ArmedFault]] = {
    "link-down": arm_link_down,
    "blackhole": arm_blackhole,
}


def rate(
    state: State, spec: str, value: str, runner: Runner, latency: str = TBF_LATENCY
) -> str:
    link, ends = target(state, spec)
    bits = parse_rate(value, "rate")
    if not re.fullmatch(r"\d+(\.\d+)?(us|ms|s)", latency):
        raise TestbedError(f"bad tbf latency {latency!r} (e.g. 5ms, 500us)")
    for end in ends:
        runner.batch("tc", [tbf_line(end.iface, bits, link.mtu, latency)], state.ns(end.node))
    _record(state, ends, "rate", bits)
    state.save()
    return (f"{spec}: rate limited to {value}, latency {latency} "
            f"(tbf on {', '.join(map(str, ends))})")


def clear(state: State, spec: str | None, runner: Runner) -> str:
    """Undo faults on one link (or end), or on the whole testbed."""
    if spec is None:
        ends = [e for lk in state.topo.links.values() for e in lk.ends]
        flaps = list(state.flaps)
    else:
        link, ends = target(state, spec)
        flaps = [link.name] if link.name in state.flaps else []
    for name in flaps:
        kill_flap(state.flaps.pop(name))
    by_node: dict[str, list[str]] = {}
    for end in ends:
        by_node.setdefault(end.node, []).append(end.iface)
    has_nft = shutil.which("nft") is not None
    for node, ifaces in by_node.items():
        ns = state.ns(node)
        if spec is None:
            script = f"add table netdev {NFT_TABLE}\ndelete table netdev {NFT_TABLE}\n"
        else:
            script = "".join(
                f"add table netdev {NFT_TABLE}\n"
                f"add chain netdev {NFT_TABLE} {_chain(i)} {{ type filter hook ingress device "
                f"\"{i}\" priority 0; policy accept; }}\n"
                f"delete chain netdev {NFT_TABLE} {_chain(i)}\n"
                for i in ifaces
            )
        if has_nft:
            runner.nft(ns, script, check=False)
        tc_lines = []
        for iface in ifaces:
            link = state.topo.links[state.topo.nodes[node].ifaces[iface].link]
            if link.rate:
                tc_lines.append(tbf_line(iface, link.rate, link.mtu))
            else:
                tc_lines.append(f"qdisc del dev {iface} root")
        runner.batch("tc", tc_lines, ns, force=True)
        restore_iface(state, node, ifaces, runner)
    for end in ends:
        state.faults.pop(str(end), None)
    state.save()
    return f"{spec}: faults cleared" if spec else "all faults cleared"
