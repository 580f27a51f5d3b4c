"""The peer daemon's TOML configuration: reading it and checking every key.

Holds `DaemonConfig` and its parts (planes, peers, control socket, metrics, protocol defaults,
limits, security keys) and `load_config(path)`. Every mistake is a `ConfigError` whose text is
one line naming the key, e.g. `planes[1].address: not an IP address`; unknown keys are
mistakes too (a misspelt limit must not silently fall back to its default). The protocol keys
are checked against the same names and ranges as `mrc bench` (the core's registries and
`SessionConfig.validate`).

Relative file names (paths, key_file, psk_file, control.socket) are taken from the directory
of the file.

What it leaves to others: opening anything the file names (the path table is parsed here so a
bad one fails at start, but sockets, key files and the control socket are `service`'s and
`control`'s), and reacting to a reload (SIGHUP re-reads the file with `load_config`, the daemon
takes only the peer list from it).
"""

from __future__ import annotations

import base64
import binascii
import grp
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from mrc.core.cc.control import cc_names
from mrc.core.config import (
    DEFAULT_FLOWCELL,
    MAX_FLOWCELL,
    MAX_PAYLOAD_MTU,
    MIN_PAYLOAD_MTU,
    SessionConfig,
)
from mrc.core.errors import LocalProtocolError
from mrc.core.paths.balance import balance_names
from mrc.core.paths.spray import spray_names
from mrc.io.pathtable import PathTable, PathTableError
from mrc.wire.bth import ROCE_PORT

__all__ = [
    "ConfigError",
    "ControlConfig",
    "DaemonConfig",
    "Limits",
    "PeerConfig",
    "PlaneConfig",
    "ProtocolConfig",
    "load_config",
    "parse_listen",
    "peer_keys",
]

DEFAULT_PORT = ROCE_PORT
DEFAULT_SOCKET = "/run/mrc/mrc.sock"
DEFAULT_KEY_FILE = "/var/lib/mrc/private.key"
#: The kernel's limit on a Unix socket path (sun_path is 108 bytes with its NUL).
MAX_SOCKET_PATH = 107
MAX_PLANES = 32
#: The core refuses more WRITEs outstanding on one connection (sender.py, 2^15).
MAX_OUTSTANDING_CAP = 1 << 15
SECURITY_LEVELS = ("encrypt", "auth", "none")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_IFNAME = re.compile(r"^[^\s/:]{1,15}$")

_TOP_KEYS = {
    "host",
    "port",
    "paths",
    "planes",
    "peers",
    "control",
    "metrics",
    "protocol",
    "limits",
    "security",
    "key_file",
    "psk_file",
}


