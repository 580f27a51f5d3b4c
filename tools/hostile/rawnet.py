"""Raw sockets for the hostile-input harness: a UDP sniffer on `lo` and a spoofing IPv4 sender.

Holds `Sniffer` (an AF_PACKET socket on the loopback device with a classic BPF filter: IPv4,
UDP, the server's port, no fragments, none of our own forgeries; GSO super-packets split into
their datagrams through the virtio-net header the kernel prepends), `Spoofer` (a raw IPv4 socket
with IP_HDRINCL that sends a UDP datagram under any source address and port, with correct IPv4
and UDP checksums) and the RFC 1071 one's-complement sums both need. What the datagrams mean is
`tools.hostile.flow`'s business; which ones to forge is `tools.hostile.attacks`'.

Both need root (CAP_NET_RAW); opening them otherwise raises `RawNetError` with one line.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from dataclasses import dataclass

#: TTL of every forgery. Genuine loopback packets leave with the default TTL (64); the sniffer's
#: filter drops this one so the harness never learns PSNs or addresses from its own forgeries.
MARK_TTL = 77
ECT0 = 0x02  # genuine mrc datagrams are ECN-capable (docs/WIRE.md §1): forgeries look the same

_ETH_P_IP = 0x0800
_SOL_PACKET = 263
_PACKET_VNET_HDR = 15
_VNET_HDR = struct.Struct("=BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start/offset
_VNET_GSO_UDP_L4 = 5
_ETH_LEN = 14  # lo's link header as a SOCK_RAW packet socket sees it
_IPV4 = struct.Struct(">BBHHHBBH4s4s")
_UDP = struct.Struct(">HHHH")
_PSEUDO = struct.Struct(">4s4sBBH")
_SKF_NET_OFF = -0x100000
# Linux values the socket module does not always export (asm-generic/socket.h).
_SO_ATTACH_FILTER = 26
_SO_RCVBUFFORCE = 33  # BPF offsets relative to the network header, whatever the link layer


class RawNetError(Exception):
    """A raw socket could not be opened or used: a one-line reason."""


# --- one's-complement sums (RFC 1071) ------------------------------------------------------


def ones_sum(data: bytes | bytearray | memoryview) -> int:
    """The 16-bit one's-complement sum of `data` (zero-padded to an even length), 0 … 0xFFFF.

    A big-endian integer of the bytes is congruent modulo 0xFFFF to the sum of its 16-bit
    words (2^16 ≡ 1), which CPython computes far faster than a loop over the words.
    """
    if len(data) & 1:
        data = bytes(data) + b"\0"
    n = int.from_bytes(data, "big")
    s = n % 0xFFFF
    return 0xFFFF if s == 0 and n else s


def ones_add(*sums: int) -> int:
    """One's-complement addition of partial sums of pieces that each start at an even offset."""
    total = sum(sums)
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def udp_checksum(src: bytes, dst: bytes, udp_len: int, body_sum: int) -> int:
    """UDP checksum over the IPv4 pseudo-header, given the sum of the UDP header (checksum 0)
    and payload; a computed 0 is sent as 0xFFFF (RFC 768: 0 means "no checksum")."""
    total = ones_add(ones_sum(_PSEUDO.pack(src, dst, 0, socket.IPPROTO_UDP, udp_len)), body_sum)
    return (~total & 0xFFFF) or 0xFFFF


# --- sniffing ------------------------------------------------------------------------------


@dataclass(slots=True)
class Seen:
    """One UDP datagram as it crossed `lo`: addresses, ports and its payload (the MRC packet)."""

    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes


