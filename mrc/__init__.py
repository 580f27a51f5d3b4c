"""mrc: a userspace Python implementation of MRC (Multipath Reliable Connection).

A connection sprays the packets of every RDMA-style WRITE across many paths in several network
planes; the receiver places each packet at the remote address it carries and acknowledges with
SACK bitmaps that echo the path each packet took, so the sender retransmits only holes and stops
using a broken path at once. The packages are layered `wire → core → sim | io → daemon → cli`:
`mrc.wire` holds the pure codecs, `mrc.core` the sans-I/O protocol.
"""

__version__ = "0.1.0"

from mrc.core import (
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
from mrc.wire import DecodeError

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
]
