"""The htsim cross-check: one permutation through UEC's htsim and through mrc's simulator.

What it holds: `build_htsim` (copies the vendored htsim sources to a temporary directory and
builds `htsim_uec` there with cmake and make, the steps of the vendor README), `run_htsim`
(runs it on a connection matrix and a topology file, parses the "finished at" lines into flow
completion times and reads its wall time and peak memory), `run_mrc` (the same matrix on the
same topology through `mrc.sim` with MRC's policies, the core `Session` on every host, packet
trains) and `main`, which prints both side by side (p50, p99, max of the completion times, wall
times, peak memory, packets) as a table or JSON (`-J`).

What is compared, and how the two setups differ (said again in the output's `notes`):
- Same fabric shape and links (fat_tree_1024.topo: 3 tiers, 100 Gbit/s, 1 µs per link), and
  what htsim_uec derives from it (`HtsimSetup`, computed as htsim does: its base RTT is the
  fabric's longest unloaded round trip, 2 × 6 links' latency + a 4,150-byte packet and a
  64-byte ACK serialized on each of the 6 hops = 14.02272 µs; its queues are 1 × that BDP in
  whole packets, 43 × 4,150 = 178,450 bytes; ECN ramps from 20 % to 80 % of it, 37,350 to
  145,250 bytes). mrc's ports use the same queue size and trim; they mark above one threshold
  (mrc.switchq has no ramp), set to the middle of htsim's.
- Matched by default (`--as-is` runs mrc's own defaults instead; `MATCHED` lists them):
  NSCC's base RTT and window use htsim's base RTT, and the plane queue guard's first cap is
  htsim's initial window (htsim starts every flow at cwnd = 1.5 × BDP; mrc's guard starts a
  plane at 64 KiB and slow-starts); control packets (SACKs, NACKs, CM) go ahead of data at the
  host's NIC and at every switch port (htsim's NIC sends control 10:1 ahead of data and pulls
  data one packet at a time, so an ACK never waits behind a window of data; its switch queues
  serve header-only packets at strict priority).
- Packets: htsim sends 4,150-byte packets carrying 4,086 bytes (490 per 2 MB flow); mrc's
  simulator counts UDP payload bytes only, so its data datagrams are made 4,150 bytes long
  (4,110 bytes of payload after the 40-byte data header): 487 packets per flow.
- Completion time: htsim's flows start at 0 with no handshake and finish at their last ACK;
  mrc's connect first (a CM handshake) and each is timed from its WRITE's post to its
  `WriteCompleted`.

What it leaves to others: the fabric, the simulator and the protocol (mrc.sim, mrc.core).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mrc.experiments.permutation import MatrixError, mrc_config, read_cm, run_flows
from mrc.sim import FabricSpec, Network, TopologyError, build, read_htsim_topo

VENDOR = Path(__file__).resolve().parents[3] / "shared" / "vendor" / "uet-htsim"
MATRIX = "connection_matrices/perm_1024n_1024c_0u_2000000b.cm"
TOPOLOGY = "topologies/fat_tree_1024.topo"
PACKET = 4150  # htsim_uec's default MTU, header included
HTSIM_ACK = 64  # htsim's ACK size (UecBasePacket ACKSIZE)
DATA_HEADER = 40  # mrc's data header without ImmDt (docs/WIRE.md §3)
#: What `--as-is` leaves at mrc's own values and the default run sets as htsim does.
MATCHED = [
    "first window: the plane guard's first cap (plane_initial_cap) = htsim's initial cwnd, "
    "1.5 x BDP = 262,926 bytes on this fabric (mrc's default: 64 KiB, then a slow start)",
    "control packets (SACK, NACK, CM) ahead of data at the host's NIC and at every switch port "
    "(FabricSpec.control_priority; mrc's simulator otherwise has one FIFO for both)",
]


@dataclass(frozen=True)
class HtsimSetup:
    """What htsim_uec derives from a topology with its default options (main_uec.cpp)."""

    #: The fabric's longest unloaded round trip (htsim's network_max_unloaded_rtt), seconds.
    base_rtt: float
    #: Its bandwidth-delay product in bytes, and in whole packets (rounded up).
    bdp: float
    bdp_packets: int
    #: Every switch queue: 1 × the BDP in whole packets (trimming on).
    queue_bytes: int
    #: ECN marking probability ramps from 0 at `ecn_low` to 1 at `ecn_high` bytes queued.
    ecn_low: int
    ecn_high: int
    #: NSCC's first window, 1.5 × BDP (initNscc with no -cwnd).
    initial_cwnd: int

    @classmethod
    def of(cls, spec: FabricSpec, packet: int = PACKET, ack: int = HTSIM_ACK) -> HtsimSetup:
        links = [spec.host_link, spec.fabric_link]
        if spec.three_tier:
            links.append(spec.core_link or spec.fabric_link)
        hops = 2 * len(links)
        rate = spec.host_link.rate_bps
        # htsim counts one packet and one ACK serialized per hop at the host's rate.
        rtt = 2 * 2 * sum(link.latency for link in links) + (packet + ack) * 8 / rate * hops
        bdp = rtt * rate / 8
        packets = math.ceil(bdp / packet)
        return cls(
            base_rtt=rtt,
            bdp=bdp,
            bdp_packets=packets,
            queue_bytes=packets * packet,
            ecn_low=math.ceil(packets * 0.2) * packet,
            ecn_high=math.ceil(packets * 0.8) * packet,
            initial_cwnd=int(1.5 * bdp),
        )


_FINISHED = re.compile(r"finished at ([0-9.]+)")
_EVENTS = re.compile(r"\.EVENTS (\d+) WALL ([0-9.]+) EPS ([0-9.]+)")
_TOTALS = re.compile(r"New: (\d+) Rtx: (\d+) RTS: \d+ Bounced: \d+ ACKs: (\d+) NACKs: (\d+)")


class CompareError(Exception):
    """A step that failed, in one line."""


@dataclass
class Side:
    """One simulator's outcome. Times: completion times in µs, wall in seconds."""

    name: str
    flows: int
    finished: int
    p50_us: float | None
    p99_us: float | None
    max_us: float | None
    wall_seconds: float
    #: CPU seconds (user + system) the run took: the machine is shared, wall time varies.
    cpu_seconds: float
    peak_rss_mb: float
    events: int | None
    data_packets: int | None
    detail: dict[str, Any] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of `values`; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _side(name: str, flows: int, fct_us: list[float], **kw: Any) -> Side:
    return Side(
        name=name,
        flows=flows,
        finished=len(fct_us),
        p50_us=percentile(fct_us, 50),
        p99_us=percentile(fct_us, 99),
        max_us=percentile(fct_us, 100),
        **kw,
    )


