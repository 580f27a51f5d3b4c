"""The units of the command line, read and printed: byte counts, seconds, bounded integers.

Holds what more than one command parses its flags with (`parse_size`, `parse_seconds`,
`int_range`, `UsageError` for a bad combination of flags) and iperf3's way of printing byte
counts and rates (`fmt_bytes`, `fmt_rate`). `mrc bench`, `mrc switch`, `mrc collective-bench`,
the collective's rank process and the tools import it; it imports nothing of mrc, so it sits
below all of them. Each command's own flags and checks stay in its module.

Byte counts follow iperf3: `K`, `M`, `G`, `T` (and `KiB`, `MiB`, …) are powers of 1024; `kB`,
`MB`, `GB`, `TB` are powers of 1000. Printed transfers are in base 1024, rates in base 1000.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence

__all__ = [
    "UsageError",
    "fmt_bytes",
    "fmt_rate",
    "int_range",
    "parse_seconds",
    "parse_size",
]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


class UsageError(Exception):
    """A bad combination of flags; reported as one line with exit status 2."""


def parse_size(text: str) -> int:
    """'256M' → 268435456, '1GiB', '1.5K', '4096', '10MB' (10**7)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (try 256M, 1G, 64KiB)")
    unit = m.group(2).lower()
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"unknown size suffix {m.group(2)!r} in {text!r}")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"byte count must be positive: {text!r}")
    return value


def parse_seconds(text: str) -> float:
    """A finite number of seconds, at least 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value != value or value < 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be a finite number >= 0: {text!r}")
    return value


def int_range(lo: int, hi: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer (decimal, or 0x… as Python reads it) in lo..hi."""

    def conv(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{what} must be {lo}..{hi}, got {value}")
        return value

    conv.__name__ = what  # argparse names the type in its "invalid <name> value" message
    return conv


def _scaled(value: float, units: Sequence[str], base: float) -> str:
    unit = 0
    while value >= base * 0.99995 and unit < len(units) - 1:
        value /= base
        unit += 1
    if value < 9.995:
        num = f"{value:4.2f}"
    elif value < 99.95:
        num = f"{value:4.1f}"
    else:
        num = f"{value:4.0f}"
    return f"{num} {units[unit]}"


def fmt_bytes(n: float) -> str:
    """iperf3's transfer column: '256 MBytes', '1.50 GBytes' (base 1024)."""
    return _scaled(float(n), ("Bytes", "KBytes", "MBytes", "GBytes", "TBytes"), 1024.0)


def fmt_rate(bits_per_second: float) -> str:
    """iperf3's bitrate column: '5.52 Gbits/sec' (base 1000)."""
    units = ("bits/sec", "Kbits/sec", "Mbits/sec", "Gbits/sec", "Tbits/sec")
    return _scaled(bits_per_second, units, 1000.0)
