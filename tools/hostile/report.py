"""The figures of a hostile-input run, from what `tools.hostile.run` observed.

Holds `figures` (a `Raw` run record to one JSON-ready dict), `verdict` (the exit status it
earns) and `text` (the same figures as a few lines for a terminal).

How the figures are judged:

- **crashes**: a bench process that died by a signal we did not send, hung past its time, wrote
  a Python traceback or an `internal error` line, reported `internal_errors` in its JSON, or
  exited with a status other than 0 and 1. Exit 1 with a one-line `mrc bench:` reason is the
  bench's own clean verdict on a failed test (an integrity mismatch, a connection the attacker
  closed): a failed transfer, listed under `clients[].error`, not a crash.
- **transfer_intact**: every verified client exited 0 and reported `integrity ok`.
- **forged_bytes_placed**: bytes written into the server's memory from forged or replayed
  packets. It is 0 exactly when the transfer is intact, because of how `--verify` works: every
  message is a pattern that depends on its number and on each byte's position, and the server
  checks each whole message in its slot when the message's immediate arrives. A forgery the
  server accepts consumes its PSN, so the genuine packet for that PSN is later dropped as a
  duplicate and its message keeps foreign bytes (random payload, or another message's pattern
  from a replay or a stale slot): that message fails the check. A verbatim replay of a packet
  the server already has is a duplicate and places nothing; one whose original the kernel lost
  on the way places exactly the genuine bytes at the genuine place, which is no forgery. So no
  mismatch ⇔ nothing forged placed. When there are mismatches the exact count is not visible
  from outside; the figure is then a lower bound: one payload MTU for every two corrupted
  messages (one accepted forgery spoils at most the message its PSN belongs to and the one its
  VA points into).
- **accounting**: per side, the hostile datagrams sent there, the kernel's drops at that
  side's sockets (`/proc/net/udp`; genuine packets included), and the drops the transport
  counted by reason. The host's Udp InErrors/RcvbufErrors deltas (`/proc/net/snmp`) are given
  apart: they cover every socket on the machine.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tools.hostile.procs import BenchProc
from tools.hostile.run import Raw

_SNMP_KEYS = ("InDatagrams", "InErrors", "RcvbufErrors", "InCsumErrors", "NoPorts")


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def crash_reasons(proc: BenchProc) -> list[str]:
    """Why `proc`'s end counts as a crash (empty: it did not crash)."""
    rc = proc.returncode
    err = proc.stderr()
    why = []
    if proc.killed or rc is None:
        why.append("did not stop within its time (killed)")
    elif rc < 0:
        if not proc.signalled:  # a SIGTERM we sent may end it by the signal: not a crash
            why.append(f"died of signal {-rc}")
    elif rc == 1:
        if not _tail(err).startswith("mrc bench:"):
            why.append("exit status 1 without a one-line reason")
    elif rc != 0:
        why.append(f"exit status {rc}")
    if "Traceback (most recent call last)" in err:
        why.append("a Python traceback on stderr")
    bad = [ln for ln in err.splitlines() if "internal error" in ln]
    if bad:
        why.append(f"internal error: {bad[0].strip()[:200]}")
    for doc in proc.docs():
        n = doc.get("end", {}).get("mrc", {}).get("internal_errors")
        if isinstance(n, int) and n > 0:
            why.append(f"{n} internal error(s) in its report")
            break
    return [f"{proc.name}: {w}" for w in why]


def _end(doc: dict[str, Any]) -> dict[str, Any]:
    end = doc.get("end", {}).get("mrc", {})
    return end if isinstance(end, dict) else {}


def _add(total: Counter[str], part: Any) -> None:
    if isinstance(part, dict):
        total.update({str(k): int(v) for k, v in part.items() if isinstance(v, int)})


def _client_row(proc: BenchProc) -> dict[str, Any]:
    docs = proc.docs()
    end = _end(docs[-1]) if docs else {}
    remote = end.get("remote") if isinstance(end.get("remote"), dict) else {}
    received = docs[-1].get("end", {}).get("sum_received", {}) if docs else {}
    row: dict[str, Any] = {
        "exit": proc.returncode,
        "integrity": end.get("integrity", "no report"),
        "messages_verified": end.get("messages_verified", 0),
        "mismatches": int(remote.get("mismatches") or 0) if remote else 0,
        "bytes": int(received.get("bytes") or 0) if isinstance(received, dict) else 0,
        "seconds": round((proc.ended or proc.started) - proc.started, 3),
        # Packets the client sent again (each can reach the server once more, as a duplicate).
        "retransmits": _retransmits(docs[-1]) if docs else 0,
    }
    if proc.returncode != 0:
        row["error"] = _tail(proc.stderr()) or f"exit status {proc.returncode}"
    return row


def _retransmits(doc: dict[str, Any]) -> int:
    sent = doc.get("end", {}).get("sum_sent", {})
    value = sent.get("retransmits") if isinstance(sent, dict) else None
    return int(value) if isinstance(value, int) else 0


