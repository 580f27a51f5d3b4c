"""The receiver's role in a bench test: check each message as its immediate arrives.

Both ways a test travels receive by this rule: the in-process test on a session (`stream`) and
the test through the daemons (`daemon`). With --verify message n is a WRITE_WITH_IMM carrying
n into slot n mod slots (`writer.WritePlan`); when its immediate arrives, the slot holds it
until the writer reuses the slot, which it does only after the message completed. A message is
verified when it is the next one expected and its bytes are the pattern's (`proto.Pattern`);
anything else is a mismatch. How immediates arrive and how the counts travel back is the
caller's.
"""

from __future__ import annotations

from .proto import Pattern, message_length

__all__ = ["Verifier"]


class Verifier:
    """Counts of one receiver: messages verified, mismatches, the next message expected."""

    __slots__ = (
        "mismatches",
        "msg_size",
        "next_expected",
        "pattern",
        "slots",
        "total_bytes",
        "verified",
    )  # fmt: skip

    def __init__(self, pattern: Pattern | None, msg_size: int, total_bytes: int, slots: int):
        self.pattern = pattern
        self.msg_size = msg_size
        self.total_bytes = total_bytes
        self.slots = slots
        self.verified = 0
        self.mismatches = 0
        self.next_expected = 0

    def length(self, n: int) -> int:
        return message_length(n, self.msg_size, self.total_bytes)

    def arrived(self, n: int, data: memoryview) -> int:
        """Message n's immediate arrived and `data` is the DATA region: check its slot (only
        its order without a pattern). Returns the message's length."""
        length = message_length(n, self.msg_size, self.total_bytes)
        in_order = n == self.next_expected
        self.next_expected = n + 1
        if self.pattern is None:
            self.mismatches += not in_order
            return length
        off = n % self.slots * self.msg_size
        view = data[off : off + length]
        if in_order and length > 0 and self.pattern.matches(view, n):
            self.verified += 1
        else:
            self.mismatches += 1
        return length
