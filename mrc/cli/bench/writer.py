"""The writer's role in a bench test: which message goes next, where, and what it carries.

Both ways a test travels write by this rule: the in-process test on a session (`stream`) and
the test through the daemons (`daemon`). Message n is `length(n)` bytes (the last of a
byte-count test may be short) into slot n mod `slots` of the receiver's DATA region
(`slot_offset`); with --verify its bytes are the pattern stream from `source_offset(n)` and it
is a WRITE_WITH_IMM carrying n (`imm`), so the receiver can check it (`receiver.Verifier`).
The writer stops after `count` messages (a byte count) or at `MAX_MESSAGES`, below the
reserved immediates (`proto`). How a WRITE is posted and its completion read is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .proto import MAX_MESSAGES, Pattern, message_count, message_length

__all__ = ["WritePlan"]


@dataclass(frozen=True, slots=True)
class WritePlan:
    msg_size: int
    #: Bytes of the test (0: it runs for a time).
    total_bytes: int
    #: Slots of the receiver's DATA region.
    slots: int
    #: --verify's byte stream (None: the bytes are not checked, messages carry no immediate).
    pattern: Pattern | None = None

    @property
    def count(self) -> int | None:
        """Messages of a byte-count test (None: a timed test)."""
        return message_count(self.msg_size, self.total_bytes)

    def more(self, n: int) -> bool:
        """Is there a message n to post?"""
        return n < MAX_MESSAGES and self.length(n) > 0

    def length(self, n: int) -> int:
        return message_length(n, self.msg_size, self.total_bytes)

    def slot_offset(self, n: int) -> int:
        """Where message n lands in the receiver's DATA region."""
        return n % self.slots * self.msg_size

    def source_offset(self, n: int) -> int:
        """Where message n's bytes start in the pattern stream (0 without --verify)."""
        return n * Pattern.STRIDE % Pattern.PERIOD if self.pattern is not None else 0

    def imm(self, n: int) -> int | None:
        """Message n's immediate: n with --verify, else none (a plain WRITE)."""
        return n if self.pattern is not None else None
