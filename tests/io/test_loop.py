"""Event-loop selection (uvloop when importable, the stdlib loop on request) and the frozen heap."""

from __future__ import annotations

import gc
import importlib.util
import weakref

import pytest

from mrc.io.loop import GC_THRESHOLD0, freeze_heap, loop_name, new_event_loop


def test_stdlib_loop_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MRC_LOOP", "asyncio")
    loop = new_event_loop()
    try:
        assert loop_name(loop) == "asyncio"
    finally:
        loop.close()


def test_uvloop_when_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MRC_LOOP", raising=False)
    loop = new_event_loop()
    try:
        expected = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
        assert loop_name(loop) == expected
    finally:
        loop.close()


def test_freeze_heap_keeps_what_is_alive_out_of_collections_and_thaws_it_next_time() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the cyclic collector can free it

    freed: list[bool] = []
    threshold = gc.get_threshold()
    try:
        node = Node()
        ref = weakref.ref(node, lambda _: freed.append(True))
        freeze_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_THRESHOLD0, *threshold[1:])
        del node
        gc.collect()  # a frozen cycle is never collected...
        assert ref() is not None and not freed
        freeze_heap()  # ...until the next call thaws it (a server's next test)
        assert ref() is None and freed == [True]
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
