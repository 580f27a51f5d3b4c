"""`mrc daemon --config FILE`: run the peer daemon (docs/DESIGN.md §9, docs/DAEMON.md).

Parses the flags, reads the configuration (a mistake is one line naming the key, exit status
2), sets up logging to stderr (the journal, under systemd) and hands over to
`mrc.daemon.run_daemon`, which returns 0 after a clean stop and 1 when the daemon cannot start.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from mrc.cli import COMMANDS
from mrc.daemon import ConfigError, load_config, parse_listen, run_daemon

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "daemon",
        help=COMMANDS["daemon"],
        description="Run the MRC peer daemon: bind the planes, accept connections from the "
        "configured peers and serve applications on a Unix control socket (JSON-RPC).",
    )
    p.add_argument("--config", required=True, metavar="FILE", help="TOML configuration file")
    p.add_argument(
        "--metrics",
        metavar="ADDR:PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (overrides [metrics] listen)",
    )
    p.add_argument(
        "--check", action="store_true", help="check the configuration and exit (0 when valid)"
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="log every region and connection change"
    )
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    try:
        config = load_config(ns.config)
    except ConfigError as exc:
        sys.stderr.write(f"mrc daemon: config {ns.config}: {exc}\n")
        return 2
    metrics = None
    if ns.metrics is not None:
        try:
            metrics = parse_listen(ns.metrics)
        except ValueError as exc:
            sys.stderr.write(f"mrc daemon: --metrics: {exc}\n")
            return 2
    if ns.check:
        sys.stdout.write(f"mrc daemon: config {ns.config}: ok\n")
        return 0
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("mrc daemon: %(message)s"))
    logger = logging.getLogger("mrc")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if ns.verbose else logging.INFO)
    logger.propagate = False
    return run_daemon(config, metrics)
