"""Batched UDP receives: libc `recvmmsg(2)` through ctypes, into a ring the caller owns.

Holds `MmsgRing`: one `mmsghdr` per ring buffer, built once (the iovec points at the ring
buffer itself, so the datagrams are read in place and the views handed on are views of the
ring, as with `recvmsg_into`), one syscall that fills up to a ring's worth of them, and the
parse of what the kernel wrote back: length, MSG_TRUNC, source address (decoded to the tuple
`socket.recvmsg` returns) and the control messages `PlaneSocket.drain` reads (IP_TOS /
IPV6_TCLASS, UDP_GRO segment size, IPV6_FLOWINFO), GRO batches split at their segment
size. `available()` says whether it may be used here (Linux on a little-endian host, libc
has `recvmmsg`, `MRC_NO_RECVMMSG` unset).

It leaves socket options, counters, error mapping and how many slots each call may fill to
`mrc.io.planes.PlaneSocket`, which falls back to its `recvmsg_into` loop without it.

Why: a `recvmsg_into` per datagram costs a syscall plus the Python objects CPython builds
for the result (an ancillary list of tuples of bytes, a fresh address tuple with a fresh host
string); here one syscall reads many datagrams, the headers are restored from a template with
one slice copy, and addresses come from a small cache keyed by the raw sockaddr bytes.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["NO_RECVMMSG_ENV", "MmsgRing", "available"]

#: Set to 1 to force the `recvmsg_into` loop (comparisons, or a libc that misbehaves).
NO_RECVMMSG_ENV = "MRC_NO_RECVMMSG"

_MSG_DONTWAIT = int(socket.MSG_DONTWAIT)
_MSG_TRUNC = int(socket.MSG_TRUNC)
_SOL_UDP = 17
_UDP_GRO = 104
_IPV6_FLOWINFO = 11
_FLOW_LABEL_MASK = 0xFFFFF
_IPPROTO_IP = int(socket.IPPROTO_IP)
_IPPROTO_IPV6 = int(socket.IPPROTO_IPV6)
_IP_TOS = int(socket.IP_TOS)
_IPV6_TCLASS = int(socket.IPV6_TCLASS)
#: Room for the largest source address we read (sockaddr_in6 is 28 bytes), 8-aligned.
_NAME_SLOT = 32
#: Bytes past each control slot, so a header-plus-int read of the last message stays inside.
_CTRL_SLACK = 8
#: Distinct peers remembered per socket; past this the cache starts over (spoofed floods).
_ADDR_CACHE_MAX = 1024


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.c_void_p),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


_HDR_SIZE = ctypes.sizeof(_Mmsghdr)
_SIZE_T = "N" if ctypes.sizeof(ctypes.c_size_t) == struct.calcsize("N") else "Q"


def _result_struct() -> struct.Struct:
    """(namelen, controllen, flags, msg_len) of one mmsghdr, at the offsets ctypes laid out."""
    fields = [
        (_Msghdr.msg_namelen.offset, "I"),
        (_Msghdr.msg_controllen.offset, _SIZE_T),
        (_Msghdr.msg_flags.offset, "i"),
        (_Mmsghdr.msg_len.offset, "I"),
    ]
    fmt, at = "@", 0
    for offset, code in fields:
        fmt += f"{offset - at}x{code}"
        at = offset + struct.calcsize("@" + code)
    return struct.Struct(fmt)


_RESULT = _result_struct()
_CMSG_HDR = socket.CMSG_LEN(0)
_ALIGN = ctypes.sizeof(ctypes.c_size_t)
#: A control message header and the native int after it (the data of every kind but IP_TOS,
#: whose one byte is read on its own).
_CMSG_INT = struct.Struct(f"@{_SIZE_T}iii")
#: One control message (the TOS / traffic class alone) and two (a GRO segment size, then
#: the TOS): their areas' lengths, and each read as header(s) and a native int. The IP_TOS
#: byte is the low byte of that int only on a little-endian host; elsewhere `available()` is
#: False and the recvmsg_into loop runs.
_ONE_LEN = socket.CMSG_SPACE(4)
_TWO_LEN = 2 * socket.CMSG_SPACE(4)
_CMSG_ONE = _CMSG_INT
_CMSG_TWO = struct.Struct(f"@{_SIZE_T}iii4x{_SIZE_T}iii")
_FLOWINFO = struct.Struct("!I")
_unpack_result = _RESULT.unpack_from
_unpack_one = _CMSG_ONE.unpack_from
_unpack_two = _CMSG_TWO.unpack_from
_SA6_KEY = struct.Struct("@4Q")  # the whole 28-byte sockaddr_in6 (and 4 zero bytes)
_SA4 = struct.Struct("!2xH4s")  # port, address (an IPv4 key is the slot's first 8 bytes)
_key6 = _SA6_KEY.unpack_from
_SA6 = struct.Struct("!2xHI16s")
_SCOPE = struct.Struct("@I")

_RecvMmsg = Callable[[int, ctypes.c_void_p, int, int, None], int]
_libc_recvmmsg: _RecvMmsg | None = None
_libc_tried = False


def _load() -> _RecvMmsg | None:
    """libc's recvmmsg, or None (not Linux, no libc symbol)."""
    global _libc_recvmmsg, _libc_tried
    if _libc_tried:
        return _libc_recvmmsg
    _libc_tried = True
    if not sys.platform.startswith("linux") or sys.byteorder != "little":
        return None
    for name in (None, "libc.so.6"):
        try:
            fn = ctypes.CDLL(name, use_errno=True).recvmmsg
        except (OSError, AttributeError):
            continue
        # No argtypes: converting through them cost about 0.5 µs a call (measured); the
        # callers pass ints for fd, vlen and flags and a c_void_p for the vector, and ints
        # are passed as C ints. PyDLL (keeping the GIL) measured no faster.
        fn.restype = ctypes.c_int
        _libc_recvmmsg = fn
        break
    return _libc_recvmmsg


