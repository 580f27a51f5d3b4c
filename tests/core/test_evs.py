"""The EV table: selectors per path, the state table, retirement, backups, the floor, probing."""

from __future__ import annotations

import random
from collections import Counter, deque

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import Event, PathRestored, PathRetired
from mrc.core.paths.evs import (
    PENALTY_MAX,
    TRANSITIONS,
    EvSignal,
    EvState,
    EvTable,
    ev_plane,
)

FOUR_PLANES = SessionConfig(plane_mask=0b1111, ev_per_plane=16, plane_paths=(4, 4, 4, 4))


def table(config: SessionConfig = FOUR_PLANES) -> tuple[EvTable, deque[Event]]:
    events: deque[Event] = deque()
    return EvTable(config, random.Random(7), events), events


def test_every_path_of_every_plane_gets_an_equal_share_of_active_and_backup_evs() -> None:
    t, _ = table()
    assert len(t.by_ev) == 4 * 32
    for plane, pe in t.planes.items():
        assert len(pe.active) == 16 and len(pe.backups) == 16
        assert all(ev_plane(r.ev) == plane for r in pe.active)
        assert Counter(r.path for r in pe.active) == {0: 4, 1: 4, 2: 4, 3: 4}
        assert Counter(r.path for r in pe.backups) == {0: 4, 1: 4, 2: 4, 3: 4}
        # The path is the selector modulo the plane's path count (docs/DESIGN.md §4).
        assert all((r.ev & 0xFFFFFF) % 4 == r.path for r in pe.active)


def test_selectors_are_random_per_connection_but_reproducible_from_the_seed() -> None:
    a = EvTable(FOUR_PLANES, random.Random(1), deque())
    b = EvTable(FOUR_PLANES, random.Random(1), deque())
    c = EvTable(FOUR_PLANES, random.Random(2), deque())
    assert list(a.by_ev) == list(b.by_ev)
    assert list(a.by_ev) != list(c.by_ev)


def test_each_connections_active_evs_start_at_its_own_path_offset() -> None:
    """16 active EVs on a plane of 32 paths (docs/DESIGN.md §4): 16 consecutive paths from an
    offset of the connection's own, so many connections cover every path."""
    config = SessionConfig(plane_mask=0b1, ev_per_plane=16, plane_paths=(32,))

    def active_paths(seed: int) -> list[int]:
        t = EvTable(config, random.Random(seed), deque())
        return [r.path for r in t.planes[0].active]

    runs = {seed: active_paths(seed) for seed in range(40)}
    assert runs[3] == active_paths(3)
    starts = Counter(paths[0] for paths in runs.values())
    # Each table's active EVs run over 16 consecutive paths from its own start ...
    for paths in runs.values():
        assert paths == [(paths[0] + i) % 32 for i in range(16)]
    # ... and the starts of 40 connections are spread over the plane, not all at path 0.
    assert len(starts) >= 16 and max(starts.values()) <= 5


def test_a_loss_retires_the_ev_and_a_backup_on_another_path_takes_its_place() -> None:
    t, events = table()
    pe = t.planes[1]
    victim = pe.active[0]
    before = t.version
    assert t.signal(victim.ev, EvSignal.LOSS, now=1.0, seq=100, sent_seq=50)
    assert victim.state is EvState.ASSUMED_BAD and not victim.active
    assert victim.times_retired == 1 and victim.retired_at == 1.0
    assert len(pe.active) == 16 and victim.ev not in t.rotation(1)
    # The replacement sits on a path with no retired EV: not on the dead one.
    replacement = pe.active[-1]
    assert replacement.path != victim.path
    assert t.version == before + 1
    assert list(events) == [PathRetired(ev=victim.ev, plane=1, reason="loss")]
    # Its first probe is due 10 ms later.
    assert victim.probe_due == pytest.approx(1.010)
    assert t.probes_changed


