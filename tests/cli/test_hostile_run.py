"""The hostile harness on loopback, as root: its raw sockets, a short mixed run at an encrypted
transfer, and the on-path attacker of issue 15 against auth, encrypt and none.

The attacker sniffs plane 0 and sends WRITE_MIDDLE forgeries ahead of the sender with the
client's own source address and port. Secured, the transfer must end `integrity ok` with the
forgeries dropped; unsecured, the same attack must corrupt it (so these tests can fail).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from benchproc import ROOT, env, free_port

from tools.hostile.rawnet import Sniffer, Spoofer

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: a packet socket on lo and a raw IPv4 socket"
)

SOL_UDP, UDP_SEGMENT = 17, 103




def hostile(
    *args: str, timeout: float = 80, pure: bool = False
) -> tuple[int, dict[str, Any], str]:
    run_env = env() | ({"MRC_PURE": "1"} if pure else {})
    proc = subprocess.run(
        [sys.executable, "-m", "tools.hostile", "-J", "--seed", "7", *args],
        capture_output=True, text=True, timeout=timeout, env=run_env, cwd=ROOT,
    )  # fmt: skip
    try:
        fig = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON (exit {proc.returncode}): {proc.stderr[-2000:]}") from None
    return proc.returncode, fig, proc.stderr


def test_spoofed_datagram_arrives_from_the_forged_source_and_is_not_sniffed() -> None:
    port = free_port("127.0.0.2")
    sniffer = Sniffer(port)
    spoofer = Spoofer()
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.2", port))
        rx.settimeout(2)
        tx.bind(("127.0.0.6", 0))
        for size in (0, 1, 4137):
            assert spoofer.send(("127.0.0.7", 4242), ("127.0.0.2", port), b"x" * size)
            data, src = rx.recvfrom(65536)
            assert (data, src) == (b"x" * size, ("127.0.0.7", 4242))
        # A genuine GSO batch of 3 segments (2 full, 1 short) is seen as 3 datagrams.
        batch = b"a" * 1000 + b"b" * 1000 + b"c" * 10
        tx.sendmsg([batch], [(SOL_UDP, UDP_SEGMENT, (1000).to_bytes(2, "little"))],
                   0, ("127.0.0.2", port))  # fmt: skip
        got = [rx.recv(65536) for _ in range(3)]
        assert got == [b"a" * 1000, b"b" * 1000, b"c" * 10]
        seen: list[Any] = []
        deadline = time.monotonic() + 2
        while len(seen) < 3 and time.monotonic() < deadline:
            seen += sniffer.read(100)
            time.sleep(0.01)
        time.sleep(0.05)
        seen += sniffer.read(100)
        # Only the genuine batch: the spoofed datagrams carry the TTL the filter skips.
        assert [(s.src, s.dst, s.dport, s.payload) for s in seen] == [
            ("127.0.0.6", "127.0.0.2", port, b"a" * 1000),
            ("127.0.0.6", "127.0.0.2", port, b"b" * 1000),
            ("127.0.0.6", "127.0.0.2", port, b"c" * 10),
        ]
        assert sniffer.packets == 1 and sniffer.skipped == 0
    finally:
        for s in (rx, tx):
            s.close()
        sniffer.close()
        spoofer.close()


def test_short_mixed_run_at_an_encrypted_transfer() -> None:
    rc, fig, err = hostile("--datagrams", "100000", "--security", "encrypt", "-n", "2G")
    assert rc == 0, (fig["crashes"], fig["clients"], err[-500:])
    assert fig["crashes"] == [] and fig["aborted"] is None and not fig["timed_out"]
    assert fig["datagrams"]["sent"] == 100_000
    assert fig["transfer_intact"] and fig["forged_bytes_placed"] == 0
    assert fig["messages_verified"] > 0 and fig["messages_corrupted"] == 0
    by_kind = fig["datagrams"]["by_kind"]
    assert set(by_kind) == {
        "forged_data", "replay", "bitflip", "truncate", "extend", "noise", "forged_sack",
        "forged_nack", "forged_probe", "forged_endpoint", "forged_trim", "forged_cm_request",
        "forged_cm_disconnect", "forged_cm_reject", "forged_cm_request_listed",
        "replayed_cm_request", "junk_to_plane", "forged_cm_reply",
    }  # fmt: skip
    assert min(by_kind.values()) > 1000
    server, client = fig["drops_by_reason"]["server"], fig["drops_by_reason"]["client"]
    # Each family of attack shows up under its reason.
    assert server["auth"] > by_kind["forged_data"] * 0.3  # wrong tags (and bit flips)
    assert server["replay"] > 0 and client["auth"] > 0  # replays; forged SACK/NACK/...
    assert any(k.startswith(("decode_", "bad_length")) for k in server)  # cut, extended, noise
    assert server["rejected_unknown_peer"] > 0  # forged REQUESTs with unlisted keys
    assert client.get("cm_mismatch", 0) > 0  # forged REJECTs
    # Forged REQUESTs claiming the client's listed key fail their seal (or wait for a token):
    # none is answered or kept (docs/WIRE.md §7 revision 1.2).
    listed = server.get("cm_auth", 0) + server.get("handshake_rate_limited", 0)
    assert listed >= 0.5 * by_kind["forged_cm_request_listed"], server
    # Forged REPLYs reach the established client and are never acted on.
    assert client.get("cm_unexpected_reply", 0) >= 0.5 * by_kind["forged_cm_reply"], client
    assert any(k.startswith("trimmed") for k in server) or fig["accounting"]["server"][
        "trimmed_received"
    ] > 0  # forged trims
    # What reached the server's core was dropped and counted, but for trims (hints the
    # receiver answers) and what came in after the last report.
    acc = fig["accounting"]["server"]
    assert acc["core_drops"] + acc["trimmed_received"] >= 0.8 * acc["reached_core_at_least"], acc


@pytest.mark.parametrize("security", ["auth", "encrypt"])
def test_forgeries_ahead_of_the_sender_are_dropped(security: str) -> None:
    rc, fig, err = hostile("--datagrams", "20000", "--security", security, "--kinds",
                           "forged_data", "--planes", "0", "-n", "512M")  # fmt: skip
    assert rc == 0, (fig["crashes"], fig["clients"], err[-500:])
    assert fig["crashes"] == [] and fig["transfer_intact"]
    assert all(c["integrity"] == "ok" and c["exit"] == 0 for c in fig["clients"])
    assert fig["forged_bytes_placed"] == 0 and fig["messages_corrupted"] == 0
    assert fig["datagrams"]["by_kind"] == {"forged_data": 20000}
    acc, drops = fig["accounting"]["server"], fig["drops_by_reason"]["server"]
    # Half carry a random trailer (dropped as `auth`), half none (short: taken for trims,
    # dropped as stale or answered with at most one NACK each, never written).
    assert drops["auth"] >= 0.3 * acc["reached_core_at_least"], drops
    # No forgery took a genuine packet's place: a genuine packet refused as a duplicate is one
    # the client sent again (a spurious resend under load, or the one early resend a forged
    # trim may cause), never an original whose PSN a forgery had filled.
    resent = sum(c["retransmits"] for c in fig["clients"])
    assert drops.get("duplicate", 0) <= resent, (drops, resent)
    trims = sum(v for k, v in drops.items() if k.startswith("trimmed"))
    assert drops["auth"] + trims + acc["trimmed_received"] >= 0.9 * acc["reached_core_at_least"]


def test_the_same_forgeries_corrupt_an_unsecured_transfer() -> None:
    # A forgery lands only while the sniffed PSN is still ahead of the sender: at 2000 a
    # second, a transfer of 512 MiB in about 1 s outran them 2 runs in 3; at 4000, 6 of 6
    # tool runs corrupted but a CI run did not; at 8000, 6 of 6. With the sender 15 % faster
    # again, 3 tool runs in 6 were intact, until the forger aimed at the far half of the rest
    # of the message (tools/hostile/attacks.py): 9 of 9 corrupted, but in the full suite a
    # CI run was still intact: the forger shares the two cores with both mrc processes and
    # sniffs late. The transfer runs pure Python (about half the packet rate), which gives
    # the forger the time to get ahead; what it shows does not depend on the build.
    rc, fig, err = hostile("--datagrams", "12000", "--rate", "8000", "--warmup", "0.5",
                           "--security", "none", "--kinds", "forged_data", "--planes", "0",
                           "-n", "512M", pure=True)  # fmt: skip
    assert rc == 0, (fig["crashes"], err[-500:])  # none: a corrupted transfer is no crash
    assert fig["crashes"] == [] and not fig["transfer_intact"]
    # The forgeries were written: the genuine packets came second and were refused as
    # duplicates of PSNs the forgeries had taken (a secured run counts next to none).
    assert fig["drops_by_reason"]["server"]["duplicate"] >= 1500
    # The verified client then reports the damage, or the sender, acknowledged for PSNs it
    # never sent, gives up on the connection (closed by the core, or by the bench's own
    # no-progress watchdog when the wedged connection stays open: 1 run in 3 here).
    errors = [c.get("error", "") for c in fig["clients"]]
    damage = ("integrity check failed", "connection closed", "no progress for")
    assert any(d in e for e in errors for d in damage), errors
    if any("integrity check failed" in e for e in errors):
        assert fig["messages_corrupted"] >= 1 and fig["forged_bytes_placed"] >= 4096


def test_replays_at_a_finished_connection_leave_the_server_serving() -> None:
    # Clients of 64 MiB end while replays of their packets are on the way; the server answers
    # some of them towards ports that are gone, and the next client must still get in.
    rc, fig, _ = hostile("--datagrams", "60000", "--kinds", "replay", "-n", "64M")
    assert fig["aborted"] is None, fig["aborted"]
    assert rc == 0 and fig["transfer_intact"] and len(fig["clients"]) > 1
