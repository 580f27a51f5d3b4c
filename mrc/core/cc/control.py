"""Congestion control: how many payload bytes a sender may have in flight (docs/DESIGN.md §7).

A policy sits behind the small `CongestionControl` ABC and is chosen by name from a registry
(`SessionConfig.cc`), like the spray policies. The sender feeds it what it learns, always with
`now`: acknowledged bytes with the RTT sample of the triggering packet's own send record (Karn's
rule) and its ECN echo (SETH `m`), trimmed NACKs, and losses; it asks `can_send(inflight)`
before each transmission. Every policy honours the receiver's `rcv_cwnd_pen` (docs/WIRE.md §4): the
effective window is `min(cwnd, max(payload_mtu, cwnd × (128 - pen) / 128))`, cwnd unchanged.

- `none`: the window only. cwnd is the sender's packet window (`max_inflight`, else MPR × 128)
  in bytes, so it never limits more than that window already does; only `rcv_cwnd_pen` bites.
- `nscc`: UEC's NSCC as htsim implements it (docs/DESIGN.md §7): a
  window in bytes moved by the four quadrants of (ECN echo, queueing delay vs target),
  multiplicative decrease at most once per base RTT, and quick adapt after a loss or a
  trimmed NACK. The UEC constants are defined at 100 Gbit/s and 12 µs and scale with the
  measured base RTT and the line rate (`NsccParams`).

The sender holds new packets and the resends of trimmed ones to the window; resends of lost
packets (RACK, RTO, a plane down) go at once, since in MRC a loss is a broken path and those
bytes already left the network. There is no pacing: a host's NIC serialises each burst at
line rate and NSCC (like htsim's) is a pure window; a flowcell is cut short where the window
closes, packet by packet.

NSCC also caps a plane that queues on its own (planeq.py, beyond UEC): one window per
connection cannot see that one slow plane of several is overflowing a queue that marks nothing.

What it leaves to others: which packets are in flight, lost or acknowledged (sender.py), and
which EV carries them (spray.py; ECN echoes and trims also mark EVs SKIP in evs.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..config import SessionConfig
from ..errors import LocalProtocolError
from .planeq import PlaneQueues

#: docs/DESIGN.md §7: the UEC constants are given for 100 Gbit/s and a 12 µs RTT.
REF_RTT: Final = 12e-6
REF_BDP: Final = 100e9 / 8 * REF_RTT
#: Multiplicative decrease gain and its floor (UEC gamma, max_md_jump).
GAMMA: Final = 0.8
MAX_MD_JUMP: Final = 0.5
#: EWMA gain of the average queueing delay.
DELAY_ALPHA: Final = 0.0125
#: Quick adapt only if the bytes achieved in the last period are below maxwnd >> QA_GATE.
QA_GATE: Final = 3
#: Quick adapt also fires on a delay above QA_DELAY × target.
QA_DELAY: Final = 4.0
#: Adjustments are applied every base RTT, or after this many MTUs acknowledged.
ADJUST_PACKETS: Final = 8
#: The largest window is MAX_WND_BDP × BDP.
MAX_WND_BDP: Final = 1.5
#: Fast increase below this delay: 1 µs at the reference RTT, scaled with the base RTT.
FAST_DELAY: Final = 1e-6 / REF_RTT


class CongestionControl(ABC):
    """A window in bytes of payload; `window` is what the sender may have in flight."""

    def __init__(self, config: SessionConfig) -> None:
        self.mtu = config.payload_mtu
        #: Congestion window, bytes of payload.
        self.cwnd = float(self.mtu)
        #: The receiver's push-back from the latest SACK, 0 … 127 (docs/WIRE.md §4).
        self.rcv_cwnd_pen = 0

    @property
    def window(self) -> float:
        """The effective window: cwnd narrowed by `rcv_cwnd_pen` (docs/WIRE.md §4)."""
        cwnd, pen = self.cwnd, self.rcv_cwnd_pen
        if not pen:
            return cwnd
        return min(cwnd, max(self.mtu, cwnd * (128 - pen) / 128))

    def can_send(self, inflight: int) -> bool:
        """One more full packet fits beside `inflight` payload bytes (one always fits alone)."""
        return inflight + self.mtu <= self.window or inflight == 0

    @abstractmethod
    def on_ack(
        self,
        now: float,
        *,
        acked: int,
        rtt: float | None,
        plane: int,
        ecn: bool,
        pen: int,
        inflight: int,
    ) -> None:
        """A SACK acknowledged `acked` new bytes. `rtt` is the Karn-valid sample of its
        triggering packet (sent on `plane`), `ecn` its CE echo, `pen` its `rcv_cwnd_pen`."""

    def on_nack(self, now: float, *, nacked: int, lasthop: bool, inflight: int) -> None:  # noqa: B027
        """A TRIMMED (or TRIMMED_LASTHOP) NACK for a packet of `nacked` bytes."""

    def plane_window(self, plane: int) -> float | None:
        """The bytes `plane` may have in flight, or None where only `window` limits it."""
        return None

    def on_plane_sample(  # noqa: B027
        self, plane: int, rtt: float, *, acked: int, inflight: int, now: float
    ) -> None:
        """A Karn-valid RTT sample of a packet sent on `plane` (`inflight` bytes in flight
        there), whose SACK newly acknowledged `acked` bytes."""

    def on_loss(self, now: float, *, lost: int, inflight: int) -> None:  # noqa: B027
        """Packets of `lost` bytes were declared lost (RACK or RTO) since the last call."""

    def on_local_drop(self, plane: int, now: float, *, inflight: int) -> None:  # noqa: B027
        """A local queue of `plane` refused a transmit (`inflight` bytes still out there)."""

    def on_plane_silent(self, plane: int, now: float) -> None:  # noqa: B027
        """Everything `plane` carried was declared lost while the peer answered on the other
        planes (its RTO, or the silent-plane resend): it delivers nothing for now."""


class WindowOnly(CongestionControl):
    """`none`: the packet window in bytes; only the receiver's push-back narrows it."""

    def __init__(self, config: SessionConfig) -> None:
        super().__init__(config)
        self.cwnd = float((config.max_inflight or config.window) * self.mtu)

    def on_ack(
        self,
        now: float,
        *,
        acked: int,
        rtt: float | None,
        plane: int,
        ecn: bool,
        pen: int,
        inflight: int,
    ) -> None:
        self.rcv_cwnd_pen = pen


