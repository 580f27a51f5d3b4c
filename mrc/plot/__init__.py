"""`mrc plot`: figures of what a bench run did over time (docs/DESIGN.md §10).

Inputs: `mrc bench -J` output (client or server), `mrc bench --trace` files, compare.json
from `make compare`, and job.json from `make job`. Modules, one job each: `model` (the
normalised data and `PlotError`), `load` (reading a file and telling its kind; compare.json),
`bench` and `trace` (their formats), `series` (what each panel shows, as data), `draw`
(matplotlib, only imported when a figure is made), `job` (job.json's step-time panels, read
and drawn on their own). The command line (`mrc.cli.plot`) only parses arguments and prints.
"""

from __future__ import annotations

from .draw import NEEDS_MATPLOTLIB, default_output, plot_file, render
from .load import load
from .model import PlotError, Run

__all__ = ["NEEDS_MATPLOTLIB", "PlotError", "Run", "default_output", "load", "plot_file", "render"]
