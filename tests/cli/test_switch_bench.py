"""Acceptance: a 256 MiB `mrc bench --verify` through a real `mrc switch` that trims.

Two loopback planes; plane 0 goes through the switch, which shapes it to 300 Mbit/s with a
64 KiB queue (a GSO flowcell of 15 packets nearly fills it, so bursts are trimmed). The data must
arrive intact on both sides, trimmed packets must come back as NACKs, and the sender must
retransmit what was trimmed or lost and little else: retransmits ≤ 1.1 × (trimmed packets the
receiver saw + packets the switch dropped: its tail and priority drops and its sockets' kernel
overflows), i.e. no go-back-N.

The switch runs with --realtime when we are root: on a 2-core machine shared with both bench
processes, plain scheduling would hold its packets for up to ~15 ms, queueing the emulated link
does not have.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from benchproc import CLIENT_ADDRS, SERVER_ADDRS, Server, client, json_docs
from test_switch_cli import SwitchProc

SWITCH_ADDR = "127.0.0.10"
RATE = "300M"
QUEUE = "64K"
TOTAL = 256 << 20
MSG = 1 << 20


def test_bench_through_a_trimming_switch_recovers_by_nack_without_go_back_n() -> None:
    server = Server("-1", "-J", addrs=SERVER_ADDRS[:2])
    realtime = ["--realtime"] if os.geteuid() == 0 else []
    sw = SwitchProc(
        "--listen", f"{SWITCH_ADDR}:{server.port}", "--forward", f"{SERVER_ADDRS[0]}:{server.port}",
        "--rate", RATE, "--queue", QUEUE, "-J", *realtime,
    )  # fmt: skip
    try:
        assert sw.listen is not None, sw.stderr
        proc = client(
            server.port,
            "-n", str(TOTAL), "-l", str(MSG), "--verify", "-J", "-i", "0",
            addrs=[SWITCH_ADDR, SERVER_ADDRS[1]],
            binds=CLIENT_ADDRS[:2],
            timeout=60,
        )  # fmt: skip
        sw_rc, sw_out, sw_err = sw.stop(signal.SIGTERM)
        srv_rc, srv_out, srv_err = server.stop()
    finally:
        sw.kill()
        server.stop(timeout=5)
    assert proc.returncode == 0, proc.stderr
    assert sw_rc == 0 and "Traceback" not in sw_err, sw_err
    assert srv_rc == 0 and "Traceback" not in srv_err, srv_err

    cdoc: dict[str, Any] = json.loads(proc.stdout)
    sdocs = json_docs(srv_out)
    assert len(sdocs) == 1
    swdoc = json.loads(sw_out)["end"]
    cm, sm = cdoc["end"]["mrc"], sdocs[0]["end"]["mrc"]
    fwd, rev = swdoc["forward"], swdoc["reverse"]

    # Intact on both sides.
    assert cm["integrity"] == "ok" and cm["messages_verified"] == TOTAL // MSG
    assert sm["integrity"] == "ok"
    assert cdoc["end"]["sum_received"]["bytes"] == TOTAL
    # The switch was in the path and trimmed; the receiver NACKed what it saw trimmed.
    assert swdoc["client"].startswith(f"{CLIENT_ADDRS[0]}:")
    assert fwd["forwarded_packets"] > 0 and rev["forwarded_packets"] > 0
    assert fwd["trimmed"] > 0 and fwd["max_queue_bytes"] <= 64 << 10
    trimmed = sm["trimmed_received"]
    assert 0 < trimmed <= fwd["trimmed"]
    assert sm["nacks_sent"] >= trimmed and cm["nacks_received"] > 0
    assert cm["retransmits_by_cause"]["nack_trimmed"] > 0

    # No go-back-N: retransmissions are for what was trimmed or dropped, plus 10 %.
    dropped = sum(
        d[k] for d in (fwd, rev) for k in ("socket_overflow", "dropped_queue", "dropped_priority")
    )
    retransmits = cdoc["end"]["sum_sent"]["retransmits"]
    figures = (
        f"goodput {cdoc['end']['sum_received']['bits_per_second'] / 1e6:.0f} Mbit/s, "
        f"retransmits {retransmits} {cm['retransmits_by_cause']}, trimmed_received {trimmed}, "
        f"switch trimmed {fwd['trimmed']} dropped {dropped}, "
        f"receiver drops {sm['drops_by_reason']}, "
        f"switch max lateness {fwd['max_release_lateness_seconds'] * 1e3:.1f} ms"
    )
    print(figures)
    assert retransmits <= 1.1 * (trimmed + dropped), figures
