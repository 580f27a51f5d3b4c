"""The `mrc` command line: one entry point with argparse subcommands (docs/DESIGN.md §10).

Holds `main(argv)`, the parser whose errors are one line on stderr with exit status 2, and the
top-level guard that turns an interrupt into an exit status instead of a traceback. Each
subcommand lives in its own module and registers itself with `add_parser`. Only the module of
the command being run is imported (the others appear in `mrc --help` by name and summary), so a
command does not pay for the imports of the others: every `mrc bench` process starts faster.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import mrc

__all__ = ["main"]

#: Subcommand → its one-line summary, in `mrc --help` order. Each is the module
#: `mrc.cli.<name>` (a dash in the name is an underscore in the module's), whose
#: `add_parser` gives its subparser this summary.
COMMANDS: dict[str, str] = {
    "bench": "measure MRC between two hosts (iperf3 roles and flags)",
    "keygen": "make a private key file (mode 0600) and print its public key",
    "switch": "a userspace trimming switch on one plane (UDP relay with a shaped queue)",
    "ctl": "show a running mrc daemon's status, peers, connections, planes, EVs, regions",
    "daemon": "run the peer daemon that applications use through its control socket",
    "plot": "draw a bench -J run, a --trace file or compare.json as PNG or SVG",
    "dissect": "print the MRC packets of a pcap/pcapng capture",
    "collective-bench": "time all-reduce, all-gather, ... over MRC or TCP as nccl-tests does",
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `PROG: error: MESSAGE`, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names: its first argument that is not an option."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the full subparser of the command `argv` names (every command's
    when `argv` is None) and a summary-only one for each other command."""
    wanted = None if argv is None else _command(argv)
    parser = _Parser(
        prog="mrc",
        description="mrc: a userspace implementation of MRC (Multipath Reliable Connection).",
    )
    parser.add_argument(
        "--version", action="version", version=f"mrc {mrc.__version__} ({mrc.implementation()})"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, summary in COMMANDS.items():
        if argv is None or name == wanted:
            importlib.import_module(f"{__name__}.{name.replace('-', '_')}").add_parser(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
    try:
        ns = parser.parse_args(argv)
        func: Callable[[argparse.Namespace], int] | None = getattr(ns, "func", None)
        if func is None:
            parser.error("missing command (try: mrc bench --help)")
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return func(ns)
    except KeyboardInterrupt:
        sys.stderr.write("mrc: interrupted\n")
        return 130
    except BrokenPipeError:
        return 141
    except Exception as exc:
        if os.environ.get("MRC_DEBUG"):
            raise
        sys.stderr.write(
            f"mrc: internal error: {type(exc).__name__}: {exc} (set MRC_DEBUG=1 for details)\n"
        )
        return 70
