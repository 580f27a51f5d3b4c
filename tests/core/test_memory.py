"""The region table (mrc.core.memory): R_Key lookups, and what deregistering takes away."""

from __future__ import annotations

import random

from mrc.core.memory import RegionTable


def test_a_lookup_finds_each_region_and_none_once_it_is_deregistered() -> None:
    table = RegionTable(random.Random(1))
    a = table.register(bytearray(4096))
    b = table.register(bytearray(8192))
    # Alternating, and the same one twice (the table remembers the last one it found).
    assert [table.lookup(r.rkey) for r in (a, a, b, a, b, b)] == [a, a, b, a, b, b]
    assert table.lookup(a.rkey ^ 1) is None
    table.deregister(b)  # b was the last found: no lookup may return it now
    assert table.lookup(b.rkey) is None
    assert table.lookup(a.rkey) is a
    table.deregister(a)
    assert table.lookup(a.rkey) is None and len(table) == 0
