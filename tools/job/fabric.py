"""The job's clos testbed: bringing it up and down, its hosts, daemons, MPTCP and counters.

`Bed` is one running `clos` testbed (SRv6, or `--ecmp 1`) as the job uses it: its hosts'
namespaces and plane addresses (from `status -J`), the SRv6 path table, a daemon per host
(`daemons`, which tools/examples/allgather_testbed uses too: the host's planes, the
other hosts as peers, the path table on SRv6, `security = "none"`: the job measures the fabric,
not the handshake), the in-kernel MPTCP path manager set up in every host (one `signal`
endpoint per extra plane, so each connection gets one subflow per plane), and the bytes each
tier-1 switch forwarded (`tier1_bytes`: which switches a run's traffic crossed). For MPTCP each
announced address takes joins on the kernel's own listener (`JOIN_PORT`; the ranks listen on
their plane-0 address only) and TCP timestamps are off while it runs (an IPv6 ADD_ADDR with a
port does not fit beside them). Everything it
starts or changes it stops or undoes, on failure too.

What it leaves to others: the testbed itself (`tools.testbed`), the fault schedule and its
playing (`schedule`, `inject`), the ranks (`rank`, `runner`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mrc.client import Client, ClientError

from .schedule import Fabric

ROOT = Path(__file__).resolve().parent.parent.parent
#: The port MPTCP's announced addresses take joins on (the in-kernel path manager listens).
JOIN_PORT = 29400


class JobError(Exception):
    """Setting the job up failed; one line."""


def env() -> dict[str, str]:
    """The environment of every process the job starts (the repository on PYTHONPATH)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), e.get("PYTHONPATH", "")) if p)
    return e


