"""Anti-replay memory (docs/WIRE.md §7): a secured direction's window, and REQUEST timestamps.

`ReplayWindow` remembers which transmit counters of the peer's direction were accepted, in the
style of RFC 6479: a ring of 64-bit bitmap blocks, so moving the window forward clears whole
blocks instead of shifting a long bitmap. One window per connection and direction, shared by
every plane: a packet that took a slow plane arrives after newer ones from a fast plane, so the
window is at least 4 × MPR × 128 counters wide.

It only answers and records. The caller asks `fresh(counter)` before it spends an AES-GCM
verification and calls `accept(counter)` only after the tag verified, so a forged packet can
neither move the window nor mark a counter as seen. Keys, tags and the drop counters belong to
`aead.py` and the session.

`RequestTimestamps` is the responder's memory of the sealed REQUESTs it accepted (revision
1.2): per requester static key, the newest TAI64N timestamp and those within the 10 s before
it, so a replayed REQUEST (or one more than 10 s older than the newest) is refused before it
leaves any state. Opening the REQUEST and counting the drop are the endpoint's.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

#: A sealed REQUEST more than this much older than the newest accepted from its key is refused.
REQUEST_MAX_AGE_NS: Final = 10_000_000_000
#: Requester keys remembered at most (only a responder that accepts any key can meet more keys
#: than its allowlist holds; the least recently accepted is forgotten first).
MAX_REQUEST_KEYS: Final = 4096

#: Bits per bitmap block (RFC 6479's word).
BLOCK_BITS: Final = 64
_BLOCK_SHIFT: Final = 6
_BIT_MASK: Final = BLOCK_BITS - 1


class ReplayWindow:
    """Counters in (top - width, top] are remembered; older ones are refused."""

    __slots__ = ("blocks", "mask", "top", "width")

    def __init__(self, width: int) -> None:
        if width < BLOCK_BITS:
            raise ValueError(f"replay window must be at least {BLOCK_BITS} counters, got {width}")
        # One block more than the width needs: the block holding `top` is only partly used,
        # and the window must still reach `width` counters back (RFC 6479 §2).
        blocks = 1 << (width // BLOCK_BITS).bit_length()
        #: The bitmap ring: block i holds counters i × 64 … i × 64 + 63 of its lap.
        self.blocks = [0] * blocks
        self.mask = blocks - 1
        self.width = width
        #: The highest counter accepted so far; -1 before the first.
        self.top = -1

    def fresh(self, counter: int) -> bool:
        """True iff `counter` is new: above the window, or inside it and not yet seen."""
        top = self.top
        if counter > top:
            return True
        if top - counter >= self.width:
            return False
        return not self.blocks[(counter >> _BLOCK_SHIFT) & self.mask] >> (counter & _BIT_MASK) & 1

    def stale(self, counter: int) -> bool:
        """True iff `counter` lies below the window (too old to tell whether it was seen)."""
        return self.top - counter >= self.width

    def accept(self, counter: int) -> None:
        """Record `counter` (whose tag verified); moves the window when it is the newest."""
        blocks = self.blocks
        mask = self.mask
        index = counter >> _BLOCK_SHIFT
        top = self.top
        if counter > top:
            current = top >> _BLOCK_SHIFT
            if index == current:  # the usual step: the same block, nothing to clear
                self.top = counter
                blocks[index & mask] |= 1 << (counter & _BIT_MASK)
                return
            # Blocks between the old top's and the new one's are from a past lap: clear them
            # (all of them at most once, however far the counter jumped).
            for i in range(current + 1, current + 1 + min(index - current, len(blocks))):
                blocks[i & mask] = 0
            self.top = counter
        blocks[index & mask] |= 1 << (counter & _BIT_MASK)


class RequestTimestamps:
    """The timestamps of the sealed REQUESTs accepted, per requester static key."""

    def __init__(self, max_keys: int = MAX_REQUEST_KEYS) -> None:
        self.max_keys = max_keys
        #: static key → (newest timestamp, timestamps accepted within REQUEST_MAX_AGE_NS of it)
        self._keys: OrderedDict[bytes, tuple[int, set[int]]] = OrderedDict()

    def fresh(self, key: bytes, ns: int) -> bool:
        """Whether a REQUEST from `key` stamped `ns` may be accepted: not seen, and not more
        than 10 s older than the newest accepted from that key."""
        seen = self._keys.get(key)
        if seen is None:
            return True
        newest, recent = seen
        return ns >= newest - REQUEST_MAX_AGE_NS and ns not in recent

    def accept(self, key: bytes, ns: int) -> None:
        """Record an accepted (opened and fresh) REQUEST's timestamp."""
        seen = self._keys.pop(key, None)
        newest, recent = seen if seen is not None else (ns, set())
        newest = max(newest, ns)
        recent.add(ns)
        floor = newest - REQUEST_MAX_AGE_NS
        self._keys[key] = (newest, {t for t in recent if t >= floor})
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