def test_a_loss_about_a_packet_sent_before_the_last_state_change_is_ignored() -> None:
    t, events = table()
    rec = t.planes[0].active[0]
    assert t.signal(rec.ev, EvSignal.ECN, now=1.0, seq=200, sent_seq=150)
    assert rec.state is EvState.SKIP and rec.changed_seq == 200
    # This packet left before the EV went to SKIP: it says nothing about the EV now.
    assert not t.signal(rec.ev, EvSignal.LOSS, now=1.1, seq=210, sent_seq=199)
    assert rec.state is EvState.SKIP and not events
    assert t.signal(rec.ev, EvSignal.LOSS, now=1.2, seq=220, sent_seq=201)
    assert rec.state is EvState.ASSUMED_BAD


def test_at_the_floor_losses_stop_retiring_and_the_plane_is_handed_to_probing() -> None:
    config = SessionConfig(plane_mask=0b1, ev_per_plane=8, ev_backup_per_plane=0)
    floors: list[tuple[int, float]] = []
    t, events = table(config)
    t.on_floor = lambda plane, now: floors.append((plane, now))
    assert t.min_active == 2
    evs = t.rotation(0)
    for i, ev in enumerate(evs[:6]):
        assert t.signal(ev, EvSignal.LOSS, now=1.0 + i, seq=10 + i, sent_seq=1)
    assert len(t.rotation(0)) == 2 and len(events) == 6
    # The seventh loss lands on a floor EV: it keeps carrying data, skipped for a while.
    last = evs[6]
    assert not t.signal(last, EvSignal.LOSS, now=9.0, seq=30, sent_seq=20)
    rec = t.by_ev[last]
    assert rec.state is EvState.GOOD and rec.active and rec.penalty == PENALTY_MAX
    assert floors == [(0, 9.0)] and t.planes[0].at_floor
    assert len(events) == 6


def test_ecn_and_trims_set_skip_counters_that_the_rotation_uses_up() -> None:
    t, _ = table()
    rec = t.planes[2].active[3]
    t.signal(rec.ev, EvSignal.ECN, now=0.0, seq=1)
    assert rec.state is EvState.SKIP and rec.penalty == 1
    t.signal(rec.ev, EvSignal.TRIMMED, now=0.0, seq=2)
    assert rec.state is EvState.SKIP and rec.penalty == 5
    for _ in range(4):
        t.pass_over(rec.ev, now=0.0)
    assert rec.state is EvState.SKIP and rec.penalty == 1
    t.pass_over(rec.ev, now=0.0)
    assert rec.state is EvState.GOOD and rec.penalty == 0
    # A SKIP EV stays in the rotation: only the policy passes over it.
    assert rec.ev in t.rotation(2)


def test_probes_back_off_until_answered_then_three_clean_answers_restore() -> None:
    t, events = table()
    rec = t.planes[0].active[0]
    t.signal(rec.ev, EvSignal.LOSS, now=0.0, seq=5, sent_seq=1)
    events.clear()
    # Unanswered probes: 10 ms, 20 ms, 40 ms apart.
    t.probe_sent(rec, 1, now=0.010)
    assert rec.probe_due == pytest.approx(0.020)
    t.probe_sent(rec, 2, now=0.020)
    assert rec.probe_due == pytest.approx(0.040)
    t.probe_sent(rec, 3, now=0.040)
    assert rec.probe_due == pytest.approx(0.080)
    # A stale answer (probe 2) is ignored; the answer to probe 3 counts.
    t.probe_answered(rec.ev, 2, True, now=0.041, seq=9)
    assert rec.clean == 0
    t.probe_answered(rec.ev, 3, True, now=0.041, seq=9)
    assert rec.clean == 1 and rec.probe_due == pytest.approx(0.051)
    # A congested answer is not clean: the count starts over.
    t.probe_sent(rec, 4, now=0.051)
    t.probe_answered(rec.ev, 4, False, now=0.052, seq=9)
    assert rec.clean == 0
    for i, now in ((5, 0.062), (6, 0.072), (7, 0.082)):
        t.probe_sent(rec, i, now=now)
        t.probe_answered(rec.ev, i, True, now=now + 0.001, seq=10)
    assert rec.state is EvState.GOOD
    assert list(events) == [PathRestored(ev=rec.ev, plane=0)]
    assert rec.seconds_retired == pytest.approx(0.083)
    # Back in the active set, in place of the stand-in on another path (next test).
    assert rec.active and rec.ev in t.rotation(0)
    assert Counter(r.path for r in t.planes[0].active) == {0: 4, 1: 4, 2: 4, 3: 4}


