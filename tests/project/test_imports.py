"""The package's import graph, read from the source with ``ast`` (every import, inside functions too; those under
``if TYPE_CHECKING:`` excepted): the config and the registries are leaves, and no module imports itself through
others. (The registries import their parts by name, at run time, which is what keeps them leaves.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.fast

PACKAGE = ROOT / "bigbatch"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (its ``else`` branch is kept)."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def imports_of(name: str) -> set[str]:
    """The bigbatch modules ``name`` imports: ``import a.b.c`` is the module ``a.b.c``; ``from a.b import c`` is
    ``a.b.c`` when that is a module, else ``a.b``; relative imports are resolved."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported = set()
    for node in _nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                imported.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in imported if m == "bigbatch" or m.startswith("bigbatch.")} - {name}


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_source_is_read():
    """The reading itself: known edges are found, including an import inside a function, and a TYPE_CHECKING
    import is not one."""
    assert "bigbatch.config" in GRAPH["bigbatch.largebatch.optim"]
    assert "bigbatch.models.small_cnn" in GRAPH["bigbatch.models"]
    assert "bigbatch.models" in GRAPH["bigbatch.telemetry.capacity"]  # inside parameter_count
    assert "bigbatch.config" not in GRAPH["bigbatch.data.formats.digits"]  # under TYPE_CHECKING only


CONFIG = {name for name in MODULES if name == "bigbatch.config" or name.startswith("bigbatch.config.")}
"""The config package: its ``__init__`` and its modules (values, sections, schema, loading, messages)."""


def test_the_config_imports_only_the_errors_and_the_registries():
    assert {"bigbatch.config", "bigbatch.config.loading", "bigbatch.config.run"} <= CONFIG
    outside = {name: GRAPH[name] - CONFIG for name in CONFIG}
    assert {name: imported for name, imported in outside.items()
            if not imported <= {"bigbatch.errors", "bigbatch.registry"}} == {}
    assert all("bigbatch.config" not in GRAPH[name] for name in CONFIG - {"bigbatch.config"})  # no module reads
    # the package's __init__, which imports them all


def test_the_registries_import_nothing_of_bigbatch():
    assert GRAPH["bigbatch.registry"] == set()


def test_the_darknet_text_reader_imports_only_the_errors_and_the_user_file_reader():
    """The cfg reader stays light (no torch): the errors, and the bounded reader of a user's files, which imports
    nothing of bigbatch."""
    assert GRAPH["bigbatch.darknet.text"] <= {"bigbatch.errors", "bigbatch.floor.user_files"}
    assert GRAPH["bigbatch.floor.user_files"] <= {"bigbatch.errors"}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycles_are_found():
    """The oracle of the next test, on a graph with one cycle of three and a self-contained chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycle():
    assert cycles(GRAPH) == []


LAYERS = (
    ("bigbatch.floor", "bigbatch.errors", "bigbatch"),  # bigbatch/__init__.py: the version, nothing imported
    ("bigbatch.config", "bigbatch.registry", "bigbatch.state_schema", "bigbatch.batching"),
    ("bigbatch.data", "bigbatch.models", "bigbatch.largebatch", "bigbatch.tasks", "bigbatch.telemetry"),
    ("bigbatch.engine",),
    ("bigbatch.darknet", "bigbatch.report", "bigbatch.inference", "bigbatch.advisor"),
    ("bigbatch.cli", "bigbatch.entry", "bigbatch.__main__"),
)
"""The floors of the package, bottom to top (docs/architecture.md, "The floors"): a module imports from its own
floor and the floors below it, never from one above."""


def floor_of(name: str) -> int:
    """The floor of module ``name``: that of the longest prefix the table names."""
    best, floor = -1, None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), level
    assert floor is not None, f"{name} is on no floor: add it to LAYERS and to docs/architecture.md"
    return floor


LAZY_ENTRY_POINTS = {("bigbatch", "bigbatch.inference.loading")}
"""The one import that points up: ``bigbatch.load``, imported by the package's ``__getattr__`` on first use (so that
``import bigbatch`` stays free of torch)."""


def test_every_module_is_on_a_floor_and_imports_nothing_above_it():
    upward = sorted(f"{name} (floor {floor_of(name)}) imports {other} (floor {floor_of(other)})"
                    for name, imported in GRAPH.items() for other in imported
                    if floor_of(other) > floor_of(name) and (name, other) not in LAZY_ENTRY_POINTS)
    assert upward == [], "\n".join(upward)


def test_an_import_from_a_floor_above_is_found():
    """The oracle of the test above: the floor-order rule catches an import pointing up."""
    assert floor_of("bigbatch.data.pipeline.batch_slabs") < floor_of("bigbatch.engine.transfer")
    assert floor_of("bigbatch.floor.files") < floor_of("bigbatch.errors") + 1
