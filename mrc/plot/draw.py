"""Drawing `mrc plot`'s figure with matplotlib (Agg, never a display) and writing the file.

`plot_file(input, output, what)` is the whole command as a function (the CLI and `make demo`
call it): load, choose the panels, draw them stacked in one figure, save PNG or SVG, return
the line to print. Each panel draws only what `series.py` computes, so the tests check the
data there; what is here is presentation: titles, units, legends, colours. matplotlib is an
optional extra (`mrc[plot]`); without it the one-line `PlotError` says how to get it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from . import job, series
from .load import load
from .model import PlotError, Run

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["NEEDS_MATPLOTLIB", "default_output", "plot_file", "render"]

NEEDS_MATPLOTLIB = "mrc plot needs matplotlib: pip install 'mrc[plot]'"
FORMATS = (".png", ".svg")
STATE_COLOURS = {
    "good": "#2ca02c",
    "skip": "#ff7f0e",
    "retired": "#d62728",
    "probing": "#9467bd",
    "denied": "#000000",
    "backup": "#d9d9d9",
}
STATE_WORDS = {
    "good": "good (carrying data)",
    "skip": "skip (ECN/trim)",
    "retired": "retired (assumed bad)",
    "probing": "probing",
    "denied": "denied",
    "backup": "backup (spare)",
}
MARK_STYLES = {  # kind: (colour, line style)
    "fault": ("#d62728", "-"),
    "plane-down": ("#000000", "--"),
    "plane-up": ("#2ca02c", "--"),
    "port-down": ("#7f7f7f", ":"),
    "port-up": ("#7f7f7f", ":"),
    "path-retired": ("#ff7f0e", "-."),
}
TRANSPORT_NAMES = {"mrc": "mrc", "mptcp": "MPTCP"}
MAX_LABELS = 12  # a flapping plane can make dozens of marks: the lines stay, the words stop


def default_output(input_path: str) -> str:
    """INPUT with its extension replaced by .png (`run.json` → `run.png`)."""
    root, ext = os.path.splitext(input_path)
    return (root if ext else input_path) + ".png"


def plot_file(input_path: str, output: str | None = None, what: str = "all") -> str:
    """Plot `input_path` into `output` (default: `default_output`); the line to print."""
    out = output or default_output(input_path)
    if os.path.splitext(out)[1].lower() not in FORMATS:
        raise PlotError(f"{out}: the output must end in .png or .svg")
    _need_matplotlib()  # before reading a large input only to fail
    if job.is_job_file(input_path):  # tools.job's step times: panels of their own
        return job.plot_job(input_path, out, what)
    run = load(input_path)
    fig, chosen = render(run, what)
    try:
        fig.savefig(out, dpi=110)
    except OSError as exc:
        raise PlotError(f"cannot write {out}: {exc.strerror or exc}") from None
    notes = "".join(f"; {n}" for n in run.notes)
    if run.skipped:
        notes += f"; {run.skipped} malformed records skipped"
    return f"wrote {out} ({', '.join(chosen)}){notes}"


def render(run: Run, what: str = "all") -> tuple[Figure, list[str]]:
    """The figure for `run` and the panels it holds, top to bottom."""
    chosen = series.panels(run, what)
    _need_matplotlib()
    from matplotlib.figure import Figure
    heights = [_height(run, name) for name in chosen]
    fig = Figure(figsize=(11, sum(heights) + 0.6), layout="constrained")
    axes = fig.subplots(len(chosen), 1, squeeze=False, height_ratios=heights)[:, 0]
    timed = [ax for ax, name in zip(axes, chosen, strict=True) if name != "failover"]
    for ax in timed[1:]:
        ax.sharex(timed[0])
    marks = series.marks(run)
    for ax, name in zip(axes, chosen, strict=True):
        if name == "goodput":
            _goodput(ax, run)
        elif name == "evs":
            _evs(ax, run)
        elif name == "cc":
            _cc(ax, run)
        else:
            _failover(ax, run)
        if name != "failover":
            ax.set_xlim(0, max(run.duration, 1e-3))
            _marks(ax, marks, labels=ax is timed[0])
            if ax is timed[-1]:
                ax.set_xlabel("time since the test started (s)")
            else:
                ax.tick_params(labelbottom=False)
        if name != "evs":  # the EV rows are their own grid
            ax.grid(True, alpha=0.3)
    who = f" ({run.role})" if run.role else ""
    fig.suptitle(f"mrc plot of {os.path.basename(run.path)}{who}")
    return fig, chosen


def _need_matplotlib() -> None:
    try:
        import matplotlib
    except ImportError:
        raise PlotError(NEEDS_MATPLOTLIB) from None
    matplotlib.use("Agg")  # never a display, whatever MPLBACKEND says


def _height(run: Run, name: str) -> float:
    if name == "evs":
        rows = len(series.ev_panel(run).rows)
        return max(2.5, min(9.0, 1.0 + rows * 0.08))
    return 3.0


def _plane_colour(plane: int) -> str:
    # apart from the marks' red, orange, green and black, and from each other
    palette = ("#1f77b4", "#9467bd", "#e377c2", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f")
    return palette[plane % len(palette)]


def _goodput(ax: Axes, run: Run) -> None:
    for pr in series.goodput(run):
        xs = [*pr.starts, pr.ends[-1]]
        ys = [*pr.gbps, pr.gbps[-1]]
        ax.step(xs, ys, where="post", color=_plane_colour(pr.plane), label=f"plane {pr.plane}",
                linewidth=1.2)
    if run.kind == "trace":
        what = f"bytes sent by the {run.role or 'sender'} between the trace's cc samples"
    elif run.sender is False:
        what = f"bytes received by the {run.role or 'receiver'} per interval"
    else:
        what = f"bytes sent by the {run.role or 'sender'} per interval, retransmits included"
    ax.set_title(f"Goodput per plane ({what})")
    ax.set_ylabel("Gbit/s")
    top = ax.get_ylim()[1]
    ax.set_ylim(-0.02 * top, top)  # a plane at 0 stays visible above the axis
    ax.legend(loc="lower left", fontsize=8, ncol=4)


def _evs(ax: Axes, run: Run) -> None:
    tl = series.ev_panel(run)
    present = [s for s in series.STATES if any(g.state == s for g in tl.segments)]
    present += sorted({g.state for g in tl.segments} - set(series.STATES))
    from matplotlib.collections import PolyCollection

    for state in present:
        # one collection of rectangles per state: a patch per segment (ax.barh) takes about
        # a minute at the timeline's bound of 100,000 changes
        boxes = [[(g.start, g.row - 0.475), (g.end, g.row - 0.475), (g.end, g.row + 0.475),
                  (g.start, g.row + 0.475)] for g in tl.segments if g.state == state]
        ax.add_collection(PolyCollection(boxes, facecolors=STATE_COLOURS.get(state, "#17becf"),
                                         linewidths=0, label=STATE_WORDS.get(state, state)),
                          autolim=False)
    ticks, labels = [], []
    planes = sorted({r.plane for r in tl.rows})
    for plane in planes:
        idx = [i for i, r in enumerate(tl.rows) if r.plane == plane]
        ticks.append((idx[0] + idx[-1]) / 2)
        labels.append(f"plane {plane}\n{len(idx)} EVs")
        if idx[0] > 0:
            ax.axhline(idx[0] - 0.5, color="#404040", linewidth=0.8)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_ylim(len(tl.rows) - 0.5, -0.5)  # plane 0 on top
    source = {
        "ev_timeline": "from end.mrc.ev_timeline",
        "trace": "from the trace's ev records",
        "events": "derived from path-retired/restored events: skips and probes not shown",
    }.get(tl.source, "")
    cut = f"; cut at {tl.end:.3f} s, the bench keeps 100,000 changes" if tl.truncated else ""
    ax.set_title(f"EV states over time ({len(tl.rows)} EVs, one row each; {source}{cut})")
    ax.legend(loc="lower left", fontsize=8, ncol=len(present), framealpha=0.9)


def _cc(ax: Axes, run: Run) -> None:
    mib = float(1 << 20)
    ws = series.windows(run)
    for w in ws:
        colour = _plane_colour(w.plane)
        cwnd = [c / mib if c is not None else float("nan") for c in w.cwnd]
        ax.step(w.t, cwnd, where="post", color=colour, linewidth=1.2,
                label=f"plane {w.plane} window")
        ax.step(w.t, [f / mib for f in w.in_flight], where="post", color=colour,
                linestyle="--", linewidth=0.9, label=f"plane {w.plane} in flight")
    t, total = series.total_window(run)
    if t:
        ax.step(t, [c / mib for c in total], where="post", color="#000000", linestyle=":",
                linewidth=1.0, label="connection window (snd_cwnd)")
    ax.set_title("Congestion window (the plane's cap) and bytes in flight per plane")
    # windows reach tens of MiB while a plane has a few packets in flight: a log axis shows
    # both; an empty plane (0 bytes) sits on the bottom edge
    values = [v for w in ws for v in (*w.cwnd, *w.in_flight) if v is not None and v > 0]
    values += [c for c in total if c > 0]
    ax.set_yscale("log", nonpositive="clip")
    if values:
        ax.set_ylim(min(values) / mib / 2, max(values) / mib * 2)
    ax.set_ylabel("MiB (log scale)")
    ax.legend(loc="upper right", fontsize=7, ncol=3)


def _failover(ax: Axes, run: Run) -> None:
    for a in series.failover(run):
        ax.step(a.t, a.gbps, where="post", label=TRANSPORT_NAMES.get(a.transport, a.transport),
                linewidth=1.2)
    ax.axvline(0.0, color=MARK_STYLES["fault"][0], linewidth=1.2)
    ax.annotate("fault", xy=(0.0, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                va="top", ha="right", fontsize=8, color=MARK_STYLES["fault"][0])
    bins = sorted({s.bin_seconds for s in run.failover.values()})
    width = "/".join(f"{b * 1e3:g}" for b in bins)
    ax.set_title(f"Failover: receiver goodput of each transport, aligned at its fault "
                 f"({width} ms bins)")
    ax.set_xlabel("time from the fault (s)")
    ax.set_ylabel("Gbit/s")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower left", fontsize=8)


def _marks(ax: Axes, marks: list[series.Mark], labels: bool) -> None:
    """A vertical line per mark; on the top panel also its label, written across from the
    line and stepped down for marks close together so that a burst stays readable."""
    span = max(ax.get_xlim()[1] - ax.get_xlim()[0], 1e-9)
    level, last_t = 0, float("-inf")
    for i, m in enumerate(marks):
        colour, style = MARK_STYLES.get(m.kind, ("#7f7f7f", ":"))
        ax.axvline(m.t, color=colour, linestyle=style, linewidth=1.0, alpha=0.9)
        if not labels or i >= MAX_LABELS:
            continue
        level = (level + 1) % 6 if m.t - last_t < 0.2 * span else 0
        last_t = m.t
        text = f"{m.label} ({m.t:.3f} s)"
        if i == MAX_LABELS - 1 and len(marks) > MAX_LABELS:
            text += f" … and {len(marks) - MAX_LABELS} more marks"
        ax.annotate(text, xy=(m.t, 0.95 - 0.11 * level), xycoords=("data", "axes fraction"),
                    xytext=(3, 0), textcoords="offset points", color=colour, fontsize=7,
                    va="top", ha="left",
                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none",
                          "alpha": 0.75})
