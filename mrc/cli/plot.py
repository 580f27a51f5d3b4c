"""`mrc plot INPUT [-o OUT] [--what …]`: draw a bench run, a trace or compare.json.

Parses the arguments and prints; the loading, the panels and the drawing live in `mrc.plot`
(docs/DESIGN.md §10). Bad input, a missing panel or a missing matplotlib is one line on
stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mrc.cli import COMMANDS
from mrc.plot import PlotError, plot_file
from mrc.plot.series import PANELS


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "plot",
        help=COMMANDS["plot"],
        description="Draw what a run did over time: goodput per plane with faults and events "
        "marked, EV states, congestion window and bytes in flight per plane (from mrc bench "
        "-J -i …, or a --trace file), the failover of mrc and MPTCP (from compare.json), or a "
        "training job's step time through faults (from make job's job.json). "
        "Needs matplotlib (pip install 'mrc[plot]').",
    )
    p.add_argument("input", metavar="INPUT",
                   help="bench -J output, a trace, compare.json or job.json")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="the figure, .png or .svg (default: INPUT with .png)")
    p.add_argument("--what", choices=[*PANELS, "all"], default="all",
                   help="one panel, or all the input supports stacked (default)")
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    try:
        line = plot_file(ns.input, ns.output, ns.what)
    except PlotError as exc:
        msg = str(exc)
        sys.stderr.write((msg if msg.startswith("mrc plot") else f"mrc plot: {msg}") + "\n")
        return 1
    sys.stdout.write(line + "\n")
    return 0
