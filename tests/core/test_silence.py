"""Stories of a plane suspected silent (mrc/core/loss/silence.py, docs/DESIGN.md §6), in explicit
time.

Four planes with an SRTT of 5 ms each (so a reordering window of 1.25 ms and an RTO of
8 ms); plane 0's last flowcell left at t = 1.000 s and its last acknowledgement came at
0.999 s. The sender's FIFOs of flowcells are built by hand: one flowcell per entry.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from mrc.core.config import SessionConfig
from mrc.core.loss.silence import SilentPlanes, closed_on_silent
from mrc.core.paths.planes import Plane, RttEstimator
from mrc.core.send.records import SentCell

SRTT = 0.005
T0 = 1.000


def plane(n: int, *, acked_at: float, answered_sent_at: float) -> Plane:
    rtt = RttEstimator(min_rto=0.005, max_rto=1.0, rto=0.1)
    rtt.sample(SRTT)  # srtt 5 ms, rttvar 2.5 ms
    rtt.sample(SRTT)  # rttvar 1.875 ms: rto = 5 + 4 × 1.875 = 12.5 ms
    pl = Plane(number=n, rtt=rtt)
    pl.acked_at, pl.answered_sent_at = acked_at, answered_sent_at
    return pl


def cell(plane: int, sent_at: float, seq: int) -> SentCell:
    """One flowcell of 4 packets of 4096 bytes, all in flight."""
    return SentCell(psn=seq * 4, n=4, runs=[], ev=plane + 100, plane=plane, sent_at=sent_at,
                    seq=seq, tx_ts=0, rtx=False, size=4096, last=4096, open=4,
                    open_bytes=4 * 4096)  # fmt: skip


def network() -> tuple[dict[int, deque[SentCell]], dict[int, Plane]]:
    """Plane 0 owes a flowcell sent at T0; planes 1-3 answered flowcells sent at T0 (the
    same burst) at 1.004 s and owe nothing."""
    fifos = {0: deque([cell(0, T0, 1)]), 1: deque(), 2: deque(), 3: deque()}
    planes = {0: plane(0, acked_at=0.999, answered_sent_at=0.996)}
    for n in (1, 2, 3):
        planes[n] = plane(n, acked_at=1.004, answered_sent_at=T0)
    return fifos, planes


def test_a_plane_silent_past_its_srtt_while_the_others_answered_is_suspected() -> None:
    fifos, planes = network()
    silent = SilentPlanes(reorder_min=0.001)
    # Due at T0 + 5 ms + 1.25 ms: before that, only when to look again.
    new, wake = silent.judge(fifos, planes, 1.006)
    assert new == [] and wake == pytest.approx(1.00625)
    assert silent.until == {}
    new, wake = silent.judge(fifos, planes, 1.00625)
    assert new == [0]
    # Suspected for four RTOs (4 x 12.5 ms), time for the plane monitor's probes to judge
    # it, unless it answers first; the next look is when that ends.
    assert silent.until == {0: pytest.approx(1.05625)}
    assert wake == pytest.approx(1.05625)
    # Suspected once: no second report while it lasts.
    assert silent.judge(fifos, planes, 1.010)[0] == []


def test_an_acknowledgement_on_the_plane_ends_its_suspicion_and_its_backoff() -> None:
    fifos, planes = network()
    silent = SilentPlanes(reorder_min=0.001)
    silent.judge(fifos, planes, 1.007)
    assert 0 in silent.until
    planes[0].acked_at = 1.008  # it only lagged
    fifos[0].clear()
    assert silent.judge(fifos, planes, 1.009) == ([], None)
    assert silent.until == {}


def test_a_plane_suspected_again_without_answering_is_left_alone_twice_as_long() -> None:
    fifos, planes = network()
    silent = SilentPlanes(reorder_min=0.001)
    silent.judge(fifos, planes, 1.007)
    assert silent.until[0] == pytest.approx(1.057)  # four RTOs
    # The suspicion ended unanswered, and the same silence suspects it again at once.
    assert silent.judge(fifos, planes, 1.057)[0] == [0]
    assert silent.until[0] == pytest.approx(1.057 + 8 * 0.0125)


def test_an_answered_probe_ends_a_suspicion() -> None:
    """The plane monitor probes a suspected plane (planes.py); its answer (the plane's
    `proven_at`) ends the suspicion at once, as an acknowledgement would."""
    fifos, planes = network()
    silent = SilentPlanes(reorder_min=0.001)
    silent.judge(fifos, planes, 1.007)
    assert 0 in silent.until
    assert silent.judge(fifos, planes, 1.009)[0] == [] and 0 in silent.until
    planes[0].proven_at = 1.0095
    assert silent.judge(fifos, planes, 1.010) == ([], pytest.approx(1.0095 + 0.00125))
    assert silent.until == {}


def test_every_plane_quiet_alike_is_a_stalled_peer_and_suspects_none() -> None:
    """Every plane owes a flowcell of the same burst and none has answered since: a peer
    that stopped reading. No plane speaks for it, so none is suspected however long."""
    fifos, planes = network()
    for n in (1, 2, 3):
        fifos[n].append(cell(n, T0, n + 1))
        planes[n].acked_at, planes[n].answered_sent_at = 0.999, 0.996
    silent = SilentPlanes(reorder_min=0.001)
    assert silent.judge(fifos, planes, 1.100) == ([], None)


def test_a_plane_read_late_after_the_peers_stall_counts_its_silence_from_the_stalls_end() -> None:
    """The peer stalled; its first acknowledgement after the stall came at 1.004 s
    (`resumed_at`). Plane 0, silent since 0.999 s, is given an RTO from then, not 1.25 ms."""
    fifos, planes = network()
    silent = SilentPlanes(reorder_min=0.001)
    new, wake = silent.judge(fifos, planes, 1.010, resumed_at=1.004)
    assert new == [] and wake == pytest.approx(1.004 + 0.0125)
    assert silent.judge(fifos, planes, 1.0165, resumed_at=1.004)[0] == [0]


def test_another_suspected_plane_does_not_speak_for_the_peer() -> None:
    """Planes 1-3 suspected (idle because they get nothing new): plane 0 stays unsuspected."""
    fifos, planes = network()
    silent = SilentPlanes(reorder_min=0.001)
    silent.until.update({1: 2.0, 2: 2.0, 3: 2.0})
    silent._since.update({1: 1.0, 2: 1.0, 3: 1.0})
    for n in (1, 2, 3):
        planes[n].acked_at = 0.9  # no acknowledgement since they were suspected
    assert silent.judge(fifos, planes, 1.010)[0] == []


def test_a_window_held_by_one_planes_flowcell_is_probed_after_two_srtts() -> None:
    """Plane 0 holds the whole window (one flowcell sent at T0); the other planes owe
    nothing and answered nothing sent as late: no evidence can come. The tail probe is due
    two SRTTs and a reordering window after T0, once until plane 0 answers again."""
    fifos, planes = network()
    for n in (1, 2, 3):
        planes[n].answered_sent_at = 0.996
    silent = SilentPlanes(reorder_min=0.001)
    assert silent.judge(fifos, planes, 1.0113) == ([], None)
    probe, wake = silent.tail_probe(fifos, planes, 1.011)
    assert probe is None and wake == pytest.approx(1.01125)
    probe, wake = silent.tail_probe(fifos, planes, 1.01125)
    assert probe is fifos[0][0] and wake is None
    assert silent.tail_probe(fifos, planes, 1.030) == (None, None)  # once
    planes[0].acked_at = 1.031
    assert silent.tail_probe(fifos, planes, 1.050)[0] is fifos[0][0]  # answered since


def test_no_tail_probe_while_two_planes_owe() -> None:
    fifos, planes = network()
    fifos[1].append(cell(1, T0, 2))
    silent = SilentPlanes(reorder_min=0.001)
    assert silent.tail_probe(fifos, planes, 1.100) == (None, None)


def test_a_plane_that_never_answered_is_expected_at_the_answering_planes_srtt() -> None:
    """Plane 0 never answered anything (no RTT sample, no acknowledgement, no probe answer):
    a peer address no one listens on. Its flowcell left at T0 with the others', which
    answered it at 1.004 s. With no SRTT of its own it is expected at theirs (5 ms): due at
    T0 + 5 ms + 1.25 ms, as a plane that had answered; suspected then for four RTOs of its
    own (the initial 100 ms). Before: never suspected (nothing known to expect), so only the
    RTO, 0.1 s after each send, judged it, round after round."""
    fifos, planes = network()
    planes[0] = Plane(number=0, rtt=RttEstimator(min_rto=0.005, max_rto=1.0, rto=0.1))
    silent = SilentPlanes(reorder_min=0.001)
    new, wake = silent.judge(fifos, planes, 1.006)
    assert new == [] and wake == pytest.approx(1.00625)
    new, wake = silent.judge(fifos, planes, 1.00625)
    assert new == [0]
    assert silent.until == {0: pytest.approx(1.00625 + 4 * 0.1)}
    # A plane with no sample that did answer (its acknowledgements covered only resends,
    # Karn) is not a never-answered plane: still nothing known to expect.
    other = Plane(number=0, rtt=RttEstimator(min_rto=0.005, max_rto=1.0, rto=0.1))
    other.acked_at = 0.990
    planes[0] = other
    assert SilentPlanes(reorder_min=0.001).judge(fifos, planes, 1.010) == ([], None)


def test_a_suspected_planes_bytes_do_not_hold_the_window_and_it_gets_no_new_flowcell() -> None:
    from mrc.core.cc.control import make_cc
    from mrc.core.paths.balance import make_balance
    from mrc.core.paths.planes import PlaneTable
    from mrc.core.paths.spray import make_spray
    from mrc.core.send.evchoice import EvChoice
    from mrc.core.send.inflight import InFlight

    config = SessionConfig(plane_mask=0b1111, cc="none")
    cc = make_cc("none", config)
    suspected: dict[int, float] = {}
    flight = InFlight(config, cc, {}, range(4), suspected)
    window = int(cc.window)
    flight.add(0, window - 4096)  # plane 0's bytes fill the window but one packet
    assert flight.room(0, 0) == 1
    suspected[0] = 2.0
    assert flight.room(0, 0) == window // 4096
    paths = PlaneTable(config, random.Random(3))
    spray = make_spray("bitmap", paths, random.Random(4))
    choice = EvChoice(paths, spray, make_balance("equal", paths), flight, suspected)
    assert not choice.plane_open(0) and choice.plane_open(1)


def test_a_closed_window_finds_its_plane_dead_a_reordering_window_past_the_last_answer() -> None:
    """The PSN window is closed on plane 0's flowcell. Planes 1-3 had packets sent after it
    answered (sent at 1.0001, the last answer at 1.004) and owe nothing: the peer has nothing
    else to read. Plane 0 silent 1.25 ms past that answer (a reordering window: ¼ SRTT) is
    dead to us, long before its RTO (12.5 ms after 1.000)."""
    fifos, planes = network()
    for n in (1, 2, 3):
        planes[n].answered_sent_at = T0 + 0.0001
    held = fifos[0][0]
    assert closed_on_silent(held, fifos, planes, 0.001, 1.005) == (False, pytest.approx(1.00525))
    assert closed_on_silent(held, fifos, planes, 0.001, 1.00525) == (True, None)
    # It answers after all (it only lagged): its silence counts from there.
    planes[0].acked_at = 1.0055
    assert closed_on_silent(held, fifos, planes, 0.001, 1.006) == (False, pytest.approx(1.00675))


def test_a_closed_window_judges_nothing_while_another_owes_or_nothing_later_answered() -> None:
    fifos, planes = network()
    held = fifos[0][0]
    # Only packets of the same burst answered elsewhere (sent at 1.000, not after): no
    # evidence, the tail probe's case.
    assert closed_on_silent(held, fifos, planes, 0.001, 1.100) == (False, None)
    for n in (1, 2, 3):
        planes[n].answered_sent_at = T0 + 0.0001
    # Plane 1 still owes a flowcell: its answer (or its own silence) comes first.
    fifos[1].append(cell(1, T0 + 0.0002, 2))
    assert closed_on_silent(held, fifos, planes, 0.001, 1.100) == (False, None)