# -- htsim ------------------------------------------------------------------------------


def build_htsim(src: Path, workdir: Path, log: Path) -> Path:
    """Copy `src` (the uet-htsim tree) into `workdir` and build `htsim_uec`; its path."""
    if not (src / "sim" / "CMakeLists.txt").is_file():
        raise CompareError(f"{src}: not an htsim source tree (no sim/CMakeLists.txt)")
    for tool in ("cmake", "make", "g++"):
        if shutil.which(tool) is None:
            raise CompareError(f"building htsim needs {tool}, which is not installed")
    tree = workdir / "uet-htsim"
    shutil.copytree(src, tree, ignore=shutil.ignore_patterns("build"))
    build_dir = tree / "sim" / "build"
    build_dir.mkdir(exist_ok=True)
    with log.open("w") as out:
        for cmd in (
            ["cmake", "..", "-DCMAKE_BUILD_TYPE=Release"],
            ["make", "-j2", "htsim_uec"],
        ):
            done = subprocess.run(cmd, cwd=build_dir, stdout=out, stderr=subprocess.STDOUT)
            if done.returncode:
                raise CompareError(f"'{' '.join(cmd)}' failed ({done.returncode}); see {log}")
    binary = tree / "sim" / "datacenter" / "htsim_uec"
    if not binary.exists():
        raise CompareError(f"the build left no {binary}; see {log}")
    return binary


def run_htsim(binary: Path, matrix: Path, topology: Path, end_us: int, log: Path) -> Side:
    """Run htsim_uec and read its completion times, events and totals."""
    cmd = [str(binary), "-tm", str(matrix), "-topo", str(topology), "-end", str(end_us)]
    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=binary.parent, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise CompareError(f"htsim_uec exited with {proc.returncode}; see {log}")
    text = log.read_text(errors="replace")
    fct = [float(m) for m in _FINISHED.findall(text)]
    events = _EVENTS.search(text)
    totals = _TOTALS.search(text)
    flows = len(read_cm(matrix))
    return _side(
        "htsim",
        flows,
        fct,
        wall_seconds=round(wall, 2),
        cpu_seconds=round(usage.ru_utime + usage.ru_stime, 2),
        peak_rss_mb=round(usage.ru_maxrss / 1024, 1),
        events=int(events.group(1)) if events else None,
        data_packets=int(totals.group(1)) if totals else None,
        detail={
            "retransmits": int(totals.group(2)) if totals else None,
            "acks": int(totals.group(3)) if totals else None,
            "nacks": int(totals.group(4)) if totals else None,
        },
    )


