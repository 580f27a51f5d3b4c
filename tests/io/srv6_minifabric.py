"""A tiny kernel SRv6 fabric for io tests: host A, switches S1 and S2, host B, one plane.

```
        a1 ── S1 (SID fc00:1::) ── b1
  A  <                                >  B
        a2 ── S2 (SID fc00:2::) ── b2
```

Every node is a network namespace named with a random suffix; links are veth pairs (MTU 9000);
the hosts' plane addresses sit on `lo` (`fd00:a::1`, `fd00:b::1`) and are reached only through a
switch SID, so a packet without an SRH has no route. Switches forward IPv6 and run
`seg6local action End` on their SID; `seg6_enabled` is on for `all`, `default` and every
interface. Needs root and `ip`; `skip_reason()` says why it cannot run. This is the io tests'
own fixture; the full testbed tool lives in `tools/testbed`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
A_ADDR = "fd00:a::1"
B_ADDR = "fd00:b::1"
SID = {"S1": "fc00:1::", "S2": "fc00:2::"}
#: (node, iface, peer node, peer iface, node's link address, peer's link address)
LINKS = [
    ("A", "a1", "S1", "s1a", "fd00:11::1", "fd00:11::2"),
    ("A", "a2", "S2", "s2a", "fd00:12::1", "fd00:12::2"),
    ("B", "b1", "S1", "s1b", "fd00:21::1", "fd00:21::2"),
    ("B", "b2", "S2", "s2b", "fd00:22::1", "fd00:22::2"),
]


def skip_reason() -> str | None:
    """Why the fabric cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root to build network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    if not os.path.exists("/proc/sys/net/ipv6/conf/all/seg6_enabled"):
        return "kernel without SRv6 (no net.ipv6.conf.all.seg6_enabled)"
    return None


def run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=30)


def child_env() -> dict[str, str]:
    """The environment for a child `python -m mrc`: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return env


class MiniFabric:
    """Build with `up()`, always `down()` (idempotent; removes only our namespaces)."""

    def __init__(self) -> None:
        self.suffix = secrets.token_hex(3)
        self.ns = {n: f"mrc-io-{n.lower()}-{self.suffix}" for n in ("A", "S1", "S2", "B")}
        self.created: list[str] = []

    def ip(self, node: str, *args: str) -> None:
        run(["ip", "-n", self.ns[node], *args])

    def sysctl(self, node: str, *settings: str) -> None:
        run(["ip", "netns", "exec", self.ns[node], "sysctl", "-qw", *settings])

    def up(self) -> None:
        for name in self.ns.values():
            run(["ip", "netns", "add", name])
            self.created.append(name)
        for node in self.ns:
            self.ip(node, "link", "set", "lo", "up")
            self.sysctl(
                node,
                "net.ipv6.conf.all.forwarding=1",
                "net.ipv6.conf.all.seg6_enabled=1",
                "net.ipv6.conf.default.seg6_enabled=1",
                "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0",
                "net.ipv6.conf.lo.seg6_enabled=1",
            )
        for node, dev, peer, pdev, addr, paddr in LINKS:
            run(
                [
                    "ip", "link", "add", dev, "netns", self.ns[node], "mtu", "9000",
                    "type", "veth", "peer", "name", pdev, "netns", self.ns[peer], "mtu", "9000",
                ]
            )  # fmt: skip
            for n, d, a in ((node, dev, addr), (peer, pdev, paddr)):
                self.sysctl(n, f"net.ipv6.conf.{d}.seg6_enabled=1")
                self.ip(n, "addr", "add", f"{a}/64", "dev", d, "nodad")
                self.ip(n, "link", "set", d, "up")
        self.ip("A", "addr", "add", f"{A_ADDR}/128", "dev", "lo", "nodad")
        self.ip("B", "addr", "add", f"{B_ADDR}/128", "dev", "lo", "nodad")
        for sw, sid in SID.items():
            try:
                self.ip(sw, "-6", "route", "add", f"{sid}/128", "encap", "seg6local", "action",
                        "End", "dev", f"{sw.lower()}a")  # fmt: skip
            except subprocess.CalledProcessError as exc:
                raise RuntimeError(f"seg6local End unavailable: {exc.stderr.strip()}") from None
        # Hosts reach each switch SID over their own link to it; switches reach both hosts.
        self.ip("A", "-6", "route", "add", f"{SID['S1']}/128", "via", "fd00:11::2")
        self.ip("A", "-6", "route", "add", f"{SID['S2']}/128", "via", "fd00:12::2")
        self.ip("B", "-6", "route", "add", f"{SID['S1']}/128", "via", "fd00:21::2")
        self.ip("B", "-6", "route", "add", f"{SID['S2']}/128", "via", "fd00:22::2")
        for sw, a_link, b_link in (("S1", "fd00:11::1", "fd00:21::1"),
                                   ("S2", "fd00:12::1", "fd00:22::1")):  # fmt: skip
            self.ip(sw, "-6", "route", "add", f"{A_ADDR}/128", "via", a_link)
            self.ip(sw, "-6", "route", "add", f"{B_ADDR}/128", "via", b_link)

    def down(self) -> None:
        for name in reversed(self.created):
            run(["ip", "netns", "del", name], check=False)
        self.created.clear()

    def argv(self, node: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[node], *cmd]

    def tx_bytes(self, node: str, dev: str) -> int:
        out = run(["ip", "-n", self.ns[node], "-s", "-j", "link", "show", "dev", dev]).stdout
        stats: dict[str, Any] = json.loads(out)[0]["stats64"]
        return int(stats["tx"]["bytes"])

    def set_mtu(self, node: str, dev: str, mtu: int) -> None:
        self.ip(node, "link", "set", dev, "mtu", str(mtu))

    @staticmethod
    def path_table() -> dict[str, Any]:
        """Both directions between A and B on plane 0: one path through each switch."""
        paths = [
            {"name": "via-s1", "segments": [SID["S1"]]},
            {"name": "via-s2", "segments": [SID["S2"]]},
        ]
        return {
            "version": 1,
            "testbed": "io-minifabric",
            "entries": [
                {"src": A_ADDR, "dst": B_ADDR, "plane": 0, "src_node": "A", "dst_node": "B",
                 "paths": paths},
                {"src": B_ADDR, "dst": A_ADDR, "plane": 0, "src_node": "B", "dst_node": "A",
                 "paths": paths},
            ],
        }  # fmt: skip


#: Run in a switch namespace: after a "ready" line, print the length and first 256 bytes (hex) of
#: the first frames that LEAVE an interface carrying IPv6 with a routing header. (Egress, since
#: an ingress copy shares its bytes with the packet that `seg6local End` rewrites in place.)
CAPTURE = r"""
import select, socket, sys, time
dev, count, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL: egress too
s.bind((dev, 0))
print("ready", flush=True)
end = time.monotonic() + secs
got = 0
while got < count and time.monotonic() < end:
    if not select.select([s], [], [], 0.1)[0]:
        continue
    frame, addr = s.recvfrom(65535)
    if addr[2] == socket.PACKET_OUTGOING and frame[12:14] == b"\x86\xdd" and frame[20] == 43:
        print(len(frame), frame[:256].hex(), flush=True)
        got += 1
"""