def _bpf(port: int) -> bytes:
    """Accept IPv4/UDP with a 20-byte IP header, not a fragment, not TTL MARK_TTL, from or to
    `port`; everything else stays in the kernel."""
    ld_b, ld_h = 0x30, 0x28  # BPF_LD|BPF_ABS|BPF_B, BPF_LD|BPF_ABS|BPF_H
    jeq, jset, ret = 0x15, 0x45, 0x06  # BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JSET|BPF_K, BPF_RET
    net = _SKF_NET_OFF & 0xFFFFFFFF
    prog = [
        (ld_b, 0, 0, net + 0),  # 0: version/IHL
        (jeq, 0, 10, 0x45),  # 1: else drop (12)
        (ld_b, 0, 0, net + 9),  # 2: protocol
        (jeq, 0, 8, socket.IPPROTO_UDP),  # 3
        (ld_b, 0, 0, net + 8),  # 4: TTL
        (jeq, 6, 0, MARK_TTL),  # 5: our own forgery: drop
        (ld_h, 0, 0, net + 6),  # 6: flags | fragment offset
        (jset, 4, 0, 0x3FFF),  # 7: MF or an offset: a fragment, drop
        (ld_h, 0, 0, net + 20),  # 8: UDP source port
        (jeq, 3, 0, port),  # 9: accept (13)
        (ld_h, 0, 0, net + 22),  # 10: UDP destination port
        (jeq, 1, 0, port),  # 11: accept (13)
        (ret, 0, 0, 0),  # 12: drop
        (ret, 0, 0, 0x40000),  # 13: accept, whole packet
    ]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


class Sniffer:
    """Every UDP datagram from or to `port` that crosses `lo`, GSO batches split, in order.

    The kernel hands a packet socket a loopback GSO batch as one super-packet; the virtio-net
    header (PACKET_VNET_HDR) carries its segment size, so `read` can cut the UDP payload into
    the datagrams the receiver will see. A protocol-bound packet socket sees only the receive
    side of `lo`, so each datagram is read once.
    """

    def __init__(self, port: int, rcvbuf: int = 8 << 20) -> None:
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_IP))
        except PermissionError:
            raise RawNetError("sniffer: a packet socket needs root (CAP_NET_RAW)") from None
        except OSError as exc:
            raise RawNetError(f"sniffer: cannot open a packet socket: {exc.strerror}") from None
        try:
            self.sock.setsockopt(_SOL_PACKET, _PACKET_VNET_HDR, 1)
            prog = _bpf(port)
            self._filter = ctypes.create_string_buffer(prog)  # must outlive the setsockopt
            fprog = struct.pack("HL", len(prog) // 8, ctypes.addressof(self._filter))
            self.sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, rcvbuf)
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.bind(("lo", _ETH_P_IP))
            self.sock.setblocking(False)
        except OSError as exc:
            self.sock.close()
            raise RawNetError(f"sniffer: cannot set up the packet socket: {exc.strerror}") from None
        self.port = port
        self.packets = 0  # link-level packets read (a GSO batch counts once)
        self.datagrams = 0  # UDP datagrams after splitting
        self.skipped = 0  # packets the filter let through that did not parse (should stay 0)
        self._buf = bytearray(1 << 17)

    def read(self, limit: int) -> list[Seen]:
        """Up to `limit` link-level packets that are ready, as datagrams; never blocks."""
        out: list[Seen] = []
        buf = self._buf
        for _ in range(limit):
            try:
                n = self.sock.recv_into(buf)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN):
                    break
                raise RawNetError(f"sniffer: receive failed: {exc.strerror}") from None
            self.packets += 1
            if not self._parse(memoryview(buf)[:n], out):
                self.skipped += 1
        return out

    def _parse(self, pkt: memoryview, out: list[Seen]) -> bool:
        if len(pkt) < _VNET_HDR.size + _ETH_LEN + 28:
            return False
        _flags, gso_type, _hlen, gso_size, _cs, _co = _VNET_HDR.unpack_from(pkt)
        ip = pkt[_VNET_HDR.size + _ETH_LEN :]
        vihl, _tos, tot_len, _id, _frag, _ttl, proto, _c, src, dst = _IPV4.unpack_from(ip)
        if vihl != 0x45 or proto != socket.IPPROTO_UDP or tot_len > len(ip) or tot_len < 28:
            return False
        sport, dport, _ulen, _ucs = _UDP.unpack_from(ip, 20)
        body = ip[28:tot_len]
        srcs, dsts = socket.inet_ntoa(src), socket.inet_ntoa(dst)
        step = gso_size if (gso_type & 0x7F) == _VNET_GSO_UDP_L4 and gso_size else len(body)
        for i in range(0, len(body), max(step, 1)):
            out.append(Seen(srcs, sport, dsts, dport, bytes(body[i : i + step])))
            self.datagrams += 1
        if not body:
            out.append(Seen(srcs, sport, dsts, dport, b""))
            self.datagrams += 1
        return True

    def close(self) -> None:
        self.sock.close()


