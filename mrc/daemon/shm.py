"""Shared-memory regions: mapping an application's memfd into the daemon, and unmapping it safely.

docs/DESIGN.md §9: an application creates a region with `os.memfd_create`, sizes it with
`ftruncate`, maps it and hands the fd over the control socket (SCM_RIGHTS); the daemon maps the
same pages, so payload bytes never cross the socket. `SharedMapping.open` checks the fd (a memfd,
at least as large as asked), seals it against shrinking (a file shrunk under the daemon's mapping
would kill the daemon with SIGBUS on the next packet placed there), checks the size again once
sealed, and maps it MAP_SHARED without MAP_POPULATE: pre-faulting would allocate whatever the
application left sparse, charged to the daemon and inside its event loop. Instead it notes
which pages the memfd holds (SEEK_DATA/SEEK_HOLE) and `prefault` maps those into the daemon a
step at a time, without allocating; a page nobody touched is allocated only when a peer's
WRITE lands there (docs/DESIGN.md §9, §11).
The control socket closes the fd afterwards: the mapping keeps the pages.

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

# Python exposes the seal constants on Linux from 3.8 on; the numbers are the kernel's.
_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
#: Bytes of the application's pages `prefault` maps into the daemon per call (a few ms).
PREFAULT_STEP = 16 << 20
#: Runs of present pages looked up at registration; pages past them fault in on first use.
MAX_EXTENTS = 4096


class SharedMapping:
    """A memfd mapped read-write and shared; `view` is the daemon's window on it."""

    def __init__(
        self, mapping: mmap.mmap, size: int, name: str, present: list[tuple[int, int]]
    ) -> None:
        """`present`: the runs [start, end) of pages the application's memfd holds, which
        `prefault` maps into the daemon."""
        self._map: mmap.mmap | None = mapping
        self.size = size
        self.name = name
        self.view: memoryview = memoryview(mapping)
        self._present = present[::-1]  # taken from the end

    @classmethod
    def open(cls, fd: int, size: int, name: str) -> SharedMapping:
        """Check, seal and map `fd`; a bad fd is an RpcError BAD_MEMORY with one line saying
        what is wrong with it. The fd stays the caller's to close (the mapping keeps the pages)."""
        mapping = _map_memfd(fd, size)
        return cls(mapping, size, name, _present(fd, size))

    def prefault(self, budget: int = PREFAULT_STEP) -> bool:
        """Map up to `budget` bytes of the pages the application's memfd holds into the
        daemon, reading one byte a page (a read allocates nothing the memfd does not hold,
        and writes nothing an application's write could race with), so a packet placed there
        later takes no first-touch fault (docs/DESIGN.md §11). True while some are left: call
        again (the service does, one step per turn of its event loop)."""
        pending = self._present
        while pending and budget > 0:
            start, end = pending[-1]
            stop = min(end, start + budget)
            try:
                bytes(self.view[start:stop:mmap.PAGESIZE])
            except ValueError:  # released: deregistered meanwhile
                pending.clear()
                break
            budget -= stop - start
            if stop >= end:
                pending.pop()
            else:
                pending[-1] = (stop, end)
        return bool(pending)

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
    # Again, now that it can no longer shrink: the application (or anyone holding the fd) could
    # have shrunk it between the first look and the seal, and a page past the end kills the
    # daemon with SIGBUS when a packet is placed there.
    try:
        sealed_size = os.fstat(fd).st_size
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise RpcError(BAD_MEMORY, f"register_region: cannot examine the fd: {reason}") from None
    if sealed_size < size:
        raise RpcError(
            BAD_MEMORY,
            f"register_region: the memfd shrank to {sealed_size} bytes while being sealed, "
            f"fewer than the {size} asked",
        )
    try:
        # No MAP_POPULATE: it would allocate every page the application left sparse, in the
        # daemon's memory and inside its event loop (a 1 GiB memfd nobody wrote is 1 GiB).
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RpcError(BAD_MEMORY, f"register_region: cannot map the memfd: {reason}") from None


def _present(fd: int, size: int) -> list[tuple[int, int]]:
    """The runs [start, end) of pages the memfd holds within `size` (at most MAX_EXTENTS),
    through a file description of its own so the application's file offset stays as it was;
    none when the file system cannot tell (then every page faults in on first use)."""
    runs: list[tuple[int, int]] = []
    try:
        own = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return runs
    try:
        offset = 0
        while offset < size and len(runs) < MAX_EXTENTS:
            start = os.lseek(own, offset, os.SEEK_DATA)
            if start >= size:
                break
            end = min(os.lseek(own, start, os.SEEK_HOLE), size)
            runs.append((start, end))
            offset = end
    except OSError:  # ENXIO: no data past `offset`
        pass
    finally:
        os.close(own)
    return runs


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
