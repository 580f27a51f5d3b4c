"""Deterministic simulated networks for driving the sans-I/O core with virtual time."""

from .network import Host, Link, LinkParams, Network

__all__ = ["Host", "Link", "LinkParams", "Network"]
