"""The failover runs: a timed mrc or MPTCP transfer over all planes, one plane failed 2 s in.

For each transport: the 1 ms interface sampler (`tools.compare.sampler`) starts in h2, then
the receiver, then the sender in time mode. When the sampler reports `FLOWING` (1 MiB has
arrived) the fault is scheduled at that instant + `fault_after` (2 s): `tools.testbed`'s own
`faults.link_down` (the code behind `python -m tools.testbed fault link-down`) on link
`h1-p<plane>`, called in-process so its time is known to a few ms; `t_fault` is taken just
before the call. After the sender ends, the sampler is stopped and the fault cleared
(`faults.clear`: interface up, addresses and routes back). Each transport's result carries
`series`, its receiver goodput in 10 ms bins on the clock of its `fault_at_s`
(`analysis.series`), which `mrc plot` draws.

`run_mrc_repeated` runs the mrc side `repeat` times in a row for one kind of fault (issue 19's
goal is a longest gap of at most 10 ms in 10 of 10 runs): the first run's full result, plus
`runs` (each run's longest gap, fault gap, retransmits and integrity) and
`runs_within_10ms`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

from tools.compare import analysis, procs
from tools.compare.analysis import Window
from tools.compare.procs import Proc, ProcError
from tools.compare.runs import Bed, finish, mptcp_procs, mrc_procs, mrc_summary
from tools.testbed import faults
from tools.testbed.build import State
from tools.testbed.runner import Runner

DATA_PACKET = 4096  # a sample "has new bytes" when it grew by at least one data payload
#: Issue 19's failover goal: the longest gap of every run at most this long.
GAP_GOAL_S = 0.010


def _sampler(bed: Bed, seconds: float) -> Proc:
    return Proc(bed.ns2, [bed.python, "-m", "tools.compare.sampler", "--ifaces",
                          ",".join(bed.ifaces), "--max-seconds", str(seconds + 60)],
                "sampler", pipe_stdout=True)


def _inject(bed: Bed, sampler: Proc, state: State, runner: Runner, kind: str, link: str,
            after: float, sender: Proc) -> tuple[float, float]:
    """Wait for the flow, then fault `link` `after` seconds into it; (t_flow, t_fault).

    The fault's commands are started (armed) while the flow ramps up and only handed their
    scripts at t_fault (tools.testbed.faults.ArmedFault): starting them then took 18-28 ms
    on a 2-core host whose cores the transfer keeps busy, competing with it for the CPU,
    and the link's two ends failed that far apart."""
    line = sampler.readline(30)
    if not line or not line.startswith("FLOWING "):
        why = sender.stderr_tail() if sender.poll() is not None else "no data after 30 s"
        raise ProcError(f"the transfer did not start: {why}")
    t_flow = float(line.split()[1])
    armed = faults.ARM[kind](state, link, runner)
    try:
        delay = t_flow + after - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if sender.poll() is not None:
            raise ProcError(f"{sender.name} ended before the fault: {sender.stderr_tail()}")
        t_fault = time.monotonic()
        armed.fire()
    finally:
        armed.cancel()
    return t_flow, t_fault


def _stop_sampler(sampler: Proc) -> dict[str, Any]:
    sampler.signal(signal.SIGTERM)
    sampler.wait(15)
    return sampler.json()


def _wire(doc: dict[str, Any], t_fault: float, plane: int) -> dict[str, Any]:
    total, per_iface = analysis.sampler_windows(doc)
    m = analysis.failover(total, t_fault, min_bytes=DATA_PACKET)
    last = total[-1].end if total else t_fault
    m["plane_rx_bytes_before"] = analysis.plane_shares(per_iface, t_fault - 1.5, t_fault)
    m["plane_rx_bytes_after"] = analysis.plane_shares(per_iface, t_fault + 0.5, last)
    m["failed_plane"] = plane
    return m


def run_mptcp(bed: Bed, seconds: float, plane: int, kind: str, after: float, state: State,
              runner: Runner) -> dict[str, Any]:
    link = f"h1-p{plane}"
    sampler = _sampler(bed, seconds)
    try:
        server, client = mptcp_procs(bed, ["--seconds", str(seconds)])
        _, t_fault = _inject(bed, sampler, state, runner, kind, link, after, client)
        finish(client, server, seconds + 60)
        wire_doc = _stop_sampler(sampler)
    finally:
        sampler.kill()
        faults.clear(state, link, runner)
    srv = server.json()
    bed.keep("failover-mptcp-receiver.json", srv)
    bed.keep("failover-mptcp-sampler.json", wire_doc)
    bed.keep("failover-mptcp-fault.json", {"t_fault": t_fault})
    app: list[Window] = analysis.bins_windows(srv["first"], srv["bins_ms"])
    m = analysis.failover(app, t_fault, exact=srv["gaps"], first=srv["first"])
    m["measured_on"] = "bytes read by the MPTCP receiver (recv_into timestamps; 1 ms bins)"
    m["series"] = analysis.series(app, t_fault)
    m["wire"] = _wire(wire_doc, t_fault, plane)
    m["bytes"] = srv["bytes"]
    m["subflows"] = client.json().get("max_subflows", 0) + 1
    m["fault"] = kind
    return m


