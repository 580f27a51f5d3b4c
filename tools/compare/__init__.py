"""`mrc` side by side with its peers, on one netns testbed, in one run (`make compare`).

Run it as root: ``python -m tools.compare [-n 8G] [-o compare.json] [--only …]``. It builds a
`pair` testbed with `tools.testbed` (2 hosts, 4 veth planes, MTU 9000, IPv4 10.0.<p>.1/.2),
runs one after another, h1 sending and h2 receiving, each moving the same `-n` bytes
(default 8 GiB, chosen so the fast transports run ≥ 3 s each on this 2-vCPU VM):

1. `iperf3` TCP, one stream, plane 0 (`iperf3 -s -1 -J` / `iperf3 -c … -n N -J`).
2. Kernel MPTCP over all planes (`tools.compare.mptcp`, `IPPROTO_MPTCP`): `net.mptcp.enabled=1`
   and `ip mptcp limits set subflow 8 add_addr_accepted 8` in both namespaces, and in h1 one
   `ip mptcp endpoint add 10.0.<p>.1 dev p<p> subflow` per plane p ≥ 1 (plane 0 carries the
   initial subflow). That several subflows were used is checked twice: the client's
   `MPTCP_INFO` subflow count, and h2's per-interface receive counters (`plane_rx_bytes`,
   the per-plane split; a warning when a plane carried < 5 %).
3. `aioquic` (`tools.compare.quic`): one stream over plane 0, self-signed certificate made
   with `cryptography`. aioquic moves ~0.2 Gbit/s here, so it stops after
   `--quic-max-seconds` (15 s) and reports what moved (`capped`); rates stay comparable.
4. The raw-UDP ceiling (`tools.compare.rawudp`): GSO send / GRO receive sprayed over all
   planes, 44-byte header + 4096-byte payload like an mrc data packet, payload placed into a
   buffer at the offset carried in the header, no reliability.
5. `mrc bench --verify` over all planes (plus `--mrc-args`), on the compiled mrc.wire/mrc.core
   when `make install` built them, then the same run with `MRC_PURE=1` (`mrc_pure`): the pure
   Python build. Each mrc row's notes say which ran (`mrc.implementation()`).

Then the failover comparison (`tools.compare.failover`): a `--failover-seconds` (3 s) timed
transfer for MPTCP and for mrc, with plane `--fail-plane` (0) failed `--fault-after` (1 s)
after data started flowing, once for each kind of `--fault` (default both: `link-down`,
`faults.link_down` of tools.testbed on link h1-p<plane>, both ends down; then `blackhole`,
`faults.blackhole`, an nftables drop at both ends, a silent failure; either is armed while
the flow ramps up and fired at the fault instant, both ends at once). MPTCP runs once per
kind, mrc `--repeat` (10) times: issue 19's goal is a longest gap of at most 10 ms in 10 of
10 runs for each kind, and the report lists every run's gap. The first kind's results are
`failover.mrc` / `failover.mptcp` in compare.json, the second's `failover.mrc-blackhole` /
`failover.mptcp-blackhole`.

Last the latency section (`tools.compare.latency`, about 25 s): 5000 round trips of 64 bytes,
one in flight, for UDP and for TCP (`tools.compare.pingpong`: blocking sockets, TCP_NODELAY,
plane 0) and for `mrc bench --latency` (WRITE_WITH_IMM there and back, every plane), min/p50/
p99/p99.9/max side by side, with mrc's CPU per round trip on each side; and `mrc bench --sweep
--verify`, 1 s per size from 4 KiB to 16 MiB. Issue 36's goals are read from them as same-run
ratios: mrc's p50 and p99 against TCP ping-pong's, the client's CPU per round trip, and 4 KiB and
64 KiB goodput against 1 MiB's (`latency-udp`, `latency-tcp`, `latency-mrc`, `sweep-mrc` for
`--only`).

How each quantity is measured
-----------------------------
- **Goodput** (bits/s): payload bytes delivered to the receiving application over the
  receiver's own time span. iperf3: `end.sum_received.bits_per_second` of the client's `-J`
  document. MPTCP, aioquic, raw UDP: our receiver's bytes over first-byte-to-last-byte time
  (monotonic clock). mrc: `end.sum_received.bits_per_second` of the client's `-J` document
  (the server's bytes placed and verified over its test time). GB = 10^9 bytes.
- **CPU seconds per GB**: user + system CPU of the sending and the receiving process summed,
  from `os.wait4` on each (`ip netns exec` execs in place, so it is the program itself),
  divided by the bytes received / 10^9. It covers each process's whole life, interpreter
  start-up and imports included (about 0.1-0.4 s per Python process), which weighs more on
  short runs; interrupt and softirq time is not in it (see "Other load").
- **Ratios**: `mrc/PEER` = mrc goodput / PEER goodput; `cpu mrc/PEER` the same for CPU s/GB.
- **Per-plane split**: h2's `ip -s -j link` rx byte counters per interface, after minus before
  (wire bytes: headers and retransmissions included).
- **Failover byte logs.** MPTCP: the receiver stamps every `recv_into` that returns data with
  CLOCK_MONOTONIC and keeps (time, bytes); it reports 1 ms bins and every read-to-read gap
  > 2 ms exactly. mrc: `mrc bench -J -i 0.01` on both sides (the server's 10 ms intervals
  are bytes placed at the receiver), plus `end.mrc.longest_stall_seconds` (longest time
  without newly placed bytes, mrc's own 1 ms-resolution measure). For both transports a
  sampler in h2 (`tools.compare.sampler`) reads every plane interface's
  `/sys/class/net/IF/statistics/rx_bytes` every 1 ms (the `wire` numbers). mrc's intervals
  are put on the sampler's clock at the first 1 ms sample that grew by a full data payload
  (error ≲ one interval); the fault time is CLOCK_MONOTONIC just before `link_down` runs.
- **Longest gap** (`longest_gap_s`): MPTCP: the longest exact read-to-read gap from 1 s
  before the fault to the end, `longest_gap_at_s` its start after the fault. mrc:
  `end.mrc.longest_stall_seconds` (whole test, so it also catches stalls with no fault).
  Wire (both, under `wire`): the longest run of 1 ms samples in which the counters grew by
  less than one 4096-byte payload (ACKs, SACKs and probes do not count as new bytes).
- **Fault gap** (`fault_gap_s`): the longest gap that starts between 50 ms before and 500 ms
  after the fault, the stall the failure itself caused; **gap before** (`pre_gap_s`): the
  same over the pre-failure span, the transport's own jitter. MPTCP: exact read-to-read
  gaps; mrc: the 1 ms wire log (mrc places packets as they arrive, so bytes on the wire are
  bytes placed, less the few retransmitted duplicates).
- **Pre-failure rate**: mean goodput over the 1.5 s before the fault (never the first 0.3 s).
- **Time to 50 %** (`to_half_s`): 10 ms windows are laid from the fault on. If none in the
  first second is below half the pre-failure rate, 0. Otherwise, from the first one that
  is, the start of the first window that is back at ≥ 50 % and from which the next 100 ms
  also average ≥ 50 % (a trickle between stalls is not recovery), minus the fault time.
  Goodput-level: MPTCP 1 ms bins, mrc 10 ms intervals (wire-level under `wire`).
- **Lost in the first second** (`lost_in_first_s`): 1 - bytes delivered in [fault,
  fault + 1 s] / (pre-failure rate × 1 s): 0 = no progress lost, 1 = none made.
- **Post-failure goodput**: mean goodput from 0.5 s after the fault to the last data;
  `post_vs_3_of_4` = post / (0.75 × pre), 1.0 being the surviving 3 planes' share (a
  CPU-bound transport can exceed 1).
- **Other load**: the machine is shared, so every run also records `host_cpu_busy_s`
  (user + nice + system + steal of all CPUs over the run, /proc/stat) and, for throughput
  runs, `other_load_cpu_s` = that minus our two processes' CPU; the table flags a run when
  other processes used more than half a CPU on average. Interrupt and softirq time (much of
  it the kernel's packet work for our own transfers) is in neither figure.

The mrc failover run uses `--verify` too, so `integrity` says whether every message survived
the failure intact.

Modules: `cli` (orchestration, cleanup), `runs` (throughput runs), `failover`, `latency`
(round trips and the sweep), `analysis` (byte-log arithmetic), `report` (ratios, goals,
tables), `procs` (child processes, CPU), and the programs run inside the namespaces: `mptcp`,
`quic`, `rawudp`, `sampler`, `pingpong`.
"""
