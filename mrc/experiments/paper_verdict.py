"""Whether each of the MRC paper's outcomes holds in a set of simulator runs.

What it holds: `CLAIMS` (per experiment, the paper's outcome in a line and what the figure
means) and `verdict(name, results)`, which reads the metrics of paper_experiments.py for MRC
and for the RoCE baseline, with the fault-free references they are measured against, and
returns a `Verdict`: the key figure for both protocols side by side, flows completed, bytes
lost, whether the paper's outcome holds, and why (the numbers it was decided on).

The thresholds are the paper's words made checkable: "line rate holds" is at least 85 % of
the host's line rate; "its share gone" is the affected flows' rate within 15 % of (planes - 1)
/ planes of their fault-free rate; "minimal impact" and "nothing lost" are every flow done,
no byte lost, and aggregate goodput from the fault on (while every flow runs) within 10 % of
the capacity the fault leaves; "about a
third" is at least a quarter of line rate for the whole permutation (bytes over the time its
slowest flow takes, what a collective sees) with RoCE at under a third of MRC's; the incast
victim "untouched" is at least 90 % of its rate alone.

What it leaves to others: running (paper_experiments.py) and printing (paper.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .paper_experiments import REFERENCE, VICTIM_ALONE

Metrics = dict[str, Any]
#: results[experiment][proto] -> metrics
Results = dict[str, dict[str, Metrics]]

CLAIMS: dict[str, tuple[str, str]] = {
    "ev_loss": ("EV retired at once, line rate holds", "flow goodput / line rate"),
    "nic_down": ("flows go on with (P-1)/P of the bandwidth", "affected rate / reference"),
    "nic_flap": ("about half the bandwidth, no failure", "affected rate / reference"),
    "t0t1_downs": ("minimal impact, nothing fails", "aggregate / reference"),
    "t0t1_flaps": ("minimal impact, nothing fails", "aggregate / reference"),
    "tier0_lost": ("its share gone, nothing more", "affected rate / reference"),
    "tier1_lost": ("nothing lost", "aggregate / reference"),
    "loss1": ("MRC about 1/3 of line rate, RoCE unusable", "aggregate / line rate"),
    "incast": ("victim untouched (DCQCN victim loses ~25%)", "victim rate / alone"),
}


@dataclass
class Verdict:
    experiment: str
    claim: str
    measure: str
    mrc: float
    roce: float
    mrc_done: str
    roce_done: str
    mrc_lost: int
    roce_lost: int
    holds: bool
    why: str
    wall: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _affected_share(m: Metrics, ref: Metrics) -> float:
    """Mean rate of the affected flows against their steady rate in the reference run."""
    base = _mean([ref["steady_bps"][i] for i in m["affected"]])
    return _mean(m["affected_bps"]) / base if base else 0.0


def window_rate(m: Metrics, t0: float, t1: float) -> float:
    """Mean aggregate goodput (bit/s) over the sample intervals ending in (t0, t1]."""
    xs = [agg for t, agg, _ in m["series"] if t0 < t <= t1]
    return _mean(xs)


def _aggregate_share(m: Metrics, ref: Metrics) -> float:
    """Aggregate goodput from the fault until the first flow of either run completes (every
    flow still running), against the reference over the same window: both runs sample on
    the same grid."""
    t0 = m.get("fault_at", 0.0)
    t1 = min(m["first_done"], ref["first_done"])
    base = window_rate(ref, t0, t1)
    return window_rate(m, t0, t1) / base if base else 0.0


def _clean(m: Metrics) -> bool:
    return bool(m["completed"] == m["flows"] and m["bytes_lost"] == 0 and m["failed"] == 0)


def _figure(name: str, m: Metrics, results: Results, proto: str) -> float:
    if name in ("ev_loss", "loss1"):
        return float(m["line_share"])
    if name == "incast":
        alone = results[VICTIM_ALONE][proto]["victim_bps"]
        return float(m["victim_bps"] / alone) if alone else 0.0
    ref = results[REFERENCE][proto]
    if name in ("nic_down", "nic_flap", "tier0_lost"):
        return _affected_share(m, ref)
    return _aggregate_share(m, ref)


def _decide(name: str, mrc: Metrics, roce: Metrics, fm: float, fr: float) -> tuple[bool, str]:
    ok = _clean(mrc)
    done = f"MRC {mrc['completed']}/{mrc['flows']} done, {mrc['bytes_lost']} B lost"
    if mrc.get("unfinished"):
        done += f", flows {mrc['unfinished'][:5]} unfinished at {mrc['ended_at'] * 1e3:.2f} ms"
    if name == "ev_loss":
        after = mrc.get("retired_after")
        holds = ok and fm >= 0.85 and after is not None and mrc["victim_times_retired"] >= 1
        when = "never retired" if after is None else f"retired {after * 1e6:.0f} µs after the loss"
        return holds, f"{done}; {when}; {fm:.2f} of line rate (RoCE {fr:.2f})"
    if name in ("nic_down", "tier0_lost"):
        want = mrc["expected_share"]
        holds = ok and abs(fm - want) <= 0.15
        extra = ""
        if name == "tier0_lost":
            unaff = _mean(mrc["unaffected_bps"])
            extra = f"; unaffected flows {unaff / 1e9:.1f} Gbit/s"
        return holds, f"{done}; {fm:.2f} of reference, expected {want:.2f}{extra}"
    if name == "nic_flap":
        holds = ok and 0.35 <= fm <= 0.9
        return holds, f"{done}; {fm:.2f} of reference (paper: about half)"
    if name in ("t0t1_downs", "t0t1_flaps", "tier1_lost"):
        if name == "tier1_lost":
            left = mrc["capacity_left"]
        else:
            n = mrc.get("links_down", mrc.get("links_flapping", 0))
            left = 1 - n / mrc["links_total"]
        holds = ok and fm >= 0.9 * left
        return holds, f"{done}; {fm:.2f} of reference, capacity left {left:.2f}"
    if name == "loss1":
        holds = ok and fm >= 0.25 and fr < fm / 3
        return holds, (
            f"{done}; collective (to the last flow) MRC {fm:.2f}, RoCE {fr:.2f} of line rate; "
            f"mean per flow MRC {mrc['mean_flow_share']:.2f}, RoCE {roce['mean_flow_share']:.2f}"
        )
    if name == "incast":
        holds = ok and fm >= 0.9
        return holds, f"{done}; victim keeps {fm:.2f} (RoCE {fr:.2f}) of its rate alone"
    raise ValueError(f"paper: no claim for experiment {name!r}")


def verdict(name: str, results: Results) -> Verdict:
    """The paper's outcome for experiment `name`, decided on MRC's run, RoCE alongside."""
    if name not in CLAIMS:
        raise ValueError(f"paper: no claim for experiment {name!r}")
    mrc, roce = results[name]["mrc"], results[name]["roce"]
    fm = _figure(name, mrc, results, "mrc")
    fr = _figure(name, roce, results, "roce")
    holds, why = _decide(name, mrc, roce, fm, fr)
    claim, measure = CLAIMS[name]
    return Verdict(
        experiment=name,
        claim=claim,
        measure=measure,
        mrc=round(fm, 4),
        roce=round(fr, 4),
        mrc_done=f"{mrc['completed']}/{mrc['flows']}",
        roce_done=f"{roce['completed']}/{roce['flows']}",
        mrc_lost=mrc["bytes_lost"],
        roce_lost=roce["bytes_lost"],
        holds=holds,
        why=why,
        wall={"mrc": mrc.get("wall", 0.0), "roce": roce.get("wall", 0.0)},
    )


def needs(name: str) -> list[str]:
    """The runs experiment `name`'s verdict is taken against, besides its own."""
    if name == "incast":
        return [VICTIM_ALONE]
    if name in ("ev_loss", "loss1"):
        return []
    return [REFERENCE]
