"""What an expired RTO concludes (mrc.core.loss.rto, docs/DESIGN.md §6), judged on its own in
explicit time: a later packet acknowledged on the plane is a loss; a plane silent for an RTO
while the peer answers elsewhere is dead; a lagging plane, answers still due elsewhere, or a
stall of our own are waited out; silence everywhere is one stall probe for the connection.

The planes and flowcells are test_silence's: an SRTT of 5 ms and an RTO of 12.5 ms each;
plane 0 owes a flowcell (send seq 1) sent at t = 1.000 s and last had an acknowledgement at
0.999 s.
"""

from __future__ import annotations

from collections import deque

import pytest
from test_silence import T0, network

from mrc.core.loss.rto import Expiry, PlaneAcks, RtoTimers, acked_later
from mrc.core.paths.planes import Plane
from mrc.core.send.records import SentCell
from mrc.core.timers import Timer, TimerTable

RTO = 0.0125
REORDER_MIN = 0.001


def _judge(
    rtos: RtoTimers, fifos: dict[int, deque[SentCell]], planes: dict[int, Plane],
    oldest: SentCell, *, top_seq: int, last_progress: float, now: float,
) -> tuple[Expiry, PlaneAcks | None]:  # fmt: skip
    """The verdict on plane 0's expired RTO."""
    return rtos.judge(
        0, oldest, fifos, planes, top_seq=top_seq, last_progress=last_progress,
        reorder_min=REORDER_MIN, now=now,
    )  # fmt: skip


def test_a_later_flowcell_acknowledged_on_the_plane_proves_the_old_one_lost() -> None:
    fifos, planes = network()
    (oldest,) = fifos[0]
    later = SentCell(psn=40, n=4, runs=[], ev=200, plane=0, sent_at=T0 + 0.001, seq=3,
                     tx_ts=0, rtx=False, size=4096, last=4096, open=0, open_bytes=0)  # fmt: skip
    later.acked = 0b1111
    fifos[0].append(later)
    verdict, here = _judge(RtoTimers(), fifos, planes, oldest, top_seq=3, last_progress=1.004,
                           now=T0 + RTO)  # fmt: skip
    # (top seq acknowledged on the plane, its EV, the top on another EV of it)
    assert (verdict, here) == (Expiry.LOST, (3, 200, 0))
    assert acked_later(oldest, here)  # its path is blamed too


def test_a_plane_lagging_behind_the_others_is_waited_for_then_found_silent() -> None:
    fifos, planes = network()
    (oldest,) = fifos[0]
    rtos = RtoTimers()
    # A flowcell sent later was acknowledged elsewhere (seq 5), but plane 0's last
    # acknowledgement (0.999) is not an RTO old yet: it lags; wait until 0.999 + 12.5 ms.
    verdict, _ = _judge(rtos, fifos, planes, oldest, top_seq=5, last_progress=1.004, now=1.011)
    assert verdict is Expiry.HELD and rtos.holds == {0: pytest.approx(1.0115)}
    # Silent for an RTO while the peer answered elsewhere 8 ms ago: dead to us.
    verdict, _ = _judge(rtos, fifos, planes, oldest, top_seq=5, last_progress=1.004, now=1.012)
    assert verdict is Expiry.SILENT


def test_a_silent_plane_waits_while_another_planes_answer_is_still_due() -> None:
    fifos, planes = network()
    (oldest,) = fifos[0]
    # The peer's last answer (1.000) is older than the plane's own last one plus half an RTO:
    # no proof it is alive now. Plane 1 answered before and has a flowcell out since 1.010,
    # expected back at 1.015 (its SRTT): look again then.
    planes[1].proven_at = 1.004
    fifos[1].append(SentCell(psn=80, n=4, runs=[], ev=101, plane=1, sent_at=1.010, seq=6,
                             tx_ts=0, rtx=False, size=4096, last=4096, open=4,
                             open_bytes=4 * 4096))  # fmt: skip
    rtos = RtoTimers()
    verdict, _ = _judge(rtos, fifos, planes, oldest, top_seq=5, last_progress=T0, now=1.012)
    assert verdict is Expiry.HELD and rtos.holds == {0: pytest.approx(1.015)}
    # Plane 1's flowcell overdue as well (past its own RTO at 1.0225): the peer stalled, not
    # plane 0; no path is blamed and, with no progress for an RTO, the stall probe goes.
    verdict, _ = _judge(rtos, fifos, planes, oldest, top_seq=5, last_progress=T0, now=1.023)
    assert verdict is Expiry.STALL_PROBE


