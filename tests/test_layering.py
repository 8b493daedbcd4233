"""The package's layering, checked on its source: the folders follow the data
flow, and nothing in a lower one imports a higher one (docs/architecture.md).

Every import of every module under ``prime_runs_otel/`` is read with ``ast``
(including imports inside functions and under ``TYPE_CHECKING``: a lazy or
type-only import is still a dependency), resolved to the module it names, and
checked against the table below.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "prime_runs_otel"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

FOLDERS = (
    "produce",
    "read",
    "deliver",
    "collector",
    "view",
    "instrumentation",
    "cli",
    "testing",
)
#: Top-level modules that only wire the folders together.
WIRING = ("run", "exporter")
#: What the base modules (any other top-level module: config, semconv,
#: errors, _json, ...) may import of the package: one another only.
UP_FROM_BASE = frozenset(FOLDERS + WIRING + ("<root>",))

#: For each part of the package, the parts it must never import.
FORBIDDEN: dict[str, frozenset[str]] = {
    "produce": frozenset(
        {"instrumentation", "read", "deliver", "collector", "view", "cli", "testing", *WIRING}
    ),
    "read": frozenset(
        {"instrumentation", "produce", "deliver", "collector", "view", "cli", "testing", *WIRING}
    ),
    "deliver": frozenset(
        {"instrumentation", "produce", "collector", "view", "cli", "testing", *WIRING}
    ),
    "collector": frozenset({"instrumentation", "produce", "view", "cli", "testing", "run"}),
    # The local viewer reads the spool (deliver/) and the records in it
    # (read/); it records nothing and receives nothing.
    "view": frozenset({"instrumentation", "produce", "collector", "cli", "testing", *WIRING}),
    "exporter": frozenset(
        {"instrumentation", "produce", "collector", "view", "cli", "testing", "run"}
    ),
    "run": frozenset({"collector", "view", "instrumentation", "cli", "testing"}),
    # Instrumentations of other SDKs wire a whole run (start_run, the
    # exporter, the spool) behind somebody else's API: above run/.
    "instrumentation": frozenset({"collector", "view", "cli", "testing"}),
    # The fakes stand in for the platform and a model server: they share no
    # code with the client they are there to test.
    "testing": frozenset({*FOLDERS, *WIRING} - {"testing"}),
    "cli": frozenset(),
    "<root>": frozenset({"cli", "collector", "view", "testing"}),
    "base": UP_FROM_BASE,
}

#: The package root may be imported for its version alone (it imports the
#: public API, so anything more would be an import from the top).
ROOT_NAMES_ALLOWED = frozenset({"__version__"})


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the module imported (or the package a name is taken from)
    name: str | None  # the name taken from the package root, if that is the target
    line: int


def part_of(module: str) -> str:
    """Which part of the layering a module belongs to."""
    parts = module.split(".")
    if parts == [PACKAGE]:
        return "<root>"
    if parts[1] in FOLDERS or parts[1] in WIRING:
        return parts[1]
    return "base"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(
    module: str, source: str, *, is_package: bool, known: frozenset[str]
) -> list[Import]:
    """Every import of ``PACKAGE`` in ``source``, resolved to absolute names.
    ``from x import y`` names the module ``x.y`` when that is a module."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    found.append(Import(module, alias.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                if node.level > len(anchor):
                    raise AssertionError(f"{module}:{node.lineno}: import beyond the package")
                anchor = anchor[: len(anchor) - node.level + 1]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in known:
                    found.append(Import(module, submodule, None, node.lineno))
                else:
                    found.append(Import(module, target, alias.name, node.lineno))
    return found


def violations(found: list[Import]) -> list[str]:
    problems = []
    for item in found:
        source, target = part_of(item.module), part_of(item.target)
        if target == "<root>" and item.name in ROOT_NAMES_ALLOWED:
            continue
        if target in FORBIDDEN[source]:
            what = item.target + (f" ({item.name})" if item.name else "")
            problems.append(f"{item.module}:{item.line} ({source}) imports {what} ({target})")
    return problems


def package_imports() -> list[Import]:
    paths = sorted(ROOT.rglob("*.py"))
    known = frozenset(module_name(path, ROOT) for path in paths)
    found: list[Import] = []
    for path in paths:
        found.extend(
            imports_of(
                module_name(path, ROOT),
                path.read_text(encoding="utf-8"),
                is_package=path.name == "__init__.py",
                known=known,
            )
        )
    return found


