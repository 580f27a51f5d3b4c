"""Bringing testbeds up and down, and the state files that let `down --all` clean up.

Holds the state store (one JSON file per testbed in `MRC_TESTBED_STATE_DIR`, default
/run/mrc-testbed), `up` (namespaces, veth pairs, sysctls, addresses, routes, tbf rates),
`down`/`down_all` (also finds leftover namespaces by their prefix, `MRC_TESTBED_PREFIX`,
default `mrc-`), the live link states for `status`, and `restore_iface` which re-installs what
the kernel drops when an interface goes down. Namespaces are `<prefix><testbed>-<node>`; the
veth ends are created straight inside them, so the root namespace never holds one. Faults are
in `faults`; the topology model in `topology`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import time
from pathlib import Path
from typing import Any

from tools.testbed.model import Node, TestbedError, Topology
from tools.testbed.runner import Runner, ensure_tools

_TESTBED_RE = re.compile(r"^[A-Za-z0-9_]{1,24}$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,16}$")
TBF_LATENCY = "50ms"


def state_dir() -> Path:
    return Path(os.environ.get("MRC_TESTBED_STATE_DIR", "/run/mrc-testbed"))


def prefix() -> str:
    p = os.environ.get("MRC_TESTBED_PREFIX", "mrc-")
    if not _PREFIX_RE.match(p):
        raise TestbedError(f"MRC_TESTBED_PREFIX={p!r}: want 1-16 of A-Z a-z 0-9 _ . -")
    return p


def new_name() -> str:
    return f"tb{secrets.token_hex(3)}"


def check_name(name: str) -> str:
    if not _TESTBED_RE.match(name):
        raise TestbedError(f"bad testbed name {name!r}: want 1-24 of A-Z a-z 0-9 _")
    return name


def namespace(name: str, node: str) -> str:
    return f"{prefix()}{name}-{node}"


class State:
    """What the tool created for one testbed, as recorded in `<state dir>/<name>.json`."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.topo = Topology.from_dict(data["topology"])

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def namespaces(self) -> dict[str, str]:
        return dict(self.data["namespaces"])

    def ns(self, node: str) -> str:
        return self.namespaces[node]

    @property
    def faults(self) -> dict[str, dict[str, Any]]:
        """Per link end `node:iface`: {"down": True, "loss": 5, "blackhole": True, "rate": …}."""
        return self.data.setdefault("faults", {})  # type: ignore[no-any-return]

    @property
    def flaps(self) -> dict[str, int]:
        """Background flap processes: link name → pid."""
        return self.data.setdefault("flaps", {})  # type: ignore[no-any-return]

    def save(self) -> None:
        save_state(self.data)


def _state_path(name: str) -> Path:
    return state_dir() / f"{name}.json"


def save_state(data: dict[str, Any]) -> None:
    d = state_dir()
    try:
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
        # Its own temporary name: two `fault` commands on one testbed (one per link, run
        # together) each replaced the other's shared temporary file, and one failed (ENOENT).
        tmp = d / f".{data['name']}.{os.getpid()}.json.tmp"
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(_state_path(data["name"]))
    except OSError as e:
        raise TestbedError(f"cannot write the state file in {d}: {e.strerror}") from None


