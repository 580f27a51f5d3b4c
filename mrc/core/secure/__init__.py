"""Packet protection of a secured connection (docs/WIRE.md §6-§7): the CM handshake and key
schedule, per-packet AEAD, the anti-replay window and the gate a secured datagram passes before
the session acts on it.
"""
