"""One in-process `mrc bench` stream test on one session: a side that writes or receives.

Holds `BenchTest`: posting messages into slots by the writer's rule (`writer.WritePlan`),
checking them by the receiver's (`receiver.Verifier`), interval samples, the results exchange
of `proto`, the watchdog, and the summary of one side. What it runs on (`TestSetup`) comes from
`setup`. It prints nothing (`report` does) and opens no socket (`client` and `server` do); it
only reacts to session events and calls `post_write`/`close` through the `IoEndpoint`.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from mrc.core.events import (
    ConnectionClosed,
    Event,
    ImmediateReceived,
    PathRestored,
    PathRetired,
    PlaneDown,
    PlaneUp,
    PortStateChanged,
    WriteCompleted,
)
from mrc.core.session import Session
from mrc.core.trace import TraceCollector
from mrc.io.endpoint import Fault, IoEndpoint
from mrc.io.loop import freeze_heap
from mrc.io.switch import format_addr

from .proto import (
    IMM_END,
    IMM_GO,
    IMM_RESULTS,
    MAX_MESSAGES,
    RESULTS_BYTES,
    BenchProtocolError,
    Pattern,
    RegionRef,
    decode_summary,
    encode_summary,
    message_count,
    message_length,
)
from .receiver import Verifier
from .setup import RECEIVER, STATUS_NAMES, WRITER, IntervalSample, TestParams, TestSetup
from .trace import TraceFile, TraceWriter, start_trace
from .writer import WritePlan

__all__ = ["RECEIVER", "WRITER", "BenchTest", "IntervalSample", "TestParams", "TestSetup"]


def next_tick(k: int, elapsed: float, interval: float) -> int:
    """The interval tick to schedule after tick `k` fired `elapsed` seconds into the test. A
    late tick (a busy loop) ends one longer interval; the ticks it overran are skipped, not
    fired back to back as zero-width intervals (as in iperf3)."""
    return max(k + 1, int(elapsed / interval) + 1)


class BenchTest:
    """One side of one test. Feed it the session's events with `on_events`."""

    def __init__(
        self,
        io: IoEndpoint[Session],
        session: Session,
        setup: TestSetup,
        *,
        peer_data: RegionRef,
        peer_results: RegionRef,
        on_done: Callable[[BenchTest], None],
        on_interval: Callable[[BenchTest, IntervalSample], None] | None = None,
        wait_for_go: bool = False,
        send_go: bool = False,
        stall_timeout: float = 15.0,
        start_timeout: float = 15.0,
        extra_drops: Callable[[], Mapping[str, int]] | None = None,
        trace_file: TraceFile | None = None,
    ) -> None:
        self.io = io
        self.loop: asyncio.AbstractEventLoop = io.loop
        self.session = session
        self.setup = setup
        self.params = setup.params
        self.role = setup.role
        self.peer_data = peer_data
        self.peer_results = peer_results
        self.on_done = on_done
        self.on_interval = on_interval
        self.wait_for_go = wait_for_go
        self.send_go = send_go
        self.stall_timeout = stall_timeout
        self.start_timeout = start_timeout
        self._progressed = False
        self.extra_drops = extra_drops
        self.state = "idle"
        self.error: str | None = None
        self.t0 = self.t_end = 0.0
        self.samples: list[IntervalSample] = []
        self.events: list[dict[str, Any]] = []
        self.peer_summary: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        # writer
        self.messages_posted = 0
        self.messages_completed = 0
        self.bytes_completed = 0
        self.write_errors: Counter[str] = Counter()
        self._outstanding: list[tuple[int, int, int]] = []  # (msn, n, length), MSN order
        self._out_head = 0
        self._stop_posting = False
        # Free slots that make a completion refill them (a post loop per batch, not per message).
        self._refill = max(1, min(32, setup.slots // 8))
        self._end_msn: int | None = None
        self._control_msns: set[int] = set()
        # receiver
        self.plan = WritePlan(setup.params.msg_size, setup.params.total_bytes, setup.slots,
                              setup.pattern)  # fmt: skip
        self.verifier = Verifier(setup.pattern, setup.params.msg_size, setup.params.total_bytes,
                                 setup.slots)  # fmt: skip
        self._end_bytes = 0
        self._results_msn: int | None = None
        # bookkeeping
        self._handles: list[asyncio.TimerHandle] = []
        self._last: dict[str, Any] = {}
        self._progress_mark: tuple[int, ...] = ()
        self._progress_at = 0.0
        self._cpu0 = os.times()
        self._cpu1 = self._cpu0
        self._placed0 = 0
        self.expected_messages = message_count(self.params.msg_size, self.params.total_bytes)
        # The session's trace, handed to it when it was built (client.py, server.py); an
        # untraced session gets an empty timeline.
        self._attached_at = io.now()
        trace = session.trace
        self.trace = trace if isinstance(trace, TraceCollector) else TraceCollector()
        self.trace_file = trace_file
        self.trace_out: TraceWriter | None = None

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.state in ("done", "failed")

    @property
    def running(self) -> bool:
        return self.state == "running"

    def start(self) -> None:
        """The session is established: the receiver starts its clock, the writer its messages."""
        freeze_heap()
        now = self.io.now()
        self._progress_at = now
        self._watchdog()
        if self.role == WRITER and self.wait_for_go:
            self.state = "waiting"
            return
        self._begin(now)

    def _begin(self, now: float) -> None:
        self.state = "running"
        self.t0 = now
        self._cpu0 = os.times()
        self._placed0 = self.session.stats.bytes_placed
        self._last = self._snapshot()
        self.trace_out = start_trace(
            self.trace_file, self.trace, self.session, t0=now, clock=self.io.now, loop=self.loop
        )
        if self.params.interval > 0:
            self._schedule_interval(1)
        if self.role == WRITER:
            for plane, at in self.params.injects:
                fault = self.io.inject_plane_down(plane, now + at)
                self._record(fault.at, "fault", plane, None, f"plane-down injected at {at:g} s")
            if self.params.duration > 0:
                self._handles.append(self.loop.call_later(self.params.duration, self._time_up))
            self._pump()
        elif self.send_go:
            self._post_control(b"GO!!", IMM_GO)
        self.io.flush(self.session)

    def fail(self, reason: str) -> None:
        if self.done:
            return
        self.error = reason
        self._finish_clock()
        self.state = "failed"
        self._cancel()
        self.on_done(self)

    def cancel(self) -> None:
        """Stop timers without reporting (owner shutting down)."""
        self._cancel()

    def _cancel(self) -> None:
        for h in self._handles:
            h.cancel()
        self._handles.clear()
        # The test is over: the timeline stops here, so -J and the trace file hold the same.
        self.trace.detach()
        if self.trace_out is not None:
            self.trace_out.close(self.io.now())
            self.trace_out = None

    def _complete(self) -> None:
        self.state = "done"
        self._cancel()
        self.on_done(self)

    # -- events -----------------------------------------------------------------------------

    def on_events(self, events: list[Event]) -> None:
        """React to a flush's session events; what they post goes out with the running flush."""
        posted = False
        for event in events:
            if type(event) is WriteCompleted:  # the usual one: straight to its handler
                posted = self._on_completed(event) or posted
            else:
                posted = self._on_event(event) or posted
        if posted and not self.session.is_closed:
            self.io.flush(self.session)  # folded into the caller's flush when inside one

    def _on_event(self, event: Event) -> bool:
        """False when the event certainly posted nothing (`on_events` may skip the flush)."""
        if isinstance(event, WriteCompleted):
            return self._on_completed(event)
        if isinstance(event, ImmediateReceived):
            return self._on_immediate(event)
        now = self.io.now()
        if isinstance(event, ConnectionClosed):
            if self.done:
                return True
            if self._results_msn is not None and event.reason == "disconnect":
                # The writer has our results (that is why it hung up) before our AETH came.
                self._complete()
            else:
                self.fail(f"connection closed: {event.reason}")
        elif isinstance(event, PlaneDown):
            self._record(now, "plane-down", event.plane, None, event.reason)
        elif isinstance(event, PlaneUp):
            self._record(now, "plane-up", event.plane, None, "")
        elif isinstance(event, PortStateChanged):
            kind = "port-up" if event.up else "port-down"
            self._record(now, kind, event.plane, None, "announced to the peer")
        elif isinstance(event, PathRetired):
            self._record(now, "path-retired", event.plane, event.ev, event.reason)
        elif isinstance(event, PathRestored):
            self._record(now, "path-restored", event.plane, event.ev, "")
        return True

    def add_fault(self, fault: Fault, detail: str) -> None:
        """Note a fault the owner injected outside the test's own schedule."""
        self._record(fault.at, "fault", fault.plane, None, detail)

    @property
    def started_data(self) -> bool:
        """Did any test traffic flow? (A stray handshake that never did is not reported.)"""
        if self.role == WRITER:
            return self.state not in ("idle", "waiting")
        return (
            self.session.stats.bytes_placed > self._placed0
            or self.verifier.next_expected > 0
            or self.peer_summary is not None
        )

    def _record(self, at: float, kind: str, plane: int | None, ev: int | None, detail: str) -> None:
        base = self.t0 if self.t0 else at
        if kind == "fault" and plane is not None:
            self.trace.fault(plane, detail, at)
        self.events.append(
            {"t": round(at - base, 3), "event": kind, "plane": plane, "ev": ev, "detail": detail}
        )

    # -- writer -----------------------------------------------------------------------------

    def _pump(self) -> None:
        if self.state != "running" or self.role != WRITER:
            return
        p, setup = self.params, self.setup
        assert setup.source is not None
        if p.duration > 0 and self.io.now() - self.t0 >= p.duration:
            self._stop_posting = True
        # The writer's rule is `WritePlan`'s, inlined: once per message (a 4 KiB test posts
        # 100k+ a second) what the loop reads is local, `source_offset`/`imm`/`slot_offset`
        # written out, `length` only for a byte count.
        plan = self.plan
        post, source, slots, size = self.session.post_write, setup.source, plan.slots, p.msg_size
        va, rkey, outstanding = self.peer_data.va, self.peer_data.rkey, self._outstanding
        verify, stride, period = plan.pattern is not None, Pattern.STRIDE, Pattern.PERIOD
        total = plan.total_bytes
        n, free = self.messages_posted, slots - (len(outstanding) - self._out_head)
        while free > 0 and not self._stop_posting:
            length = message_length(n, size, total) if total else size
            if length <= 0 or n >= MAX_MESSAGES:
                self._stop_posting = True
                break
            src_off, imm = (n * stride % period, n) if verify else (0, None)
            msn = post(source, src_off, length, va + n % slots * size, rkey, imm)
            outstanding.append((msn, n, length))
            n += 1
            self.messages_posted = n
            free -= 1
        self._maybe_end()

    def _time_up(self) -> None:
        self._stop_posting = True
        self._maybe_end()
        self.io.flush(self.session)

    def _on_completed(self, event: WriteCompleted) -> bool:
        """Account one completion, refilling `_refill` free slots; False if nothing was posted."""
        if event.msn in self._control_msns:
            self._control_msns.discard(event.msn)
            if event.status:
                self.fail(f"control write failed with status {event.status:#x}")
            elif event.msn == self._results_msn:
                self._complete()
            return True
        if self._out_head >= len(self._outstanding):
            return True
        msn, _n, length = self._outstanding[self._out_head]
        if msn != event.msn:
            self.fail(f"completion for MSN {event.msn}, expected {msn}")
            return True
        self._out_head += 1
        if self._out_head > 4096:
            del self._outstanding[: self._out_head]
            self._out_head = 0
        self.messages_completed += 1
        if event.status:
            self.write_errors[STATUS_NAMES.get(event.status, f"{event.status:#x}")] += 1
        else:
            self.bytes_completed += length
        in_flight = len(self._outstanding) - self._out_head
        if self._stop_posting or self.setup.slots - in_flight >= self._refill:
            self._pump()
            return True
        return False

    def _maybe_end(self) -> None:
        if (
            self.state == "running"
            and self.role == WRITER
            and self._stop_posting
            and self._out_head >= len(self._outstanding)
            and self._end_msn is None
        ):
            self._finish_clock()
            self.state = "finishing"
            summary = self.build_summary()
            self._end_msn = self._post_control(
                encode_summary(summary, min(RESULTS_BYTES, self.peer_results.length)), IMM_END
            )

    def _post_control(self, data: bytes, imm: int) -> int:
        out = self.setup.outbox
        out.view[: len(data)] = data
        msn = self.session.post_write(
            out, 0, len(data), self.peer_results.va, self.peer_results.rkey, imm=imm
        )
        self._control_msns.add(msn)
        return msn

    # -- receiver ---------------------------------------------------------------------------

    def _on_immediate(self, event: ImmediateReceived) -> bool:
        """Check one message (or act on a control immediate); False if nothing was posted."""
        imm = event.imm
        if imm == IMM_GO:
            if self.state == "waiting":
                self._begin(self.io.now())
            return True
        if imm == IMM_END:
            self._on_end(self.io.now())
            return True
        if imm == IMM_RESULTS:
            self._read_peer_summary()
            if self.role == WRITER and not self.done:
                self._complete()
            return True
        if self.role != RECEIVER or self.state != "running":
            return False
        data = self.setup.data
        self.verifier.arrived(imm, data.view if data is not None else memoryview(b""))
        return False

    def _on_end(self, now: float) -> None:
        if self.role != RECEIVER or self.state != "running":
            return
        self._read_peer_summary()
        # The END write itself landed in our inbox: 4-byte length + its JSON.
        self._end_bytes = 4 + int.from_bytes(self.setup.inbox.view[:4], "big")
        self._finish_clock()
        self.state = "finishing"
        summary = self.build_summary()
        self._results_msn = self._post_control(
            encode_summary(summary, min(RESULTS_BYTES, self.peer_results.length)), IMM_RESULTS
        )

    def _read_peer_summary(self) -> None:
        try:
            self.peer_summary = decode_summary(self.setup.inbox.view)
        except BenchProtocolError as exc:
            self.peer_summary = {"error": str(exc)}

    # -- measurements -----------------------------------------------------------------------

    def _finish_clock(self) -> None:
        if not self.t_end:
            self.t_end = self.io.now()
            self._cpu1 = os.times()

    def _snapshot(self) -> dict[str, Any]:
        st = self.session.stats
        planes: dict[int, tuple[int, int]] = {}
        for p, ps in st.planes.items():
            if self.role == WRITER:
                planes[p] = (ps.bytes_sent, ps.packets_sent)
            else:
                planes[p] = (ps.bytes_received, ps.packets_received)
        return {
            "bytes": st.bytes_acked if self.role == WRITER else st.bytes_placed,
            "retransmits": st.retransmits,
            "planes": planes,
        }

    def _schedule_interval(self, k: int) -> None:
        delay = self.t0 + k * self.params.interval - self.io.now()
        self._handles.append(self.loop.call_later(max(0.0, delay), self._tick, k))

    def _tick(self, k: int) -> None:
        if self.state not in ("running", "waiting"):
            return
        now = self.io.now()
        self._sample(now)
        self._schedule_interval(next_tick(k, now - self.t0, self.params.interval))

    def _sample(self, now: float) -> None:
        snap = self._snapshot()
        last = self._last
        start = self.samples[-1].end if self.samples else 0.0
        planes = []
        for p in sorted(snap["planes"]):
            b, n = snap["planes"][p]
            b0, n0 = last["planes"].get(p, (0, 0))
            planes.append((p, b - b0, n - n0))
        sample = IntervalSample(
            start=start,
            end=now - self.t0,
            bytes=snap["bytes"] - last["bytes"],
            retransmits=snap["retransmits"] - last["retransmits"],
            planes=planes,
        )
        sender = self.session.sender
        if self.role == WRITER and sender is not None:
            sample.snd_cwnd = round(self.session.cc.window)
            for p, used in sender.flight.planes_now().items():
                cap = self.session.cc.plane_window(p)
                sample.in_flight[p] = (used, None if cap is None else round(cap))
        self._last = snap
        self.samples.append(sample)
        if self.on_interval is not None:
            self.on_interval(self, sample)

    def final_sample(self) -> None:
        """The last, partial interval (called once the test is over)."""
        if self.params.interval > 0 and self.t_end and self.t0:
            end = self.t_end - self.t0
            start = self.samples[-1].end if self.samples else 0.0
            # A sliver of time still gets its own line when bytes moved in it, so the
            # intervals always add up to the totals.
            if end - start > 1e-3 or self._snapshot() != self._last:
                self._sample(max(self.t_end, self.t0 + start))

    def _watchdog(self) -> None:
        if self.done:
            return
        st = self.session.stats
        mark = (st.bytes_acked, st.bytes_placed, st.messages_completed, len(self.events))
        now = self.io.now()
        limit = self.stall_timeout if self._progressed else self.start_timeout
        if mark != self._progress_mark:
            self._progressed = bool(self._progress_mark)
            self._progress_mark = mark
            self._progress_at = now
        elif now - self._progress_at > limit:
            self.fail(f"no progress for {limit:g} s")
            self.session.close(now)
            self.io.flush(self.session)
            return
        self._handles.append(self.loop.call_later(1.0, self._watchdog))

    def ev_timeline(self) -> list[dict[str, Any]]:
        """`end.mrc.ev_timeline` of -J: the EV timeline on the test's clock."""
        return self.trace.ev_timeline(self.t0 or self._attached_at)

    @property
    def seconds(self) -> float:
        end = self.t_end or self.io.now()
        return max(0.0, end - self.t0) if self.t0 else 0.0

    @property
    def data_bytes(self) -> int:
        if self.role == WRITER:
            return self.bytes_completed
        return max(0, self.session.stats.bytes_placed - self._placed0 - self._end_bytes)

    @property
    def messages_verified(self) -> int:
        return self.verifier.verified

    @property
    def mismatches(self) -> int:
        return self.verifier.mismatches

    def integrity(self) -> str:
        if not self.params.verify:
            return "not-checked"
        if self.role == WRITER:
            peer = self.peer_summary or {}
            value = peer.get("integrity")
            return value if isinstance(value, str) else "unknown"
        expected = _summary_int(self.peer_summary, "messages") if self.peer_summary else None
        if self.mismatches or (expected is not None and self.messages_verified != expected):
            return "mismatch"
        return "ok"

    def cpu(self) -> dict[str, float]:
        c0, c1 = self._cpu0, self._cpu1
        wall = max(1e-9, c1.elapsed - c0.elapsed)
        user = (c1.user - c0.user) / wall * 100
        system = (c1.system - c0.system) / wall * 100
        return {
            "host_total": round(user + system, 2),
            "host_user": round(user, 2),
            "host_system": round(system, 2),
        }

    def plane_rows(self) -> list[dict[str, Any]]:
        st = self.session.stats
        rows = []
        for p in sorted(set(st.planes) | set(self.io.planes)):
            ps = st.plane(p)
            sock = self.io.planes.get(p)
            remote = self.session.peer_addrs.get(p)
            rows.append(
                {
                    "plane": p,
                    "local": format_addr(sock.local_addr) if sock is not None else None,
                    "remote": format_addr(remote) if isinstance(remote, tuple) else None,
                    "state": self.session.plane_state(p),
                    "packets_sent": ps.packets_sent,
                    "bytes_sent": ps.bytes_sent,
                    "packets_received": ps.packets_received,
                    "bytes_received": ps.bytes_received,
                    "retransmits": ps.retransmits,
                }
            )
        return rows

    def build_summary(self) -> dict[str, Any]:
        """This side's results: what travels to the peer and feeds `end` in the report."""
        st = self.session.stats
        core_drops: Counter[str] = Counter(st.drops_by_reason)
        if self.extra_drops is not None:
            core_drops.update(self.extra_drops())
        return {
            "role": self.role,
            "seconds": round(self.seconds, 6),
            "bytes": self.data_bytes,
            "retransmits": st.retransmits,
            "messages": (
                self.messages_completed if self.role == WRITER else self.verifier.next_expected
            ),
            "messages_verified": self.messages_verified,
            "mismatches": self.mismatches,
            "integrity": self.integrity() if self.role == RECEIVER else "pending",
            "write_errors": dict(self.write_errors),
            "cpu_utilization_percent": self.cpu(),
            "planes": self.plane_rows(),
            "retransmits_by_cause": _by_cause(st.retransmits_by_cause),
            "drops_by_reason": dict(core_drops),
            "trimmed_received": st.trimmed_received,
            "local_drops": st.local_drops,
            "nacks_sent": st.nacks_sent,
            "nacks_received": st.nacks_received,
            "probes_sent": st.probes_sent,
            "probes_answered": st.probes_answered,
            "longest_stall_seconds": round(st.longest_stall_seconds, 3),
            "longest_stall_at_seconds": st.longest_stall_at,
            "events": list(self.events),
        }


def _by_cause(counter: Counter[str]) -> dict[str, int]:
    return {"rack": 0, "rto": 0, "nack_trimmed": 0, "nack_other": 0} | dict(counter)


def _summary_int(summary: dict[str, Any] | None, key: str) -> int:
    value = (summary or {}).get(key)
    return value if isinstance(value, int) else 0
