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

    def __len__(self) -> int:
        return len(self._messages)

    def add(self, msg: OutMessage, now: float, interval: float) -> None:
        """Every PSN of `msg` is acknowledged: its AETH is due within `interval`."""
        msg.completion_interval = interval
        msg.completion_deadline = now + interval
        self._messages.append(msg)

    def due(self, now: float) -> list[OutMessage]:
        """The messages whose AETH is overdue at `now`; each one's next deadline backs off."""
        out = []
        for msg in self._messages:
            deadline = msg.completion_deadline
            if msg.status is not None or deadline is None or deadline > now:
                continue
            msg.completion_interval = min(self.max_interval, msg.completion_interval * 2)
            msg.completion_deadline = now + msg.completion_interval
            out.append(msg)
        return out

    def deadline(self) -> float | None:
        """The earliest deadline of a message still waiting, or None."""
        return min(
            (
                m.completion_deadline
                for m in self._messages
                if m.status is None and m.completion_deadline is not None
            ),
            default=None,
        )

    def settle(self) -> None:
        """Forget the messages at the front whose outcome arrived."""
        messages = self._messages
        while messages and messages[0].status is not None:
            messages.popleft()
