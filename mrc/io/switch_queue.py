"""The egress port of the `mrc switch` relay: queues, token bucket, ECN and trimming decisions.

Holds `EgressPort` (one direction of the relay: a finite data queue, a bounded priority queue for
trimmed headers, a token bucket that drains both at the configured rate), `TokenBucket`,
`PortStats` (the per-direction counters `mrc switch -J` reports) and `is_data`. Everything here is
pure: no sockets, no clock; `now` (monotonic seconds) comes in as an argument, so tests drive it
with an injected clock. Receiving, sending and the event loop are `mrc.io.switch`'s.

The decisions at enqueue (ECN marking, trimming into the priority queue, tail drop) are
`mrc.switchq.decide`, the same rules the simulator's ports follow (docs/WIRE.md §5,
docs/DESIGN.md §5); here only MRC data packets (`is_data`) may be trimmed, and the occupancy it
is given is this port's (below). The priority queue always goes out first. Byte counts (queue
sizes, thresholds, the rate's budget) are UDP payload bytes: IP and UDP headers are not counted.

The bucket models the egress link, not the relay process: a packet may leave once the link
would have started sending it (tokens ≥ 0; each packet then takes its size from them), and
while packets wait, tokens keep accruing even if the relay wakes up late. So when the relay was
late, the queue it holds is longer than the link's would be; the decisions above use the link's
occupancy (what is queued minus what the link would already have sent), the reported queueing
delay is the link's, and `max_release_lateness_seconds` says how late the relay actually sent.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from mrc.switchq import (
    DSCP_TRIMMED,
    DSCP_TRIMMED_LASTHOP,
    MIN_TRIM_SIZE,
    QueuePolicy,
    Verdict,
    decide,
    is_data,
)

__all__ = [
    "DEFAULT_TRIM_SIZE",
    "DSCP_TRIMMED",
    "DSCP_TRIMMED_LASTHOP",
    "MIN_TRIM_SIZE",
    "EgressPort",
    "PortStats",
    "TokenBucket",
    "Verdict",
    "is_data",
]

DEFAULT_TRIM_SIZE = 64

#: A queued packet: its bytes, the TOS byte it leaves with, when it was enqueued.
_Queued = tuple[bytes, int, float]
Packet = bytes | bytearray | memoryview


@dataclass(slots=True)
class PortStats:
    """One direction's counters. The relay fills `forwarded_*`, `socket_overflow` and the rest."""

    received_packets: int = 0
    received_bytes: int = 0
    forwarded_packets: int = 0
    forwarded_bytes: int = 0
    ce_marked: int = 0
    trimmed: int = 0
    #: Packets queued at priority (trimmed here or upstream).
    priority: int = 0
    dropped_queue: int = 0
    dropped_priority: int = 0
    #: The kernel's own receive-queue drops on the socket this direction reads (SO_RXQ_OVFL).
    socket_overflow: int = 0
    #: Datagrams the kernel refused to send (the relay counts them by errno too).
    send_errors: int = 0
    #: Replies that came before any client did, so had nowhere to go.
    dropped_no_client: int = 0
    #: Packets still queued when the relay stopped.
    left_queued: int = 0
    max_queue_bytes: int = 0
    max_priority_bytes: int = 0
    delay_sum: float = 0.0
    delay_samples: int = 0
    delay_max: float = 0.0
    lateness_max: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        total, n = d.pop("delay_sum"), d.pop("delay_samples")
        d["mean_queue_delay_seconds"] = total / n if n else 0.0
        d["max_queue_delay_seconds"] = d.pop("delay_max")
        d["max_release_lateness_seconds"] = d.pop("lateness_max")
        return d


