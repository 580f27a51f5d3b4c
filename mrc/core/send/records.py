"""Send records: one posted WRITE (`OutMessage`) and one transmission of a flowcell
(`SentCell`: consecutive PSNs sent together on one EV), the state of each of its packets, and
what a packet's opcode and timestamp are.

Plain data shared by the sender (which owns the records and their life cycle) and the plane
monitor (which stamps probes with the same clock); nothing here sends or decides.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Final

from ...wire.ack import Syndrome, syndrome_ok
from ...wire.bth import PSN_MOD, Opcode
from ..errors import LocalProtocolError

PSN_MASK: Final = PSN_MOD - 1


def tx_timestamp(now: float) -> int:
    """docs/WIRE.md §3 TSETH: the sender's clock in microseconds modulo 2^16."""
    return int(now * 1e6) & 0xFFFF


@dataclass(eq=False, slots=True)
class OutMessage:
    msn: int
    # builtins.memoryview: compiled, a dataclass field's type is looked up by this name.
    src: builtins.memoryview
    remote_va: int
    rkey: int
    imm: int | None
    npkts: int
    first_psn: int = -1
    last_psn: int = -1
    #: Packets handed out so far (new transmissions only).
    sent: int = 0
    #: Packets acknowledged so far.
    acked: int = 0
    #: The outcome once its AETH arrived: 0, or the failure (docs/WIRE.md §4).
    status: int | None = None
    #: BAD_RKEY or OUT_OF_BOUNDS, when a NACK said so before the AETH's remote access error.
    failure: int | None = None
    #: When to resend the LAST to fetch a missing AETH, and the interval in force.
    completion_deadline: float | None = None
    completion_interval: float = 0.0

    # Written out (the dataclass keeps it): compiled, the `__init__` dataclasses generates
    # stays interpreted, about 0.6 µs of every posted WRITE.
    def __init__(
        self, msn: int, src: builtins.memoryview, remote_va: int, rkey: int, imm: int | None,
        npkts: int,
    ) -> None:  # fmt: skip
        self.msn = msn
        self.src = src
        self.remote_va = remote_va
        self.rkey = rkey
        self.imm = imm
        self.npkts = npkts
        self.first_psn = self.last_psn = -1
        self.sent = self.acked = 0
        self.status = self.failure = None
        self.completion_deadline = None
        self.completion_interval = 0.0

    @property
    def length(self) -> int:
        return len(self.src)

    def settle(self, syndrome: int) -> None:
        """Take the outcome its AETH carried (docs/WIRE.md §4) as `status`."""
        self.status = outcome(syndrome, self.failure)


def outcome(syndrome: int, failure: int | None) -> int:
    """A message's completion status from its AETH (docs/WIRE.md §4): 0 for any IBTA ACK
    (0x00-0x1F); for a remote access error, the NACK reason that named it (BAD_RKEY or
    OUT_OF_BOUNDS) when one came; else the syndrome itself."""
    if syndrome_ok(syndrome):
        return 0
    if syndrome == Syndrome.NAK_REMOTE_ACCESS and failure is not None:
        return failure
    return syndrome


def new_message(
    msn: int, src: memoryview, remote_va: int, rkey: int, imm: int | None, mtu: int
) -> OutMessage:
    """A posted WRITE of `src`, checked: LocalProtocolError names the first bad argument."""
    length = len(src)
    if not 1 <= length <= 1 << 31:
        raise LocalProtocolError(f"a WRITE moves 1..2^31 bytes, not {length}")
    if not (remote_va >= 0 and remote_va + length <= 1 << 64):
        raise LocalProtocolError(f"remote VA {remote_va:#x} + {length} does not fit 64 bits")
    if not 0 <= rkey < 1 << 32:
        raise LocalProtocolError(f"R_Key {rkey} is not a 32-bit value")
    if imm is not None and not 0 <= imm < 1 << 32:
        raise LocalProtocolError(f"immediate {imm} is not a 32-bit value")
    return OutMessage(
        msn=msn,
        src=src,
        remote_va=remote_va,
        rkey=rkey,
        imm=imm,
        npkts=(length + mtu - 1) // mtu,
    )


#: A run of a flowcell's packets that belong to one message: the message, the index in it of
#: the run's first packet, and how many packets (consecutive indexes, consecutive PSNs). A
#: flowcell of large WRITEs is one run or two; one of small WRITEs is a run per message.
#: Runs, not a tuple per packet: the per-packet tuple and its boxed ints cost the sender
#: about 65 ns a packet.
CellRun = tuple[OutMessage, int, int]


