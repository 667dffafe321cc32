"""The import layers of docs/architecture.md ("Layers"), enforced (issue 30).

The graph is built from the source with ``ast`` (no import runs): an edge per ``import`` /
``from ... import`` of a tilewright module made at module level (in the module's body, in a
class body, under ``if``/``try``/``with`` there), not inside a function (the sanctioned way a
lower layer calls a higher one at run time, e.g. a kind's lowering hook importing the compiler)
and not under ``if TYPE_CHECKING:``. The layers come from the table in docs/architecture.md, so
the page and this test cannot disagree: a module may import modules of its own layer and of the
layers below it, never above. On top of that the top-level packages must form no cycle (with a
kind's folder counted by its files' layers: it is a vertical slice, ``problem.py`` below the
templates, its policy beside the autotuner, its lowering beside the compiler).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "tilewright"
DOC = ROOT / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(source: str, name: str, is_package: bool) -> list[str]:
    """The modules ``source`` (module ``name``) imports at module level, absolute, with every
    ``from m import x`` giving both ``m`` and ``m.x`` (``x`` may be a submodule)."""
    found: list[str] = []

    def is_type_checking(test: ast.expr) -> bool:
        return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
            (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # imported when called: allowed upwards
            if isinstance(node, ast.ClassDef):
                visit(node.body)
            elif isinstance(node, ast.If):
                if not is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                visit(node.body)
            elif isinstance(node, ast.Import):
                found.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                found.append(module)
                found.extend(f"{module}.{a.name}" for a in node.names)

    visit(ast.parse(source).body)
    return found


def import_graph() -> nx.DiGraph:
    """tilewright's modules and their module-level imports of each other."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(paths)
    for name, path in paths.items():
        for imported in module_level_imports(path.read_text(), name, path.name == "__init__.py"):
            parts = imported.split(".")
            while parts and ".".join(parts) not in paths:  # `from m import function` is an edge to m
                parts.pop()
            if parts and ".".join(parts) != name:
                g.add_edge(name, ".".join(parts))
    return g


def documented_layers() -> list[tuple[str, list[str]]]:
    """(layer, module patterns), bottom first, from the table under "## Layers" in
    docs/architecture.md: rows ``| N name | `pattern`, `pattern` ... | ... |``."""
    text = DOC.read_text()
    section = text[text.index("## Layers"):]
    section = section[:section.index("\n## ", 4)]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\| (\d+) (\w+) \| (.*?) \|", line)
        if m:
            patterns = re.findall(r"`([^`]+)`", m.group(3))
            rows.append((int(m.group(1)), m.group(2), [f"tilewright.{p}" if p != "tilewright" else p
                                                       for p in patterns]))
    rows.sort()
    assert [r[0] for r in rows] == list(range(len(rows))), "layers are numbered 0, 1, 2, ... from the bottom"
    return [(name, patterns) for _, name, patterns in rows]


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The layer of the most specific pattern matching ``module`` (a pattern names a module and
    everything under it; ``*`` matches one name)."""
    best: tuple[int, int] | None = None  # (specificity, layer)
    for i, (_, patterns) in enumerate(layers):
        for p in patterns:
            if fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module, p + ".*"):
                rank = p.count(".") * 2 + (0 if "*" in p else 1)
                if best is None or rank > best[0]:
                    best = (rank, i)
    return None if best is None else best[1]


@pytest.fixture(scope="module")
def graph():
    return import_graph()


@pytest.fixture(scope="module")
def layers():
    return documented_layers()


def test_every_module_has_a_documented_layer(graph, layers):
    missing = sorted(m for m in graph if layer_of(m, layers) is None)
    assert not missing, f"modules in no layer of docs/architecture.md's table: {missing}"


def test_no_module_imports_a_layer_above_its_own(graph, layers):
    names = [n for n, _ in layers]
    up = [f"{a} ({names[layer_of(a, layers)]}) imports {b} ({names[layer_of(b, layers)]})"
          for a, b in graph.edges if layer_of(b, layers) > layer_of(a, layers)]
    assert not up, "imports against the layers (import inside the function that needs it, or move " \
                   "the module):\n" + "\n".join(sorted(up))


def unit_of(module: str, layers: list[tuple[str, list[str]]]) -> str:
    """A module's top-level package; inside ``kinds/`` the package and the file's layer."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "tilewright"
    if top == "kinds" and len(parts) > 2:
        return f"kinds[{layers[layer_of(module, layers)][0]}]"
    return top


