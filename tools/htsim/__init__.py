"""The htsim cross-check (`python -m tools.htsim`): UEC's htsim and mrc's simulator on the same
1,024-host permutation, completion times and wall times side by side (compare.py).

Measured on 2026-11-24 (2 vCPU shared with other engineers' jobs; both sides under `nice -n
10`), flowcell 1, read every 1 µs. "as-is" is mrc with its own settings (`--as-is`, and the run
before these settings existed, at load about 7); "matched" is the default, with the settings
compare.MATCHED lists set as htsim has them (at load about 2.5; at load 7 the same run took
182.8 s wall, 10.3x, and 122.2 s CPU):

                         htsim     mrc as-is     mrc matched
    FCT p50 (µs)         196.1         232.6           184.1   (mrc/htsim 1.19 -> 0.94)
    FCT p99 (µs)         204.2         243.8           187.3   (1.19 -> 0.92)
    FCT max (µs)         205.6         247.5           189.1
    wall (s)              14.9         310.1           119.6   (matched: 8.0x)
    CPU (s)               14.9         136.2           116.2   (7.8x)
    peak RSS (MB)          141           506             567
    events          11,929,163     4,470,391       4,334,580
    data packets       501,760       498,688         498,688   (mrc: 1,024 x 487, no resend)

Where the 19 % went, each setting measured alone on htsim's 128-host fat tree (same links,
queues and RTT; htsim there: p50 193.7, p99 201.3 µs):

    mrc as-is                         p50 231.8   p99 244.7
    control packets ahead of data     p50 204.6   p99 209.0
    first window = htsim's            p50 207.3   p99 231.0
    both (matched)                    p50 181.0   p99 182.6

- First window. htsim starts every flow at cwnd = 1.5 x BDP (262,926 bytes); NSCC in mrc does
  too, but MRC's plane queue guard (mrc.core.cc.planeq, beyond UEC) starts each plane's cap at
  64 KiB and slow-starts it. A flow alone (0 -> 1000 on fat_tree_1024) takes 195.1 µs as-is,
  176.0 µs with the guard's first cap at htsim's window, and 176.2 µs in htsim: that 19 µs is
  MRC's guard, a protocol choice, and the rest of the lone flow agrees to 0.2 µs.
- Control packets. htsim's NIC pulls data from a sender one packet at a time and sends
  control packets 10:1 ahead of data; its switch queues serve header-only packets (ACKs,
  NACKs, trimmed headers) at strict priority. mrc's simulator had one FIFO: a sender hands its
  NIC a window of data at once, so the 0.5 x BDP its window holds beyond the pipe sat in the
  NIC queue, and in a permutation every host's SACKs for its inbound flow waited behind it
  (about 7 µs), stretching every RTT and leaving the window short of the pipe.
- What remains: matched, mrc's flows are 6-8 % faster than htsim's. Alone they agree; under
  the permutation htsim adds about 20 µs and mrc about 8. In mrc's run nothing was trimmed or
  resent, 4 packets were marked and the deepest switch queue held 99,600 bytes (24 packets,
  8 µs); in htsim (128-host run) 125 of 128 flows saw an RTT 10.5 µs (its delay target) above
  base at least once (its fair-increase counters). The likely cause, not isolated here:
  htsim's switches hash (flow, EV) onto their uplinks at every tier, so a flow's 64 EVs fall
  unevenly on the 8 x 8 core paths, while MRC routes EV i onto path i exactly
  (docs/DESIGN.md §4), which spreads each flow evenly.
  Two smaller differences favour mrc too: it sends 487 packets per flow to htsim's 490
  (about 1 µs), and its priority lane does not charge the control packets' few bytes to the
  data's line time (about 0.5 % of it).
"""
