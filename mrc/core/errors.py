"""Errors raised by the protocol core.

Follows h11: one base class, `LocalProtocolError` for misuse of the API by our own
application, `RemoteProtocolError` for a peer that broke the protocol. Malformed datagrams are
never raised to the caller: the receive path counts them as drops (docs/DESIGN.md §6).
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class of every error the core raises."""


class LocalProtocolError(ProtocolError):
    """The local application used the API wrongly (bad region, closed session, …)."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol in a way that ends the connection."""