# -- mrc --------------------------------------------------------------------------------


def run_mrc(
    matrix: Path,
    topology: Path,
    *,
    flowcell: int,
    read_every: float,
    end_us: int,
    seed: int,
    matched: bool = True,
) -> Side:
    """The same matrix and fabric through mrc.sim (module docstring), in this process; with
    `matched`, the settings in MATCHED as htsim has them."""
    shape = read_htsim_topo(topology)
    setup = HtsimSetup.of(shape)
    spec = replace(
        shape,
        host_link=replace(shape.host_link, queue_bytes=setup.queue_bytes),
        fabric_link=replace(shape.fabric_link, queue_bytes=setup.queue_bytes),
        core_link=shape.core_link and replace(shape.core_link, queue_bytes=setup.queue_bytes),
        ecn_threshold=(setup.ecn_low + setup.ecn_high) // 2,
        trim=True,
        control_priority=matched,
    )
    flows = read_cm(matrix)
    cpu = time.process_time()
    net = Network(seed, trains=True, read_every=read_every)
    fab = build(net, spec)
    # A host's NIC queues what its own sender hands it (a real one pushes back, never drops).
    for host in fab.hosts:
        for nic in host.links.values():
            nic.params.queue_bytes = 1 << 30
    extra: dict[str, Any] = {"plane_initial_cap": setup.initial_cwnd} if matched else {}
    config = mrc_config(
        fab,
        base_rtt=setup.base_rtt,
        flowcell=flowcell,
        payload_mtu=PACKET - DATA_HEADER,
        **extra,
    )
    run = run_flows(net, fab, flows, config, timeout=end_us * 1e-6)
    cpu = time.process_time() - cpu
    ports = list(fab.ports())
    fct = [t * 1e6 for t in run.fct if t is not None]
    return _side(
        "mrc",
        len(flows),
        fct,
        wall_seconds=round(run.wall_seconds, 2),
        cpu_seconds=round(cpu, 2),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        events=run.events,
        data_packets=run.data_packets,
        detail={
            "retransmits": run.retransmits,
            "packets_all_kinds": run.packets,
            "trims": run.trims,
            "drops": run.drops,
            "ce_marked": sum(p.counters["ce_marked"] for p in ports),
            # The deepest any switch queue got (bytes): htsim's queues reach its 10.5 µs
            # delay target (about 130 KB) in most flows (its fair-increase counters).
            "max_port_queue_bytes": max((p.stats.max_bytes for p in ports), default=0),
            "events_per_second": round(run.events / run.wall_seconds) if run.wall_seconds else 0,
            "flowcell": flowcell,
            "read_every_us": read_every * 1e6,
            "events_per_cpu_second": round(run.events / cpu) if cpu else 0,
            "payload_mtu": config.payload_mtu,
            "ev_per_plane": config.ev_per_plane,
            "matched": MATCHED if matched else [],
            "htsim_setup": asdict(setup),
        },
    )


# -- output -----------------------------------------------------------------------------

