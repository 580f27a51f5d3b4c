"""The control protocol's shared constants: what the daemon (`mrc.daemon`) and its clients
(`mrc.client`) must agree on byte for byte, kept once so they cannot drift apart.

The protocol itself (newline-delimited JSON-RPC 2.0 on a Unix stream socket, the methods, the
objects) is described in docs/DAEMON.md; each side's codec lives in its own package.
"""

from __future__ import annotations

#: Longest line either side sends, newline included.
MAX_LINE = 1 << 20

# JSON-RPC 2.0's own codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# The daemon's codes, from -32000 down (docs/DAEMON.md "Errors").
UNKNOWN_PEER = -32001
UNKNOWN_REGION = -32002
UNKNOWN_CONNECTION = -32003
BAD_MEMORY = -32004
OUT_OF_BOUNDS = -32005
TOO_MANY_OUTSTANDING = -32006
NOT_CONNECTED = -32007
SHUTTING_DOWN = -32008
RESOURCE_LIMIT = -32009
PERMISSION_DENIED = -32010

#: Largest unsigned value a JSON integer of the protocol may carry (ids, VAs, lengths).
U64_MAX = (1 << 64) - 1