def load_state(name: str) -> State:
    path = _state_path(check_name(name))
    try:
        data = json.loads(path.read_text())
        return State(data)
    except FileNotFoundError:
        raise TestbedError(f"no testbed named '{name}' (see: list)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TestbedError(f"state file {path} is unreadable ({e}); use down {name}") from None


def names() -> list[str]:
    """Testbeds with a state file, sorted."""
    try:
        return sorted(p.stem for p in state_dir().glob("*.json"))
    except OSError:
        return []


def resolve(name: str | None) -> State:
    """The named testbed, or the only one when no name is given."""
    if name:
        return load_state(name)
    found = names()
    if not found:
        raise TestbedError("no testbed is up (python -m tools.testbed up TOPOLOGY)")
    if len(found) > 1:
        raise TestbedError(f"several testbeds are up ({', '.join(found)}): name one")
    return load_state(found[0])


def list_namespaces(runner: Runner) -> list[str]:
    out = runner.run(["ip", "netns", "list"], show=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _sysctls(node: Node, hash_policy: int = 0) -> list[tuple[str, str]]:
    """IPv6 forwarding and seg6 on `all`, `default` and every interface (the kernel takes the
    minimum of `all` and the interface for seg6), no DAD, addresses kept across link down, and
    routes over a carrier-down link skipped so a backup static route takes over."""
    settings = [("net.ipv6.conf.all.forwarding", "1"), ("net.ipv6.conf.default.forwarding", "1")]
    for dev in ["all", "default", "lo", *node.ifaces]:
        settings += [
            (f"net.ipv6.conf.{dev}.forwarding", "1"),
            (f"net.ipv6.conf.{dev}.seg6_enabled", "1"),
            (f"net.ipv6.conf.{dev}.accept_dad", "0"),
            (f"net.ipv6.conf.{dev}.keep_addr_on_down", "1"),
            (f"net.ipv6.conf.{dev}.ignore_routes_with_linkdown", "1"),
        ]
    if not node.is_host:
        settings.append(("net.ipv4.ip_forward", "1"))
        # ECMP routes hash on addresses, flow label and protocol (0), or on the 5-tuple (1):
        # the clos's ecmp modes 1 and 2.
        settings.append(("net.ipv6.fib_multipath_hash_policy", str(hash_policy)))
    return settings


def _addr_lines(node: Node, iface: str) -> list[str]:
    return [
        f"addr replace {a} dev {iface}" + (" nodad" if ":" in a else "")
        for a in node.ifaces[iface].addrs
    ]


def tbf_line(iface: str, bits: int, mtu: int, latency: str = TBF_LATENCY) -> str:
    """A tbf root qdisc limiting `iface` to `bits` bit/s (burst ≥ 2 ms of traffic, ≥ 4 MTUs),
    queueing at most `latency` worth of packets (tc's `latency`)."""
    burst = max(bits // 8 // 500, 4 * (mtu + 100), 32 * 1024)
    return f"qdisc replace dev {iface} root tbf rate {bits}bit burst {burst} latency {latency}"


def up(topo: Topology, name: str | None, runner: Runner) -> State:
    """Build `topo` as testbed `name` (random `tb<hex>` when None); roll back on failure."""
    ensure_tools(["ip", "tc"], runner)
    name = check_name(name) if name else new_name()
    pre = prefix()
    if _state_path(name).exists() or any(
        ns.startswith(f"{pre}{name}-") for ns in list_namespaces(runner)
    ):
        raise TestbedError(f"testbed '{name}' already exists (down {name} first)")
    nsmap = {node: namespace(name, node) for node in topo.nodes}
    data: dict[str, Any] = {
        "name": name,
        "prefix": pre,
        "state": "creating",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "namespaces": nsmap,
        "topology": topo.to_dict(),
        "faults": {},
        "flaps": {},
    }
    save_state(data)  # first, so a crash part-way through still leaves a record for down --all
    try:
        _build(topo, nsmap, runner)
    except BaseException as e:
        with contextlib.suppress(Exception):
            _remove(name, list(nsmap.values()), runner)
        if isinstance(e, KeyboardInterrupt):
            raise TestbedError("interrupted; nothing left behind", code=130) from None
        raise
    data["state"] = "up"
    save_state(data)
    return State(data)


def _build(topo: Topology, nsmap: dict[str, str], runner: Runner) -> None:
    runner.batch("ip", [f"netns add {ns}" for ns in nsmap.values()])
    veths = []
    for link in topo.links.values():
        a, b = link.a, link.b
        veths.append(
            f"link add name {a.iface} mtu {link.mtu} netns {nsmap[a.node]} type veth "
            f"peer name {b.iface} mtu {link.mtu} netns {nsmap[b.node]}"
        )
    runner.batch("ip", veths)
    for node in topo.nodes.values():
        runner.sysctl(nsmap[node.name], _sysctls(node, 1 if topo.params.get("ecmp") == 2 else 0))
    for node in topo.nodes.values():
        lines = ["link set dev lo up"] + [f"link set dev {i} up" for i in node.ifaces]
        for iface in node.ifaces:
            lines += _addr_lines(node, iface)
        lines += [r.ip_args() for r in node.routes]
        runner.batch("ip", lines, nsmap[node.name])
    for node in topo.nodes.values():
        tc_lines = []
        for end in node.ifaces.values():
            link = topo.links[end.link]
            if link.rate:
                tc_lines.append(tbf_line(end.name, link.rate, link.mtu))
        runner.batch("tc", tc_lines, nsmap[node.name])


def restore_iface(state: State, node_name: str, ifaces: list[str], runner: Runner) -> None:
    """Bring interfaces of one node up and re-install their addresses and the routes through
    them (IPv6 deletes a device's routes when it goes down)."""
    node = state.topo.nodes[node_name]
    lines = [f"link set dev {i} up" for i in ifaces]
    for iface in ifaces:
        lines += _addr_lines(node, iface)
    lines += [r.ip_args() for r in node.routes if r.dev in ifaces]
    runner.batch("ip", lines, state.ns(node_name), force=True)


def kill_flap(pid: int) -> None:
    """Stop a background flap started by this tool (checked by its command line)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if b"tools.testbed" in cmdline and b"flap" in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.01)


def _remove(name: str, namespaces: list[str], runner: Runner) -> int:
    """Delete the namespaces that exist (their veths, nft tables and qdiscs go with them),
    then the state file. Returns how many namespaces were deleted."""
    live = set(list_namespaces(runner))
    doomed = [ns for ns in namespaces if ns in live]
    runner.batch("ip", [f"netns del {ns}" for ns in doomed], force=True)
    left = [ns for ns in doomed if ns in set(list_namespaces(runner))]
    if left:
        raise TestbedError(f"could not delete namespaces: {' '.join(left)}")
    with contextlib.suppress(FileNotFoundError):
        _state_path(name).unlink()
    return len(doomed)


def down(name: str, runner: Runner) -> int:
    """Remove one testbed; works from the namespace prefix when its state file is broken."""
    check_name(name)
    pre = prefix()
    by_prefix = [ns for ns in list_namespaces(runner) if ns.startswith(f"{pre}{name}-")]
    try:
        state = load_state(name)
    except TestbedError:
        if not by_prefix and not _state_path(name).exists():
            raise
        return _remove(name, by_prefix, runner)
    for pid in state.flaps.values():
        kill_flap(pid)
    return _remove(name, sorted(set(state.namespaces.values()) | set(by_prefix)), runner)


def down_all(runner: Runner) -> dict[str, int]:
    """Remove every testbed with a state file and every leftover namespace with our prefix."""
    removed: dict[str, int] = {}
    for name in names():
        try:
            removed[name] = down(name, runner)
        except TestbedError:
            removed[name] = _remove(name, [], runner)
    pre = prefix()
    orphans: dict[str, list[str]] = {}
    for ns in list_namespaces(runner):
        if ns.startswith(pre):
            orphans.setdefault(ns[len(pre):].split("-", 1)[0], []).append(ns)
    for name, nss in orphans.items():
        removed[name] = removed.get(name, 0) + _remove(name, nss, runner)
    return removed


def link_states(state: State, runner: Runner) -> dict[str, dict[str, str]]:
    """Live operstate of every interface: node → iface → "UP" | "DOWN" | "LOWERLAYERDOWN" …;
    a namespace that is gone maps to {}."""
    out: dict[str, dict[str, str]] = {}
    for node, ns in state.namespaces.items():
        proc = runner.run(["ip", "-n", ns, "-j", "link", "show"], check=False, show=False)
        try:
            rows = json.loads(proc.stdout) if proc.returncode == 0 else []
        except ValueError:
            rows = []
        out[node] = {r["ifname"]: _operstate(r) for r in rows if r.get("ifname") != "lo"}
    return out


def _operstate(row: dict[str, Any]) -> str:
    if "UP" not in row.get("flags", []):
        return "DOWN"
    state = str(row.get("operstate", "UNKNOWN"))
    return "UP" if state in ("UP", "UNKNOWN") and "LOWER_UP" in row.get("flags", []) else state
