"""Plane balance: `equal` leaves planes to the spray rotation, `adaptive` follows delivery."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from mrc.core.config import SessionConfig
from mrc.core.errors import LocalProtocolError
from mrc.core.paths.balance import AdaptiveBalance, balance_names, make_balance
from mrc.core.paths.planes import PlaneState, PlaneTable, ev_plane
from mrc.core.paths.spray import make_spray

CONFIG = SessionConfig(plane_mask=0b1111, ev_per_plane=8)
PKT = 4096


def test_equal_leaves_the_plane_to_the_spray_rotation() -> None:
    paths = PlaneTable(CONFIG, random.Random(3))
    assert make_balance("equal", paths).next_plane(0.0) is None
    assert balance_names() == ["adaptive", "equal"]
    with pytest.raises(LocalProtocolError, match="unknown plane balance 'fast'"):
        make_balance("fast", paths)


def test_adaptive_starts_equal_and_a_plane_that_returns_starts_level() -> None:
    paths = PlaneTable(CONFIG, random.Random(3))
    bal = make_balance("adaptive", paths)
    first = Counter(bal.next_plane(0.0) for _ in range(400))
    assert first == {0: 100, 1: 100, 2: 100, 3: 100}
    # Plane 2 leaves for a while, then comes back: it does not get a burst of catch-up turns.
    paths.set_state(2, PlaneState.DOWN, "test")
    assert Counter(bal.next_plane(0.0) for _ in range(300)) == {0: 100, 1: 100, 3: 100}
    paths.set_state(2, PlaneState.UP)
    assert Counter(bal.next_plane(0.0) for _ in range(8)) == {0: 2, 1: 2, 2: 2, 3: 2}


def fluid(balance: AdaptiveBalance, capacity: list[float], seconds: float) -> list[float]:
    """Offer 4000 packets/s more than the planes can take, 1 ms steps: each plane delivers
    up to its capacity (packets/s) from its own FIFO, whose backlog delays it. Returns each
    plane's share of the packets sent in the last half."""
    base = 0.0005
    backlog = [0.0] * len(capacity)
    sent = Counter[int]()
    offered = sum(capacity) + 4000
    step = 0.001
    for i in range(int(seconds / step)):
        now = i * step
        for _ in range(round(offered * step)):
            p = balance.next_plane(now)
            assert p is not None
            backlog[p] += 1
            if now >= seconds / 2:
                sent[p] += 1
        for p, cap in enumerate(capacity):
            done = min(backlog[p], cap * step)
            backlog[p] -= done
            if done:
                balance.on_acked(p, int(done * PKT), base + backlog[p] / cap, now)
    total = sum(sent.values())
    return [sent[p] / total for p in range(len(capacity))]


def test_adaptive_weights_planes_by_what_they_deliver() -> None:
    """Planes of 1, 1, 1 and 0.25 (×30k packets/s): the slow plane's share settles near its
    capacity share (0.25 / 3.25 = 7.7 %) instead of the equal 25 % that would overflow it."""
    paths = PlaneTable(CONFIG, random.Random(3))
    bal = make_balance("adaptive", paths)
    assert isinstance(bal, AdaptiveBalance)
    shares = fluid(bal, [30_000, 30_000, 30_000, 7_500], 3.0)
    assert 0.05 <= shares[3] <= 0.10, shares
    assert all(0.28 <= s <= 0.33 for s in shares[:3]), shares
    reported = bal.shares()
    assert sum(reported.values()) == pytest.approx(1.0)
    assert reported[3] < 0.12


def test_next_ev_on_stays_on_the_plane_and_uses_each_of_its_evs_once_per_round() -> None:
    paths = PlaneTable(CONFIG, random.Random(3))
    for name in ("oblivious", "bitmap"):
        spray = make_spray(name, paths, random.Random(4))
        for _ in range(3):
            picked = [spray.next_ev_on(1, 0.0) for _ in range(8)]
            assert sorted(e for e in picked if e is not None) == sorted(paths.evs.rotation(1))
    reps = make_spray("reps", paths, random.Random(4))
    assert {ev_plane(reps.next_ev_on(3, 0.0) or -1) for _ in range(50)} == {3}
    # A clean EV of plane 3 is reused first; one of another plane is left for later.
    good3, good0 = paths.evs.rotation(3)[0], paths.evs.rotation(0)[0]
    reps.on_acked([good0, good3], None, 0.0)
    assert reps.next_ev_on(3, 0.0) == good3
    assert reps.next_ev_on(0, 0.0) == good0
    paths.set_state(3, PlaneState.DOWN, "test")
    assert make_spray("oblivious", paths, random.Random(4)).next_ev_on(3, 0.0) is None
