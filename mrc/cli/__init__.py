"""The `mrc` command line: one entry point with argparse subcommands (docs/DESIGN.md §10).

Holds `main(argv)`, the parser whose errors are one line on stderr with exit status 2, and the
top-level guard that turns an interrupt into an exit status instead of a traceback. Each
subcommand lives in its own module (`bench` now; `daemon`, `ctl`, `dissect`, `plot` later) and
registers itself with `add_parser`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import mrc

from . import bench, ctl, daemon, dissect, keygen, plot, switch

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `PROG: error: MESSAGE`, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mrc",
        description="mrc: a userspace implementation of MRC (Multipath Reliable Connection).",
    )
    parser.add_argument(
        "--version", action="version", version=f"mrc {mrc.__version__} ({mrc.implementation()})"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    bench.add_parser(sub)
    keygen.add_parser(sub)
    switch.add_parser(sub)
    ctl.add_parser(sub)
    daemon.add_parser(sub)
    plot.add_parser(sub)
    dissect.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
