"""A training job through fabric faults: step time of MRC, TCP and MPTCP on the clos testbed.

    sudo python -m tools.job [--fabric srv6,ecmp] [--transport mrc,tcp,mptcp]
        [--schedule none,flap,reboot,host-link] [--size 4M] [--steps 20] [--compute 0.1]
        [-o job.json] [-J]

On `tools.testbed`'s clos (4 hosts in 2 racks, 4 planes, 2 tier-1 switches per plane; SRv6,
and the `--ecmp 1` variant) a rank runs on every host: a loop of steps, each an all-reduce of
`--size` bytes (`mrc.collective`) then `--compute` seconds of sleep, every result checked. Each
transport runs fault-free, then under each of the MRC paper's fault schedules scaled to
seconds (`schedule`: tier-0 to tier-1 links flapping every second, tier-1 switches rebooted
one after another, one host's plane link lost for the rest of the run). Printed: a row per run
with the step time p50/p99/max, the steps slower than 1.1x the fault-free p50, failed steps
and verified results; `-o` writes the JSON (per-step times, the fault events as played), which
`mrc plot` draws as step time over time with the faults marked.

Transports: `mrc` (a daemon per host, the collective over the daemons' API, every plane and
its SRv6 paths), `tcp` (one connection per ring neighbour between plane-0 addresses: one path,
plane 0, whichever tier-1 the fabric's routing picks), `mptcp` (the same connections as MPTCP,
with one subflow per plane from the in-kernel path manager's announced addresses).

Modules: `schedule` (the fault schedules, pure), `stats` (merging ranks' steps, percentiles,
the table, pure), `fabric` (the testbed, daemons, MPTCP endpoints, tier-1 counters), `inject`
(playing a schedule), `rank` (one rank's step loop, a process), `runner` (a run, the matrix),
`cli` (the command line).
"""
