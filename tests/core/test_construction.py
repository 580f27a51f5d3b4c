"""Objects of the core are built whole: no attribute of a collaborator is assigned from outside
it after construction (issue 33; docs/DESIGN.md §3).

An AST check over mrc/core. A *collaborator* is an instance of a class of mrc/core or mrc/wire
that is not plain data; *plain data* is a dataclass, a NamedTuple or an Enum (a record the
table that owns it fills in: `Plane`, `EvRecord`, `SessionStats`, a decoded packet). Every
assignment `<expr>.<field> = ...` (also augmented, annotated, in a tuple) whose `<expr>` is
not `self` is resolved to a class where the code says which: a parameter's or a local's
annotation, a local built by calling the class, `self.<attr>` declared so in the class. An
assignment into a collaborator fails the test. When the class cannot be told, the field
decides: a field that only collaborators declare fails. Nothing is allowed by name.

The first test shows the check catches each form of the violation and lets records through.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Checked, and the classes of the packets it decodes (records).
CHECKED = "mrc/core"
INDEXED = (CHECKED, "mrc/wire")


@dataclass
class ClassInfo:
    name: str
    record: bool
    #: Declared attribute types: `self.x: T`, `self.x = T(...)`, `self.x = param` with `param: T`.
    attrs: dict[str, str]
    fields: set[str]


def _annotation_class(node: ast.expr | None, known: set[str]) -> str | None:
    """The first known class an annotation names (`T`, `T | None`, `Optional[T]`, "T")."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in known:
            return sub.id
        if isinstance(sub, ast.Attribute) and sub.attr in known:
            return sub.attr
    return None


def _called_class(node: ast.expr | None, known: set[str]) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in known:
            return name
    return None


def _is_record(cls: ast.ClassDef) -> bool:
    for dec in cls.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
        if name == "dataclass":
            return True
    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in cls.bases}
    return bool(bases & {"NamedTuple", "Enum", "IntEnum", "IntFlag", "Flag"})


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        raw = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        raw = [node.target]
    else:
        return []
    out: list[ast.expr] = []
    while raw:
        t = raw.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            raw.extend(t.elts)
        elif isinstance(t, ast.Starred):
            raw.append(t.value)
        else:
            out.append(t)
    return out


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def index(trees: dict[str, ast.Module]) -> dict[str, ClassInfo]:
    """Every class of the scanned sources with its kind, declared fields and attribute types."""
    defs = [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)]
    known = {c.name for c in defs}
    classes: dict[str, ClassInfo] = {}
    for cls in defs:
        info = ClassInfo(cls.name, _is_record(cls), {}, set())
        for stmt in cls.body:  # class-level fields (dataclasses, NamedTuples)
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                info.fields.add(stmt.target.id)
        for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            params = {
                a.arg: _annotation_class(a.annotation, known)
                for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
            }
            for node in ast.walk(fn):
                for t in _targets(node):
                    if isinstance(t, ast.Attribute) and _is_self(t.value):
                        info.fields.add(t.attr)
                        kind = None
                        if isinstance(node, ast.AnnAssign):
                            kind = _annotation_class(node.annotation, known)
                        value = getattr(node, "value", None)
                        kind = kind or _called_class(value, known)
                        if kind is None and isinstance(value, ast.Name):
                            kind = params.get(value.id)
                        if kind is not None:
                            info.attrs.setdefault(t.attr, kind)
        classes.setdefault(cls.name, info)
    return classes


def violations(trees: dict[str, ast.Module]) -> list[str]:
    """`path:line: expr` of every assignment into a collaborator from outside it."""
    classes = index(trees)
    known = set(classes)
    collaborator_fields = {f for c in classes.values() if not c.record for f in c.fields}
    record_fields = {f for c in classes.values() if c.record for f in c.fields}
    found: list[str] = []

    def check(path: str, scope: ast.AST, owner: ClassInfo | None) -> None:
        local: dict[str, str] = {}
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]:
                kind = _annotation_class(a.annotation, known)
                if kind is not None:
                    local[a.arg] = kind
            for node in ast.walk(scope):
                for t in _targets(node):
                    if isinstance(t, ast.Name):
                        kind = _called_class(getattr(node, "value", None), known)
                        if isinstance(node, ast.AnnAssign):
                            kind = _annotation_class(node.annotation, known) or kind
                        if kind is not None:
                            local.setdefault(t.id, kind)
        for node in ast.walk(scope):
            for t in _targets(node):
                if not isinstance(t, ast.Attribute) or _is_self(t.value):
                    continue
                base = t.value
                kind: str | None = None
                if isinstance(base, ast.Name):
                    kind = local.get(base.id)
                elif isinstance(base, ast.Attribute) and _is_self(base.value) and owner:
                    kind = owner.attrs.get(base.attr)
                if kind is not None:
                    bad = not classes[kind].record
                else:
                    bad = t.attr in collaborator_fields and (
                        t.attr not in record_fields or isinstance(base, ast.Attribute)
                    )
                if bad:
                    found.append(f"{path}:{t.lineno}: {ast.unparse(t)}")

    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for fn in node.body:
                    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        check(path, fn, classes.get(node.name))
        for fn in tree.body:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                check(path, fn, None)
    return sorted(set(found))


def _sources() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p))
        for folder in INDEXED
        for p in sorted((ROOT / folder).rglob("*.py"))
    }


SAMPLE = """
from dataclasses import dataclass

@dataclass
class Row:
    count: int = 0

class Monitor:
    def __init__(self) -> None:
        self.trace = None
        self.peer_qpn = 0
        self.rows: list[Row] = []

class Table:
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.row = Row()

    def patch(self, other: Monitor, row: Row) -> None:
        self.monitor.peer_qpn = 5          # through self: a violation
        other.trace = self                 # a parameter: a violation
        m = Monitor()
        m.trace, row.count = None, 1       # a local (violation), a record (allowed)
        self.row.count += 1                # a record held by self: allowed
        row.count = 2                      # allowed

def build(thing) -> None:
    thing.peer_qpn = 1                     # type unknown: only collaborators have the field
    thing.count = 3                        # a record's field: allowed
"""


def test_the_check_catches_assignments_into_collaborators_and_lets_records_through() -> None:
    found = violations({"sample.py": ast.parse(SAMPLE)})
    assert [f.split(": ", 1)[1] for f in found] == [
        "self.monitor.peer_qpn",
        "other.trace",
        "m.trace",
        "thing.peer_qpn",
    ]


def test_no_attribute_of_a_collaborator_is_assigned_from_outside_it_in_the_core() -> None:
    assert [v for v in violations(_sources()) if v.startswith(CHECKED + "/")] == []
