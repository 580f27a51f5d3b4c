"""Compile mrc/wire, mrc/core and mrc/io in place with mypyc, or leave a working pure install.

`make install` runs this after the editable install. It rebuilds only when the sources, mypy or
Python changed since the stamp (mrc/_mypyc_stamp.json) the last good build wrote, and then only
the modules whose generated C changed. Without a matching stamp the compiled modules are never
imported, and a failed build removes them, so a failed or missing build always leaves pure
Python; it prints one line whatever happens. What a compiled or stale build means at import time is
mrc/_build.py's business. Compiler output goes to build/mypyc.log.

Usage: python tools/build_mypyc.py [--force | --clean | --check]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mrc import _build  # noqa: E402  (the checkout's mrc, whatever is installed)

BUILD = REPO / "build"
LOG = BUILD / "mypyc.log"
# setuptools builds the extension modules here; install() moves them beside the sources.
LIB = BUILD / "mypyc-lib"
# Modules mypyc must not compile, with the reason; they stay interpreted beside compiled ones.
INTERPRETED: dict[str, str] = {
    "mrc/io/mmsg.py": "its ctypes structures make mypyc emit C that does not compile (an"
    " undeclared `CPyModule__ctypes`); it runs once a drain, not once a packet",
    "mrc/core/paths/evformat.py": "it checks the types of API arguments itself (a bool width, a str"
    " mode) with one-line errors; compiled, its constructors would coerce or refuse them first",
}
JOBS = 2


def compiler() -> str | None:
    """The C compiler setuptools would call, if it is on PATH."""
    cc = os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc")
    return shutil.which(cc.split()[0]) if cc.split() else None


def mypy_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mypy")
    except PackageNotFoundError:
        return ""


def wanted_stamp() -> dict[str, object]:
    return {
        "digest": _build.source_digest(),
        "mypy": mypy_version(),
        "python": sys.version.split()[0],
        "interpreted": sorted(INTERPRETED),
    }


def current() -> bool:
    """Whether the extension modules present match the sources, mypy and Python of now."""
    stamp = _build.read_stamp()
    if stamp is None or not _build.extensions():
        return False
    want = wanted_stamp()
    return all(stamp.get(k) == v for k, v in want.items())


def clean() -> None:
    """Remove every compiled module and the stamp: what is left is the pure install."""
    _build.STAMP.unlink(missing_ok=True)
    for path in _build.extensions():
        path.unlink()


def install() -> int:
    """Put the modules built in LIB beside the sources; returns how many changed. Each goes in
    by rename, never by rewriting the file in place: a process that has the old one loaded
    (another checkout user's test run) keeps its copy instead of crashing on a truncated one."""
    changed = 0
    for built in sorted(LIB.rglob("*.so")):
        target = REPO / built.relative_to(LIB)
        data = built.read_bytes()
        if target.is_file() and target.read_bytes() == data:
            continue
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o755)
        os.replace(tmp, target)
        changed += 1
    return changed


def remove_leftovers() -> None:
    """Remove extension modules of sources no longer compiled (now interpreted, or deleted): they
    would shadow the .py files."""
    wanted = set(compile_paths())
    for path in _build.extensions():
        stem = path.name.split(".", 1)[0]
        source = path.with_name(stem.removesuffix("__mypyc") + ".py")
        if stem.endswith("__mypyc") and not source.is_file():
            # A package's library lies beside its folder (mrc/core__mypyc, core/send__mypyc).
            source = source.with_suffix("") / "__init__.py"
        if str(source.relative_to(REPO)) not in wanted:
            path.unlink()


def compile_paths() -> list[str]:
    return [
        str(p.relative_to(REPO))
        for p in _build.sources()
        if str(p.relative_to(REPO)) not in INTERPRETED
    ]


def inner() -> None:
    """The build proper (run in a child whose output goes to the log)."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    os.chdir(REPO)
    modules = mypycify(
        compile_paths(),
        opt_level="3",
        separate=True,
        target_dir=str(BUILD / "mypyc"),
    )
    # A bare Distribution, not setup(): setup() would read pyproject.toml, which is hatchling's.
    dist = Distribution({"name": "mrc-mypyc", "ext_modules": modules})
    dist.script_args = [
        "build_ext",
        f"--parallel={JOBS}",
        f"--build-lib={LIB}",
        f"--build-temp={BUILD / 'mypyc-temp'}",
    ]
    dist.parse_command_line()
    dist.run_commands()


def build() -> int:
    if importlib.util.find_spec("mypyc") is None:
        clean()
        print("mypyc: not installed (pip install mypy), mrc runs as pure Python")
        return 0
    if compiler() is None:
        if current():
            print("mypyc: no C compiler found, the compiled modules present are current")
            return 0
        clean()
        print("mypyc: no C compiler found, mrc runs as pure Python")
        return 0
    # Without the stamp the old modules count as stale (pure) until this build succeeds; they stay
    # on disk so setuptools recompiles only the modules whose C changed.
    _build.STAMP.unlink(missing_ok=True)
    BUILD.mkdir(exist_ok=True)
    # mypyc's own cache, apart from the one `mypy --strict` keeps in .mypy_cache, and fresh each
    # time: an incremental mypyc run crashed here once the set of compiled modules changed. The
    # C files it writes keep their old times when unchanged, so setuptools recompiles only those
    # modules whose C changed.
    cache = BUILD / "mypyc-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, MYPY_CACHE_DIR=str(cache))
    start = time.monotonic()
    with LOG.open("w") as log:
        result = subprocess.run(
            [sys.executable, __file__, "--inner"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
        )
    seconds = time.monotonic() - start
    if result.returncode != 0:
        clean()
        print(f"mypyc: build failed ({LOG.relative_to(REPO)}), mrc runs as pure Python")
        return 0
    install()
    remove_leftovers()
    stamp = wanted_stamp()
    stamp["seconds"] = round(seconds, 1)
    _build.STAMP.write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
    count = len(compile_paths())
    print(f"mypyc: compiled {count} modules of mrc/wire, mrc/core and mrc/io in {seconds:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--force", action="store_true", help="rebuild even when current")
    mode.add_argument("--clean", action="store_true", help="remove the compiled modules")
    mode.add_argument("--check", action="store_true", help="exit 1 unless the build is current")
    mode.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        inner()
        return 0
    if args.clean:
        clean()
        print("mypyc: compiled modules removed, mrc runs as pure Python")
        return 0
    if args.check:
        ok = current()
        print("mypyc: compiled modules are current" if ok else "mypyc: not compiled or stale")
        return 0 if ok else 1
    if not args.force and current():
        print("mypyc: compiled modules are current")
        return 0
    return build()


if __name__ == "__main__":
    sys.exit(main())
