"""Per-connection settings and their defaults (docs/DESIGN.md §4, §6, §10; docs/WIRE.md §6).

Only data lives here: the session reads these values, the CLI and the daemon build them. The
negotiated subset (payload MTU, MPR, EVs per plane, plane mask, max_imm) is narrowed by the CM
handshake and stored back as a new `SessionConfig` with `dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .errors import LocalProtocolError

MIN_PAYLOAD_MTU: Final = 256
MAX_PAYLOAD_MTU: Final = 8192
#: UDP GSO sends at most 64 segments per call (docs/DESIGN.md §11).
MAX_FLOWCELL: Final = 64
#: Packets per flowcell unless the user says otherwise: the one default `SessionConfig`, `mrc
#: bench --flowcell`, the daemon's `protocol.flowcell` and tools/bench_core.py all read. As many
#: as one GSO call holds, which moved 1.9-2.5x the bytes of an EV per packet on loopback
#: (docs/DESIGN.md §11). The simulator's experiments and the story tests that count packets ask
#: for 1 (an EV per packet, MRC's rule as the paper models it) explicitly.
DEFAULT_FLOWCELL: Final = MAX_FLOWCELL
#: Paths one plane may have between two hosts (`plane_paths`).
MAX_PLANE_PATHS: Final = 1 << 16
#: `security` levels (docs/WIRE.md §7): none, auth (integrity), encrypt (payload encrypted too).
SECURITY_LEVELS: Final = ("none", "auth", "encrypt")


#: Where a connection's datagrams carry their EV (`SessionConfig.ev_encoding`).
EV_ENCODINGS: Final = ("evxh", "flowlabel", "udp")

@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Settings of one connection (a QP). Times are seconds."""

    #: Bit p set = plane p may carry this connection (docs/WIRE.md §6 `plane_mask`).
    plane_mask: int = 0b1
    #: Payload bytes per packet (docs/WIRE.md §3), 256…8192.
    payload_mtu: int = 4096
    #: Window in units of 128 PSNs (docs/DESIGN.md §6: 8 × 128 = 1024 packets).
    mpr: int = 8
    #: EVs per plane in the active set (docs/DESIGN.md §4).
    ev_per_plane: int = 16
    #: Most WRITE_WITH_IMM messages in flight (docs/WIRE.md §6 `max_imm`).
    max_imm: int = 1024
    #: Backup EVs per plane that replace retired ones (docs/DESIGN.md §4); None = ev_per_plane.
    ev_backup_per_plane: int | None = None
    #: MRC's `ev_min_active`: below this many usable EVs a plane stops retiring them;
    #: None = a quarter of ev_per_plane (at least 1).
    ev_min_active: int | None = None
    #: Paths of each plane (index = plane number; missing = 1): route = selector mod paths.
    plane_paths: tuple[int, ...] = ()
    #: Spray policy by name (mrc.core.paths.spray registry).
    spray: str = "bitmap"
    #: Plane balance by name (mrc.core.paths.balance registry): "equal" (MRC's rule) or "adaptive"
    #: (planes weighted by their measured delivery rate) (docs/DESIGN.md §4).
    plane_balance: str = "equal"
    #: Packets per flowcell (docs/DESIGN.md §11): the sender asks the spray policy for one EV per
    #: flowcell and sends up to min(flowcell, 65507 // segment size, 64) consecutive new
    #: packets on it as one GSO batch (two when their headers differ in size). 1 = an EV per
    #: packet, MRC's rule as the models see it (the simulator's experiments pass it). Local: not
    #: negotiated.
    flowcell: int = DEFAULT_FLOWCELL
    #: Congestion control by name (mrc.core.cc.control registry): "nscc" (UEC NSCC) or "none" (the
    #: window only) (docs/DESIGN.md §7).
    cc: str = "nscc"
    #: NSCC: line rate of one plane (bit/s); with the base RTT it gives the BDP that scales
    #: the UEC constants and caps the window at 1.5 × BDP (docs/DESIGN.md §7).
    cc_plane_rate: float = 10e9
    #: NSCC: the base RTT assumed until one is measured (the smallest RTT seen replaces it).
    cc_base_rtt: float = 50e-6
    #: NSCC and its plane queue guard: a base RTT is never taken below this (seconds). On
    #: real sockets every RTT includes the userspace peer's turnaround (a receive batch and
    #: its SACKs, about a millisecond in CPython under load), which is no queue; one sample
    #: through an idle host would otherwise scale the window to a fraction of the pipe, and
    #: make its plane alone look queued. sim/ sets 0.
    cc_min_base_rtt: float = 0.001
    #: NSCC, until the fabric's first ECN mark: a queueing delay above this (seconds) reads
    #: as a mark, since a fabric that marks nothing (a Linux router, a tbf) shows its queues
    #: only as delay. Above the jitter of a userspace peer's turnaround (about a millisecond).
    cc_delay_mark: float = 0.002
    #: NSCC: target queueing delay as a fraction of the base RTT (UEC: 0.75 on fabrics that
    #: trim, 1.0 on fabrics that drop).
    cc_target: float = 0.75
    #: NSCC: the largest window in bytes (UEC `max_cwnd`); None = 1.5 × BDP.
    cc_max_cwnd: int | None = None
    #: NSCC's plane queue guard [beyond UEC] (planeq.py): a plane whose own queueing delay,
    #: beyond the least-queued plane's, passes this (seconds) gets its bytes in flight capped.
    plane_queue_min: float = 0.001
    #: The plane queue guard's first cap on a plane's bytes in flight; None = 64 KiB
    #: (planeq.INITIAL_CAP). sim/ sets it to a simulator's initial window to mirror it.
    plane_initial_cap: int | None = None
    #: In-flight packet cap below the MPR window; None = MPR × 128.
    max_inflight: int | None = None
    #: RFC 6298 knobs, kept per plane (docs/DESIGN.md §6).
    initial_rto: float = 0.1
    min_rto: float = 0.005
    max_rto: float = 1.0
    #: Reordering window floor for per-EV loss inference (docs/DESIGN.md §6).
    reorder_min: float = 0.001
    #: The connection closes after this many RTO expiries without progress…
    rto_retries: int = 10
    #: …and at least this long without progress.
    give_up_after: float = 5.0
    #: CM REQUEST retransmission: first interval (doubles) and number of tries.
    cm_retry: float = 0.1
    cm_attempts: int = 8
    #: Probing of DOWN planes and retired EVs: first interval, doubling to the max.
    probe_interval: float = 0.01
    probe_max_interval: float = 1.0
    #: Probes a DOWN plane must answer before it returns (docs/DESIGN.md §4).
    restore_answers: int = 3
    #: Reverse EVs validated on a plane with one known path (docs/DESIGN.md §4): 1 where the
    #: path is the plane (direct links); more where a fabric hashes EVs over paths the host
    #: cannot see (EVs in the flow label), so that one EV hashed through a dead switch does
    #: not make the whole plane look dead. Planes with SRv6 paths take one per path.
    reverse_evs: int = 1
    #: Where this side wants the EV carried (docs/WIRE.md §3): "evxh" (our header),
    #: "flowlabel" (the IPv6 flow label, EVXH left out; IPv6 planes only; offered in the CM
    #: REQUEST and agreed only when both sides want it), or "udp" (EVXH, and the UDP source
    #: port picked by the EV from a pool of sockets per plane; both sides must say so, since
    #: a side that does not would filter the other's ports). The agreed config says what is
    #: used.
    ev_encoding: str = "evxh"
    p_key: int = 0xFFFF
    #: First PSN of our sending direction; None = random (tests start near 2^24 to wrap).
    initial_psn: int | None = None
    #: First MSN we use (0 on a new QP; tests start near 2^16 to wrap).
    initial_msn: int = 0
    #: A responder closes a connection whose requester never spoke after the REPLY.
    half_open_timeout: float = 30.0
    #: Per-packet protection (docs/WIRE.md §7): "none", "auth" (AES-256-GCM tag over every
    #: packet) or "encrypt" (payloads encrypted too). Must match on both sides.
    security: str = "none"
    #: log2 of the packets one AES-GCM key protects before the next epoch's key takes over
    #: (aead.py): 23 = QUIC's AES-GCM limit. Not negotiated: both sides must agree (as p_key).
    rekey_shift: int = 23
    #: A connection whose peer's WRITEs fail more than this many times with a remote access
    #: error (unknown R_Key, out of bounds, or a region not registered for that peer) is
    #: closed: an allowlisted peer cannot search R_Keys (docs/DESIGN.md §6). Counted per message.
    max_access_errors: int = 16
    #: NACKs for trimmed packets (docs/WIRE.md §5) go through a token bucket of their own:
    #: this many a second, bursts of `trim_nack_burst`; the rest are dropped (counted).
    trim_nack_rate: float = 50_000.0
    trim_nack_burst: int = 256

    def validate(self) -> SessionConfig:
        """Return self, or raise LocalProtocolError naming the first bad field."""
        if not MIN_PAYLOAD_MTU <= self.payload_mtu <= MAX_PAYLOAD_MTU:
            raise LocalProtocolError(
                f"payload_mtu must be {MIN_PAYLOAD_MTU}..{MAX_PAYLOAD_MTU}, got {self.payload_mtu}"
            )
        if not 1 <= self.mpr <= 255:
            raise LocalProtocolError(f"mpr must be 1..255, got {self.mpr}")
        if not 1 <= self.flowcell <= MAX_FLOWCELL:
            raise LocalProtocolError(f"flowcell must be 1..{MAX_FLOWCELL}, got {self.flowcell}")
        if not 1 <= self.ev_per_plane <= 255:
            raise LocalProtocolError(f"ev_per_plane must be 1..255, got {self.ev_per_plane}")
        if self.ev_backup_per_plane is not None and not 0 <= self.ev_backup_per_plane <= 4096:
            raise LocalProtocolError("ev_backup_per_plane must be 0..4096")
        if self.ev_min_active is not None and not 1 <= self.ev_min_active <= 255:
            raise LocalProtocolError("ev_min_active must be 1..255")
        if self.ev_encoding not in EV_ENCODINGS:
            raise LocalProtocolError(f"ev_encoding must be one of {EV_ENCODINGS}")
        if not 1 <= self.reverse_evs <= 255:
            raise LocalProtocolError(f"reverse_evs must be 1..255, got {self.reverse_evs}")
        if any(not 1 <= n <= MAX_PLANE_PATHS for n in self.plane_paths):
            raise LocalProtocolError("plane_paths entries must be 1..65536")
        if not 0 < self.plane_mask < 1 << 32:
            raise LocalProtocolError(f"plane_mask must name 1..32 planes, got {self.plane_mask:#x}")
        if not 1 <= self.max_imm <= 0xFFFF:
            raise LocalProtocolError(f"max_imm must be 1..65535, got {self.max_imm}")
        if self.max_inflight is not None and self.max_inflight < 1:
            raise LocalProtocolError("max_inflight must be at least 1")
        if not (self.cc_plane_rate > 0 and self.cc_base_rtt > 0 and self.cc_target > 0):
            raise LocalProtocolError("cc_plane_rate, cc_base_rtt and cc_target must be positive")
        if not 0 <= self.cc_min_base_rtt <= 1:
            raise LocalProtocolError("cc_min_base_rtt must be 0..1 s")
        if not self.cc_delay_mark > 0:
            raise LocalProtocolError("cc_delay_mark must be positive")
        if self.cc_max_cwnd is not None and self.cc_max_cwnd < self.payload_mtu:
            raise LocalProtocolError("cc_max_cwnd must be at least one payload_mtu")
        if not self.plane_queue_min > 0:
            raise LocalProtocolError("plane_queue_min must be positive")
        if self.plane_initial_cap is not None and self.plane_initial_cap < self.payload_mtu:
            raise LocalProtocolError("plane_initial_cap must be at least one payload_mtu")
        if not 0 < self.min_rto <= self.initial_rto <= self.max_rto:
            raise LocalProtocolError("need 0 < min_rto <= initial_rto <= max_rto")
        if self.initial_psn is not None and not 0 <= self.initial_psn < 1 << 24:
            raise LocalProtocolError("initial_psn must be a 24-bit value")
        if not 0 <= self.initial_msn < 1 << 16:
            raise LocalProtocolError("initial_msn must be a 16-bit value")
        if self.security not in SECURITY_LEVELS:
            raise LocalProtocolError(
                f"security must be one of {', '.join(SECURITY_LEVELS)}, got {self.security!r}"
            )
        if not 8 <= self.rekey_shift <= 48:
            raise LocalProtocolError(f"rekey_shift must be 8..48, got {self.rekey_shift}")
        if self.max_access_errors < 0:
            raise LocalProtocolError("max_access_errors must be 0 or more")
        if not (self.trim_nack_rate > 0 and self.trim_nack_burst >= 1):
            raise LocalProtocolError("trim_nack_rate must be positive, trim_nack_burst at least 1")
        return self

    @property
    def window(self) -> int:
        """PSNs the receiver accepts beyond cack_psn (MPR × 128)."""
        return self.mpr * 128

    @property
    def secured(self) -> bool:
        return self.security != "none"

    @property
    def replay_width(self) -> int:
        """Transmit counters the anti-replay window spans: 4 × MPR × 128 (docs/WIRE.md §7)."""
        return 4 * self.window

    @property
    def backups_per_plane(self) -> int:
        b = self.ev_backup_per_plane
        return self.ev_per_plane if b is None else b

    @property
    def min_active(self) -> int:
        m = self.ev_min_active
        # Clamped: the handshake may narrow ev_per_plane below a configured floor.
        return max(1, self.ev_per_plane // 4) if m is None else min(m, self.ev_per_plane)

    def paths_of(self, plane: int) -> int:
        """Paths of `plane` (1 on direct planes)."""
        return self.plane_paths[plane] if plane < len(self.plane_paths) else 1

    @property
    def planes(self) -> list[int]:
        """The plane numbers in `plane_mask`, ascending."""
        return [p for p in range(32) if self.plane_mask >> p & 1]
