"""`mrc plot job.json`: the training job's step time over time, with the faults marked.

The input is what `python -m tools.job -o job.json` writes (`"tool": "tools.job"`): runs of a
transport (mrc, tcp, mptcp) under a fault schedule on a fabric (srv6, ecmp), each with its
steps (start and duration in seconds after the run's T0, ok, verified) and the fault events as
played. `read_job` checks it into `JobPanel`s, one per (fabric, schedule), every transport's
steps on the same clock (each run's own T0; the schedule is the same in every run); `plot_job`
draws one panel per fabric and schedule, stacked: step time (log scale, so a 5 s timeout and a
0.2 s step both show) against the step's start, failed steps as crosses, each fault as a band
from its `down` to its `up` (a link that stays down reaches the end), the mrc fault-free p50 ×
1.1 as a dotted line. Every problem is a one-line `PlotError`. `is_job_file` is how the
dispatch (`draw.plot_file`) tells a job document from the other inputs without reading it all.

What it leaves to others: the bench, trace and compare inputs (`load`, `draw`); running the
job (tools/job).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from .model import PlotError

__all__ = ["JobPanel", "JobSteps", "is_job_file", "plot_job", "read_job"]

MAX_JOB_BYTES = 256 << 20
COLOURS = {"mrc": "#1f77b4", "tcp": "#d62728", "mptcp": "#ff7f0e"}
NAMES = {"mrc": "mrc", "tcp": "TCP (one path)", "mptcp": "MPTCP (a subflow per plane)"}


@dataclass(frozen=True)
class JobSteps:
    """One run's steps: start (s after its T0), duration (s), ok and verified, as columns."""

    transport: str
    start: tuple[float, ...]
    seconds: tuple[float, ...]
    good: tuple[bool, ...]
    p50: float | None


@dataclass
class JobPanel:
    """Every transport's run of one schedule on one fabric, and the schedule's faults as
    (down, up or None, label) in seconds after T0."""

    fabric: str
    schedule: str
    runs: list[JobSteps] = field(default_factory=list)
    faults: list[tuple[float, float | None, str]] = field(default_factory=list)


def is_job_file(path: str) -> bool:
    """Whether `path` starts as a tools.job document (its first key is `"tool"`)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False  # the loader reports it
    return b'"tool": "tools.job"' in head


def _num(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(what)
    return float(v)


def _faults(run: dict[str, Any]) -> list[tuple[float, float | None, str]]:
    """(down, up, label) bands from the played events, paired per link set."""
    events = run.get("faults") or []
    if not isinstance(events, list):
        raise ValueError("faults")
    bands: list[tuple[float, float | None, str]] = []
    open_at: dict[tuple[str, ...], tuple[float, str]] = {}
    for e in events:
        if not isinstance(e, dict) or "action" not in e:
            continue  # an injector error record: nothing was changed
        t = _num(e.get("started", e.get("at")), "faults[].at")
        links = tuple(str(x) for x in e.get("links") or [])
        label = str(e.get("label") or " ".join(links))
        if e["action"] == "down":
            open_at[links] = (t, label)
        elif links in open_at:
            down, label = open_at.pop(links)
            bands.append((down, t, label))
    bands += [(down, None, label) for down, label in open_at.values()]
    return sorted(bands, key=lambda b: b[0])


def read_job(path: str) -> list[JobPanel]:
    """The panels of a tools.job document, in the order of its runs."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JOB_BYTES + 1)
    except OSError as exc:
        raise PlotError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_JOB_BYTES:
        raise PlotError(f"{path}: larger than {MAX_JOB_BYTES >> 20} MiB")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise PlotError(f"{path}: not JSON (a tools.job document is one JSON object)") from None
    if not isinstance(doc, dict) or doc.get("tool") != "tools.job":
        raise PlotError(f"{path}: not a tools.job document")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise PlotError(f"{path}: a tools.job document without runs")
    panels: dict[tuple[str, str], JobPanel] = {}
    for i, run in enumerate(runs):
        try:
            if not isinstance(run, dict):
                raise ValueError("run")
            key = (str(run["fabric"]), str(run["schedule"]))
            panel = panels.setdefault(key, JobPanel(*key))
            steps = run["steps"]
            if not isinstance(steps, list):
                raise ValueError("steps")
            p50 = (run.get("summary") or {}).get("p50")
            panel.runs.append(JobSteps(
                str(run["transport"]),
                tuple(_num(s["start"], "start") for s in steps),
                tuple(_num(s["seconds"], "seconds") for s in steps),
                tuple(bool(s["ok"]) and bool(s["verified"]) for s in steps),
                None if p50 is None else _num(p50, "summary.p50")))
            if not panel.faults:
                panel.faults = _faults(run)
        except (KeyError, TypeError, ValueError) as exc:
            raise PlotError(f"{path}: runs[{i}] is malformed ({exc})") from None
    return list(panels.values())


def plot_job(path: str, out: str, what: str = "all") -> str:
    """Draw `path` (a tools.job document) into `out`; the line to print. matplotlib must be
    importable (the caller checks)."""
    if what not in ("all", "job"):
        raise PlotError(f"{path}: a tools.job document has step-time panels only "
                        "(use --what all)")
    panels = read_job(path)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 2.8 * len(panels) + 0.6), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    end = max((s + d for p in panels for r in p.runs for s, d in zip(r.start, r.seconds,
                                                                       strict=True)),
              default=1.0)
    baselines = {(p.fabric, r.transport): r.p50 for p in panels if p.schedule == "none"
                 for r in p.runs}
    for ax, panel in zip(axes, panels, strict=True):
        for lo, hi, _ in panel.faults:
            ax.axvspan(lo, end if hi is None else hi, color="#d62728", alpha=0.12, linewidth=0)
        for lo, _, label in panel.faults[:8]:
            ax.annotate(label, xy=(lo, 0.97), xycoords=("data", "axes fraction"), fontsize=6,
                        rotation=90, va="top", ha="right", color="#a01010")
        for r in panel.runs:
            colour = COLOURS.get(r.transport, "#7f7f7f")
            ax.plot(r.start, r.seconds, color=colour, linewidth=1.0, marker=".", markersize=3,
                    label=NAMES.get(r.transport, r.transport))
            bad = [(s, d) for s, d, g in zip(r.start, r.seconds, r.good, strict=True) if not g]
            if bad:
                ax.scatter([s for s, _ in bad], [d for _, d in bad], marker="x", s=30,
                           color=colour, label=f"{r.transport}: failed step ({len(bad)})")
        base = baselines.get((panel.fabric, "mrc"))
        if base:
            ax.axhline(1.1 * base, color=COLOURS["mrc"], linestyle=":", linewidth=0.9,
                       label="1.1 x mrc fault-free p50")
        ax.set_yscale("log")
        ax.set_xlim(0, end)
        ax.set_ylabel("step time (s)")
        faults = f", {len(panel.faults)} faults (red bands)" if panel.faults else ""
        ax.set_title(f"{panel.fabric}: schedule {panel.schedule}{faults}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1].set_xlabel("time since the run's first step (s)")
    fig.suptitle(f"Training job step time: {os.path.basename(path)}")
    try:
        fig.savefig(out, dpi=110)
    except OSError as exc:
        raise PlotError(f"cannot write {out}: {exc.strerror or exc}") from None
    return f"wrote {out} (job: {len(panels)} step-time panels)"
