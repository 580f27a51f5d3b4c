"""Event-loop selection: uvloop when importable, the stdlib loop on request."""

from __future__ import annotations

import importlib.util

import pytest

from mrc.io.loop import loop_name, new_event_loop


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
