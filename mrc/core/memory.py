"""Registered memory regions: R_Keys, virtual addresses, bounds, pre-faulting.

A region is a writable buffer the peer may WRITE into, named on the wire by a random 32-bit
R_Key and a base virtual address (docs/WIRE.md §3 RETH). This module checks bounds, keeps which
peers a region is for (`peers`: the static public keys that may write it, None = any peer the
endpoint accepts) and resolves a (VA, R_Key, length) triple to a slice of the buffer; it never
decides *whether* a packet may be placed (the receiver's checks of docs/DESIGN.md §6 do that,
asking `Region.allows` and `Region.contains`) and never touches the OS. The VA is an
opaque 64-bit number chosen here, page-aligned, so a peer learns nothing about our process.
"""

from __future__ import annotations

import builtins
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from .errors import LocalProtocolError

PAGE: Final = 4096


def prefault(view: memoryview) -> None:
    """Write one byte per page (its own value) so first-touch faults never stall the receive
    path (docs/DESIGN.md §11); the buffer's content is unchanged."""
    if len(view):
        view[::PAGE] = bytes(view[::PAGE])


@dataclass(eq=False, slots=True)
class Region:
    """One registered buffer."""

    rkey: int
    base_va: int
    # builtins.memoryview: compiled, a dataclass field's type is looked up by this name.
    view: builtins.memoryview = field(repr=False)
    #: The static public keys of the peers whose connections may WRITE here; None: any.
    peers: frozenset[bytes] | None = None

    def allows(self, peer_key: bytes | None) -> bool:
        """Whether a connection whose peer proved `peer_key` (None: an unsecured connection,
        no key proved) may write here: any when `peers` is None, else only a named key."""
        peers = self.peers
        return peers is None or (peer_key is not None and peer_key in peers)

    @property
    def size(self) -> int:
        return len(self.view)

    def contains(self, va: int, length: int) -> bool:
        """docs/DESIGN.md §6: base ≤ VA and VA + len ≤ base + size."""
        return self.base_va <= va and va + length <= self.base_va + len(self.view)

    def local_slice(self, offset: int, length: int) -> memoryview:
        """The bytes at `offset` (relative to the region start), checked."""
        if offset < 0 or length < 0 or offset + length > len(self.view):
            raise LocalProtocolError(
                f"offset {offset} + length {length} outside region of {len(self.view)} bytes"
            )
        return self.view[offset : offset + length]


class RegionTable:
    """The regions of one endpoint, by R_Key."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._by_rkey: dict[int, Region] = {}
        # The region the last lookup found: a stream of packets names the same R_Key, and
        # comparing it is cheaper than hashing it (compiled, a boxed int per dict lookup).
        self._last: Region | None = None

    def register(
        self, buffer: bytearray | memoryview, *, prefault_pages: bool = True,
        peers: Iterable[bytes] | None = None,
    ) -> Region:  # fmt: skip
        """Register a writable buffer; returns its Region with a fresh random R_Key and VA.
        `peers`: the static public keys (32 bytes each) of the peers that may write it (None:
        any; an empty collection: none)."""
        view = memoryview(buffer).cast("B")
        if view.readonly:
            raise LocalProtocolError("a registered region must be writable")
        allowed: frozenset[bytes] | None = None
        if peers is not None:
            if isinstance(peers, (bytes, bytearray, memoryview, str)):
                raise LocalProtocolError("peers must be a collection of keys, not one key")
            allowed = frozenset(bytes(key) for key in peers)
            bad = [key for key in allowed if len(key) != 32]
            if bad:
                raise LocalProtocolError(
                    f"a peer key is 32 bytes (an X25519 public key), got {len(bad[0])}"
                )
        if prefault_pages:
            prefault(view)
        rkey = self._rng.getrandbits(32)
        while rkey == 0 or rkey in self._by_rkey:
            rkey = self._rng.getrandbits(32)
        # A page-aligned VA well inside the 64-bit space, so VA + size never wraps.
        base_va = self._rng.randrange(1 << 20, 1 << 47) * PAGE
        region = Region(rkey=rkey, base_va=base_va, view=view, peers=allowed)
        self._by_rkey[rkey] = region
        return region

    def deregister(self, region: Region) -> None:
        if self._by_rkey.get(region.rkey) is not region:
            raise LocalProtocolError(f"R_Key {region.rkey:#010x} is not registered")
        del self._by_rkey[region.rkey]
        if self._last is region:
            self._last = None

    def lookup(self, rkey: int) -> Region | None:
        last = self._last
        if last is not None and last.rkey == rkey:
            return last
        region = self._by_rkey.get(rkey)
        if region is not None:
            self._last = region
        return region

    def __len__(self) -> int:
        return len(self._by_rkey)
