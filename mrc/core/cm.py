"""Connection management [ours] (docs/WIRE.md §6): negotiation and CM packet construction.

Pure functions over `SessionConfig` and the `CMH` codec: what a REQUEST, REPLY, REJECT or
DISCONNECT holds, and which parameters two sides agree on. The handshake's state (retries,
which planes a copy arrived on) lives in the session and the endpoint; on a secured connection
the key block's keys and the REPLY's sealing come from handshake.py and aead.py
(docs/WIRE.md §7). A REQUEST and a REPLY carry the connection's security level and their key
block; a REJECT and a DISCONNECT carry level 0 and no key block (a DISCONNECT is authenticated
by its trailer instead). A sealed REQUEST (revision 1.2) is `request_head` followed by what
handshake.py seals; `with_plane` makes each plane's copy of it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final, Protocol

from ..wire.bth import BTH_STRUCT, CM_LISTEN_QPN, Opcode
from ..wire.cm import (
    CM_FLAG_EV_FLOWLABEL,
    CM_FLAG_EV_SPORT,
    CMH,
    MAX_PRIVATE_DATA,
    KeyBlock,
    RejectReason,
    SecurityLevel,
)
from ..wire.packet import CmPacket
from .config import MAX_PAYLOAD_MTU, MIN_PAYLOAD_MTU, SessionConfig
from .errors import LocalProtocolError
from .events import ConnectionEstablished

CM_VERSION: Final = 1
REPLY_PLANE: Final = 0xFF


class _Connected(Protocol):
    config: SessionConfig
    peer_qpn: int
    connection_id: int


def established(session: _Connected, private_data: bytes) -> ConnectionEstablished:
    """The event of a connection that just agreed on `session.config`."""
    c = session.config
    return ConnectionEstablished(
        peer_qpn=session.peer_qpn,
        private_data=private_data,
        payload_mtu=c.payload_mtu,
        mpr=c.mpr,
        ev_per_plane=c.ev_per_plane,
        plane_mask=c.plane_mask,
        connection_id=session.connection_id,
    )


def reject_name(cmh: CMH) -> str:
    """A REJECT's reason as words ("unknown peer"), for `ConnectionClosed`."""
    try:
        return RejectReason(cmh.reject_reason).name.lower().replace("_", " ")
    except ValueError:
        return f"reason {cmh.reject_reason}"


def check_private_data(data: bytes) -> bytes:
    if len(data) > MAX_PRIVATE_DATA:
        raise LocalProtocolError(
            f"private data is {len(data)} bytes; a CM packet carries at most {MAX_PRIVATE_DATA}"
        )
    return bytes(data)


def security_level(config: SessionConfig) -> SecurityLevel:
    return SecurityLevel[config.security.upper()]


def negotiate(local: SessionConfig, cmh: CMH) -> SessionConfig | RejectReason:
    """The responder's view of a REQUEST: the agreed config, or why to refuse it.

    Negotiated values are the smaller of the two sides' and the intersection of the plane
    masks (docs/WIRE.md §6); the security level must match; EVs ride in the flow label only
    when both sides want it.
    """
    if cmh.version != CM_VERSION:
        return RejectReason.VERSION
    if cmh.security != security_level(local):
        return RejectReason.SECURITY_POLICY
    mask = local.plane_mask & cmh.plane_mask
    if (
        not MIN_PAYLOAD_MTU <= cmh.payload_mtu <= MAX_PAYLOAD_MTU
        or cmh.mpr == 0
        or cmh.ev_per_plane == 0
        or cmh.max_imm == 0
        or mask == 0
        or bool(cmh.flags & CM_FLAG_EV_SPORT) != (local.ev_encoding == "udp")
    ):
        return RejectReason.BAD_PARAMETERS
    return replace(
        local,
        plane_mask=mask,
        payload_mtu=min(local.payload_mtu, cmh.payload_mtu),
        mpr=min(local.mpr, cmh.mpr),
        ev_per_plane=min(local.ev_per_plane, cmh.ev_per_plane),
        max_imm=min(local.max_imm, cmh.max_imm),
        ev_encoding=_agreed_encoding(local, cmh),
    )


_ENCODING_FLAGS: Final = {"evxh": 0, "flowlabel": CM_FLAG_EV_FLOWLABEL, "udp": CM_FLAG_EV_SPORT}


def _agreed_encoding(local: SessionConfig, cmh: CMH) -> str:
    if local.ev_encoding == "udp":
        return "udp"  # both sides said so (checked before)
    offered = cmh.flags & CM_FLAG_EV_FLOWLABEL
    return "flowlabel" if offered and local.ev_encoding == "flowlabel" else "evxh"


def adopt_reply(local: SessionConfig, cmh: CMH) -> SessionConfig | None:
    """The requester's view of a REPLY: the agreed config, or None if the reply is not a
    narrowing of what we asked for (a responder may only lower values)."""
    if (
        cmh.version != CM_VERSION
        or cmh.security != security_level(local)
        or not MIN_PAYLOAD_MTU <= cmh.payload_mtu <= local.payload_mtu
        or not 1 <= cmh.mpr <= local.mpr
        or not 1 <= cmh.ev_per_plane <= local.ev_per_plane
        or not 1 <= cmh.max_imm <= local.max_imm
        or cmh.plane_mask == 0
        or cmh.plane_mask & ~local.plane_mask
        or (cmh.flags & CM_FLAG_EV_FLOWLABEL and local.ev_encoding != "flowlabel")
        or bool(cmh.flags & CM_FLAG_EV_SPORT) != (local.ev_encoding == "udp")
    ):
        return None
    return replace(
        local,
        plane_mask=cmh.plane_mask,
        payload_mtu=cmh.payload_mtu,
        mpr=cmh.mpr,
        ev_per_plane=cmh.ev_per_plane,
        max_imm=cmh.max_imm,
        ev_encoding=_agreed_encoding(local, cmh),
    )


