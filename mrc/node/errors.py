"""`NodeError`: an expected failure of the host layer (bind, resolve, path table, MTU), with a
message that is one line a user can act on. The CLI and the daemon print it and exit non-zero."""

from __future__ import annotations


class NodeError(Exception):
    """An expected failure: one line for the user, no traceback."""