def figures(raw: Raw) -> dict[str, Any]:
    opts = raw.options
    sent = sum(raw.sent.values())
    server = raw.server
    server_docs = server.docs() if server is not None else []
    client_docs = [d for c in raw.clients for d in c.docs()]
    drops = {"server": Counter[str](), "client": Counter[str]()}
    io_drops = {"server": Counter[str](), "client": Counter[str]()}
    acted = {"server": Counter[str](), "client": Counter[str]()}
    for side, docs in (("server", server_docs), ("client", client_docs)):
        for doc in docs:
            _add(drops[side], _end(doc).get("drops_by_reason"))
            _add(io_drops[side], _end(doc).get("io_drops"))
            _add(acted[side], {k: _end(doc).get(k) for k in ("trimmed_received", "nacks_sent")})
    crashes: list[str] = []
    for proc in (server, *raw.clients):
        if proc is not None:
            crashes += crash_reasons(proc)
    if server is None:
        crashes.append("server: never started")
    clients = [_client_row(c) for c in raw.clients]
    intact = bool(clients) and all(c["exit"] == 0 and c["integrity"] == "ok" for c in clients)
    mismatches = sum(c["mismatches"] for c in clients)
    mtu = _payload_mtu(client_docs)
    placed = 0 if intact else (-(-mismatches // 2) * mtu if mismatches else None)
    snmp = {k: raw.snmp_after.get(k, 0) - raw.snmp_before.get(k, 0) for k in _SNMP_KEYS}
    secs = raw.attack_seconds
    return {
        "security": opts.security,
        "datagrams": {
            "requested": opts.datagrams,
            "sent": sent,
            "to_server": raw.to_server,
            "to_client": raw.to_client,
            "by_kind": dict(sorted(raw.sent.items())),
            "send_refused": raw.refused,
        },
        "attack_seconds": round(secs, 3),
        "rate_per_second": round(sent / secs) if secs > 0 else 0,
        "timed_out": raw.timed_out,
        "aborted": raw.aborted,
        "planes_attacked": opts.planes,
        "server": {"exit": server.returncode if server else None, "reports": len(server_docs)},
        "clients": clients,
        "crashes": crashes,
        "transfer_intact": intact,
        "messages_verified": sum(int(c["messages_verified"] or 0) for c in clients),
        "messages_corrupted": mismatches,
        "forged_bytes_placed": placed,
        "forged_bytes_placed_is_lower_bound": not intact,
        "drops_by_reason": {side: dict(sorted(c.items())) for side, c in drops.items()},
        "io_drops": {side: dict(sorted(c.items())) for side, c in io_drops.items()},
        "accounting": {
            side: _accounting(hostile, kernel, drops[side], acted[side])
            for side, hostile, kernel in (
                ("server", raw.to_server, raw.server_socket_drops),
                ("client", raw.to_client, raw.client_socket_drops),
            )
        },
        "kernel_udp_snmp_delta_host_wide": snmp,
        "sniffed": {
            "packets": raw.sniffed_packets,
            "datagrams": raw.sniffed_datagrams,
            "connections": raw.connections_seen,
        },
    }


def _payload_mtu(docs: list[dict[str, Any]]) -> int:
    for doc in docs:
        mtu = doc.get("start", {}).get("test_start", {}).get("payload_mtu")
        if isinstance(mtu, int) and mtu > 0:
            return mtu
    return 4096


def _accounting(
    hostile: int, kernel_drops: int, drops: Counter[str], acted: Counter[str]
) -> dict[str, int]:
    core = sum(drops.values())
    return {
        "hostile_datagrams": hostile,
        "kernel_socket_drops": kernel_drops,
        "reached_core_at_least": max(0, hostile - kernel_drops),
        "core_drops": core,
        # Hostile datagrams that reached the core and were not counted as drops. Negative:
        # the core also dropped packets the attack did not send itself, such as duplicates
        # of retransmissions and, at the client, the server's REJECTs of forged REQUESTs
        # (they go to the forged source, the client's address, with a QPN it never had).
        "not_counted_as_drops": max(0, hostile - kernel_drops) - core,
        # What the core did with trimmed-looking packets (forged trims, cut data packets,
        # forged data without a trailer): a trim is a hint answered by a NACK, not a drop.
        "trimmed_received": acted["trimmed_received"],
        "nacks_sent": acted["nacks_sent"],
    }


def verdict(fig: dict[str, Any]) -> int:
    """0, or 1 when a process crashed or a secured transfer did not come through intact."""
    if fig["crashes"] or fig["aborted"]:
        return 1
    if fig["security"] != "none" and not fig["transfer_intact"]:
        return 1
    return 0


def text(fig: dict[str, Any]) -> str:
    d = fig["datagrams"]
    lines = [
        f"hostile: security {fig['security']}, {d['sent']} datagrams in "
        f"{fig['attack_seconds']:.1f} s ({fig['rate_per_second']}/s), "
        f"{d['to_server']} at the server, {d['to_client']} at the client",
        "by kind: " + ", ".join(f"{k} {v}" for k, v in d["by_kind"].items()),
        f"transfer intact: {fig['transfer_intact']} ({len(fig['clients'])} verified client "
        f"run(s), {fig['messages_verified']} messages verified, "
        f"{fig['messages_corrupted']} corrupted)",
        f"forged bytes placed: {fig['forged_bytes_placed']}"
        + (" (lower bound)" if fig["forged_bytes_placed_is_lower_bound"] else ""),
        f"crashes: {len(fig['crashes'])}" + "".join(f"\n  {c}" for c in fig["crashes"]),
    ]
    if fig["aborted"]:
        lines.append(f"aborted: {fig['aborted']}")
    for side in ("server", "client"):
        acc = fig["accounting"][side]
        lines.append(
            f"{side}: {acc['hostile_datagrams']} hostile, {acc['kernel_socket_drops']} kernel "
            f"socket drops, {acc['core_drops']} core drops: "
            + ", ".join(f"{k} {v}" for k, v in fig["drops_by_reason"][side].items())
        )
    for c in fig["clients"]:
        if "error" in c:
            lines.append(f"client error: {c['error']}")
    return "\n".join(lines)
