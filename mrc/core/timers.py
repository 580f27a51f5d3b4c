"""The session's one timer table (docs/DESIGN.md §3).

Deadlines keyed by (`Timer`, plane-or-None); `next_deadline()` is what `Session.get_timer()`
returns. The table holds absolute times in the caller's clock and never reads a clock itself.
"""

from __future__ import annotations

from enum import Enum


class Timer(Enum):
    RETRANSMIT = "retransmit"  # per plane: RFC 6298 RTO
    REORDER = "reorder"  # per-EV RACK reordering window (RFC 8985)
    COMPLETION = "completion"  # all PSNs of a message acked, its AETH not yet seen
    PLANE_PROBE = "plane_probe"  # per plane: probe a DOWN plane, or a plane at its EV floor
    EV_PROBE = "ev_probe"  # probe retired (ASSUMED_BAD) EVs
    REVERSE_PROBE = "reverse_probe"  # EV_PROBE the reverse EVs of planes nothing proved
    CM_RETRY = "cm_retry"  # requester: resend REQUEST
    HALF_OPEN = "half_open"  # responder: give up on a requester that never spoke after REPLY

    # Enum's own __hash__ is Python code (a hash of the name), run for every table access
    # through the (timer, plane) key; members are singletons compared by identity, so the
    # identity hash in C agrees with equality.
    __hash__ = object.__hash__


TimerKey = tuple[Timer, int | None]


class TimerTable:
    def __init__(self) -> None:
        self._deadlines: dict[TimerKey, float] = {}

    def set(self, timer: Timer, deadline: float, plane: int | None = None) -> None:
        self._deadlines[(timer, plane)] = deadline

    def cancel(self, timer: Timer, plane: int | None = None) -> None:
        self._deadlines.pop((timer, plane), None)

    def get(self, timer: Timer, plane: int | None = None) -> float | None:
        return self._deadlines.get((timer, plane))

    def next_deadline(self) -> float | None:
        # A loop, not `min(..., default=None)`: compiled, a builtin called with a keyword is
        # a generic call, and this runs at every flush pass (docs/DESIGN.md §11).
        first: float | None = None
        for deadline in self._deadlines.values():
            if first is None or deadline < first:
                first = deadline
        return first

    def pop_expired(self, now: float) -> list[TimerKey]:
        """Remove and return every key due at `now`, earliest first."""
        due = sorted(
            (d, k[0].value, k[1] if k[1] is not None else -1, k)
            for k, d in self._deadlines.items()
            if d <= now
        )
        for *_, key in due:
            del self._deadlines[key]
        return [key for *_, key in due]

    def clear(self) -> None:
        self._deadlines.clear()
