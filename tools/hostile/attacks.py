"""The attacks: generators of hostile datagrams built from what the sniffer saw.

Holds `Forgery` (one datagram to send: its kind, spoofed source, destination, bytes and, when
known, the bytes' one's-complement sum), one generator per attack kind (`KINDS` maps each name
to its generator) and `Mix`, which interleaves the chosen kinds by weight. Every generator runs
for ever over a live `Flow` and reads the connection's state afresh for each datagram, so
"ahead of the sender" follows the transfer as it moves. Packets are built with the `mrc.wire`
codecs, so they are well-formed where the attack wants them to be.

The kinds, and what a correct receiver does with them on a secured connection:
- `forged_data`: WRITE_MIDDLE packets ahead of the sender (next PSNs and VAs, right QPN and
  R_Key, random payload) with a random trailer or none: `auth` drops (without a trailer the
  packet looks short, i.e. trimmed, and can at most draw a NACK).
- `replay`: genuine datagrams again, verbatim, from their genuine source: `replay` drops.
- `bitflip`, `truncate`, `extend`: genuine datagrams with 1-8 bits flipped, cut short, or with
  bytes appended: `auth` or decode drops (a cut data packet is a trim, docs/WIRE.md §5).
- `noise`: random bytes from a genuine source address and port.
- `forged_sack`: SACKs to the client acknowledging PSNs not sent yet, bitmaps all ones.
- `forged_nack`: NACKs to the client, TRIMMED and every other reason, for PSNs in flight.
- `forged_probe`: RELIABILITY_PROBEs to the server; `forged_endpoint`: PORT_STATUS requests
  saying no plane can receive, to either side.
- `forged_trim`: data headers with a few payload bytes and no trailer, PSNs around the sender.
- `forged_cm_request`: REQUESTs with a random static key (in no allowlist), random nonce and
  private data, sometimes with the other security level.
- `forged_cm_disconnect` (to both sides) and `forged_cm_reject` (to the client, with a random
  nonce or the genuine REQUEST's): ignored, or on a secured attempt a hint (`cm_reject_hint`).
- `forged_cm_request_listed`: REQUESTs claiming the genuine client's (listed) static key, sealed
  with a seal no key made: `cm_auth` (or `handshake_rate_limited`), no state, no answer.
- `replayed_cm_request`: a genuine REQUEST again, verbatim, from the client's address on any
  attacked plane: the live connection's is a copy (the same REPLY bytes, to the address the
  server already knows), an earlier connection's draws `cm_replay`; never a new connection.
- `junk_to_plane`: 12-40 byte datagrams naming the server's QPN from another port of the
  client's address: dropped, and no plane's peer address moves.
- `forged_cm_reply`: REPLYs to the client naming its QPN, random keys and trailer: never acted
  on (`cm_unexpected_reply` once established).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mrc.wire import (
    CM_LISTEN_QPN,
    ERTH,
    NETH,
    PETH,
    SETH,
    TRAILER_SIZE,
    CCState,
    CmPacket,
    EndpointOp,
    EndpointPacket,
    KeyBlock,
    NackPacket,
    NackReason,
    Opcode,
    ProbePacket,
    SackMark,
    SackPacket,
    SecurityLevel,
    encode_data_header,
)
from tools.hostile.flow import Addr, Flow, Genuine
from tools.hostile.rawnet import ones_add, ones_sum

_M64 = (1 << 64) - 1


@dataclass(slots=True)
class Forgery:
    """One hostile datagram: `payload` from `src` to `dst`; `psum` its one's-complement sum
    when the generator already knows it (None: the sender computes it)."""

    kind: str
    src: Addr
    dst: Addr
    payload: bytes
    psum: int | None = None


class Scope:
    """What every generator shares: the live flow, the planes under attack and the randomness.

    Random payloads come from a pool of pre-summed blocks, so a forged 4 KiB payload costs no
    checksum work per datagram.
    """

    def __init__(self, flow: Flow, planes: list[int], rng: random.Random) -> None:
        if not planes:
            raise ValueError("no planes to attack")
        self.flow = flow
        self.planes = planes
        self.rng = rng
        self._blocks: dict[int, list[tuple[bytes, int]]] = {}

    @property
    def ready(self) -> bool:
        """The flow is ready and the client has been seen on an attacked plane (so every
        generator has something to work from there)."""
        return self.flow.ready and any(p in self.flow.client for p in self.planes)

    def plane(self) -> int:
        """A plane under attack on which the client has been seen (else any attacked plane)."""
        known = [p for p in self.planes if p in self.flow.client]
        return self.rng.choice(known or self.planes)

    def ends(self, plane: int) -> tuple[Addr, Addr]:
        """(client address, server address) on `plane`; the client's is its last one seen."""
        flow = self.flow
        client = flow.client.get(plane) or next(iter(flow.client.values()))
        return client, flow.server(plane)

    def random_payload(self, size: int) -> tuple[bytes, int]:
        """`size` random bytes and their sum, from a pool of 16 blocks per size."""
        pool = self._blocks.setdefault(size, [])
        if len(pool) < 16:
            block = self.rng.randbytes(size)
            pool.append((block, ones_sum(block)))
            return pool[-1]
        return self.rng.choice(pool)

    def trailer(self) -> bytes:
        """On a secured connection a random security trailer (a tag no key made) or, one time
        in two, none at all; on an unsecured one none (there is nothing to fake)."""
        if self.flow.secured and self.rng.random() < 0.5:
            return self.rng.randbytes(TRAILER_SIZE)
        return b""

    def ev(self) -> int:
        evs = self.flow.evs
        return self.rng.choice(evs) if evs else self.rng.getrandbits(32)

    def nonce(self) -> bytes:
        return self.rng.randbytes(16)