def testbed(*args: str, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m tools.testbed ARGS`; with `check`, a non-zero exit is a `JobError`."""
    proc = subprocess.run([sys.executable, "-m", "tools.testbed", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env(), timeout=timeout, check=False)
    if check and proc.returncode:
        raise JobError(f"testbed {' '.join(args)}: {proc.stderr.strip() or proc.stdout}")
    return proc


class Bed:
    """A running clos testbed and what the job knows of it (`status -J`)."""

    def __init__(self, name: str, ecmp: int, doc: dict[str, Any], work: Path) -> None:
        self.name = name
        self.ecmp = ecmp
        self.work = work
        self.namespaces = {str(n["name"]): str(n["namespace"]) for n in doc["nodes"]}
        self.roles = {str(n["name"]): str(n["role"]) for n in doc["nodes"]}
        params = doc["topology"]["params"]
        self.planes = int(params.get("planes", 4))
        self.fabric = Fabric(self.planes, int(params.get("racks", 2)),
                             int(params.get("tier1", 2)), int(params.get("hosts", 4)))
        addrs: dict[str, dict[int, str]] = {}
        for node in doc["nodes"]:
            if node["role"] != "host":
                continue
            for iface in node["interfaces"]:
                for a in iface["addresses"]:
                    if ":" in a and iface["plane"] is not None:
                        addrs.setdefault(node["name"], {})[int(iface["plane"])] = a.split("/")[0]
        self.hosts = sorted((h for h, a in addrs.items() if len(a) == self.planes),
                            key=lambda h: int(h[1:]))
        self.addresses = {h: [addrs[h][p] for p in range(self.planes)] for h in self.hosts}
        self.paths: Path | None = None
        if not ecmp:
            self.paths = work / f"{name}.paths.json"
            testbed("paths", name, "-o", str(self.paths))

    @property
    def kind(self) -> str:
        return f"ecmp{self.ecmp}" if self.ecmp else "srv6"

    def ns(self, node: str) -> str:
        return self.namespaces[node]

    def in_ns(self, node: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node), *argv]

    # -- daemons ----------------------------------------------------------------------------

    def daemon_config(self, host: str, sock: Path) -> str:
        lines = [f'host = "{host}"', 'security = "none"']
        if self.paths is not None:
            lines.append(f'paths = "{self.paths}"')
        lines.append("")
        for addr in self.addresses[host]:
            lines += ["[[planes]]", f'address = "{addr}"', ""]
        for peer in self.hosts:
            if peer != host:
                quoted = ", ".join(f'"{a}"' for a in self.addresses[peer])
                lines += ["[[peers]]", f'name = "{peer}"', f"addresses = [{quoted}]", ""]
        lines += ["[control]", f'socket = "{sock}"', ""]
        return "\n".join(lines)

    def socket(self, host: str) -> Path:
        return self.work / f"{self.name}-{host}.sock"

    @contextlib.contextmanager
    def daemons(self, hosts: list[str], timeout: float = 30.0,
                exits: dict[str, int | None] | None = None) -> Iterator[dict[str, Path]]:
        """A daemon per host, answering on its socket; SIGTERM (then SIGKILL) at the end, after
        which `exits` (when given) holds each host's daemon exit status."""
        started: list[tuple[str, Path, subprocess.Popen[bytes], Path]] = []
        try:
            with processes() as procs:
                for host in hosts:
                    sock = self.socket(host)
                    conf = self.work / f"{self.name}-{host}.toml"
                    conf.write_text(self.daemon_config(host, sock))
                    log = self.work / f"{self.name}-{host}.daemon.log"
                    with log.open("wb") as fh:
                        proc = subprocess.Popen(
                            self.in_ns(host, sys.executable, "-m", "mrc", "daemon", "--config",
                                       str(conf)),
                            stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env())
                    procs.append(proc)
                    started.append((host, sock, proc, log))
                for host, sock, proc, log in started:
                    _wait_socket(host, sock, proc, log, timeout)
                yield {host: sock for host, sock, _, _ in started}
        finally:
            if exits is not None:
                exits.update({host: proc.returncode for host, _, proc, _ in started})

    def clear_faults(self) -> None:
        """Every fault of the testbed undone (links up, routes back)."""
        testbed("fault", "--name", self.name, "clear", check=False)

    # -- MPTCP -------------------------------------------------------------------------------

    def mptcp_setup(self) -> str | None:
        """One `signal` endpoint per extra plane in every host, limits to match; None when
        done, else why MPTCP cannot run (the kernel lacks it)."""
        for host in self.hosts:
            ns = self.ns(host)
            enabled = subprocess.run(self.in_ns(host, "sysctl", "-n", "net.mptcp.enabled"),
                                     capture_output=True, text=True, check=False)
            if enabled.returncode or enabled.stdout.strip() != "1":
                return "net.mptcp.enabled is not 1 (kernel without MPTCP)"
            extra = self.planes - 1
            # An IPv6 ADD_ADDR with a port (30 bytes) does not fit beside TCP timestamps in
            # the 40 bytes of options: the kernel drops it (MPTcpExtAddAddrTxDrop). MPTCP runs
            # go without timestamps; `mptcp_clear` puts them back.
            subprocess.run(self.in_ns(host, "sysctl", "-qw", "net.ipv4.tcp_timestamps=0"),
                           capture_output=True, check=False)
            lines = ["mptcp endpoint flush",
                     f"mptcp limits set subflows {max(extra, 1) * 2} add_addr_accepted "
                     f"{max(extra, 1) * 2}"]
            # A join must find a listener: the ranks listen on their plane-0 address only, so
            # each announced address gets the kernel's own listener on JOIN_PORT (joins are
            # matched to their connection by token, not by port).
            lines += [f"mptcp endpoint add {self.addresses[host][p]} dev p{p} port {JOIN_PORT} "
                      "signal" for p in range(1, self.planes)]
            proc = subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n",
                                  capture_output=True, text=True, check=False)
            if proc.returncode:
                return f"ip mptcp in {host}: {proc.stderr.strip().splitlines()[0]}"
        return None

    def mptcp_clear(self) -> None:
        for host in self.hosts:
            subprocess.run(["ip", "-n", self.ns(host), "mptcp", "endpoint", "flush"],
                           capture_output=True, check=False)
            subprocess.run(self.in_ns(host, "sysctl", "-qw", "net.ipv4.tcp_timestamps=1"),
                           capture_output=True, check=False)

    def established(self, host: str, port_from: int, port_to: int) -> dict[int, int]:
        """TCP connections (MPTCP subflows each count) of `host` with a local or remote port in
        [port_from, port_to] or `JOIN_PORT`, by the plane of their local address."""
        out = subprocess.run(self.in_ns(host, "ss", "-tnH", "state", "established"),
                             capture_output=True, text=True, check=False).stdout
        planes: dict[int, int] = {}
        for line in out.splitlines():
            words = line.split()
            if len(words) < 4:
                continue
            local, peer = words[-2], words[-1]
            ports = [int(x.rsplit(":", 1)[1]) for x in (local, peer) if ":" in x]
            if not any(port_from <= p <= port_to or p == JOIN_PORT for p in ports):
                continue
            addr = local.rsplit(":", 1)[0].strip("[]")
            for p, a in enumerate(self.addresses[host]):
                if a == addr:
                    planes[p] = planes.get(p, 0) + 1
        return planes

    # -- counters ----------------------------------------------------------------------------

    def tier1_bytes(self) -> dict[str, int]:
        """Bytes each tier-1 switch has received on all its interfaces so far."""
        out = {}
        for node, role in self.roles.items():
            if role != "tier1":
                continue
            proc = subprocess.run(["ip", "-n", self.ns(node), "-s", "-j", "link", "show"],
                                  capture_output=True, text=True, check=False)
            try:
                rows = json.loads(proc.stdout or "[]")
            except ValueError:
                rows = []
            out[node] = sum(int(r.get("stats64", {}).get("rx", {}).get("bytes", 0))
                            for r in rows if r.get("ifname") != "lo")
        return dict(sorted(out.items()))


def _wait_socket(host: str, sock: Path, proc: subprocess.Popen[bytes], log: Path,
                 timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise JobError(f"daemon on {host} exited {proc.returncode}: " + " | ".join(tail))
        with contextlib.suppress(ClientError), Client(str(sock), connect_timeout=1.0) as c:
            c.status()
            return
        time.sleep(0.1)
    raise JobError(f"daemon on {host} not answering at {sock} after {timeout:g} s")


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[Any]]]:
    """Processes started inside; SIGTERM (then SIGKILL) for any still running at the end."""
    procs: list[subprocess.Popen[Any]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@contextlib.contextmanager
def clos(name: str | None, ecmp: int, work: Path, hosts: int = 4) -> Iterator[Bed]:
    """The clos testbed `name` (already up), or a new one (`--ecmp ecmp`, `hosts` hosts)
    that is taken down at the end, whatever happened."""
    own = name is None
    name = name or f"job{secrets.token_hex(3)}"
    try:
        if own:
            args = ["up", "clos", "--name", name, "--hosts", str(hosts)]
            testbed(*args, *(["--ecmp", str(ecmp)] if ecmp else []))
        doc = json.loads(testbed("status", name, "-J").stdout)
        kind = doc["topology"]["kind"]
        if kind != "clos" or bool(doc["topology"]["params"].get("ecmp")) != bool(ecmp):
            raise JobError(f"testbed {name} is not a clos with ecmp={ecmp} ({kind}, "
                           f"{doc['topology']['params']})")
        yield Bed(name, ecmp, doc, work)
    finally:
        testbed("fault", "--name", name, "clear", check=False)
        if own:
            testbed("down", name, check=False)
