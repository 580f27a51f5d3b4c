"""What the io tests need to know about this host's loopback."""

from __future__ import annotations

import socket


def ipv6_loopback() -> bool:
    """A UDP socket can bind ::1 (IPv6 is on)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True