class ConfigError(Exception):
    """A mistake in the configuration: `key` is where, the text says what (one line)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


@dataclass(frozen=True, slots=True)
class PlaneConfig:
    address: str
    interface: str | None = None


@dataclass(frozen=True, slots=True)
class PeerConfig:
    name: str
    #: One address per plane, in plane order.
    addresses: tuple[str, ...]
    port: int
    #: The peer's static X25519 public key (base64 of 32 bytes), for the allowlist.
    public_key: str | None = None

    @property
    def key(self) -> bytes | None:
        """`public_key` as its 32 bytes (checked when the file was read)."""
        return None if self.public_key is None else base64.b64decode(self.public_key)


@dataclass(frozen=True, slots=True)
class ControlConfig:
    socket: str = DEFAULT_SOCKET
    mode: int = 0o600
    group: str | None = None
    #: The uids whose processes may use the socket (the daemon's own and root always may);
    #: None: any the socket's mode and group let in.
    allowed_uids: frozenset[int] | None = None


_CORE = SessionConfig()


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    cc: str = _CORE.cc
    spray: str = _CORE.spray
    plane_balance: str = _CORE.plane_balance
    payload_mtu: int = _CORE.payload_mtu
    ev_per_plane: int = _CORE.ev_per_plane
    mpr: int = _CORE.mpr
    #: As `mrc bench`'s default: as many packets per GSO batch as one call holds.
    flowcell: int = DEFAULT_FLOWCELL


@dataclass(frozen=True, slots=True)
class Limits:
    max_clients: int = 256
    max_regions: int = 4096
    max_outstanding_writes: int = 4096
    drain_seconds: float = 2.0
    #: MRC connections (either direction) the daemon holds at once.
    max_connections: int = 1024
    #: The largest region one application may register, and all regions together.
    max_region_bytes: int = 1 << 36
    max_total_region_bytes: int = 1 << 38
    #: What one control client may hold (docs/DAEMON.md, "Configuration").
    max_regions_per_client: int = 1024
    max_region_bytes_per_client: int = 1 << 36
    max_connections_per_client: int = 256
    max_endpoints_per_client: int = 64
    #: What the clients of one uid may hold together (from SO_PEERCRED); the admin uids (the
    #: daemon's own and root) are held only to the per-client and global limits.
    max_clients_per_uid: int = 128
    max_regions_per_uid: int = 2048
    max_region_bytes_per_uid: int = 1 << 37
    max_connections_per_uid: int = 512
    max_endpoints_per_uid: int = 512


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    path: str
    host: str
    planes: tuple[PlaneConfig, ...]
    port: int = DEFAULT_PORT
    peers: tuple[PeerConfig, ...] = ()
    paths_file: str | None = None
    path_table: PathTable | None = field(default=None, compare=False)
    control: ControlConfig = ControlConfig()
    #: (address, port) of the Prometheus endpoint, or None.
    metrics: tuple[str, int] | None = None
    protocol: ProtocolConfig = ProtocolConfig()
    limits: Limits = Limits()
    security: str = "encrypt"
    #: True when the file wrote `security` (the default is encrypt; "none" must be asked for).
    security_written: bool = False
    key_file: str = DEFAULT_KEY_FILE
    psk_file: str | None = None

    def peer(self, name: str) -> PeerConfig | None:
        for p in self.peers:
            if p.name == name:
                return p
        return None

    def session_config(self) -> SessionConfig:
        """The connection settings every connection of this daemon offers."""
        proto = self.protocol
        return SessionConfig(
            plane_mask=(1 << len(self.planes)) - 1,
            payload_mtu=proto.payload_mtu,
            mpr=proto.mpr,
            ev_per_plane=proto.ev_per_plane,
            spray=proto.spray,
            plane_balance=proto.plane_balance,
            cc=proto.cc,
            flowcell=proto.flowcell,
            security=self.security,
        ).validate()


def peer_keys(peers: tuple[PeerConfig, ...]) -> list[bytes]:
    """The raw public keys of the peers that list one (checked base64 of 32 bytes)."""
    return [key for key in (p.key for p in peers) if key is not None]


# -- reading ------------------------------------------------------------------------------------


def load_config(path: str) -> DaemonConfig:
    """Read and check the file; `ConfigError` (one line, naming the key) on any mistake."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError("", f"cannot read: {exc.strerror or exc}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("", "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"not valid TOML: {exc}") from None
    return parse_config(doc, path, os.path.dirname(os.path.abspath(path)))


def parse_config(doc: dict[str, Any], path: str = "<config>", base: str = ".") -> DaemonConfig:
    """Check a parsed document; relative file names are taken from `base` (the directory of
    the file), so the daemon finds them whatever its working directory (`/` under systemd)."""
    _no_unknown(doc, _TOP_KEYS, "")
    host = _name(doc, "host", "host", required=True)
    assert host is not None
    port = _int(doc, "port", "port", 1, 65535, DEFAULT_PORT)
    planes = _planes(doc.get("planes"))
    peers = _peers(doc.get("peers"), len(planes), port, host)
    paths_file = _file(doc, "paths", base)
    table = None
    if paths_file is not None:
        try:
            table = PathTable.load(paths_file)
        except PathTableError as exc:
            raise ConfigError("paths", str(exc)) from None
    control = _control(_table(doc, "control"), base)
    metrics = None
    metrics_doc = _table(doc, "metrics")
    _no_unknown(metrics_doc, {"listen"}, "metrics")
    listen = _str(metrics_doc, "listen", "metrics.listen")
    if listen is not None:
        try:
            metrics = parse_listen(listen)
        except ValueError as exc:
            raise ConfigError("metrics.listen", str(exc)) from None
    protocol = _protocol(_table(doc, "protocol"))
    limits = _limits(_table(doc, "limits"))
    security = _str(doc, "security", "security") or "encrypt"
    if security not in SECURITY_LEVELS:
        raise ConfigError("security", f"must be one of {', '.join(SECURITY_LEVELS)}")
    if security != "none":
        for i, peer in enumerate(peers):
            if peer.public_key is None:
                raise ConfigError(
                    f"peers[{i}].public_key",
                    f"missing: security = \"{security}\" accepts only peers whose key is "
                    "listed (mrc keygen prints one)",
                )
    key_file = _file(doc, "key_file", base) or DEFAULT_KEY_FILE
    psk_file = _file(doc, "psk_file", base)
    config = DaemonConfig(
        path=path,
        host=host,
        planes=planes,
        port=port,
        peers=peers,
        paths_file=paths_file,
        path_table=table,
        control=control,
        metrics=metrics,
        protocol=protocol,
        limits=limits,
        security=security,
        security_written="security" in doc,
        key_file=key_file,
        psk_file=psk_file,
    )
    try:
        config.session_config()
    except LocalProtocolError as exc:
        raise ConfigError("protocol", str(exc)) from None
    return config


def parse_listen(text: str) -> tuple[str, int]:
    """'127.0.0.1:9464' or '[::1]:9464' → (address, port); ValueError with one line."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"want ADDR:PORT or [ADDR]:PORT, got {text!r}")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"want ADDR:PORT or [ADDR]:PORT, got {text!r}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address") from None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be 0..65535, got {port_text!r}")
    return host, int(port_text)


# -- sections -----------------------------------------------------------------------------------


def _planes(value: Any) -> tuple[PlaneConfig, ...]:
    if value is None:
        raise ConfigError("planes", "missing: add one [[planes]] table per plane")
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise ConfigError("planes", "must be an array of tables ([[planes]])")
    if not 1 <= len(value) <= MAX_PLANES:
        raise ConfigError("planes", f"need 1..{MAX_PLANES} planes, got {len(value)}")
    planes = []
    seen: set[str] = set()
    for i, doc in enumerate(value):
        where = f"planes[{i}]"
        _no_unknown(doc, {"address", "interface"}, where)
        address = _ip(doc, "address", f"{where}.address")
        if address in seen:
            raise ConfigError(f"{where}.address", f"{address} is already another plane's")
        seen.add(address)
        interface = _str(doc, "interface", f"{where}.interface")
        if interface is not None and not _IFNAME.match(interface):
            raise ConfigError(f"{where}.interface", f"not an interface name: {interface!r}")
        planes.append(PlaneConfig(address, interface))
    return tuple(planes)


def _peers(value: Any, planes: int, port: int, host: str) -> tuple[PeerConfig, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise ConfigError("peers", "must be an array of tables ([[peers]])")
    peers = []
    names: set[str] = set()
    for i, doc in enumerate(value):
        where = f"peers[{i}]"
        _no_unknown(doc, {"name", "addresses", "port", "public_key"}, where)
        name = _name(doc, "name", f"{where}.name", required=True)
        assert name is not None
        if name in names:
            raise ConfigError(f"{where}.name", f"peer {name!r} is listed twice")
        if name == host:
            raise ConfigError(f"{where}.name", f"{name!r} is this daemon's own host name")
        names.add(name)
        addrs = doc.get("addresses")
        if not isinstance(addrs, list) or not addrs:
            raise ConfigError(f"{where}.addresses", "must be a list of addresses, one per plane")
        if len(addrs) != planes:
            raise ConfigError(
                f"{where}.addresses", f"names {len(addrs)} addresses for {planes} planes"
            )
        checked = tuple(
            _ip({"a": a}, "a", f"{where}.addresses[{j}]") for j, a in enumerate(addrs)
        )
        peer_port = _int(doc, "port", f"{where}.port", 1, 65535, port)
        key = _str(doc, "public_key", f"{where}.public_key")
        if key is not None:
            try:
                raw = base64.b64decode(key, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != 32:
                raise ConfigError(
                    f"{where}.public_key", "not a base64 X25519 public key (32 bytes)"
                )
        peers.append(PeerConfig(name, checked, peer_port, key))
    return tuple(peers)


def _control(doc: dict[str, Any], base: str) -> ControlConfig:
    _no_unknown(doc, {"socket", "mode", "group", "allowed_uids"}, "control")
    path = _file(doc, "socket", base, "control.socket") or DEFAULT_SOCKET
    if len(path.encode()) > MAX_SOCKET_PATH:
        raise ConfigError(
            "control.socket", f"longer than the {MAX_SOCKET_PATH} bytes a Unix socket path allows"
        )
    mode_text = _str(doc, "mode", "control.mode") or "0600"
    if mode_text not in ("0600", "0660"):
        raise ConfigError(
            "control.mode", f"must be \"0600\" or \"0660\" (with group), got {mode_text!r}"
        )
    group = _str(doc, "group", "control.group")
    if group is not None:
        if mode_text != "0660":
            raise ConfigError("control.group", "only applies with mode = \"0660\"")
        try:
            grp.getgrnam(group)
        except KeyError:
            raise ConfigError("control.group", f"no group named {group!r}") from None
    uids = doc.get("allowed_uids")
    allowed = None
    if uids is not None:
        if not isinstance(uids, list) or not all(
            type(u) is int and 0 <= u < 1 << 32 for u in uids
        ):
            raise ConfigError(
                "control.allowed_uids", f"must be a list of uids (integers 0..2^32-1), got {uids!r}"
            )
        allowed = frozenset(uids)
    return ControlConfig(path, int(mode_text, 8), group, allowed)


def _protocol(doc: dict[str, Any]) -> ProtocolConfig:
    _no_unknown(doc, set(ProtocolConfig.__slots__), "protocol")
    d = ProtocolConfig()
    return ProtocolConfig(
        cc=_choice(doc, "cc", cc_names(), d.cc),
        spray=_choice(doc, "spray", spray_names(), d.spray),
        plane_balance=_choice(doc, "plane_balance", balance_names(), d.plane_balance),
        payload_mtu=_int(
            doc, "payload_mtu", "protocol.payload_mtu", MIN_PAYLOAD_MTU, MAX_PAYLOAD_MTU,
            d.payload_mtu,
        ),
        ev_per_plane=_int(doc, "ev_per_plane", "protocol.ev_per_plane", 1, 255, d.ev_per_plane),
        mpr=_int(doc, "mpr", "protocol.mpr", 1, 255, d.mpr),
        flowcell=_int(doc, "flowcell", "protocol.flowcell", 1, MAX_FLOWCELL, d.flowcell),
    )


def _limits(doc: dict[str, Any]) -> Limits:
    _no_unknown(doc, set(Limits.__slots__), "limits")
    d = Limits()
    drain = doc.get("drain_seconds", d.drain_seconds)
    if type(drain) not in (int, float) or not 0 <= drain <= 60:
        raise ConfigError("limits.drain_seconds", f"must be a number 0..60, got {drain!r}")
    return Limits(
        max_clients=_int(doc, "max_clients", "limits.max_clients", 1, 65536, d.max_clients),
        max_regions=_int(doc, "max_regions", "limits.max_regions", 1, 1 << 20, d.max_regions),
        max_outstanding_writes=_int(
            doc, "max_outstanding_writes", "limits.max_outstanding_writes", 1,
            MAX_OUTSTANDING_CAP, d.max_outstanding_writes,
        ),
        drain_seconds=float(drain),
        max_connections=_int(
            doc, "max_connections", "limits.max_connections", 1, 1 << 16, d.max_connections
        ),
        max_region_bytes=_int(
            doc, "max_region_bytes", "limits.max_region_bytes", 1, 1 << 40, d.max_region_bytes
        ),
        max_total_region_bytes=_int(
            doc, "max_total_region_bytes", "limits.max_total_region_bytes", 1, 1 << 44,
            d.max_total_region_bytes,
        ),
        **{key: _int(doc, key, f"limits.{key}", 1, hi, getattr(d, key))
           for key, hi in _QUOTAS.items()},
    )


#: The per-client and per-uid quotas and the largest value each takes.
_QUOTAS = {
    "max_regions_per_client": 1 << 20,
    "max_region_bytes_per_client": 1 << 44,
    "max_connections_per_client": 1 << 16,
    "max_endpoints_per_client": 1 << 16,
    "max_clients_per_uid": 65536,
    "max_regions_per_uid": 1 << 20,
    "max_region_bytes_per_uid": 1 << 44,
    "max_connections_per_uid": 1 << 16,
    "max_endpoints_per_uid": 1 << 16,
}


# -- value checks -------------------------------------------------------------------------------


def _no_unknown(doc: dict[str, Any], known: set[str], where: str) -> None:
    for key in doc:
        if key not in known:
            name = f"{where}.{key}" if where else key
            raise ConfigError(name, f"unknown key (known: {', '.join(sorted(known))})")


def _table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(key, f"must be a table ([{key}])")
    return value


def _str(doc: dict[str, Any], key: str, where: str) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, f"must be a non-empty string, got {value!r}")
    return value


def _file(doc: dict[str, Any], key: str, base: str, where: str | None = None) -> str | None:
    value = _str(doc, key, where or key)
    if value is None:
        return None
    return os.path.normpath(os.path.join(base, os.path.expanduser(value)))


def _name(doc: dict[str, Any], key: str, where: str, *, required: bool) -> str | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise ConfigError(where, "missing")
        return None
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(
            where, f"must be 1..63 letters, digits, '.', '_' or '-', got {value!r}"
        )
    return value


def _ip(doc: dict[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if value is None:
        raise ConfigError(where, "missing")
    if not isinstance(value, str):
        raise ConfigError(where, f"not an IP address: {value!r}")
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ConfigError(where, f"not an IP address: {value!r}") from None


def _int(doc: dict[str, Any], key: str, where: str, lo: int, hi: int, default: int) -> int:
    value = doc.get(key, default)
    if type(value) is not int or not lo <= value <= hi:
        raise ConfigError(where, f"must be an integer {lo}..{hi}, got {value!r}")
    return value


def _choice(doc: dict[str, Any], key: str, names: list[str], default: str) -> str:
    value = doc.get(key, default)
    if value not in names:
        raise ConfigError(f"protocol.{key}", f"must be one of {', '.join(names)}, got {value!r}")
    return str(value)
