"""Deterministic simulated networks for driving the sans-I/O core with virtual time: direct
planes (network.py) and two-tier multi-plane Clos fabrics with switches (fabric.py)."""

from .fabric import DSCP_TRIMMED, DSCP_TRIMMED_LASTHOP, Clos, Port, Switch, clos
from .network import TOS_ECT0, Host, InFlight, Link, LinkParams, Network, QueueStats

__all__ = [
    "DSCP_TRIMMED",
    "DSCP_TRIMMED_LASTHOP",
    "TOS_ECT0",
    "Clos",
    "Host",
    "InFlight",
    "Link",
    "LinkParams",
    "Network",
    "Port",
    "QueueStats",
    "Switch",
    "clos",
]
