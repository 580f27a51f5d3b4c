"""The responder half of a session: its checks, placement into registered memory,
and the SACK/NACK/AETH replies (docs/DESIGN.md §2, §6).

Memory regions themselves are `mrc.core.memory`; the security gate in front is
`mrc.core.secure`.
"""