@dataclass(frozen=True, slots=True)
class NsccParams:
    """NSCC's constants for one base RTT and line rate (docs/DESIGN.md §7).

    With a = BDP / BDP_ref and b = target / RTT_ref (100 Gbit/s, 12 µs): alpha = 4·MTU·a·b /
    target, fi = 5·MTU·a, fi_scale = 0.25·a, eta = 0.15·MTU·a; the window tops out at
    1.5 × BDP (or `cc_max_cwnd`), the target is `cc_target` × base RTT, quick adapt fires above
    4 × target, and adjustments are applied every base RTT or 8 MTUs.
    """

    base_rtt: float
    bdp: float
    target: float
    maxwnd: float
    alpha: float
    fi: float
    fi_scale: float
    eta: float
    qa_threshold: float
    fast_delay: float

    @classmethod
    def scaled(cls, config: SessionConfig, base_rtt: float) -> NsccParams:
        mtu = config.payload_mtu
        line_rate = config.cc_plane_rate * len(config.planes) / 8  # bytes per second
        bdp = base_rtt * line_rate
        target = config.cc_target * base_rtt
        a = bdp / REF_BDP
        b = target / REF_RTT
        maxwnd = config.cc_max_cwnd or MAX_WND_BDP * bdp
        return cls(
            base_rtt=base_rtt,
            bdp=bdp,
            target=target,
            maxwnd=max(float(mtu), maxwnd),
            alpha=4 * mtu * a * b / target,
            fi=5 * mtu * a,
            fi_scale=0.25 * a,
            eta=0.15 * mtu * a,
            qa_threshold=QA_DELAY * target,
            fast_delay=FAST_DELAY * base_rtt,
        )


