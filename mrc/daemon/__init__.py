"""The peer daemon: MRC as a service that applications use (docs/DESIGN.md §9).

`mrc daemon --config FILE` binds the host's planes, accepts MRC connections from the peers its
configuration lists, and serves applications over a Unix control socket speaking
newline-delimited JSON-RPC 2.0 (the protocol reference is docs/DAEMON.md). Applications register
regions of shared memory (a memfd they pass with SCM_RIGHTS; payload bytes never cross the
socket), connect to peers, post WRITEs and WRITE_WITH_IMMs, and collect completions and
immediates; small messages between applications travel through the daemons' mailboxes.

Modules, one job each: `config` (the TOML file), `rpc` (JSON-RPC framing, codes, parameters),
`control` (the Unix socket, fds, client limits), `shm` (mapping and unmapping memfds), `regions`
(registered regions and their limits), `conns` (connection records, the daemons' CM private data),
`clients` (a client's queues, long-polls and WRITE checks), `service` (what changes state, and the
session events), `mailbox` (messages), `views` (read-only views), `methods` (which method name the
service or a view answers; above both), `metrics` (Prometheus text over HTTP), `notify` (sd_notify)
and `daemon` (the process: start-up, signals, shutdown). The application side is `mrc.client`.
"""

from __future__ import annotations

from .config import ConfigError, DaemonConfig, load_config, parse_listen
from .daemon import Daemon, DaemonError, run_daemon

__all__ = [
    "ConfigError",
    "Daemon",
    "DaemonConfig",
    "DaemonError",
    "load_config",
    "parse_listen",
    "run_daemon",
]
