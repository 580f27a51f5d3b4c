"""The sender's SACK scoreboard: which bits of each 64-PSN block some SACK already reported.

SETH bitmaps repeat (every SACK of a block carries the whole block, docs/DESIGN.md §6), so the
sender acts only on bits no earlier SACK reported, and only on PSNs at or after `una`. Blocks
wholly behind `una` are forgotten once more than 64 are remembered. The sender acknowledges
the PSNs this returns; what an acknowledgement means is left to it.
"""

from __future__ import annotations

from typing import Final

from ...wire.bth import PSN_MOD

PSN_MASK: Final = PSN_MOD - 1
HALF: Final = PSN_MOD >> 1
#: Blocks remembered before the ones wholly behind `una` are dropped.
MAX_BLOCKS: Final = 64


class SackScoreboard:
    def __init__(self) -> None:
        self._blocks: dict[int, int] = {}

    def new_bits(self, base: int, bitmap: int, una: int) -> int:
        """The bits of `bitmap` (the block starting at PSN `base`, bit 63 = `base`) that no
        earlier SACK reported, cleared for PSNs before `una`; they are remembered."""
        seen = self._blocks.get(base, 0)
        bitmap &= ~seen
        if not bitmap:
            return 0
        self._blocks[base] = seen | bitmap
        behind = (una - base) & PSN_MASK
        if behind < 64:
            return bitmap & ((1 << (64 - behind)) - 1)
        return 0 if behind < HALF else bitmap

    def new_span(self, base: int, bitmap: int, una: int, span: int) -> int:
        """`new_bits` turned round, bit k for PSN `base + k` (what the sender's
        acknowledgement takes), keeping only the `span` PSNs from `una` (those sent and not
        yet acknowledged)."""
        bits = reverse64(self.new_bits(base, bitmap, una))
        if not bits:
            return 0
        behind = (una - base) & PSN_MASK
        limit = span + behind if behind < 64 else span - ((base - una) & PSN_MASK)
        if limit <= 0:
            return 0
        return bits & ((1 << limit) - 1) if limit < 64 else bits

    def forget_behind(self, una: int) -> None:
        """Drop blocks wholly behind `una` (nothing in them can be acknowledged again)."""
        if len(self._blocks) > MAX_BLOCKS:
            for block in [b for b in self._blocks if 64 <= (una - b) & PSN_MASK < HALF]:
                del self._blocks[block]


def reverse64(x: int) -> int:
    """The 64 bits of `x` in reverse order (a SETH bitmap's bit 63 is its block's first PSN)."""
    x = ((x >> 1) & 0x5555555555555555) | ((x & 0x5555555555555555) << 1)
    x = ((x >> 2) & 0x3333333333333333) | ((x & 0x3333333333333333) << 2)
    x = ((x >> 4) & 0x0F0F0F0F0F0F0F0F) | ((x & 0x0F0F0F0F0F0F0F0F) << 4)
    x = ((x >> 8) & 0x00FF00FF00FF00FF) | ((x & 0x00FF00FF00FF00FF) << 8)
    x = ((x >> 16) & 0x0000FFFF0000FFFF) | ((x & 0x0000FFFF0000FFFF) << 16)
    return (x >> 32) | ((x & 0xFFFFFFFF) << 32)
