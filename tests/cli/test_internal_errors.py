"""An exception inside the transport is a failure of the run, never a quiet counter: the bench
says so on stderr, reports it in `end.mrc.internal_errors` and exits 70 even when every byte
arrived intact."""

from __future__ import annotations

import json

import pytest

from mrc.cli import main
from mrc.core.receiver import Receiver


def test_a_core_exception_fails_the_bench_with_exit_70(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = Receiver.on_data_bytes
    calls = {"n": 0}

    def flaky(self: Receiver, *args: object) -> bool:
        calls["n"] += 1
        if calls["n"] == 50:
            raise KeyError("injected by the test")
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Receiver, "on_data_bytes", flaky)
    rc = main(["bench", "--demo", "-n", "16M", "-J"])
    out, err = capsys.readouterr()
    assert rc == 70
    # The receiving side (the demo's server) hit it; the one line names it and the exception.
    (line,) = [ln for ln in err.splitlines() if "of the demo server" in ln]
    assert line.startswith("mrc bench: 1 internal error(s) in the transport of the demo server")
    assert "KeyError: 'injected by the test'" in line
    doc = json.loads(out[out.index("{") :])
    assert doc["end"]["mrc"]["internal_errors"] == 0  # the client's own io had none
