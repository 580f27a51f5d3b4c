"""Failover arithmetic on receiver byte logs: windows, gaps, time to 50 %, post-fault goodput.

A log is a list of `Window`s `(start, end, bytes)` on CLOCK_MONOTONIC seconds: bytes that
arrived in (start, end]. Three kinds feed it (see the package docstring for who writes them):
the MPTCP receiver's 1 ms bins (`bins_windows`), the 1 ms samples of the receiving
namespace's interface counters (`sampler_windows`), and `mrc bench`'s 10 ms receiver
intervals (`interval_windows`). `failover` turns one log and the fault time into the numbers
the report shows; the rules are in its docstring. `series` turns the same log into fixed bins
of goodput on the same clock, for `mrc plot` to draw both transports aligned at the fault.
"""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Any, NamedTuple

PRE_SECONDS = 1.5  # the pre-failure rate is the mean over this long before the fault
SKIP_START = 0.3  # … but never over the first 0.3 s of the transfer (slow start, set-up)
RECOVERY_WINDOW = 0.010  # the time to 50 % is judged on 10 ms windows
RECOVERED_OVER = 0.100  # … and "regained" means: held over the next 100 ms
POST_SKIP = 0.5  # post-failure goodput starts this long after the fault
FAULT_LEAD, FAULT_SPAN = 0.050, 0.500  # "the gap at the fault" starts in this span
SERIES_BIN = 0.010  # compare.json's failover series: 10 ms bins, mrc's finest interval


class Window(NamedTuple):
    start: float
    end: float
    bytes: int


def bins_windows(first: float, bins_ms: list[int]) -> list[Window]:
    """The MPTCP receiver's bins: bin i holds the bytes read in [first + i ms, first + i+1 ms)."""
    return [Window(first + i / 1000, first + (i + 1) / 1000, n) for i, n in enumerate(bins_ms)]


def sampler_windows(doc: dict[str, Any]) -> tuple[list[Window], list[list[Window]]]:
    """The sampler's cumulative counters as per-sample windows: the total, and per interface."""
    t: list[float] = doc["t"]
    per_iface: list[list[Window]] = []
    for col in doc["rx"]:
        per_iface.append([Window(t[i - 1], t[i], col[i] - col[i - 1]) for i in range(1, len(t))])
    total = [Window(t[i - 1], t[i], sum(col[i] - col[i - 1] for col in doc["rx"]))
             for i in range(1, len(t))]
    return total, per_iface


def interval_windows(t0: float, intervals: list[dict[str, Any]]) -> list[Window]:
    """`mrc bench -J` receiver intervals, placed at `t0` (the first data seen on the wire)."""
    return [Window(t0 + iv["sum"]["start"], t0 + iv["sum"]["end"], int(iv["sum"]["bytes"]))
            for iv in intervals]


def first_data(windows: list[Window], min_bytes: int) -> float | None:
    """The end of the first window that carries at least `min_bytes`."""
    for w in windows:
        if w.bytes >= min_bytes:
            return w.end
    return None


def _span(windows: list[Window], lo: float, hi: float) -> tuple[int, float]:
    """Bytes of the windows whose end lies in (lo, hi], and the time they cover."""
    got = [w for w in windows if lo < w.end <= hi]
    if not got:
        return 0, 0.0
    return sum(w.bytes for w in got), got[-1].end - got[0].start


def rate(windows: list[Window], lo: float, hi: float) -> float:
    n, secs = _span(windows, lo, hi)
    return n * 8 / secs if secs > 0 else 0.0


def longest_gap(windows: list[Window], lo: float, hi: float,
                min_bytes: int = 1) -> tuple[float, float]:
    """The longest stretch, within [lo, hi], between two windows that each carry at least
    `min_bytes`: the end of the one to the start of the next (empty windows in between).
    With 1 ms samples this is exact to the sample spacing. Returns (length, start)."""
    best, at = 0.0, lo
    last_end: float | None = None
    for w in windows:
        if w.end < lo or w.start > hi:
            continue
        if w.bytes >= min_bytes:
            if last_end is not None and w.start - last_end > best:
                best, at = w.start - last_end, last_end
            last_end = w.end
    return best, at


def exact_gaps(first: float, gaps: list[list[float]], lo: float,
               hi: float) -> tuple[float, float]:
    """The longest of the MPTCP receiver's exact read-to-read gaps that starts in [lo, hi]:
    (length, start)."""
    found = [(g[1], first + g[0]) for g in gaps if lo <= first + g[0] <= hi]
    return max(found, default=(0.0, lo))


