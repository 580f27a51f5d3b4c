"""A plane socket's `sock` stand-in for the io tests that count reads (test_planes,
test_endpoint_glue): it passes everything to the real socket and counts `recvmsg_into` calls
and those that found the socket empty."""

from __future__ import annotations

from typing import Any


class CountingReads:
    """Wraps a socket; `reads` and `empty` count its reads and the empty ones."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.reads = 0
        self.empty = 0

    def recvmsg_into(self, buffers: list[memoryview], ancbufsize: int) -> Any:
        self.reads += 1
        try:
            return self.sock.recvmsg_into(buffers, ancbufsize)
        except BlockingIOError:
            self.empty += 1
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)
