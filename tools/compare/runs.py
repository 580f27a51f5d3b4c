"""The five throughput runs: iperf3 TCP, kernel MPTCP, aioquic, the raw-UDP ceiling, mrc.

Each `run_*` takes the `Bed` (the testbed's namespaces and plane addresses) and the byte count,
starts the receiver in h2 and the sender in h1 (`procs.Proc`), waits for both with deadlines
and returns a result dict with the common keys `goodput_bps` (receiver bytes over receiver
seconds, as each tool defines them; see the package docstring), `bytes`, `seconds`,
`cpu_seconds` (user + system of both processes from `wait4`), `cpu_s_per_gb` (per 10^9 bytes
received) and, for the multi-plane transports, `plane_rx_bytes` (h2's per-interface receive
counters, before/after difference). Failures raise `procs.ProcError` with one line.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from tools.compare import procs
from tools.compare.procs import Proc, ProcError

IPERF_PORT = 5201
MPTCP_PORT = 5301
QUIC_PORT = 5401
RAW_PORT = 5501
MRC_PORT = 4791


@dataclass
class Bed:
    """What the runs need to know about the testbed."""

    name: str
    ns1: str  # h1: every sender
    ns2: str  # h2: every receiver
    a1: list[str]  # h1's IPv4 address on each plane
    a2: list[str]
    timeout: float  # per-run deadline, seconds
    python: str = sys.executable
    ifaces: list[str] = field(default_factory=list)
    logs: str | None = None  # keep the raw documents and byte logs here

    def keep(self, name: str, doc: Any) -> None:
        """Write a raw document to the `--logs` directory, if one was given."""
        if self.logs:
            os.makedirs(self.logs, exist_ok=True)
            with open(os.path.join(self.logs, name), "w") as fh:
                fh.write(doc if isinstance(doc, str) else json.dumps(doc))

    @property
    def planes(self) -> int:
        return len(self.a1)


def _result(nbytes: int, seconds: float, cpu: float, **extra: Any) -> dict[str, Any]:
    bps = nbytes * 8 / seconds if seconds > 0 else 0.0
    return {"goodput_bps": bps, "bytes": nbytes, "seconds": round(seconds, 4),
            "cpu_seconds": round(cpu, 3),
            "cpu_s_per_gb": round(cpu / (nbytes / 1e9), 3) if nbytes else None, **extra}


def _cpu(*ps: Proc) -> float:
    return sum(p.cpu_seconds or 0.0 for p in ps)


def _split(bed: Bed, before: dict[str, dict[str, int]]) -> list[int]:
    after = procs.rx_counters(bed.ns2)
    return [after[i]["rx_bytes"] - before[i]["rx_bytes"] for i in bed.ifaces]


def finish(client: Proc, server: Proc, timeout: float) -> None:
    """Wait for the sender, then the receiver; a sender that failed is reported at once (its
    receiver, still waiting for a peer, is stopped)."""
    client.wait(timeout)
    if client.returncode != 0:
        server.kill(grace=0.5)
        client.check()
    server.wait(15)
    client.check()
    server.check()


def run_iperf3(bed: Bed, nbytes: int) -> dict[str, Any]:
    server = Proc(bed.ns2, ["iperf3", "-s", "-1", "-B", bed.a2[0], "-p", str(IPERF_PORT), "-J"],
                  "iperf3 server")
    procs.wait_listening(bed.ns2, IPERF_PORT, udp=False, proc=server)
    client = Proc(bed.ns1, ["iperf3", "-c", bed.a2[0], "-B", bed.a1[0], "-p", str(IPERF_PORT),
                            "-n", str(nbytes), "-J"], "iperf3 client")
    client.wait(bed.timeout)
    if client.returncode != 0:
        server.kill(grace=0.5)
    else:
        server.wait(15)
    doc = client.json()
    bed.keep("iperf3-client.json", doc)
    if doc.get("error"):
        raise ProcError(f"iperf3: {doc['error']}")
    recv = doc["end"]["sum_received"]
    sent = doc["end"]["sum_sent"]
    return _result(int(recv["bytes"]), float(recv["seconds"]), _cpu(client, server),
                   retransmits=sent.get("retransmits"),
                   tcp_congestion=doc["end"].get("sender_tcp_congestion"),
                   iperf3_cpu_percent=doc["end"].get("cpu_utilization_percent"))


def mptcp_setup(bed: Bed) -> None:
    """Kernel MPTCP on the testbed: enabled in both namespaces, limits raised on both, and one
    `subflow` endpoint per extra plane in the client namespace (plane 0 is the initial
    subflow's address; each endpoint is bound to its plane's interface)."""
    for ns in (bed.ns1, bed.ns2):
        procs.run(ns, ["sysctl", "-q", "-w", "net.mptcp.enabled=1"])
        procs.run(None, ["ip", "-n", ns, "mptcp", "endpoint", "flush"])
        procs.run(None, ["ip", "-n", ns, "mptcp", "limits", "set", "subflow", "8",
                         "add_addr_accepted", "8"])
    for k in range(1, bed.planes):
        procs.run(None, ["ip", "-n", bed.ns1, "mptcp", "endpoint", "add", bed.a1[k],
                         "dev", bed.ifaces[k], "subflow"])


def mptcp_procs(bed: Bed, what: list[str]) -> tuple[Proc, Proc]:
    """Start the MPTCP receiver (h2, plane-0 address) and sender (`what`: --bytes/--seconds)."""
    mod = [bed.python, "-m", "tools.compare.mptcp"]
    server = Proc(bed.ns2, [*mod, "server", "--bind", bed.a2[0], "--port", str(MPTCP_PORT),
                            "--timeout", str(bed.timeout)], "mptcp server")
    procs.wait_listening(bed.ns2, MPTCP_PORT, udp=False, proc=server)
    client = Proc(bed.ns1, [*mod, "client", "--connect", bed.a2[0], "--port", str(MPTCP_PORT),
                            *what], "mptcp client")
    return server, client


def run_mptcp(bed: Bed, nbytes: int) -> dict[str, Any]:
    before = procs.rx_counters(bed.ns2)
    server, client = mptcp_procs(bed, ["--bytes", str(nbytes)])
    finish(client, server, bed.timeout)
    split = _split(bed, before)
    srv, cli = server.json(), client.json()
    total = sum(split) or 1
    used = sum(1 for b in split if b >= 0.05 * total)
    out = _result(int(srv["bytes"]), float(srv["seconds"]), _cpu(client, server),
                  plane_rx_bytes=split, planes_used=used,
                  subflows=(cli.get("max_subflows", 0) + 1) if cli.get("mptcp_info_ok") else None)
    if used < bed.planes:
        out["warning"] = f"only {used} of {bed.planes} planes carried ≥ 5 % of the bytes"
    return out


def run_quic(bed: Bed, nbytes: int, max_seconds: float) -> dict[str, Any]:
    mod = [bed.python, "-m", "tools.compare.quic"]
    server = Proc(bed.ns2, [*mod, "server", "--bind", bed.a2[0], "--port", str(QUIC_PORT),
                            "--timeout", str(bed.timeout)], "aioquic server", pipe_stdout=True)
    if server.readline(30) != "READY":
        server.kill()
        raise ProcError(f"aioquic server: did not start: {server.stderr_tail()}")
    client = Proc(bed.ns1, [*mod, "client", "--connect", bed.a2[0], "--port", str(QUIC_PORT),
                            "--bytes", str(nbytes), "--max-seconds", str(max_seconds)],
                  "aioquic client")
    finish(client, server, bed.timeout)
    srv, cli = server.json(), client.json()
    return _result(int(srv["bytes"]), float(srv["seconds"]), _cpu(client, server),
                   capped=bool(cli.get("capped")), bytes_requested=nbytes)


def run_raw(bed: Bed, nbytes: int) -> dict[str, Any]:
    mod = [bed.python, "-m", "tools.compare.rawudp"]
    before = procs.rx_counters(bed.ns2)
    server = Proc(bed.ns2, [*mod, "recv", "--bind", ",".join(bed.a2), "--port", str(RAW_PORT),
                            "--bytes", str(nbytes), "--peer", bed.a1[0]], "raw-udp receiver",
                  pipe_stdout=True)
    if server.readline(30) != "READY":
        server.kill()
        raise ProcError(f"raw-udp receiver: did not start: {server.stderr_tail()}")
    client = Proc(bed.ns1, [*mod, "send", "--bind", ",".join(bed.a1), "--connect",
                            ",".join(bed.a2), "--port", str(RAW_PORT), "--bytes", str(nbytes)],
                  "raw-udp sender")
    finish(client, server, bed.timeout)
    split = _split(bed, before)
    srv, cli = server.json(), client.json()
    return _result(int(srv["bytes"]), float(srv["seconds"]), _cpu(client, server),
                   plane_rx_bytes=split, lost_bytes=srv.get("lost"),
                   packets=srv.get("packets"), receive_calls=srv.get("calls"),
                   sender_calls=cli.get("calls"))


def mrc_procs(
    bed: Bed, what: list[str], extra: list[str], security: str = "none", *, pure: bool = False
) -> tuple[Proc, Proc]:
    """Start `mrc bench -s -1 -J` in h2 and `mrc bench -c … -J` (plus `what`) in h1, both at
    the same `--security` level (a server refuses a REQUEST that asks for another); `pure`
    runs both on the pure-Python mrc.wire/mrc.core (MRC_PURE=1) even where they are compiled."""
    mod = [bed.python, "-m", "mrc", "bench"]
    env = {"MRC_PURE": "1"} if pure else {"MRC_PURE": "0"}
    interval = [a for i, a in enumerate(what) if i and what[i - 1] == "-i"]
    level = ["--security", security]
    what = [*what, *level]
    server = Proc(bed.ns2, [*mod, "-s", "-1", "-B", ",".join(bed.a2), "-p", str(MRC_PORT), "-J",
                            *level, *(["-i", interval[0]] if interval else [])], "mrc server",
                  env=env)
    procs.wait_listening(bed.ns2, MRC_PORT, udp=True, proc=server)
    client = Proc(bed.ns1, [*mod, "-c", ",".join(bed.a2), "-B", ",".join(bed.a1),
                            "-p", str(MRC_PORT), "-J", *what, *extra], "mrc client", env=env)
    return server, client


def mrc_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The parts of an `mrc bench -J` client document worth keeping in the comparison."""
    end = doc.get("end", {})
    m = end.get("mrc", {})
    return {
        "integrity": m.get("integrity"),
        "messages_verified": m.get("messages_verified"),
        "retransmits": end.get("sum_sent", {}).get("retransmits"),
        "retransmits_by_cause": m.get("retransmits_by_cause"),
        "drops_by_reason": m.get("drops_by_reason"),
        "peer_drops_by_reason": m.get("remote", {}).get("drops_by_reason"),
        "probes_sent": m.get("probes_sent"),
        "longest_stall_seconds": m.get("longest_stall_seconds"),
        "mrc_cpu_percent": end.get("cpu_utilization_percent"),
        "test_start": doc.get("start", {}).get("test_start"),
        # "compiled" or "pure: …" (mrc.implementation() in the client).
        "implementation": doc.get("start", {}).get("implementation"),
    }


def run_mrc(
    bed: Bed, nbytes: int, extra: list[str], security: str = "none", *, pure: bool = False
) -> dict[str, Any]:
    """One verified `mrc bench` run; `security` auth or encrypt protects every packet with
    per-run keys (aioquic always encrypts: its fair peer is the encrypt run); `pure` runs the
    pure-Python build beside the compiled one."""
    before = procs.rx_counters(bed.ns2)
    what = ["-n", str(nbytes), "--verify", "-i", "0"]
    server, client = mrc_procs(bed, what, extra, security, pure=pure)
    finish(client, server, bed.timeout)
    split = _split(bed, before)
    doc = client.json()
    tag = ("mrc" if security == "none" else f"mrc-{security}") + ("-pure" if pure else "")
    bed.keep(f"{tag}-client.json", doc)
    bed.keep(f"{tag}-server.json", server.json())
    if doc.get("error"):
        raise ProcError(f"mrc bench: {doc['error']}")
    recv = doc["end"]["sum_received"]
    out = _result(int(recv["bytes"]), float(recv["seconds"]), _cpu(client, server),
                  plane_rx_bytes=split, **mrc_summary(doc))
    if out["integrity"] != "ok":
        out["warning"] = f"integrity {out['integrity']}"
    return out
