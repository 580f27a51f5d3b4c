"""The htsim cross-check (`python -m tools.htsim`): UEC's htsim and mrc's simulator on the same
1,024-host permutation, completion times and wall times side by side (compare.py).

Measured on 2026-11-24 (2 vCPU shared with three other engineers' jobs, load about 5; both
sides under `nice -n 10`), flowcell 1, read every 1 µs:

                         htsim           mrc
    FCT p50 (µs)         196.1         232.6     (mrc/htsim 1.19)
    FCT p99 (µs)         204.2         243.8     (1.19)
    FCT max (µs)         205.6         247.5
    wall (s)              29.9         204.5     (6.8x)
    CPU (s)               17.1         127.2     (7.4x)
    peak RSS (MB)          140           496
    events          11,929,163     4,470,412
    data packets       501,760       498,688     (mrc: 1,024 x 487, no retransmission)

Why mrc's flows are about 19 % slower. A flow alone on this fabric takes 195.1 µs to another pod
in mrc (178.0 within its pod, 167.0 within its rack; its 487 packets serialize in 161.7 µs) and
176.2 µs in htsim (flow 0 -> 1000). About 19 µs of that is NSCC's plane queue guard
(mrc.core.planeq), which starts every plane's cap at 64 KiB and grows it about 1.5x per RTT, so
a flow needs about 55 µs to reach its window (on 256 hosts of the same fabric: p50 226 µs with
it, 206 µs with it bypassed in an experiment, p99 then worse, 267 µs). The permutation then adds
about 37 µs to mrc's flows where it adds about 20 µs to htsim's: queueing of a few µs per hop
under full load (no packet was marked, trimmed or dropped in mrc's run). Not pinned down
further: one difference is that mrc's NSCC sizes each flow's window from its own measured base
RTT (175 KB inside a pod) where htsim gives every flow 1.5 x the BDP of the fabric's longest
path, but giving every flow htsim's window (`cc_max_cwnd=262926`) made mrc slower on 256 hosts
(p50 233, p99 270 µs: deeper queues).
"""
