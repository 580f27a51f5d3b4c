"""Which implementation of mrc.wire, mrc.core and mrc.io runs: mypyc-compiled or pure Python.

`make install` compiles mrc/wire, mrc/core and mrc/io with mypyc (tools/build_mypyc.py) and writes
a stamp holding a digest of the sources it compiled. Extension modules shadow the .py files beside
them, so this module decides at `import mrc` time, before any of them is imported, and
installs a finder that loads the .py files whenever the compiled ones must not run: MRC_PURE=1,
or sources that changed since the build (a stale .so must never hide an edit). The build itself,
and the list of modules left interpreted, live in tools/build_mypyc.py; this module holds only
what both the build and the import need.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent
PACKAGES = ("wire", "core", "io")
STAMP = ROOT / "_mypyc_stamp.json"
PURE_ENV = "MRC_PURE"


def sources() -> list[Path]:
    """Every .py file of the compiled packages, in a stable order."""
    found: list[Path] = []
    for package in PACKAGES:
        found.extend(sorted((ROOT / package).rglob("*.py")))
    return found


def source_digest(paths: Sequence[Path] | None = None) -> str:
    """sha256 over the relative names and bytes of the sources (added or removed files count)."""
    h = hashlib.sha256()
    for path in sources() if paths is None else paths:
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def extensions() -> list[Path]:
    """Compiled extension modules present beside the sources of the compiled packages."""
    found: list[Path] = []
    for package in PACKAGES:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            found.extend((ROOT / package).rglob("*" + suffix))
            # A package's own compiled __init__ keeps its library beside the package folder.
            found.extend(ROOT.glob(f"{package}__mypyc*{suffix}"))
    return sorted(set(found))


def read_stamp() -> dict[str, object] | None:
    """The stamp the last successful build wrote, or None when absent or unreadable."""
    try:
        data = json.loads(STAMP.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def choose(environ: Mapping[str, str]) -> tuple[bool, str]:
    """(use the compiled modules, one-line reason) for this process."""
    if not extensions():
        return False, "pure: not compiled"
    if environ.get(PURE_ENV, "") not in ("", "0"):
        return False, f"pure: {PURE_ENV}={environ[PURE_ENV]}"
    stamp = read_stamp()
    if stamp is None or stamp.get("digest") != source_digest():
        return False, "pure: compiled modules are stale (sources changed), run `make install`"
    return True, "compiled"


class PureFinder:
    """Loads mrc.wire, mrc.core and mrc.io from their .py files even where a compiled module exists
    (a meta path finder: `find_spec` is all the import system asks of one)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        parts = fullname.split(".")
        if len(parts) < 2 or parts[0] != "mrc" or parts[1] not in PACKAGES:
            return None
        base = ROOT.joinpath(*parts[1:])
        if (base / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(
                fullname, base / "__init__.py", submodule_search_locations=[str(base)]
            )
        source = base.with_suffix(".py")
        if source.is_file():
            return importlib.util.spec_from_file_location(fullname, source)
        return None


def install_pure_finder() -> None:
    """Put PureFinder first on sys.meta_path (once)."""
    if not any(isinstance(f, PureFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PureFinder())
