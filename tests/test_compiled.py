"""The compiled build of mrc.wire, mrc.core and mrc.io is the one imported, MRC_PURE=1 the pure one.

`make install` compiles the two packages with mypyc (tools/build_mypyc.py); mrc/_build.py decides
at `import mrc` which modules load. Each check imports mrc in a fresh interpreter, so the choice
is made from the environment given there and not from this process's.
"""

from __future__ import annotations

import ast
import importlib.machinery
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mrc import _build
from tools import build_mypyc

REPO = Path(__file__).resolve().parent.parent
SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)

# Imports every module of the compiled packages and reports which file each came from.
PROBE = """
import importlib, json, pkgutil, sys
import mrc
from mrc import _build
prefixes = tuple("mrc." + name for name in _build.PACKAGES)
for prefix in prefixes:
    pkg = importlib.import_module(prefix)
    for info in pkgutil.walk_packages(pkg.__path__, prefix + "."):
        if not info.name.endswith("__mypyc"):  # a compiled module's library, not a module
            importlib.import_module(info.name)
files = {n: m.__file__ for n, m in sys.modules.items()
         if n.startswith(prefixes) and not n.endswith("__mypyc")}
print(json.dumps({"compiled": mrc.compiled(), "implementation": mrc.implementation(),
                  "files": files}))
"""


def probe(pure: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != _build.PURE_ENV}
    if pure is not None:
        env[_build.PURE_ENV] = pure
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    result: dict[str, object] = json.loads(out.stdout)
    return result


def module_name(source: str) -> str:
    """mrc/core/send/sender.py -> mrc.core.send.sender; mrc/core/__init__.py -> mrc.core."""
    return source.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def test_mrc_pure_loads_every_module_from_its_source() -> None:
    seen = probe("1")
    assert seen["compiled"] is False
    expected = "pure: MRC_PURE=1" if _build.extensions() else "pure: not compiled"
    assert seen["implementation"] == expected
    files = seen["files"]
    assert isinstance(files, dict) and len(files) >= len(_build.sources())
    assert [n for n, f in files.items() if not str(f).endswith(".py")] == []


@pytest.mark.skipif(not _build.extensions(), reason="not compiled (no C compiler, or not built)")
def test_the_compiled_modules_are_the_ones_imported_when_built() -> None:
    assert _build.choose({}) == (True, "compiled"), "the build is stale: run `make install`"
    seen = probe(None)
    assert (seen["compiled"], seen["implementation"]) == (True, "compiled")
    files = seen["files"]
    assert isinstance(files, dict)
    compiled = {module_name(p) for p in build_mypyc.compile_paths()}
    assert compiled and compiled <= set(files)
    assert [n for n in sorted(compiled) if not str(files[n]).endswith(SUFFIXES)] == []
    # The modules tools/build_mypyc.py leaves interpreted come from their sources.
    for source in build_mypyc.INTERPRETED:
        assert str(files[module_name(source)]).endswith(".py")
    # MRC_PURE=0 is not a request for pure Python.
    assert probe("0")["compiled"] is True


def test_a_source_changed_since_the_build_means_pure(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_so = [REPO / "mrc" / "core" / "sender.cpython-311-x86_64-linux-gnu.so"]
    monkeypatch.setattr(_build, "extensions", lambda: fake_so)
    monkeypatch.setattr(_build, "read_stamp", lambda: {"digest": _build.source_digest()})
    assert _build.choose({}) == (True, "compiled")
    monkeypatch.setattr(_build, "read_stamp", lambda: {"digest": "0" * 64})
    assert _build.choose({}) == (
        False, "pure: compiled modules are stale (sources changed), run `make install`"
    )  # fmt: skip
    monkeypatch.setattr(_build, "read_stamp", lambda: None)
    assert _build.choose({})[0] is False
    monkeypatch.setattr(_build, "extensions", list)
    assert _build.choose({}) == (False, "pure: not compiled")


def test_the_digest_changes_with_a_byte_or_a_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_build, "ROOT", tmp_path)
    (tmp_path / "core").mkdir()
    (tmp_path / "wire").mkdir()
    a = tmp_path / "core" / "a.py"
    a.write_bytes(b"x = 1\n")
    first = _build.source_digest()
    assert _build.source_digest() == first
    a.write_bytes(b"x = 2\n")
    second = _build.source_digest()
    a.rename(tmp_path / "core" / "b.py")
    third = _build.source_digest()
    assert len({first, second, third}) == 3


def _unfinal_constants(source: Path) -> list[str]:
    """Module-level UPPER_CASE names of `source` bound without `Final`."""
    found = []
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):
            targets = [t for t in node.targets if isinstance(t, (ast.Name, ast.Tuple))]
            names = [n for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            call = ast.unparse(node.value.func) if isinstance(node.value, ast.Call) else ""
            is_typevar = call == "TypeVar"
            found += [n.id for n in names if _CONSTANT.match(n.id) and not is_typevar]
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _CONSTANT.match(node.target.id)
            and "Final" not in ast.unparse(node.annotation)
        ):
            found.append(node.target.id)
    return found


_CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")


def test_module_constants_of_the_compiled_packages_are_final() -> None:
    # Compiled, a constant without Final is looked up in the module's dict and boxed at each
    # use; with Final mypyc inlines it or keeps it in a C static. Marking them raised loopback
    # bulk goodput by about a quarter.
    sources = sorted((REPO / "mrc" / "core").glob("*.py")) + sorted(
        (REPO / "mrc" / "wire").glob("*.py")
    )
    missing = {
        str(p.relative_to(REPO)): names
        for p in sources
        if (names := [n for n in _unfinal_constants(p) if n != "__all__"])
    }
    assert missing == {}
    # The scan does find unmarked constants: this file's own.
    assert _unfinal_constants(Path(__file__)) == ["REPO", "SUFFIXES", "PROBE", "_CONSTANT"]
