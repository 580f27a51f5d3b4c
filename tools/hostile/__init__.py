"""The hostile-input harness: a live verified `mrc bench` transfer under attack on loopback.

`python -m tools.hostile` (root only) sniffs a bench client's connection to a bench server on 4
loopback planes and sends up to a million hostile datagrams with the genuine peers' source
addresses (forged data ahead of the sender, replays, bit flips, forged SACK/NACK/PROBE/CM, …)
while the transfer runs, then reports crashes, the transfer's integrity and every side's drops
by reason. Modules: `rawnet` (sniffer and spoofer), `flow` (what the sniffer learned),
`attacks` (the generators), `procs` (bench processes, kernel counters), `run` (one run),
`report` (its figures) and `cli`. The transport itself lives in `mrc/`; nothing here is
imported by it.
"""
