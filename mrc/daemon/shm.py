"""Shared-memory regions: mapping an application's memfd into the daemon, and unmapping it safely.

docs/DESIGN.md §9: an application creates a region with `os.memfd_create`, sizes it with
`ftruncate`, maps it and hands the fd over the control socket (SCM_RIGHTS); the daemon maps the
same pages, so payload bytes never cross the socket. `SharedMapping.open` checks the fd (a memfd,
at least as large as asked), seals it against shrinking (a file shrunk under the daemon's mapping
would kill the daemon with SIGBUS on the next packet placed there), maps it MAP_SHARED with
MAP_POPULATE (pre-faulted: a first-touch fault mid-transfer stalls the receive path;
docs/DESIGN.md §11). The control socket closes the fd afterwards: the mapping keeps the pages.

Unmapping: a WRITE still being sent holds a slice of the mapping (the core's send records), and
`mmap.close()` refuses while any view exists (BufferError). `close()` therefore releases the
daemon's own view and unmaps only when nothing else holds one; otherwise it reports False and the
caller retries later (`Unmapper`). So memory is never read after it was unmapped: Python's buffer
exports are the guard. Which regions exist and who owns them is `service`'s business.
"""

from __future__ import annotations

import fcntl
import gc
import mmap
import os
import stat

from .rpc import BAD_MEMORY, RpcError

__all__ = ["SharedMapping", "Unmapper"]

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# Python exposes the seal constants on Linux from 3.8 on; the numbers are the kernel's.
_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)


class SharedMapping:
    """A memfd mapped read-write and shared; `view` is the daemon's window on it."""

    def __init__(self, mapping: mmap.mmap, size: int, name: str) -> None:
        self._map: mmap.mmap | None = mapping
        self.size = size
        self.name = name
        self.view: memoryview = memoryview(mapping)

    @classmethod
    def open(cls, fd: int, size: int, name: str) -> SharedMapping:
        """Check, seal and map `fd`; a bad fd is an RpcError BAD_MEMORY with one line saying
        what is wrong with it. The fd stays the caller's to close (the mapping keeps the pages)."""
        return cls(_map_memfd(fd, size), size, name)

    @property
    def closed(self) -> bool:
        return self._map is None

    def close(self) -> bool:
        """Unmap when no view of the mapping is left; False while one is (call again later)."""
        if self._map is None:
            return True
        self.view.release()
        try:
            self._map.close()
        except BufferError:
            return False
        self._map = None
        return True


def _map_memfd(fd: int, size: int) -> mmap.mmap:
    try:
        st = os.fstat(fd)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise RpcError(BAD_MEMORY, f"register_region: cannot examine the fd: {reason}") from None
    if not stat.S_ISREG(st.st_mode):
        raise RpcError(BAD_MEMORY, "register_region: the fd is not a memfd (not a regular file)")
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        target = ""
    if not target.startswith("/memfd:"):
        raise RpcError(
            BAD_MEMORY, "register_region: the fd is not a memfd (create it with os.memfd_create)"
        )
    if st.st_size < size:
        raise RpcError(
            BAD_MEMORY,
            f"register_region: the memfd holds {st.st_size} bytes, fewer than the {size} asked",
        )
    try:
        fcntl.fcntl(fd, _F_ADD_SEALS, _F_SEAL_SHRINK)
    except OSError:
        raise RpcError(
            BAD_MEMORY,
            "register_region: the memfd cannot be sealed against shrinking (create it with "
            "MFD_ALLOW_SEALING and do not add F_SEAL_SEAL)",
        ) from None
    try:
        return mmap.mmap(
            fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RpcError(BAD_MEMORY, f"register_region: cannot map the memfd: {reason}") from None


class Unmapper:
    """Mappings whose `close()` found views still held (a send record of a connection that is
    closing): retried at each `sweep()`, after a garbage collection (the views may sit in
    reference cycles of a discarded session)."""

    def __init__(self) -> None:
        self._pending: list[SharedMapping] = []

    def close(self, mapping: SharedMapping) -> None:
        if not mapping.close():
            self._pending.append(mapping)

    def sweep(self) -> int:
        """Try again; returns how many mappings are still waiting."""
        if not self._pending:
            return 0
        gc.collect()
        self._pending = [m for m in self._pending if not m.close()]
        return len(self._pending)

    def __len__(self) -> int:
        return len(self._pending)
