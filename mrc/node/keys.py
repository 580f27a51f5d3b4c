"""Key files for secured connections (docs/DESIGN.md §8), WireGuard style.

A private key file holds one X25519 private key as base64 on one line and must be readable by
its owner only: `load_private_key` refuses a file owned by another user than the one running
(who else owns it could replace the key) or that grants any permission to group or others,
with one line naming the fix. `create_private_key` writes a new one with mode 0600 (and
never overwrites), `load_or_create_private_key` is the daemon's "create on first start". Peer
public keys come from a file (one base64 key a line; `#` starts a comment) or from a base64
string given directly; a pre-shared key file is held to the private key's rules. Every problem
is a `NodeError` with one line.

What it leaves to others: key agreement and the `Identity` the core uses
(mrc.core.secure.handshake), deciding which peers a host lists (the daemon's config,
`mrc bench --peer-key`).
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from collections.abc import Iterable

from mrc.core.secure.handshake import Identity, public_key

from .errors import NodeError

KEY_SIZE = 32
#: The only permissions a private key or PSK file may have.
PRIVATE_MODE = 0o600


def encode_key(raw: bytes) -> str:
    """A 32-byte key as the base64 text key files and command lines use."""
    return base64.b64encode(raw).decode("ascii")


def decode_key(text: str, what: str) -> bytes:
    """The 32 bytes of a base64 key; NodeError naming `what` otherwise."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise NodeError(f"{what} is not base64") from None
    if len(raw) != KEY_SIZE:
        raise NodeError(f"{what} is {len(raw)} bytes, a key is {KEY_SIZE}")
    return raw


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except UnicodeDecodeError:
        raise NodeError(f"{what} {path} is not a text key file") from None
    except OSError as exc:
        raise NodeError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def _check_private(path: str, what: str) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise NodeError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if st.st_uid != os.geteuid():
        raise NodeError(
            f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}); "
            f"run: chown {os.geteuid()} {path}"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise NodeError(
            f"{what} {path} is accessible by group or others (mode {mode:04o}); "
            f"run: chmod 600 {path}"
        )


def load_private_key(path: str) -> bytes:
    """The private key in `path`, refusing a file others may read."""
    _check_private(path, "key file")
    return decode_key(_first_key(_read(path, "key file")), f"key file {path}")


def create_private_key(path: str, key: bytes | None = None) -> bytes:
    """Write a new private key (random unless `key` is given) to `path` with mode 0600;
    refuses to overwrite an existing file. Returns the key."""
    key = os.urandom(KEY_SIZE) if key is None else key
    if len(key) != KEY_SIZE:
        raise NodeError(f"a private key is {KEY_SIZE} bytes, got {len(key)}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    except FileExistsError:
        raise NodeError(f"{path} exists; not overwriting a key file (remove it first)") from None
    except OSError as exc:
        raise NodeError(f"cannot create key file {path}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, PRIVATE_MODE)  # whatever the umask
        os.write(fd, (encode_key(key) + "\n").encode("ascii"))
    finally:
        os.close(fd)
    return key


def load_or_create_private_key(path: str) -> tuple[bytes, bool]:
    """(key, created): the key in `path`, or a new one written there if there is none."""
    if not os.path.lexists(path):
        return create_private_key(path), True
    return load_private_key(path), False


def _keys_in(text: str) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def _first_key(text: str) -> str:
    keys = _keys_in(text)
    return keys[0] if keys else ""


def load_public_keys(spec: str) -> list[bytes]:
    """Peer public keys from `spec`: a file of base64 keys (one a line) if such a file
    exists, else one base64 key given directly."""
    if os.path.exists(spec):
        keys = _keys_in(_read(spec, "public key file"))
        if not keys:
            raise NodeError(f"public key file {spec} holds no key")
        return [decode_key(k, f"a key in {spec}") for k in keys]
    return [decode_key(spec, f"{spec!r} (neither a key file nor a base64 key)")]


def load_public_key(spec: str) -> bytes:
    """The one peer public key of `spec` (a file or a base64 string)."""
    keys = load_public_keys(spec)
    if len(keys) != 1:
        raise NodeError(f"{spec} holds {len(keys)} keys, expected one")
    return keys[0]


def load_psk(path: str) -> bytes:
    """A pre-shared key file: base64 of 32 bytes, held to the private key's permissions."""
    _check_private(path, "pre-shared key file")
    return decode_key(_first_key(_read(path, "pre-shared key file")), f"pre-shared key {path}")


def load_identity(
    key_file: str,
    peers: Iterable[str] | None,
    psk_file: str | None = None,
) -> Identity:
    """The core `Identity` from a private key file, the peer public keys it accepts (files or
    base64 strings; None accepts any key) and an optional pre-shared key file."""
    allowed = None if peers is None else [k for spec in peers for k in load_public_keys(spec)]
    psk = load_psk(psk_file) if psk_file is not None else None
    return Identity(load_private_key(key_file), allowed, psk, os.urandom)


def public_key_text(private_key: bytes) -> str:
    """The base64 public key of a private key (what `mrc keygen` prints)."""
    return encode_key(public_key(private_key))
