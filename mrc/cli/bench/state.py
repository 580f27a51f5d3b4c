"""`RunState`: what one `mrc bench` run opens or makes from its options before it connects.

Holds the run's identity when it is secured (from --key, or made for this run, accepting the
keys --peer-key names) and its --trace file (opened at once, so a bad path fails before
anything connects). Built whole by `RunState.open` after the options were checked, closed by
whoever opened it; the options themselves stay as they were parsed (`options.BenchOptions`).
The demo makes the two states of its two sides itself (`demo`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mrc.core.secure.handshake import Identity
from mrc.node.keys import load_identity, load_public_keys

from .options import BenchOptions
from .trace import TraceFile

__all__ = ["RunState"]


@dataclass(frozen=True, slots=True)
class RunState:
    #: The identity a secured run uses (None: --security none).
    identity: Identity | None = None
    #: The open --trace file (None: no --trace).
    trace_file: TraceFile | None = None

    @classmethod
    def open(cls, opts: BenchOptions) -> RunState:
        """Open the --trace file (`TraceFileError` when it cannot be) and read or make the
        identity (`NodeError` for a key file that cannot be used)."""
        trace_file = None
        if opts.trace is not None:
            trace_file = TraceFile(opts.trace, "server" if opts.role == "server" else "client")
        try:
            identity = _identity(opts)
        except BaseException:
            if trace_file is not None:
                trace_file.close()
            raise
        return cls(identity, trace_file)

    def close(self) -> None:
        if self.trace_file is not None:
            self.trace_file.close()


def _identity(opts: BenchOptions) -> Identity | None:
    """--security: the run's identity, from --key or made for this run, accepting the keys
    --peer-key names (any key without it: tampering is caught, impersonation is not). The
    demo makes one for each of its sides."""
    if opts.security == "none" or opts.role == "demo":
        return None
    peers = None if opts.peer_key is None else [opts.peer_key]
    if opts.key is not None:
        return load_identity(opts.key, peers)
    allowed = None if opts.peer_key is None else load_public_keys(opts.peer_key)
    return Identity.generate(allowed, entropy=os.urandom)
