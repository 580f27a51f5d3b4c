"""Per-packet protection of a secured connection (docs/WIRE.md §7): keys, sealing, opening.

`PacketProtection` holds one connection's two directions after the handshake: what we send is
sealed under our direction's keys with our transmit counter, what we receive is opened under
the peer's direction's keys and checked against the anti-replay window (replay.py).

Trailer and nonce. Every packet after the REQUEST (not a REJECT) ends with `tx_counter 64 |
tag 128` (`mrc.wire.trailer`). The AES-256-GCM nonce is `direction 32 | tx_counter 64`
(direction 0 = requester → responder, 1 = the reverse), and each direction's counter goes up
by one per transmitted packet, retransmissions and GSO segments included, so no (key, nonce)
pair is ever used twice. Counter 0 of the responder's direction is its REPLY.

Levels. `auth`: the whole packet before the trailer is associated data, the plaintext is empty
(the tag alone). `encrypt`: a data packet's payload is ciphertext and its headers associated
data; a control packet has no payload and is sealed as in `auth`. A secured REPLY's private data
is encrypted at both levels (it carries R_Keys).

Rekeying without signals. The handshake yields one 32-byte traffic secret per direction,
secret(0); each epoch has its own, ratcheted forward (`SecretRatchet`):
    secret(e + 1) = HKDF-Expand-SHA256(secret(e), "mrc ratchet", 32)
and the key of counter c is the key of its epoch e = c >> `rekey_shift`:
    key(e) = HKDF-Expand-SHA256(secret(e), "mrc epoch" ‖ e as 8 bytes big-endian, 32).
Once a side has moved past an epoch (the sender's counter crossed into the next; the receiver
verified a counter of a newer one) that epoch's secret is overwritten, so a secret read out of
memory later opens nothing older; the receiver keeps only the AES contexts of the epochs its
replay window still reaches. (Python cannot wipe the copies a library call makes; the one
buffer that holds the secret is overwritten in place.)
With the default shift of 23 a key protects at most 2^23 packets, QUIC's confidentiality limit
for AES-GCM (RFC 9001 §6.6); `SessionConfig.rekey_shift` lowers it for tests. The sender moves
to the next key when its counter crosses an epoch boundary; the receiver reads the epoch off
each counter and keeps a context for every epoch the replay window still reaches, deriving an
epoch's key the first time a counter of it arrives (it keeps keys at most one epoch ahead of
the newest verified counter, so forged counters cannot fill its table, and derives nothing for
a counter more than `max_ahead` epochs past it: an `auth` drop). Nothing stops or waits
at a boundary. Both
sides must use the same shift: it is not negotiated (like `p_key`).

Hot path. Counters and tags are read and written with one `struct` call each (the direction
half of each nonce is written once), and `AESGCM.encrypt_into` / `decrypt_into` write straight
into the packet being framed or, for an encrypted payload in a writable receive buffer, over
the ciphertext where it lies, so sealing and opening allocate no packet-sized buffer. Nothing
is decrypted into a memory region: a decrypt writes before its tag is known to verify.

What it leaves to others: the handshake and the traffic secrets (handshake.py), deciding which
bytes of a datagram are headers and which packets are trimmed (secure.py), framing (sendpath.py).
"""

from __future__ import annotations

import struct
from collections import Counter
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from ...wire.trailer import TAG_SIZE, TRAILER_SIZE
from .replay import ReplayWindow

#: Bytes the trailer adds to every secured packet.
TRAILER: Final = TRAILER_SIZE
#: The key of each epoch is HKDF-Expand(secret(epoch), EPOCH_LABEL ‖ epoch).
EPOCH_LABEL: Final = b"mrc epoch"
#: secret(epoch + 1) = HKDF-Expand(secret(epoch), RATCHET_LABEL).
RATCHET_LABEL: Final = b"mrc ratchet"
#: Default log2 of packets per key: 2^23, QUIC's AES-GCM confidentiality limit.
DEFAULT_REKEY_SHIFT: Final = 23
KEY_SIZE: Final = 32

_NONCE: Final = struct.Struct(">IQ")
_COUNTER: Final = struct.Struct(">Q")
#: The trailer as read: the counter and the tag in one unpack.
_COUNTER_TAG: Final = struct.Struct(">Q16s")
_TAG: Final = struct.Struct("16s")
# The receive path's struct calls as bound methods, looked up once here rather than on every
# packet (a method call on a Struct is an attribute lookup each time, compiled or not).
_read_trailer: Final = _COUNTER_TAG.unpack_from
_write_counter: Final = _COUNTER.pack_into
_write_tag: Final = _TAG.pack_into
#: Receive slots whose views one connection keeps (io's rings: 64 a plane); past it, all go.
MAX_SLOTS: Final = 1024
#: A packet's place in a receive slot and the views it is opened through (`_slot_views`).
SlotViews = tuple[int, int, memoryview, memoryview, memoryview]
_EPOCH: Final = struct.Struct(">Q")


