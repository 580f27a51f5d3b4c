"""Starting a ring: daemons on loopback planes or on the testbed's hosts, and a rank on each.

`loopback_daemons(world, workdir)` starts `world` `mrc daemon` processes on this machine, each
with its own plane addresses on the loopback network (127.A.i.1, 127.A.i.2 for daemon i, A
picked at random so runs side by side do not meet), one UDP port free on all of them, a
throw-away X25519 key per daemon (`security = "encrypt"` unless asked otherwise) and every
other daemon as a peer; it waits until each answers on its control socket and stops them all
(SIGTERM, then SIGKILL) when the context ends, whatever happened. `testbed_daemons(name,
workdir)` does the same on the hosts of a running `tools.testbed` (one daemon in each host's
namespace, through `python -m tools.testbed exec HOST -- ...`, with the testbed's SRv6 path
table, `tools.testbed paths`, unless given one). Both yield `DaemonSpec`s: host name,
control socket, and the command prefix that runs a program where that daemon is.

`rank_command` is the command line of one `mrc.collective.rank` process and `run_ranks` starts
one per rank and gathers their JSON lines (every process killed at the deadline or on an
error). `mrc collective-bench` and the job tool (tools/job) use these; the ranks themselves are
`rank`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from mrc.client import Client, ClientError
from mrc.node.keys import create_private_key, public_key_text

from .comm import CollectiveError

__all__ = [
    "DaemonSpec",
    "loopback_daemons",
    "rank_command",
    "run_ranks",
    "testbed_daemons",
]

ROOT = Path(__file__).resolve().parents[2]
#: Planes of each loopback daemon.
LOOPBACK_PLANES = 2


@dataclass
class DaemonSpec:
    """One daemon of a ring: its host name, its control socket, and the command prefix that
    runs a program next to it (empty on this machine, `testbed exec HOST --` on a testbed)."""

    host: str
    socket: str
    prefix: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None


def environ() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("NOTIFY_SOCKET", None)
    env.pop("WATCHDOG_USEC", None)
    return env


def _free_port(addresses: Sequence[str]) -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((addresses[0], 0))
            port = int(probe.getsockname()[1])
        ok = True
        for addr in addresses[1:]:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    s.bind((addr, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise CollectiveError("no UDP port free on every loopback plane address")


def _config(host: str, planes: list[str], port: int, sock: Path, key: Path | None,
            peers: dict[str, tuple[list[str], str | None]], paths: str | None = None) -> str:
    lines = [f'host = "{host}"', f"port = {port}"]
    if key is None:
        lines.append('security = "none"')
    else:
        lines += ['security = "encrypt"', f'key_file = "{key}"']
    if paths:
        lines.append(f'paths = "{paths}"')
    for addr in planes:
        lines += ["[[planes]]", f'address = "{addr}"']
    for name, (addrs, pub) in peers.items():
        lines += ["[[peers]]", f'name = "{name}"', f"addresses = {json.dumps(addrs)}"]
        if pub:
            lines.append(f'public_key = "{pub}"')
    lines += ["[control]", f'socket = "{sock}"', "[limits]", "drain_seconds = 1"]
    return "\n".join(lines) + "\n"


def _keys(workdir: Path, hosts: list[str], secure: bool) -> dict[str, tuple[Path | None,
                                                                          str | None]]:
    if not secure:
        return {h: (None, None) for h in hosts}
    out: dict[str, tuple[Path | None, str | None]] = {}
    for h in hosts:
        path = workdir / f"{h}.key"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        out[h] = (path, public_key_text(create_private_key(str(path))))
    return out


def _wait_ready(specs: list[DaemonSpec], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for spec in specs:
        while True:
            if spec.proc is not None and spec.proc.poll() is not None:
                tail = spec.log.read_text(errors="replace").strip().splitlines()[-3:] \
                    if spec.log else []
                raise CollectiveError(f"daemon {spec.host} exited {spec.proc.returncode}: "
                                      + " | ".join(tail))
            if Path(spec.socket).exists():
                with contextlib.suppress(ClientError), Client(spec.socket,
                                                              connect_timeout=1.0) as c:
                    c.status()
                    break
            if time.monotonic() > deadline:
                raise CollectiveError(f"daemon {spec.host} not answering at {spec.socket} "
                                      f"after {timeout:g} s")
            time.sleep(0.05)


def _stop(specs: list[DaemonSpec]) -> None:
    for spec in specs:
        if spec.proc is not None and spec.proc.poll() is None:
            spec.proc.send_signal(signal.SIGTERM)
    for spec in specs:
        if spec.proc is None:
            continue
        try:
            spec.proc.wait(5)
        except subprocess.TimeoutExpired:
            spec.proc.kill()
            spec.proc.wait(5)


@contextlib.contextmanager
def loopback_daemons(world: int, workdir: Path, *, secure: bool = True,
                     ready_timeout: float = 30.0) -> Iterator[list[DaemonSpec]]:
    """`world` daemons on loopback planes (see the module docstring), stopped on exit."""
    base = random.randrange(64, 250)
    hosts = [f"r{i}" for i in range(world)]
    planes = {h: [f"127.{base}.{i + 1}.{p + 1}" for p in range(LOOPBACK_PLANES)]
              for i, h in enumerate(hosts)}
    port = _free_port([a for addrs in planes.values() for a in addrs])
    keys = _keys(workdir, hosts, secure)
    specs: list[DaemonSpec] = []
    logs: list[IO[bytes]] = []
    try:
        for h in hosts:
            sock = workdir / f"{h}.sock"
            conf = workdir / f"{h}.toml"
            peers = {o: (planes[o], keys[o][1]) for o in hosts if o != h}
            conf.write_text(_config(h, planes[h], port, sock, keys[h][0], peers))
            log = workdir / f"{h}.log"
            out = open(log, "wb")  # noqa: SIM115 (closed below)
            logs.append(out)
            proc = subprocess.Popen([sys.executable, "-m", "mrc", "daemon", "--config",
                                     str(conf)], stdout=out, stderr=subprocess.STDOUT,
                                    env=environ(), cwd=workdir)
            specs.append(DaemonSpec(h, str(sock), [], proc, log))
        _wait_ready(specs, ready_timeout)
        yield specs
    finally:
        _stop(specs)
        for log_file in logs:
            log_file.close()


def _testbed(*args: str, timeout: float = 120.0) -> str:
    proc = subprocess.run([sys.executable, "-m", "tools.testbed", *args], capture_output=True,
                          text=True, cwd=ROOT, env=environ(), timeout=timeout, check=False)
    if proc.returncode:
        raise CollectiveError(f"testbed {' '.join(args)}: "
                              f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout


def testbed_hosts(name: str | None) -> dict[str, list[str]]:
    """host → its plane addresses (plane order), from `tools.testbed status -J`."""
    args = ["status", "-J"] + ([name] if name else [])
    doc = json.loads(_testbed(*args))
    out: dict[str, list[str]] = {}
    for node in doc.get("nodes", []):
        if not str(node.get("name", "")).startswith("h"):
            continue
        addrs: dict[int, str] = {}
        for iface in node.get("interfaces", []):
            for a in iface.get("addresses", []):
                if ":" in a and iface.get("plane") is not None:
                    addrs[int(iface["plane"])] = a.split("/")[0]
        if addrs:
            out[node["name"]] = [addrs[p] for p in sorted(addrs)]
    if not out:
        raise CollectiveError("the testbed has no hosts with plane addresses (is it up?)")
    return dict(sorted(out.items(), key=lambda kv: int(kv[0][1:]) if kv[0][1:].isdigit() else 0))


@contextlib.contextmanager
def testbed_daemons(workdir: Path, *, name: str | None = None, hosts: Sequence[str] = (),
                    paths: str | None = None, secure: bool = True,
                    ready_timeout: float = 30.0) -> Iterator[list[DaemonSpec]]:
    """One daemon in each (or each named) host of a running testbed, stopped on exit."""
    table = testbed_hosts(name)
    chosen = list(hosts) or list(table)
    unknown = [h for h in chosen if h not in table]
    if unknown:
        raise CollectiveError(f"the testbed has no host {unknown[0]} (hosts: {', '.join(table)})")
    keys = _keys(workdir, chosen, secure)
    name_args = ["--name", name] if name else []
    if paths is None:  # the testbed's SRv6 path table (empty on a fabric without SRv6)
        paths = str(workdir / "paths.json")
        _testbed("paths", *([name] if name else []), "-o", paths)
    specs: list[DaemonSpec] = []
    logs: list[IO[bytes]] = []
    try:
        for h in chosen:
            sock = workdir / f"{h}.sock"
            conf = workdir / f"{h}.toml"
            peers = {o: (table[o], keys[o][1]) for o in chosen if o != h}
            conf.write_text(_config(h, table[h], 4791, sock, keys[h][0], peers, paths))
            prefix = [sys.executable, "-m", "tools.testbed", "exec", *name_args, h, "--"]
            log = workdir / f"{h}.log"
            out = open(log, "wb")  # noqa: SIM115 (closed below)
            logs.append(out)
            proc = subprocess.Popen([*prefix, sys.executable, "-m", "mrc", "daemon",
                                     "--config", str(conf)], stdout=out,
                                    stderr=subprocess.STDOUT, env=environ(), cwd=ROOT)
            specs.append(DaemonSpec(h, str(sock), prefix, proc, log))
        _wait_ready(specs, ready_timeout)
        yield specs
    finally:
        _stop(specs)
        for log_file in logs:
            log_file.close()


def rank_command(spec: DaemonSpec | None, args: Sequence[str]) -> list[str]:
    """The command line of one `mrc.collective.rank` (where `spec`'s daemon is)."""
    prefix = spec.prefix if spec is not None else []
    return [*prefix, sys.executable, "-m", "mrc.collective.rank", *args]


def run_ranks(commands: Sequence[Sequence[str]], timeout: float) -> list[list[dict[str, Any]]]:
    """Start every command at once; each rank's JSON lines (stdout), in rank order (a rank
    that exits non-zero without a JSON error line gets one made of its last stderr line). A
    run past `timeout` is a CollectiveError; every process is killed before this returns."""
    procs = [subprocess.Popen(list(c), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=environ(), cwd=ROOT) for c in commands]
    deadline = time.monotonic() + timeout
    try:
        outs = []
        for i, proc in enumerate(procs):
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise CollectiveError(f"rank {i} still running after {timeout:g} s") from None
            lines = []
            for line in out.decode(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    obj = json.loads(line)
                    if isinstance(obj, dict):
                        lines.append(obj)
            if proc.returncode and not any("error" in o for o in lines):
                tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                lines.append({"rank": i, "error": f"exited {proc.returncode}: {tail[0]}"})
            outs.append(lines)
        return outs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
