"""Spray policies: equal plane shares, skips, REPS recycling and freeze."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from mrc.core.config import SessionConfig
from mrc.core.errors import LocalProtocolError
from mrc.core.paths.evs import EvSignal, EvState
from mrc.core.paths.planes import PlaneTable, ev_plane
from mrc.core.paths.spray import REPS_EXPLORE, make_spray, shuffle, spray_names

CONFIG = SessionConfig(plane_mask=0b1111, ev_per_plane=8)


@pytest.mark.parametrize("name", ["oblivious", "bitmap", "reps"])
def test_planes_carry_equal_shares(name: str) -> None:
    paths = PlaneTable(CONFIG, random.Random(3))
    spray = make_spray(name, paths, random.Random(4))
    planes = Counter(ev_plane(spray.next_ev(0.0) or -1) for _ in range(3200))
    assert planes == {0: 800, 1: 800, 2: 800, 3: 800}


def test_oblivious_uses_every_ev_once_per_round() -> None:
    paths = PlaneTable(CONFIG, random.Random(3))
    spray = make_spray("oblivious", paths, random.Random(4))
    for _ in range(3):
        picked = [spray.next_ev(0.0) for _ in range(32)]
        assert sorted(e for e in picked if e is not None) == sorted(
            ev for evs in paths.active_evs().values() for ev in evs
        )


def test_oblivious_passes_a_skip_ev_over_for_one_rotation() -> None:
    paths = PlaneTable(CONFIG, random.Random(3))
    spray = make_spray("oblivious", paths, random.Random(4))
    skipped = paths.evs.rotation(1)[0]
    paths.evs.signal(skipped, EvSignal.TRIMMED, now=0.0, seq=1)
    first = [spray.next_ev(0.0) for _ in range(31)]
    assert skipped not in first
    assert paths.evs.state_of(skipped) is EvState.GOOD
    second = [spray.next_ev(0.0) for _ in range(32)]
    assert skipped in second


def test_bitmap_skips_an_ev_as_many_rounds_as_its_counter() -> None:
    paths = PlaneTable(CONFIG, random.Random(3))
    spray = make_spray("bitmap", paths, random.Random(4))
    ev = paths.evs.rotation(2)[0]
    paths.evs.signal(ev, EvSignal.TRIMMED, now=0.0, seq=1)  # +4
    uses = []
    for _ in range(6):
        uses.append(sum(spray.next_ev(0.0) == ev for _ in range(31)))
    # Four rounds skipped (31 picks per round while it is skipped), then used again.
    assert uses[:4] == [0, 0, 0, 0] and sum(uses[4:]) >= 1
    assert paths.evs.state_of(ev) is EvState.GOOD


def test_a_retired_ev_leaves_every_policy_at_once() -> None:
    for name in spray_names():
        paths = PlaneTable(CONFIG, random.Random(3))
        spray = make_spray(name, paths, random.Random(4))
        dead = paths.evs.rotation(0)[0]
        spray.on_acked([dead], None, 0.0)
        paths.evs.signal(dead, EvSignal.LOSS, now=0.0, seq=1)
        assert all(spray.next_ev(0.0) != dead for _ in range(500)), name


def test_reps_reuses_clean_evs_and_freezes_after_a_loss() -> None:
    paths = PlaneTable(CONFIG, random.Random(3))
    spray = make_spray("reps", paths, random.Random(4))
    good = paths.evs.rotation(0)[:3]
    marked = paths.evs.rotation(1)[0]
    spray.on_acked([*good, marked], marked, now=0.0)
    # Recycled EVs come back oldest first; the ECN-marked one is not recycled.
    assert [spray.next_ev(0.0) for _ in range(3)] == good
    spray.on_acked(good[:1], None, now=0.001)
    spray.on_loss(good[1], now=0.002)
    # Frozen for 10 ms: only the known-good EV, random when none is left.
    assert spray.next_ev(0.003) == good[0]
    # After the freeze: explore REPS_EXPLORE random EVs even though one is recycled.
    spray.on_acked(good[2:], None, now=0.004)
    explored = [spray.next_ev(0.013) for _ in range(REPS_EXPLORE)]
    assert len(set(explored)) > 4
    assert Counter(ev_plane(e or 0) for e in explored) == {0: 4, 1: 4, 2: 4, 3: 4}


def test_unknown_policy_is_a_clear_error() -> None:
    paths = PlaneTable(CONFIG, random.Random(3))
    with pytest.raises(LocalProtocolError, match=r"unknown spray policy 'fast'.*bitmap"):
        make_spray("fast", paths, random.Random(0))


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 16, 17, 64, 1000])
def test_shuffle_is_the_standard_librarys_permutation(size: int) -> None:
    # Same seed, same permutation and same generator state after: seeded runs stay the same.
    for seed in range(20):
        ours, theirs = random.Random(seed), random.Random(seed)
        a, b = list(range(size)), list(range(size))
        shuffle(ours, a)
        theirs.shuffle(b)
        assert a == b
        assert ours.getstate() == theirs.getstate()
