"""A simulated host is built with its event handler, a connection is made with its own, and
nothing assigns `on_event` from outside after construction (issue 33; docs/DESIGN.md §1:
"objects are built whole for their phase").

The check reads the syntax trees of mrc/ and of the simulator's and experiments' tests: the
one assignment to an attribute named `on_event` allowed is `self.on_event = ...` in an
`__init__`. The stories below show where a handler comes in instead: `Host(...)` and the
builders that pass it on (`Network.add_host`, `Network.pair`, `topology.build`, `clos`), and
`Host.connect(..., on_event=...)`.
"""

from __future__ import annotations

import ast
import struct
import sys
from pathlib import Path

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, Event, WriteCompleted
from mrc.core.session import Session
from mrc.sim import FabricSpec, Host, LinkParams, Network, build, clos
from mrc.sim.network import EventHook

ROOT = Path(__file__).resolve().parents[2]
# The assignment targets of a statement, as tests/core/test_construction.py reads them.
sys.path.insert(0, str(ROOT / "tests" / "core"))
from test_construction import _targets  # noqa: E402

#: Where no handler may be patched in: the package, and the tests of sim and experiments.
CHECKED = ("mrc", "tests/sim", "tests/experiments")
FIELD = "on_event"
REPLY = struct.Struct(">QI")


def patched_handlers(tree: ast.Module) -> list[int]:
    """Lines that assign `<expr>.on_event` other than `self.on_event` in an `__init__`."""
    allowed: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
            for node in ast.walk(fn):
                for t in _targets(node):
                    if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self":
                        allowed.add(id(t))
    return sorted(
        t.lineno
        for node in ast.walk(tree)
        for t in _targets(node)
        if isinstance(t, ast.Attribute) and t.attr == FIELD and id(t) not in allowed
    )


def _sources() -> list[Path]:
    return [p for folder in CHECKED for p in sorted((ROOT / folder).rglob("*.py"))]


def test_no_handler_is_assigned_after_construction() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _sources()
        for line in patched_handlers(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    ]
    assert found == []


def test_the_check_catches_each_form() -> None:
    sample = (
        "class H:\n"
        "    def __init__(self, on_event):\n"
        "        self.on_event = on_event\n"  # allowed: the constructor's own
        "    def later(self, f):\n"
        "        self.on_event = f\n"  # 5
        "def f(a, b, hook):\n"
        "    a.on_event = hook\n"  # 7
        "    a.on_event, x = hook, 1\n"  # 8
        "    a.host.on_event: object = hook\n"  # 9
        "    a.on_receive = hook\n"  # another field: not this check's
        "    a.on_event(None)\n"  # a call, not an assignment
        "def g(self, other):\n"
        "    other.on_event = None\n"  # 13
    )
    assert patched_handlers(ast.parse(sample)) == [5, 7, 8, 9, 13]


# -- where handlers come in ----------------------------------------------------------------


def _record(into: list[tuple[str, int, str]]) -> EventHook:
    def on_event(host: Host, session: Session, event: Event) -> None:
        into.append((host.name, session.qpn, type(event).__name__))

    return on_event


def test_a_host_is_built_with_its_handler_and_a_builder_passes_it_to_the_named_host() -> None:
    seen: list[tuple[str, int, str]] = []
    net = Network(seed=1)
    a, b = net.pair(1, LinkParams(latency=5e-6), handlers={"b": _record(seen)})
    assert (a.on_event, b.on_event is not None) == (None, True)
    config = SessionConfig(plane_mask=0b1)
    b.listen(config, accept=lambda _pd: b"")
    a.connect(b, config)
    net.drive(0.01)
    assert [(name, kind) for name, _, kind in seen] == [("b", "ConnectionEstablished")]
    assert seen[0][1] == b.session().qpn
    assert len(a.events) == len(b.events) == 1  # both record; only b's handler is told

    fab = build(
        Network(seed=1),
        FabricSpec(hosts=2, planes=1, hosts_per_rack=2, tier1=1),
        handlers={"h1": _record(seen)},
    )
    assert [h.on_event is not None for h in fab.hosts] == [False, True]
    small = clos(Network(seed=1), planes=1, racks=1, hosts_per_rack=2, tier1=1,
                 handlers={"h0": _record(seen)})  # fmt: skip
    assert [h.on_event is not None for h in small.hosts] == [True, False]
    assert Host(net, "c", _record(seen)).on_event is not None


def test_a_connection_made_with_its_handler_gives_it_that_session_s_events_only() -> None:
    """The host's handler hears every session of the host; a connection's own handler hears
    its session, from its first event, after the host's."""
    host_seen: list[tuple[str, int, str]] = []
    own_seen: list[tuple[str, int, str]] = []
    net = Network(seed=2)
    fab = clos(net, planes=1, racks=1, hosts_per_rack=3, tier1=1,
               handlers={"h1": _record(host_seen)})  # fmt: skip
    h0, h1, h2 = fab.hosts
    config = SessionConfig(plane_mask=0b1)
    dst = h2.regions.register(bytearray(4096))
    src = h1.regions.register(bytearray(4096))
    h0.listen(config, accept=lambda _pd: b"")
    h2.listen(config, accept=lambda _pd: REPLY.pack(dst.base_va, dst.rkey))

    def write(host: Host, session: Session, event: Event) -> None:
        _record(own_seen)(host, session, event)
        if isinstance(event, ConnectionEstablished):
            va, rkey = REPLY.unpack(event.private_data)
            session.post_write(src, 0, 4096, va, rkey)

    to_h0 = h1.connect(h0, config)
    to_h2 = h1.connect(h2, config, on_event=write)
    net.drive(0.01)
    assert [(q, kind) for _, q, kind in own_seen] == [
        (to_h2.qpn, "ConnectionEstablished"),
        (to_h2.qpn, "WriteCompleted"),
    ]
    assert sorted((q, kind) for _, q, kind in host_seen) == sorted(
        [(to_h0.qpn, "ConnectionEstablished"), *((q, k) for _, q, k in own_seen)]
    )
    assert h1.events_of(WriteCompleted) and h0.on_event is None
