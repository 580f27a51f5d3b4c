"""`mrc keygen`: a private key file with mode 0600 and its public key on stdout."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from mrc.cli import main
from mrc.core.secure.handshake import public_key
from mrc.node.keys import load_private_key


def test_keygen_writes_a_0600_key_and_prints_its_public_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "host.key")
    assert main(["keygen", path]) == 0
    printed = capsys.readouterr().out
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert base64.b64decode(printed.strip()) == public_key(load_private_key(path))
    assert main(["keygen", "--public", path]) == 0
    assert capsys.readouterr().out == printed


def test_keygen_never_overwrites_and_refuses_an_open_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "host.key")
    assert main(["keygen", path]) == 0
    before = Path(path).read_text()
    capsys.readouterr()
    assert main(["keygen", path]) == 1
    assert capsys.readouterr().err == (
        f"mrc keygen: error: {path} exists; not overwriting a key file (remove it first)\n"
    )
    assert Path(path).read_text() == before
    os.chmod(path, 0o644)
    assert main(["keygen", "--public", path]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "accessible by group or others (mode 0644)" in err
