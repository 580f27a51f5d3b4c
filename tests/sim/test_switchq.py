"""The shared switch queue model (mrc.switchq): its rules as exact stories, and the same
offered burst judged alike by the simulator's port and by the `mrc switch` relay's port."""

from __future__ import annotations

import pytest

from mrc.io.switch_queue import EgressPort
from mrc.sim import LinkParams, Network, clos
from mrc.switchq import (
    DSCP_TRIMMED,
    DSCP_TRIMMED_LASTHOP,
    QueuePolicy,
    Verdict,
    decide,
    is_data,
)

ECT0, CE = 0x02, 0x03
DATA = bytes([0xC6]) + bytes(999)  # a WRITE_FIRST's first byte, 1000 bytes long


def test_rules_in_order() -> None:
    p = QueuePolicy(queue_bytes=3000, ecn_threshold=1500, trim=True, trim_size=64)
    # Fits, below the threshold: queued as it is.
    assert decide(p, 1000, 0, 1000, ECT0, True) == (Verdict.QUEUED, ECT0, 1000)
    # Fits, more than 1500 bytes ahead: CE on an ECN-capable packet, never on a Not-ECT one.
    assert decide(p, 1600, 0, 1000, ECT0, True) == (Verdict.MARKED, CE, 1000)
    assert decide(p, 1600, 0, 1000, 0x00, True) == (Verdict.QUEUED, 0x00, 1000)
    # Exactly full still fits; one byte more is trimmed to 64 bytes, DSCP 11, ECN kept.
    assert decide(p, 2000, 0, 1000, ECT0, True)[0] is Verdict.MARKED
    assert decide(p, 2001, 0, 1000, ECT0, True) == (
        Verdict.TRIMMED, DSCP_TRIMMED << 2 | ECT0, 64,
    )  # fmt: skip
    # Not trimmable (the relay: not an MRC data packet), or no longer than trim_size: dropped.
    assert decide(p, 2001, 0, 1000, ECT0, False)[0] is Verdict.DROPPED_QUEUE
    assert decide(p, 2990, 0, 64, ECT0, True)[0] is Verdict.DROPPED_QUEUE
    # Trimmed upstream: priority, even into a full data queue, never marked again.
    tos21 = DSCP_TRIMMED_LASTHOP << 2 | ECT0
    assert decide(p, 9999, 0, 64, tos21, True) == (Verdict.PRIORITY, tos21, 64)
    # The priority queue has `queue_bytes` of room (priority_bytes None).
    assert decide(p, 0, 2950, 64, tos21, True)[0] is Verdict.DROPPED_PRIORITY
    assert decide(p, 2001, 2950, 1000, ECT0, True)[0] is Verdict.DROPPED_PRIORITY
    # No trimming: a full queue tail-drops.
    off = QueuePolicy(queue_bytes=3000)
    assert decide(off, 2001, 0, 1000, ECT0, True)[0] is Verdict.DROPPED_QUEUE
    # The last hop's DSCP.
    last = QueuePolicy(queue_bytes=3000, trim=True, trimmed_dscp=DSCP_TRIMMED_LASTHOP)
    assert decide(last, 3000, 0, 1000, ECT0, True)[1] == tos21


def test_bad_policies_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="queue_bytes must be positive"):
        QueuePolicy(queue_bytes=0)
    with pytest.raises(ValueError, match="trim_size must be at least 44"):
        QueuePolicy(queue_bytes=3000, trim=True, trim_size=40)
    assert is_data(DATA) and not is_data(b"\x06" * 10) and not is_data(b"")


def test_sim_port_and_relay_port_judge_a_burst_alike() -> None:
    """Six 1000-byte data packets at once into a 3000-byte queue at 8 Mbit/s, ECN above 1500:
    both ports queue three (the third marked) and trim three to 64-byte headers."""
    relay = EgressPort(rate_bps=8e6, queue_bytes=3000, ecn_threshold=1500, last_hop=True)
    relay_verdicts = [relay.offer(DATA, ECT0, 0.0) for _ in range(6)]

    net = Network(seed=0)
    fast = LinkParams(rate_bps=1e12, latency=1e-6, queue_bytes=1 << 20)
    fab = clos(
        net, planes=1, racks=1, hosts_per_rack=2, tier1=1, host_link=fast,
        ecn_threshold=1500, trim=True,
    )  # fmt: skip
    h0, h1 = fab.hosts
    last = fab.link(fab.tier0[0][0], h1)
    last.params.rate_bps, last.params.queue_bytes = 8e6, 3000
    for _ in range(6):
        h0.inject(0, "h1", DATA)
    net.drive(0.010)
    c = last.counters
    # The sim's port counts the packet on the wire as queued (its occupancy is the link's
    # whole backlog); the relay's bucket holds the first packet until it has the tokens.
    assert relay_verdicts == [Verdict.QUEUED, Verdict.QUEUED, Verdict.MARKED] + [
        Verdict.TRIMMED
    ] * 3
    assert (c["forwarded"], c["ce_marked"], c["trimmed"], c["priority"]) == (6, 1, 3, 3)
    assert (relay.stats.ce_marked, relay.stats.trimmed, relay.stats.priority) == (1, 3, 3)