def test_two_planes_that_lost_one_burst_while_later_packets_got_through_are_not_a_stall() -> None:
    # A flap took plane 0's and plane 1's flowcells of one burst (send seqs 1 and 2); the
    # peer acknowledged the flowcell sent after them on plane 2 (seq 5) at 1.004 s. Plane 1's
    # is overdue too (since 1.013), but the peer answered something sent after it: a loss of
    # plane 1's own, no stall. Taken for a stall, both planes were left to the stall probe,
    # one packet per backed-off RTO: the 5 s stall of tools.job's flap schedule.
    fifos, planes = network()
    (oldest,) = fifos[0]
    planes[1].proven_at = 0.5
    fifos[1].append(SentCell(psn=8, n=4, runs=[], ev=101, plane=1, sent_at=T0 + 0.0005, seq=2,
                             tx_ts=0, rtx=False, size=4096, last=4096, open=4,
                             open_bytes=4 * 4096))  # fmt: skip
    verdict, _ = _judge(RtoTimers(), fifos, planes, oldest, top_seq=5, last_progress=1.004,
                        now=1.017)  # fmt: skip
    assert verdict is Expiry.SILENT
    assert planes[0].rtt.backoff == 0

def test_silence_everywhere_is_one_stall_probe_per_rto_with_backoff() -> None:
    fifos, planes = network()
    (oldest,) = fifos[0]
    rtos = RtoTimers()
    # Nothing sent later acknowledged anywhere, no progress for an RTO: plane 0 holds the
    # connection's oldest packet, so its expiry sends the one probe and backs off.
    verdict, _ = _judge(rtos, fifos, planes, oldest, top_seq=0, last_progress=0.99, now=1.0125)
    assert verdict is Expiry.STALL_PROBE
    assert planes[0].rtt.backoff == 1 and rtos.probe_until == pytest.approx(1.0125 + 2 * RTO)
    verdict, _ = _judge(rtos, fifos, planes, oldest, top_seq=0, last_progress=0.99, now=1.02)
    assert verdict is Expiry.BACKED_OFF and planes[0].rtt.backoff == 2
    # Progress within the last RTO: the window stalled, not the peer; wait for it.
    rtos2 = RtoTimers()
    _, planes2 = network()
    verdict, _ = _judge(rtos2, fifos, planes2, oldest, top_seq=0, last_progress=1.005,
                        now=1.0125)  # fmt: skip
    assert verdict is Expiry.HELD and rtos2.holds == {0: pytest.approx(1.0175)}


def test_an_rto_that_fires_late_with_nothing_heard_is_our_own_stall() -> None:
    fifos, planes = network()
    (oldest,) = fifos[0]
    rtos, timers = RtoTimers(), TimerTable()
    rtos.arm(timers, fifos, planes)
    assert rtos.armed == {0: pytest.approx(T0 + RTO)}
    assert timers.get(Timer.RETRANSMIT, 0) == pytest.approx(T0 + RTO)
    # Run 7 ms late (more than half an RTO) with nothing heard from the peer since it was
    # due: this process was not running. Read first, judge a reordering window later.
    verdict, _ = _judge(rtos, fifos, planes, oldest, top_seq=0, last_progress=0.99, now=1.0195)
    assert verdict is Expiry.HELD and rtos.holds == {0: pytest.approx(1.0205)}
    # The same lateness after the peer was heard on plane 2: a real expiry.
    planes[2].heard_at = 1.013
    verdict, _ = _judge(rtos, fifos, planes, oldest, top_seq=0, last_progress=0.99, now=1.0195)
    assert verdict is Expiry.STALL_PROBE
