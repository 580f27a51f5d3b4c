"""The import graph of mrc/: no import circle, and the packages layered as docs/DESIGN.md §1 says.

The graph is read from the syntax trees, not from running anything, and every import counts:
top level, under `if TYPE_CHECKING:`, or inside a function. A circle closed only by a deferred
or type-only import is still two modules that need each other, and the way out is the same: the
lower one owns a small `typing.Protocol` of what it needs from above (`mrc/daemon/mailbox.py`'s
`MailHost`). Edges: `import a.b` is an edge to `a.b`; `from p import n` to `p.n` when that is a
module, else to `p`; relative imports are resolved; a package's `__init__` is a module like any
other (named as the package). The parent packages Python runs on the way are not edges.

Layering: `USES` writes down the arrows of docs/DESIGN.md §1, what each top-level package (or
module) of mrc/ may import; what those may import it may import too, and nothing else: no arrow
up, none across (sim and io, daemon and client know nothing of each other). A new package fails
the test until it is given its arrows.
"""

from __future__ import annotations

import ast
from collections import deque
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "mrc"

#: module → {imported module: first line importing it}
Graph = dict[str, dict[str, int]]

#: What each top-level package (or module) of mrc/ may import (docs/DESIGN.md §1: wire → core →
#: sim | io → node → daemon → cli, control → client, daemon); what those may import it may import
#: too. "mrc" is the root package, the public API over the core; `_build` chooses the compiled or
#: pure core before it loads; `control` holds the constants the daemon and its client share, so
#: neither imports the other; `units` holds the byte counts and seconds every command line parses;
#: `switchq`, the switch queue model, sits below both switches (sim's
#: ports and io's relay); `experiments` run on the simulator.
USES: dict[str, frozenset[str]] = {
    "_build": frozenset(),
    "control": frozenset(),
    "wire": frozenset(),
    "switchq": frozenset(),
    "units": frozenset(),
    "core": frozenset({"wire"}),
    "mrc": frozenset({"_build", "core"}),
    "sim": frozenset({"core", "switchq"}),
    "experiments": frozenset({"sim"}),
    "io": frozenset({"core", "switchq"}),
    "node": frozenset({"io"}),
    "daemon": frozenset({"node", "control", "mrc"}),
    "client": frozenset({"control"}),
    "collective": frozenset({"client", "node", "units"}),
    "plot": frozenset(),
    "contrib": frozenset({"wire"}),
    "cli": frozenset({"mrc", "sim", "daemon", "client", "collective", "plot", "contrib", "units"}),
    "__main__": frozenset({"cli"}),
}


def modules(root: Path) -> dict[str, Path]:
    """Dotted name → file of every module under the package folder `root`."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports_of(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The modules of `known` that `name` (the module in `path`) imports, with the first line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in _targets(node, _package(name, path), known):
                if target != name and node.lineno < found.get(target, node.lineno + 1):
                    found[target] = node.lineno
    return found


def _targets(node: ast.Import | ast.ImportFrom, package: str, known: dict[str, Path]) -> list[str]:
    """The modules of `known` one import statement in `package` names."""
    out: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            # `import a.b.c` names the module a.b.c; of a path that is no module, its longest
            # prefix that is one (outside modules are no node of the graph).
            parts = alias.name.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts:
                out.append(".".join(parts))
        return out
    source = node.module or ""
    if node.level:
        base = package.split(".")
        if node.level - 1 >= len(base):
            return out  # above the top package: Python refuses it too
        source = ".".join(base[: len(base) - (node.level - 1)] + ([source] if source else []))
    for alias in node.names:
        if f"{source}.{alias.name}" in known:
            out.append(f"{source}.{alias.name}")
        elif source in known:
            out.append(source)
    return out


def import_graph(root: Path) -> tuple[Graph, dict[str, Path]]:
    known = modules(root)
    return {name: imports_of(name, path, known) for name, path in known.items()}, known


def _reach(graph: Graph, start: str) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), {}):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def circles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted."""
    reverse: Graph = {name: {} for name in graph}
    for src, targets in graph.items():
        for dst, line in targets.items():
            reverse.setdefault(dst, {})[src] = line
    placed: set[str] = set()
    out: list[list[str]] = []
    for name in sorted(graph):
        if name in placed:
            continue
        component = _reach(graph, name) & _reach(reverse, name)
        placed |= component
        if len(component) > 1:
            out.append(sorted(component))
    return out


def describe(graph: Graph, files: dict[str, Path], circle: list[str]) -> str:
    """The members of a circle, and one shortest loop through its first member, import by
    import (file:line → the module it imports)."""
    members = set(circle)
    start = circle[0]
    came: dict[str, str] = {}
    todo = deque([start])
    while todo and start not in came:
        here = todo.popleft()
        for nxt in sorted(graph[here]):
            if nxt in members and nxt not in came:
                came[nxt] = here
                todo.append(nxt)
    loop = [start]
    while len(loop) == 1 or loop[-1] != start:
        loop.append(came[loop[-1]])
    loop.reverse()
    base = ROOT.parent
    steps = [f"    {_shown(files[a], base)}:{graph[a][b]} → {b}" for a, b in pairwise(loop)]
    head = f"  a circle of {len(circle)} modules: {', '.join(circle)}\n  one loop in it:"
    return "\n".join([head, *steps])