def epoch_key(secret: bytes, epoch: int) -> bytes:
    """The AES-256-GCM key of `epoch` under that epoch's traffic secret."""
    info = EPOCH_LABEL + _EPOCH.pack(epoch)
    return HKDFExpand(hashes.SHA256(), KEY_SIZE, info).derive(secret)


def next_secret(secret: bytes) -> bytes:
    """The traffic secret of the epoch after the one `secret` belongs to."""
    return HKDFExpand(hashes.SHA256(), KEY_SIZE, RATCHET_LABEL).derive(secret)


class SecretRatchet:
    """One direction's traffic secret at its current epoch; it only moves forward, and each
    secret it leaves behind is overwritten in place."""

    def __init__(self, secret: bytes) -> None:
        self._secret = bytearray(secret)
        self.epoch = 0

    def key(self, epoch: int) -> bytes | None:
        """The AES key of `epoch` (this epoch or a later one, derived without moving), or
        None for an epoch already left behind."""
        if epoch < self.epoch:
            return None
        secret = bytes(self._secret)
        for _ in range(epoch - self.epoch):
            secret = next_secret(secret)
        return epoch_key(secret, epoch)

    def advance(self, epoch: int) -> None:
        """Move to `epoch`, overwriting every secret passed."""
        while self.epoch < epoch:
            self._secret[:] = next_secret(bytes(self._secret))
            self.epoch += 1


