"""Running one in-process `mrc bench` side on a fresh event loop.

Holds `run(opts, side)`: it opens the run state (`state.RunState`: the --trace file, the
identity), runs the side's coroutine on a new event loop, closes both, and turns every
expected failure (bad address, bind error, no answer, refused, a key file that cannot be used,
out of memory for the regions) into one line on stderr and exit status 1. Each mode's module
(`client`, `server`, `sweep`, `latency`, `demo`) hands it its own coroutine; it knows none of
them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from mrc.io.loop import new_event_loop
from mrc.node import NodeError

from .options import BenchOptions
from .setup import BenchError
from .state import RunState
from .trace import TraceFileError

__all__ = ["Side", "run"]

#: One side of a run: a coroutine on the options and the run's state, to an exit status.
Side = Callable[[BenchOptions, RunState], Coroutine[Any, Any, int]]


def run(opts: BenchOptions, side: Side) -> int:
    """Run `side` on a fresh event loop; expected failures become one stderr line."""
    try:
        state = RunState.open(opts)
    except (TraceFileError, NodeError) as exc:
        sys.stderr.write(f"mrc bench: {exc}\n")
        return 1
    loop = new_event_loop()
    try:
        return loop.run_until_complete(side(opts, state))
    except (BenchError, NodeError) as exc:
        sys.stderr.write(f"mrc bench: {exc}\n")
        return 1
    except MemoryError:
        sys.stderr.write("mrc bench: out of memory for the test regions (try a smaller -l)\n")
        return 1
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        state.close()
