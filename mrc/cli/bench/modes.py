"""The ways to run `mrc bench`: each mode's client, its server, and the roles that write and
receive.

mode      client (-c)                 server (-s)            writer / receiver
bulk      client.BenchClient          server.BenchServer     stream, by writer / receiver
sweep     sweep: a BenchClient a size server.BenchServer     as bulk
latency   latency.LatencyPing         echo.LatencyEcho       LatencyPing / LatencyEcho
daemon    daemon.run_writer           daemon.serve_one       daemon, by writer / receiver
demo      demo: a server and a client in one process         as bulk

Holds `MODES` (that table, by module name) and `entry`, which imports only the module of the
side being run, so that `mrc bench --help` and one mode do not pay for the imports of the
others (the daemon's client library above all). Every entry module has `main(opts) -> int`;
none imports this one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, cast

from .options import BenchOptions

__all__ = ["MODES", "Mode", "entry"]


@dataclass(frozen=True, slots=True)
class Mode:
    #: Modules (under mrc.cli.bench) whose `main(opts)` runs the client side and the server.
    client: str
    server: str
    #: Modules holding the roles that write and that receive in this mode.
    writer: str
    receiver: str


MODES: Final = {
    "bulk": Mode(client="client", server="server", writer="writer", receiver="receiver"),
    "sweep": Mode(client="sweep", server="server", writer="writer", receiver="receiver"),
    "latency": Mode(client="latency", server="server", writer="latency", receiver="echo"),
    "daemon": Mode(client="daemon", server="daemon", writer="writer", receiver="receiver"),
    "demo": Mode(client="demo", server="demo", writer="writer", receiver="receiver"),
}


def entry(opts: BenchOptions) -> Callable[[BenchOptions], int]:
    """The `main` of the module that runs this side of `opts.mode`."""
    mode = MODES[opts.mode]
    name = mode.server if opts.role == "server" else mode.client
    module = importlib.import_module(f"{__package__}.{name}")
    return cast(Callable[[BenchOptions], int], module.main)