# --- spoofing ------------------------------------------------------------------------------


def ipv4_udp(
    src: bytes,
    sport: int,
    dst: bytes,
    dport: int,
    payload: bytes,
    *,
    payload_sum: int | None = None,
    ident: int = 0,
) -> bytes:
    """An IPv4 packet (20-byte header, DF, TTL `MARK_TTL`, ECT(0)) carrying one UDP datagram,
    both checksums filled in. `src`/`dst` are packed addresses; `payload_sum`, when given, is
    the payload's one's-complement sum."""
    udp_len = 8 + len(payload)
    if udp_len + 20 > 0xFFFF:
        raise ValueError(f"a {len(payload)}-byte payload does not fit in one IPv4 packet")
    psum = ones_sum(payload) if payload_sum is None else payload_sum
    head_sum = ones_sum(_UDP.pack(sport, dport, udp_len, 0))
    csum = udp_checksum(src, dst, udp_len, ones_add(head_sum, psum))
    ip = bytearray(_IPV4.pack(0x45, ECT0, 20 + udp_len, ident, 0x4000, MARK_TTL, 17, 0, src, dst))
    struct.pack_into(">H", ip, 10, ~ones_sum(ip) & 0xFFFF)
    return bytes(ip) + _UDP.pack(sport, dport, udp_len, csum) + payload



class Spoofer:
    """Sends UDP datagrams with any IPv4 source address and port (raw socket, IP_HDRINCL).

    Every datagram leaves with TTL `MARK_TTL` (so the sniffer skips it), ECT(0), DF, and correct
    IPv4 and UDP checksums. A caller that already knows the one's-complement sum of a payload
    passes it as `payload_sum`, which saves summing a 4 KiB payload again per copy.
    """

    def __init__(self) -> None:
        try:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        except PermissionError:
            raise RawNetError("spoofer: a raw IPv4 socket needs root (CAP_NET_RAW)") from None
        except OSError as exc:
            raise RawNetError(f"spoofer: cannot open a raw socket: {exc.strerror}") from None
        self.sent = 0
        self.refused: dict[str, int] = {}  # send errors by errno name (ENOBUFS under load)
        self._addr: dict[str, bytes] = {}
        self._ident = int.from_bytes(os.urandom(2), "big")

    def _packed(self, host: str) -> bytes:
        raw = self._addr.get(host)
        if raw is None:
            raw = self._addr[host] = socket.inet_aton(host)
        return raw

    def datagram(
        self,
        src: tuple[str, int],
        dst: tuple[str, int],
        payload: bytes,
        payload_sum: int | None = None,
    ) -> bytes:
        """The whole IPv4 packet that carries `payload` from `src` to `dst`."""
        self._ident = (self._ident + 1) & 0xFFFF
        return ipv4_udp(
            self._packed(src[0]), src[1], self._packed(dst[0]), dst[1], payload,
            payload_sum=payload_sum, ident=self._ident,
        )  # fmt: skip

    def send(
        self,
        src: tuple[str, int],
        dst: tuple[str, int],
        payload: bytes,
        payload_sum: int | None = None,
    ) -> bool:
        """Send one datagram; False (and counted by errno) when the kernel refused it."""
        packet = self.datagram(src, dst, payload, payload_sum)
        try:
            self.sock.sendto(packet, (dst[0], 0))
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            self.refused[name] = self.refused.get(name, 0) + 1
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        self.sock.close()
