"""The daemon's registered regions: whose they are, their handles, and the limits on them.

Holds `DaemonRegion` (one region: its id, owner, the shared mapping behind it and the core
`Region` registered in the node's `RegionTable` under a random R_Key) and `Regions`, which
registers an application's memfd (`register_shared`, through `shm.SharedMapping`) or a
daemon-owned buffer (`register_local`: mailboxes), each for the peers that may write it (their
static keys; None: any peer the daemon accepts), checks the count and size limits (global, per
client and per uid, the admin uids held only to the first two), finds a
region by id or by R_Key (an immediate names the R_Key it landed under), and deregisters:
the R_Key leaves the table at once, so a later WRITE into it is refused at the receiver
(BAD_RKEY, reported to the writer as remote_access_error), while the mapping is unmapped only
when no send record holds a view of it any more (`shm.Unmapper`).

What it leaves to others: who may deregister what and what happens to WRITEs reading from a
region (`service`), the wire checks of R_Key and bounds (the core receiver).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mrc.core.memory import Region, RegionTable

from .config import Limits
from .rpc import RESOURCE_LIMIT, RpcError
from .shm import SharedMapping, Unmapper

__all__ = ["DaemonRegion", "Regions"]


@dataclass(eq=False)
class DaemonRegion:
    id: int
    #: The control client that registered it; None for the daemon's own (mailboxes).
    owner: int | None
    #: The uid of the owner's process (SO_PEERCRED); None for the daemon's own.
    uid: int | None
    name: str
    core: Region
    created: float
    mapping: SharedMapping | None = None
    immediates: int = 0

    @property
    def size(self) -> int:
        return self.core.size

    def handle(self, host: str) -> dict[str, Any]:
        """What one application gives another to write here (docs/DAEMON.md)."""
        return {
            "host": host,
            "region": self.id,
            "rkey": self.core.rkey,
            "va": self.core.base_va,
            "length": self.core.size,
        }


class Regions:
    def __init__(self, table: RegionTable, limits: Limits, admin_uids: frozenset[int]) -> None:
        """`admin_uids`: the uids held to no per-uid quota (the daemon's own and root)."""
        self.table = table
        self.limits = limits
        self.admin_uids = admin_uids
        self.by_id: dict[int, DaemonRegion] = {}
        self._by_rkey: dict[int, DaemonRegion] = {}
        self.unmapper = Unmapper()
        self.shared_bytes = 0
        self._next_id = 1

    def _check(self, owner: int, uid: int, size: int) -> None:
        limits = self.limits
        shared = sum(1 for r in self.by_id.values() if r.owner is not None)
        if shared >= limits.max_regions:
            raise RpcError(
                RESOURCE_LIMIT, f"register_region: max_regions ({limits.max_regions}) reached"
            )
        mine = [r for r in self.by_id.values() if r.owner == owner]
        self._quota("client", len(mine), sum(r.size for r in mine), size,
                    limits.max_regions_per_client, limits.max_region_bytes_per_client)
        if uid not in self.admin_uids:
            ours = [r for r in self.by_id.values() if r.owner is not None and r.uid == uid]
            self._quota("uid", len(ours), sum(r.size for r in ours), size,
                        limits.max_regions_per_uid, limits.max_region_bytes_per_uid)
        if size > limits.max_region_bytes:
            raise RpcError(
                RESOURCE_LIMIT,
                f"register_region: {size} bytes exceed max_region_bytes "
                f"({limits.max_region_bytes})",
            )
        if self.shared_bytes + size > limits.max_total_region_bytes:
            raise RpcError(
                RESOURCE_LIMIT,
                f"register_region: all regions would exceed max_total_region_bytes "
                f"({limits.max_total_region_bytes})",
            )

    @staticmethod
    def _quota(who: str, count: int, held: int, size: int, max_count: int, max_bytes: int) -> None:
        if count >= max_count:
            raise RpcError(
                RESOURCE_LIMIT,
                f"register_region: this {who} holds {count} regions (max_regions_per_{who} = "
                f"{max_count})",
            )
        if held + size > max_bytes:
            raise RpcError(
                RESOURCE_LIMIT,
                f"register_region: this {who} holds {held} bytes of regions; {size} more would "
                f"exceed max_region_bytes_per_{who} ({max_bytes})",
            )

    def register_shared(
        self,
        owner: int,
        uid: int,
        fd: int,
        size: int,
        name: str,
        now: float,
        peers: frozenset[bytes] | None = None,
    ) -> DaemonRegion:
        """Map an application's memfd and register it for `peers` (their static keys; None:
        any), or RpcError when refused."""
        self._check(owner, uid, size)
        mapping = SharedMapping.open(fd, size, name)
        # Not pre-faulted: the core's pre-fault would allocate a sparse memfd's every page in
        # the daemon (shm), and it writes each page's byte back, which could undo an
        # application's write racing with it.
        core = self.table.register(mapping.view, prefault_pages=False, peers=peers)
        region = self._add(owner, uid, name, core, now, mapping)
        self.shared_bytes += size
        return region

    def register_local(
        self, buffer: bytearray, name: str, now: float, peers: frozenset[bytes] | None = None
    ) -> DaemonRegion:
        """A daemon-owned buffer `peers` may write into (a mailbox)."""
        return self._add(None, None, name, self.table.register(buffer, peers=peers), now, None)

    def _add(
        self,
        owner: int | None,
        uid: int | None,
        name: str,
        core: Region,
        now: float,
        mapping: SharedMapping | None,
    ) -> DaemonRegion:
        region = DaemonRegion(self._next_id, owner, uid, name, core, now, mapping)
        self._next_id += 1
        self.by_id[region.id] = region
        self._by_rkey[core.rkey] = region
        return region

    def get(self, region_id: int) -> DaemonRegion | None:
        return self.by_id.get(region_id)

    def by_rkey(self, rkey: int) -> DaemonRegion | None:
        return self._by_rkey.get(rkey)

    def owned_by(self, owner: int) -> list[DaemonRegion]:
        return [r for r in self.by_id.values() if r.owner == owner]

    def deregister(self, region: DaemonRegion) -> None:
        """Out of the R_Key table now; unmapped once nothing reads from it."""
        if self.by_id.pop(region.id, None) is None:
            return
        if self._by_rkey.get(region.core.rkey) is region:
            del self._by_rkey[region.core.rkey]
        if self.table.lookup(region.core.rkey) is region.core:
            self.table.deregister(region.core)
        if region.mapping is not None:
            self.shared_bytes -= region.size
            # The table's view first: `close` then finds only views of send records, if any.
            region.core.view.release()
            self.unmapper.close(region.mapping)

    def close(self) -> None:
        for region in list(self.by_id.values()):
            self.deregister(region)
        self.unmapper.sweep()

    def __len__(self) -> int:
        return len(self.by_id)
