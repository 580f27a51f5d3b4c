"""NSCC's plane queue guard (mrc/core/cc/planeq.py): stories with explicit time and samples.

Four planes are sampled every 100 µs. Plane 3 is the slow one when a story needs one: its
RTT climbs above the others' while they stay flat, as behind a tbf queue that marks nothing.
"""

from __future__ import annotations

from itertools import pairwise

import pytest

from mrc.core.cc.planeq import BOUNDED_FOR, GROW, INITIAL_CAP, PlaneQueues

MTU = 4096
MS = 1e-3


def feed(
    pq: PlaneQueues, t: float, until: float, rtts: dict[int, float], acked: int = MTU,
    inflight: int = 256 * 1024,
) -> float:
    """Every plane gets one sample every 100 µs from `t` to `until`; returns `until`."""
    while t < until:
        for plane, rtt in rtts.items():
            pq.on_sample(plane, rtt, acked, inflight, t)
        t += 100e-6
    return until


def test_every_plane_starts_at_one_flowcell_and_grows_while_it_shows_no_queue() -> None:
    pq = PlaneQueues(MTU, queue_min=1 * MS)
    assert pq.window(0) == INITIAL_CAP
    pq.on_sample(0, 0.5 * MS, 8 * MTU, 0, now=0.0)
    # The first sample sets the base; no queue of its own: half the acknowledged bytes added.
    assert pq.window(0) == INITIAL_CAP + GROW * 8 * MTU


def test_a_delay_every_plane_shares_caps_no_plane() -> None:
    pq = PlaneQueues(MTU, queue_min=1 * MS)
    t = feed(pq, 0.0, 0.01, dict.fromkeys(range(4), 0.5 * MS))
    before = pq.caps()
    # A busy host: every plane's RTT grows by 5 ms at once.
    feed(pq, t, 0.05, dict.fromkeys(range(4), 5.5 * MS))
    after = pq.caps()
    assert all(after[p] > before[p] for p in range(4))


def test_a_plane_that_queues_on_its_own_is_cut_to_its_pipe_and_the_others_are_not() -> None:
    pq = PlaneQueues(MTU, queue_min=1 * MS)
    t = feed(pq, 0.0, 0.02, dict.fromkeys(range(4), 0.5 * MS))
    grown = pq.caps()
    # Plane 3's queue builds: 4 ms above its base while the others stay at their base.
    t = feed(pq, t, 0.04, {0: 0.5 * MS, 1: 0.5 * MS, 2: 0.5 * MS, 3: 4.5 * MS})
    caps = pq.caps()
    assert caps[3] < grown[3]
    assert all(caps[p] > grown[p] for p in range(3))
    # Its pipe: it delivered MTU per 100 µs (≈41 MB/s) over 0.5 ms base + 1 ms threshold.
    rate = MTU / 100e-6
    assert caps[3] == pytest.approx(rate * 1.5 * MS, rel=0.15)


def test_after_a_decrease_the_cap_stays_near_the_pipe_then_is_free() -> None:
    pq = PlaneQueues(MTU, queue_min=1 * MS)
    t = feed(pq, 0.0, 0.02, dict.fromkeys(range(4), 0.5 * MS))
    t = feed(pq, t, 0.03, {0: 0.5 * MS, 1: 0.5 * MS, 2: 0.5 * MS, 3: 4.5 * MS})
    # The queue drains: plane 3 is back at its base; its cap grows, but only to 1.5 × pipe
    # (≈41 MB/s × 1.5 ms ≈ 61 KB → ≈92 KB) while the decrease is recent.
    t = feed(pq, t, 0.06, dict.fromkeys(range(4), 0.5 * MS))
    bounded = pq.window(3)
    assert 1.3 * 61_000 < bounded < 1.6 * 61_000
    # 100 smoothed RTTs later the bound is lifted and the cap grows on.
    feed(pq, t, 0.03 + BOUNDED_FOR * 0.5 * MS + 0.04, dict.fromkeys(range(4), 0.5 * MS))
    assert pq.window(3) > 4 * bounded



