"""Plane sockets: one non-blocking UDP socket per plane, with batched reads and GSO sends.

Holds `PlaneSocket` (bind, socket options, `drain` into a ring of preallocated buffers, `send`
with the errno mapping of docs/DESIGN.md §11) and `resolve_addr` for numeric or named addresses.
`drain` reads with one `recvmsg_into` per datagram (or GRO batch), and after a drain that found a
burst with `recvmmsg` (mrc.io.mmsg: many a syscall, into the same ring) where libc has it and
`MRC_NO_RECVMMSG` is unset. It knows nothing about MRC packets, sessions or the event loop:
`mrc.io.endpoint` registers the sockets with the loop and feeds what `drain` returns to the core.

Socket facts this module relies on (docs/DESIGN.md §11, checked on Linux 6.x):

- every datagram's TOS / traffic-class byte arrives as a control message once `IP_RECVTOS` /
  `IPV6_RECVTCLASS` is set; we send ECN-capable (ECT(0)) through `IP_TOS` / `IPV6_TCLASS`;
- `sendmsg` with a `(SOL_UDP, UDP_SEGMENT, u16)` control message sends one buffer as several
  datagrams of that size (at most 64 segments and 64 KiB per call);
- with `UDP_GRO` set, one read may return several coalesced datagrams and their size arrives as
  a `(SOL_UDP, UDP_GRO, int)` control message; `drain` splits them again;
- `SO_RCVBUFFORCE` / `SO_SNDBUFFORCE` lift `net.core.rmem_max` for root only.
- with `reuseport`, other sockets (SRv6 path sockets, `mrc.io.srv6`) may bind the same address
  and port; `send(via=…)` sends on such a socket while the counters stay this plane's.
- under `IP_RECVERR` / `IPV6_RECVERR` each ICMP error about a datagram of ours waits in the
  socket's error queue (`MSG_ERRQUEUE`) with the datagram's destination as its address and a
  `sock_extended_err` (errno, origin ICMP or ICMPv6) as its control message; `unreachable`
  keeps the destinations of the hard ones for io;
- with `IPV6_FLOWINFO_SEND` (33) set, the flowinfo of the destination address of `sendto` /
  `sendmsg` sets each datagram's IPv6 flow label, GSO batches included; a kernel that wants the
  label leased first says EINVAL, and `IPV6_FLOWLABEL_MGR` (32) leases it.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import struct
from collections import Counter
from typing import Any

from mrc.io.mmsg import MmsgRing
from mrc.io.mmsg import available as mmsg_available
from mrc.wire.fast import split_datagrams

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "ECT0",
    "LOCAL_DROP_ERRNOS",
    "MAX_GSO_SEGMENTS",
    "PLANE_DOWN_ERRNOS",
    "RECV_BUFFER_BYTES",
    "UNREACHABLE_ERRNOS",
    "PlaneSocket",
    "SockAddr",
    "resolve_addr",
]

#: A socket address as the kernel reports it: (host, port) or (host, port, flowinfo, scope_id).
SockAddr = tuple[Any, ...]
#: One received datagram: its bytes (a view into a ring buffer), the source, the TOS byte.
DatagramView = tuple[memoryview, SockAddr, int]
#: One read: the view of the ring slot it went into, its source, TOS word, GRO segment size (0:
#: the read is one datagram) and length. The bytes are `view[:nbytes]`; the view is the slot's
#: own (the same object at every drain that reads into it), so the core may keep views of a slot
#: from read to read (a secured session's in-place opening, docs/DESIGN.md §8).
Read = tuple[memoryview, SockAddr, int, int, int]

SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33

ECT0 = 0x02
DEFAULT_BUFFER_BYTES = 16 << 20
#: Send buffer of each pool socket (a few GSO batches: the pool shares the plane's traffic).
POOL_BUFFER_BYTES = 1 << 20
RECV_BUFFER_BYTES = 64 << 10
MAX_GSO_SEGMENTS = 64
_ANC_SIZE = socket.CMSG_SPACE(4) * 2
# Plain ints: `flags & socket.MSG_TRUNC` would build a MsgFlag enum on every read.
_MSG_TRUNC = int(socket.MSG_TRUNC)
_U16 = struct.Struct("=H")
_INT = struct.Struct("=i")
_FLOWINFO = struct.Struct("!I")

#: Send errors that mean the local link of the plane is gone (reported to the core).
PLANE_DOWN_ERRNOS = frozenset({errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH})
#: Send errors that mean this datagram (or GSO batch) never left the host: the socket buffer
#: or the interface's qdisc was full (reported to the core, which resends it elsewhere).
LOCAL_DROP_ERRNOS = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS})
#: Reads a drain must find before the next one uses recvmmsg (`PlaneSocket.mmsg_min_reads`).
MMSG_MIN_READS = 4
#: Read errors that only say the socket is empty (or a signal came): the drain stops.
_AGAIN_ERRNOS = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})
#: Send errors an ICMP message from the network can leave pending on a socket.
_ICMP_ERRNOS = PLANE_DOWN_ERRNOS | {errno.ECONNREFUSED}
#: IP_RECVERR / IPV6_RECVERR: without them the kernel hides a qdisc drop from a UDP sender
#: (it counts UdpSndbufErrors and reports success).
_IP_RECVERR = 11
_IPV6_RECVERR = 25
#: An error queue entry's `struct sock_extended_err` (errno, origin, ICMP type and code, pad,
#: info, data), and the origins that mean an ICMP / ICMPv6 message from the network.
_EXT_ERR = struct.Struct("=IBBBBII")
_ORIGIN_ICMP = 2
_ORIGIN_ICMP6 = 3
#: ICMP errors that say the destination cannot be reached at all: port unreachable (nothing
#: listens there), host and network unreachable (docs/DESIGN.md §4).
UNREACHABLE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH})
#: Destinations kept per plane between two looks of io (`PlaneSocket.unreachable`).
MAX_UNREACHABLE = 64
#: IPv6 flow labels set per datagram (`send(label=…)`): the socket option and the lease request.
IPV6_FLOWINFO = 11
IPV6_FLOWLABEL_MGR = 32
IPV6_FLOWINFO_SEND = 33
FLOW_LABEL_MASK = 0xFFFFF
_FL_LEASE = struct.Struct("=BBHHHI")  # action, share, flags, expires, linger, pad
_IPV6_FL_A_GET, _IPV6_FL_S_ANY, _IPV6_FL_F_CREATE = 0, 255, 1
#: Errors that say the kernel or device cannot do UDP GSO at all.
_NO_GSO_ERRNOS = frozenset({errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP})


def _errname(code: int) -> str:
    return errno.errorcode.get(code, f"errno{code}").lower()


def resolve_addr(host: str, port: int) -> tuple[int, SockAddr]:
    """(family, sockaddr) for a numeric address or a host name; raises OSError if unresolvable."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        ip = None
    if ip is not None and ip.version == 4:
        return socket.AF_INET, (str(ip), port)
    infos = socket.getaddrinfo(
        host, port, type=socket.SOCK_DGRAM, flags=socket.AI_NUMERICHOST if ip else 0
    )
    family, _, _, _, sockaddr = infos[0]
    return int(family), tuple(sockaddr)


