"""`python -m tools.hostile`: flags, the root check, one run, its figures and exit status.

`--family` picks what is attacked: `network` (the default) a live bench transfer with hostile
datagrams, `local` a daemon's control socket with hostile local clients
(`tools.hostile.local`), `all` both, one after the other.

Exit status: 0 when no bench process crashed and (with `--security auth|encrypt`) the genuine
transfer came through intact, and every local case passed; 1 otherwise; 2 for bad flags,
missing root, or a run that could not start (one line on stderr). Without `-J` the figures
print as a few lines; with `-J` as one JSON document: the network figures at the top level
(`tools.hostile.report`), the local family's under `local` (`tools.hostile.local`), and
`family`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from mrc.units import parse_size
from tools.hostile import local, report
from tools.hostile.attacks import KINDS
from tools.hostile.localproc import LocalError
from tools.hostile.rawnet import RawNetError
from tools.hostile.run import Options, RunError, run

NOT_ROOT = (
    "hostile: needs root (a packet socket to sniff lo, a raw socket to spoof, clients of other "
    "uids); run as root"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"hostile: error: {message}\n")
        raise SystemExit(2)


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 (unpaced) or a positive rate, got {text!r}")
    return value


def _size(text: str) -> str:
    """A byte count as `mrc bench -n` takes it (checked here, passed on as written)."""
    parse_size(text)
    return text


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown attack kind(s) {', '.join(unknown) or '(none)'}; known: {', '.join(KINDS)}"
        )
    return kinds


def _cases(text: str) -> list[str]:
    cases = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in cases if k not in local.CASES]
    if unknown or not cases:
        raise argparse.ArgumentTypeError(
            f"unknown local case(s) {', '.join(unknown) or '(none)'}; known: "
            f"{', '.join(local.CASES)}"
        )
    return cases


def _uid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a uid: {text!r}") from None
    if not 0 <= value < 1 << 31:
        raise argparse.ArgumentTypeError(f"not a uid: {text!r}")
    return value


def _planes(text: str) -> list[int]:
    try:
        planes = sorted({int(p) for p in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"planes are numbers 0-3, got {text!r}") from None
    if not planes or any(not 0 <= p <= 3 for p in planes):
        raise argparse.ArgumentTypeError(f"planes are numbers 0-3, got {text!r}")
    return planes


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m tools.hostile",
        description="Attack a live verified mrc bench transfer on 4 loopback planes with "
        "hostile datagrams carrying the genuine peers' addresses; report crashes, integrity "
        "and drops by reason (root only).",
    )
    p.add_argument("--datagrams", type=_positive_int, default=1_000_000, metavar="N",
                   help="hostile datagrams to send (default 1000000)")
    p.add_argument("--security", choices=("none", "auth", "encrypt"), default="encrypt",
                   help="the benches' --security (default encrypt; with none the attacks "
                   "succeed, which shows the harness can hurt)")
    p.add_argument("--keys", choices=("listed", "per-run"), default="listed",
                   help="secured runs: listed (default) gives each bench a key file and the "
                   "other's public key as its only peer; per-run lets them make per-run keys "
                   "and skip the allowlist")
    p.add_argument("--kinds", type=_kinds, default=list(KINDS), metavar="K[,K...]",
                   help=f"attack kinds (default all): {', '.join(KINDS)}")
    p.add_argument("--planes", type=_planes, default=[0, 1, 2, 3], metavar="P[,P...]",
                   help="planes to attack (default 0,1,2,3)")
    p.add_argument("-n", "--size", type=_size, default="16G", metavar="BYTES",
                   help="bytes each verified client moves (its -n; default 16G, more than "
                   "moves while 10^6 datagrams go out); if one ends early the next starts")
    p.add_argument("--seconds", type=_seconds, default=600.0, metavar="SEC",
                   help="time limit of the attack (default 600)")
    p.add_argument("--rate", type=_rate, default=0.0, metavar="PER_SEC",
                   help="cap on hostile datagrams per second (default 0: unpaced)")
    p.add_argument("--warmup", type=_rate, default=0.0, metavar="SEC",
                   help="seconds a connection moves data before the attack on it starts "
                   "(default 0)")
    p.add_argument("--seed", type=int, default=None, help="seed of the attacks' randomness")
    p.add_argument("--family", choices=("network", "local", "all"), default="network",
                   help="network (default): hostile datagrams at a live transfer; local: "
                   "hostile clients of a daemon's control socket; all: both")
    p.add_argument("--cases", type=_cases, default=list(local.CASES), metavar="C[,C...]",
                   help=f"local cases (default all): {', '.join(local.CASES)}")
    p.add_argument("--hostile-uid", type=_uid, default=local.HOSTILE, metavar="UID",
                   help=f"uid of the local attacker (default {local.HOSTILE}); 0 makes it "
                   "the daemon's admin, whose view is not isolated: the isolation cases then "
                   "fail, which shows the harness sees a leak")
    p.add_argument("-J", "--json", action="store_true", help="figures as one JSON document")
    return p  # fmt: skip


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through run()'s cleanup, which stops every child


def main(argv: Sequence[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    if os.geteuid() != 0:
        sys.stderr.write(NOT_ROOT + "\n")
        return 2
    opts = Options(
        datagrams=ns.datagrams,
        security=ns.security,
        kinds=ns.kinds,
        planes=ns.planes,
        size=ns.size,
        seconds=ns.seconds,
        rate=ns.rate,
        warmup=ns.warmup,
        seed=ns.seed,
        keys=ns.keys,
    )
    local_opts = local.LocalOptions(cases=ns.cases, hostile_uid=ns.hostile_uid)
    if local_opts.hostile_uid == local_opts.victim_uid:
        local_opts.victim_uid = local.HOSTILE
    if local_opts.hostile_uid == local_opts.stranger_uid:
        local_opts.stranger_uid = local.STRANGER - 1
    signal.signal(signal.SIGTERM, _terminate)
    raw = None
    fig: dict[str, Any] = {}
    status = 0
    try:
        try:
            if ns.family in ("network", "all"):
                raw = run(opts)
                fig = report.figures(raw)
                status = report.verdict(fig)
            fig["family"] = ns.family
            if ns.family in ("local", "all"):
                fig["local"] = local.run_local(local_opts)
                status = max(status, local.verdict(fig["local"]))
        except (RunError, RawNetError, LocalError) as exc:
            sys.stderr.write(f"hostile: {exc}\n")
            return 2
        except KeyboardInterrupt:
            sys.stderr.write("hostile: interrupted\n")
            return 2
        if ns.json:
            sys.stdout.write(json.dumps(fig, indent=2) + "\n")
        else:
            parts = [report.text(fig)] if raw is not None else []
            if "local" in fig:
                parts.append(local.text(fig["local"]))
            sys.stdout.write("\n".join(parts) + "\n")
    finally:
        if raw is not None:
            for proc in (raw.server, *raw.clients):
                if proc is not None:
                    proc.close()
    return status
