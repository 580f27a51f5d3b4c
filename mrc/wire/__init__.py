"""Pure codecs for the mrc wire format (docs/WIRE.md): headers, whole packets and the SRv6 SRH.

Nothing here does I/O, reads a clock or keeps state: every function maps bytes to frozen records
and back. Decoders are strict and raise `DecodeError` naming the field; what a packet means is
left to `mrc.core`.
"""

from mrc.wire.ack import (
    AETH,
    NETH,
    SETH,
    CCState,
    NackReason,
    PortState,
    SackMark,
    Syndrome,
    syndrome_ok,
)
from mrc.wire.bth import (
    BTH,
    CM_LISTEN_QPN,
    CM_OPCODES,
    DATA_OPCODES,
    ENDPOINT_QPN,
    EVXH,
    FIRST_OPCODES,
    IMM_OPCODES,
    LAST_OPCODES,
    MSN_MOD,
    PSN_MOD,
    ROCE_PORT,
    Opcode,
)
from mrc.wire.cm import CMH, MAX_PRIVATE_DATA, KeyBlock, RejectReason, SecurityLevel
from mrc.wire.data import METH, RETH, TSETH, ImmDt
from mrc.wire.errors import DecodeError
from mrc.wire.packet import (
    AckPacket,
    CmPacket,
    DataPacket,
    EndpointPacket,
    NackPacket,
    Packet,
    ProbePacket,
    SackPacket,
    data_header_size,
    decode_packet,
    encode_data_header,
    peek_dest_qp,
    peek_opcode,
)
from mrc.wire.probe import EETH, ERTH, PETH, EndpointOp
from mrc.wire.srh import SRH
from mrc.wire.trailer import TRAILER_SIZE, Trailer

__all__ = [
    "AETH",
    "BTH",
    "CMH",
    "CM_LISTEN_QPN",
    "CM_OPCODES",
    "DATA_OPCODES",
    "EETH",
    "ENDPOINT_QPN",
    "ERTH",
    "EVXH",
    "FIRST_OPCODES",
    "IMM_OPCODES",
    "LAST_OPCODES",
    "MAX_PRIVATE_DATA",
    "METH",
    "MSN_MOD",
    "NETH",
    "PETH",
    "PSN_MOD",
    "RETH",
    "ROCE_PORT",
    "SETH",
    "SRH",
    "TRAILER_SIZE",
    "TSETH",
    "AckPacket",
    "CCState",
    "CmPacket",
    "DataPacket",
    "DecodeError",
    "EndpointOp",
    "EndpointPacket",
    "ImmDt",
    "KeyBlock",
    "NackPacket",
    "NackReason",
    "Opcode",
    "Packet",
    "PortState",
    "ProbePacket",
    "RejectReason",
    "SackMark",
    "SackPacket",
    "SecurityLevel",
    "Syndrome",
    "Trailer",
    "data_header_size",
    "decode_packet",
    "encode_data_header",
    "peek_dest_qp",
    "peek_opcode",
    "syndrome_ok",
]
