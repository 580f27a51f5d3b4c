"""The project's own documents (mrc/docs) and the citations that point into them.

Code, tests and tools cite `docs/DESIGN.md §N`, `docs/WIRE.md §N`, `docs/NOTES.md §N` and
`docs/COLLECTIVE.md §N` (files under mrc/docs). These tests check that the architecture and the
wire format keep their numbered sections and the notebook numbers its sections after the
architecture's, that every citation names a section that exists, that nothing cites a document
outside the repository (a bare design, wire, notes or collective name, or the research notes
the code was first written from), and that the documents go into the wheel and the source
archive.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "mrc" / "docs"
#: The documents and the section numbers each must keep (their subjects are fixed, see
#: mrc/docs/README.md), so old citations can be rewritten mechanically.
EXPECTED = {"DESIGN.md": range(1, 13), "WIRE.md": range(1, 8)}
#: The lab notebook: its sections carry the numbers of the DESIGN.md sections they back and grow
#: as entries are added, so only its citations are checked, against the sections it has.
NOTEBOOK = "NOTES.md"
#: Documents cited by section whose numbering is their own business: only citations are checked.
CITED = (NOTEBOOK, "COLLECTIVE.md")
#: Citations of documents that are not in the repository: a design or wire note named without
#: its place under mrc/docs, or the research notes kept outside the tree.
_OUTSIDE = re.compile(r"(?<![/\w.])(?:DESIGN|WIRE|NOTES|COLLECTIVE)\.md|reference/\w[\w-]*\.md")
SCANNED = ("mrc", "tests", "tools")
SKIPPED_DIRS = frozenset({"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"})

_HEADING = re.compile(r"^## (\d+)\. \S", re.MULTILINE)
# `docs/wire.md §2`, `§2–§3`, `§2-3`, `§4, §6`, `§4 and §6` ...; a comma not followed by `§`
# (as in `§4, 0x80`) ends the citation.
_SECTION = r"§\s*\d+(?:\s*[–-]\s*§?\s*\d+)?"
_DOCS = r"docs/(DESIGN|WIRE|NOTES|COLLECTIVE)\.md"
_CITATION = re.compile(_DOCS + r"((?:\s*(?:,|and|or|&)?\s*" + _SECTION + r")*)")
_NUMBER = re.compile(r"\d+")


def sections(text: str) -> list[int]:
    """The numbers of a document's `## N. Title` headings, in order."""
    return [int(n) for n in _HEADING.findall(text)]


def citations(text: str) -> Iterator[tuple[int, str, list[int]]]:
    """(line, document, section numbers) for each citation in `text`; a range gives both
    ends."""
    for match in _CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        yield line, match.group(1) + ".md", [int(n) for n in _NUMBER.findall(match.group(2))]


def problems(path: Path, text: str, known: dict[str, set[int]]) -> list[str]:
    """One line per bad citation in `text` (from `path`). The documents in mrc/docs name each
    other by file name, and this file spells the forbidden forms to test the checker."""
    out: list[str] = []
    siblings = path.parent == Path("mrc/docs") or path.name == "test_docs.py"
    for lineno, line in enumerate(text.splitlines() if not siblings else [], 1):
        out.extend(f"{path}:{lineno}: cites {m} (not in the repository)" for m in
                   _OUTSIDE.findall(line))  # fmt: skip
    for lineno, doc, numbers in citations(text):
        out.extend(
            f"{path}:{lineno}: docs/{doc} has no §{n}" for n in numbers if n not in known[doc]
        )
    return out


def repo_texts() -> Iterator[tuple[Path, str]]:
    """Every text file under mrc/, tests/ and tools/, and the top-level README."""
    paths = [ROOT / "README.md"]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT)
            if path.is_file() and not SKIPPED_DIRS & set(rel.parts):
                paths.append(path)
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: cannot hold a citation
        yield path.relative_to(ROOT), text


def known_sections() -> dict[str, set[int]]:
    names = (*EXPECTED, *CITED)
    return {name: set(sections((DOCS / name).read_text(encoding="utf-8"))) for name in names}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_documents_keep_their_section_numbers(name: str) -> None:
    assert sections((DOCS / name).read_text(encoding="utf-8")) == list(EXPECTED[name])


def test_citations_resolve() -> None:
    known = known_sections()
    found = [line for path, text in repo_texts() for line in problems(path, text, known)]
    assert found == []


def test_checker_catches_bad_citations() -> None:
    known = {"DESIGN.md": {1, 2, 6}, "WIRE.md": {3, 4}}
    text = (
        "see docs/DESIGN.md §6 and docs/WIRE.md §2–§3\n"
        "also docs/DESIGN.md §1, §2 and §9\n"
        "fine: docs/WIRE.md §4, 0x80 and docs/DESIGN.md, mrc/docs/DESIGN.md\n"
        "old: " + "DESIGN" + ".md §4 and reference/" + "protocol.md §2.6\n"
    )
    assert problems(Path("x.py"), text, known) == [
        "x.py:4: cites DESIGN.md (not in the repository)",
        "x.py:4: cites reference/protocol.md (not in the repository)",
        "x.py:1: docs/WIRE.md has no §2",
        "x.py:2: docs/DESIGN.md has no §9",
    ]


def test_citation_parser_reads_ranges_and_lists() -> None:
    text = "docs/WIRE.md §2-§6 x\ndocs/DESIGN.md §4, §6 and §10; docs/WIRE.md §5"
    assert list(citations(text)) == [
        (1, "WIRE.md", [2, 6]),
        (2, "DESIGN.md", [4, 6, 10]),
        (2, "WIRE.md", [5]),
    ]


def test_notebook_citations_are_checked() -> None:
    """docs/NOTES.md citations resolve against the notebook's own sections; a bare NOTES.md
    outside mrc/docs is a citation of a file that is not there."""
    known = {"DESIGN.md": {6}, "WIRE.md": set(), "NOTES.md": {6}}
    text = "docs/NOTES.md §6 and §11\nsee " + "NOTES" + ".md §6\n"
    assert problems(Path("x.py"), text, known) == [
        "x.py:2: cites NOTES.md (not in the repository)",
        "x.py:1: docs/NOTES.md has no §11",
    ]


def test_notebook_sections_ascend_each_once() -> None:
    """A notebook section is numbered after the DESIGN.md section it backs: each number once, in
    order, and one DESIGN.md has."""
    numbers = sections((DOCS / NOTEBOOK).read_text(encoding="utf-8"))
    assert numbers == sorted(set(numbers))
    assert set(numbers) <= set(EXPECTED["DESIGN.md"])


def test_documents_ship_in_wheel_and_sdist() -> None:
    """The hatch build targets cover mrc/docs (a directory pattern includes what is below it)."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    targets = build["tool"]["hatch"]["build"]["targets"]
    docs = [f"mrc/docs/{name}" for name in (*EXPECTED, *CITED, "DAEMON.md", "README.md")]

    def covered(patterns: list[str], path: str) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in patterns)

    wheel = targets["wheel"]
    sdist = targets["sdist"]
    for path in docs:
        assert (ROOT / path).is_file()
        assert covered(wheel.get("packages", []) + wheel.get("include", []), path)
        assert covered(sdist.get("include", []), path)
        assert not covered(wheel.get("exclude", []) + sdist.get("exclude", []), path)
