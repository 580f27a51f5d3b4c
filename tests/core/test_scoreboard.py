"""The sender's SACK scoreboard (mrc.core.send.scoreboard): new bits of a block, as PSN offsets."""

from __future__ import annotations

import random

from mrc.core.send.scoreboard import SackScoreboard, reverse64

PSN_MOD = 1 << 24


def test_reverse64_turns_the_bit_order_round() -> None:
    assert reverse64(1 << 63) == 1
    assert reverse64(1) == 1 << 63
    assert reverse64(0x7F << 56) == 0xFE
    rng = random.Random(3)
    for _ in range(200):
        x = rng.getrandbits(64)
        assert reverse64(x) == int(f"{x:064b}"[::-1], 2)
        assert reverse64(reverse64(x)) == x


def test_new_span_gives_each_bit_once_from_una_within_what_was_sent() -> None:
    board = SackScoreboard()
    # Block 1024..1087, una 1030, 40 PSNs sent from una (1030..1069): PSNs 1024 (behind una),
    # 1030, 1031, 1069 and 1070 (not sent) are reported.
    bitmap = sum(1 << (63 - k) for k in (0, 6, 7, 45, 46))
    assert board.new_span(1024, bitmap, 1030, 40) == (1 << 6) | (1 << 7) | (1 << 45)
    # The same bits again are nothing new; one more bit is.
    assert board.new_span(1024, bitmap, 1030, 40) == 0
    assert board.new_span(1024, bitmap | 1 << (63 - 8), 1030, 40) == 1 << 8


def test_new_span_of_a_block_ahead_of_una_and_across_the_psn_wrap() -> None:
    board = SackScoreboard()
    una = PSN_MOD - 10
    # The block starts 20 PSNs after una, past the wrap; 25 PSNs were sent from una.
    base = (una + 20) % PSN_MOD
    assert board.new_span(base, (1 << 63) | (1 << 59) | (1 << 58), una, 25) == 1 | 1 << 4
    # A block wholly beyond what was sent gives nothing.
    assert board.new_span((una + 64) % PSN_MOD, 1 << 63, una, 25) == 0
