"""The raw-UDP ceiling: GSO send and GRO receive sprayed over every plane, with placement.

    python -m tools.compare.rawudp recv --bind A0,A1,… --port P --bytes N --peer ADDR
    python -m tools.compare.rawudp send --bind A0,A1,… --connect B0,B1,… --port P --bytes N

No reliability, no congestion control: it is the most a CPython sender and receiver can
move with mrc's packet shape on this machine. Packets are mrc data packets in size: a 44-byte
header (the size of mrc's data header; bytes 0-7 carry the byte offset of the payload, 8-11
a packet number, the rest is zero) and a 4096-byte payload (mrc's default payload MTU).

Sender: one UDP socket per plane, bound to its plane address and connected to the peer's
(`SO_SNDBUFFORCE` 8 MiB). Per `sendmsg` it writes the headers of up to 15 packets
(`struct.pack_into`, 15 × 4140 ≤ 65507) into one buffer and sends it with a `UDP_SEGMENT`
control message (`SOL_UDP`, 103, segment size 4140); successive calls go round-robin over
the planes (a 15-packet flowcell per plane). A tiny credit loop keeps it from overrunning the
receiver's socket buffers (which would only measure drops): the receiver sends the count of
bytes it has placed every 2 MiB to the sender's control socket (plane 0, port P+1), and the
sender keeps at most 24 MiB beyond that in flight. If credit stops (loss), it waits 0.2 s and
carries on, so it always ends.

Receiver: one socket per plane with `UDP_GRO` (`SOL_UDP`, 104) on and `SO_RCVBUFFORCE`
16 MiB, drained non-blocking after `select` with `recvmsg_into` into a 256 KiB buffer; the
GRO control message gives the segment size. For each segment it reads the offset with
`struct.unpack_from` and copies the payload with memoryview slice assignment to that offset
(modulo the region size) in a pre-faulted 64 MiB region. It stops when it has placed `--bytes`
or after 1 s without data, and prints one JSON line: `bytes` (payload bytes placed),
`packets`, `first`/`last` (monotonic), `seconds`, `bits_per_second`, `per_plane` (bytes),
`calls` (receive calls) and `lost` (`--bytes` minus what arrived).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import socket
import struct
import sys
import time
from typing import Any

SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
HEADER = 44
PAYLOAD = 4096
SEGMENT = HEADER + PAYLOAD
PER_CALL = min(64, 65507 // SEGMENT)  # 15
REGION = 64 << 20
WINDOW = 24 << 20
CREDIT_EVERY = 2 << 20
_HDR = struct.Struct("!QI")
_CREDIT = struct.Struct("!Q")


def _force_buf(sock: socket.socket, force: int, plain: int, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, plain, size)


def recv(binds: list[str], port: int, nbytes: int, peer: str) -> dict[str, Any]:
    socks = []
    for addr in binds:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _force_buf(s, getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF, 16 << 20)
        s.setsockopt(SOL_UDP, UDP_GRO, 1)
        s.bind((addr, port))
        s.setblocking(False)
        socks.append(s)
    ctrl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ctrl.bind((binds[0], 0))
    ctrl.connect((peer, port + 1))
    region = bytearray(REGION)
    rmv = memoryview(region)
    rmv[::4096] = b"\x01" * len(rmv[::4096])  # pre-fault every page
    buf = bytearray(256 << 10)
    mv = memoryview(buf)
    cspace = socket.CMSG_SPACE(4)
    unpack = _HDR.unpack_from
    placed = packets = calls = 0
    per_plane = [0] * len(socks)
    next_credit = CREDIT_EVERY
    first = last = 0.0
    print("READY", flush=True)
    fds = {s.fileno(): (i, s) for i, s in enumerate(socks)}
    while placed < nbytes:
        ready, _, _ = select.select(list(fds), [], [], 1.0)
        if not ready:
            if placed:
                break
            continue
        for fd in ready:
            plane, s = fds[fd]
            while True:
                try:
                    n, anc, _flags, _ = s.recvmsg_into([buf], cspace)
                except BlockingIOError:
                    break
                calls += 1
                seg = n
                for level, kind, data in anc:
                    if level == SOL_UDP and kind == UDP_GRO:
                        seg = int.from_bytes(data[:4], sys.byteorder)
                pos = 0
                while pos < n:
                    end = min(pos + seg, n)
                    off = unpack(buf, pos)[0] % REGION
                    plen = end - pos - HEADER
                    rmv[off:off + plen] = mv[pos + HEADER:end]
                    placed += plen
                    per_plane[plane] += plen
                    packets += 1
                    pos = end
                last = time.monotonic()
                if not first:
                    first = last
                if placed >= next_credit:
                    next_credit = placed + CREDIT_EVERY
                    with contextlib.suppress(OSError):
                        ctrl.send(_CREDIT.pack(placed))
    for _ in range(3):  # the final credit, so the sender does not wait
        with contextlib.suppress(OSError):
            ctrl.send(_CREDIT.pack(placed))
    seconds = last - first
    return {"bytes": placed, "packets": packets, "first": first, "last": last,
            "seconds": seconds, "bits_per_second": placed * 8 / seconds if seconds > 0 else 0.0,
            "per_plane": per_plane, "calls": calls, "lost": max(0, nbytes - placed)}


def send(binds: list[str], remotes: list[str], port: int, nbytes: int) -> dict[str, Any]:
    socks = []
    for local, remote in zip(binds, remotes, strict=True):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _force_buf(s, getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF, 8 << 20)
        s.bind((local, 0))
        s.connect((remote, port))
        socks.append(s)
    ctrl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ctrl.bind((binds[0], port + 1))
    ctrl.setblocking(False)
    buf = bytearray(PER_CALL * SEGMENT)
    mv = memoryview(buf)
    pack = _HDR.pack_into
    cmsg = [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", SEGMENT))]
    credited = 0
    offset = 0
    pkt = 0
    plane = 0
    nplanes = len(socks)
    calls = 0
    start = time.monotonic()
    while offset < nbytes:
        if offset - credited > WINDOW // 2:
            credited = _drain_credit(ctrl, credited, offset)
        n = 0
        pos = 0
        while n < PER_CALL and offset < nbytes:
            plen = min(PAYLOAD, nbytes - offset)
            pack(buf, pos, offset, pkt)
            pos += HEADER + plen
            offset += plen
            pkt += 1
            n += 1
        if n > 1 or pos == SEGMENT:
            socks[plane].sendmsg([mv[:pos]], cmsg)
        else:
            socks[plane].send(mv[:pos])
        calls += 1
        plane = (plane + 1) % nplanes
    return {"bytes": offset, "packets": pkt, "calls": calls,
            "seconds": time.monotonic() - start}


def _drain_credit(ctrl: socket.socket, credited: int, offset: int) -> int:
    """Read credit updates; block (0.2 s at most per wait) while the window is full."""
    stalled_since = None
    while True:
        try:
            while True:
                credited = max(credited, _CREDIT.unpack(ctrl.recv(64)[:8])[0])
        except BlockingIOError:
            pass
        if offset - credited <= WINDOW:
            return credited
        if stalled_since is None:
            stalled_since = time.monotonic()
        elif time.monotonic() - stalled_since > 0.2:
            return offset  # credit lost: go on as if everything arrived
        select.select([ctrl], [], [], 0.01)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.compare.rawudp")
    sub = p.add_subparsers(dest="role", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--bytes", type=int, required=True)
    r.add_argument("--peer", required=True, help="the sender's plane-0 address (credit)")
    s = sub.add_parser("send")
    s.add_argument("--bind", required=True)
    s.add_argument("--connect", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--bytes", type=int, required=True)
    a = p.parse_args(argv)
    try:
        if a.role == "recv":
            doc = recv(a.bind.split(","), a.port, a.bytes, a.peer)
        else:
            doc = send(a.bind.split(","), a.connect.split(","), a.port, a.bytes)
    except OSError as e:
        print(f"rawudp {a.role}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
