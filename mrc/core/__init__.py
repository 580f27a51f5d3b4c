"""The sans-I/O protocol core: sessions (QPs), the endpoint that routes to them, memory
regions, paths and spray policies. Imports no socket, clock or event-loop module
(docs/DESIGN.md §1).
"""

from .config import SessionConfig
from .endpoint import Endpoint
from .errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from .events import (
    ConnectionClosed,
    ConnectionEstablished,
    Event,
    ImmediateReceived,
    PathRestored,
    PathRetired,
    PlaneDown,
    PlaneUp,
    PortStateChanged,
    WriteCompleted,
)
from .memory import Region, RegionTable
from .paths.spray import SprayPolicy, make_spray, register_spray, spray_names
from .session import Session, SessionState
from .stats import PlaneStats, SessionStats
from .transmit import Addr, Transmit

__all__ = [
    "Addr",
    "ConnectionClosed",
    "ConnectionEstablished",
    "Endpoint",
    "Event",
    "ImmediateReceived",
    "LocalProtocolError",
    "PathRestored",
    "PathRetired",
    "PlaneDown",
    "PlaneStats",
    "PlaneUp",
    "PortStateChanged",
    "ProtocolError",
    "Region",
    "RegionTable",
    "RemoteProtocolError",
    "Session",
    "SessionConfig",
    "SessionState",
    "SessionStats",
    "SprayPolicy",
    "Transmit",
    "WriteCompleted",
    "make_spray",
    "register_spray",
    "spray_names",
]
