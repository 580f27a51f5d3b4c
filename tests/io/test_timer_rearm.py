"""io's one loop timer per session is re-armed only when the session's deadline moved earlier
(mrc/io/endpoint.py `_arm`, docs/DESIGN.md §11): each small message moves the RTO and
completion deadlines later, and a later deadline keeps the handle already armed, whose early
wake-up finds nothing due and arms the timer again."""

from __future__ import annotations

from test_endpoint_glue import FakeSession, make, run


def test_a_later_deadline_keeps_the_handle_and_its_early_wake_up_rearms() -> None:
    loop, _core, io, peers = make(1)
    try:
        session = FakeSession(peers[0].local_addr)
        now = io.now()
        session.deadline = now + 0.010
        io.flush(session)
        (armed,) = io._timers.values()
        # Four messages later the deadline has moved to +40 ms: the +10 ms handle stays.
        for k in range(1, 5):
            session.deadline = now + 0.010 * (k + 1)
            io.flush(session)
            assert list(io._timers.values()) == [armed]
        # +10 ms: the early wake-up finds nothing due (no handle_timer), pulls the session
        # once and arms the timer for +50 ms, when the timer runs.
        pulls = session.pulls
        run(loop, lambda: io._timers.get(id(session), armed)[0] != armed[0])
        assert session.timer_calls == [] and session.pulls == pulls + 1
        assert io._timers[id(session)][0] == now + 0.050
        run(loop, lambda: bool(session.timer_calls))
        assert len(session.timer_calls) == 1 and session.timer_calls[0] >= now + 0.050
        # An earlier deadline replaces the handle; None cancels it.
        session.deadline = now + 10.0
        io.flush(session)
        session.deadline = now + 5.0
        io.flush(session)
        assert io._timers[id(session)][0] == now + 5.0
        session.deadline = None
        io.flush(session)
        assert io._timers == {}
    finally:
        io.close()
        loop.close()
        peers[0].close()
