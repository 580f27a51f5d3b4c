"""Deterministic simulated networks for driving the sans-I/O core with virtual time: links and
their queues, per packet or in trains (link.py), hosts and the event loop (network.py),
switches and Clos fabrics (fabric.py), fabric shapes at any scale (topology.py), and the
RoCE-like baseline (roce.py, roce_host.py). Experiments built on it live in mrc.experiments.

This package's API is the names below, each defined in the module named beside it.
"""

from .fabric import Clos, Port, Switch
from .link import TOS_ECT0, Delivery, InFlight, Link, LinkParams, QueueStats
from .network import Host, Network
from .topology import Fabric, FabricSpec, TopologyError, build, clos, mrc_fabric, read_htsim_topo

__all__ = [
    "TOS_ECT0",
    "Clos",
    "Delivery",
    "Fabric",
    "FabricSpec",
    "Host",
    "InFlight",
    "Link",
    "LinkParams",
    "Network",
    "Port",
    "QueueStats",
    "Switch",
    "TopologyError",
    "build",
    "clos",
    "mrc_fabric",
    "read_htsim_topo",
]
