"""Congestion control of a sender: the window (NSCC or the MPR window only) and the plane queue
guard (docs/DESIGN.md §7). It says how much may be in flight; which EV carries it is
`mrc.core.paths`'.
"""