def test_restored_evs_take_their_paths_share_back_from_the_stand_ins() -> None:
    t, _ = table()
    pe = t.planes[2]
    # t = 0: two losses on path 0 retire two of its EVs; backups on other paths stand in.
    dead = [r for r in pe.active if r.path == 0][:2]
    for rec in dead:
        t.signal(rec.ev, EvSignal.LOSS, now=0.0, seq=10, sent_seq=1)
    shares = Counter(r.path for r in pe.active)
    assert shares[0] == 2 and sum(shares.values()) == 16
    stand_ins = [r for r in pe.active[-2:]]
    assert all(r.path != 0 for r in stand_ins)
    # t = 0.5: the first comes back; the latest stand-in on the fullest path steps down.
    version = t.version
    t.signal(dead[0].ev, EvSignal.RESTORED, now=0.5, seq=20)
    assert dead[0].active and t.version == version + 1
    assert Counter(r.path for r in pe.active)[0] == 3
    # t = 0.6: the second comes back and path 0 holds its four again.
    t.signal(dead[1].ev, EvSignal.RESTORED, now=0.6, seq=21)
    assert Counter(r.path for r in pe.active) == {0: 4, 1: 4, 2: 4, 3: 4}
    assert all(not r.active and r in pe.backups for r in stand_ins)
    assert len(pe.active) == 16 and len(pe.backups) == 16


def test_the_state_table_matches_mrc() -> None:
    g, s, b, d = EvState.GOOD, EvState.SKIP, EvState.ASSUMED_BAD, EvState.DENIED
    assert TRANSITIONS[(g, EvSignal.ECN)] is s
    assert TRANSITIONS[(g, EvSignal.ALWAYS_SKIP)] is b
    assert TRANSITIONS[(s, EvSignal.ROTATED)] is g
    assert TRANSITIONS[(b, EvSignal.RESTORED)] is g
    assert TRANSITIONS[(d, EvSignal.ALLOW)] is g
    assert (b, EvSignal.ECN) not in TRANSITIONS  # a retired EV carries nothing to mark
    assert (d, EvSignal.LOSS) not in TRANSITIONS


def test_deny_takes_an_ev_out_for_good_and_allow_brings_it_back() -> None:
    t, _ = table()
    rec = t.planes[3].active[0]
    assert t.signal(rec.ev, EvSignal.DENY, now=0.0, seq=1)
    assert rec.state is EvState.DENIED and rec.ev not in t.rotation(3)
    assert len(t.planes[3].active) == 16
    assert not t.signal(rec.ev, EvSignal.LOSS, now=0.0, seq=2)
    assert t.signal(rec.ev, EvSignal.ALLOW, now=0.0, seq=3)
    # A backup on its own path stood in (a denial says nothing about the path), so the
    # paths kept their shares and the allowed EV waits in the backups.
    assert rec.state is EvState.GOOD and rec in t.planes[3].backups
    assert Counter(r.path for r in t.planes[3].active) == {0: 4, 1: 4, 2: 4, 3: 4}


def test_report_rows() -> None:
    t, _ = table(SessionConfig(plane_mask=0b1, ev_per_plane=4, plane_paths=(2,)))
    a, b = t.rotation(0)[:2]
    t.count_sent(a, rtx=False)
    t.count_sent(a, rtx=True)
    t.signal(b, EvSignal.LOSS, now=1.0, seq=1)
    rows = {r["ev"]: r for r in t.report(now=1.5)}
    assert rows[a] == {
        "ev": a,
        "plane": 0,
        "path": t.by_ev[a].path,
        "state": "good",
        "packets_sent": 2,
        "retransmits": 1,
        "times_retired": 0,
        "seconds_retired": 0.0,
    }
    assert rows[b]["state"] == "assumed_bad" and rows[b]["seconds_retired"] == 0.5
    assert len(rows) == 5  # four active (one a replacement) and the retired one
