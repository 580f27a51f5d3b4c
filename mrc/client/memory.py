"""Region memory on the application side: a memfd, mapped shared, handed to the daemon by fd.

docs/DESIGN.md §9: the application creates the memory with `os.memfd_create` (sealable,
so the daemon can forbid shrinking it under its mapping), sizes it with `ftruncate`, maps it
MAP_SHARED and pre-faulted (a first touch of fresh pages mid-transfer stalls for milliseconds),
and passes the fd over the control socket with SCM_RIGHTS; the daemon maps the same pages, so
payload bytes never cross the socket. `multiprocessing.shared_memory` is not used: on Python
3.11 its resource tracker can unlink a segment that is still in use.

Holds `SharedMemory` (create, expose as a memoryview, release) and `RegionBase`, the part of a
registered region both client flavours share. Registering and deregistering are RPCs: `sync`
and `aio`.
"""

from __future__ import annotations

import contextlib
import mmap
import os

from .objects import RegionHandle
from .rpc import INVALID_PARAMS, RESOURCE_LIMIT, ClientError

__all__ = ["MAX_REGION", "RegionBase", "SharedMemory"]

#: Largest region the client will create (the daemon may refuse smaller ones: RESOURCE_LIMIT).
MAX_REGION = 1 << 40
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class SharedMemory:
    """A memfd of `size` bytes mapped read-write and shared. `fd` stays open until
    `close_fd()` (after registration the mapping alone keeps the pages alive)."""

    def __init__(self, size: int, name: str = "region") -> None:
        if type(size) is not int or not 1 <= size <= MAX_REGION:
            raise ClientError(INVALID_PARAMS, f"region size must be 1..{MAX_REGION}, got {size!r}")
        if not isinstance(name, str) or "\0" in name:
            raise ClientError(INVALID_PARAMS, f"region name must be a string: {name!r}")
        self.size = size
        fd = -1
        try:
            # The kernel caps memfd names at 249 bytes; the name only shows in /proc/PID/fd.
            fd = os.memfd_create(f"mrc:{name}"[:200], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, size)
            self._map: mmap.mmap | None = mmap.mmap(
                fd, size, flags=mmap.MAP_SHARED | _POPULATE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            reason = exc.strerror or str(exc)
            raise ClientError(
                RESOURCE_LIMIT, f"cannot create a {size}-byte shared region: {reason}"
            ) from None
        self.fd = fd
        self.buf: memoryview = memoryview(self._map)

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def release(self) -> None:
        """Close the fd and unmap, unless the application still holds views of the mapping:
        then the pages go when the last view does (mmap refuses to close under an export)."""
        self.close_fd()
        self.buf.release()
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None


class RegionBase:
    """A registered region: its daemon id, `handle` (give it to a peer) and `buf` (the shared
    bytes). Once closed, `buf` is released and the region can no longer be written from."""

    def __init__(self, region_id: int, handle: RegionHandle, memory: SharedMemory,
                 name: str | None) -> None:
        self.id = region_id
        self.handle = handle
        self.name = name
        self._memory = memory
        self.closed = False

    @property
    def size(self) -> int:
        return self._memory.size

    @property
    def buf(self) -> memoryview:
        if self.closed:
            raise ClientError(INVALID_PARAMS, f"region {self.id} is closed")
        return self._memory.buf

    def _release(self) -> None:
        if not self.closed:
            self.closed = True
            self._memory.release()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Region {self.id} {self.size} bytes {state}>"
