"""The trace collector (mrc/core/trace.py) as stories with explicit `now`: the shared rate limit
and its `suppressed` records, drops coalesced per reason, the EV timeline's bound, and, in the
simulator, an EV retired by a dead switch, probed and restored."""

from __future__ import annotations

import random

from mrc.core.config import SessionConfig
from mrc.core.memory import RegionTable
from mrc.core.paths.evs import EvSignal
from mrc.core.session import Session
from mrc.core.trace import TraceCollector, record_json
from mrc.experiments.scenarios import MiB, Transfer
from mrc.sim import LinkParams, Network, clos


def kinds(trace: TraceCollector, t0: float = 0.0) -> list[dict[str, object]]:
    return [record_json(r, t0) for r in trace.records()]


def connecting_session(trace: TraceCollector) -> Session:
    """A session still in its handshake, traced: it has counters, no EV table yet."""
    rng = random.Random(1)
    return Session.connect(
        SessionConfig(plane_mask=1),
        {0: ("::1", 4791)},
        b"",
        qpn=1,
        regions=RegionTable(rng),
        rng=rng,
        now=0.0,
        trace=trace,
    )


def test_retransmits_and_rtts_share_a_bucket_and_what_it_leaves_out_is_reported() -> None:
    trace = TraceCollector(records=True, records_per_second=4)
    # A burst of one second's worth goes through, the rest is counted.
    for psn in range(1, 7):
        trace.retransmit(psn, 0x01000005, 1, "rack", 0.0)
    # Half a second refills two tokens.
    for psn in (7, 8, 9):
        trace.retransmit(psn, 0x01000005, 1, "rto", 0.5)
    trace.rtt(1, 0x01000005, 0.000123, 0.5)
    trace.sample(0.5)
    assert trace.suppressed_total == 4
    out = kinds(trace)
    assert [r["psn"] for r in out if r["kind"] == "retransmit"] == [1, 2, 3, 4, 7, 8]
    assert out[-1] == {"t": 0.5, "kind": "suppressed", "counts": {"retransmit": 3, "rtt": 1}}
    # A quarter second: one token, taken by the RTT sample of another plane.
    trace.rtt(2, 0x02000007, 0.000250, 0.75)
    trace.retransmit(10, 0x02000007, 2, "nack_trimmed", 0.75)
    # The next suppressed record waits a whole second after the last one.
    trace.sample(1.0)
    assert kinds(trace) == [
        {"t": 0.75, "kind": "rtt", "plane": 2, "ev": 0x02000007, "rtt": 0.00025}
    ]
    trace.sample(1.5)
    assert kinds(trace) == [{"t": 1.5, "kind": "suppressed", "counts": {"retransmit": 1}}]
    assert trace.suppressed_total == 5
    trace.sample(3.0)
    assert kinds(trace) == []


def test_rtt_samples_are_thinned_to_one_per_plane_per_cc_period() -> None:
    trace = TraceCollector(records=True, cc_sample_seconds=0.01)
    for i in range(5):
        trace.rtt(0, 7, 0.001, 1.0 + i * 0.004)  # 1.000 1.004 1.008 1.012 1.016
    trace.rtt(1, 9, 0.002, 1.004)
    out = kinds(trace, t0=1.0)
    assert [(r["t"], r["plane"]) for r in out] == [(0.0, 0), (0.004, 1), (0.012, 0)]
    assert trace.suppressed_total == 0


def test_drops_are_coalesced_per_reason_and_a_left_out_count_waits_for_the_next_record() -> None:
    trace = TraceCollector(records=True, records_per_second=2)
    session = connecting_session(trace)
    drops = session.stats.drops_by_reason
    assert session.trace is trace and trace.timeline == []  # no EV table before the handshake
    drops["p_key"] += 3
    drops["decode_bth"] += 1
    session.sample_trace(0.01)
    assert kinds(trace) == [
        {"t": 0.01, "kind": "drop", "reason": "p_key", "count": 3},
        {"t": 0.01, "kind": "drop", "reason": "decode_bth", "count": 1},
    ]
    # The bucket is empty: this sample's drops wait (counted as left out) ...
    drops["p_key"] += 5
    session.sample_trace(0.02)
    assert trace.suppressed_total == 1
    # ... and the next record of the reason carries them all.
    drops["p_key"] += 2
    session.sample_trace(0.6)
    assert kinds(trace) == [
        {"t": 0.02, "kind": "suppressed", "counts": {"drop": 1}},
        {"t": 0.6, "kind": "drop", "reason": "p_key", "count": 7},
    ]
    session.sample_trace(0.7)
    assert kinds(trace) == []


