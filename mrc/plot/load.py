"""Opening an input of `mrc plot` and telling what it is: bench -J, trace or compare.json.

`load(path)` reads the file and returns a `Run`; every problem is a `PlotError` of one line
that names the file: unreadable, empty, truncated or not JSON, JSON of another tool. A file
of several concatenated `-J` documents (a server that ran several tests) gives its last test.
compare.json (written by `make compare`, tools/compare) is read here too: only its
`failover.<transport>.series`. What it leaves to others: the bench and trace formats
themselves (`bench.py`, `trace.py`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .bench import is_bench, read_bench
from .model import FailoverSeries, PlotError, Run
from .trace import is_trace_header, read_trace

__all__ = ["MAX_INPUT_BYTES", "load", "read_compare"]

MAX_INPUT_BYTES = 1 << 30  # a 10 s trace is documented to stay far below this


def load(path: str) -> Run:
    content = _read(path)
    if not content.strip():
        raise PlotError(f"{path}: empty file")
    first = content.lstrip().split("\n", 1)[0]
    if is_trace_header(first) or '"mrc-trace"' in first:
        return read_trace(path, content.lstrip())
    docs = _json_docs(path, content)
    doc = docs[-1]
    if is_bench(doc):
        if not all(is_bench(d) for d in docs):
            raise PlotError(f"{path}: mixes bench -J documents with other JSON")
        run = read_bench(path, doc)
        if len(docs) > 1:
            run.notes.append(f"{path} holds {len(docs)} tests; plotting the last")
        return run
    if len(docs) == 1 and isinstance(doc, dict) and doc.get("tool") == "tools.compare":
        return read_compare(path, doc)
    if isinstance(docs[0], dict) and isinstance(docs[0].get("format"), str):
        raise PlotError(f"{path}: not an mrc trace (the first line is not a header with "
                        'format "mrc-trace")')
    raise PlotError(f"{path}: not an mrc bench -J document, trace or compare.json")


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise PlotError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise PlotError(f"{path}: larger than {MAX_INPUT_BYTES >> 20} MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlotError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def _json_docs(path: str, content: str) -> list[Any]:
    """The JSON documents of `content`, one or several back to back."""
    dec = json.JSONDecoder()
    docs: list[Any] = []
    i, n = 0, len(content)
    while True:
        while i < n and content[i].isspace():
            i += 1
        if i >= n:
            return docs
        try:
            doc, i = dec.raw_decode(content, i)
        except RecursionError:
            raise PlotError(f"{path}: JSON nested too deeply to be a document of mrc") from None
        except json.JSONDecodeError as exc:
            rest = content[exc.pos:].rstrip()
            # an unterminated string that runs to the end of the file was cut off too
            cut = exc.msg.startswith("Unterminated string") and "\n" not in rest
            if cut or not rest:
                raise PlotError(f"{path}: truncated JSON (it ends at line {exc.lineno} "
                                "before the document is complete)") from None
            raise PlotError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: "
                            f"{exc.msg})") from None
        docs.append(doc)


def read_compare(path: str, doc: dict[str, Any]) -> Run:
    """compare.json's failover series (tools/compare/failover.py writes them)."""
    fo = doc.get("failover")
    if not isinstance(fo, dict) or not fo:
        raise PlotError(f"{path}: compare.json without a failover run")
    run = Run(path=path, kind="compare")
    for transport in ("mrc", "mptcp"):
        part = fo.get(transport)
        raw = part.get("series") if isinstance(part, dict) else None
        if raw is None:
            continue
        try:
            run.failover[transport] = _series(transport, raw)
        except (KeyError, TypeError, ValueError):
            raise PlotError(f"{path}: failover.{transport}.series is malformed") from None
    if not run.failover:
        raise PlotError(f"{path}: compare.json has no failover series (written before "
                        "mrc plot existed: run make compare again)")
    run.duration = max(s.t0 + len(s.bps) * s.bin_seconds for s in run.failover.values())
    return run


def _series(transport: str, raw: dict[str, Any]) -> FailoverSeries:
    bin_s, t0, fault = (float(raw[k]) for k in ("bin_seconds", "t0", "fault_at_s"))
    bps = raw["bps"]
    finite = all(map(math.isfinite, (bin_s, t0, fault)))
    if not isinstance(bps, list) or not finite or bin_s <= 0:
        raise ValueError("bps")
    return FailoverSeries(transport, bin_s, t0, fault, tuple(float(b) for b in bps))
