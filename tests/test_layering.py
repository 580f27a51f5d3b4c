"""mrc.core, mrc.wire and the switch queue model (mrc.switchq) stay sans-I/O: no direct import of an
I/O, clock or process module.

docs/DESIGN.md §1: imports flow `wire → core → sim | io → daemon → cli`, and core/wire read no clock
and touch no socket; `now` and randomness come in as arguments.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FORBIDDEN = frozenset(
    {
        "socket",
        "asyncio",
        "uvloop",
        "time",
        "os",
        "select",
        "selectors",
        "subprocess",
        "threading",
    }
)
ROOT = Path(__file__).resolve().parent.parent / "mrc"
PACKAGES = ("core", "wire")
#: Top-level modules held to the same rule.
MODULES = ("switchq.py",)


def modules() -> list[Path]:
    found: list[Path] = []
    for package in PACKAGES:
        folder = ROOT / package
        if folder.is_dir():
            found.extend(sorted(folder.rglob("*.py")))
    found.extend(ROOT / name for name in MODULES)
    return found


def forbidden_imports(path: Path) -> list[str]:
    """`line: import name` for every import of a FORBIDDEN module in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        bad.extend(f"{node.lineno}: import {n}" for n in names if n.split(".")[0] in FORBIDDEN)
    return bad


def test_wire_exists() -> None:
    assert (ROOT / "wire" / "__init__.py").is_file()


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_io_imports(path: Path) -> None:
    assert forbidden_imports(path) == []


def test_checker_catches_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import json\nimport os.path\nfrom time import monotonic\nfrom . import time\n"
        "def f():\n    import socket\n",
        encoding="utf-8",
    )
    assert forbidden_imports(sample) == ["2: import os.path", "3: import time", "6: import socket"]
