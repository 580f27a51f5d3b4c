"""Step times into figures: merging the ranks' steps, percentiles, the summary and its table.

`merge_steps` turns each rank's step records into the job's steps (a synchronous job's step is
as slow as its slowest rank, and good only when every rank's collective completed and its result
verified); `summarize` gives one run's figures against its fault-free baseline; `table` prints
the runs side by side. Pure functions over plain dicts (the JSON the runner writes), so the unit
tests check them exactly. Running anything is `runner`'s job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: A step slower than this times the fault-free p50 of the same transport is "slow".
SLOW_FACTOR = 1.1
#: The goal: p99 under faults at most this times the fault-free p99.
P99_FACTOR = 1.1


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (the smallest value with at least q % of the values at or below
    it); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[k - 1]


def merge_steps(per_rank: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The job's steps from every rank's records (`step`, `start`, `end`, `ok`, `verified`,
    `error`, and a failed step's `daemon` view), keyed by step number; a step some rank never
    reported is failed."""
    world = len(per_rank)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rank, records in enumerate(per_rank):
        for rec in records:
            by_step.setdefault(int(rec["step"]), []).append(rec | {"rank": rank})
    steps = []
    for n in sorted(by_step):
        recs = by_step[n]
        errors = sorted({str(r["error"]) for r in recs if r.get("error")})
        if len(recs) < world:
            errors.append(f"{world - len(recs)} rank(s) did not report the step")
        ok = len(recs) == world and all(r["ok"] for r in recs)
        steps.append({
            "step": n,
            "start": round(min(float(r["start"]) for r in recs), 6),
            "end": round(max(float(r["end"]) for r in recs), 6),
            "seconds": round(max(float(r["end"]) - float(r["start"]) for r in recs), 6),
            "ok": ok,
            "verified": ok and all(r["verified"] for r in recs),
            "restarted": any(r.get("restarted") for r in recs),
            "errors": errors,
        } | ({"daemons": {str(r["rank"]): r["daemon"] for r in recs if r.get("daemon")}}
             if any(r.get("daemon") for r in recs) else {}))
    return steps


def summarize(steps: Sequence[dict[str, Any]], wanted: int,
              baseline: dict[str, Any] | None) -> dict[str, Any]:
    """One run's figures: p50/p99/max over every step that ran (a failed step counts with the
    time it took to fail and to restart), steps slower than `SLOW_FACTOR` × the baseline's p50,
    failed steps (one that raised, timed out, gave a wrong result or a rank did not report),
    `unrun` (of the `wanted` steps, those the deadline cut off), verified results, and whether
    it meets the goal against `baseline` (the same transport's fault-free summary)."""
    times = [float(s["seconds"]) for s in steps]
    ran = len(steps)
    failed = sum(1 for s in steps if not s["ok"])
    verified = sum(1 for s in steps if s["verified"])
    out: dict[str, Any] = {
        "steps": ran,
        "wanted": wanted,
        "unrun": max(0, wanted - ran),
        "p50": percentile(times, 50),
        "p99": percentile(times, 99),
        "max": max(times) if times else None,
        "failed": failed,
        "verified": verified,
        "restarts": sum(1 for s in steps if s.get("restarted")),
        "slow": None,
        "p99_ratio": None,
        "goal": None,
    }
    if baseline is not None and baseline.get("p50") and baseline.get("p99"):
        limit = SLOW_FACTOR * float(baseline["p50"])
        out["slow"] = sum(1 for t in times if t > limit)
        if out["p99"] is not None:
            out["p99_ratio"] = round(float(out["p99"]) / float(baseline["p99"]), 3)
            out["goal"] = (failed == 0 and verified == ran and out["unrun"] == 0
                           and out["p99_ratio"] <= P99_FACTOR)
    return out


def _ms(v: Any) -> str:
    return "-" if v is None else f"{float(v) * 1e3:.0f}"


def table(runs: Sequence[dict[str, Any]]) -> str:
    """The summary table: a row per (fabric, schedule, transport)."""
    head = ("fabric", "schedule", "transport", "steps", "p50 ms", "p99 ms", "max ms",
            "slow", "failed", "unrun", "verified", "p99/ff")
    rows = [head]
    for r in runs:
        s = r["summary"]
        ratio = "-" if s.get("p99_ratio") is None else f"{s['p99_ratio']:.2f}"
        rows.append((r["fabric"], r["schedule"], r["transport"], str(s["steps"]), _ms(s["p50"]),
                     _ms(s["p99"]), _ms(s["max"]), "-" if s["slow"] is None else str(s["slow"]),
                     str(s["failed"]), str(s.get("unrun", 0)), f"{s['verified']}/{s['steps']}",
                     ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    return "\n".join(lines)
