"""`mrc plot` end to end through the command line: figures written, bad input refused.

Every bad input is one line on stderr naming what is wrong, exit status 1, no traceback.
"""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from plotdocs import bench_doc, client_doc, interval, trace_lines, write_json, write_trace

from mrc.cli import main
from mrc.plot import load, render


def plot(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["plot", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc, out, err = plot(capsys, *args)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("mrc plot")
    return err.rstrip("\n")


def test_png_next_to_the_input_by_default(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    src = write_json(tmp_path / "client.json", client_doc())
    rc, out, err = plot(capsys, str(src))
    assert (rc, err) == (0, "")
    assert out == f"wrote {tmp_path / 'client.png'} (goodput, evs, cc)\n"
    assert (tmp_path / "client.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_svg_of_one_panel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_trace(tmp_path / "run.trace", trace_lines())
    out_path = tmp_path / "evs.svg"
    rc, out, _ = plot(capsys, str(src), "-o", str(out_path), "--what", "evs")
    assert rc == 0 and out == f"wrote {out_path} (evs)\n"
    svg = out_path.read_text(encoding="utf-8")
    assert "<svg" in svg and "EV states over time" in svg


def test_the_figure_says_what_it_shows(tmp_path: Path) -> None:
    fig, chosen = render(load(str(write_json(tmp_path / "c.json", client_doc()))))
    assert chosen == ["goodput", "evs", "cc"]
    good, evs, cc = fig.axes[:3]
    assert good.get_ylabel() == "Gbit/s" and cc.get_ylabel() == "MiB (log scale)"
    assert good.get_title().startswith("Goodput per plane (bytes sent by the client")
    labels = [str(ln.get_label()) for ln in good.get_lines()]
    assert [s for s in labels if s.startswith("plane")] == ["plane 0", "plane 1"]
    assert cc.get_xlabel() == "time since the test started (s)"
    legend = evs.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == [
        "good (carrying data)", "skip (ECN/trim)", "retired (assumed bad)", "probing",
        "backup (spare)"]
    # the fault and the burst are marked with their times on the top panel
    texts = [t.get_text() for t in good.texts]
    assert texts == ["fault: plane 1 (0.020 s)", "2 EVs retired on plane 1 (timeout) (0.022 s)"]


def test_unreadable_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.json"
    assert refused(capsys, str(missing)) == (
        f"mrc plot: cannot read {missing}: No such file or directory")
    assert refused(capsys, str(tmp_path)) == f"mrc plot: cannot read {tmp_path}: Is a directory"


def test_empty_binary_truncated_and_foreign_files(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    assert refused(capsys, str(empty)) == f"mrc plot: {empty}: empty file"
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x00\xff\xfe")
    assert refused(capsys, str(binary)) == f"mrc plot: {binary}: not UTF-8 text (byte 1)"
    text = json.dumps(client_doc(), indent=1)
    for cut in (len(text) // 2, len(text) - 3):
        cut_file = tmp_path / f"cut{cut}.json"
        cut_file.write_text(text[:cut])
        assert "truncated JSON (it ends at line" in refused(capsys, str(cut_file))
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"start": nonsense}\n')
    assert refused(capsys, str(garbage)) == (
        f"mrc plot: {garbage}: not JSON (line 1, column 11: Expecting value)")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert refused(capsys, str(deep)) == (
        f"mrc plot: {deep}: JSON nested too deeply to be a document of mrc")
    foreign = write_json(tmp_path / "foreign.json", {"hello": [1, 2]})
    assert refused(capsys, str(foreign)) == (
        f"mrc plot: {foreign}: not an mrc bench -J document, trace or compare.json")
    qlog = tmp_path / "other.jsonl"
    qlog.write_text('{"format": "qlog", "version": 1}\n{"t": 1}\n')
    assert refused(capsys, str(qlog)) == (
        f'mrc plot: {qlog}: not an mrc trace (the first line is not a header with format '
        '"mrc-trace")')


def test_failed_bench_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server"}
    src = write_json(tmp_path / "failed.json", doc)
    assert refused(capsys, str(src)) == (
        f"mrc plot: {src}: the bench run failed: unable to connect to server")


def test_run_without_intervals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_json(tmp_path / "noi.json", bench_doc([], []))
    assert refused(capsys, str(src), "--what", "goodput") == (
        f"mrc plot: {src}: no intervals: run mrc bench with -i")
    # with nothing else to draw, "all" says the first thing missing
    assert refused(capsys, str(src)) == f"mrc plot: {src}: no intervals: run mrc bench with -i"


def test_trace_newer_empty_truncated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = trace_lines()
    newer = write_trace(tmp_path / "v2.trace", [{**recs[0], "version": 2}, *recs[1:]])
    assert refused(capsys, str(newer)) == (
        f"mrc plot: {newer}: trace version 2 is newer than this mrc reads (1)")
    bare = write_trace(tmp_path / "bare.trace", recs[:1])
    assert refused(capsys, str(bare)) == (
        f"mrc plot: {bare}: no records (the trace has only its header)")
    # a writer cut off mid-line: the partial last line is ignored, the rest drawn
    cut = write_trace(tmp_path / "cut.trace", recs[:-1], tail='{"t": 0.04, "kind": "e')
    rc, out, err = plot(capsys, str(cut), "-o", str(tmp_path / "cut.png"))
    assert (rc, err) == (0, "")
    assert out == f"wrote {tmp_path / 'cut.png'} (goodput, evs, cc)\n"


def test_malformed_records_are_counted(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    recs = trace_lines()
    bad = [recs[0], {"t": "soon", "kind": "cc"}, {"t": 0.01, "kind": "ev", "ev": "x"},
           *recs[1:]]
    src = write_trace(tmp_path / "bad.trace", bad)
    text = src.read_text().replace('"kind": "cc"}', '"kind": "cc"}\nnot json at all', 1)
    src.write_text(text)
    rc, out, _ = plot(capsys, str(src), "-o", str(tmp_path / "bad.png"))
    assert rc == 0
    assert out == f"wrote {tmp_path / 'bad.png'} (goodput, evs, cc); 3 malformed records skipped\n"
    doc = client_doc()
    doc["intervals"].append({"sum": {"start": 0.05}})
    doc["end"]["mrc"]["events"].append({"t": None})
    doc["end"]["mrc"]["ev_timeline"].append({"t": float("inf"), "ev": 1, "plane": 0})
    src = write_json(tmp_path / "bad.json", doc)
    rc, out, _ = plot(capsys, str(src))
    assert out.endswith("(goodput, evs, cc); 3 malformed records skipped\n")


def test_several_tests_in_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = bench_doc([interval(0.0, 0.01, [1, 1], sender=False)], [], role="server")
    src = tmp_path / "server.json"
    src.write_text(json.dumps(first) + "\n" + json.dumps(client_doc()) + "\n")
    rc, out, _ = plot(capsys, str(src))
    assert rc == 0
    assert out == (f"wrote {tmp_path / 'server.png'} (goodput, evs, cc); {src} holds 2 tests; "
                   "plotting the last\n")


def test_outputs_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_json(tmp_path / "client.json", client_doc())
    assert refused(capsys, str(src), "-o", str(tmp_path / "x.jpg")) == (
        f"mrc plot: {tmp_path / 'x.jpg'}: the output must end in .png or .svg")
    where = tmp_path / "no" / "dir.png"
    assert refused(capsys, str(src), "-o", str(where)) == (
        f"mrc plot: cannot write {where}: No such file or directory")


def test_compare_without_series(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_json(tmp_path / "compare.json", {"tool": "tools.compare", "version": 1,
                                                 "failover": {"mrc": {"fault_at_s": 2.0}}})
    assert refused(capsys, str(src)) == (
        f"mrc plot: {src}: compare.json has no failover series (written before mrc plot "
        "existed: run make compare again)")
    assert refused(capsys, str(write_json(tmp_path / "c.json", client_doc())), "--what",
                   "failover") == (
        f"mrc plot: {tmp_path / 'c.json'}: the failover panel needs a compare.json "
        "(make compare)")


def test_without_matplotlib(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    src = write_json(tmp_path / "client.json", client_doc())
    assert refused(capsys, str(src)) == "mrc plot needs matplotlib: pip install 'mrc[plot]'"
    assert not (tmp_path / "client.png").exists()


def test_every_truncation_is_a_line_or_a_plot(tmp_path: Path) -> None:
    """A file cut anywhere (a writer killed, a copy cut short) is refused with a PlotError
    or drawn from what is left; never another exception. A JSON document only whole; a trace
    as soon as one record after the header is complete."""
    from mrc.plot import PlotError
    from mrc.plot.series import ev_panel, goodput, marks, panels, windows

    lines = [json.dumps(r) + "\n" for r in trace_lines()]
    first_record_end = len(lines[0]) + len(lines[1])
    for name, text, drawn_from in (
        ("t.trace", "".join(lines), first_record_end - 1),  # its newline may be missing
        ("b.json", json.dumps(client_doc()), len(json.dumps(client_doc()))),
    ):
        for cut in range(0, len(text), 37):
            path = tmp_path / name
            path.write_text(text[:cut])
            try:
                run = load(str(path))
                for panel in panels(run, "all"):
                    {"goodput": goodput, "evs": ev_panel, "cc": windows}[panel](run)
                marks(run)
            except PlotError as exc:
                assert "\n" not in str(exc)
                assert cut < drawn_from, (name, cut, str(exc))
            else:
                assert cut >= drawn_from, (name, cut)


JUNK: list[object] = [None, True, 0, -1, 1.5, "x", [], {}, [1], {"a": 1}, float("nan"), 10**30]


def _paths(o: object, pre: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [pre] if pre else []
    if isinstance(o, dict):
        for k, v in o.items():
            out += _paths(v, (*pre, k))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            out += _paths(v, (*pre, i))
    return out


def _mutated(doc: object, rng: random.Random) -> object:
    d = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(_paths(d) or [()])
        if not where:
            continue
        parent: Any = d
        for k in where[:-1]:
            parent = parent[k]
        parent[where[-1]] = copy.deepcopy(rng.choice(JUNK))
    return d


def test_mistyped_fields_are_a_line_or_a_plot(tmp_path: Path) -> None:
    """Fields of a -J, a trace and a compare.json replaced by values of other types (seeded,
    600 documents): each is read, refused in one line or drawn from its good records; any
    other exception fails."""
    from mrc.plot import PlotError
    from mrc.plot.series import ev_panel, failover, goodput, marks, panels, windows

    rng = random.Random(16)
    compare = {"tool": "tools.compare", "version": 1, "failover": {"mrc": {"series": {
        "bin_seconds": 0.01, "t0": 0.0, "fault_at_s": 0.02, "bps": [1e9, 2e9, 0.0]}}}}
    outcomes = {"refused": 0, "drawn": 0}
    for i in range(600):
        kind = i % 3
        path = tmp_path / f"m{kind}.json"
        if kind == 0:
            path.write_text(json.dumps(_mutated(client_doc(), rng)))
        elif kind == 1:
            recs = [_mutated(r, rng) if rng.random() < 0.2 else r for r in trace_lines()]
            path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        else:
            path.write_text(json.dumps(_mutated(compare, rng)))
        try:
            run = load(str(path))
            draw = {"goodput": goodput, "evs": ev_panel, "cc": windows, "failover": failover}
            for panel in panels(run, "all"):
                draw[panel](run)
            marks(run)
        except PlotError as exc:
            assert "\n" not in str(exc)
            outcomes["refused"] += 1
        else:
            outcomes["drawn"] += 1
    assert outcomes["refused"] > 0 and outcomes["drawn"] > 0, outcomes