def failover(windows: list[Window], t_fault: float, *, min_bytes: int = 1,
             exact: list[list[float]] | None = None, first: float = 0.0) -> dict[str, Any]:
    """The failover numbers of one receiver log (times in seconds):

    - `pre_bps`: mean rate over the 1.5 s before the fault (not before 0.3 s into the
      transfer);
    - `longest_gap_s`: the longest stretch with no window carrying `min_bytes`, from 1 s
      before the fault to the last data (or `exact_gap` when the log has exact gaps), and
      `longest_gap_at_s`, where it starts relative to the fault; `fault_gap_s` and
      `fault_gap_at_s`: the same but only for gaps that start between 50 ms before and
      500 ms after the fault (the stall the failure itself caused); `pre_gap_s`: the same
      for gaps that start in the pre-failure span (the transport's own jitter, no fault);
    - `to_half_s`: time to regain 50 % of `pre_bps`. 10 ms windows are laid from the fault
      on; if none of those in the first second is below half `pre_bps`, it is 0. Otherwise,
      from the first one that is, it is the start of the first window that is itself back at
      half `pre_bps` or more and from which the mean over the next 100 ms is too (so a
      trickle between stalls does not count as recovered); None if that never happens;
    - `lost_in_first_s`: 1 s minus the bytes delivered in the first second after the fault
      expressed in seconds at `pre_bps` (0 = no loss of progress; 1 = nothing delivered);
    - `post_bps`: mean rate from 0.5 s after the fault to the last window with data;
      `post_vs_3_of_4`: `post_bps / (0.75 × pre_bps)` (1.0 = the whole 3-plane share).
    """
    data = [w for w in windows if w.bytes >= min_bytes]
    if not data:
        return {"error": "no data in the log"}
    begin, last = data[0].start, data[-1].end
    pre_lo = max(begin + SKIP_START, t_fault - PRE_SECONDS)
    pre = rate(windows, pre_lo, t_fault)
    spans = ((t_fault - 1.0, last), (t_fault - FAULT_LEAD, t_fault + FAULT_SPAN),
             (pre_lo, t_fault - FAULT_LEAD))
    if exact is not None:
        (gap, gap_at), (fgap, fgap_at), (pgap, _) = (exact_gaps(first, exact, lo, hi)
                                                     for lo, hi in spans)
    else:
        (gap, gap_at), (fgap, fgap_at), (pgap, _) = (longest_gap(windows, lo, hi, min_bytes)
                                                     for lo, hi in spans)
    to_half = _to_half(windows, t_fault, last, pre) if pre > 0 else None
    got_1s, _ = _span(windows, t_fault, t_fault + 1.0)
    lost = max(0.0, 1.0 - got_1s * 8 / pre) if pre > 0 and last >= t_fault + 1.0 else None
    post = rate(windows, t_fault + POST_SKIP, last)
    return {
        "pre_bps": pre,
        "longest_gap_s": round(gap, 6),
        "longest_gap_at_s": round(gap_at - t_fault, 3),
        "fault_gap_s": round(fgap, 6),
        "fault_gap_at_s": round(fgap_at - t_fault, 3),
        "pre_gap_s": round(pgap, 6),
        "to_half_s": None if to_half is None else round(to_half, 3),
        "lost_in_first_s": None if lost is None else round(lost, 3),
        "post_bps": post,
        "post_vs_3_of_4": post / (0.75 * pre) if pre > 0 else None,
        "post_seconds": round(max(0.0, last - t_fault - POST_SKIP), 3),
        "pre_from_s": round(pre_lo - begin, 3),
        "fault_at_s": round(t_fault - begin, 3),
    }


def series(windows: list[Window], t_fault: float, *, min_bytes: int = 1,
           bin_seconds: float = SERIES_BIN) -> dict[str, Any]:
    """Goodput in `bin_seconds` bins from the start of the first window that carries
    `min_bytes` (the transfer start `failover` measures from) to the end of the last one:
    `{bin_seconds, t0, fault_at_s, bps}`, times relative to that start, as docs/DESIGN.md §10
    lays out compare.json. A window wider than a bin (mrc's late intervals) spreads its
    bytes over the bins it covers in proportion to the overlap; a zero-width one counts in
    the bin of its end."""
    data = [w for w in windows if w.bytes >= min_bytes]
    if not data:
        return {"error": "no data in the log"}
    begin, last = data[0].start, data[-1].end
    bins = [0.0] * max(1, math.ceil((last - begin) / bin_seconds - 1e-9))
    for w in windows:
        lo, hi = max(w.start, begin) - begin, min(w.end, last) - begin
        if w.bytes <= 0 or hi < lo or (hi == lo and w.end != w.start):
            continue
        if hi == lo:
            bins[min(len(bins) - 1, int(lo / bin_seconds))] += w.bytes
            continue
        share = w.bytes / (w.end - w.start)  # bytes per second of the window
        k = int(lo / bin_seconds)
        while k < len(bins) and k * bin_seconds < hi:
            overlap = min(hi, (k + 1) * bin_seconds) - max(lo, k * bin_seconds)
            bins[k] += share * max(0.0, overlap)
            k += 1
    return {
        "bin_seconds": bin_seconds,
        "t0": 0.0,
        "fault_at_s": round(t_fault - begin, 6),
        "bps": [round(b * 8 / bin_seconds) for b in bins],
    }


def _to_half(windows: list[Window], t_fault: float, last: float, pre: float) -> float | None:
    ends = [w.end for w in windows]
    cum = [0, *itertools.accumulate(w.bytes for w in windows)]

    def bps(lo: float, length: float) -> float:
        n = cum[bisect.bisect_right(ends, lo + length)] - cum[bisect.bisect_right(ends, lo)]
        return n * 8 / length

    steps = int((last - t_fault) / RECOVERY_WINDOW)
    dip = next((k for k in range(min(steps, int(1.0 / RECOVERY_WINDOW)))
                if bps(t_fault + k * RECOVERY_WINDOW, RECOVERY_WINDOW) < 0.5 * pre), None)
    if dip is None:
        return 0.0
    for k in range(dip, steps - int(RECOVERED_OVER / RECOVERY_WINDOW) + 1):
        lo = t_fault + k * RECOVERY_WINDOW
        if min(bps(lo, RECOVERY_WINDOW), bps(lo, RECOVERED_OVER)) >= 0.5 * pre:
            return k * RECOVERY_WINDOW
    return None


def plane_shares(per_iface: list[list[Window]], lo: float, hi: float) -> list[int]:
    """Bytes per interface with window ends in (lo, hi]."""
    return [_span(col, lo, hi)[0] for col in per_iface]