def _shown(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def unit_of(name: str) -> str:
    """The top-level package (or module) of mrc/ that `name` belongs to; "mrc" for the root."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def below(uses: dict[str, frozenset[str]]) -> dict[str, set[str]]:
    """Each unit → every unit it may import: its arrows, and theirs, all the way down."""
    out: dict[str, set[str]] = {}
    for unit in uses:
        seen: set[str] = set()
        todo = list(uses[unit])
        while todo:
            nxt = todo.pop()
            if nxt not in seen:
                seen.add(nxt)
                todo.extend(uses.get(nxt, ()))
        out[unit] = seen
    return out


def layer_violations(
    graph: Graph, files: dict[str, Path], uses: dict[str, frozenset[str]]
) -> list[str]:
    """One line per import of a unit that `uses` does not put below the importer."""
    allowed = below(uses)
    out: list[str] = []
    for src, targets in sorted(graph.items()):
        for dst, line in sorted(targets.items()):
            a, b = unit_of(src), unit_of(dst)
            if a != b and b not in allowed[a]:
                way = "up" if a in allowed.get(b, ()) else "across"
                out.append(f"{_shown(files[src], ROOT.parent)}:{line}: {a} imports {dst} ({way})")
    return out


# -- mrc/ ------------------------------------------------------------------------------------------


def test_no_import_circles() -> None:
    graph, files = import_graph(ROOT)
    assert "mrc.core.session" in graph and len(graph) > 100  # the tree was read, not missed
    found = circles(graph)
    report = "\n".join(describe(graph, files, c) for c in found)
    assert not found, f"{len(found)} import circle(s) in mrc/ (every import counts):\n{report}"


def test_packages_are_layered() -> None:
    graph, files = import_graph(ROOT)
    unplaced = sorted({unit_of(name) for name in graph} - set(USES))
    assert not unplaced, f"give these their arrows in USES (docs/DESIGN.md §1): {unplaced}"
    assert not [unit for unit, under in below(USES).items() if unit in under]  # no loop in USES
    bad = layer_violations(graph, files, USES)
    assert not bad, "imports against the layering of docs/DESIGN.md §1:\n" + "\n".join(bad)


# -- the checker itself ----------------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_checker_finds_every_kind_of_circle(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            # a → b at top level; b → a only for the type checker.
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from .a import A\n",
            # c → d at top level; d → c only inside a function.
            "pkg/c.py": "import pkg.d\n",
            "pkg/d.py": "def f():\n    from . import c\n",
            # A package's __init__ is a module: `from pkg.sub import NAME` is an edge to it.
            "pkg/sub/__init__.py": "from ..e import E\n",
            "pkg/e.py": "from pkg.sub import NAME\n",
            # ... while `from pkg.sub import g` names the module g, not the package.
            "pkg/f.py": "from pkg.sub import g\n",
            "pkg/sub/g.py": "from .. import f\n",
            # No circle: h imports a, nothing imports h; outside modules are not nodes.
            "pkg/h.py": "import json\nimport os.path\nfrom . import a\nfrom pkg.a import b\n",
        },
    )
    graph, files = import_graph(tmp_path / "pkg")
    assert graph["pkg.h"] == {"pkg.a": 3}
    found = circles(graph)
    assert found == [
        ["pkg.a", "pkg.b"],
        ["pkg.c", "pkg.d"],
        ["pkg.e", "pkg.sub"],
        ["pkg.f", "pkg.sub.g"],
    ]
    text = describe(graph, files, found[0])
    assert "pkg.a, pkg.b" in text
    assert f"{tmp_path / 'pkg/a.py'}:1 → pkg.b" in text
    assert f"{tmp_path / 'pkg/b.py'}:3 → pkg.a" in text


def test_checker_finds_layering_breaches(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "mrc/__init__.py": "",
            "mrc/wire/__init__.py": "",
            "mrc/core/x.py": "from mrc.wire import y\n",  # down: fine
            "mrc/wire/y.py": "def f():\n    from mrc.core import x\n",  # up
            "mrc/sim/s.py": "from mrc.io import i\nfrom mrc.wire import y\n",  # across; down
            "mrc/io/i.py": "",
        },
    )
    graph, files = import_graph(tmp_path / "mrc")
    uses = {
        "wire": frozenset(),
        "core": frozenset({"wire"}),
        "sim": frozenset({"core"}),
        "io": frozenset({"core"}),
    }
    bad = [line.rpartition(": ")[2] for line in layer_violations(graph, files, uses)]
    assert bad == ["sim imports mrc.io.i (across)", "wire imports mrc.core.x (up)"]