def test_after_an_overflow_the_cap_grows_by_one_mtu_per_cap_not_by_slow_start() -> None:
    pq = PlaneQueues(MTU, queue_min=1 * MS)
    t = feed(pq, 0.0, 0.02, dict.fromkeys(range(4), 0.5 * MS))
    # t = 20 ms: plane 3's own qdisc refuses a transmit; the cap drops to its pipe (≈61 KB).
    pq.on_overflow(3, inflight=256 * 1024, now=t)
    cut = pq.window(3)
    assert 0.85 * 61_000 < cut < 1.15 * 61_000
    # 20-25 ms: no plane shows a queue. Slow start would add half of each MTU acknowledged
    # (50 samples: ≈100 KB, up to the 1.5 × pipe bound); above the threshold the decrease
    # left, each sample adds MTU × MTU / cap.
    for i in range(50):
        for plane in range(4):
            pq.on_sample(plane, 0.5 * MS, MTU, 256 * 1024, t + i * 100e-6)
    additive = cut
    for _ in range(50):
        additive += MTU * MTU / additive
    assert pq.window(3) == pytest.approx(additive, rel=1e-9)


def test_a_decrease_for_delay_leaves_the_slow_start_on() -> None:
    pq = PlaneQueues(MTU, queue_min=1 * MS)
    t = feed(pq, 0.0, 0.02, dict.fromkeys(range(4), 0.5 * MS))
    t = feed(pq, t, 0.03, {0: 0.5 * MS, 1: 0.5 * MS, 2: 0.5 * MS, 3: 4.5 * MS})
    cut = pq.window(3)
    # 30 ms on: the queue drained. Once plane 3's excess decays below half the threshold its
    # cap grows by half of each MTU acknowledged again (a delay is no overflow), up to the
    # 1.5 × pipe bound.
    caps = [cut]
    for i in range(100):
        for plane in range(4):
            pq.on_sample(plane, 0.5 * MS, MTU, 256 * 1024, t + i * 100e-6)
        caps.append(pq.window(3))
    steps = [b - a for a, b in pairwise(caps)]
    assert steps.count(GROW * MTU) >= 5
    assert caps[-1] > 1.4 * cut


def test_a_plane_found_silent_restarts_at_the_first_cap_and_grows_again_when_it_answers() -> None:
    """A dead plane sends no RTT samples, so nothing else would shrink its cap: the sender's
    `on_plane_silent` (its RTO or the closed-window resend found it silent) restarts it."""
    pq = PlaneQueues(MTU, queue_min=1 * MS)
    t = feed(pq, 0.0, 5 * MS, {0: 0.5 * MS, 1: 0.5 * MS})
    grown = pq.window(1)
    assert pq.window(0) == grown > 2 * INITIAL_CAP
    pq.restart(0)
    assert pq.window(0) == INITIAL_CAP
    assert pq.window(1) == grown  # the other plane keeps its cap
    # Back and answering without a queue of its own: slow start again.
    pq.on_sample(0, 0.5 * MS, 8 * MTU, 0, now=t)
    assert pq.window(0) == INITIAL_CAP + GROW * 8 * MTU


def test_planes_never_sampled_do_not_indict_the_live_one() -> None:
    """Four planes; 1-3 never answered (their caps were asked for, no sample ever came).
    Plane 0's RTT rises from 1 ms to 3 ms over 200 samples 1 ms apart (a busy host's
    queues, which the planes would all share if they had samples): with no other plane to
    compare with it has no delay of its own, and its cap keeps growing as a single plane's
    does. Before: the zero delay of the dead planes made all of it plane 0's own, and its cap
    fell to two MTUs (8 KiB), 0.25-0.4x a one-plane run's goodput on loopback."""
    q = PlaneQueues(MTU, queue_min=0.0005)
    for p in range(4):
        q.window(p)
    for k in range(200):
        rtt = 0.001 + 0.002 * min(k, 100) / 100
        q.on_sample(0, rtt, acked=MTU, inflight=int(q.window(0)), now=k * 0.001)
    assert q.own_delay(0) == 0.0
    assert q.window(0) > 65536
