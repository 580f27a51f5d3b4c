"""The requester half of a session: posted WRITEs, their framing into packets and flowcells,
send records, bytes in flight, the acknowledgement ledger and completion (docs/DESIGN.md §2, §6).

Loss inference lives in `mrc.core.loss`, path choice in `mrc.core.paths`, the window in
`mrc.core.cc`.
"""