def test_no_module_imports_a_higher_layer() -> None:
    found = package_imports()
    # The walk did see the package: every folder's modules import something.
    assert {part_of(item.module) for item in found} >= {*FOLDERS, *WIRING, "base"} - {"testing"}
    problems = violations(found)
    assert not problems, "imports against the layering (docs/architecture.md):\n" + "\n".join(
        problems
    )


def import_loops(found: list[Import]) -> list[list[str]]:
    """The circles in the import graph: groups of modules that import one
    another, directly or round a longer loop (Tarjan's strongly connected
    components). Taking ``__version__`` from the package root is no edge: the
    root imports the public API lazily, for its names only."""
    edges: dict[str, set[str]] = {}
    for item in found:
        if item.target == PACKAGE and item.name in ROOT_NAMES_ALLOWED:
            continue
        if item.target != item.module:
            edges.setdefault(item.module, set()).add(item.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                loops.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return loops


def test_no_two_modules_import_each_other() -> None:
    """An import loop ties two modules into one unit that neither can be
    read, tested or moved without: put what both need in a module below
    them. Lazy and type-only imports count, as in the layering check."""
    loops = import_loops(package_imports())
    assert not loops, "import loops (move the shared piece below both):\n" + "\n".join(
        " <-> ".join(group) for group in loops
    )


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        # two modules importing each other, one of them inside a function
        (
            {"a": "from . import b", "b": "def f():\n    from . import a\n"},
            [["a", "b"]],
        ),
        # round three modules
        (
            {"a": "from . import b", "b": "from . import c", "c": "from .a import x"},
            [["a", "b", "c"]],
        ),
        # a chain is no loop; the root's version is no edge
        ({"a": "from . import b", "b": "from . import __version__"}, []),
    ],
)
def test_the_loop_check_catches_what_it_should(
    sources: dict[str, str], expected: list[list[str]]
) -> None:
    known = frozenset({PACKAGE, *(f"{PACKAGE}.{name}" for name in sources)})
    found = [
        item
        for name, source in sources.items()
        for item in imports_of(f"{PACKAGE}.{name}", source, is_package=False, known=known)
    ]
    assert import_loops(found) == [[f"{PACKAGE}.{name}" for name in group] for group in expected]


KNOWN = frozenset(
    {
        PACKAGE,
        f"{PACKAGE}.semconv",
        f"{PACKAGE}.run",
        f"{PACKAGE}.read",
        f"{PACKAGE}.read.records",
        f"{PACKAGE}.deliver",
        f"{PACKAGE}.deliver.spool",
        f"{PACKAGE}.produce",
        f"{PACKAGE}.produce.episode",
    }
)


@pytest.mark.parametrize(
    ("module", "is_package", "source", "expected"),
    [
        # relative, one level up, into a higher folder
        (f"{PACKAGE}.read.records", False, "from ..deliver import spool", ["deliver"]),
        # relative, a name from a sibling folder's module
        (f"{PACKAGE}.read.records", False, "from ..produce.episode import x", ["produce"]),
        # absolute, inside a function
        (
            f"{PACKAGE}.deliver.spool",
            True,
            "def f():\n    import prime_runs_otel.run\n",
            ["run"],
        ),
        # from a package __init__: one dot is the package itself
        (f"{PACKAGE}.deliver", True, "from . import spool\nfrom .. import run", ["run"]),
        # a base module taking anything but the version from the root
        (f"{PACKAGE}.semconv", False, "from . import start_run", ["<root>"]),
        (f"{PACKAGE}.semconv", False, "from . import __version__", []),
        # under TYPE_CHECKING
        (
            f"{PACKAGE}.produce.episode",
            False,
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..read import records",
            ["read"],
        ),
        # allowed: down the layers
        (f"{PACKAGE}.deliver.spool", True, "from ...read.records import RunIdentity", []),
        (f"{PACKAGE}.run", False, "from .produce import episode\nfrom . import semconv", []),
    ],
)
def test_the_check_catches_what_it_should(
    module: str, is_package: bool, source: str, expected: list[str]
) -> None:
    found = imports_of(module, source, is_package=is_package, known=KNOWN)
    problems = violations(found)
    assert [problem.rsplit("(", 1)[1].rstrip(")") for problem in problems] == expected, problems