class Nscc(CongestionControl):
    """UEC NSCC (docs/DESIGN.md §7), one window per connection.

    The base RTT is the smallest RTT seen; queueing delay is measured against the smallest RTT
    of the sample's own plane, so planes of different length do not read as queueing. Until
    the first sample the window is 1.5 × BDP at `cc_base_rtt`.
    """

    def __init__(self, config: SessionConfig) -> None:
        super().__init__(config)
        self.config = config
        self.p = NsccParams.scaled(config, max(config.cc_base_rtt, config.cc_min_base_rtt))
        self.cwnd = self.p.maxwnd
        self.base_rtt: float | None = None
        self._plane_base: dict[int, float] = {}
        #: EWMA of the queueing delay (the MD decision uses it).
        self.avg_delay = 0.0
        #: Window growth accumulated since the last adjustment (bytes², applied as inc / cwnd).
        self._inc = 0.0
        self._received = 0  # bytes acknowledged since the last adjustment
        self._last_adjust = 0.0
        self._last_decrease: float | None = None
        self._fi_count = 0  # bytes acknowledged in a row at a delay below fast_delay
        self._increasing = False  # fast increase in progress
        # Quick adapt: the bytes achieved in the current period and when it ends; after a QA,
        # signals about the `_to_ignore` bytes already in flight are ignored.
        self._achieved = 0
        self._qa_end: float | None = None
        self._trigger_qa = False
        self._ignored = 0
        self._to_ignore = 0
        self.planes = PlaneQueues(
            self.mtu, config.plane_queue_min, config.cc_min_base_rtt, config.plane_initial_cap
        )
        #: A CE echo arrived: from now on the fabric's marks, not delay alone, say "queue".
        self._ecn_seen = False

    def plane_window(self, plane: int) -> float | None:
        return self.planes.window(plane)

    def on_plane_sample(
        self, plane: int, rtt: float, *, acked: int, inflight: int, now: float
    ) -> None:
        self.planes.on_sample(plane, rtt, acked, inflight, now)

    def on_local_drop(self, plane: int, now: float, *, inflight: int) -> None:
        # The plane's own first hop overflowed: its cap's business, not the window's.
        self.planes.on_overflow(plane, inflight, now)

    def on_plane_silent(self, plane: int, now: float) -> None:
        # A dead plane never sends the RTT samples that shrink its cap: restart it, as TCP
        # restarts its window after an RTO, so it takes a flowcell or two, not megabytes.
        self.planes.restart(plane)

    # -- inputs -----------------------------------------------------------------------------

    def on_ack(
        self,
        now: float,
        *,
        acked: int,
        rtt: float | None,
        plane: int,
        ecn: bool,
        pen: int,
        inflight: int,
    ) -> None:
        self.rcv_cwnd_pen = pen
        self._achieved += acked
        self._received += acked
        self._ignored += acked
        if ecn:
            self._ecn_seen = True
        delay = self.avg_delay
        if rtt is not None:
            base = self._base_for(plane, rtt)
            # A plane's own queue is its cap's business (planeq.py): the window reads the
            # delay the planes share, so one slow plane does not shrink them all.
            delay = max(rtt - base - self.planes.own_delay(plane), 0.0)
            if not self._ecn_seen:
                # A fabric that has not marked a packet yet may mark none (a Linux router,
                # a tbf): its queues show only as delay, so a long delay reads as a mark.
                ecn = delay >= self.config.cc_delay_mark
            self._update_delay(delay, ecn)
        if self._quick_adapt(now, is_loss=False, ecn=ecn, delay=delay, inflight=inflight):
            return
        p = self.p
        # The four quadrants (docs/DESIGN.md §7).
        if not ecn:
            if delay >= p.target:
                self._inc += p.fi * acked  # fair increase
            else:
                self._proportional_increase(acked, delay)
        elif delay >= p.target:
            self._multiplicative_decrease(now)
        # ECN with a low delay: no change, the EV is skipped instead (docs/DESIGN.md §4).
        self._bound()
        if self._received > ADJUST_PACKETS * self.mtu or now - self._last_adjust > p.base_rtt:
            self._adjust(now)
            self._bound()

    def on_nack(self, now: float, *, nacked: int, lasthop: bool, inflight: int) -> None:
        """htsim `updateCwndOnNack_NSCC`: the delay sample reads one base RTT, quick adapt is
        armed, and without one the window loses the trimmed bytes (last hop included)."""
        self._ignored += nacked
        self._update_delay(self.p.base_rtt, ecn=True)
        self._trigger_qa = True
        if not self._quick_adapt(now, is_loss=True, ecn=True, delay=0.0, inflight=inflight):
            self.cwnd -= nacked
            self._bound()

    def on_loss(self, now: float, *, lost: int, inflight: int) -> None:
        """A loss arms quick adapt and nothing else: in MRC a lost packet means a broken path,
        which retires its EV (docs/DESIGN.md §6); congestion shows as ECN and trims. Quick adapt
        only bites if the flow's delivery collapsed (qa_gate), as in an incast that drops."""
        self._trigger_qa = True
        self._quick_adapt(now, is_loss=True, ecn=True, delay=0.0, inflight=inflight)

    # -- the rules --------------------------------------------------------------------------

    def _base_for(self, plane: int, rtt: float) -> float:
        """The smallest RTT of `plane` (never below `cc_min_base_rtt`); a new overall minimum
        rescales the constants."""
        rtt = max(rtt, self.config.cc_min_base_rtt)
        base = self._plane_base.get(plane)
        if base is None or rtt < base:
            base = self._plane_base[plane] = rtt
            if self.base_rtt is None or rtt < self.base_rtt:
                self.base_rtt = max(rtt, 1e-9)
                self.p = NsccParams.scaled(self.config, self.base_rtt)
                self._bound()
        return base

    def _update_delay(self, delay: float, ecn: bool) -> None:
        # htsim `update_delay`: an unmarked delay above target is not this flow's queue (no
        # switch on the way marked it), so it pulls the average toward a quarter base RTT.
        sample = self.p.base_rtt / 4 if not ecn and delay > self.p.target else delay
        self.avg_delay += DELAY_ALPHA * (sample - self.avg_delay)

    def _proportional_increase(self, acked: int, delay: float) -> None:
        p = self.p
        if delay < p.fast_delay:
            # Fast increase: a whole window acknowledged at (almost) no queueing.
            self._fi_count += acked
            if self._fi_count > self.cwnd or self._increasing:
                self.cwnd += acked * p.fi_scale
                self._increasing = True
                return
        else:
            self._fi_count = 0
        self._increasing = False
        self._inc += p.alpha * acked * (p.target - delay)

    def _multiplicative_decrease(self, now: float) -> None:
        """At most once per base RTT, by the averaged delay's excess over target."""
        self._increasing = False
        self._fi_count = 0
        p, avg = self.p, self.avg_delay
        if avg <= p.target:
            return
        if self._last_decrease is not None and now - self._last_decrease <= p.base_rtt:
            return
        self.cwnd *= max(1 - GAMMA * (avg - p.target) / avg, MAX_MD_JUMP)
        self._last_decrease = now

    def _adjust(self, now: float) -> None:
        """htsim `fulfill_adjustment`: apply the accumulated increase, plus eta once a period."""
        self.cwnd += self._inc / self.cwnd
        if now - self._last_adjust >= self.p.base_rtt:
            self.cwnd += self.p.eta
            self._last_adjust = now
        self._inc = 0.0
        self._received = 0

    def _quick_adapt(
        self, now: float, *, is_loss: bool, ecn: bool, delay: float, inflight: int
    ) -> bool:
        """After a loss, a trim or a delay above 4 × target, fall back to the bytes achieved
        in the last (base RTT + target), when that is far below the window (UEC qa_gate); at
        most once a period. True: this signal is consumed (a QA ran or is being absorbed)."""
        done = False
        if ecn and self._ignored < self._to_ignore:
            done = True  # a mark on a packet sent before the last QA took effect
        elif self._qa_end is None or now > self._qa_end:
            p = self.p
            if (
                self._qa_end is not None
                and (self._trigger_qa or is_loss or delay > p.qa_threshold)
                and self._achieved < p.maxwnd / (1 << QA_GATE)
            ):
                self.cwnd = max(float(self._achieved), float(self.mtu))
                self._to_ignore = inflight
                self._ignored = 0
                self._trigger_qa = False
                done = True
            self._achieved = 0
            self._qa_end = now + p.base_rtt + p.target
        if done:
            self._inc = 0.0
            self._received = 0
        return done

    def _bound(self) -> None:
        self.cwnd = min(max(self.cwnd, float(self.mtu)), self.p.maxwnd)


CcFactory = Callable[[SessionConfig], CongestionControl]

_REGISTRY: Final[dict[str, CcFactory]] = {
    "none": WindowOnly,
    "nscc": Nscc,
}


def register_cc(name: str, factory: CcFactory) -> None:
    _REGISTRY[name] = factory


def cc_names() -> list[str]:
    return sorted(_REGISTRY)


def make_cc(name: str, config: SessionConfig) -> CongestionControl:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise LocalProtocolError(
            f"unknown congestion control {name!r} (known: {', '.join(cc_names())})"
        ) from None
    return factory(config)