def test_no_cycle_between_top_level_packages(graph, layers):
    units = nx.DiGraph()
    for a, b in graph.edges:
        ua, ub = unit_of(a, layers), unit_of(b, layers)
        if ua != ub and "tilewright" not in (ua, ub):  # the package's own __init__ and its top modules
            units.add_edge(ua, ub, why=f"{a} -> {b}")
    cycles = list(nx.simple_cycles(units))
    assert not cycles, "\n".join(
        " -> ".join(c + [c[0]]) + ": " + "; ".join(units.edges[x, y]["why"] for x, y in zip(c, c[1:] + c[:1]))
        for c in cycles[:5])


def test_the_docs_draw_every_layer(layers):
    text = DOC.read_text()
    picture = re.search(r"```mermaid\n(.*?)```", text[text.index("## Layers"):], re.S)
    assert picture, "the Layers section has a mermaid picture"
    for name, _ in layers:
        assert name in picture.group(1), f"layer {name} is not in the picture"


def test_the_graph_sees_module_level_imports_only():
    source = '''
import tilewright.a
from tilewright.b import thing
from . import sibling
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import tilewright.typing_only
try:
    import tilewright.optional
except ImportError:
    pass


def hook():
    import tilewright.lazy


class K:
    from tilewright.in_class import x
'''
    found = module_level_imports(source, "tilewright.pkg.mod", False)
    assert {"tilewright.a", "tilewright.b", "tilewright.b.thing", "tilewright.pkg.sibling",
            "tilewright.optional", "tilewright.in_class"} <= set(found)
    assert "tilewright.lazy" not in found and "tilewright.typing_only" not in found


def test_a_violation_is_reported(layers):
    g = nx.DiGraph([("tilewright.ir.expr", "tilewright.compiler.pipeline")])
    assert layer_of("tilewright.compiler.pipeline", layers) > layer_of("tilewright.ir.expr", layers)
    assert [e for e in g.edges if layer_of(e[1], layers) > layer_of(e[0], layers)]


def test_the_factorys_old_path_warns_and_is_the_same_objects(graph):
    # kernels/ holds the public ops only: the render-and-load factory the pipeline imports moved
    # below them (compiler/kernel_factory.py), the ops' tuned launchers to kernels/launchers.py
    import importlib
    import sys

    from tilewright.compiler import kernel_factory
    from tilewright.kernels import launchers

    sys.modules.pop("tilewright.kernels.build", None)
    with pytest.warns(DeprecationWarning, match="tilewright.compiler.kernel_factory"):
        old = importlib.import_module("tilewright.kernels.build")
    assert old.default_factory is kernel_factory.default_factory
    assert old.TemplateKernelFactory is kernel_factory.TemplateKernelFactory
    assert old.tuned_launcher is launchers.tuned_launcher
    users = sorted(a for a, b in graph.edges if b == "tilewright.kernels.build")
    assert not users, f"import tilewright.compiler.kernel_factory / kernels.launchers instead: {users}"


def test_the_compiler_recognises_the_public_ops_by_name():
    import torch

    from tilewright.compiler.lower import is_op
    from tilewright.kinds.grouped_gemm.lower import is_ours, tilewright_grouped_mm

    import tilewright.kernels.nvfp4  # noqa: F401 - the op a user's graph was traced from

    assert is_op(torch.ops.tilewright.nvfp4_mm.default, "tilewright::nvfp4_mm")
    assert not is_op(torch.ops.aten.mm.default, "tilewright::nvfp4_mm")
    assert is_ours(tilewright_grouped_mm()) and not is_ours(torch.ops.aten._grouped_mm.default)