class TokenBucket:
    """Bytes the egress link has earned, at `rate` bytes/s; in deficit while a packet is on it.

    A packet may start when `tokens` ≥ 0 and then takes its size (so tokens go negative for as
    long as the link needs to send it). While the port is idle the bucket stores no credit
    (a link cannot send in the past); while packets wait it does, so a late wakeup is made up
    for with a larger batch and the long-run rate stays exact.
    """

    __slots__ = ("rate", "stamp", "tokens")

    def __init__(self, rate: float, now: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.tokens = 0.0
        self.stamp = now

    def refill(self, now: float, idle: bool) -> None:
        """Add what the time since `stamp` earned; `idle`: the port was empty meanwhile."""
        elapsed = now - self.stamp
        if elapsed > 0:
            self.tokens += elapsed * self.rate
            self.stamp = now
        if idle and self.tokens > 0:
            self.tokens = 0.0


class EgressPort:
    """One direction of the relay: data queue, priority queue, token bucket (module docstring).

    `rate_bps` None means unshaped: nothing waits beyond the current receive batch, and nothing
    is marked, trimmed or dropped.
    """

    def __init__(
        self,
        *,
        rate_bps: float | None,
        queue_bytes: int = 256 << 10,
        ecn_threshold: int | None = None,
        priority_bytes: int | None = None,
        trim: bool = True,
        trim_size: int = DEFAULT_TRIM_SIZE,
        last_hop: bool = True,
        now: float = 0.0,
    ) -> None:
        if trim_size < MIN_TRIM_SIZE:
            raise ValueError(f"trim_size must be at least {MIN_TRIM_SIZE} (docs/WIRE.md §5)")
        self.queue_bytes = queue_bytes
        self.ecn_threshold = queue_bytes // 4 if ecn_threshold is None else ecn_threshold
        self.priority_bytes = queue_bytes if priority_bytes is None else priority_bytes
        self.trim = trim
        self.trim_size = trim_size
        self.last_hop = last_hop
        self.dscp = DSCP_TRIMMED_LASTHOP if last_hop else DSCP_TRIMMED
        self.policy = QueuePolicy(
            queue_bytes=queue_bytes,
            ecn_threshold=self.ecn_threshold,
            trim=trim,
            trim_size=trim_size,
            priority_bytes=self.priority_bytes,
            trimmed_dscp=self.dscp,
        )
        self.rate_bps = rate_bps
        self.bucket = None if rate_bps is None else TokenBucket(rate_bps / 8, now)
        self.stats = PortStats()
        self._data: deque[_Queued] = deque()
        self._prio: deque[_Queued] = deque()
        #: Bytes held in each queue (the relay may hold more than the link would: see above).
        self.data_bytes = 0
        self.prio_bytes = 0

    @property
    def shaped(self) -> bool:
        return self.bucket is not None

    def __len__(self) -> int:
        return len(self._data) + len(self._prio)

    def occupancy(self) -> tuple[float, float]:
        """(data, priority) bytes the link would still hold: queued minus the bucket's credit."""
        credit = self.bucket.tokens if self.bucket is not None else 0.0
        if credit <= 0:
            return float(self.data_bytes), float(self.prio_bytes)
        prio = self.prio_bytes - credit
        if prio >= 0:
            return float(self.data_bytes), prio
        data = self.data_bytes + prio
        return (data if data > 0 else 0.0), 0.0

    # -- enqueue ----------------------------------------------------------------------------

    def offer(self, packet: Packet, tos: int, now: float) -> Verdict:
        """Take one received UDP payload (copied: `packet` may be a reused buffer)."""
        st = self.stats
        size = len(packet)
        st.received_packets += 1
        st.received_bytes += size
        bucket = self.bucket
        if bucket is None:
            self._data.append((bytes(packet), tos, now))
            self.data_bytes += size
            return Verdict.QUEUED
        bucket.refill(now, not self._data and not self._prio)
        data_queued, prio_queued = self.occupancy()
        if bucket.tokens <= 0:
            data_queued = float(self.data_bytes)
        verdict, tos, size = decide(
            self.policy, data_queued, prio_queued, size, tos, is_data(packet)
        )
        if verdict is Verdict.QUEUED or verdict is Verdict.MARKED:
            if verdict is Verdict.MARKED:
                st.ce_marked += 1
            self._data.append((bytes(packet), tos, now))
            self.data_bytes += size
            if data_queued + size > st.max_queue_bytes:
                st.max_queue_bytes = int(data_queued + size)
        elif verdict is Verdict.TRIMMED or verdict is Verdict.PRIORITY:
            if verdict is Verdict.TRIMMED:
                st.trimmed += 1
            self._prio.append((bytes(packet[:size]), tos, now))
            self.prio_bytes += size
            st.priority += 1
            if prio_queued + size > st.max_priority_bytes:
                st.max_priority_bytes = int(prio_queued + size)
        elif verdict is Verdict.DROPPED_QUEUE:
            st.dropped_queue += 1
        else:
            st.dropped_priority += 1
        return verdict

    # -- dequeue ----------------------------------------------------------------------------

    def pop_ready(self, now: float) -> list[tuple[bytes, int]]:
        """Every packet the link has started sending by `now`, priority first: (bytes, TOS)."""
        out: list[tuple[bytes, int]] = []
        bucket = self.bucket
        prio, data = self._prio, self._data
        if bucket is None:
            while data:
                pkt, tos, _ = data.popleft()
                out.append((pkt, tos))
            self.data_bytes = 0
            return out
        if not prio and not data:
            bucket.refill(now, True)
            return out
        bucket.refill(now, False)
        st = self.stats
        rate = bucket.rate
        tokens = bucket.tokens
        while tokens >= 0:
            if prio:
                pkt, tos, since = prio.popleft()
                self.prio_bytes -= len(pkt)
            elif data:
                pkt, tos, since = data.popleft()
                self.data_bytes -= len(pkt)
            else:
                break
            # The link became free for it `tokens / rate` ago, or when it arrived if later.
            start = now - tokens / rate
            if start < since:
                start = since
            waited = start - since
            st.delay_sum += waited
            st.delay_samples += 1
            if waited > st.delay_max:
                st.delay_max = waited
            if now - start > st.lateness_max:
                st.lateness_max = now - start
            tokens -= len(pkt)
            out.append((pkt, tos))
        bucket.tokens = tokens
        return out

    def next_departure(self, now: float) -> float | None:
        """When the head packet may leave (≤ now: at once), or None if nothing is queued."""
        if not self._prio and not self._data:
            return None
        bucket = self.bucket
        if bucket is None:
            return now
        tokens = bucket.tokens
        if now > bucket.stamp:
            tokens += (now - bucket.stamp) * bucket.rate
        return now if tokens >= 0 else now - tokens / bucket.rate

    def clear(self) -> int:
        """Forget everything queued (the relay is stopping); returns how many packets that was."""
        n = len(self)
        self.stats.left_queued += n
        self._data.clear()
        self._prio.clear()
        self.data_bytes = self.prio_bytes = 0
        return n