def test_faults_are_recorded_when_their_time_comes_and_records_stay_in_time_order() -> None:
    trace = TraceCollector(records=True)
    trace.fault(2, "plane-down injected at 0.5 s", 10.5)
    trace.sample(10.2)
    trace.retransmit(1, 5, 0, "rto", 10.52)
    trace.sample(10.53)
    assert kinds(trace, t0=10.0) == [
        {"t": 0.5, "kind": "fault", "plane": 2, "detail": "plane-down injected at 0.5 s"},
        {"t": 0.52, "kind": "retransmit", "psn": 1, "ev": 5, "plane": 0, "cause": "rto"},
    ]


def established(trace: TraceCollector) -> Session:
    """A one-plane session with 4 active EVs and 2 backups, traced from its handshake on
    (handed the collector when built: the timeline starts when it is established)."""
    net = Network(seed=3)
    a, b = net.pair(1, LinkParams(rate_bps=1e9, latency=5e-6, queue_bytes=1 << 20))
    cfg = SessionConfig(plane_mask=1, ev_per_plane=4, ev_backup_per_plane=2)
    b.listen(cfg, accept=lambda _pd: b"")
    session = a.connect(b, cfg, trace=trace)
    net.drive(0.001)
    return session


def test_ecn_and_trims_skip_an_ev_until_the_rotation_passes_it() -> None:
    trace = TraceCollector()
    session = established(trace)
    evs = session.paths.evs
    ev = evs.planes[0].active[1].ev
    start = len(trace.timeline)
    assert evs.signal(ev, EvSignal.ECN, now=0.01, seq=1)
    assert not evs.signal(ev, EvSignal.ECN, now=0.02, seq=2)  # skipped already: no record
    for now in (0.03, 0.04):  # two skips owed, used up by two passes of the rotation
        evs.pass_over(ev, now=now)
    assert evs.signal(ev, EvSignal.TRIMMED, now=0.05, seq=3)
    assert trace.ev_timeline(0.0)[start:] == [
        {"t": 0.01, "ev": ev, "plane": 0, "state": "skip", "reason": "ecn"},
        {"t": 0.04, "ev": ev, "plane": 0, "state": "good", "reason": "rotated"},
        {"t": 0.05, "ev": ev, "plane": 0, "state": "skip", "reason": "trimmed"},
    ]