@dataclass(eq=False, slots=True)
class SentCell:
    """One transmission of a flowcell: `n` packets (consecutive PSNs from `psn`, in `runs`)
    sent at `sent_at` on `ev` as one GSO batch, or two when its packets differ in header size
    (`late`); a resend is a cell of one packet with `rtx` set.

    Per packet, a bit (bit i for packet i): `acked`, or `lost` (declared lost; its resend, if
    any, is a record of its own). The others are in flight (`open`, `open_bytes`). Every packet
    is `size` payload bytes but the last, which is `last` (docs/DESIGN.md §11)."""

    psn: int
    n: int
    runs: list[CellRun]
    ev: int
    plane: int
    sent_at: float
    #: Send order across the whole session; a flowcell's packets share it.
    seq: int
    tx_ts: int
    rtx: bool
    size: int
    last: int
    open: int
    open_bytes: int
    acked: int = 0
    lost: int = 0
    #: Packets acted on for one TRIMMED NACK already (docs/WIRE.md §4: at most one each).
    trim_nacked: int = 0
    #: Packets that left in the flowcell's second GSO batch, after all of the first
    #: (framing.cut_flowcell); 0: the flowcell left in PSN order.
    late: int = 0

    # Written out (OutMessage says why): one per flowcell sent.
    def __init__(
        self, psn: int, n: int, runs: list[CellRun], ev: int, plane: int, sent_at: float,
        seq: int, tx_ts: int, rtx: bool, size: int, last: int, open: int, open_bytes: int,
    ) -> None:  # fmt: skip
        self.psn = psn
        self.n = n
        self.runs = runs
        self.ev = ev
        self.plane = plane
        self.sent_at = sent_at
        self.seq = seq
        self.tx_ts = tx_ts
        self.rtx = rtx
        self.size = size
        self.last = last
        self.open = open
        self.open_bytes = open_bytes
        self.acked = 0
        self.lost = 0
        self.trim_nacked = 0
        self.late = 0

    def length(self, i: int) -> int:
        """Payload bytes of packet `i`."""
        return self.size if i < self.n - 1 else self.last

    def packet(self, i: int) -> tuple[OutMessage, int]:
        """Packet `i`'s message and its index in that message."""
        for msg, first, count in self.runs:
            if i < count:
                return msg, first + i
            i -= count
        raise IndexError(i)

    def sent_before(self, i: int) -> int:
        """The packets that left before packet `i`: those of its GSO batch before it in PSN
        order, and the whole first batch if `i` left in the second (`late`)."""
        before = (1 << i) - 1
        late = self.late
        if not late:
            return before
        if late >> i & 1:
            return (((1 << self.n) - 1) & ~late) | (before & late)
        return before & ~late

    def sent_last(self, mask: int) -> int:
        """Of the packets in `mask` (not 0), the one that left last."""
        later = mask & self.late
        return (later or mask).bit_length() - 1

    def sent_after(self, i: int, j: int) -> bool:
        """Did packet `i` leave after packet `j`?"""
        late = self.late
        return (i + (self.n if late >> i & 1 else 0)) > (j + (self.n if late >> j & 1 else 0))

    def open_mask(self) -> int:
        """The packets still in flight: neither acknowledged nor declared lost."""
        return ((1 << self.n) - 1) & ~(self.acked | self.lost)

    def lose(self, mask: int) -> tuple[list[int], int]:
        """Declare the packets in `mask` still in flight lost: their PSNs, and their bytes."""
        mask &= self.open_mask()
        psns: list[int] = []
        lost = i = 0
        bits = mask
        while bits:
            if bits & 1:
                lost += self.length(i)
                psns.append((self.psn + i) & PSN_MASK)
            bits >>= 1
            i += 1
        self.lost |= mask
        self.open -= len(psns)
        self.open_bytes -= lost
        return psns, lost


def new_cell(
    runs: list[CellRun], n: int, psn: int, mtu: int, ev: int, plane: int, now: float,
    seq: int, tx_ts: int, rtx: bool, late: int = 0,
) -> SentCell:  # fmt: skip
    """The record of the `n` packets of `runs` (non-empty), PSNs from `psn`, sent at `now` on
    `ev`; `late`: those that left in a second GSO batch."""
    msg, first, count = runs[-1]
    index = first + count - 1
    last = mtu if index < msg.npkts - 1 else len(msg.src) - index * mtu
    if n == 1:
        size = last
    else:
        msg, index, _ = runs[0]
        size = mtu if index < msg.npkts - 1 else len(msg.src) - index * mtu
    total = size * (n - 1) + last
    cell = SentCell(psn, n, runs, ev, plane, now, seq, tx_ts, rtx, size, last, n, total)
    cell.late = late
    return cell


def opcode_for(msg: OutMessage, index: int) -> Opcode:
    """The opcode of packet `index` of `msg` (docs/WIRE.md §2)."""
    if msg.npkts == 1:
        return Opcode.WRITE_ONLY if msg.imm is None else Opcode.WRITE_ONLY_IMM
    if index == 0:
        return Opcode.WRITE_FIRST
    if index == msg.npkts - 1:
        return Opcode.WRITE_LAST if msg.imm is None else Opcode.WRITE_LAST_IMM
    return Opcode.WRITE_MIDDLE
