"""`mrc bench --security` between real processes on 4 loopback planes: keys from files and
per-run keys, what -J reports, the unsecured run's warning, and the refusals (unlisted client,
unexpected server key, different levels, key flags without security, a key file others can
read)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchproc import Server, client, json_docs

from mrc.cli import main
from mrc.node.keys import create_private_key, public_key_text


def keys(tmp_path: Path, name: str) -> tuple[str, str]:
    """A private key file and its public key (base64)."""
    path = str(tmp_path / f"{name}.key")
    return path, public_key_text(create_private_key(path))


def run_json(port: int, *args: str) -> dict[str, Any]:
    proc = client(port, "-J", "-n", "32M", "--verify", *args)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@pytest.mark.parametrize("level", ["auth", "encrypt"])
def test_keys_from_files_authenticate_both_ends(tmp_path: Path, level: str) -> None:
    srv_key, srv_pub = keys(tmp_path, "server")
    cli_key, cli_pub = keys(tmp_path, "client")
    peers = tmp_path / "server.pub"
    peers.write_text(srv_pub + "\n")
    server = Server("-J", "-1", "--security", level, "--key", srv_key, "--peer-key", cli_pub)
    try:
        doc = run_json(server.port, "--security", level, "--key", cli_key, "--peer-key", str(peers))
    finally:
        rc, out, err = server.stop()
    assert rc == 0, err
    ts = doc["start"]["test_start"]
    assert (ts["security"], ts["key"], ts["peer_key"], ts["peer_key_checked"]) == (
        level, cli_pub, srv_pub, True
    )
    assert doc["end"]["mrc"]["integrity"] == "ok"
    drops = doc["end"]["mrc"]["drops_by_reason"]
    assert not {"auth", "replay", "replay_window"} & set(drops), drops
    (sdoc,) = json_docs(out)
    sts = sdoc["start"]["test_start"]
    assert (sts["security"], sts["key"], sts["peer_key"]) == (level, srv_pub, cli_pub)


def test_per_run_keys_say_what_they_do_not_protect_against() -> None:
    server = Server("-1", "--security", "auth")
    try:
        proc = client(server.port, "-n", "16M", "--verify", "--security", "auth", "-i", "0")
    finally:
        rc, out, err = server.stop()
    assert proc.returncode == 0 and rc == 0, proc.stderr + err
    for text in (proc.stdout, out):  # the server repeats its banner after each test
        lines = {ln for ln in text.splitlines() if ln.startswith("Security: auth")}
        (line,) = lines
        assert line.endswith("no --peer-key: protects against tampering, not impersonation")
    assert "integrity: ok" in proc.stdout
    assert "drops:" not in proc.stdout  # the REPLY's copies from the other planes are no drop


def test_an_unsecured_run_warns_that_anyone_can_write() -> None:
    server = Server("-1")
    try:
        proc = client(server.port, "-n", "4M", "-i", "0")
    finally:
        rc, out, err = server.stop()
    assert proc.returncode == 0 and rc == 0, proc.stderr + err
    for text in (proc.stdout, out):
        (line,) = {ln for ln in text.splitlines() if ln.startswith("Security:")}
        assert line.startswith("Security: none: anyone who can send to this run's planes can write")


def test_refusals_are_one_line(tmp_path: Path) -> None:
    srv_key, _ = keys(tmp_path, "server")
    cli_key, cli_pub = keys(tmp_path, "client")
    _, other_pub = keys(tmp_path, "other")
    stranger_key, _ = keys(tmp_path, "stranger")
    server = Server("--security", "encrypt", "--key", srv_key, "--peer-key", cli_pub)
    runs = []
    # docs/WIRE.md §6-§7 revision 1.2: a REJECT of a secured attempt is unauthenticated, so it
    # is a hint and the client keeps trying until its own timeout; a REQUEST sealed to a key
    # the server does not hold is not answered at all.
    wait = ("--connect-timeout", "0.5")
    try:
        # A client the server does not list: REJECT unknown peer, a hint.
        runs.append(client(server.port, "-n", "1M", "--security", "encrypt", "--key", stranger_key,
                           *wait))  # fmt: skip
        assert runs[-1].stderr.endswith("within 0.5 s\n")
        # A listed client, but the server's key is not the one it names: never answered.
        runs.append(client(server.port, "-n", "1M", "--security", "encrypt", "--key", cli_key,
                           "--peer-key", other_pub, *wait))  # fmt: skip
        assert runs[-1].stderr.endswith("within 0.5 s\n")
        # A different level: REJECT security policy, a hint.
        runs.append(client(server.port, "-n", "1M", "--security", "auth", "--key", cli_key, *wait))
        assert runs[-1].stderr.endswith("within 0.5 s\n")
    finally:
        _, _, err = server.stop()
    assert all(r.returncode == 1 and r.stderr.count("\n") == 1 for r in runs)
    assert "Traceback" not in err


def test_key_flags_need_security_and_an_open_key_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, _ = keys(tmp_path, "host")
    assert main(["bench", "-c", "127.0.0.2", "--key", key]) == 2
    assert "--key and --peer-key need --security auth or encrypt" in capsys.readouterr().err
    Path(key).chmod(0o644)
    assert main(["bench", "-c", "127.0.0.2", "--security", "auth", "--key", key]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"mrc bench: key file {key} is accessible by group or others (mode 0644); "
        f"run: chmod 600 {key}\n"
    )
