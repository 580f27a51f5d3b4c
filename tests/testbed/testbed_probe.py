"""A probe run inside a testbed namespace (`ip netns exec NS python testbed_probe.py …`).

The test machines have no `ping`, so this sends ICMP echo requests on raw sockets, and it sends
and receives UDP datagrams with an SRv6 routing header (`IPV6_RTHDR`, built by
`mrc.wire.srh.SRH`). Every mode prints one JSON line (`recv` prints `ready` first):

    ping ADDR… [--count N] [--timeout S]   → {"ADDR": replies, …}
    send DST PORT [--hops SID,…] [--count N] [--size B]   → {"sent": N}
    recv PORT [--count N] [--timeout S]    → {"received": n, "segments": [...] | null}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ping(addrs: list[str], count: int, timeout: float) -> dict[str, int]:
    """Echo requests to every address, `count` each; how many replies came back from each."""
    ident = os.getpid() & 0xFFFF
    socks = {
        6: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
        4: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    }
    replies: dict[str, set[int]] = {a: set() for a in addrs}
    for seq in range(count):
        for i, addr in enumerate(addrs):
            v6 = ":" in addr
            body = struct.pack("!HH", ident, seq * 256 + i) + b"mrc-testbed"
            head = struct.pack("!BBH", 128 if v6 else 8, 0, 0)
            if not v6:
                head = struct.pack("!BBH", 8, 0, _checksum(head + body))
            with contextlib.suppress(OSError):  # unreachable: counts as no reply
                socks[6 if v6 else 4].sendto(head + body, (addr, 0))
    deadline = time.monotonic() + timeout
    want = count * len(addrs)
    while sum(map(len, replies.values())) < want:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(list(socks.values()), [], [], left)
        for s in ready:
            data, src = s.recvfrom(65535)
            if s.family == socket.AF_INET:
                data = data[(data[0] & 0x0F) * 4:]
            kind = data[0]
            if kind not in (129, 0) or len(data) < 8:
                continue
            rid, rseq = struct.unpack_from("!HH", data, 4)
            host = src[0].split("%")[0]
            if rid == ident and host in replies:
                replies[host].add(rseq)
    return {a: len(r) for a, r in replies.items()}


def send(dst: str, port: int, hops: list[str], count: int, size: int) -> int:
    sys.path.insert(0, ROOT)
    from mrc.wire.srh import SRH

    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    if hops:
        srh = SRH.for_path([*hops, dst]).encode()
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, srh)
    payload = bytes(size)
    for _ in range(count):
        s.sendto(payload, (dst, port))
    return count


def recv(port: int, count: int, timeout: float) -> dict[str, object]:
    sys.path.insert(0, ROOT)
    from mrc.wire.srh import SRH

    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVRTHDR, 1)
    s.bind(("::", port))
    print("ready", flush=True)
    got, segments = 0, None
    deadline = time.monotonic() + timeout
    while got < count:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([s], [], [], left)[0]:
            break
        _, anc, _, _ = s.recvmsg(65535, 4096)
        got += 1
        for level, kind, data in anc:
            if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_RTHDR and segments is None:
                segments = [str(a) for a in reversed(SRH.decode(data).segments)]
    return {"received": got, "segments": segments}


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("ping")
    s.add_argument("addrs", nargs="+")
    s.add_argument("--count", type=int, default=3)
    s.add_argument("--timeout", type=float, default=1.0)
    s = sub.add_parser("send")
    s.add_argument("dst")
    s.add_argument("port", type=int)
    s.add_argument("--hops", default="")
    s.add_argument("--count", type=int, default=1)
    s.add_argument("--size", type=int, default=100)
    s = sub.add_parser("recv")
    s.add_argument("port", type=int)
    s.add_argument("--count", type=int, default=1)
    s.add_argument("--timeout", type=float, default=3.0)
    a = p.parse_args()
    if a.mode == "ping":
        out: object = ping(a.addrs, a.count, a.timeout)
    elif a.mode == "send":
        hops = [h for h in a.hops.split(",") if h]
        out = {"sent": send(a.dst, a.port, hops, a.count, a.size)}
    else:
        out = recv(a.port, a.count, a.timeout)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
