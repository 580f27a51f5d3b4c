"""Every argument check of `Session.post_write`, one story each: a bad WRITE is refused with a
`LocalProtocolError` naming the bad argument, and a refused WRITE consumes no MSN and sends nothing.

The remote side's own checks (a bad R_Key or range at the target) are receiver stories
(test_receiver.py); these are the writer's, before anything reaches the wire.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import pytest

from mrc.core.config import SessionConfig
from mrc.core.errors import LocalProtocolError
from mrc.core.events import ConnectionEstablished
from mrc.core.send.sender import MAX_OUTSTANDING_MESSAGES
from mrc.core.session import Session
from mrc.sim import Network
from mrc.wire.bth import DATA_OPCODES


class Writer:
    """`a` connected to `b` over 2 simulated planes at t = 0.001; nothing posted yet."""

    def __init__(self) -> None:
        self.net = Network(seed=3)
        self.a, self.b = self.net.pair(2)
        self.dst = self.b.regions.register(bytearray(1 << 16))
        self.src = self.a.regions.register(bytearray(1 << 16))
        cfg = SessionConfig(plane_mask=0b11)
        self.b.listen(cfg)
        self.session: Session = self.a.connect(self.b, cfg)
        self.net.drive(0.001)
        assert self.a.events_of(ConnectionEstablished)

    def post(self, **kw: int | None) -> int:
        args: dict[str, int | None] = {
            "offset": 0,
            "length": 4096,
            "remote_va": self.dst.base_va,
            "rkey": self.dst.rkey,
            "imm": None,
        }
        args.update(kw)
        return self.session.post_write(self.src, **args)  # type: ignore[arg-type]

    def data_sent(self) -> int:
        txs = self.session.datagrams_to_send(self.net.now)
        return sum(1 for t in txs if t.data[0] in DATA_OPCODES)


@pytest.fixture
def w() -> Iterator[Writer]:
    yield Writer()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"length": 0}, r"a WRITE moves 1\.\.2\^31 bytes, not 0"),
        ({"length": -1}, r"offset 0 \+ length -1 outside region of 65536 bytes"),
        ({"offset": 65535, "length": 2}, r"offset 65535 \+ length 2 outside region"),
        ({"offset": -4096}, r"offset -4096 \+ length 4096 outside region"),
        ({"remote_va": (1 << 64) - 100}, r"remote VA 0xff+9c \+ 4096 does not fit 64 bits"),
        ({"remote_va": -1}, r"remote VA -0x1 \+ 4096 does not fit 64 bits"),
        ({"rkey": 1 << 32}, r"R_Key 4294967296 is not a 32-bit value"),
        ({"rkey": -1}, r"R_Key -1 is not a 32-bit value"),
        ({"imm": 1 << 32}, r"immediate 4294967296 is not a 32-bit value"),
        ({"imm": -5}, r"immediate -5 is not a 32-bit value"),
    ],
)
def test_a_bad_argument_is_refused_and_costs_nothing(
    w: Writer, args: dict[str, int], message: str
) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        w.post(**args)
    assert w.data_sent() == 0
    assert w.post() == 0  # the refused WRITE took no MSN


def test_a_write_longer_than_2_pow_31_is_refused_even_from_a_region_that_holds_it(
    w: Writer,
) -> None:
    # An untouched anonymous mapping: address space only, no memory is committed.
    big = mmap.mmap(-1, (1 << 31) + 4096)
    try:
        region = w.a.regions.register(memoryview(big), prefault_pages=False)
        with pytest.raises(LocalProtocolError, match=r"not 2147483649"):
            w.session.post_write(region, 0, (1 << 31) + 1, w.dst.base_va, w.dst.rkey)
        w.a.regions.deregister(region)
        region.view.release()
    finally:
        big.close()


def test_the_outstanding_write_cap_refuses_the_one_past_it_until_a_completion(w: Writer) -> None:
    for i in range(MAX_OUTSTANDING_MESSAGES):
        assert w.post(length=1, offset=i % 4096) == i & 0xFFFF
    with pytest.raises(LocalProtocolError, match=r"too many WRITEs outstanding \(2\^15\)"):
        w.post(length=1)
    # Let the transfer run: completions free the cap again.
    w.a.flush(w.session)
    w.net.drive(0.5)
    assert w.session.idle
    assert w.post(length=1) == MAX_OUTSTANDING_MESSAGES & 0xFFFF


def test_a_write_on_a_session_that_is_not_established_is_refused() -> None:
    net = Network(seed=4)
    a, b = net.pair(1)
    src = a.regions.register(bytearray(4096))
    session = a.connect(b, SessionConfig(plane_mask=0b1))  # nobody listens: never established
    with pytest.raises(LocalProtocolError, match="cannot post a WRITE on a connecting session"):
        session.post_write(src, 0, 4096, 0, 0)
    session.close(net.now)
    with pytest.raises(LocalProtocolError, match="cannot post a WRITE on a closed session"):
        session.post_write(src, 0, 4096, 0, 0)
