"""`mrc ctl`: look at a running peer daemon over its control socket (docs/DESIGN.md §10).

`mrc ctl [--socket PATH] [-J] status|peers|connections|planes|evs|regions` asks the daemon through
`mrc.client` and prints a human table, or the daemon's answer as JSON with `-J`. A daemon that
cannot be reached (no socket, refused, no permission) or that refuses is one line on stderr and
exit status 1. Holds the subcommand and its table formatting; the protocol is `mrc.client`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from mrc.cli import COMMANDS
from mrc.client import Client, ClientError, default_socket

__all__ = ["add_parser", "format_status", "format_table", "run"]

VIEWS = ("status", "peers", "connections", "planes", "evs", "regions")


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "ctl",
        help=COMMANDS["ctl"],
        description="Ask the local mrc daemon over its control socket.",
    )
    p.add_argument(
        "--socket",
        metavar="PATH",
        default=None,
        help=f"the daemon's control socket (default: $MRC_SOCKET, else {default_socket()})",
    )
    p.add_argument("-J", "--json", action="store_true", help="print the daemon's answer as JSON")
    p.add_argument(
        "--connection",
        type=int,
        metavar="ID",
        default=None,
        help="evs: only this connection's EVs",
    )
    p.add_argument("what", choices=VIEWS, help="what to show")
    p.set_defaults(func=run)


#: Columns read as bit patterns (EV = plane 8 | selector 24, R_Key, VA): shown in hex.
_HEX = {"ev": 10, "rkey": 10, "va": 18}


def _cell(value: Any, column: str = "") -> str:
    if column in _HEX and type(value) is int and value >= 0:
        return f"{value:#0{_HEX[column]}x}"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    if value is None:
        return "-"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Columns in order of first appearance, left-aligned text and right-aligned numbers."""
    if not rows:
        return "(none)"
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    cells = [[_cell(row.get(c), c) for c in columns] for row in rows]
    numeric = [
        all(isinstance(row.get(c), int | float) and not isinstance(row.get(c), bool)
            for row in rows if c in row)
        for c in columns
    ]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric,
                                                                   strict=True)
        ).rstrip()

    return "\n".join([line(columns), *(line(r) for r in cells)])


def format_status(status: dict[str, Any]) -> str:
    planes = status.get("planes") if isinstance(status.get("planes"), list) else []
    width = max((len(k) for k in status), default=0) + 1
    head = [f"{k + ':':<{width}} {_cell(v)}" for k, v in status.items() if k != "planes"]
    return "\n".join([*head, "", format_table(planes or [])])


def run(ns: argparse.Namespace) -> int:
    if ns.connection is not None and ns.what != "evs":
        sys.stderr.write("mrc ctl: error: --connection only applies to evs\n")
        return 2
    try:
        with Client(ns.socket) as client:
            if ns.what == "status":
                answer: Any = client.status()
            elif ns.what == "evs":
                answer = client.evs(ns.connection)
            else:
                answer = getattr(client, ns.what)()
    except ClientError as exc:
        sys.stderr.write(f"mrc ctl: {exc}\n")
        return 1
    if ns.json:
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
    elif ns.what == "status":
        sys.stdout.write(format_status(answer) + "\n")
    else:
        sys.stdout.write(format_table(answer) + "\n")
    return 0
