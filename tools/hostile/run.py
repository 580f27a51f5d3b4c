"""One hostile-input run: a bench server, verified clients, a sniffer and a spoofer on loopback.

Holds `Options` and `run`, which starts `mrc bench -s` on 4 loopback planes, then verified
clients (`mrc bench -c … --verify -n SIZE`) one after the other, sniffs their traffic on `lo`,
and while a transfer runs sends hostile datagrams from the chosen attacks (`tools.hostile.attacks`)
until the budget of datagrams is spent or the time is up. It then lets the running transfer
finish, stops the server, and hands everything to `tools.hostile.report` as a `Raw` record.
Every process it starts is stopped on the way out, whatever the way out is.

Pacing: the attacker sends in batches and reads the sniffer between batches, so forgeries
"ahead of the sender" are at most one batch stale. `rate` caps datagrams per second; 0 sends as
fast as the raw socket takes them (the server's socket buffer then decides what reaches the
core, and the kernel counts what it drops).
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

from mrc.node.errors import NodeError
from mrc.node.keys import create_private_key, public_key_text
from tools.hostile.attacks import KINDS, Mix, Scope
from tools.hostile.flow import Flow
from tools.hostile.procs import (
    CLIENT_ADDRS,
    SERVER_ADDRS,
    BenchProc,
    bench_argv,
    free_port,
    socket_drops,
    udp_bound,
    udp_snmp,
)
from tools.hostile.rawnet import Sniffer, Spoofer

BATCH = 64
SNIFF_LIMIT = 1024
MAX_IDLE_CLIENTS = 3


class RunError(Exception):
    """The run could not be set up (a bench that does not start, …): one line."""


@dataclass(slots=True)
class Options:
    datagrams: int = 1_000_000
    security: str = "encrypt"  # none | auth | encrypt
    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    planes: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    size: str = "16G"  # each client's -n
    seconds: float = 600.0  # the attack's time limit
    drain: float = 180.0  # how long the transfer running at the end may take to finish
    rate: float = 0.0  # datagrams per second, 0 = unpaced
    warmup: float = 0.0  # seconds a connection carries data before the attack on it starts
    seed: int | None = None
    #: Secured runs: "listed" gives each bench a key file and the other's public key as its
    #: only allowed peer (so a REQUEST with any other static key is refused unheard);
    #: "per-run" lets the benches make per-run keys and skip the allowlist.
    keys: str = "listed"


@dataclass(slots=True)
class Raw:
    """Everything a run observed, for `report.figures`."""

    options: Options
    port: int
    sent: Counter[str] = field(default_factory=Counter)
    to_server: int = 0
    to_client: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    attack_seconds: float = 0.0
    timed_out: bool = False
    server: BenchProc | None = None
    clients: list[BenchProc] = field(default_factory=list)
    server_socket_drops: int = 0
    client_socket_drops: int = 0
    snmp_before: dict[str, int] = field(default_factory=dict)
    snmp_after: dict[str, int] = field(default_factory=dict)
    sniffed_packets: int = 0
    sniffed_datagrams: int = 0
    connections_seen: int = 0
    aborted: str | None = None  # why the attack stopped before its budget, if it did


class Keys:
    """Key files for a secured run with allowlists: each side lists only the other."""

    def __init__(self, tmp: str) -> None:
        self.paths = {side: os.path.join(tmp, f"{side}.key") for side in ("server", "client")}
        self.public = {
            side: public_key_text(create_private_key(path)) for side, path in self.paths.items()
        }

    def args(self, side: str) -> list[str]:
        other = "client" if side == "server" else "server"
        return ["--key", self.paths[side], "--peer-key", self.public[other]]


def _security_args(opts: Options, keys: Keys | None, side: str) -> list[str]:
    if opts.security == "none":
        return []  # the bench's default
    return ["--security", opts.security, *(keys.args(side) if keys is not None else [])]


def _start_server(opts: Options, port: int, keys: Keys | None) -> BenchProc:
    argv = bench_argv("-s", "-B", ",".join(SERVER_ADDRS), "-p", str(port), "-J",
                      *_security_args(opts, keys, "server"))  # fmt: skip
    server = BenchProc("server", argv)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if server.returncode is not None:
            tail = (server.stderr().strip().splitlines() or [f"exit {server.returncode}"])[-1]
            raise RunError(f"the bench server did not start: {tail}")
        if udp_bound(SERVER_ADDRS, port):
            return server
        time.sleep(0.02)
    server.close()
    raise RunError("the bench server did not bind its planes within 15 s")


def _start_client(opts: Options, port: int, n: int, keys: Keys | None) -> BenchProc:
    argv = bench_argv("-c", ",".join(SERVER_ADDRS), "-B", ",".join(CLIENT_ADDRS), "-p", str(port),
                      "-J", "--verify", "-n", opts.size,
                      *_security_args(opts, keys, "client"))  # fmt: skip
    return BenchProc(f"client {n}", argv)


def _client_drops(flow: Flow, known: dict[tuple[str, int], int]) -> None:
    """Remember the kernel drop count of each client socket while it exists (it goes with
    the client process)."""
    for host, port in flow.client.values():
        known[(host, port)] = max(known.get((host, port), 0), socket_drops([host], port))


def run(opts: Options) -> Raw:
    """Attack a live verified transfer; raises RunError when the run cannot start."""
    rng = random.Random(opts.seed)
    port = free_port()
    raw = Raw(options=opts, port=port)
    sniffer = Sniffer(port)
    spoofer = Spoofer()
    flow = Flow(SERVER_ADDRS, port, opts.security != "none", rng=rng)
    scope = Scope(flow, opts.planes, rng)
    mix = Mix(scope, opts.kinds)
    client_drops: dict[tuple[str, int], int] = {}
    client: BenchProc | None = None
    raw.snmp_before = udp_snmp()
    tmp = tempfile.TemporaryDirectory(prefix="mrc-hostile-")
    try:
        try:
            keys = Keys(tmp.name) if opts.security != "none" and opts.keys == "listed" else None
        except NodeError as exc:
            raise RunError(f"cannot make key files: {exc}") from None
        raw.server = server = _start_server(opts, port, keys)
        client = _start_client(opts, port, 1, keys)
        sent = 0
        sent_at_client_start = 0
        idle_clients = 0  # clients in a row that ended before a single forgery went out
        ready_at: float | None = None  # when the live connection became a target
        start = time.monotonic()
        deadline = start + opts.seconds
        next_check = start
        while sent < opts.datagrams:
            now = time.monotonic()
            if now > deadline:
                raw.timed_out = True
                break
            flow.feed(sniffer.read(SNIFF_LIMIT))
            # Every batch: a client that just ended must stop being a target at once.
            if now >= next_check or client.returncode is not None:
                next_check = now + 0.05
                _client_drops(flow, client_drops)
                if server.returncode is not None:
                    raw.aborted = "the server ended during the attack"
                    break
                if client.returncode is not None:
                    flow.forget()
                    raw.clients.append(client)
                    idle_clients = idle_clients + 1 if sent == sent_at_client_start else 0
                    if idle_clients >= MAX_IDLE_CLIENTS:
                        raw.aborted = f"{idle_clients} clients in a row ended before data flowed"
                        client = None
                        break
                    sent_at_client_start = sent
                    client = _start_client(opts, port, len(raw.clients) + 1, keys)
                    continue
            if not scope.ready:
                ready_at = None
                time.sleep(0.001)
                continue
            if ready_at is None:
                ready_at = now
            if now - ready_at < opts.warmup:
                time.sleep(0.001)
                continue
            for _ in range(min(BATCH, opts.datagrams - sent)):
                f = mix.next()
                if spoofer.send(f.src, f.dst, f.payload, f.psum):
                    sent += 1
                    raw.sent[f.kind] += 1
                    if f.dst[1] == port:
                        raw.to_server += 1
                    else:
                        raw.to_client += 1
            if opts.rate > 0:
                ahead = sent / opts.rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
        raw.attack_seconds = time.monotonic() - start
        # The transfer under way finishes on its own; its forgeries are all on the wire.
        end = time.monotonic() + opts.drain
        while client is not None and client.returncode is None and time.monotonic() < end:
            flow.feed(sniffer.read(SNIFF_LIMIT))
            _client_drops(flow, client_drops)
            client.wait(0.05)
        if client is not None:
            raw.clients.append(client)
            client = None
        raw.server_socket_drops = socket_drops(SERVER_ADDRS, port)
        server.stop()
    finally:
        for proc in (client, *raw.clients, raw.server):
            if proc is not None:
                with contextlib.suppress(OSError):
                    proc.stop(grace=5.0)
        raw.snmp_after = udp_snmp()
        raw.refused = dict(spoofer.refused)
        raw.sniffed_packets = sniffer.packets
        raw.sniffed_datagrams = sniffer.datagrams
        raw.connections_seen = flow.connections
        raw.client_socket_drops = sum(client_drops.values())
        sniffer.close()
        spoofer.close()
        tmp.cleanup()
    return raw
