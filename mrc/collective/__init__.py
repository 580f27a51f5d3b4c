"""`mrc.collective`: collectives on numpy arrays over the MRC daemons, and over TCP to compare.

    from mrc.collective import open_mrc

    comm = open_mrc("/run/mrc/mrc.sock", rank, world, ["h1", "h2", "h3", "h4"])
    grads = comm.all_reduce(grads, "sum", timeout=30)
    comm.close()

The interface (`Communicator`, `CollectiveError`, the factories' arguments) is `comm`'s
docstring; the ring algorithm and its slot/credit protocol are docs/COLLECTIVE.md. numpy is an
optional extra (`pip install mrc[collective]`): importing this package without it fails with
an ImportError naming the extra.
"""

from __future__ import annotations

try:
    import numpy  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("mrc.collective needs numpy: pip install 'mrc[collective]'") from exc

from .comm import COLLECTIVES, DTYPES, OPS, AsyncCommunicator, CollectiveError, Communicator
from .mrc_link import open_mrc, open_mrc_async
from .tcp_link import open_tcp, open_tcp_async

__all__ = [
    "COLLECTIVES",
    "DTYPES",
    "OPS",
    "AsyncCommunicator",
    "CollectiveError",
    "Communicator",
    "open_mrc",
    "open_mrc_async",
    "open_tcp",
    "open_tcp_async",
]