class PacketProtection:
    """Both directions of one secured connection.

    `direction` is ours (0 requester, 1 responder); `tx_secret` and `rx_secret` are the traffic
    secrets of our direction and the peer's. `max_payload` bounds the payload of a packet this
    side opens with decryption (the connection's payload_mtu, or the private-data limit).
    `drops` is the session's drop counter: opening counts `auth`, `replay` (a counter already
    seen), `replay_window` (below the window) and `bad_length` there.
    """

    def __init__(
        self,
        *,
        direction: int,
        tx_secret: bytes,
        rx_secret: bytes,
        encrypt: bool,
        rekey_shift: int,
        replay_width: int,
        max_payload: int,
        drops: Counter[str],
    ) -> None:
        self.direction = direction
        self.encrypt = encrypt
        self.shift = rekey_shift
        self.drops = drops
        self._tx_secret = SecretRatchet(tx_secret)
        self._rx_secret = SecretRatchet(rx_secret)
        #: Epochs past the newest verified one whose keys a received counter may ask for
        #: (a burst of losses as long as the replay window, and one more).
        self.max_ahead = (replay_width >> rekey_shift) + 2
        #: The next counter we send with.
        self.tx_counter = 0
        self._tx_epoch = 0
        self._tx_ctx = AESGCM(epoch_key(tx_secret, 0))
        self._tx_nonce = bytearray(_NONCE.pack(direction, 0))
        self._rx_direction = direction ^ 1
        self._rx_ctxs: dict[int, AESGCM] = {0: AESGCM(epoch_key(rx_secret, 0))}
        #: The epoch of the newest verified counter and its context (the common lookup).
        self._rx_epoch = 0
        self._rx_cur = self._rx_ctxs[0]
        #: `_rx_cur.decrypt_into`, bound once per epoch (a method call looks its name up).
        self._rx_decrypt = self._rx_cur.decrypt_into
        self._rx_nonce = bytearray(_NONCE.pack(self._rx_direction, 0))
        self.replay = ReplayWindow(replay_width)
        self.max_payload = max_payload
        # Opening an encrypted payload: ciphertext ‖ tag are gathered in `_gather` (the wire
        # has the counter between them) and decrypted into `_plain` behind a copy of the
        # headers, so the receive path can treat the result as a plain packet.
        self._gather = memoryview(bytearray(max_payload + TAG_SIZE))
        self._plain = memoryview(bytearray(max_payload + 64))
        self._empty = bytearray(0)
        #: The views `open_at` opens packets of io's receive slots through, per slot (its
        #: view's id; the view is kept, so the id is not reused) and offset:
        #: (body, end, first, second, third) as `_slot_views` makes them.
        self._slots: dict[int, tuple[memoryview, dict[int, SlotViews]]] = {}
        #: The slot of the last call and its views (a GRO read's packets share one slot).
        self._slot: memoryview | None = None
        self._slot_map: dict[int, SlotViews] = {}
        #: Keys derived so far (both directions), for tests and metrics.
        self.rekeys = 0

    # -- sending ----------------------------------------------------------------------------

    def _next(self) -> tuple[AESGCM, bytearray, int]:
        """The context, nonce and counter of the next transmission (the counter is consumed)."""
        counter = self.tx_counter
        self.tx_counter = counter + 1
        if counter >> self.shift != self._tx_epoch:
            self._tx_epoch = counter >> self.shift
            self._tx_ctx = self._tx_epoch_ctx(self._tx_epoch)
        _NONCE.pack_into(self._tx_nonce, 0, self.direction, counter)
        return self._tx_ctx, self._tx_nonce, counter

    def _tx_epoch_ctx(self, epoch: int) -> AESGCM:
        """Ratchet our secret to `epoch` (the old one overwritten) and give its context."""
        ratchet = self._tx_secret
        ratchet.advance(epoch)
        key = ratchet.key(epoch)
        assert key is not None  # (the ratchet stands at `epoch`)
        self.rekeys += 1
        return AESGCM(key)

    def seal(self, packet: bytes) -> bytes:
        """A control packet with its trailer: the whole packet is associated data."""
        ctx, nonce, counter = self._next()
        n = len(packet)
        buf = bytearray(n + TRAILER)
        mv = memoryview(buf)
        mv[:n] = packet
        ctx.encrypt_into(nonce, b"", mv[:n], mv[n + 8 :])
        _COUNTER.pack_into(buf, n, counter)
        return bytes(buf)

    def spans(
        self, mv: memoryview, start: int, body: int, end: int
    ) -> tuple[memoryview, memoryview]:  # fmt: skip
        """The two views of `mv` that `seal_into` seals a data packet through, the packet's
        headers at `mv[start:body]` and its payload's room up to `end`: in `encrypt` mode
        (headers, payload ‖ tag: what `encrypt_into` reads and writes), else (payload, headers
        ‖ payload: where the payload is copied, and what the tag covers). A framer that reuses
        one buffer can keep them from batch to batch."""
        if self.encrypt:
            return mv[start:body], mv[body : end + TAG_SIZE]
        return mv[body:end], mv[start:end]

    def seal_into(
        self, mv: memoryview, packets: list[tuple[memoryview, memoryview, memoryview, int]]
    ) -> None:  # fmt: skip
        """Seal data packets framed in `mv`: each `(first, second, payload, end)` has its
        headers already written, `first` and `second` its `spans`, `payload` its payload
        (written as ciphertext in `encrypt` mode), and its trailer goes at `mv[end:]`. One
        call per GSO batch: the loop keeps its state in locals (the per-packet cost is what
        limits a CPython sender)."""
        counter = self.tx_counter
        shift = self.shift
        epoch = self._tx_epoch
        ctx = self._tx_ctx
        nonce = self._tx_nonce
        pack_trailer = _COUNTER_TAG.pack_into
        unpack_tag = _TAG.unpack_from
        encrypt = self.encrypt
        # The cipher's methods bound once per epoch (a method call looks its name up each time).
        encrypt_into, encrypt_tag = ctx.encrypt_into, ctx.encrypt
        for first, second, payload, end in packets:
            if counter >> shift != epoch:
                epoch = self._tx_epoch = counter >> shift
                ctx = self._tx_ctx = self._tx_epoch_ctx(epoch)
                encrypt_into, encrypt_tag = ctx.encrypt_into, ctx.encrypt
            _write_counter(nonce, 4, counter)  # the direction half was written once
            if encrypt:
                # encrypt_into writes ciphertext ‖ tag; the tag then moves past the counter.
                encrypt_into(nonce, payload, first, second)
                pack_trailer(mv, end, counter, unpack_tag(mv, end)[0])
            else:
                first[:] = payload
                pack_trailer(mv, end, counter, encrypt_tag(nonce, b"", second))
            counter += 1
        self.tx_counter = counter

    def seal_reply(self, reply: bytes, private_len: int) -> bytes:
        """The REPLY with its private data (the last `private_len` bytes) encrypted and its
        trailer, under counter 0 (docs/WIRE.md §7: resent byte-identical)."""
        if self.tx_counter != 0:
            raise ValueError("the REPLY must be the first packet sealed")
        ctx, nonce, counter = self._next()
        n = len(reply)
        head = n - private_len
        buf = bytearray(n + TRAILER)
        mv = memoryview(buf)
        mv[:head] = reply[:head]
        ctx.encrypt_into(nonce, reply[head:], mv[:head], mv[head : n + TAG_SIZE])
        mv[n + 8 :] = mv[n : n + TAG_SIZE]
        _COUNTER.pack_into(buf, n, counter)
        return bytes(buf)

    # -- receiving --------------------------------------------------------------------------

    def _rx_ctx(self, counter: int) -> AESGCM | None:
        """The context of `counter`'s epoch, or None (counted) for an epoch left behind or
        further ahead than `max_ahead`."""
        epoch = counter >> self.shift
        ctx = self._rx_ctxs.get(epoch)
        if ctx is not None:
            return ctx
        newest = max(self.replay.top, 0) >> self.shift
        if epoch > newest + self.max_ahead:
            self.drops["auth"] += 1  # (never checked: no key is derived that far ahead)
            return None
        key = self._rx_secret.key(epoch)
        if key is None:
            self.drops["replay_window"] += 1
            return None
        ctx = AESGCM(key)
        # Kept only up to one epoch ahead of what verified: forged counters from ahead cost
        # a derivation each but cannot fill the table; a genuine jump (a long burst lost) is
        # kept once its tag verifies (`open`).
        if epoch <= newest + 1:
            self._rx_ctxs[epoch] = ctx
            self.rekeys += 1
        return ctx

    def _rx_advance(self, epoch: int) -> None:
        """A counter of `epoch`, newer than every epoch before, verified: keep the contexts
        of the epochs between that the window still reaches, then ratchet the secret there."""
        ratchet = self._rx_secret
        oldest = (self.replay.top - self.replay.width + 1) >> self.shift
        for e in range(max(ratchet.epoch, oldest), epoch):
            if e not in self._rx_ctxs:
                key = ratchet.key(e)
                if key is not None:
                    self._rx_ctxs[e] = AESGCM(key)
                    self.rekeys += 1
        ratchet.advance(epoch)

    def _forget_old_epochs(self) -> None:
        """Drop the contexts of epochs the replay window no longer reaches."""
        oldest = (self.replay.top - self.replay.width + 1) >> self.shift
        for epoch in [e for e in self._rx_ctxs if e < oldest]:
            del self._rx_ctxs[epoch]

    def _window(self, counter: int) -> AESGCM | None:
        """The context to verify `counter` with, if the anti-replay window has not seen it and
        its epoch has a key; else None (counted)."""
        replay = self.replay
        # In order (the common case) is new without a look at the bitmap.
        if counter <= replay.top and not replay.fresh(counter):
            self.drops["replay_window" if replay.stale(counter) else "replay"] += 1
            return None
        if counter >> self.shift == self._rx_epoch:
            return self._rx_cur
        return self._rx_ctx(counter)

    def _verified(self, counter: int, ctx: AESGCM) -> None:
        """`counter`'s tag verified under `ctx`: the window moves (only now, RFC 6479)."""
        replay = self.replay
        top = replay.top
        epoch = counter >> self.shift
        if counter > top and counter >> 6 == top >> 6 and epoch == self._rx_epoch:
            # The usual step: newest, in the same block and epoch (the window's first case).
            replay.accept(counter)
        elif counter > top and epoch != top >> self.shift:
            # A new newest epoch: it is the current one from now on, and the secret moves.
            self._rx_ctxs[epoch] = self._rx_cur = ctx
            self._rx_decrypt = ctx.decrypt_into
            self._rx_epoch = epoch
            replay.accept(counter)
            self._rx_advance(epoch)
            self._forget_old_epochs()
        else:
            replay.accept(counter)

    def open(self, data: bytes | memoryview, header: int) -> memoryview | None:
        """The packet without its trailer if its tag verifies and its counter is new, else
        None (counted): `open_at` for the whole of `data`. `header` > 0 says the bytes after
        it are a data packet's payload (encrypted in `encrypt` mode); 0, a control packet, all
        associated data. The result is a view of `data`, but for an encrypted payload in
        read-only `data`: that is decrypted into this object's plaintext buffer, behind a copy
        of the headers, and the result is a view of that, valid until the next `open`."""
        mv = memoryview(data) if isinstance(data, bytes) else data  # (a C check compiled)
        if not self.open_at(mv, 0, len(mv), header):
            return None
        end = len(mv) - TRAILER
        if header and self.encrypt and mv.readonly:
            return self._plain[:end]
        return mv[:end]

    def open_at(
        self, buf: memoryview, at: int, size: int, header: int, slot: bool = False
    ) -> bool:
        """Whether the datagram of `size` bytes at `at` in `buf` opens: its counter is new to
        the window and its tag verifies (the window moves only then); False when not
        (counted). `header` as for `open`. An encrypted payload in a writable `buf` (io's
        receive buffer) is decrypted where it lies: nothing of `buf` changes but this
        datagram's payload and trailer, whether or not it verified, so a GRO read's packets
        are opened where they lie, one after the other. In a read-only `buf` it is decrypted
        into `_plain` (`open`). `slot` says `buf` is a writable receive slot io reads into
        again and again (mrc/io/planes.py): the views the cipher call takes are then made
        once per slot and offset and kept (`_slot_views`), not sliced a packet at a time."""
        end = at + size - TRAILER
        body = at + header
        if end < body:
            self.drops["auth"] += 1
            return False
        counter, tag = _read_trailer(buf, end)
        ctx = self._window(counter)
        if ctx is None:
            return False
        nonce = self._rx_nonce
        _write_counter(nonce, 4, counter)  # the direction half was written once
        decrypt_into = self._rx_decrypt if ctx is self._rx_cur else ctx.decrypt_into
        try:
            if not (header and self.encrypt):
                ad = self._slot_views(buf, at, body, end)[2] if slot else buf[at:end]
                decrypt_into(nonce, tag, ad, self._empty)
            elif end - body > self.max_payload:
                self.drops["bad_length"] += 1
                return False
            elif slot or not buf.readonly:
                # The tag moves over the counter, read already, so ciphertext ‖ tag are one
                # span; the payload is decrypted where it lies (no staging copy).
                _write_tag(buf, end, tag)
                if slot:
                    _, _, sealed, ad, out = self._slot_views(buf, at, body, end)
                    decrypt_into(nonce, sealed, ad, out)
                else:
                    decrypt_into(nonce, buf[body : end + TAG_SIZE], buf[at:body], buf[body:end])
            else:
                # Ciphertext ‖ tag must be contiguous: gather them (the counter is between)
                # and decrypt behind a copy of the headers.
                n = end - body
                sealed = self._gather[: n + TAG_SIZE]
                sealed[:n] = buf[body:end]
                sealed[n:] = tag
                plain = self._plain
                decrypt_into(nonce, sealed, buf[at:body], plain[header : header + n])
                plain[:header] = buf[at:body]
        except InvalidTag:
            self.drops["auth"] += 1
            return False
        self._verified(counter, ctx)
        return True

    def _slot_views(self, buf: memoryview, at: int, body: int, end: int) -> SlotViews:
        """The views of the packet at `buf[at:end + TRAILER]` (payload from `body`) that the
        cipher call takes, for a receive slot `buf` (`open_at`): payload ‖ tag, headers,
        payload in `encrypt` mode; headers ‖ payload (the associated data) in `auth`. Made
        the first time this slot holds a packet at `at` with this layout, then kept."""
        if buf is not self._slot:
            slots = self._slots
            entry = slots.get(id(buf))
            if entry is None or entry[0] is not buf:
                if len(slots) >= MAX_SLOTS:
                    slots.clear()
                entry = (buf, {})
                slots[id(buf)] = entry
            self._slot, self._slot_map = buf, entry[1]
        views = self._slot_map.get(at)
        if views is None or views[0] != body or views[1] != end:
            if self.encrypt:
                views = (body, end, buf[body : end + TAG_SIZE], buf[at:body], buf[body:end])
            else:
                whole = buf[at:end]
                views = (body, end, whole, whole, whole)
            self._slot_map[at] = views
        return views

    def open_reply(self, data: bytes | memoryview, private_len: int) -> bytes | None:
        """The REPLY's private data in clear if its tag verifies under counter 0, else None
        (counted as `auth`)."""
        mv = data if isinstance(data, memoryview) else memoryview(data)
        end = len(mv) - TRAILER
        head = end - private_len
        if head < 0 or _COUNTER.unpack_from(mv, end)[0] != 0:
            self.drops["auth"] += 1
            return None
        nonce = self._rx_nonce
        _NONCE.pack_into(nonce, 0, self._rx_direction, 0)
        sealed = bytes(mv[head:end]) + bytes(mv[end + 8 :])
        plain = bytearray(private_len)
        try:
            self._rx_ctxs[0].decrypt_into(nonce, sealed, mv[:head], plain)
        except InvalidTag:
            self.drops["auth"] += 1
            return None
        self.replay.accept(0)
        return bytes(plain)
