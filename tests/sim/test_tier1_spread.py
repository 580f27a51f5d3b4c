"""Every tier-1 switch of a plane carries its share (docs/DESIGN.md §4, EVs).

A plane of 32 tier-1 switches and connections of 16 active EVs each: every connection's active
EVs sit on 16 consecutive paths from its own offset, so over many connections the traffic
spreads over all 32. (With the active EVs of every connection on paths 0-15, tier-1s 16-31
carried nothing but probes.) The story runs the paper's permutation on one plane in the
simulator and counts the bytes each tier-1 switch forwarded; tests/core/test_evs.py has the
offsets themselves.
"""

from __future__ import annotations

from mrc.experiments.paper_experiments import _go
from mrc.experiments.paper_run import MiB, Run, Scale, permutation

#: 64 hosts in two racks of 32, one plane of 32 tier-1s: host i writes to host i + 32, so all
#: 64 connections cross tier-1.
SCALE = Scale(hosts=64, planes=1, tier1=32, hosts_per_rack=32, flow_bytes=MiB // 4)


def test_64_connections_put_every_tier1_within_a_quarter_of_the_mean_bytes() -> None:
    run = Run("mrc", SCALE, permutation(SCALE))
    res = _go(run, SCALE)
    assert res.completed()
    carried = [sum(p.counters["forwarded_bytes"] for p in t1.ports.values())
               for t1 in run.fab.tier1[0]]  # fmt: skip
    mean = sum(carried) / len(carried)
    assert mean > 64 * SCALE.flow_bytes / 32
    assert all(0.75 * mean <= c <= 1.25 * mean for c in carried), [
        round(c / mean, 2) for c in carried
    ]
