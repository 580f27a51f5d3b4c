"""The daemon's registered regions: whose they are, their handles, and the limits on them.

Holds `DaemonRegion` (one region: its id, owner, the shared mapping behind it and the core
`Region` registered in the node's `RegionTable` under a random R_Key) and `Regions`, which
registers an application's memfd (`register_shared`, through `shm.SharedMapping`) or a
daemon-owned buffer (`register_local`: mailboxes), checks the count and size limits, finds a
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
    def __init__(self, table: RegionTable, limits: Limits) -> None:
        self.table = table
        self.limits = limits
        self.by_id: dict[int, DaemonRegion] = {}
        self._by_rkey: dict[int, DaemonRegion] = {}
        self.unmapper = Unmapper()
        self.shared_bytes = 0
        self._next_id = 1

    def _check(self, size: int) -> None:
        limits = self.limits
        shared = sum(1 for r in self.by_id.values() if r.owner is not None)
        if shared >= limits.max_regions:
            raise RpcError(
                RESOURCE_LIMIT, f"register_region: max_regions ({limits.max_regions}) reached"
            )
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

    def register_shared(
        self, owner: int, fd: int, size: int, name: str, now: float
    ) -> DaemonRegion:
        """Map an application's memfd and register it (RpcError when refused)."""
        self._check(size)
        mapping = SharedMapping.open(fd, size, name)
        # Pre-faulted by MAP_POPULATE already: the core's own pre-fault writes each page's
        # byte back, which could undo an application's write racing with it.
        core = self.table.register(mapping.view, prefault_pages=False)
        region = self._add(owner, name, core, now, mapping)
        self.shared_bytes += size
        return region

    def register_local(self, buffer: bytearray, name: str, now: float) -> DaemonRegion:
        """A daemon-owned buffer peers may write into (a mailbox)."""
        return self._add(None, name, self.table.register(buffer), now, None)

    def _add(
        self, owner: int | None, name: str, core: Region, now: float, mapping: SharedMapping | None
    ) -> DaemonRegion:
        region = DaemonRegion(self._next_id, owner, name, core, now, mapping)
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
