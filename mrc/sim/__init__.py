"""Deterministic simulated networks for driving the sans-I/O core with virtual time: direct
planes (network.py), switches and Clos fabrics (fabric.py), fabric shapes at any scale
(topology.py), packet trains (trains.py) and many flows at once (permutation.py)."""

from .fabric import DSCP_TRIMMED, DSCP_TRIMMED_LASTHOP, Clos, Port, Switch, clos
from .network import TOS_ECT0, Host, InFlight, Link, LinkParams, Network, QueueStats
from .topology import Fabric, FabricSpec, TopologyError, build, mrc_fabric, read_htsim_topo

__all__ = [
    "DSCP_TRIMMED",
    "DSCP_TRIMMED_LASTHOP",
    "TOS_ECT0",
    "Clos",
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
