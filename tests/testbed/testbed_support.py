"""Helpers for the testbed tests: run `python -m tools.testbed`, bring a testbed up and always
down again, run the probe inside a namespace, read interface counters, and skip cleanly
without root or without a kernel feature (veth, seg6local, nftables netdev)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testbed_probe.py")

requires_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="testbed tests need root (network namespaces); CI runs as root"
)


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, e.get("PYTHONPATH", "")) if p)
    e.update(extra)
    return e


def unique(stem: str = "t") -> str:
    return f"{stem}{secrets.token_hex(3)}"


def tb(*args: str, extra_env: dict[str, str] | None = None, check: bool = True,
       timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m tools.testbed ARGS`; with `check`, fail the test on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, "-m", "tools.testbed", *args], capture_output=True, text=True,
        env=env(**(extra_env or {})), cwd=ROOT, timeout=timeout, check=False,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"testbed {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _try(*argv: str) -> bool:
    return subprocess.run(list(argv), capture_output=True).returncode == 0


@cache
def missing_feature() -> str | None:
    """Why the kernel or userland cannot run a testbed, or None when it can."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make sysdeps)"
    ns = unique("mrcfeat")
    if not _try("ip", "netns", "add", ns):
        return "cannot create network namespaces"
    try:
        if not _try("ip", "-n", ns, "link", "add", "fa", "type", "veth", "peer", "name", "fb"):
            return "kernel lacks veth"
        _try("ip", "-n", ns, "link", "set", "fa", "up")
        if not _try("ip", "-n", ns, "-6", "route", "add", "fc00::1/128", "encap", "seg6local",
                    "action", "End", "dev", "fa"):
            return "kernel lacks SRv6 seg6local (CONFIG_IPV6_SEG6_LWTUNNEL)"
        if not _try("ip", "netns", "exec", ns, "nft", "add table netdev t; add chain netdev t c "
                    "{ type filter hook ingress device fa priority 0; }; add rule netdev t c "
                    "numgen random mod 100 < 5 drop"):
            return "nftables lacks netdev ingress or numgen"
        if not _try("tc", "-n", ns, "qdisc", "add", "dev", "fa", "root", "tbf", "rate", "1mbit",
                    "burst", "32k", "latency", "50ms"):
            return "kernel lacks the tbf qdisc"
    finally:
        _try("ip", "netns", "del", ns)
    return None


def skip_without_features() -> None:
    reason = missing_feature()
    if reason:
        pytest.skip(f"testbed: {reason}")


@contextlib.contextmanager
def running_testbed(topology: str, *args: str, extra_env: dict[str, str] | None = None,
            name: str | None = None) -> Iterator[dict[str, Any]]:
    """Bring a testbed up, yield its `status -J` document, and always take it down."""
    name = name or unique()
    try:
        tb("up", topology, "--name", name, *args, extra_env=extra_env)
        yield status(name, extra_env)
    finally:
        tb("down", name, extra_env=extra_env, check=False)


def status(name: str, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    return json.loads(tb("status", name, "-J", extra_env=extra_env).stdout)  # type: ignore[no-any-return]


def ns_of(doc: dict[str, Any], node: str) -> str:
    return str(next(n["namespace"] for n in doc["nodes"] if n["name"] == node))


def addr_of(doc: dict[str, Any], node: str, plane: int, version: int = 6) -> str:
    """A node's address on a plane, without the prefix length."""
    for n in doc["nodes"]:
        if n["name"] == node:
            for i in n["interfaces"]:
                for a in i["addresses"]:
                    if i["plane"] == plane and (":" in a) == (version == 6):
                        return str(a.split("/")[0])
    raise KeyError((node, plane, version))


def probe(ns: str, *args: str, timeout: float = 20) -> Any:
    """Run testbed_probe.py inside `ns` and return its JSON answer."""
    proc = subprocess.run(["ip", "netns", "exec", ns, sys.executable, PROBE, *args],
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ping(ns: str, *addrs: str, count: int = 2, timeout: float = 1.0) -> dict[str, int]:
    return probe(ns, "ping", *addrs, "--count", str(count), "--timeout", str(timeout))  # type: ignore[no-any-return]


@contextlib.contextmanager
def receiver(ns: str, port: int, count: int, timeout: float = 2.0) -> Iterator[dict[str, Any]]:
    """A UDP receiver in `ns`; the yielded dict is filled with its answer on exit."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, PROBE, "recv", str(port), "--count",
         str(count), "--timeout", str(timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    result: dict[str, Any] = {}
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        yield result
        out, err = proc.communicate(timeout=timeout + 10)
        assert proc.returncode == 0, err
        result.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def tx_packets(ns: str, iface: str) -> int:
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", iface],
                         capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["packets"])


def nft_ruleset(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "ruleset"],
                          capture_output=True, text=True, check=True).stdout


def qdiscs(ns: str, iface: str) -> str:
    return subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", iface],
                          capture_output=True, text=True, check=True).stdout


# -- bench processes inside a testbed ----------------------------------------------------------


@dataclass
class BenchBed:
    """A running testbed as the bench tests use it: its `status -J` document, the environment
    of its private prefix and state directory, and its plane count."""

    doc: dict[str, Any]
    env: dict[str, str]
    planes: int = 4

    @property
    def name(self) -> str:
        return str(self.doc["name"])

    def tb(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return tb(*args, extra_env=self.env, check=check)

    def ns(self, node: str) -> str:
        return ns_of(self.doc, node)

    def addrs(self, node: str) -> str:
        return ",".join(addr_of(self.doc, node, p) for p in range(self.planes))

    def bench_argv(self, node: str, *args: str) -> list[str]:
        """`mrc bench ARGS` run inside `node`."""
        return [sys.executable, "-m", "tools.testbed", "exec", "--name", self.name, node, "--",
                sys.executable, "-m", "mrc", "bench", *args]  # fmt: skip

    def popen(self, argv: list[str]) -> subprocess.Popen[str]:
        """Start `argv` in its own process group (`stop` kills the whole group)."""
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env(**self.env), cwd=ROOT, start_new_session=True)  # fmt: skip

    def wait_bound(self, node: str, port: int, timeout: float = 10) -> None:
        """Until something in `node` listens on UDP `port` (its /proc/net/udp6)."""
        needle = f":{port:04X} "
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            table = subprocess.run(["ip", "netns", "exec", self.ns(node), "cat",
                                    "/proc/net/udp6"], capture_output=True, text=True).stdout
            if needle in table:
                return
            time.sleep(0.05)
        pytest.fail(f"bench server on {node} never bound port {port}")


def stop(proc: subprocess.Popen[str] | None) -> None:
    """Kill `proc`'s process group if it still runs, and reap it."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