def _cmh(
    config: SessionConfig,
    *,
    plane: int,
    local_qpn: int,
    remote_qpn: int,
    initial_psn: int,
    nonce: bytes,
    connection_id: int,
    private_data: bytes = b"",
    reject_reason: int = 0,
    secured: bool = False,
) -> CMH:
    return CMH(
        local_qpn=local_qpn,
        remote_qpn=remote_qpn,
        initial_psn=initial_psn,
        mpr=config.mpr,
        payload_mtu=config.payload_mtu,
        plane_count=bin(config.plane_mask).count("1"),
        ev_per_plane=config.ev_per_plane,
        plane_mask=config.plane_mask,
        max_imm=config.max_imm,
        security=security_level(config) if secured else SecurityLevel.NONE,
        nonce=nonce,
        connection_id=connection_id,
        plane=plane,
        reject_reason=reject_reason,
        private_data_len=len(private_data),
        version=CM_VERSION,
        flags=_ENCODING_FLAGS[config.ev_encoding],
    )


def build_request(
    config: SessionConfig,
    *,
    plane: int,
    local_qpn: int,
    initial_psn: int,
    nonce: bytes,
    connection_id: int,
    private_data: bytes,
    key_block: KeyBlock | None = None,
) -> bytes:
    """A REQUEST copy for `plane`; `key_block` (ephemeral, static) iff the config is secured."""
    cmh = _cmh(
        config,
        plane=plane,
        local_qpn=local_qpn,
        remote_qpn=0,
        initial_psn=initial_psn,
        nonce=nonce,
        connection_id=connection_id,
        private_data=private_data,
        secured=key_block is not None,
    )
    return CmPacket(
        opcode=Opcode.CM_REQUEST,
        dest_qp=CM_LISTEN_QPN,
        cmh=cmh,
        key_block=key_block,
        private_data=private_data,
        p_key=config.p_key,
    ).encode()


def request_head(
    config: SessionConfig,
    *,
    local_qpn: int,
    initial_psn: int,
    nonce: bytes,
    connection_id: int,
    private_data_len: int,
    key_block: KeyBlock,
) -> bytes:
    """A sealed REQUEST's head, BTH through key block, with `plane` 0 (what k_req's info
    hashes and the seal authenticates); the sealed timestamp and private data follow it."""
    cmh = _cmh(
        config,
        plane=0,
        local_qpn=local_qpn,
        remote_qpn=0,
        initial_psn=initial_psn,
        nonce=nonce,
        connection_id=connection_id,
        private_data=bytes(private_data_len),
        secured=True,
    )
    bth = BTH_STRUCT.pack(Opcode.CM_REQUEST, 0, config.p_key, CM_LISTEN_QPN, 0)
    return bth + cmh.encode() + key_block.encode()


def with_plane(packet: bytes, plane: int) -> bytes:
    """A CM packet's copy that names `plane` in its CMH (every other byte the same)."""
    return packet[:13] + bytes((plane,)) + packet[14:]


def build_reply(
    config: SessionConfig,
    *,
    local_qpn: int,
    remote_qpn: int,
    initial_psn: int,
    nonce: bytes,
    connection_id: int,
    private_data: bytes,
    key_block: KeyBlock | None = None,
) -> bytes:
    """The REPLY, private data in clear and without trailer: a secured one (`key_block` given)
    is then sealed with `PacketProtection.seal_reply`."""
    cmh = _cmh(
        config,
        plane=REPLY_PLANE,
        local_qpn=local_qpn,
        remote_qpn=remote_qpn,
        initial_psn=initial_psn,
        nonce=nonce,
        connection_id=connection_id,
        private_data=private_data,
        secured=key_block is not None,
    )
    return CmPacket(
        opcode=Opcode.CM_REPLY,
        dest_qp=remote_qpn,
        cmh=cmh,
        key_block=key_block,
        private_data=private_data,
        p_key=config.p_key,
    ).encode()


def build_reject(request: CMH, reason: RejectReason) -> bytes:
    """A REJECT echoes the REQUEST's nonce and parameters and carries no trailer (§6)."""
    cmh = replace(
        request,
        plane=REPLY_PLANE,
        local_qpn=0,
        remote_qpn=request.local_qpn,
        reject_reason=int(reason),
        private_data_len=0,
        security=SecurityLevel.NONE,
        version=CM_VERSION,
    )
    return CmPacket(
        opcode=Opcode.CM_REJECT,
        dest_qp=request.local_qpn,
        cmh=cmh,
        key_block=None,
        private_data=b"",
    ).encode()


def build_disconnect(
    config: SessionConfig, *, local_qpn: int, remote_qpn: int, connection_id: int
) -> bytes:
    cmh = _cmh(
        config,
        plane=REPLY_PLANE,
        local_qpn=local_qpn,
        remote_qpn=remote_qpn,
        initial_psn=0,
        nonce=bytes(16),
        connection_id=connection_id,
    )
    return CmPacket(
        opcode=Opcode.CM_DISCONNECT,
        dest_qp=remote_qpn,
        cmh=cmh,
        key_block=None,
        private_data=b"",
        p_key=config.p_key,
    ).encode()
