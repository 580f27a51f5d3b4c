"""Messages waiting for their AETH: every PSN acknowledged, the outcome not yet heard.

A WRITE completes only on its AETH (docs/DESIGN.md §2). The responder repeats the AETH for every
duplicate of a message's LAST (docs/WIRE.md §4), so when it is overdue the sender resends the
LAST, on a backoff from the slowest plane's RTO up to `max_rto`. This module keeps those
messages in acknowledgement order with their deadlines; the sender builds and sends the
resends (without a send record: their PSN is acknowledged and never in flight again).
"""

from __future__ import annotations

from collections import deque

from .records import OutMessage


class AwaitingAeth:
    def __init__(self, max_interval: float) -> None:
        self.max_interval = max_interval
        self._messages: deque[OutMessage] = deque()
        # The earliest deadline of a message still waiting, or None for none; computed again
        # only when an outcome may have removed it (`settle`), not at every output pull (a
        # walk over every message waiting: hundreds of small WRITEs each RTT).
        self._earliest: float | None = None
        self._stale = False

    def __len__(self) -> int:
        return len(self._messages)

    def add(self, msg: OutMessage, now: float, interval: float) -> None:
        """Every PSN of `msg` is acknowledged: its AETH is due within `interval`."""
        msg.completion_interval = interval
        msg.completion_deadline = deadline = now + interval
        self._messages.append(msg)
        if self._earliest is None or deadline < self._earliest:
            self._earliest = deadline

    def due(self, now: float) -> list[OutMessage]:
        """The messages whose AETH is overdue at `now`; each one's next deadline backs off."""
        earliest = self.deadline()
        if earliest is None or earliest > now:
            return []
        out = []
        for msg in self._messages:
            deadline = msg.completion_deadline
            if msg.status is not None or deadline is None or deadline > now:
                continue
            msg.completion_interval = min(self.max_interval, msg.completion_interval * 2)
            msg.completion_deadline = now + msg.completion_interval
            out.append(msg)
        self._stale = True
        return out

    def deadline(self) -> float | None:
        """The earliest deadline of a message still waiting, or None."""
        if self._stale:
            earliest: float | None = None
            for m in self._messages:
                deadline = m.completion_deadline
                if m.status is not None or deadline is None:
                    continue
                if earliest is None or deadline < earliest:
                    earliest = deadline
            self._earliest = earliest
            self._stale = False
        return self._earliest

    def settle(self) -> None:
        """Forget the messages at the front whose outcome arrived (outcomes came: the
        earliest deadline is looked for again when next asked)."""
        messages = self._messages
        while messages and messages[0].status is not None:
            messages.popleft()
        self._stale = True
