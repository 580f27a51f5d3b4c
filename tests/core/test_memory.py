"""The region table (mrc.core.memory): R_Key lookups, what deregistering takes away, and the
peers a region is for."""

from __future__ import annotations

import random

import pytest

from mrc.core.errors import LocalProtocolError
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


def test_a_region_registered_for_named_peers_allows_only_their_keys() -> None:
    table = RegionTable(random.Random(2))
    alice, bob = bytes(range(32)), bytes(range(1, 33))
    anyone = table.register(bytearray(4096))
    scoped = table.register(bytearray(4096), peers=[alice])
    nobody = table.register(bytearray(4096), peers=())
    assert anyone.peers is None and scoped.peers == frozenset({alice})
    # Any key, and an unsecured connection (no key proved), may write a region for anyone.
    assert [anyone.allows(k) for k in (alice, bob, None)] == [True, True, True]
    # A scoped region: the named key only; an unsecured connection proved none.
    assert [scoped.allows(k) for k in (alice, bob, None)] == [True, False, False]
    assert [nobody.allows(k) for k in (alice, bob, None)] == [False, False, False]


def test_peers_must_be_a_collection_of_32_byte_keys() -> None:
    table = RegionTable(random.Random(3))
    with pytest.raises(LocalProtocolError, match="not one key"):
        table.register(bytearray(4096), peers=bytes(32))  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="32 bytes"):
        table.register(bytearray(4096), peers=[b"short"])
    assert len(table) == 0
