"""The responder half of a session: checks, placement into registered memory, the scoreboard of
what arrived, and the SACK/NACK/AETH replies (docs/DESIGN.md §5).

Memory regions themselves are `mrc.core.memory`; the security gate in front is
`mrc.core.secure`.
"""
