"""Many flows at once on packet trains (mrc.experiments.permutation): a 32-host permutation of
the core Session finishing with exact outcomes, and htsim connection matrices read or refused
in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrc.experiments.permutation import (
    Flow,
    MatrixError,
    mrc_config,
    permutation,
    read_cm,
    run_flows,
)
from mrc.sim import FabricSpec, LinkParams, Network, build


def test_a_small_permutation_finishes_with_exact_outcomes() -> None:
    """32 hosts of a 2-plane 2-tier Clos, 100 Gbit/s, every host writes 256 KiB to another:
    every WRITE completes, every byte lands, nothing is dropped or resent, and no flow beats
    its own serialization time."""
    spec = FabricSpec(
        hosts=32, planes=2, hosts_per_rack=8, tier1=4,
        host_link=LinkParams(rate_bps=100e9, latency=1e-6, queue_bytes=1 << 30),
        fabric_link=LinkParams(rate_bps=100e9, latency=1e-6, queue_bytes=200_000),
        ecn_threshold=90_000, trim=True,
    )  # fmt: skip
    net = Network(seed=3, trains=True)
    fab = build(net, spec)
    config = mrc_config(fab, base_rtt=10e-6, flowcell=15, payload_mtu=4096)
    flows = permutation(32, 256 << 10, seed=5)
    assert sorted(f.src for f in flows) == sorted(f.dst for f in flows) == list(range(32))
    assert all(f.src != f.dst for f in flows)
    run = run_flows(net, fab, flows, config, timeout=0.01, verify=True)
    assert (run.completed, run.intact, run.drops, run.retransmits) == (32, True, 0, 0)
    # 256 KiB in 4096-byte payloads: 64 data packets per flow, none sent twice.
    assert run.data_packets == 32 * 64 and run.trims == 0
    # 64 packets of 4136 bytes over two 100 Gbit/s planes: at least 10.6 µs each.
    fastest = 64 * 4136 * 8 / 200e9
    done = [t for t in run.fct if t is not None]
    assert min(done) > fastest and max(done) < 20 * fastest
    p50, p99 = run.percentile(50), run.percentile(99)
    assert p50 is not None and p99 is not None and p50 <= p99 == max(done)


def test_connection_matrices(tmp_path: Path) -> None:
    cm = tmp_path / "perm.cm"
    cm.write_text("Nodes 4\nConnections 2\n0->3 id 1 start 0 size 2000\n3->1 id 2 start 5 size 9\n")
    assert read_cm(cm) == [Flow(0, 3, 2000, 0.0), Flow(3, 1, 9, 5e-6)]
    for text, message in (
        ("Nodes 4\n0->9 id 1 start 0 size 10\n", "beyond Nodes 4"),
        ("0->0 id 1 start 0 size 10\n", "two hosts"),
        ("0-1 id 1 size 10\n", "cannot read"),
        ("Nodes 4\n", "no flows"),
    ):
        cm.write_text(text)
        with pytest.raises(MatrixError, match=message) as info:
            read_cm(cm)
        assert "\n" not in str(info.value)
    with pytest.raises(MatrixError, match="at least two hosts"):
        permutation(1, 10)
