"""Plane queue guard: a cap on the bytes in flight on a plane that queues on its own.

[beyond UEC] NSCC keeps one window per connection and reads queues from ECN marks; a delay
without a mark it takes for someone else's queue (docs/DESIGN.md §7). That is right
for MRC's symmetric planes behind ECN-marking switches, but not for planes of different speed
behind queues that never mark (a tbf-shaped veth plane, a degraded link): with equal shares
the slow plane's queue absorbs the whole window and overflows, and nothing tells NSCC.

So each plane's bytes in flight are capped, and the cap follows the plane's own queueing:
its RTT samples above the plane's smallest (EWMA), beyond the mean of the other planes' (a busy
host, or one bottleneck they share, delays every plane alike and indicts none). A plane
starts at 64 KiB (`plane_initial_cap`) and grows by half of what it gets acknowledged (about
1.5x per RTT, a slow start of its own) while its own delay stays under half the threshold
(`plane_queue_min`, or a quarter of the fastest base RTT when that is longer), and by one MTU
per cap acknowledged below the threshold. Above it the cap drops, at most once per the plane's
smoothed RTT, to the plane's pipe: what it delivers × (its base RTT + the delay all planes
share + the threshold), so a threshold's worth of queue stays (before a delivery rate is
measured, NSCC's multiplicative decrease by the delay's excess, at most halving). For 100
RTTs after a decrease the cap also stays under 1.5 × the pipe: the other planes are noisy too
and may hide the plane's queue, and a slow plane's shallow queue overflows within an RTT. The
least-queued plane is never decreased for delay, so the connection always has somewhere to send. A
transmit the plane's own first hop refused (a full host qdisc, ENOBUFS) cuts the cap to the
pipe at once (`on_overflow`): that queue never shows as delay, since its drops never come back.
For 100 RTTs after such an overflow the slow start also stops at the cap it left (a slow start
threshold, as TCP's after a loss) and growth above it is one MTU per cap acknowledged: the
delays are too noisy to show that queue filling again, and a slow start refilled it within a few
RTTs (a tbf-shaped plane lost 1.7-2.2 % of its packets so). A decrease for delay sets no
threshold: on a busy host delays also indict planes with no queue of their own, which must
get their share back quickly.

What it leaves to others: the sender counts each plane's bytes in flight and asks `window`
before a flowcell goes out; the balance policy and the spray rotation choose the plane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: EWMA gain of a plane's queueing delay and of its smoothed RTT.
GAIN: Final = 0.125
#: Multiplicative decrease of a plane's cap (NSCC's gain and floor), the smallest cap in MTUs.
GAMMA: Final = 0.8
MAX_CUT: Final = 0.5
MIN_CAP_MTUS: Final = 2
#: A plane's first cap (bytes: one full GSO flowcell), and its growth per acknowledged byte
#: while it shows no queue.
INITIAL_CAP: Final = 65536
GROW: Final = 0.5
#: A cap stays within HEADROOM × the plane's delivery rate × (base RTT + the delay every
#: plane shares + threshold).
HEADROOM: Final = 1.5
#: ... for this many smoothed RTTs after the plane's latest decrease (then it is free again:
#: one noisy sample must not bind a plane for good).
BOUNDED_FOR: Final = 100
#: The threshold as a fraction of the fastest plane's base RTT, when that is the larger.
QUEUE_FRACTION: Final = 0.25
#: Delivery rate: measured over at least this long (and a smoothed RTT), EWMA gain.
RATE_PERIOD: Final = 0.001
RATE_GAIN: Final = 0.5


@dataclass(slots=True)
class _Plane:
    cap: float  # bytes in flight allowed
    base: float = float("inf")  # smallest RTT seen
    excess: float = 0.0  # EWMA of RTT above base
    srtt: float = 0.0
    last_decrease: float = float("-inf")
    #: Set by an overflow of the plane's own queue: above it the cap grows by one MTU per cap
    #: acknowledged, until BOUNDED_FOR smoothed RTTs after `overflowed_at`.
    ssthresh: float = float("inf")
    overflowed_at: float = float("-inf")
    own: float = 0.0  # queueing delay of its own: excess beyond the other planes' mean
    rate: float = 0.0  # delivered bytes per second (EWMA), 0 until measured
    rate_bytes: int = 0
    rate_start: float | None = None


class PlaneQueues:
    """Per-plane caps on the bytes in flight, from each plane's own queueing delay."""

    def __init__(
        self, mtu: int, queue_min: float, min_base: float = 0.0, initial_cap: int | None = None
    ) -> None:
        self.mtu = mtu
        #: A new plane's first cap (`plane_initial_cap`; None = INITIAL_CAP).
        self.initial_cap = float(max(initial_cap or INITIAL_CAP, MIN_CAP_MTUS * mtu))
        self.queue_min = queue_min
        #: A plane's base RTT never reads below this (`cc_min_base_rtt`): the first flowcell
        #: of a connection crosses an idle host and would give its plane alone a base far
        #: below what any loaded plane can reach, so that plane would look queued for good.
        self.min_base = min_base
        self._planes: dict[int, _Plane] = {}

    def window(self, plane: int) -> float:
        """The bytes `plane` may have in flight."""
        return self._state(plane).cap

    def _state(self, plane: int) -> _Plane:
        st = self._planes.get(plane)
        if st is None:
            st = self._planes[plane] = _Plane(cap=self.initial_cap)
        return st

    def on_sample(self, plane: int, rtt: float, acked: int, inflight: int, now: float) -> None:
        """An RTT sample (Karn-valid) of a packet sent on `plane`, which has `inflight` bytes
        in flight; `acked` bytes sent on it were newly acknowledged with it."""
        st = self._state(plane)
        if rtt < st.base:
            st.base = max(rtt, self.min_base)
        st.excess += GAIN * (max(rtt - st.base, 0.0) - st.excess)
        st.srtt = rtt if not st.srtt else st.srtt + GAIN * (rtt - st.srtt)
        self._measure_rate(st, acked, now)
        shared, threshold, pipe = self._pipe(st)
        own = st.own = st.excess - shared if shared is not None else 0.0
        if own > threshold:
            if now - st.last_decrease >= st.srtt:
                target = pipe or max(1 - GAMMA * (own - threshold) / own, MAX_CUT) * inflight
                st.cap = max(min(st.cap, target), MIN_CAP_MTUS * self.mtu)
                st.last_decrease = now
        elif own < threshold / 2 and (
            st.cap < st.ssthresh or now - st.overflowed_at >= BOUNDED_FOR * st.srtt
        ):
            st.cap += acked * GROW
        else:
            st.cap += self.mtu * acked / st.cap
        if pipe and now - st.last_decrease < BOUNDED_FOR * st.srtt:
            # Never far above the pipe: the others' delays are noisy too and may hide this
            # plane's queue, and a shallow queue overflows within one RTT.
            st.cap = max(min(st.cap, HEADROOM * pipe), MIN_CAP_MTUS * self.mtu)

    def on_overflow(self, plane: int, inflight: int, now: float) -> None:
        """A local queue of `plane` refused a transmit (a full qdisc on the host's own link):
        the cap was above what the plane holds. It drops to the plane's pipe (never above the
        `inflight` bytes left), or to half of those before a rate is measured; at most once
        per smoothed RTT, as a delay-driven decrease."""
        st = self._state(plane)
        if now - st.last_decrease < st.srtt:
            return
        pipe = self._pipe(st)[2]
        target = min(pipe, inflight) if pipe else MAX_CUT * inflight
        st.cap = st.ssthresh = max(min(st.cap, target), MIN_CAP_MTUS * self.mtu)
        st.last_decrease = st.overflowed_at = now

    def restart(self, plane: int) -> None:
        """`plane` delivered nothing while the others did: back to the first cap (its
        measurements stay; its answers, when they come, grow the cap again)."""
        st = self._state(plane)
        st.cap = min(st.cap, self.initial_cap)

    def _pipe(self, st: _Plane) -> tuple[float | None, float, float]:
        """(the delay the other planes share, the queue threshold, `st`'s pipe): its delivery
        rate × (its base RTT + the shared delay + the threshold); 0 before a rate."""
        planes = self._planes.values()
        # Only planes with RTT samples: one that never answered (dead from the start) has no
        # delay to compare, and its zero made the one live plane look queued on its own.
        others = [p.excess for p in planes if p is not st and p.srtt]
        shared = sum(others) / len(others) if others else None
        threshold = max(self.queue_min, QUEUE_FRACTION * min(p.base for p in planes))
        pipe = st.rate * (st.base + max(shared or 0.0, 0.0) + threshold) if st.rate else 0.0
        return shared, threshold, pipe

    def _measure_rate(self, st: _Plane, acked: int, now: float) -> None:
        if st.rate_start is None:
            st.rate_start = now
            return
        st.rate_bytes += acked
        elapsed = now - st.rate_start
        if elapsed >= max(RATE_PERIOD, st.srtt):
            sample = st.rate_bytes / elapsed
            st.rate = sample if not st.rate else st.rate + RATE_GAIN * (sample - st.rate)
            st.rate_bytes, st.rate_start = 0, now

    def own_delay(self, plane: int) -> float:
        """The queueing delay `plane` has of its own (0 if none): NSCC leaves it to the cap
        and reads only the delay the planes share."""
        st = self._planes.get(plane)
        return max(st.own, 0.0) if st is not None else 0.0

    def caps(self) -> dict[int, float]:
        """Every plane's cap now (for reports)."""
        return {p: st.cap for p, st in self._planes.items()}
