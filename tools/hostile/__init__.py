"""The hostile-input harness: a live verified `mrc bench` transfer under attack on loopback.

`python -m tools.hostile` (root only) sniffs a bench client's connection to a bench server on 4
loopback planes and sends up to a million hostile datagrams with the genuine peers' source
addresses (forged data ahead of the sender, replays, bit flips, forged SACK/NACK/PROBE/CM, …)
while the transfer runs, then reports crashes, the transfer's integrity and every side's drops
by reason. With `--family local` (or `all`) it attacks a real `mrc daemon`'s control socket
with hostile local clients of another uid instead (or as well): other clients' views and
objects, quotas, floods, malformed and nested JSON, bad fds and memfds, slow readers; and
reports per case that the daemon survived, refused clearly, leaked nothing and logged no
traceback. Modules: `rawnet` (sniffer and spoofer), `flow` (what the sniffer learned),
`attacks` (the generators), `procs` (bench processes, kernel counters), `run` (one run),
`report` (its figures), `local` and `localproc` (the local family, its daemon and clients)
and `cli`. The transport itself lives in `mrc/`; nothing here is imported by it.
"""