NOTES = [
    "both: htsim's base RTT (14.02 µs on fat_tree_1024) for NSCC's constants and first window, "
    "its queue size (1 x BDP, 178,450 bytes), trimming on, 64 EVs (mrc: one per core path)",
    "htsim flows start at 0 without a handshake; mrc flows are timed from the WRITE's post "
    "(after the CM handshake) to WriteCompleted",
    "htsim: 490 packets of 4,086 payload bytes per 2 MB flow; mrc: 487 datagrams of 4,150 "
    "bytes (4,110 payload)",
    "htsim marks ECN on a ramp 37,350..145,250 bytes at dequeue; mrc's ports above 91,300 "
    "bytes at enqueue",
    "mrc moves each flowcell as one event per hop (packet trains, mrc/sim/link.py); a host "
    "reads its arrivals at most every --read-every µs (htsim's sink ACKs every 16 KB, about "
    "every 4 packets, and at once on a CE mark)",
]


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(sides: list[Side]) -> str:
    rows: list[tuple[str, Callable[[Side], str]]] = [
        ("flows finished", lambda s: f"{s.finished}/{s.flows}"),
        ("FCT p50 (µs)", lambda s: _fmt(s.p50_us)),
        ("FCT p99 (µs)", lambda s: _fmt(s.p99_us)),
        ("FCT max (µs)", lambda s: _fmt(s.max_us)),
        ("wall (s)", lambda s: _fmt(s.wall_seconds, ".2f")),
        ("CPU (s)", lambda s: _fmt(s.cpu_seconds, ".2f")),
        ("peak RSS (MB)", lambda s: _fmt(s.peak_rss_mb)),
        ("events", lambda s: "-" if s.events is None else f"{s.events:,}"),
        ("data packets", lambda s: "-" if s.data_packets is None else f"{s.data_packets:,}"),
    ]
    out = [f"{'':<16}" + "".join(f"{s.name:>14}" for s in sides)]
    for label, get in rows:
        out.append(f"{label:<16}" + "".join(f"{get(s):>14}" for s in sides))
    if len(sides) == 2:
        a, b = sides
        for label, x, y in (("p50", a.p50_us, b.p50_us), ("p99", a.p99_us, b.p99_us)):
            if x and y:
                out.append(f"mrc/htsim {label}: {y / x:.3f}")
        if a.wall_seconds and a.cpu_seconds:
            out.append(f"mrc/htsim wall: {b.wall_seconds / a.wall_seconds:.2f}")
            out.append(f"mrc/htsim CPU: {b.cpu_seconds / a.cpu_seconds:.2f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.htsim",
        description="Run htsim's 1,024-host 2 MB permutation through htsim and through mrc's "
        "simulator, and print the flow completion times side by side.",
    )
    ap.add_argument("--htsim-src", type=Path, default=VENDOR, help="uet-htsim source tree")
    ap.add_argument("--htsim-bin", type=Path, help="an htsim_uec already built (skips the build)")
    ap.add_argument("--matrix", default=MATRIX, help="connection matrix, relative to datacenter/")
    ap.add_argument("--topo", default=TOPOLOGY, help="topology file, relative to datacenter/")
    ap.add_argument("--end", type=int, default=100_000, help="simulated end time (µs)")
    ap.add_argument(
        "--flowcell", type=int, default=1,
        help="mrc packets per flowcell (1: an EV per packet, as MRC sprays; more: fewer events, "
        "burstier paths)",
    )
    ap.add_argument(
        "--read-every", type=float, default=1.0,
        help="µs between a host's reads of its arrivals (0: every arrival at once)",
    )
    ap.add_argument(
        "--as-is", action="store_true",
        help="run mrc with its own defaults instead of the settings matched to htsim's",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-htsim", action="store_true", help="run only mrc's side")
    ap.add_argument("--skip-mrc", action="store_true", help="run only htsim")
    ap.add_argument("-J", "--json", action="store_true", help="one JSON document")
    args = ap.parse_args(argv)
    datacenter = args.htsim_src / "sim" / "datacenter"
    matrix, topology = datacenter / args.matrix, datacenter / args.topo
    sides: list[Side] = []
    try:
        with tempfile.TemporaryDirectory(prefix="mrc-htsim-") as tmp:
            work = Path(tmp)
            if not args.skip_htsim:
                binary = args.htsim_bin or build_htsim(
                    args.htsim_src, work, work / "build.log"
                )
                if not binary.exists():
                    raise CompareError(f"{binary}: no such file")
                sides.append(run_htsim(binary, matrix, topology, args.end, work / "htsim.log"))
            if not args.skip_mrc:
                sides.append(
                    run_mrc(matrix, topology, flowcell=args.flowcell,
                            read_every=args.read_every * 1e-6, end_us=args.end, seed=args.seed,
                            matched=not args.as_is)
                )  # fmt: skip
    except (CompareError, TopologyError, MatrixError, OSError) as e:
        print(f"tools.htsim: {e}", file=sys.stderr)
        return 1
    matched = [] if args.as_is or args.skip_mrc else MATCHED
    if args.json:
        doc = {"sides": [asdict(s) for s in sides], "matched": matched, "notes": NOTES}
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(table(sides))
        print("mrc settings matched to htsim's:" if matched else "mrc's own settings (--as-is)")
        for item in matched:
            print(f"- {item}")
        print("as the two runs are set up:")
        for note in NOTES:
            print(f"- {note}")
    return 0
