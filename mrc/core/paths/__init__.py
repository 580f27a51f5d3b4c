"""Planes and EVs of one connection: plane state and RTT, path health (probes, DOWN/UP), the EV
table, plane balance and spray policies, and where an EV travels on the wire
(docs/DESIGN.md §4).

What to do after a loss is `mrc.core.loss`'s business; how much to send, `mrc.core.cc`'s.
"""
