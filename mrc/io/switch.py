"""`Relay`: the `mrc switch` process, a userspace trimming switch for one plane (docs/DESIGN.md §5).

Linux cannot trim packets, so trimming experiments over real sockets put this relay on one plane:
the client sends that plane's traffic to the relay's listen address instead of the server's, and
the relay forwards it to the server's plane address from its own socket. What the server sends
back to that socket goes back to the client.

One client per relay: replies go to the last address the listen socket heard from (a relay
stands in for one plane's link between two hosts, not for a fabric).

Each direction has an egress port (`mrc.io.switch_queue.EgressPort`): the forward direction
(toward the server) is shaped to `rate_bps`; the reverse one is unshaped unless
`reverse_rate_bps` is given, and then it gets the same queue, ECN and trimming settings. Trimmed
packets get DSCP 21 by default (`last_hop`): the relay hands them straight to the receiving host,
and every EV of the plane crosses this one queue, so skipping the EV that happened to be trimmed
(what TRIMMED, DSCP 11, asks of the sender) would only move load onto EVs with the same
bottleneck. Pass `last_hop=False` for a relay that is not in front of a host.

I/O: one epoll loop in one thread (docs/DESIGN.md §11). Sockets have UDP GRO on and are read in
batches with `recvmsg_into` into one preallocated buffer; a coalesced read is split by its segment
size and the port copies what it keeps (only `trim_size` bytes of a trimmed packet). What leaves
goes in runs of equal size and TOS, one GSO `sendmsg` per run: a syscall per datagram would cap
the relay near 35 kpps. Each datagram's TOS arrives as an `IP_TOS` / `IPV6_TCLASS` control
message and leaves with one, so ECN and DSCP cross the relay. `SO_RXQ_OVFL` reports the kernel's
own receive-queue drops on each socket as a cumulative counter (on the next datagram queued after
them; /proc/net/udp gives the final count when the relay stops), kept apart from the relay's
trimming and tail-drop decisions so the two are never confused. The loop sleeps until the next
packet may leave (epoll's millisecond grain; the bucket makes up for late wakeups with a larger
batch). Socket setup (binding, `SO_RCVBUFFORCE` with fallback, `IP_RECVTOS`, GRO) is
`PlaneSocket`'s; flags and reports are `mrc.cli.switch`'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .planes import (
    DEFAULT_BUFFER_BYTES,
    MAX_GSO_SEGMENTS,
    RECV_BUFFER_BYTES,
    PlaneSocket,
    SockAddr,
    resolve_addr,
)
from .switch_queue import DEFAULT_TRIM_SIZE, EgressPort, PortStats

__all__ = ["SO_RXQ_OVFL", "Relay", "SwitchConfig", "format_addr", "kernel_drops"]

#: `SO_RXQ_OVFL` (asm-generic/socket.h); Python's socket module does not name it.
SO_RXQ_OVFL = 40
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SOL_UDP = 17
_UDP_SEGMENT = 103
_UDP_GRO = 104
_U16 = struct.Struct("=H")
_U32 = struct.Struct("=I")
_INT = struct.Struct("=i")
_ANC_SIZE = socket.CMSG_SPACE(4) * 4
_TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)
#: One GSO send carries at most this many payload bytes (an IPv4 datagram's limit).
_GSO_MAX_BYTES = 65507
#: Errors that say this kernel or device cannot do UDP GSO (or not this batch).
_NO_GSO_ERRNOS = frozenset({errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EINVAL})
_WILDCARD: dict[int, str] = {socket.AF_INET: "0.0.0.0", socket.AF_INET6: "::"}


@dataclass(frozen=True, slots=True)
class SwitchConfig:
    """What `mrc switch` was asked for; byte counts are UDP payload bytes, rates bit/s."""

    listen: tuple[str, int]
    forward: tuple[str, int]
    rate_bps: float
    reverse_rate_bps: float | None = None
    queue_bytes: int = 256 << 10
    #: Default: a quarter of the queue.
    ecn_threshold: int | None = None
    #: Default: as large as the data queue (as the simulator's ports).
    priority_bytes: int | None = None
    trim: bool = True
    trim_size: int = DEFAULT_TRIM_SIZE
    last_hop: bool = True
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    #: Datagrams read from one socket before the egress gets a turn.
    batch: int = 16

    def egress(self, rate_bps: float | None, now: float) -> EgressPort:
        return EgressPort(
            rate_bps=rate_bps,
            queue_bytes=self.queue_bytes,
            ecn_threshold=self.ecn_threshold,
            priority_bytes=self.priority_bytes,
            trim=self.trim,
            trim_size=self.trim_size,
            last_hop=self.last_hop,
            now=now,
        )


def format_addr(addr: SockAddr | None) -> str | None:
    if addr is None:
        return None
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def kernel_drops(sock: socket.socket) -> int | None:
    """The socket's receive drops as /proc/net/udp{,6} shows them (None if it is not there)."""
    inode = str(os.fstat(sock.fileno()).st_ino)
    table = "/proc/net/udp6" if sock.family == socket.AF_INET6 else "/proc/net/udp"
    try:
        with open(table) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 13 and fields[9] == inode:
                    return int(fields[-1])
    except (OSError, ValueError):
        pass
    return None