def run_mrc(bed: Bed, seconds: float, plane: int, kind: str, after: float, state: State,
            runner: Runner, extra: list[str], run: int = 1) -> dict[str, Any]:
    """One mrc failover run; its raw documents go to `--logs` as
    `failover-mrc-<kind>-<run>-{client,server,sampler,fault}.json`."""
    link = f"h1-p{plane}"
    sampler = _sampler(bed, seconds)
    try:
        server, client = mrc_procs(bed, ["-t", str(seconds), "-i", "0.01", "--verify"], extra)
        _, t_fault = _inject(bed, sampler, state, runner, kind, link, after, client)
        finish(client, server, seconds + 60)
        wire_doc = _stop_sampler(sampler)
    finally:
        sampler.kill()
        faults.clear(state, link, runner)
    cdoc, sdoc = client.json(), server.json()
    tag = f"failover-mrc-{kind}-{run}"
    bed.keep(f"{tag}-client.json", cdoc)
    bed.keep(f"{tag}-server.json", sdoc)
    bed.keep(f"{tag}-sampler.json", wire_doc)
    bed.keep(f"{tag}-fault.json", {"t_fault": t_fault})
    total, _ = analysis.sampler_windows(wire_doc)
    t0 = analysis.first_data(total, DATA_PACKET)
    if t0 is None:
        raise ProcError("mrc failover: the sampler saw no data")
    placed = analysis.interval_windows(t0, sdoc.get("intervals", []))
    stall = cdoc.get("end", {}).get("mrc", {}).get("longest_stall_seconds")
    m = analysis.failover(placed, t_fault)
    m["series"] = analysis.series(placed, t_fault)  # the clock of m["fault_at_s"]
    wire = _wire(wire_doc, t_fault, plane)
    # mrc places packets as they arrive (no head-of-line blocking), so the 1 ms wire log is
    # its finest goodput-level view of the stall at the fault; 10 ms intervals are coarser.
    for key in ("fault_gap_s", "fault_gap_at_s", "pre_gap_s"):
        m[key] = wire[key]
    m["longest_gap_10ms_s"] = m.pop("longest_gap_s")
    m["longest_gap_10ms_at_s"] = m.pop("longest_gap_at_s")
    m["longest_gap_s"] = float(stall) if stall is not None else m["longest_gap_10ms_s"]
    # Where it began, after the fault: the receiver counts from its first placement, which is
    # the first data packet on the wire to within a round trip.
    stall_at = cdoc.get("end", {}).get("mrc", {}).get("longest_stall_at_seconds")
    if stall is None:
        m["longest_gap_at_s"] = m["longest_gap_10ms_at_s"]
    else:
        m["longest_gap_at_s"] = None if stall_at is None else round(stall_at - (t_fault - t0), 3)
    m["measured_on"] = ("bytes placed by the mrc receiver (-i 0.01 intervals, aligned on the "
                        "first data packet on the wire); gap: end.mrc.longest_stall_seconds, "
                        "at: end.mrc.longest_stall_at_seconds")
    m["wire"] = wire
    m["bytes"] = cdoc.get("end", {}).get("sum_received", {}).get("bytes")
    summary = mrc_summary(cdoc)
    m.update({k: summary[k] for k in ("integrity", "retransmits", "retransmits_by_cause")})
    events = sdoc.get("end", {}).get("mrc", {}).get("events", [])
    events += cdoc.get("end", {}).get("mrc", {}).get("events", [])
    fault_rel = t_fault - t0
    m["events_after_fault"] = _event_digest(events, fault_rel)
    return m


def _event_digest(events: list[dict[str, Any]], fault_rel: float) -> dict[str, Any]:
    """Counts of mrc's events by kind, and when (s after the fault) each kind first came."""
    out: dict[str, Any] = {}
    for ev in events:
        t = float(ev.get("t", 0.0)) - fault_rel
        if t < -0.05:
            continue
        d = out.setdefault(ev.get("event", "?"), {"count": 0, "first_s": round(t, 3)})
        d["count"] += 1
        d["first_s"] = min(d["first_s"], round(t, 3))
    return out


def run_mrc_repeated(bed: Bed, seconds: float, plane: int, kind: str, after: float,
                     state: State, runner: Runner, extra: list[str], repeat: int,
                     say: Callable[[str], None]) -> dict[str, Any]:
    """`run_mrc` `repeat` times for fault `kind`; a run that fails is kept as its error and
    counts as a miss. The first successful run's full result carries every run's figures."""
    runs: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    for i in range(repeat):
        try:
            m = run_mrc(bed, seconds, plane, kind, after, state, runner, extra, i + 1)
        except ProcError as e:
            runs.append({"error": str(e)})
            say(f"  mrc {kind} run {i + 1}/{repeat} FAILED: {e}")
            continue
        finally:
            procs.kill_all()
        at = m["longest_gap_at_s"]
        runs.append({"longest_gap_s": m["longest_gap_s"], "longest_gap_at_s": at,
                     "fault_gap_s": m["fault_gap_s"], "retransmits": m["retransmits"],
                     "integrity": m["integrity"], "post_vs_3_of_4": m.get("post_vs_3_of_4")})
        where = "" if at is None else f" at {at:+.3f} s"
        say(f"  mrc {kind} run {i + 1}/{repeat}: longest gap {m['longest_gap_s'] * 1e3:.1f} ms"
            f"{where}, fault gap {m['fault_gap_s'] * 1e3:.1f} ms, integrity {m['integrity']}")
        if first is None:
            first = m
    if first is None:
        raise ProcError(f"all {repeat} mrc {kind} runs failed: {runs[-1]['error']}")
    first["fault"] = kind
    first["runs"] = runs
    first["runs_within_10ms"] = sum(
        1 for r in runs if "error" not in r and r["longest_gap_s"] <= GAP_GOAL_S)
    return first
