"""mrc: a userspace Python implementation of MRC (Multipath Reliable Connection).

A connection sprays the packets of every RDMA-style WRITE across many paths in several network
planes; the receiver places each packet at the remote address it carries and acknowledges with
SACK bitmaps that echo the path each packet took, so the sender retransmits only holes and stops
using a broken path at once. The packages are layered `wire → core → sim | io → daemon → cli`:
`mrc.wire` holds the pure codecs, `mrc.core` the sans-I/O protocol.
"""

__version__ = "0.1.0"

import os as _os

from mrc import _build

# Decided before mrc.core and mrc.wire are imported: extension modules would shadow the .py files.
_COMPILED, _REASON = _build.choose(_os.environ)
if not _COMPILED:
    _build.install_pure_finder()


def compiled() -> bool:
    """Whether mrc.wire, mrc.core and mrc.io run as mypyc-compiled modules (False: pure Python)."""
    return _COMPILED


def implementation() -> str:
    """"compiled" or "pure", with why when pure: "pure: MRC_PURE=1", "pure: not compiled", ..."""
    return _REASON


from mrc.core import (  # noqa: E402  (after the choice of implementation above)
    ConnectionClosed,
    ConnectionEstablished,
    Endpoint,
    Event,
    ImmediateReceived,
    LocalProtocolError,
    PathRestored,
    PathRetired,
    PlaneDown,
    PlaneUp,
    PortStateChanged,
    ProtocolError,
    Region,
    RegionTable,
    RemoteProtocolError,
    Session,
    SessionConfig,
    Transmit,
    WriteCompleted,
)
from mrc.wire import DecodeError  # noqa: E402

__all__ = [
    "ConnectionClosed",
    "ConnectionEstablished",
    "DecodeError",
    "Endpoint",
    "Event",
    "ImmediateReceived",
    "LocalProtocolError",
    "PathRestored",
    "PathRetired",
    "PlaneDown",
    "PlaneUp",
    "PortStateChanged",
    "ProtocolError",
    "Region",
    "RegionTable",
    "RemoteProtocolError",
    "Session",
    "SessionConfig",
    "Transmit",
    "WriteCompleted",
    "__version__",
    "compiled",
    "implementation",
]