def _forgery(kind: str, src: Addr, dst: Addr, *parts: tuple[bytes, int | None]) -> Forgery:
    """Join pieces (each at an even offset, with its sum when known) into one Forgery."""
    data = b"".join(p for p, _ in parts)
    sums = [s if s is not None else ones_sum(p) for p, s in parts]
    return Forgery(kind, src, dst, data, ones_add(*sums))


# --- data --------------------------------------------------------------------------------------


def forged_data(sc: Scope) -> Iterator[Forgery]:
    """WRITE_MIDDLE packets for the PSNs the sender has not sent yet, at the VAs they will use.

    Within the message being sent, the forgery is exactly the packet the sender will send
    (PSN, MSN, VA, R_Key, length) but for its payload: on an unsecured connection that is the
    one the receiver cannot tell apart. Past the message's end (or when its FIRST was not
    seen) the PSN is anywhere in the window and the MSN is left as it was.
    """
    rng, flow = sc.rng, sc.flow
    while True:
        last = flow.latest
        assert last is not None and flow.server_qpn is not None
        mtu = flow.payload_mtu or len(last.payload) or 4096
        left = flow.left_in_message()
        # Never the message's LAST: the receiver checks a message when its LAST's immediate
        # arrives, and a forged LAST without it would hide the damage instead of showing it.
        # From the far half of what is left of the message: between sniffing and sending, a
        # sender at 350,000 packets a second moves tens of PSNs on, and a forgery for a PSN
        # that close arrives after the genuine packet (a duplicate, not a forgery placed).
        if left > 1:
            distance = rng.randrange(max(1, left // 2), left)
        else:
            distance = rng.randrange(1, flow.window)
        header = encode_data_header(
            opcode=Opcode.WRITE_MIDDLE,
            dest_qp=flow.server_qpn,
            psn=flow.psn_ahead(distance),
            ev=sc.ev(),
            a=False,
            rtx=False,
            rqmsn=last.rqmsn,
            msn=last.msn,
            va=(last.va + distance * mtu) & _M64,
            rkey=last.rkey,
            dma_length=last.dma_length,
            tx_timestamp=rng.getrandbits(16),
        )
        payload, psum = sc.random_payload(mtu)
        client, server = sc.ends(sc.plane())
        yield _forgery("forged_data", client, server, (header, None), (payload, psum),
                       (sc.trailer(), None))  # fmt: skip


def forged_trim(sc: Scope) -> Iterator[Forgery]:
    """Data headers with 1-64 payload bytes and no trailer: what a trimming switch leaves."""
    rng, flow = sc.rng, sc.flow
    while True:
        last = flow.latest
        assert last is not None and flow.server_qpn is not None
        distance = rng.randrange(-flow.window, flow.window)
        mtu = flow.payload_mtu or 4096
        header = encode_data_header(
            opcode=rng.choice((Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST)),
            dest_qp=flow.server_qpn,
            psn=flow.psn_ahead(distance),
            ev=sc.ev(),
            a=False,
            rtx=False,
            rqmsn=last.rqmsn,
            msn=last.msn,
            va=(last.va + distance * mtu) & _M64,
            rkey=last.rkey,
            dma_length=last.dma_length,
            tx_timestamp=rng.getrandbits(16),
        )
        client, server = sc.ends(sc.plane())
        yield _forgery("forged_trim", client, server, (header, None),
                       (rng.randbytes(rng.randrange(1, 65)), None))  # fmt: skip


# --- genuine datagrams, again or damaged --------------------------------------------------------


def _pick(sc: Scope) -> Genuine | None:
    """A recent genuine datagram on an attacked plane, three in four of them towards the
    server (None when that plane has carried nothing yet)."""
    to_server = sc.rng.random() < 0.75
    plane = sc.plane()
    return sc.flow.genuine(to_server, plane) or sc.flow.genuine(not to_server, plane)


def replay(sc: Scope) -> Iterator[Forgery]:
    while True:
        g = _pick(sc)
        if g is not None:
            yield Forgery("replay", g.src, g.dst, g.payload, g.psum)


def bitflip(sc: Scope) -> Iterator[Forgery]:
    """1-8 bits flipped anywhere in the datagram; the sum is updated word by word (RFC 1624)."""
    rng = sc.rng
    while True:
        g = _pick(sc)
        if g is None or not g.payload:
            continue
        data = bytearray(g.payload)
        psum = g.psum
        for _ in range(rng.randrange(1, 9)):
            bit = rng.randrange(len(data) * 8)
            i = bit >> 3
            w = i & ~1
            old = (data[w] << 8) | (data[w + 1] if w + 1 < len(data) else 0)
            data[i] ^= 1 << (bit & 7)
            new = (data[w] << 8) | (data[w + 1] if w + 1 < len(data) else 0)
            psum = ones_add(psum, ~old & 0xFFFF, new)
        yield Forgery("bitflip", g.src, g.dst, bytes(data), psum)


def truncate(sc: Scope) -> Iterator[Forgery]:
    rng = sc.rng
    while True:
        g = _pick(sc)
        if g is not None and g.payload:
            yield Forgery("truncate", g.src, g.dst, g.payload[: rng.randrange(len(g.payload))])


def extend(sc: Scope) -> Iterator[Forgery]:
    rng = sc.rng
    while True:
        g = _pick(sc)
        if g is None:
            continue
        extra = rng.randbytes(rng.randrange(1, 301))
        if len(g.payload) % 2:
            yield Forgery("extend", g.src, g.dst, g.payload + extra)
        else:
            yield _forgery("extend", g.src, g.dst, (g.payload, g.psum), (extra, None))


def noise(sc: Scope) -> Iterator[Forgery]:
    """Random bytes, 0-1500 of them, from the genuine peer's address on an attacked plane."""
    rng = sc.rng
    while True:
        client, server = sc.ends(sc.plane())
        data = rng.randbytes(rng.randrange(0, 1501))
        if rng.random() < 0.75:
            yield Forgery("noise", client, server, data)
        else:
            yield Forgery("noise", server, client, data)


# --- control packets ---------------------------------------------------------------------------


def forged_sack(sc: Scope) -> Iterator[Forgery]:
    """SACKs to the client (the writer) for PSNs it has not sent, bitmaps all ones."""
    rng, flow = sc.rng, sc.flow
    while True:
        assert flow.client_qpn is not None
        cack = flow.psn_ahead(rng.randrange(0, flow.window))
        ev = sc.ev()
        seth = SETH(
            ack_psn_offset=rng.randrange(-(1 << 15), 1 << 15),
            entropy=ev,
            cack_psn=cack,
            sack_offset=64 * rng.randrange(0, 16),
            sack_bitmap=_M64 if rng.random() < 0.75 else rng.getrandbits(64),
            m=rng.choice(list(SackMark)),
            pr=rng.random() < 0.25,
        )
        cc = CCState(
            tx_timestamp=rng.getrandbits(16),
            valid=rng.random() < 0.5,
            ooo_count=rng.getrandbits(15),
            rcv_cwnd_pen=rng.getrandbits(7),
            rcvd_bytes=rng.getrandbits(24),
        )
        pkt = SackPacket(flow.client_qpn, cack, ev, seth, cc, None)
        client, server = sc.ends(sc.plane())
        yield _forgery("forged_sack", server, client, (pkt.encode(), None), (sc.trailer(), None))


_NACK_REASONS = list(NackReason)


def forged_nack(sc: Scope) -> Iterator[Forgery]:
    """NACKs to the client for PSNs in flight: TRIMMED half of the time, else any reason."""
    rng, flow = sc.rng, sc.flow
    while True:
        assert flow.client_qpn is not None
        psn = flow.psn_ahead(-rng.randrange(0, flow.window))
        reason = NackReason.TRIMMED if rng.random() < 0.5 else rng.choice(_NACK_REASONS)
        ev = sc.ev()
        neth = NETH(reason, ev, psn, tx_timestamp=rng.getrandbits(16))
        pkt = NackPacket(flow.client_qpn, psn, ev, neth)
        client, server = sc.ends(sc.plane())
        yield _forgery("forged_nack", server, client, (pkt.encode(), None), (sc.trailer(), None))


def forged_probe(sc: Scope) -> Iterator[Forgery]:
    """RELIABILITY_PROBEs to the server, as if from the client's sender."""
    rng, flow = sc.rng, sc.flow
    while True:
        assert flow.server_qpn is not None
        peth = PETH(rng.getrandbits(16), tx_timestamp=rng.getrandbits(16))
        psn = flow.psn_ahead(rng.randrange(flow.window))
        pkt = ProbePacket(flow.server_qpn, psn, sc.ev(), peth)
        client, server = sc.ends(sc.plane())
        yield _forgery("forged_probe", client, server, (pkt.encode(), None), (sc.trailer(), None))


def forged_endpoint(sc: Scope) -> Iterator[Forgery]:
    """PORT_STATUS requests that say the sender can receive on no plane (or on random ones)."""
    rng, flow = sc.rng, sc.flow
    while True:
        assert flow.server_qpn is not None and flow.client_qpn is not None
        mask = 0 if rng.random() < 0.5 else rng.getrandbits(4)
        erth = ERTH(EndpointOp.PORT_STATUS, port_status_mask=mask, tx_timestamp=rng.getrandbits(16))
        client, server = sc.ends(sc.plane())
        if rng.random() < 0.5:
            pkt = EndpointPacket(Opcode.ENDPOINT_REQUEST, flow.server_qpn, sc.ev(), erth)
            src, dst = client, server
        else:
            pkt = EndpointPacket(Opcode.ENDPOINT_REQUEST, flow.client_qpn, sc.ev(), erth)
            src, dst = server, client
        yield _forgery("forged_endpoint", src, dst, (pkt.encode(), None), (sc.trailer(), None))


# --- connection management ---------------------------------------------------------------------


def _keys(sc: Scope, level: int, static: bytes | None = None) -> KeyBlock | None:
    """A key block of random keys (or the given static key with a random ephemeral one)."""
    if not level:
        return None
    return KeyBlock(sc.rng.randbytes(32), static or sc.rng.randbytes(32))


def forged_cm_request(sc: Scope) -> Iterator[Forgery]:
    """REQUESTs from the client's address with a static key nobody listed and random private
    data; one in four asks for a different security level than the genuine client did, and one
    in four claims the genuine client's static key (without its private key, an attacker can
    start a handshake but never finish it)."""
    rng, flow = sc.rng, sc.flow
    while True:
        genuine = flow.request
        assert genuine is not None
        level = genuine.cmh.security
        if rng.random() < 0.25:
            level = rng.choice([s for s in SecurityLevel if s != level])
        private = rng.randbytes(rng.randrange(0, 257))
        plane = sc.plane()
        cmh = dataclasses.replace(
            genuine.cmh,
            local_qpn=rng.getrandbits(24),
            initial_psn=rng.getrandbits(24),
            nonce=sc.nonce(),
            connection_id=rng.getrandbits(64),
            security=int(level),
            plane=plane,
            private_data_len=len(private),
        )
        genuine_keys = genuine.key_block
        static = genuine_keys.static if genuine_keys is not None and rng.random() < 0.25 else None
        pkt = CmPacket(Opcode.CM_REQUEST, CM_LISTEN_QPN, cmh, _keys(sc, level, static), private)
        client, server = sc.ends(plane)
        yield Forgery("forged_cm_request", client, server, pkt.encode())


def forged_cm_request_listed(sc: Scope) -> Iterator[Forgery]:
    """REQUESTs that name the genuine client's static key (it is on the server's allowlist:
    anyone can copy a public key) in the sealed form of docs/WIRE.md §7 revision 1.2, with a
    random seal: the server spends two X25519 operations on each within its handshake bucket,
    keeps nothing and answers nothing. On an unsecured run: REQUESTs with new nonces."""
    rng, flow = sc.rng, sc.flow
    while True:
        genuine = flow.request
        assert genuine is not None
        private = rng.randbytes(rng.randrange(0, 65))
        plane = sc.plane()
        cmh = dataclasses.replace(
            genuine.cmh,
            local_qpn=rng.getrandbits(24),
            nonce=sc.nonce(),
            connection_id=rng.getrandbits(64),
            plane=plane,
            private_data_len=len(private),
        )
        keys = genuine.key_block
        block = None if keys is None else KeyBlock(rng.randbytes(32), keys.static)
        pkt = CmPacket(Opcode.CM_REQUEST, CM_LISTEN_QPN, cmh, block, private).encode()
        if block is not None:
            pkt += rng.randbytes(12 + 16)  # where the timestamp and the tag go
        client, server = sc.ends(plane)
        yield Forgery("forged_cm_request_listed", client, server, pkt)


def replayed_cm_request(sc: Scope) -> Iterator[Forgery]:
    """A genuine REQUEST, verbatim, on an attacked plane from the client's address: the live
    connection's (a copy), or one of an earlier connection (a replay: `cm_replay`)."""
    rng, flow = sc.rng, sc.flow
    while True:
        assert flow.request_raw
        past = flow.past_requests
        request = rng.choice(past) if past and rng.random() < 0.5 else flow.request_raw
        plane = sc.plane()
        client, server = sc.ends(plane)
        yield Forgery("replayed_cm_request", client, server, request)


def junk_to_plane(sc: Scope) -> Iterator[Forgery]:
    """Short datagrams naming the live connection's server QPN, from another port of the
    client's address on the plane: a plane's peer address used to follow the first such
    datagram (for a plane the REQUEST had not reached yet), and the plane's traffic with it."""
    rng, flow = sc.rng, sc.flow
    while True:
        assert flow.server_qpn is not None
        plane = sc.plane()
        client, server = sc.ends(plane)
        port = rng.randrange(1024, 65535)
        src = (client[0], port if port != client[1] else port + 1)
        head = bytes([rng.choice(list(Opcode)).value, 0, 0xFF, 0xFF, 0])
        body = flow.server_qpn.to_bytes(3, "big") + rng.randbytes(4 + 2 * rng.randrange(0, 15))
        yield Forgery("junk_to_plane", src, server, head + body)


def forged_cm_reply(sc: Scope) -> Iterator[Forgery]:
    """REPLYs to the client naming its QPN, with random keys, private data and trailer."""
    rng, flow = sc.rng, sc.flow
    while True:
        genuine = flow.request
        assert genuine is not None and flow.client_qpn is not None
        private = rng.randbytes(rng.randrange(0, 33))
        cmh = dataclasses.replace(
            genuine.cmh,
            local_qpn=rng.getrandbits(24),
            remote_qpn=flow.client_qpn,
            nonce=sc.nonce(),
            plane=0xFF,
            private_data_len=len(private),
        )
        pkt = CmPacket(Opcode.CM_REPLY, flow.client_qpn, cmh, _keys(sc, cmh.security), private)
        client, server = sc.ends(sc.plane())
        yield _forgery("forged_cm_reply", server, client, (pkt.encode(), None),
                       (sc.trailer(), None))  # fmt: skip


def forged_cm_disconnect(sc: Scope) -> Iterator[Forgery]:
    """DISCONNECTs naming the live connection's QPNs, to the server and to the client."""
    rng, flow = sc.rng, sc.flow
    while True:
        genuine = flow.request
        assert genuine is not None and flow.server_qpn is not None
        assert flow.client_qpn is not None
        level = genuine.cmh.security
        to_server = rng.random() < 0.5
        local, remote = (
            (flow.client_qpn, flow.server_qpn) if to_server else (flow.server_qpn, flow.client_qpn)
        )
        cmh = dataclasses.replace(
            genuine.cmh, local_qpn=local, remote_qpn=remote, plane=0xFF, private_data_len=0
        )
        pkt = CmPacket(Opcode.CM_DISCONNECT, remote, cmh, _keys(sc, level), b"")
        client, server = sc.ends(sc.plane())
        src, dst = (client, server) if to_server else (server, client)
        yield _forgery("forged_cm_disconnect", src, dst, (pkt.encode(), None),
                       (sc.trailer(), None))  # fmt: skip


def forged_cm_reject(sc: Scope) -> Iterator[Forgery]:
    """REJECTs to the client, echoing the genuine REQUEST's nonce half of the time."""
    rng, flow = sc.rng, sc.flow
    while True:
        genuine = flow.request
        assert genuine is not None and flow.client_qpn is not None
        nonce = genuine.cmh.nonce if rng.random() < 0.5 else sc.nonce()
        cmh = dataclasses.replace(
            genuine.cmh,
            local_qpn=flow.server_qpn or 0,
            remote_qpn=flow.client_qpn,
            nonce=nonce,
            security=0,
            plane=0xFF,
            reject_reason=rng.randrange(1, 7),
            private_data_len=0,
        )
        pkt = CmPacket(Opcode.CM_REJECT, flow.client_qpn, cmh, None, b"")
        client, server = sc.ends(sc.plane())
        yield Forgery("forged_cm_reject", server, client, pkt.encode())


#: Every attack by name, with its weight in the default mix (forgeries ahead of the sender and
#: damaged genuine packets are the attacks that matter most, so they come most often).
KINDS: dict[str, tuple[Callable[[Scope], Iterator[Forgery]], int]] = {
    "forged_data": (forged_data, 6),
    "replay": (replay, 4),
    "bitflip": (bitflip, 4),
    "truncate": (truncate, 2),
    "extend": (extend, 2),
    "noise": (noise, 2),
    "forged_sack": (forged_sack, 2),
    "forged_nack": (forged_nack, 2),
    "forged_probe": (forged_probe, 2),
    "forged_endpoint": (forged_endpoint, 1),
    "forged_trim": (forged_trim, 2),
    "forged_cm_request": (forged_cm_request, 1),
    "forged_cm_disconnect": (forged_cm_disconnect, 1),
    "forged_cm_reject": (forged_cm_reject, 1),
    "forged_cm_request_listed": (forged_cm_request_listed, 1),
    "replayed_cm_request": (replayed_cm_request, 1),
    "junk_to_plane": (junk_to_plane, 1),
    "forged_cm_reply": (forged_cm_reply, 1),
}


class Mix:
    """The chosen kinds interleaved at random by weight; `next()` is the next hostile datagram."""

    def __init__(self, scope: Scope, kinds: list[str]) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise ValueError(f"unknown attack kind(s): {', '.join(unknown) or '(none given)'}")
        self._gens = {k: KINDS[k][0](scope) for k in kinds}
        # A flat table of names, each as often as its weight: one choice() per datagram.
        self._table = [k for k in kinds for _ in range(KINDS[k][1])]
        self._rng = scope.rng

    def next(self) -> Forgery:
        return next(self._gens[self._rng.choice(self._table)])