class PlaneSocket:
    """The UDP socket of one plane, bound to a local address and port."""

    def __init__(
        self,
        plane: int,
        host: str,
        port: int = 0,
        *,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        ring_size: int = 64,
        gro: bool = False,
        tos: int = ECT0,
        reuseport: bool = False,
        flowlabel: bool = False,
        pool: int = 0,
    ) -> None:
        self.plane = plane
        self.family, bind_addr = resolve_addr(host, port)
        self.counters: Counter[str] = Counter()
        self.packets_sent = 0
        self.bytes_sent = 0
        self.packets_received = self.bytes_received = 0
        self.drained = 0  # datagrams the last drain read
        #: Drains asked for and error-queue looks taken: each is at least a syscall, so
        #: io's wake-up spends them only on the planes that need them (tests read them).
        self.drains = self.error_checks = 0
        self.connected: SockAddr | None = None
        #: Wake-ups that carried a socket error (an ICMP error pinned on the socket or queued
        #: under IP_RECVERR): each one was an EPOLLERR.
        self.error_events = 0
        #: Destinations of our datagrams that an ICMP error said cannot be reached (port, host
        #: or network unreachable), one entry per error, in the order read from the error
        #: queue; io takes them (`take_unreachable`) and tells the core.
        self.unreachable: list[SockAddr] = []
        sock = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            self.rcvbuf = _set_buffer(sock, socket.SO_RCVBUF, SO_RCVBUFFORCE, buffer_bytes)
            self.sndbuf = _set_buffer(sock, socket.SO_SNDBUF, SO_SNDBUFFORCE, buffer_bytes)
            if self.family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
            else:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            set_recverr(sock, self.family)
            #: Datagrams carry the flow label `send(label=…)` names (IPv6 only).
            self.flowlabel = flowlabel
            if flowlabel:
                if self.family != socket.AF_INET6:
                    raise OSError(errno.EAFNOSUPPORT, "a flow label needs an IPv6 plane")
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO_SEND, 1)
                # ...and reads each arrival's label (a control message, `drain`).
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO, 1)
            self._leased: set[tuple[str, int]] = set()
            self.gro = False
            if gro:
                try:
                    sock.setsockopt(SOL_UDP, UDP_GRO, 1)
                    self.gro = True
                except OSError:
                    self.counters["gro_unavailable"] += 1
            if reuseport:
                if bind_addr[1]:
                    # A fixed port someone already holds is still refused (EADDRINUSE), as
                    # without reuseport: only our own path sockets join this one.
                    with socket.socket(self.family, socket.SOCK_DGRAM) as probe:
                        probe.bind(bind_addr)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(bind_addr)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        #: The address the socket is bound to (a wildcard stays a wildcard after `connect`).
        self.bound_addr: SockAddr = tuple(sock.getsockname())
        self.local_addr: SockAddr = self.bound_addr
        self._gso = True
        self._ring = [bytearray(RECV_BUFFER_BYTES) for _ in range(max(1, ring_size))]
        self._views = [memoryview(b) for b in self._ring]
        self._iov = [[b] for b in self._ring]
        self._anc = _ANC_SIZE + (socket.CMSG_SPACE(4) if flowlabel else 0)
        #: recvmmsg over the same ring (mrc.io.mmsg); None: the recvmsg_into loop. It reads
        #: the socket it was made for: one put in `sock`'s place is read with recvmsg_into.
        self._mmsg: MmsgRing | None = None
        self._mmsg_sock = sock
        #: Most datagrams one read held in the last recvmmsg (a GRO batch holds several):
        #: sizes the next call so that a drain passes `limit` by about one GRO batch, as the
        #: recvmsg_into loop does. A GRO socket starts high: its first read may be a batch.
        self._per_read = 16 if self.gro else 1
        #: Reads (datagrams or GRO batches) the last drain found. recvmmsg through ctypes
        #: costs more per call than recvmsg_into (about 1-2 µs a drain more in the loopback
        #: bench, where GRO leaves 1-2 reads per drain) and pays only when a drain finds
        #: several reads (1.4x less drain CPU at 4 datagrams a drain, 2x at 64), so a drain
        #: uses it after one that found at least `mmsg_min_reads`.
        self._last_reads = 0
        self.mmsg_min_reads = MMSG_MIN_READS
        if mmsg_available():
            try:
                self._mmsg = MmsgRing(self.family, self._ring, self._anc)
            except (OSError, ValueError, TypeError):
                self.counters["recvmmsg_unavailable"] += 1
        #: Sockets this plane also sends from, a source port each (`send(via=…)`): an EV
        #: picks one, so a fabric that hashes the 5-tuple spreads the plane's EVs.
        self.pool: list[socket.socket] = []
        try:
            for _ in range(pool):
                self.pool.append(_pool_socket(self.family, bind_addr[0], tos))
        except BaseException:
            self.close()
            raise
        self._next = 0

    # -- plumbing ---------------------------------------------------------------------------

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def ring_size(self) -> int:
        return len(self._ring)

    @property
    def gso(self) -> bool:
        """False once the kernel refused a GSO send; batches then go out one datagram at a time."""
        return self._gso

    def connect(self, addr: SockAddr) -> None:
        """Fix the peer: sends to `addr` skip the per-packet address lookup, others still work."""
        self.sock.connect(addr)
        self.connected = tuple(self.sock.getpeername())
        self.local_addr = tuple(self.sock.getsockname())  # a wildcard bind now has its source

    def close(self) -> None:
        self.sock.close()
        for s in self.pool:
            s.close()

    # -- receive ----------------------------------------------------------------------------

    def drain(self, limit: int = 64, errors: bool = True) -> list[DatagramView]:
        """Read until the socket is empty or `limit` datagrams were read (at most one ring).

        The views point into the ring; they stay valid until the next drain, which reads into
        the ring from its first slot again, so a caller must consume (copy what it keeps)
        before it drains again. A GRO
        batch is returned whole, so a drain may pass `limit` by about one batch. With `errors`
        a drain that read nothing also empties the error queue (`check_errors`); io leaves
        that to the wake-up of this socket's own readiness.
        """
        out: list[DatagramView] = []
        for view, addr, tos, seg, nbytes in self.drain_reads(limit, errors):
            if seg:
                split_datagrams(view, nbytes, seg, addr, tos, out)
            else:
                out.append((view[:nbytes], addr, tos))
        return out

    def drain_reads(self, limit: int = 64, errors: bool = True, once: bool = False) -> list[Read]:
        """`drain`, a GRO batch left whole; `drained` counts the datagrams the reads hold.

        `once`: one read, not a read until the socket is empty. The read that finds a socket
        empty costs a syscall and a raised `BlockingIOError` (its message decoded, a traceback
        built): a wake-up for one datagram paid it every time (io asks for `once` when the last
        drain took one datagram and polls again before it would read more)."""
        self.drains += 1
        # Each drain reads into the ring from its first slot: the slots a drain needs (a GRO
        # read holds up to 64 KiB) stay in the CPU's caches from drain to drain, where going
        # round all of them cycled through ring_size x 64 KiB (docs/NOTES.md §11).
        self._next = 0
        out: list[Read] = []
        if once and self._last_reads < self.mmsg_min_reads:
            self._last_reads = self._drain_recvmsg(1, out)
        elif self._mmsg is None or self.sock is not self._mmsg_sock:
            self._drain_recvmsg(limit, out)
        elif self._last_reads >= self.mmsg_min_reads:
            self._last_reads = self._drain_mmsg(limit, out)
        else:
            self._last_reads = self._drain_recvmsg(limit, out)
        if errors and not out:
            self.check_errors()
        return out

    def check_errors(self) -> None:
        """Empty the error queue (IP_RECVERR): ICMP errors wait there, and the loop would
        report the socket ready until they are read. Counted in `error_events` when it held
        any. A syscall and a raised OSError even when empty (about 1.5 µs), so io asks only on
        its socket's own wake-up, not on every drain."""
        self.error_checks += 1
        if _pending_icmp(self.sock, self.unreachable):
            self.counters["icmp_errors"] += 1
            self.error_events += 1

    def take_unreachable(self) -> list[SockAddr]:
        """The destinations reported unreachable since the last call (see `unreachable`)."""
        found = self.unreachable
        if found:
            self.unreachable = []
        return found

    @property
    def recvmmsg(self) -> bool:
        """True when `drain` reads bursts with recvmmsg (mrc.io.mmsg), False when it always
        uses the recvmsg_into loop."""
        return self._mmsg is not None and self.sock is self._mmsg_sock

    def _drain_mmsg(self, limit: int, out: list[Read]) -> int:
        """`drain` with recvmmsg: as many slots per syscall as the ring, the remaining calls
        and the room left under `limit` (counted in the largest recent read) allow, without
        wrapping round the ring inside one call."""
        mm = self._mmsg
        assert mm is not None
        fd = self.sock.fileno()
        views = self._views
        ring = len(views)
        left = min(limit, ring)
        idx = self._next
        per_read = self._per_read
        reads = taken = 0
        while left > 0:
            room = limit - taken
            if room <= 0:
                break
            count = min(left, ring - idx, max(1, room // per_read))
            got, packets, nbytes, truncated, most, held = mm.read(fd, idx, count, views, out)
            if got < 0:
                code = -got
                if code in _AGAIN_ERRNOS:
                    break
                if code == errno.ECONNREFUSED:
                    self._read_error("econnrefused")
                    left -= 1
                    continue
                self._read_error("recv_" + _errname(code))
                break
            if got == 0:
                break
            reads += got
            taken += held
            if most:
                # Up at once, down by one a call: a few reads of single datagrams between
                # GRO batches should not size the next call for singles.
                per_read = max(most, per_read - 1)
            self.packets_received += packets
            self.bytes_received += nbytes
            if truncated:
                self.counters["truncated"] += truncated
            idx += got
            if idx == ring:
                idx = 0
            left -= got
            if got < count:
                break  # the socket is empty (an error after the first datagram waits in sk_err)
        self._next = idx
        self._per_read = per_read
        self.drained = taken
        return reads

    def _drain_recvmsg(self, limit: int, out: list[Read]) -> int:
        """`drain` with one recvmsg_into per datagram (or GRO batch); how many it read."""
        recv = self.sock.recvmsg_into
        iovs = self._iov
        views = self._views
        ring = len(iovs)
        calls = min(limit, ring)
        idx = self._next
        anc_size = self._anc
        reads = taken = 0
        for _ in range(calls):
            try:
                nbytes, anc, flags, addr = recv(iovs[idx], anc_size)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:
                self._read_error("econnrefused")
                continue
            except OSError as exc:
                self._read_error("recv_" + _errname(exc.errno or 0))
                break
            view = views[idx]
            idx += 1
            reads += 1
            if idx == ring:
                idx = 0
            if flags & _MSG_TRUNC:
                self.counters["truncated"] += 1
                continue
            tos = 0
            seg = 0
            label = 0
            for level, kind, cdata in anc:
                if level == socket.IPPROTO_IP and kind == socket.IP_TOS:
                    tos = cdata[0] if cdata else 0
                elif level == socket.IPPROTO_IPV6 and kind == socket.IPV6_TCLASS:
                    tos = _INT.unpack_from(cdata)[0] & 0xFF if len(cdata) >= 4 else 0
                elif level == SOL_UDP and kind == UDP_GRO:
                    seg = _INT.unpack_from(cdata)[0] if len(cdata) >= 4 else _U16.unpack(cdata)[0]
                elif level == socket.IPPROTO_IPV6 and kind == IPV6_FLOWINFO and len(cdata) >= 4:
                    label = _FLOWINFO.unpack_from(cdata)[0] & FLOW_LABEL_MASK
            if label:
                tos |= label << 8  # the EV's label for the core, above the TOS byte (evlabel.py)
            self.packets_received += 1
            self.bytes_received += nbytes
            if not 0 < seg < nbytes:
                seg = 0
            out.append((view, addr, tos, seg, nbytes))
            taken += -(-nbytes // seg) if seg else 1
            if taken >= limit:
                break
        self._next = idx
        self.drained = taken
        return reads

    def _read_error(self, name: str) -> None:
        """A read returned the socket's pending error (an ICMP error the kernel pinned on it).
        The same ICMP error also waits in the error queue (IP_RECVERR): empty it now, so that
        whoever clears the error clears both and EPOLLERR always comes with an error a read
        returns (which `error_events` counts for io)."""
        self.counters[name] += 1
        self.error_events += 1
        if _pending_icmp(self.sock, self.unreachable):
            self.counters["icmp_errors"] += 1

    def take_errors(self) -> None:
        """Clear a pending socket error and empty the error queue (ICMP errors under
        IP_RECVERR), so the socket stops signalling EPOLLERR."""
        self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if _pending_icmp(self.sock, self.unreachable):
            self.counters["icmp_errors"] += 1

    # -- send -------------------------------------------------------------------------------

    def send(
        self,
        data: bytes | bytearray | memoryview,
        addr: SockAddr,
        segment_size: int | None = None,
        via: socket.socket | None = None,
        *,
        retry: bool = True,
        label: int | None = None,
    ) -> int | None:
        """Send one datagram, or a GSO batch of `segment_size` datagrams.

        `via` is an unconnected socket to send on instead of this one (an SRv6 path socket);
        what it sends is counted here, and its errors are mapped the same way. `label` (on a
        socket made with `flowlabel`) is the IPv6 flow label of every datagram sent.

        Returns None, or the errno of a send error that means the plane's local link is down
        (ENETUNREACH, ENETDOWN, EHOSTUNREACH) for the caller to report. ECONNREFUSED (an ICMP
        error from the peer) is counted and ignored; EAGAIN and ENOBUFS are counted as local
        drops; any other error is counted by name.
        """
        size = len(data)
        sock = self.sock if via is None else via
        if label is not None and self.flowlabel:
            # The label rides in the destination's flowinfo (IPV6_FLOWINFO_SEND).
            addr = (addr[0], addr[1], label & FLOW_LABEL_MASK, addr[3] if len(addr) > 3 else 0)
        connected = via is None and addr == self.connected
        try:
            if segment_size is not None and 0 < segment_size < size:
                if not self._gso:
                    return self._send_split(data, addr, segment_size, via)
                cmsg = [(SOL_UDP, UDP_SEGMENT, _U16.pack(segment_size))]
                if connected:
                    sock.sendmsg([data], cmsg)
                else:
                    sock.sendmsg([data], cmsg, 0, addr)
                self.packets_sent += -(-size // segment_size)
            else:
                if connected:
                    sock.send(data)
                else:
                    sock.sendto(data, addr)
                self.packets_sent += 1
        except OSError as exc:
            code = exc.errno or 0
            # A kernel that wants flow labels leased (unprivileged senders, older kernels):
            # lease this one once and send again.
            if retry and code == errno.EINVAL and len(addr) > 2 and addr[2] and self._lease(addr):
                return self.send(data, addr, segment_size, via, retry=False)
            if retry and code in _ICMP_ERRNOS and _pending_icmp(sock, self.unreachable):
                # An ICMP error from the network (IP_RECVERR queued it, and the kernel fails
                # the next send with it): news of some path, not of this plane's link, and
                # this datagram never went. Counted; it goes once more.
                self.counters["icmp_" + _errname(code)] += 1
                return self.send(data, addr, segment_size, via, retry=False)
            if (
                segment_size is not None
                and 0 < segment_size < size
                and (code in _NO_GSO_ERRNOS or code in (errno.EINVAL, errno.EMSGSIZE))
            ):
                if code in _NO_GSO_ERRNOS:
                    self._gso = False
                    self.counters["gso_disabled"] += 1
                else:
                    self.counters["gso_split"] += 1
                return self._send_split(data, addr, segment_size, via)
            return self._send_error(code)
        self.bytes_sent += size
        return None

    def _lease(self, addr: SockAddr) -> bool:
        """Lease `addr`'s flow label for its destination (IPV6_FLOWLABEL_MGR); False when
        it was leased already or the kernel refuses (counted)."""
        key = (str(addr[0]), int(addr[2]))
        if key in self._leased:
            return False
        self._leased.add(key)
        dst = socket.inet_pton(socket.AF_INET6, str(addr[0]).split("%", 1)[0])
        req = dst + struct.pack("!I", key[1]) + _FL_LEASE.pack(
            _IPV6_FL_A_GET, _IPV6_FL_S_ANY, _IPV6_FL_F_CREATE, 0, 0, 0
        )
        try:
            self.sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWLABEL_MGR, req)
        except OSError as exc:
            self.counters["flowlabel_lease_" + _errname(exc.errno or 0)] += 1
            return False
        self.counters["flowlabel_leased"] += 1
        return True

    def _send_split(
        self,
        data: bytes | bytearray | memoryview,
        addr: SockAddr,
        segment_size: int,
        via: socket.socket | None = None,
    ) -> int | None:
        view = memoryview(data)
        first: int | None = None
        for start in range(0, len(view), segment_size):
            err = self.send(view[start : start + segment_size], addr, None, via)  # label in addr
            if err is not None and first is None:
                first = err
        return first

    def _send_error(self, code: int) -> int | None:
        if code == errno.ECONNREFUSED:
            self.counters["econnrefused"] += 1
            return None
        if code in PLANE_DOWN_ERRNOS:
            self.counters["send_" + _errname(code)] += 1
            return code
        if code in LOCAL_DROP_ERRNOS:
            self.counters["local_drop_" + _errname(code)] += 1
            return code
        self.counters["send_" + _errname(code)] += 1
        return None

    def __repr__(self) -> str:
        return f"PlaneSocket(plane={self.plane}, local={self.local_addr!r})"


def _pool_socket(family: int, host: str, tos: int) -> socket.socket:
    """One source port of a plane's pool: bound to the plane's address on a port of its own,
    marked like the plane socket, sending only (answers come to the plane socket)."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        _set_buffer(sock, socket.SO_SNDBUF, SO_SNDBUFFORCE, POOL_BUFFER_BYTES)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
        else:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        set_recverr(sock, family)
        sock.bind((host, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def _pending_icmp(sock: socket.socket, unreachable: list[SockAddr]) -> bool:
    """Empty `sock`'s error queue (IP_RECVERR); True if it held anything. The destination of
    each datagram an ICMP error said cannot be reached goes to `unreachable` (at most
    `MAX_UNREACHABLE` wait there)."""
    found = False
    for _ in range(64):
        try:
            _, anc, _, addr = sock.recvmsg(1, 512, socket.MSG_ERRQUEUE)
        except OSError:
            break
        found = True
        if addr and len(unreachable) < MAX_UNREACHABLE and _unreachable(anc):
            if len(addr) == 4:
                addr = (addr[0], addr[1], 0, addr[3])  # as peers are named: no flow label
            unreachable.append(tuple(addr))
    return found


def _unreachable(anc: list[tuple[int, int, bytes]]) -> bool:
    """An error queue entry's control messages hold an ICMP error from the network that says
    its destination cannot be reached (`UNREACHABLE_ERRNOS`); a local error (ENOBUFS,
    EMSGSIZE) or a softer ICMP one does not."""
    for level, kind, data in anc:
        if (
            (level == socket.IPPROTO_IP and kind == _IP_RECVERR)
            or (level == socket.IPPROTO_IPV6 and kind == _IPV6_RECVERR)
        ) and len(data) >= _EXT_ERR.size:
            code, origin = _EXT_ERR.unpack_from(data)[:2]
            return origin in (_ORIGIN_ICMP, _ORIGIN_ICMP6) and code in UNREACHABLE_ERRNOS
    return False


def set_recverr(sock: socket.socket, family: int) -> None:
    """Have sends report a full qdisc (ENOBUFS) instead of hiding it. ICMP errors then also
    queue on the socket's error queue, which `PlaneSocket.drain` empties."""
    with contextlib.suppress(OSError):
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_RECVERR, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IP, _IP_RECVERR, 1)


def _set_buffer(sock: socket.socket, opt: int, force_opt: int, size: int) -> int:
    """Ask for `size` bytes (forcing past the sysctl cap when allowed); return what we got."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, force_opt, size)
    except OSError:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
    return int(sock.getsockopt(socket.SOL_SOCKET, opt))