def test_the_timeline_starts_with_every_ev_and_stops_at_its_bound() -> None:
    trace = TraceCollector(records=True, cc_sample_seconds=0.01, timeline_max=8)
    session = established(trace)
    evs = session.paths.evs
    start = [(r.ev, "good") for r in evs.planes[0].active]
    start += [(r.ev, "backup") for r in evs.planes[0].backups]
    assert sorted((ev, state) for _, ev, _, state, _ in trace.timeline) == sorted(start)
    assert all(reason == "start" for *_, reason in trace.timeline)
    # A loss retires an active EV; a backup takes its place: two records, the bound reached.
    victim = evs.planes[0].active[0]
    backups = list(evs.planes[0].backups)
    assert evs.signal(victim.ev, EvSignal.LOSS, now=0.002, seq=1, reason="timeout")
    (promoted,) = [r for r in backups if r.active]
    t0 = 0.0015
    assert trace.ev_timeline(t0)[6:] == [
        {"t": 0.0005, "ev": victim.ev, "plane": 0, "state": "retired", "reason": "timeout"},
        {"t": 0.0005, "ev": promoted.ev, "plane": 0, "state": "good", "reason": ""},
    ]
    assert not trace.timeline_truncated
    # Past the bound nothing more is kept, and the timeline says it was cut.
    other = evs.planes[0].active[0]
    assert evs.signal(other.ev, EvSignal.LOSS, now=0.003, seq=2, reason="loss")
    assert len(trace.timeline) == 8 and trace.timeline_truncated
    # The trace records hold the same ev records, then the congestion sample of the plane.
    session.sample_trace(0.004)
    out = kinds(trace, t0)
    assert [r for r in out if r["kind"] == "ev"] == [
        {"kind": "ev", **r} for r in trace.ev_timeline(t0)
    ]
    (cc,) = [r for r in out if r["kind"] == "cc"]
    assert cc["plane"] == 0 and cc["bytes_sent"] == session.stats.plane(0).bytes_sent
    # The plane's own cap (NSCC's plane queue guard), the window of the plane.
    assert cc["in_flight"] == 0 and cc["cwnd"] == round(session.cc.plane_window(0) or 0) > 0
    # Detached, the session records nothing more.
    trace.detach()
    session.sample_trace(0.0045)
    assert kinds(trace, t0) == []
    trace.timeline_truncated = False
    trace.timeline_max = 100
    assert evs.signal(evs.planes[0].active[0].ev, EvSignal.LOSS, now=0.005, seq=3)
    assert len(trace.timeline) == 8


def test_evs_behind_a_dead_switch_are_retired_probed_and_restored_in_the_timeline() -> None:
    """Tier-1 switch #2 of plane 1 dies at 10 ms and returns at 300 ms: each EV through it
    shows good -> retired -> probing (unanswered) -> retired (answered) -> probing -> ... ->
    good, and a backup that stood in goes back to the pool."""
    net = Network(1)
    link = LinkParams(rate_bps=1e9, latency=2e-6, queue_bytes=4 << 20)
    fab = clos(net, planes=4, racks=2, hosts_per_rack=1, tier1=4, host_link=link)
    h0, h1 = fab.hosts
    cfg = SessionConfig(
        plane_mask=15,
        max_inflight=64,
        cc="none",
        cc_min_base_rtt=0.0,
        min_rto=0.002,
        plane_paths=fab.plane_paths,
    )
    dead = fab.tier1[1][2]
    fab.set_switch(dead, False, at=0.010)
    fab.set_switch(dead, True, at=0.300)
    trace = TraceCollector()
    t = Transfer(net, h0, h1, cfg, 8 * MiB, MiB, trace=trace)
    net.drive_until(t.done, timeout=10)
    net.drive(2.8)
    assert t.done()
    history: dict[int, list[tuple[float, str, str]]] = {}
    for now, ev, _plane, state, reason in trace.timeline:
        history.setdefault(ev, []).append((now, state, reason))
    assert len(trace.timeline) >= 64 + 64  # every EV's start, 16 active and 16 backups a plane
    through = [ev for ev, h in history.items() if h[0][1] == "good" and fab.tier1_of(ev) is dead]
    assert len(through) == 4
    for ev in through:
        h = history[ev]
        assert [(s, r) for _, s, r in h] == [
            ("good", "start"),
            ("retired", "timeout"),
            ("probing", "probe"),
            ("retired", ""),
            ("probing", "probe"),
            ("retired", ""),
            ("probing", "probe"),
            ("good", "restored"),
        ]
        assert 0.010 < h[1][0] < 0.020  # retired within two RTOs of the death
        assert 0.300 < h[3][0] < h[-1][0] < 0.400  # answered once the switch is back
        assert [n for n, _, _ in h] == sorted(n for n, _, _ in h)
    # Only plane 1 changed, and each EV's last record is its state now.
    changed = {ev for ev, h in history.items() if len(h) > 1}
    assert all(ev >> 24 == 1 for ev in changed)
    assert {ev: h[-1][1] for ev, h in history.items()} == {
        r.ev: ("good" if r.active else "backup") for r in t.session.paths.evs.by_ev.values()
    }
