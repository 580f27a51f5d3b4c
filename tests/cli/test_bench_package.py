"""The bench package's seams, without sockets: frozen options, the writer's and receiver's rules
that the in-process and daemon paths share, and the table of modes."""

from __future__ import annotations

import argparse
import dataclasses
import importlib

import pytest

from mrc.cli import build_parser
from mrc.cli.bench.modes import MODES
from mrc.cli.bench.options import CORE, BenchOptions, options_from
from mrc.cli.bench.proto import MAX_MESSAGES, Pattern
from mrc.cli.bench.receiver import Verifier
from mrc.cli.bench.writer import WritePlan
from mrc.core.config import DEFAULT_FLOWCELL
from mrc.daemon.config import DEFAULT_PORT, ProtocolConfig


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(["bench"]).parse_args(["bench", *argv])


def test_options_are_frozen_and_built_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MRC_FLOWCELL", raising=False)
    opts = options_from(parse("--demo"))
    # The demo's defaults are in the options as built, not patched in later.
    assert (opts.mode, opts.total_bytes, opts.verify) == ("demo", 256 << 20, True)
    assert opts.flowcell == DEFAULT_FLOWCELL
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.verify = False  # type: ignore[misc]
    latency = options_from(parse("-c", "127.0.0.2", "--latency"))
    assert (latency.mode, latency.msg_size, latency.iterations) == ("latency", 64, 10_000)
    daemon = options_from(parse("-c", "peer", "--daemon", "/tmp/x.sock"))
    assert (daemon.mode, daemon.server, daemon.duration) == ("daemon", ("peer",), 10.0)


def test_bench_and_daemon_share_their_defaults() -> None:
    opts = BenchOptions(role="client")
    proto = ProtocolConfig()
    assert opts.port == DEFAULT_PORT == 4791
    assert opts.flowcell == proto.flowcell == DEFAULT_FLOWCELL
    for name in ("payload_mtu", "ev_per_plane", "mpr", "spray", "plane_balance", "cc"):
        assert getattr(opts, name) == getattr(proto, name) == getattr(CORE, name), name


def test_the_write_plan_numbers_slots_pattern_and_end() -> None:
    pattern = Pattern(7, 1000)
    plan = WritePlan(msg_size=1000, total_bytes=2500, slots=2, pattern=pattern)
    assert plan.count == 3
    assert [plan.length(n) for n in range(4)] == [1000, 1000, 500, 0]
    assert [plan.more(n) for n in range(4)] == [True, True, True, False]
    assert [plan.slot_offset(n) for n in range(3)] == [0, 1000, 0]
    assert [plan.source_offset(n) for n in range(3)] == [pattern.offset(n) for n in range(3)]
    assert plan.imm(2) == 2
    timed = WritePlan(msg_size=1000, total_bytes=0, slots=4)
    assert timed.count is None and timed.imm(5) is None and timed.source_offset(5) == 0
    assert timed.more(MAX_MESSAGES - 1) and not timed.more(MAX_MESSAGES)


def test_the_verifier_checks_order_and_bytes() -> None:
    pattern = Pattern(3, 8)
    plan = WritePlan(msg_size=8, total_bytes=0, slots=2, pattern=pattern)
    region = bytearray(16)

    def land(n: int, corrupt: bool = False) -> None:
        off, src = plan.slot_offset(n), plan.source_offset(n)
        region[off : off + 8] = pattern.stream[src : src + 8]
        if corrupt:
            region[off] ^= 0xFF

    v = Verifier(pattern, 8, 0, 2)
    for n in range(3):
        land(n)
        assert v.arrived(n, memoryview(region)) == 8
    land(3, corrupt=True)
    v.arrived(3, memoryview(region))
    land(5)
    v.arrived(5, memoryview(region))  # 4 never came: 5 is out of order
    assert (v.verified, v.mismatches, v.next_expected) == (3, 2, 6)


def test_every_mode_names_modules_with_a_main() -> None:
    assert set(MODES) == {"bulk", "sweep", "latency", "daemon", "demo"}
    for mode in MODES.values():
        for name in (mode.client, mode.server):
            assert callable(importlib.import_module(f"mrc.cli.bench.{name}").main), name
        for name in (mode.writer, mode.receiver):
            importlib.import_module(f"mrc.cli.bench.{name}")