def available() -> bool:
    """True when `MmsgRing` can be used: Linux (little-endian), libc has recvmmsg,
    MRC_NO_RECVMMSG not set."""
    if os.environ.get(NO_RECVMMSG_ENV, "").strip() not in ("", "0"):
        return False
    return _load() is not None


class MmsgRing:
    """recvmmsg headers for a ring of receive buffers, and the parse of what was read.

    Message slot `i` reads into `ring[i]`; the caller keeps `ring` (and the views it hands
    out) alive. `read` fills slots `start … start+count-1` (no wrap-around) with one
    syscall and turns them into datagrams.
    """

    def __init__(self, family: int, ring: Sequence[bytearray], control_bytes: int) -> None:
        fn = _load()
        if fn is None:
            raise OSError("recvmmsg is not available")
        self._fn = fn
        n = len(ring)
        self.family = family
        self._v6 = family == socket.AF_INET6
        self._namelen = 28 if self._v6 else 16
        self._ctrl_slot = control_bytes + _CTRL_SLACK
        # Exported ring memory: the bytearrays cannot be resized while these exist (they never
        # are), and the kernel writes straight into them.
        self._bufs = [(ctypes.c_char * len(b)).from_buffer(b) for b in ring]
        self._iov = (_Iovec * n)()
        self._names = ctypes.create_string_buffer(n * _NAME_SLOT)
        self._ctrl = ctypes.create_string_buffer(n * self._ctrl_slot)
        self._hdrs = (_Mmsghdr * n)()
        names = ctypes.addressof(self._names)
        ctrl = ctypes.addressof(self._ctrl)
        for i, buf in enumerate(self._bufs):
            self._iov[i].iov_base = ctypes.addressof(buf)
            self._iov[i].iov_len = len(ring[i])
            h = self._hdrs[i].msg_hdr
            h.msg_name = names + i * _NAME_SLOT
            h.msg_namelen = _NAME_SLOT
            h.msg_iov = ctypes.addressof(self._iov[i])
            h.msg_iovlen = 1
            h.msg_control = ctrl + i * self._ctrl_slot
            h.msg_controllen = control_bytes
        # The kernel writes namelen, controllen, flags and msg_len back: one slice copy from
        # this template restores the slots a call filled.
        self._hdr_view = memoryview(self._hdrs).cast("B")
        self._template = bytes(self._hdr_view)
        self._names_view = memoryview(self._names).cast("B")
        self._names_q = self._names_view.cast("Q")
        self._ctrl_view = memoryview(self._ctrl).cast("B")
        base = ctypes.addressof(self._hdrs)
        self._slot_ptr = [ctypes.c_void_p(base + i * _HDR_SIZE) for i in range(n)]
        self._addrs: dict[Any, tuple[Any, ...]] = {}
        self._template_view = memoryview(self._template)
        self._state = (
            self._fn,
            self._slot_ptr,
            self._hdr_view,
            self._ctrl_view,
            self._ctrl_slot,
            self._addrs,
            self._names_view,
            self._names_q,
            self._v6,
            self._namelen,
            _IPV6_TCLASS if self._v6 else _IP_TOS,
        )

    def read(
        self,
        fd: int,
        start: int,
        count: int,
        views: Sequence[memoryview],
        out: list[tuple[memoryview, tuple[Any, ...], int, int, int]],
    ) -> tuple[int, int, int, int, int, int]:
        """One recvmmsg (MSG_DONTWAIT) into slots start…start+count-1 (`views[i]` views
        slot i's buffer), then append each read to `out`: (slot i's view, source address,
        TOS | flow label << 8, GRO segment size or 0 for one datagram, length). The slots
        read are restored for the next call.

        Returns (slots read or -errno, reads kept, their bytes, datagrams dropped as
        truncated, the most datagrams one read held: 1 without GRO, 0 when none was kept,
        and the datagrams the reads kept hold). -EAGAIN: the socket was empty."""
        # One attribute load for all the state: this runs once per syscall, and a call that
        # reads a single datagram (or GRO batch) is common, so fixed costs count.
        (fn, slots, hdrs, ctrl, ctrl_slot, addrs, names, names_q, v6, want_namelen, tos_kind) = (
            self._state
        )
        got = fn(fd, slots[start], count, _MSG_DONTWAIT, None)
        if got <= 0:
            return (-ctypes.get_errno() if got else 0), 0, 0, 0, 0, 0
        tos_level = _IPPROTO_IPV6 if v6 else _IPPROTO_IP
        packets = nbytes_total = truncated = most = datagrams = 0
        for i in range(start, start + got):
            namelen, ctrllen, flags, nbytes = _unpack_result(hdrs, i * _HDR_SIZE)
            if flags & _MSG_TRUNC:
                truncated += 1
                continue
            if namelen == want_namelen:
                # IPv4: family, port and address are one 8-byte word, an int key.
                key = _key6(names, i * _NAME_SLOT) if v6 else names_q[i * (_NAME_SLOT // 8)]
                addr = addrs.get(key)
                if addr is None:
                    addr = self._decode(i, key, v6)
            else:
                addr = self._decode_other(i, namelen)
            # The layouts this socket's options produce, read in one unpack each: the TOS
            # (traffic class) alone, or a GRO segment size then the TOS. Anything else (a
            # flow label, a cut-short area) goes the long way.
            off = i * ctrl_slot
            if ctrllen == _ONE_LEN:
                clen, level, kind, tos = _unpack_one(ctrl, off)
                seg = 0
                if level != tos_level or kind != tos_kind or clen < _CMSG_HDR + 1:
                    tos, seg = self._parse_cmsgs(off, ctrllen)
                elif v6:
                    tos &= 0xFF if clen >= _CMSG_HDR + 4 else 0
                else:
                    tos &= 0xFF  # the one TOS byte (the rest is padding)
            elif ctrllen == _TWO_LEN:
                clen, level, kind, seg, clen2, level2, kind2, tos = _unpack_two(ctrl, off)
                if (
                    level != _SOL_UDP
                    or kind != _UDP_GRO
                    or clen < _CMSG_HDR + 4
                    or level2 != tos_level
                    or kind2 != tos_kind
                    or clen2 < _CMSG_HDR + (4 if v6 else 1)
                ):
                    tos, seg = self._parse_cmsgs(off, ctrllen)
                else:
                    tos &= 0xFF
            elif ctrllen:
                tos, seg = self._parse_cmsgs(off, ctrllen)
            else:
                tos = seg = 0
            packets += 1
            nbytes_total += nbytes
            if 0 < seg < nbytes:
                held = -(-nbytes // seg)
                most = max(most, held)
                datagrams += held
            else:
                seg = 0
                datagrams += 1
            out.append((views[i], addr, tos, seg, nbytes))
        if packets and not most:
            most = 1
        lo, hi = start * _HDR_SIZE, (start + got) * _HDR_SIZE
        hdrs[lo:hi] = self._template_view[lo:hi]
        return got, packets, nbytes_total, truncated, most, datagrams

    def _parse_cmsgs(self, off: int, ctrllen: int) -> tuple[int, int]:
        """(TOS | flow label << 8, GRO segment size) from any control area: every message in
        turn, the kinds `PlaneSocket` asks for, the rest skipped."""
        ctrl = self._ctrl_view
        end = off + ctrllen
        tos = seg = 0
        while off + _CMSG_HDR <= end:
            clen, level, kind, value = _CMSG_INT.unpack_from(ctrl, off)
            if clen < _CMSG_HDR:
                break
            size = min(clen, end - off) - _CMSG_HDR
            if level == _IPPROTO_IP:
                if kind == _IP_TOS and size >= 1:
                    tos = ctrl[off + _CMSG_HDR] | (tos & ~0xFF)
            elif level == _IPPROTO_IPV6:
                if kind == _IPV6_TCLASS and size >= 4:
                    tos = (value & 0xFF) | (tos & ~0xFF)
                elif kind == _IPV6_FLOWINFO and size >= 4:
                    label = _FLOWINFO.unpack_from(ctrl, off + _CMSG_HDR)[0]
                    tos = (tos & 0xFF) | ((label & _FLOW_LABEL_MASK) << 8)
            elif level == _SOL_UDP and kind == _UDP_GRO:
                if size >= 4:
                    seg = value
                elif size >= 2:
                    seg = value & 0xFFFF if sys.byteorder == "little" else value >> 16
            off += (clen + _ALIGN - 1) & -_ALIGN
        return tos, seg

    def _decode(self, i: int, key: Any, v6: bool) -> tuple[Any, ...]:
        """The source address of slot `i` as `socket.recvmsg` gives it, remembered by `key`."""
        off = i * _NAME_SLOT
        addr: tuple[Any, ...]
        if v6:
            port, flowinfo, raw = _SA6.unpack_from(self._names_view, off)
            scope = _SCOPE.unpack_from(self._names_view, off + 24)[0]
            host = socket.inet_ntop(socket.AF_INET6, raw)
            if scope:
                # A scoped address reads as "fe80::1%eth0", as CPython's getnameinfo gives it.
                flags = socket.NI_NUMERICHOST | socket.NI_NUMERICSERV
                host = socket.getnameinfo((host, port, flowinfo, scope), flags)[0]
            addr = (host, port, flowinfo, scope)
        else:
            port, raw = _SA4.unpack_from(self._names_view, off)
            addr = (socket.inet_ntop(socket.AF_INET, raw), port)
        if len(self._addrs) >= _ADDR_CACHE_MAX:
            self._addrs.clear()
        self._addrs[key] = addr
        return addr

    def _decode_other(self, i: int, namelen: int) -> tuple[Any, ...]:
        """A source address of an unexpected length (an IPv4 sender on an IPv6 socket cannot
        give one, but the kernel owns this field): decoded by its family, uncached."""
        off = i * _NAME_SLOT
        family = struct.unpack_from("@H", self._names_view, off)[0] if namelen >= 2 else 0
        if family == socket.AF_INET and namelen >= 8:
            port, raw = _SA4.unpack_from(self._names_view, off)
            return (socket.inet_ntop(socket.AF_INET, raw), port)
        if family == socket.AF_INET6 and namelen >= 28:
            return self._decode(i, ("other", _SA6_KEY.unpack_from(self._names_view, off)), True)
        return ()