def _errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, f"errno{exc.errno}").lower()


def _tos_cmsgs(family: int) -> list[list[tuple[int, int, bytes]]]:
    """One ready-made control message list per TOS value, so a send builds nothing."""
    if family == socket.AF_INET6:
        return [[(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, _INT.pack(t))] for t in range(256)]
    return [[(socket.IPPROTO_IP, socket.IP_TOS, bytes([t]))] for t in range(256)]


def _open(host: str, port: int, buffer_bytes: int) -> PlaneSocket:
    # GRO: a GSO batch from the client arrives in one read (split again in `_drain`).
    ps = PlaneSocket(0, host, port, buffer_bytes=buffer_bytes, ring_size=1, gro=True)
    try:
        ps.sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        if ps.family == socket.AF_INET6:
            # An IPv4-mapped client on a v6 socket reports its TOS at the IP level.
            with contextlib.suppress(OSError):
                ps.sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    except BaseException:
        ps.close()
        raise
    return ps


class Relay:
    """The relay's sockets, its two egress ports and the loop that moves packets between them.

    Construction binds and connects (OSError on a bad or busy address); `serve()` runs until
    `stop()` or the duration; `report()` gives the counters `mrc switch -J` prints.
    """

    def __init__(
        self, config: SwitchConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self._clock = clock
        family, forward_addr = resolve_addr(*config.forward)
        self.forward_addr: SockAddr = forward_addr
        now = clock()
        #: client → server (shaped) and server → client (unshaped unless reverse_rate_bps).
        self.forward = config.egress(config.rate_bps, now)
        self.reverse = config.egress(config.reverse_rate_bps, now)
        self.client: SockAddr | None = None
        self.errors: Counter[str] = Counter()
        self.seconds = 0.0
        self._stopping = False
        self.downstream = _open(*config.listen, config.buffer_bytes)
        try:
            self.upstream = _open(_WILDCARD[family], 0, config.buffer_bytes)
            try:
                # Connected: sends skip the per-packet route lookup, and only the server's
                # packets come in on it.
                self.upstream.connect(forward_addr)
                self._wake_r, self._wake_w = socket.socketpair()
            except BaseException:
                self.upstream.close()
                raise
        except BaseException:
            self.downstream.close()
            raise
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._gso = True
        self._buf = bytearray(RECV_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._iov = [self._buf]
        self._down_cmsgs = _tos_cmsgs(self.downstream.family)
        self._up_cmsgs = _tos_cmsgs(self.upstream.family)

    @property
    def listen_addr(self) -> SockAddr:
        return self.downstream.bound_addr

    @property
    def source_addr(self) -> SockAddr:
        return self.upstream.local_addr

    def close(self) -> None:
        for s in (self.downstream, self.upstream):
            s.close()
        self._wake_r.close()
        self._wake_w.close()

    def stop(self) -> None:
        """Ask `serve()` to return; safe from a signal handler."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the loop ---------------------------------------------------------------------------

    def serve(self, duration: float | None = None) -> None:
        """Relay until `stop()` or `duration` seconds; queued packets are then dropped."""
        clock = self._clock
        down, up = self.downstream, self.upstream
        dfd, ufd, wfd = down.fileno(), up.fileno(), self._wake_r.fileno()
        ep = select.epoll()
        start = clock()
        deadline = None if duration is None else start + duration
        ports = (self.forward, self.reverse)
        try:
            for fd in (dfd, ufd, wfd):
                ep.register(fd, select.EPOLLIN)
            while not self._stopping:
                now = clock()
                timeout = -1.0
                for port in ports:
                    due = port.next_departure(now)
                    if due is not None:
                        wait = due - now if due > now else 0.0
                        timeout = wait if timeout < 0 else min(timeout, wait)
                if deadline is not None:
                    left = deadline - now
                    if left <= 0:
                        break
                    timeout = left if timeout < 0 else min(timeout, left)
                for fd, _ in ep.poll(timeout):
                    if fd == dfd:
                        self._drain(down.sock, self.forward, True)
                    elif fd == ufd:
                        self._drain(up.sock, self.reverse, False)
                    else:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                now = clock()
                if self.forward:
                    self._send_upstream(self.forward.pop_ready(now))
                if self.reverse:
                    self._send_downstream(self.reverse.pop_ready(now))
        finally:
            ep.close()
            self.seconds = clock() - start
            for port in ports:
                port.clear()
            # Drops after the last datagram read never rode on a control message.
            for ps, port in ((down, self.forward), (up, self.reverse)):
                drops = kernel_drops(ps.sock)
                if drops is not None and drops > port.stats.socket_overflow:
                    port.stats.socket_overflow = drops

    def _drain(self, sock: socket.socket, port: EgressPort, from_client: bool) -> None:
        recv = sock.recvmsg_into
        iov, view = self._iov, self._view
        offer = port.offer
        st = port.stats
        now = self._clock()
        for _ in range(self.config.batch):
            try:
                nbytes, anc, flags, addr = recv(iov, _ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:
                # An ICMP error from the server (nothing listening yet): count and carry on.
                self.errors["recv_econnrefused"] += 1
                continue
            except OSError as exc:
                self.errors["recv_" + _errname(exc)] += 1
                break
            tos = seg = 0
            for level, kind, cdata in anc:
                if level == _SOL_SOCKET:
                    if kind == SO_RXQ_OVFL and len(cdata) >= 4:
                        drops = _U32.unpack_from(cdata)[0]
                        if drops > st.socket_overflow:
                            st.socket_overflow = drops
                elif level == _SOL_UDP:
                    if kind == _UDP_GRO:
                        seg = (_INT if len(cdata) >= 4 else _U16).unpack_from(cdata)[0]
                elif kind == socket.IP_TOS and level == socket.IPPROTO_IP:
                    tos = cdata[0] if len(cdata) == 1 else _INT.unpack_from(cdata)[0] & 0xFF
                elif kind == socket.IPV6_TCLASS and level == socket.IPPROTO_IPV6:
                    tos = _INT.unpack_from(cdata)[0] & 0xFF
            if flags & _TRUNCATED:
                self.errors["truncated"] += 1
                continue
            if from_client:
                self.client = addr
            if 0 < seg < nbytes:
                for at in range(0, nbytes, seg):
                    offer(view[at : min(at + seg, nbytes)], tos, now)
            else:
                offer(view[:nbytes], tos, now)

    def _send_upstream(self, packets: list[tuple[bytes, int]]) -> None:
        self._transmit(self.upstream.sock, packets, self._up_cmsgs, None, self.forward.stats)

    def _send_downstream(self, packets: list[tuple[bytes, int]]) -> None:
        if self.client is None:
            self.reverse.stats.dropped_no_client += len(packets)
            return
        st = self.reverse.stats
        self._transmit(self.downstream.sock, packets, self._down_cmsgs, self.client, st)

    def _transmit(
        self,
        sock: socket.socket,
        packets: list[tuple[bytes, int]],
        cmsgs: list[list[tuple[int, int, bytes]]],
        addr: SockAddr | None,
        st: PortStats,
    ) -> None:
        """Send in runs of equal size and TOS, one GSO `sendmsg` per run (docs/DESIGN.md §11).

        A run may end with one shorter packet, as GSO allows; `addr` None means the connected
        peer. Per-packet syscalls would cap the relay far below the rates it shapes to.
        """
        sendmsg = sock.sendmsg
        n = len(packets)
        i = 0
        while i < n:
            data, tos = packets[i]
            size = len(data)
            j = i + 1
            if self._gso:
                total = size
                limit = i + min(MAX_GSO_SEGMENTS, _GSO_MAX_BYTES // size)
                while j < n and j < limit:
                    nxt, nxt_tos = packets[j]
                    nsize = len(nxt)
                    if nxt_tos != tos or nsize > size or total + nsize > _GSO_MAX_BYTES:
                        break
                    total += nsize
                    j += 1
                    if nsize < size:
                        break
            count = j - i
            if count == 1:
                bufs, anc = [data], cmsgs[tos]
            else:
                bufs = [p[0] for p in packets[i:j]]
                anc = [*cmsgs[tos], (_SOL_UDP, _UDP_SEGMENT, _U16.pack(size))]
            try:
                sent = sendmsg(bufs, anc) if addr is None else sendmsg(bufs, anc, 0, addr)
            except OSError as exc:
                if count > 1 and exc.errno in _NO_GSO_ERRNOS:
                    self._gso = False
                    self.errors["gso_disabled"] += 1
                    continue  # the same run again, one datagram at a time
                st.send_errors += count
                self.errors["send_" + _errname(exc)] += count
            else:
                st.forwarded_packets += count
                st.forwarded_bytes += sent
            i = j

    # -- report -----------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """The `-J` document: what was asked for (`start`) and what happened (`end`)."""
        c = self.config
        fwd = self.forward
        return {
            "start": {
                "listen": format_addr(self.listen_addr),
                "forward": format_addr(self.forward_addr),
                "source": format_addr(self.source_addr),
                "rate_bps": c.rate_bps,
                "reverse_rate_bps": c.reverse_rate_bps,
                "queue_bytes": fwd.queue_bytes,
                "priority_bytes": fwd.priority_bytes,
                "ecn_threshold_bytes": fwd.ecn_threshold,
                "trim": c.trim,
                "trim_size": c.trim_size,
                "last_hop": c.last_hop,
                "trimmed_dscp": fwd.dscp,
                "rcvbuf": [self.downstream.rcvbuf, self.upstream.rcvbuf],
                "loop": "epoll",
            },
            "end": {
                "seconds": round(self.seconds, 6),
                "client": format_addr(self.client),
                "forward": self.forward.stats.as_dict(),
                "reverse": self.reverse.stats.as_dict(),
                "errors": dict(self.errors),
            },
        }
