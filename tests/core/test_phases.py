"""A session's two phases (mrc/core/phase.py) as a story with explicit `now`: a requester's
handshake has no connection and refuses what needs one; the REPLY builds the connection whole,
each part given the peer's QPN and the trace when it is built; a REJECT ends the handshake."""

from __future__ import annotations

import random

import pytest

from mrc.core import LocalProtocolError, SessionState
from mrc.core.config import SessionConfig
from mrc.core.endpoint import Endpoint
from mrc.core.established import Established
from mrc.core.memory import RegionTable
from mrc.core.session import Session
from mrc.core.trace import TraceCollector, TraceLog
from mrc.core.transmit import Transmit

CONFIG = SessionConfig(plane_mask=0b11, ev_per_plane=4, ev_backup_per_plane=2)


def deliver(out: list[Transmit], to: Endpoint, plane_of: dict[int, str], now: float) -> None:
    for tx in out:
        to.receive_datagrams(tx.plane, [(tx.data, plane_of[tx.plane], 0)], now)


def test_the_reply_builds_the_connection_whole_and_the_handshake_had_none() -> None:
    a = Endpoint(rng=random.Random(1))
    b = Endpoint(rng=random.Random(2))
    log = TraceLog(records=True)
    b.listen(CONFIG, lambda _pd: b"ok", trace=log)
    trace = TraceCollector(records=True)
    s = a.connect(CONFIG, {0: "b0", 1: "b1"}, b"hi", 0.0, trace=trace)
    # The handshake: no connection, nothing that needs one.
    assert s.state is SessionState.CONNECTING and s.established is None
    assert s.sender is None and s.receiver is None and s.planes is None and s.idle
    with pytest.raises(LocalProtocolError, match="connecting session"):
        s.post_write(a.regions.register(bytearray(8)), 0, 8, 0, 1)
    with pytest.raises(LocalProtocolError, match="no connection yet"):
        _ = s.paths
    assert s.plane_state(0) == "absent" and s.ev_stats(0.0) == [] and trace.timeline == []
    # The REQUESTs reach b, whose session starts established (half-open) with its own trace.
    deliver(s.datagrams_to_send(0.0), b, {0: "a0", 1: "a1"}, 0.001)
    (r,) = b.sessions.values()
    assert r.state is SessionState.ESTABLISHED and r.half_open and r.trace is log.traces[r.qpn]
    # Its REPLY: the requester's connection, built whole.
    deliver(r.datagrams_to_send(0.001), a, {0: "b0", 1: "b1"}, 0.002)
    conn = s.established
    assert isinstance(conn, Established) and s.state is SessionState.ESTABLISHED
    assert s.peer_qpn == r.qpn
    assert conn.sender.dest_qp == conn.receiver.replies.dest_qp == conn.monitor.peer_qpn == r.qpn
    assert conn.sender.trace is trace and conn.monitor.trace is trace
    assert conn.paths.evs.trace is trace
    # The timeline starts with every EV of the new table.
    assert sorted(ev for _, ev, *_ in trace.timeline) == sorted(conn.paths.evs.by_ev)


def test_an_untraced_connection_gives_its_parts_no_trace_and_a_reject_ends_a_handshake() -> None:
    rng = random.Random(3)
    s = Session.connect(
        CONFIG, {0: "x", 1: "y"}, b"", qpn=7, regions=RegionTable(rng), rng=rng, now=0.0
    )
    assert s.trace is None and s.get_timer() == CONFIG.cm_retry
    # Only a timeline: the sender and the monitor get no trace.
    trace = TraceCollector()
    a = Endpoint(rng=random.Random(4))
    b = Endpoint(rng=random.Random(5))
    b.listen(CONFIG, lambda _pd: b"")
    t = a.connect(CONFIG, {0: "b0", 1: "b1"}, b"", 0.0, trace=trace)
    deliver(t.datagrams_to_send(0.0), b, {0: "a0", 1: "a1"}, 0.001)
    (r,) = b.sessions.values()
    assert r.trace is None
    deliver(r.datagrams_to_send(0.001), a, {0: "b0", 1: "b1"}, 0.002)
    conn = t.established
    assert conn is not None and conn.sender.trace is None and conn.monitor.trace is None
    assert conn.paths.evs.trace is trace and len(trace.timeline) == len(conn.paths.evs.by_ev)


def test_a_reject_for_our_nonce_ends_the_handshake_and_the_session() -> None:
    a = Endpoint(rng=random.Random(6))
    b = Endpoint(rng=random.Random(7))
    # b does not listen: REJECT (no listener). (A RESOURCES REJECT only means "later", and
    # a secured attempt takes any REJECT as a hint: docs/WIRE.md §6.)
    s = a.connect(CONFIG, {0: "b0", 1: "b1"}, b"", 0.0)
    deliver(s.datagrams_to_send(0.0), b, {0: "a0", 1: "a1"}, 0.001)
    assert not b.sessions
    deliver(b.datagrams_to_send(), a, {0: "b0", 1: "b1"}, 0.002)
    assert s.state is SessionState.CLOSED and s.established is None
    assert s.close_reason == "rejected: no listener" and s.get_timer() is None
