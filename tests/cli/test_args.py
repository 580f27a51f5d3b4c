"""`mrc bench` flag checking: every usage error is one line on stderr and exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from benchproc import env

from mrc.cli import main
from mrc.units import parse_size

BAD = [
    ([], "missing command"),
    (["bench"], "missing role"),
    (["bench", "-s", "-c", "127.0.0.2"], "exactly one of"),
    (["bench", "-s"], "-s needs -B"),
    (["bench", "-c", "127.0.0.2,127.0.0.3", "-B", "127.0.0.6"], "one local address per plane"),
    (["bench", "-c", "127.0.0.2", "-t", "1", "-n", "1M"], "mutually exclusive"),
    (["bench", "-c", "127.0.0.2", "-i", "0.001"], "at least 0.01"),
    (["bench", "-c", "127.0.0.2", "-i", "abc"], "not a number of seconds"),
    (["bench", "-c", "127.0.0.2", "-n", "12X"], "unknown size suffix"),
    (["bench", "-c", "127.0.0.2", "--bytes=-5"], "not a byte count"),
    (["bench", "-c", "127.0.0.2", "-l", "0"], "must be positive"),
    (["bench", "-c", "127.0.0.2", "-l", "1G"], "-l must be"),
    (["bench", "-c", "127.0.0.2", "--inject", "plane-up=1@2"], "--inject wants"),
    (["bench", "-c", "127.0.0.2,127.0.0.3", "--inject", "plane-down=2@1"], "only 2 planes"),
    (["bench", "-c", "127.0.0.2", "--payload-mtu", "100"], "payload MTU must be 256..8192"),
    (["bench", "-c", "127.0.0.2", "--mpr", "0"], "MPR must be 1..255"),
    (["bench", "-c", "127.0.0.2", "-p", "70000"], "port must be 0..65535"),
    (["bench", "-c", "127.0.0.2", "-p", "0"], "-p must name"),
    (["bench", "-c", "127.0.0.2", "--frobnicate"], "unrecognized arguments"),
    (["bench", "-c", "127.0.0.2", "-1"], "-1 is a server flag"),
    (["bench", "-s", "-B", "127.0.0.2", "-R"], "-R is a client flag"),
    (["bench", "-s", "-B", "127.0.0.2", "-t", "3"], "client flags"),
    (["bench", "--demo", "-c", "127.0.0.2"], "exactly one of"),
    (["bench", "-c", "127.0.0.2,,127.0.0.3"], "empty address"),
    (["bench", "-c", "127.0.0.2", "--spray", "nope"], "invalid choice: 'nope'"),
    (["bench", "-c", "::1", "--ev-encoding", "sport"], "invalid choice: 'sport'"),
    (["bench", "-c", "x", "--daemon", "/tmp/s", "--ev-encoding", "flowlabel"],
     "--ev-encoding does not apply with --daemon"),
]


@pytest.mark.parametrize(("argv", "needle"), BAD)
def test_usage_errors_are_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert lines[0].startswith("mrc")


@pytest.mark.parametrize("value", ["0", "65", "many"])
def test_a_bad_mrc_flowcell_is_a_usage_error(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MRC_FLOWCELL", value)
    assert main(["bench", "-c", "127.0.0.2", "-n", "1M"]) == 2
    err = capsys.readouterr().err
    assert err == f"mrc bench: error: MRC_FLOWCELL must be 1..64, got {value!r}\n"


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--help"]) == 0
    assert "-c ADDR" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("1K", 1024),
        ("256M", 256 << 20),
        ("1G", 1 << 30),
        ("1.5K", 1536),
        ("64KiB", 65536),
        ("2MiB", 2 << 20),
        ("10MB", 10**7),
        ("1kB", 1000),
        ("3g", 3 << 30),
    ],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


def run_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
    )


def test_real_process_usage_error() -> None:
    proc = run_cli("bench", "-c", "127.0.0.2", "-n", "lots")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_bind_address_not_available() -> None:
    proc = run_cli("bench", "-s", "-B", "127.0.0.2,192.0.2.1", "-p", "0")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "mrc bench: cannot bind 192.0.2.1 port 0 (plane 1): Cannot assign requested address"
    ]


def test_ev_in_the_flow_label_needs_ipv6_planes() -> None:
    proc = run_cli("bench", "-s", "-B", "127.0.0.2", "-p", "0", "--ev-encoding", "flowlabel")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "mrc bench: EVs in the flow label need IPv6 on every plane; plane 0 is 127.0.0.2"
    ]


def test_bind_address_in_use() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
        proc = run_cli("bench", "-s", "-B", "127.0.0.2", "-p", str(port))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"mrc bench: cannot bind 127.0.0.2 port {port} (plane 0): Address already in use"
    )


def test_unresolvable_server_address() -> None:
    proc = run_cli("bench", "-c", "no-such-host.invalid", "--connect-timeout", "1")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "cannot resolve" in proc.stderr


def test_refused_when_no_server() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    proc = run_cli("bench", "-c", "127.0.0.2", "-p", str(port), "-t", "1")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "connection refused by 127.0.0.2" in proc.stderr


def test_no_answer_from_silent_peer() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # bound, never answers
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
        proc = run_cli("bench", "-c", "127.0.0.2", "-p", str(port), "--connect-timeout", "0.5")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"mrc bench: no answer from 127.0.0.2 port {port} within 0.5 s"


def test_the_lazy_parser_lists_the_same_commands_as_the_full_one() -> None:
    from mrc.cli import COMMANDS, build_parser

    full = build_parser().format_help()
    assert build_parser([]).format_help() == full
    for name in COMMANDS:
        assert build_parser([name]).format_help() == full, name


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "import sys; from mrc.cli import main\n"
        "try:\n    main(['bench', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('mrc.daemon', 'mrc.plot',"
        " 'mrc.cli.daemon', 'mrc.cli.plot', 'mrc.cli.dissect', 'mrc.cli.bench.daemon'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(),
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
