"""The daemon's configuration: a good file reads back exactly, and every class of mistake is
one line naming its key (and `mrc daemon` exits 2 with that line)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from mrc.cli import main
from mrc.daemon.config import ConfigError, load_config, parse_config, parse_listen

GOOD = """
host = "a"
port = 4800
security = "none"

[[planes]]
address = "127.0.0.2"
[[planes]]
address = "127.0.0.3"
interface = "lo"

[[peers]]
name = "b"
addresses = ["127.0.0.6", "127.0.0.7"]
public_key = "{key}"

[[peers]]
name = "c"
addresses = ["127.0.0.10", "127.0.0.11"]
port = 4900

[control]
socket = "/tmp/mrc-test.sock"
allowed_uids = [1000, 1001]

[metrics]
listen = "[::1]:9464"

[protocol]
cc = "none"
spray = "oblivious"
plane_balance = "adaptive"
payload_mtu = 1024
ev_per_plane = 8
mpr = 4
flowcell = 8

[limits]
max_clients = 10
max_regions = 20
max_outstanding_writes = 30
drain_seconds = 1.5
max_regions_per_client = 5
max_region_bytes_per_uid = 1048576
max_clients_per_uid = 2
""".replace("{key}", base64.b64encode(bytes(range(32))).decode())


def test_a_good_file_reads_back_every_value(tmp_path: Path) -> None:
    path = tmp_path / "mrc.toml"
    path.write_text(GOOD)
    c = load_config(str(path))
    assert c.host == "a" and c.port == 4800 and c.security == "none" and c.security_written
    planes = [(p.address, p.interface) for p in c.planes]
    assert planes == [("127.0.0.2", None), ("127.0.0.3", "lo")]
    assert [(p.name, p.addresses, p.port) for p in c.peers] == [
        ("b", ("127.0.0.6", "127.0.0.7"), 4800),
        ("c", ("127.0.0.10", "127.0.0.11"), 4900),
    ]
    assert c.peers[0].public_key is not None and c.peers[1].public_key is None
    control = (c.control.socket, c.control.mode, c.control.group)
    assert control == ("/tmp/mrc-test.sock", 0o600, None)
    assert c.control.allowed_uids == frozenset({1000, 1001})
    assert c.metrics == ("::1", 9464)
    s = c.session_config()
    assert (s.cc, s.spray, s.plane_balance, s.payload_mtu, s.ev_per_plane, s.mpr, s.flowcell) == (
        "none", "oblivious", "adaptive", 1024, 8, 4, 8
    )
    assert s.plane_mask == 0b11
    lim = c.limits
    assert (lim.max_clients, lim.max_regions, lim.max_outstanding_writes, lim.drain_seconds) == (
        10, 20, 30, 1.5
    )
    quotas = (lim.max_regions_per_client, lim.max_region_bytes_per_uid, lim.max_clients_per_uid)
    assert quotas == (5, 1 << 20, 2)
    assert lim.max_connections_per_client == 256  # the defaults DAEMON.md gives
    assert (lim.max_endpoints_per_client, lim.max_endpoints_per_uid) == (64, 512)


def test_defaults_secure_by_default() -> None:
    c = parse_config({"host": "a", "planes": [{"address": "::1"}]})
    assert c.security == "encrypt" and not c.security_written
    assert c.port == 4791 and c.control.socket == "/run/mrc/mrc.sock" and c.control.mode == 0o600
    assert c.metrics is None and c.peers == ()
    assert c.control.allowed_uids is None


def base() -> dict[str, Any]:
    return {
        "host": "a",
        "security": "none",
        "planes": [{"address": "127.0.0.2"}, {"address": "127.0.0.3"}],
        "peers": [{"name": "b", "addresses": ["127.0.0.6", "127.0.0.7"]}],
    }


def edit(path: str, value: Any) -> dict[str, Any]:
    """`base()` with the value at a dotted path (list indices as numbers) replaced; a value
    of `...` deletes the key."""
    doc = base()
    keys = path.split(".")
    node: Any = doc
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    last = keys[-1]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return doc


MISTAKES = [
    # (where, value, the key the line names, words it must contain)
    ("host", ..., "host", "missing"),
    ("host", "a b", "host", "letters"),
    ("host", 7, "host", "letters"),
    ("port", 0, "port", "1..65535"),
    ("port", "4791", "port", "integer"),
    ("planes", ..., "planes", "missing"),
    ("planes", [], "planes", "1..32"),
    ("planes", [{"address": f"127.0.1.{i}"} for i in range(33)], "planes", "1..32"),
    ("planes", {"address": "127.0.0.2"}, "planes", "array of tables"),
    ("planes.1.address", "127.0.0.999", "planes[1].address", "not an IP address"),
    ("planes.1.address", "127.0.0.2", "planes[1].address", "another plane"),
    ("planes.0.address", ..., "planes[0].address", "missing"),
    ("planes.0.interface", "a/b", "planes[0].interface", "interface name"),
    ("planes.0.mtu", 9000, "planes[0].mtu", "unknown key"),
    ("peers", {"name": "b"}, "peers", "array of tables"),
    ("peers.0.name", "a", "peers[0].name", "own host name"),
    ("peers.0.name", ..., "peers[0].name", "missing"),
    ("peers.0.addresses", ["127.0.0.6"], "peers[0].addresses", "1 addresses for 2 planes"),
    ("peers.0.addresses", "127.0.0.6", "peers[0].addresses", "list"),
    ("peers.0.addresses", ["127.0.0.6", "x"], "peers[0].addresses[1]", "not an IP address"),
    ("peers.0.port", 70000, "peers[0].port", "1..65535"),
    ("peers.0.public_key", "abc", "peers[0].public_key", "32 bytes"),
    ("peers.0.public_key", base64.b64encode(b"x" * 31).decode(), "peers[0].public_key", "32"),
    ("control.socket", "/" + "s" * 200, "control.socket", "107 bytes"),
    ("control.mode", "0666", "control.mode", "0600"),
    ("control.mode", 384, "control.mode", "string"),
    ("control.group", "mrc-no-such-group", "control.group", "only applies"),
    ("control.sock", "/x", "control.sock", "unknown key"),
    ("metrics.listen", "localhost:9464", "metrics.listen", "not an IP address"),
    ("metrics.listen", "127.0.0.1", "metrics.listen", "ADDR:PORT"),
    ("metrics.listen", "127.0.0.1:99999", "metrics.listen", "0..65535"),
    ("protocol.cc", "cubic", "protocol.cc", "one of"),
    ("protocol.spray", "random", "protocol.spray", "one of"),
    ("protocol.plane_balance", "weighted", "protocol.plane_balance", "one of"),
    ("protocol.payload_mtu", 100, "protocol.payload_mtu", "256..8192"),
    ("protocol.ev_per_plane", 0, "protocol.ev_per_plane", "1..255"),
    ("protocol.mpr", 256, "protocol.mpr", "1..255"),
    ("protocol.flowcell", 65, "protocol.flowcell", "1..64"),
    ("protocol.window", 1, "protocol.window", "unknown key"),
    ("limits.max_clients", 0, "limits.max_clients", "1..65536"),
    ("limits.max_regions", -1, "limits.max_regions", "integer"),
    ("limits.max_outstanding_writes", 1 << 16, "limits.max_outstanding_writes", "1..32768"),
    ("limits.drain_seconds", 61, "limits.drain_seconds", "0..60"),
    ("limits.drain_seconds", "2", "limits.drain_seconds", "number"),
    ("limits.max_regions_per_uid", 0, "limits.max_regions_per_uid", "1..1048576"),
    ("limits.max_endpoints_per_client", "8", "limits.max_endpoints_per_client", "integer"),
    ("limits.max_region_bytes_per_client", 1 << 45, "limits.max_region_bytes_per_client",
     "1..17592186044416"),
    ("limits.max_clients_per_user", 4, "limits.max_clients_per_user", "unknown key"),
    ("control.allowed_uids", 1000, "control.allowed_uids", "list of uids"),
    ("control.allowed_uids", [1000, -1], "control.allowed_uids", "list of uids"),
    ("control.allowed_uids", ["root"], "control.allowed_uids", "list of uids"),
    ("security", "tls", "security", "encrypt, auth, none"),
    ("security", "encrypt", "peers[0].public_key", "missing: security = \"encrypt\""),
    ("security", ..., "peers[0].public_key", "accepts only peers whose key is listed"),
    ("psk_file", "", "psk_file", "non-empty"),
    ("key_file", "", "key_file", "non-empty"),
    ("pathz", "x.json", "pathz", "unknown key"),
    ("paths", "/nonexistent/paths.json", "paths", "nonexistent"),
]


@pytest.mark.parametrize(("where", "value", "key", "words"), MISTAKES)
def test_every_mistake_is_one_line_naming_its_key(
    where: str, value: Any, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(edit(where, value))
    text = str(err.value)
    assert err.value.key == key
    assert text.startswith(f"{key}: ") and words in text, text
    assert "\n" not in text


def test_a_second_peer_with_the_same_name_is_refused() -> None:
    doc = base()
    doc["peers"].append({"name": "b", "addresses": ["127.0.0.8", "127.0.0.9"]})
    with pytest.raises(ConfigError, match=r"^peers\[1\]\.name: peer 'b' is listed twice$"):
        parse_config(doc)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("host = \"a\"\n[[planes]\n", "not valid TOML"),
        ("host = 'a'\nhost = 'b'\n", "not valid TOML"),
        (b"host = \"\xff\"\n", "not UTF-8"),
    ],
)
def test_a_file_that_is_not_toml_is_one_line(tmp_path: Path, text: str | bytes,
                                              message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=message) as err:
        load_config(str(path))
    assert "\n" not in str(err.value)


def test_mrc_daemon_prints_the_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mrc.toml"
    path.write_text(GOOD.replace('address = "127.0.0.3"', 'address = "127.0.0.300"'))
    assert main(["daemon", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    line = "planes[1].address: not an IP address: '127.0.0.300'"
    assert err == f"mrc daemon: config {path}: {line}\n"
    assert main(["daemon", "--config", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mrc daemon: config ") and "cannot read" in err and err.count("\n") == 1
    path.write_text(GOOD)
    assert main(["daemon", "--config", str(path), "--metrics", "nohost:1"]) == 2
    assert capsys.readouterr().err == "mrc daemon: --metrics: 'nohost' is not an IP address\n"
    assert main(["daemon", "--config", str(path), "--check"]) == 0


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("::1:9464", "[::1]9464", "1.2.3.4:", "1.2.3.4:x"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_relative_file_names_are_taken_from_the_files_directory(tmp_path: Path) -> None:
    conf = tmp_path / "etc"
    conf.mkdir()
    path = conf / "mrc.toml"
    path.write_text(
        'host = "a"\nkey_file = "keys/a.key"\npsk_file = "/abs/psk"\n'
        '[[planes]]\naddress = "127.0.0.2"\n[control]\nsocket = "../run/mrc.sock"\n'
    )
    c = load_config(str(path))
    assert c.key_file == str(conf / "keys" / "a.key")
    assert c.psk_file == "/abs/psk"
    assert c.control.socket == str(tmp_path / "run" / "mrc.sock")
