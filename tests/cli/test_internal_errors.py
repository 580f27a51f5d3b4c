"""An exception inside the transport is a failure of the run, never a quiet counter: the bench
says so on stderr, reports it in `end.mrc.internal_errors` and exits 70 even when every byte
arrived intact."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mrc.cli import main
from mrc.core.endpoint import Endpoint
from mrc.wire.bth import DATA_OPCODES

DATA_VALUES = {int(op) for op in DATA_OPCODES}


def test_a_core_exception_fails_the_bench_with_exit_70(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # io hands every receive batch to the core endpoint through this method. The demo
    # server's batches carry data packets, the client's only acknowledgements.
    real = Endpoint.receive_reads
    calls = {"n": 0}

    def flaky(self: Endpoint, plane: int, reads: list[Any], now: float) -> list[Any]:
        if reads and reads[0][0][0] in DATA_VALUES:
            calls["n"] += 1
            if calls["n"] == 20:
                raise KeyError("injected by the test")
        return real(self, plane, reads, now)

    monkeypatch.setattr(Endpoint, "receive_reads", flaky)
    rc = main(["bench", "--demo", "-n", "16M", "-J"])
    out, err = capsys.readouterr()
    assert rc == 70
    # The receiving side (the demo's server) hit it; the one line names it and the exception.
    (line,) = [ln for ln in err.splitlines() if "of the demo server" in ln]
    assert line.startswith("mrc bench: 1 internal error(s) in the transport of the demo server")
    assert "KeyError: 'injected by the test'" in line
    doc = json.loads(out[out.index("{") :])
    assert doc["end"]["mrc"]["internal_errors"] == 0  # the client's own io had none
