-- mrc.lua: a Wireshark/tshark dissector for the mrc wire format (mrc/docs/WIRE.md, rev. 1.1).
--
-- Registers a protocol "mrc" (not RoCE's "infiniband") for every header of docs/WIRE.md §2-§7:
-- BTH with mrc's EVX/A/RTX/TS bits, EVXH, METH, TSETH, RETH, ImmDt, SETH, CC_STATE, PORTSTATE,
-- NETH, PETH, AETH, ERTH, EETH (36 bytes), CMH, key block, private data, and a security
-- trailer when a control packet has exactly 24 bytes left over. Fields are named after the spec:
-- mrc.opcode, mrc.dest_qp, mrc.psn, mrc.ev, mrc.msn, mrc.cack_psn, mrc.sack_bitmap, ...
--
-- It dissects UDP port 4791 (Edit > Preferences > Protocols > MRC to change it; it replaces
-- the RoCEv2 dissector there) and, as a heuristic, any UDP datagram that starts like an MRC
-- packet (a known opcode, transport version 0, long enough for its headers). To force a port:
--   tshark -X lua_script:tools/wireshark/mrc.lua -d udp.port==5000,mrc -r capture.pcap
-- Fields for scripts:
--   tshark -X lua_script:tools/wireshark/mrc.lua -r capture.pcap -Y mrc \
--          -T fields -e mrc.psn -e mrc.opcode -e mrc.ev
-- As root: tshark runs -X lua_script only if the global init.lua says
-- `run_user_scripts_when_superuser = true` (and `enable_lua = true`); Debian's Wireshark 4.0
-- ships it so (/usr/share/wireshark/init.lua; `tshark -G folders` names the global
-- configuration folder). Where it is false, set it there, or run tshark as an ordinary user
-- on a readable copy of the capture. The "Running as user root" line on stderr is harmless. Bad input never stops the dissector: a short
-- header is flagged "malformed: <header>" (expert info mrc.malformed) and the rest shown raw.
-- A UDP GSO batch captured before the kernel split it is dissected packet by packet (one "MRC"
-- tree each, so -T fields prints comma-separated values for that frame).

local mrc = Proto("mrc", "MRC (Multipath Reliable Connection)")

local OPCODES = {
  [0xC6] = "WRITE_FIRST", [0xC7] = "WRITE_MIDDLE", [0xC8] = "WRITE_LAST",
  [0xC9] = "WRITE_LAST_IMM", [0xCA] = "WRITE_ONLY", [0xCB] = "WRITE_ONLY_IMM",
  [0xD1] = "ACKNOWLEDGE", [0xD8] = "ENDPOINT_REQUEST", [0xD9] = "ENDPOINT_RESPONSE",
  [0xDC] = "RELIABILITY_SACK", [0xDD] = "RELIABILITY_NACK", [0xDE] = "RELIABILITY_PROBE",
  [0xE0] = "CM_REQUEST", [0xE1] = "CM_REPLY", [0xE2] = "CM_REJECT", [0xE3] = "CM_DISCONNECT",
}
local NACK_REASONS = {
  [0x01] = "TRIMMED", [0x02] = "TRIMMED_LASTHOP", [0x06] = "NO_BITMAP",
  [0x07] = "NO_PKT_BUFFER", [0x0A] = "NO_RESOURCE", [0x0B] = "PSN_OOR_WINDOW",
  [0x19] = "UNEXP_EVENT", [0x80] = "BAD_RKEY", [0x81] = "OUT_OF_BOUNDS",
}
local SYNDROMES = {
  [0x1F] = "ACK", [0x60] = "NAK_PSN_SEQUENCE", [0x61] = "NAK_INVALID_REQUEST",
  [0x62] = "NAK_REMOTE_ACCESS", [0x63] = "NAK_REMOTE_OPERATIONAL",
}
local SACK_MARKS = { [0] = "NONE", [1] = "SKIP_ONCE", [2] = "ALWAYS_SKIP", [3] = "(invalid)" }
local ENDPOINT_OPS = { [0] = "PORT_STATUS", [1] = "EV_PROBE", [2] = "(invalid)", [3] = "(invalid)" }
local SECURITY = { [0] = "none", [1] = "auth", [2] = "encrypt" }
local REJECT_REASONS = {
  [0] = "none", [1] = "NO_LISTENER", [2] = "VERSION", [3] = "SECURITY_POLICY",
  [4] = "UNKNOWN_PEER", [5] = "RESOURCES", [6] = "BAD_PARAMETERS",
}

local function is_data(op) return op >= 0xC6 and op <= 0xCB end
local function is_imm(op) return op == 0xC9 or op == 0xCB end
local function is_cm(op) return op >= 0xE0 and op <= 0xE3 end
local function is_endpoint(op) return op == 0xD8 or op == 0xD9 end

local F = {}
local function add(key, field) F[key] = field end
-- BTH (docs/WIRE.md §2)
add("opcode", ProtoField.uint8("mrc.opcode", "Opcode", base.HEX, OPCODES))
add("se", ProtoField.bool("mrc.se", "SE", 8, nil, 0x80))
add("m_bit", ProtoField.bool("mrc.migreq", "M", 8, nil, 0x40))
add("pad_cnt", ProtoField.uint8("mrc.pad_cnt", "PadCnt", base.DEC, nil, 0x30))
add("tver", ProtoField.uint8("mrc.tver", "TVer", base.DEC, nil, 0x0F))
add("p_key", ProtoField.uint16("mrc.p_key", "P_Key", base.HEX))
add("fecn", ProtoField.bool("mrc.fecn", "FECN", 32, nil, 0x80000000))
add("becn", ProtoField.bool("mrc.becn", "BECN", 32, nil, 0x40000000))
add("evx", ProtoField.bool("mrc.evx", "EVX (EVXH follows)", 32, nil, 0x01000000))
add("dest_qp", ProtoField.uint32("mrc.dest_qp", "DestQP", base.HEX, nil, 0x00FFFFFF))
add("a", ProtoField.bool("mrc.a", "A (ack requested)", 32, nil, 0x80000000))
add("r", ProtoField.bool("mrc.r", "R", 32, nil, 0x40000000))
add("rtx", ProtoField.bool("mrc.rtx", "RTX (retransmission)", 32, nil, 0x20000000))
add("ts", ProtoField.bool("mrc.ts", "TS (TSETH follows)", 32, nil, 0x10000000))
add("psn", ProtoField.uint32("mrc.psn", "PSN", base.DEC, nil, 0x00FFFFFF))
add("probe_id", ProtoField.uint16("mrc.probe_id", "Probe id", base.DEC))
-- EVXH (§3)
add("ev", ProtoField.uint32("mrc.ev", "EV", base.HEX))
add("ev_plane", ProtoField.uint32("mrc.ev_plane", "Plane", base.DEC, nil, 0xFF000000))
add("ev_selector", ProtoField.uint32("mrc.ev_selector", "Selector", base.HEX, nil, 0x00FFFFFF))
-- METH, TSETH, RETH, ImmDt, payload (§3)
add("rqmsn", ProtoField.uint16("mrc.rqmsn", "RQMSN", base.DEC))
add("msn", ProtoField.uint32("mrc.msn", "MSN", base.DEC))
add("tx_timestamp", ProtoField.uint16("mrc.tx_timestamp", "tx_timestamp", base.HEX))
add("tsr", ProtoField.bool("mrc.tsr", "TSR", 16, nil, 0x8000))
add("ftype", ProtoField.uint16("mrc.ftype", "ftype", base.DEC, nil, 0x000F))
add("va", ProtoField.uint64("mrc.va", "VA", base.HEX))
add("rkey", ProtoField.uint32("mrc.rkey", "R_Key", base.HEX))
add("dma_length", ProtoField.uint32("mrc.dma_length", "DMA_length", base.DEC))
add("imm", ProtoField.uint32("mrc.imm", "Immediate", base.HEX))
add("payload", ProtoField.bytes("mrc.payload", "Payload"))
add("payload_length", ProtoField.uint32("mrc.payload_length", "Payload length", base.DEC))
-- The reliability headers' common prefix (§4): sent as 0, ignored.
add("hdr_type", ProtoField.uint16("mrc.hdr_type", "type", base.DEC, nil, 0xF000))
add("hdr_next", ProtoField.uint16("mrc.hdr_next", "next", base.DEC, nil, 0x0F80))
-- SETH, CC_STATE, PORTSTATE (§4)
add("m", ProtoField.uint16("mrc.m", "m", base.DEC, SACK_MARKS, 0x0060))
add("pr", ProtoField.bool("mrc.pr", "PR (answers a probe)", 16, nil, 0x0002))
add("ps", ProtoField.bool("mrc.ps", "PS (PORTSTATE follows)", 16, nil, 0x0001))
add("ack_psn_offset", ProtoField.int16("mrc.ack_psn_offset", "ack_psn_offset", base.DEC))
add("entropy", ProtoField.uint32("mrc.entropy", "entropy", base.HEX))
add("spdcid", ProtoField.uint16("mrc.spdcid", "spdcid", base.DEC))
add("dpdcid", ProtoField.uint16("mrc.dpdcid", "dpdcid", base.DEC))
add("cack_psn", ProtoField.uint32("mrc.cack_psn", "cack_psn", base.DEC))
add("cc_type", ProtoField.uint8("mrc.cc_type", "cc_type", base.DEC, nil, 0xF0))
add("cc_flags", ProtoField.uint8("mrc.cc_flags", "cc_flags", base.HEX, nil, 0x0F))
add("mpr", ProtoField.uint8("mrc.mpr", "mpr", base.DEC))
add("sack_offset", ProtoField.int16("mrc.sack_offset", "sack_offset", base.DEC))
add("sack_bitmap", ProtoField.uint64("mrc.sack_bitmap", "sack_bitmap", base.HEX))
add("v", ProtoField.bool("mrc.v", "V (echo valid)", 16, nil, 0x8000))
add("ooo_count", ProtoField.uint16("mrc.ooo_count", "ooo_count", base.DEC, nil, 0x7FFF))
add("restore_cwnd", ProtoField.bool("mrc.restore_cwnd", "restore_cwnd", 32, nil, 0x80000000))
add("rcv_cwnd_pen", ProtoField.uint32("mrc.rcv_cwnd_pen", "rcv_cwnd_pen", base.DEC, nil,
                                      0x7F000000))
add("rcvd_bytes", ProtoField.uint32("mrc.rcvd_bytes", "rcvd_bytes", base.DEC, nil, 0x00FFFFFF))
add("port_state_mask", ProtoField.uint32("mrc.port_state_mask", "port_state_mask", base.HEX))
-- NETH, PETH, AETH, ERTH, EETH (§4)
add("nack_reason", ProtoField.uint8("mrc.nack_reason", "nack_reason", base.HEX, NACK_REASONS))
add("vendor", ProtoField.uint8("mrc.vendor", "vendor", base.HEX))
add("nack_psn", ProtoField.uint32("mrc.nack_psn", "nack_psn", base.DEC))
add("syndrome", ProtoField.uint8("mrc.syndrome", "syndrome", base.HEX, SYNDROMES))
add("op", ProtoField.uint16("mrc.op", "op", base.DEC, ENDPOINT_OPS, 0x0003))
add("port_status_mask", ProtoField.uint32("mrc.port_status_mask", "port_status_mask", base.HEX))
add("rsvd", ProtoField.bytes("mrc.rsvd", "rsvd"))
-- CMH, key block, private data (§6); trailer (§7)
add("cm_version", ProtoField.uint8("mrc.cm.version", "version", base.DEC))
add("cm_plane", ProtoField.uint8("mrc.cm.plane", "plane", base.DEC))
add("cm_flags", ProtoField.uint16("mrc.cm.flags", "flags", base.HEX))
add("cm_local_qpn", ProtoField.uint32("mrc.cm.local_qpn", "local_qpn", base.HEX))
add("cm_remote_qpn", ProtoField.uint32("mrc.cm.remote_qpn", "remote_qpn", base.HEX))
add("cm_initial_psn", ProtoField.uint32("mrc.cm.initial_psn", "initial_psn", base.DEC))
add("cm_payload_mtu", ProtoField.uint16("mrc.cm.payload_mtu", "payload_mtu", base.DEC))
add("cm_plane_count", ProtoField.uint8("mrc.cm.plane_count", "plane_count", base.DEC))
add("cm_ev_per_plane", ProtoField.uint8("mrc.cm.ev_per_plane", "ev_per_plane", base.DEC))
add("cm_plane_mask", ProtoField.uint32("mrc.cm.plane_mask", "plane_mask", base.HEX))
add("cm_max_imm", ProtoField.uint16("mrc.cm.max_imm", "max_imm", base.DEC))
add("cm_security", ProtoField.uint8("mrc.cm.security", "security", base.DEC, SECURITY))
add("cm_nonce", ProtoField.bytes("mrc.cm.nonce", "nonce"))
add("cm_reject_reason", ProtoField.uint16("mrc.cm.reject_reason", "reject_reason", base.DEC,
                                          REJECT_REASONS))
add("cm_private_data_len", ProtoField.uint16("mrc.cm.private_data_len", "private_data_len",
                                             base.DEC))
add("cm_connection_id", ProtoField.uint64("mrc.cm.connection_id", "connection_id", base.HEX))
add("cm_ephemeral", ProtoField.bytes("mrc.cm.ephemeral", "ephemeral public key"))
add("cm_static", ProtoField.bytes("mrc.cm.static", "static public key"))
add("cm_private_data", ProtoField.bytes("mrc.cm.private_data", "private data"))
add("cm_sealed", ProtoField.bytes("mrc.cm.sealed", "sealed timestamp and private data"))
add("cm_sealed_tag", ProtoField.bytes("mrc.cm.sealed_tag", "tag"))
add("flow_label", ProtoField.uint32("mrc.flow_label", "IPv6 flow label", base.HEX))
add("tx_counter", ProtoField.uint64("mrc.tx_counter", "tx_counter", base.DEC))
add("tag", ProtoField.bytes("mrc.tag", "tag"))

local field_list = {}
for _, f in pairs(F) do field_list[#field_list + 1] = f end
mrc.fields = field_list

-- The IPv6 flow label: where --ev-encoding flowlabel puts an EV's low 20 bits (docs/WIRE.md,
-- revision note item 6), shown next to the EVXH.
local ipv6_flow = Field.new("ipv6.flow")

local ex_malformed = ProtoExpert.new("mrc.malformed", "Malformed MRC packet",
                                     expert.group.MALFORMED, expert.severity.ERROR)
local ex_gso = ProtoExpert.new("mrc.gso", "A UDP GSO batch: only its first packet is dissected",
                               expert.group.PROTOCOL, expert.severity.NOTE)
local ex_leftover = ProtoExpert.new("mrc.leftover", "Bytes after the MRC headers",
                                    expert.group.MALFORMED, expert.severity.WARN)
mrc.experts = { ex_malformed, ex_gso, ex_leftover }

mrc.prefs.port = Pref.uint("UDP port", 4791, "The UDP port MRC uses (default 4791, RoCEv2's)")
mrc.prefs.heuristic = Pref.bool("Heuristic on other UDP ports", true,
                                "Try datagrams on any UDP port that start like an MRC packet")

-- Adds a header subtree of `size` bytes at `off`, or flags the packet malformed and returns nil
-- when the datagram is too short for it.
local function header(tvb, pinfo, tree, off, size, name)
  if tvb:len() - off < size then
    local item = tree:add(mrc, tvb(off), name .. " (truncated)")
    item:add_proto_expert_info(ex_malformed, "malformed: " .. name .. " needs " .. size ..
                               " bytes, " .. (tvb:len() - off) .. " left")
    pinfo.cols.info:append(" [malformed: " .. name .. "]")
    return nil
  end
  return tree:add(mrc, tvb(off, size), name)
end

local function prefix(t, tvb, off)
  t:add(F.hdr_type, tvb(off, 2))
  t:add(F.hdr_next, tvb(off, 2))
end

-- QPNs of the secured connections whose CM packets were seen (docs/WIRE.md §7): a data packet
-- to one ends in a 24-byte trailer, not payload. Filled on the first, in-order pass.
local secured = {}
function mrc.init()
  secured = {}
end

local function add_trailer(tvb, tree, off)
  local t = tree:add(mrc, tvb(off, 24), "Security trailer")
  t:add(F.tx_counter, tvb(off, 8))
  t:add(F.tag, tvb(off + 8, 16))
end

local function dissect_data(tvb, pinfo, tree, off, op, ts, trailer)
  local t = header(tvb, pinfo, tree, off, 4, "METH")
  if not t then return end
  t:add(F.rqmsn, tvb(off, 2))
  t:add(F.msn, tvb(off + 2, 2))
  local msn = tvb(off + 2, 2):uint()
  off = off + 4
  if ts then
    t = header(tvb, pinfo, tree, off, 4, "TSETH")
    if not t then return end
    t:add(F.tx_timestamp, tvb(off, 2))
    t:add(F.tsr, tvb(off + 2, 2))
    t:add(F.ftype, tvb(off + 2, 2))
    off = off + 4
  end
  t = header(tvb, pinfo, tree, off, 16, "RETH")
  if not t then return end
  t:add(F.va, tvb(off, 8))
  t:add(F.rkey, tvb(off + 8, 4))
  t:add(F.dma_length, tvb(off + 12, 4))
  off = off + 16
  if is_imm(op) then
    t = header(tvb, pinfo, tree, off, 4, "ImmDt")
    if not t then return end
    t:add(F.imm, tvb(off, 4))
    off = off + 4
  end
  local n = tvb:len() - off
  if trailer and n > 24 then
    n = n - 24
    add_trailer(tvb, tree, off + n)
  end
  tree:add(F.payload_length, n):set_generated()
  -- docs/WIRE.md §1: a capture taken before the kernel splits a GSO send holds several
  -- packets in one datagram; no single packet is longer than 8192 + 44 + 24 bytes.
  if tvb:reported_length_remaining(0) > 8192 + 44 + 24 then
    tree:add_proto_expert_info(ex_gso)
    pinfo.cols.info:append(" [too long for one packet: an unsplit GSO batch?]")
  end
  if n > 0 then
    tree:add(F.payload, tvb(off, n))
  else
    tree:add_proto_expert_info(ex_malformed, "malformed: payload (data packet without payload)")
  end
  pinfo.cols.info:append(string.format(" MSN=%d len=%d", msn, n))
end

local function dissect_seth(tvb, pinfo, tree, off)
  local t = header(tvb, pinfo, tree, off, 36, "SETH + CC_STATE")
  if not t then return off, false end
  t:set_text("SETH")
  prefix(t, tvb, off)
  t:add(F.m, tvb(off, 2))
  t:add(F.pr, tvb(off, 2))
  t:add(F.ps, tvb(off, 2))
  t:add(F.ack_psn_offset, tvb(off + 2, 2))
  t:add(F.entropy, tvb(off + 4, 4))
  t:add(F.spdcid, tvb(off + 8, 2))
  t:add(F.dpdcid, tvb(off + 10, 2))
  t:add(F.cack_psn, tvb(off + 13, 3))
  t:add(F.cc_type, tvb(off + 16, 1))
  t:add(F.cc_flags, tvb(off + 16, 1))
  t:add(F.mpr, tvb(off + 17, 1))
  t:add(F.sack_offset, tvb(off + 18, 2))
  t:add(F.sack_bitmap, tvb(off + 20, 8))
  local ps = bit.band(tvb(off + 1, 1):uint(), 0x01) ~= 0
  pinfo.cols.info:append(string.format(" cack_psn=%d sack_offset=%d", tvb(off + 13, 3):uint(),
                                       tvb(off + 18, 2):int()))
  local c = tree:add(mrc, tvb(off + 28, 8), "CC_STATE")
  c:add(F.tx_timestamp, tvb(off + 28, 2))
  c:add(F.v, tvb(off + 30, 2))
  c:add(F.ooo_count, tvb(off + 30, 2))
  c:add(F.restore_cwnd, tvb(off + 32, 4))
  c:add(F.rcv_cwnd_pen, tvb(off + 32, 4))
  c:add(F.rcvd_bytes, tvb(off + 32, 4))
  off = off + 36
  if ps then
    local p = header(tvb, pinfo, tree, off, 4, "PORTSTATE")
    if not p then return off, false end
    p:add(F.port_state_mask, tvb(off, 4))
    off = off + 4
  end
  return off, true
end

local function dissect_neth(tvb, pinfo, tree, off)
  local t = header(tvb, pinfo, tree, off, 20, "NETH")
  if not t then return off, false end
  prefix(t, tvb, off)
  t:add(F.nack_reason, tvb(off + 2, 1))
  t:add(F.vendor, tvb(off + 3, 1))
  t:add(F.entropy, tvb(off + 4, 4))
  t:add(F.spdcid, tvb(off + 8, 2))
  t:add(F.dpdcid, tvb(off + 10, 2))
  t:add(F.nack_psn, tvb(off + 13, 3))
  t:add(F.cc_type, tvb(off + 16, 1))
  t:add(F.cc_flags, tvb(off + 16, 1))
  t:add(F.tx_timestamp, tvb(off + 18, 2))
  local reason = tvb(off + 2, 1):uint()
  pinfo.cols.info:append(" " .. (NACK_REASONS[reason] or string.format("reason=0x%02X", reason)))
  return off + 20, true
end

local function dissect_peth(tvb, pinfo, tree, off)
  local t = header(tvb, pinfo, tree, off, 16, "PETH")
  if not t then return off, false end
  prefix(t, tvb, off)
  t:add(F.vendor, tvb(off + 2, 1))
  t:add(F.probe_id, tvb(off + 4, 2))
  t:add(F.spdcid, tvb(off + 8, 2))
  t:add(F.dpdcid, tvb(off + 10, 2))
  t:add(F.tx_timestamp, tvb(off + 12, 2))
  t:add(F.tsr, tvb(off + 14, 2))
  t:add(F.ftype, tvb(off + 14, 2))
  pinfo.cols.info:append(" probe_id=" .. tvb(off + 4, 2):uint())
  return off + 16, true
end

local function dissect_aeth(tvb, pinfo, tree, off)
  local t = header(tvb, pinfo, tree, off, 4, "AETH")
  if not t then return off, false end
  t:add(F.syndrome, tvb(off, 1))
  t:add(F.msn, tvb(off + 1, 3))
  local syn = tvb(off, 1):uint()
  pinfo.cols.info:append(string.format(" syndrome=0x%02X MSN=%d", syn, tvb(off + 1, 3):uint()))
  return off + 4, true
end

local function dissect_erth(tvb, pinfo, tree, off)
  local t = header(tvb, pinfo, tree, off, 16, "ERTH")
  if not t then return off, false end
  prefix(t, tvb, off)
  t:add(F.op, tvb(off, 2))
  t:add(F.vendor, tvb(off + 3, 1))
  t:add(F.port_status_mask, tvb(off + 4, 4))
  t:add(F.tx_timestamp, tvb(off + 12, 2))
  t:add(F.tsr, tvb(off + 14, 2))
  t:add(F.ftype, tvb(off + 14, 2))
  pinfo.cols.info:append(" " .. ENDPOINT_OPS[bit.band(tvb(off + 1, 1):uint(), 3)])
  return off + 16, true
end

local function dissect_eeth(tvb, pinfo, tree, off)
  local t = header(tvb, pinfo, tree, off, 36, "EETH")
  if not t then return off, false end
  prefix(t, tvb, off)
  t:add(F.op, tvb(off, 2))
  t:add(F.port_status_mask, tvb(off + 4, 4))
  t:add(F.rsvd, tvb(off + 8, 20))
  t:add(F.tx_timestamp, tvb(off + 28, 2))
  pinfo.cols.info:append(" " .. ENDPOINT_OPS[bit.band(tvb(off + 1, 1):uint(), 3)])
  return off + 36, true
end

local function dissect_cm(tvb, pinfo, tree, off)
  local t = header(tvb, pinfo, tree, off, 64, "CMH")
  if not t then return off, false end
  t:add(F.cm_version, tvb(off, 1))
  t:add(F.cm_plane, tvb(off + 1, 1))
  t:add(F.cm_flags, tvb(off + 2, 2))
  t:add(F.cm_local_qpn, tvb(off + 4, 3))
  t:add(F.cm_remote_qpn, tvb(off + 8, 3))
  t:add(F.cm_initial_psn, tvb(off + 12, 3))
  t:add(F.mpr, tvb(off + 15, 1))
  t:add(F.cm_payload_mtu, tvb(off + 16, 2))
  t:add(F.cm_plane_count, tvb(off + 18, 1))
  t:add(F.cm_ev_per_plane, tvb(off + 19, 1))
  t:add(F.cm_plane_mask, tvb(off + 20, 4))
  t:add(F.cm_max_imm, tvb(off + 24, 2))
  t:add(F.cm_security, tvb(off + 26, 1))
  t:add(F.cm_nonce, tvb(off + 28, 16))
  t:add(F.cm_reject_reason, tvb(off + 44, 2))
  t:add(F.cm_private_data_len, tvb(off + 46, 2))
  t:add(F.cm_connection_id, tvb(off + 48, 8))
  local security = tvb(off + 26, 1):uint()
  local private = tvb(off + 46, 2):uint()
  if security ~= 0 then
    -- From now on packets to either QPN carry trailers (a REQUEST names the requester as
    -- local_qpn; a REPLY names the responder as local_qpn and the requester as remote_qpn).
    for _, q in ipairs({ tvb(off + 4, 3):uint(), tvb(off + 8, 3):uint() }) do
      if q ~= 0 then secured[q] = true end
    end
  end
  pinfo.cols.info:append(string.format(" local_qpn=0x%06X remote_qpn=0x%06X",
                                       tvb(off + 4, 3):uint(), tvb(off + 8, 3):uint()))
  off = off + 64
  if security ~= 0 then
    local k = header(tvb, pinfo, tree, off, 64, "Key block")
    if not k then return off, false end
    k:add(F.cm_ephemeral, tvb(off, 32))
    k:add(F.cm_static, tvb(off + 32, 32))
    off = off + 64
    -- docs/WIRE.md §7, revision 1.2: a sealed REQUEST holds AES-GCM(timestamp 96 | private
    -- data) and a 16-byte tag after its key block (the open form: the private data in clear).
    local sealed = 12 + private
    if tvb(0, 1):uint() == 0xE0 and tvb:len() - off == sealed + 16 then
      local sb = header(tvb, pinfo, tree, off, sealed + 16, "Sealed (revision 1.2)")
      if not sb then return off, false end
      sb:add(F.cm_sealed, tvb(off, sealed))
      sb:add(F.cm_sealed_tag, tvb(off + sealed, 16))
      return off + sealed + 16, true
    end
  end
  if private > 0 then
    local p = header(tvb, pinfo, tree, off, private, "Private data")
    if not p then return off, false end
    p:add(F.cm_private_data, tvb(off, private))
    off = off + private
  end
  return off, true
end

local CONTROL = {
  [0xD1] = dissect_aeth, [0xD8] = dissect_erth, [0xD9] = dissect_eeth,
  [0xDC] = dissect_seth, [0xDD] = dissect_neth, [0xDE] = dissect_peth,
  [0xE0] = dissect_cm, [0xE1] = dissect_cm, [0xE2] = dissect_cm, [0xE3] = dissect_cm,
}

-- The smallest datagram each opcode can be (BTH, no EVXH/TSETH, headers, no private data).
local function min_length(op)
  if is_data(op) then return 12 + 4 + 16 + (is_imm(op) and 4 or 0) + 1 end
  local sizes = { [0xD1] = 4, [0xD8] = 16, [0xD9] = 36, [0xDC] = 36, [0xDD] = 20, [0xDE] = 16 }
  return 12 + (sizes[op] or 64)
end

-- One MRC packet: `tvb` is the whole packet; `sep` starts its part of the info column.
local function dissect_one(tvb, pinfo, tree, sep)
  local len = tvb:len()
  local root = tree:add(mrc, tvb(), "MRC")
  if len < 12 then
    root:add_proto_expert_info(ex_malformed, "malformed: length (BTH needs 12 bytes)")
    pinfo.cols.info:append(sep .. "MRC [malformed: BTH]")
    return len
  end
  local op = tvb(0, 1):uint()
  local name = OPCODES[op] or string.format("opcode 0x%02X", op)
  local b = root:add(mrc, tvb(0, 12), "BTH")
  b:add(F.opcode, tvb(0, 1))
  b:add(F.se, tvb(1, 1))
  b:add(F.m_bit, tvb(1, 1))
  b:add(F.pad_cnt, tvb(1, 1))
  b:add(F.tver, tvb(1, 1))
  b:add(F.p_key, tvb(2, 2))
  b:add(F.fecn, tvb(4, 4))
  b:add(F.becn, tvb(4, 4))
  b:add(F.evx, tvb(4, 4))
  b:add(F.dest_qp, tvb(4, 4))
  b:add(F.a, tvb(8, 4))
  b:add(F.r, tvb(8, 4))
  b:add(F.rtx, tvb(8, 4))
  b:add(F.ts, tvb(8, 4))
  b:add(F.psn, tvb(8, 4))
  if is_endpoint(op) then b:add(F.probe_id, tvb(10, 2)) end
  local qp = bit.band(tvb(4, 4):uint(), 0xFFFFFF)
  local psn = bit.band(tvb(8, 4):uint(), 0xFFFFFF)
  local evx = bit.band(tvb(4, 1):uint(), 0x01) ~= 0
  local ts = bit.band(tvb(8, 1):uint(), 0x10) ~= 0
  pinfo.cols.info:append(sep .. string.format("%s QP=0x%06X PSN=%d", name, qp, psn))
  root:append_text(", " .. name)
  if not OPCODES[op] then
    root:add_proto_expert_info(ex_malformed, "malformed: opcode (unknown)")
    return len
  end
  if bit.band(tvb(1, 1):uint(), 0x0F) ~= 0 then
    root:add_proto_expert_info(ex_malformed, "malformed: tver (transport version not 0)")
  end
  local fl = ipv6_flow()
  if fl and fl.value ~= 0 then
    root:add(F.flow_label, fl.value):set_generated()
  end
  local off = 12
  if evx and not is_cm(op) then
    local e = header(tvb, pinfo, root, off, 4, "EVXH")
    if not e then return len end
    e:add(F.ev, tvb(off, 4))
    e:add(F.ev_plane, tvb(off, 4))
    e:add(F.ev_selector, tvb(off, 4))
    pinfo.cols.info:append(string.format(" EV=0x%08X", tvb(off, 4):uint()))
    off = off + 4
  elseif evx then
    root:add_proto_expert_info(ex_malformed, "malformed: evx (CM packets carry no EVXH)")
  end
  if is_data(op) then
    dissect_data(tvb, pinfo, root, off, op, ts, secured[qp] == true)
    return len
  end
  local done, ok = CONTROL[op](tvb, pinfo, root, off)
  local left = len - done
  if ok and left == 24 and not (op == 0xE0 or op == 0xE2) then
    -- docs/WIRE.md §7: a secured connection ends every packet but a REQUEST/REJECT with it.
    add_trailer(tvb, root, done)
  elseif ok and left > 0 then
    root:add(tvb(done, left), "Left over: " .. left .. " bytes")
        :add_proto_expert_info(ex_leftover, left .. " bytes after the headers")
  end
  return len
end

-- docs/WIRE.md §1: a capture taken before the kernel splits a UDP GSO send holds several data
-- packets of one size back to back (the last may be shorter). Their size is where the next one
-- starts: the first later offset with a data opcode, TVer 0 and the first packet's P_Key, EVX
-- bit and DestQP; every later start must match too, or the datagram stays whole. `mrc
-- dissect` (mrc/cli/dissect.py, split_gso) applies the same rule. Returns the start offsets.
local function split_gso(tvb)
  local n = tvb:len()
  if n ~= tvb:reported_len() or n < 26 then return nil end
  local raw = tvb:raw(0, n)
  local function starts_data(q) -- q is 0-based
    return is_data(raw:byte(q + 1)) and bit.band(raw:byte(q + 2), 0x0F) == 0
  end
  if not starts_data(0) then return nil end
  local key = raw:sub(3, 8) -- bytes 2-7: P_Key, EVX and DestQP
  local at = raw:find(key, 15, true)
  local size
  while at do
    local start = at - 3
    if starts_data(start) and n - start >= 12 then
      size = start
      break
    end
    at = raw:find(key, at + 1, true)
  end
  if not size then return nil end
  local starts = {}
  for q = 0, n - 1, size do
    if q > 0 and (n - q < 12 or not starts_data(q) or raw:sub(q + 3, q + 8) ~= key) then
      return nil
    end
    starts[#starts + 1] = q
  end
  return starts, size
end

function mrc.dissector(tvb, pinfo, tree)
  local len = tvb:len()
  pinfo.cols.protocol = "MRC"
  pinfo.cols.info = ""
  local starts, size = split_gso(tvb)
  if not starts then
    dissect_one(tvb, pinfo, tree, "")
    return len
  end
  for k, q in ipairs(starts) do
    local seg = tvb(q, math.min(size, len - q)):tvb()
    dissect_one(seg, pinfo, tree, k == 1 and "" or " | ")
  end
  pinfo.cols.info:prepend(string.format("[GSO batch of %d] ", #starts))
  return len
end

local function heuristic(tvb, pinfo, tree)
  if not mrc.prefs.heuristic or tvb:len() < 12 then return false end
  local op = tvb(0, 1):uint()
  if not OPCODES[op] or bit.band(tvb(1, 1):uint(), 0x0F) ~= 0 then return false end
  if tvb:len() < min_length(op) then return false end
  if is_cm(op) and tvb(12, 1):uint() ~= 1 then return false end -- CMH version 1
  mrc.dissector(tvb, pinfo, tree)
  return true
end

local registered_port = 0
local function register_port()
  local udp = DissectorTable.get("udp.port")
  if registered_port ~= 0 then udp:remove(registered_port, mrc) end
  registered_port = mrc.prefs.port
  if registered_port ~= 0 then udp:add(registered_port, mrc) end
end

mrc.prefs_changed = register_port
register_port()
mrc:register_heuristic("udp", heuristic)
