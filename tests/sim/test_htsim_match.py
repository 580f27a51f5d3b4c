"""The settings the htsim cross-check matches to htsim's (tools/htsim): htsim's derived setup for
a fabric, control packets ahead of data (`FabricSpec.control_priority`), and the plane queue
guard's first cap (`SessionConfig.plane_initial_cap`). Each is shown changing exactly what it
should, and nothing when left at its default."""

from __future__ import annotations

import struct

import pytest

from mrc.core.config import SessionConfig
from mrc.core.errors import LocalProtocolError
from mrc.core.events import ConnectionEstablished, Event
from mrc.core.session import Session
from mrc.core.transmit import Transmit
from mrc.experiments.permutation import mrc_config
from mrc.sim import FabricSpec, Host, LinkParams, Network, TopologyError, build
from tools.htsim.compare import HtsimSetup

SLOW = LinkParams(rate_bps=8e6, latency=1e-6, queue_bytes=1 << 20)  # 1000 bytes = 1 ms
WRITE_FIRST = 0xC6  # an MRC data opcode (docs/WIRE.md §3)
SACK_LIKE = 0x11  # any opcode that is not data


def test_htsim_setup_of_its_1024_host_fat_tree() -> None:
    """htsim_uec prints these for fat_tree_1024.topo: network_max_unloaded_rtt 14.0227 µs,
    queues of 178,450 bytes, ECN 37,350..145,250, and every flow's first cwnd 262,926."""
    link = LinkParams(rate_bps=100e9, latency=1e-6)
    spec = FabricSpec(
        hosts=1024, planes=1, hosts_per_rack=8, tier1=8, racks_per_pod=8, tier2=64,
        host_link=link, fabric_link=link, core_link=link,
    )  # fmt: skip
    s = HtsimSetup.of(spec)
    assert s.base_rtt == pytest.approx(14.02272e-6, abs=1e-12)
    assert (s.bdp_packets, s.queue_bytes, s.ecn_low, s.ecn_high) == (43, 178_450, 37_350, 145_250)
    assert s.initial_cwnd == 262_926


def fabric(*, control_priority: bool) -> tuple[Network, Host, Host]:
    """Two hosts in two racks of one plane: four hops of 1 ms per 1000 bytes, 1 µs of cable."""
    net = Network(seed=0, trains=True)
    spec = FabricSpec(
        hosts=2, planes=1, hosts_per_rack=1, tier1=1, host_link=SLOW, fabric_link=SLOW,
        control_priority=control_priority,
    )  # fmt: skip
    fab = build(net, spec)
    return net, fab.hosts[0], fab.hosts[1]


def arrivals(host: Host) -> list[tuple[float, int]]:
    got: list[tuple[float, int]] = []

    def hook(h: Host, plane: int, batch: list[tuple[bytes, object, int]]) -> None:
        got.extend((round(h.net.now, 9), data[0]) for data, _, _ in batch)

    host.on_receive = hook
    return got


def test_control_packets_overtake_data_only_when_asked() -> None:
    """h0 hands its NIC three 1000-byte data packets, then a 50-byte control packet. In one
    FIFO the control packet waits behind the data at every hop: 3 ms at the NIC, then 1 ms at
    each switch, arriving at 6.054 ms. Ahead of data it crosses the four hops in 4 × (50 µs +
    1 µs) = 204 µs. The data arrive at 6.004 ms either way."""
    data = Transmit(plane=0, addr="h1", data=bytes([WRITE_FIRST]) * 3000, ev=0, segment_size=1000)
    control = Transmit(plane=0, addr="h1", data=bytes([SACK_LIKE]) * 50, ev=0, segment_size=0)
    for first, control_at in ((False, 0.006054), (True, 0.000204)):
        net, h0, h1 = fabric(control_priority=first)
        got = arrivals(h1)
        assert h0._send(data) and h0._send(control)
        net.drive(0.1)
        assert sorted(got) == sorted([(0.006004, WRITE_FIRST)] * 3 + [(control_at, SACK_LIKE)])


def test_control_priority_reaches_every_nic_and_port_and_needs_trains() -> None:
    """Two NIC links and six switch ports (each rack switch: host and uplink; the tier-1: two
    racks) all put control first; without the setting none is made ahead of use."""
    net, h0, h1 = fabric(control_priority=True)
    queues = [link.trainq for h in (h0, h1) for link in h.links.values()]
    queues += [port.trainq for sw in net.switches.values() for port in sw.ports.values()]
    assert len(queues) == 2 + 6 and all(q is not None and q.control_first for q in queues)
    net, h0, h1 = fabric(control_priority=False)
    assert all(link.trainq is None for h in (h0, h1) for link in h.links.values())
    spec = FabricSpec(hosts=2, planes=1, hosts_per_rack=1, tier1=1, control_priority=True)
    with pytest.raises(TopologyError, match="needs a network of packet trains"):
        build(Network(seed=0), spec)


_REPLY = struct.Struct(">QI")


def first_burst(**kw: int) -> int:
    """Data packets a 1 MB WRITE puts on the wire the moment it is posted, before any SACK:
    two hosts at 100 Gbit/s, NSCC at a 10 µs base RTT (window 1.5 × 125,000 = 187,500
    bytes: 45 packets of 4,096)."""
    size = 1 << 20
    posted: list[Session] = []

    def on_event(host: Host, session: Session, event: Event) -> None:
        if isinstance(event, ConnectionEstablished) and not posted:
            va, rkey = _REPLY.unpack(event.private_data)
            session.post_write(src, 0, size, va, rkey)
            posted.append(session)

    net = Network(seed=1, trains=True)
    link = LinkParams(rate_bps=100e9, latency=1e-6, queue_bytes=1 << 30)
    fab = build(net, FabricSpec(hosts=2, planes=1, hosts_per_rack=1, tier1=1,
                                host_link=link, fabric_link=link),
                handlers={"h0": on_event})  # fmt: skip
    config = mrc_config(fab, base_rtt=10e-6, payload_mtu=4096, **kw)
    a, b = fab.hosts
    dst = b.regions.register(bytearray(size), prefault_pages=False)
    src = a.regions.register(bytearray(size), prefault_pages=False)
    b.listen(config, lambda pd: _REPLY.pack(dst.base_va, dst.rkey))
    a.connect(b, config)
    assert net.drive_until(lambda: bool(posted), timeout=0.01)
    (session,) = posted
    return sum(r.packets_sent for r in session.paths.evs.by_ev.values())


def test_plane_initial_cap_sets_the_first_burst() -> None:
    """The plane guard's first cap is 64 KiB by default: 16 packets of 4,096 go at once. With
    `plane_initial_cap=100_000`, 24 do (100,000 // 4,096), still under NSCC's 45; with the
    cap at the window, NSCC's window is what stops the burst."""
    assert first_burst() == 16
    assert first_burst(plane_initial_cap=100_000) == 24
    assert first_burst(plane_initial_cap=187_500) == 45
    with pytest.raises(LocalProtocolError, match="plane_initial_cap"):
        SessionConfig(payload_mtu=4096, plane_initial_cap=4000).validate()
