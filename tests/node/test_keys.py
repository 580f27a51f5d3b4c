"""Key files (mrc.node.keys): mode 0600, refusal of a file others may read, public keys from
files or base64, and the Identity they make."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mrc.core.secure.handshake import Identity
from mrc.node import NodeError
from mrc.node.keys import (
    create_private_key,
    encode_key,
    load_identity,
    load_or_create_private_key,
    load_private_key,
    load_psk,
    load_public_key,
    load_public_keys,
    public_key_text,
)


def test_a_new_key_file_is_mode_0600_whatever_the_umask_and_is_never_overwritten(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "host.key")
    old = os.umask(0)
    try:
        key = create_private_key(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_private_key(path) == key and len(key) == 32
    with pytest.raises(NodeError, match="exists; not overwriting"):
        create_private_key(path)
    assert load_private_key(path) == key


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o602])
def test_a_key_file_group_or_others_may_access_is_refused_with_one_line(
    tmp_path: Path, mode: int
) -> None:
    path = str(tmp_path / "host.key")
    create_private_key(path)
    os.chmod(path, mode)
    with pytest.raises(NodeError) as err:
        load_private_key(path)
    message = str(err.value)
    assert message == (
        f"key file {path} is accessible by group or others (mode {mode:04o}); "
        f"run: chmod 600 {path}"
    )
    os.chmod(path, 0o400)
    assert len(load_private_key(path)) == 32  # owner-only is fine


def test_create_if_missing_makes_the_key_once(tmp_path: Path) -> None:
    path = str(tmp_path / "sub.key")
    key, created = load_or_create_private_key(path)
    assert created
    assert load_or_create_private_key(path) == (key, False)


def test_bad_key_files_and_strings_are_one_line(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.key")
    with pytest.raises(NodeError, match=r"cannot read key file .*nope\.key: No such file"):
        load_private_key(missing)
    short = tmp_path / "short.key"
    short.write_text(encode_key(b"x" * 16) + "\n")
    short.chmod(0o600)
    with pytest.raises(NodeError, match="is 16 bytes, a key is 32"):
        load_private_key(str(short))
    with pytest.raises(NodeError, match="neither a key file nor a base64 key"):
        load_public_key("not-a-key")
    empty = tmp_path / "peers"
    empty.write_text("# nobody yet\n")
    with pytest.raises(NodeError, match="holds no key"):
        load_public_keys(str(empty))


def test_public_keys_come_from_a_file_of_several_or_from_base64(tmp_path: Path) -> None:
    k1, k2 = Identity(b"\x01" * 32).public_key, Identity(b"\x02" * 32).public_key
    peers = tmp_path / "peers"
    peers.write_text(f"# the lab\n{encode_key(k1)}  # host 1\n\n{encode_key(k2)}\n")
    assert load_public_keys(str(peers)) == [k1, k2]
    assert load_public_key(encode_key(k2)) == k2
    with pytest.raises(NodeError, match="holds 2 keys, expected one"):
        load_public_key(str(peers))


def test_an_identity_from_files_accepts_the_listed_peers_and_mixes_the_psk(
    tmp_path: Path,
) -> None:
    key_file = str(tmp_path / "a.key")
    key = create_private_key(key_file)
    psk_file = tmp_path / "psk"
    psk_file.write_text(encode_key(b"p" * 32))
    psk_file.chmod(0o644)
    peer = Identity(b"\x07" * 32).public_key
    with pytest.raises(NodeError, match=r"pre-shared key file .* accessible by group or others"):
        load_psk(str(psk_file))
    psk_file.chmod(0o600)
    identity = load_identity(key_file, [encode_key(peer)], str(psk_file))
    assert identity.public_key == Identity(key).public_key
    assert public_key_text(key) == encode_key(identity.public_key)
    assert identity.allows(peer) and not identity.allows(b"\x00" * 32)
    assert identity.psk == b"p" * 32
    assert load_identity(key_file, None).allows(b"\x00" * 32)  # no allowlist: any key
