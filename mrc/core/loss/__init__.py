"""Loss inference of a sender: RACK per EV, what an expired RTO may conclude, and planes gone
silent (docs/DESIGN.md §6). It decides what is lost; resending it is `mrc.core.send`'s job.
"""
