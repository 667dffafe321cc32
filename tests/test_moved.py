"""Modules that moved into their kind's folder (issue 30) keep their old import path for one
release: the old path is the same module object (so monkeypatching either patches both), and
importing it warns with a DeprecationWarning naming the new path. tilewright's own code imports
the new paths only."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

import tilewright

PKG = Path(tilewright.__file__).parent

MOVED = {
    "tilewright.attention.problem": "tilewright.kinds.attention.problem",
    "tilewright.attention.mods": "tilewright.kinds.attention.mods",
    "tilewright.attention.reference": "tilewright.kinds.attention.reference",
    "tilewright.attention.tuning": "tilewright.kinds.attention.checks",
    "tilewright.autotune.attention_policy": "tilewright.kinds.attention.policy",
    "tilewright.compiler.lower_attention": "tilewright.kinds.attention.lower",
    "tilewright.compiler.lower_flex": "tilewright.kinds.attention.lower_flex",
    "tilewright.compiler.lower_eager_attention": "tilewright.kinds.attention.lower_eager",
    "tilewright.compiler.lower_grouped": "tilewright.kinds.grouped_gemm.lower",
    "tilewright.autotune.grouped_policy": "tilewright.kinds.grouped_gemm.policy",
    # kernels/ holds the public ops only: the eager FlyDSL gate is the FlyDSL folder's
    "tilewright.kernels.gate": "tilewright.templates.flydsl.gate",
    # a language's toolchain runtime is its folder's
    "tilewright.runtime.sycl": "tilewright.templates.sycl.runtime",
    "tilewright.runtime.cpp": "tilewright.templates.cpp.runtime",
    "tilewright.runtime.metal_check": "tilewright.templates.metal.check",
    "tilewright.runtime.cutedsl": "tilewright.templates.cutedsl.runtime",
    "tilewright.runtime.flydsl": "tilewright.templates.flydsl.runtime",
    "tilewright.runtime.flydsl_launch": "tilewright.templates.flydsl.launch",
    "tilewright.runtime.pdl": "tilewright.templates.triton.pdl",
    "tilewright.autotune.loop_policy": "tilewright.kinds.loop.policy",
    "tilewright.autotune.decode": "tilewright.kinds.gemm.decode",
    "tilewright.autotune.heuristics": "tilewright.kinds.gemm.heuristics",
    "tilewright.autotune.inputs": "tilewright.kinds.gemm.checks",
    "tilewright.compiler.fuse": "tilewright.kinds.gemm.fuse",
    "tilewright.compiler.lower_scaled": "tilewright.kinds.gemm.lower_scaled",
    # the loop kind's fusion scheduler and kernel builder (compiler/fusion.py was split in four)
    "tilewright.compiler.fusion": "tilewright.kinds.loop.fusion",
    "tilewright.compiler.schedule": "tilewright.kinds.loop.fusion.schedule",
}
# old modules split or turned into packages: a module of their own that re-exports what it had
# from the new place (and warns)
MOVED_PACKAGES = {
    "tilewright.attention": "tilewright.kinds.attention",
    "tilewright.grouped": "tilewright.kinds.grouped_gemm",
}


# packages that moved whole: the old package and each of its modules are the new ones
MOVED_TREES = {
    "tilewright.compiler.loops": "tilewright.kinds.loop.lower",
}


@pytest.mark.parametrize("old", sorted(MOVED_TREES))
def test_old_package_and_its_modules_are_the_new_ones(old):
    import pkgutil

    new = importlib.import_module(MOVED_TREES[old])
    for name in [k for k in sys.modules if k == old or k.startswith(old + ".")]:
        del sys.modules[name]
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED_TREES[old]}"):
        assert importlib.import_module(old) is new
    modules = [m.name for m in pkgutil.iter_modules(new.__path__)]
    assert "scatters" in modules and "scans" in modules
    for m in modules:
        assert importlib.import_module(f"{old}.{m}") is importlib.import_module(f"{new.__name__}.{m}")


# modules that stay, some of whose names moved: each such name still resolves there, with a warning
MOVED_NAMES = {
    # a language's AOT compile is its folder's (Gluon's: tests/test_language_folders.py)
    "tilewright.runtime.aot": ("tilewright.templates.triton.aot", ("compile_triton",)),
    "tilewright.autotune.policy": ("tilewright.kinds.gemm.policy", (
        "GPU_SEEDS", "DECODE_SEEDS", "INTERPRETER_SEEDS", "clamp_tile", "GemmPolicy", "POLICIES")),
    "tilewright.autotune.cost_model": ("tilewright.kinds.loop.cost", (
        "estimate_loop", "LOOP_BW_EFFICIENCY", "LOOP_DESC_EFFICIENCY", "INTERP_PROGRAM_MS", "INTERP_ELEMENT_MS")),
    # a module whose names went to several places: "<module> <where>" keys
    "tilewright.autotune.cost_model gemm": ("tilewright.kinds.gemm.cost", ("estimate_gemm", "roofline_ms")),
    "tilewright.autotune.shapes": ("tilewright.kinds.gemm.shapes", (
        "PHASES", "ShapesFileError", "load_shapes", "problems_from_shapes")),
    "tilewright.compiler.lower": ("tilewright.kinds.gemm.lower", (
        "GEMM_OPS", "NVFP4_MM", "MX_MM", "FP8_DTYPES", "why_not_gemm", "broadcast_pattern", "lower_gemm",
        "lower_scaled_mm", "lower_block_scaled_mm", "lower_nvfp4_mm", "lower_mx_mm")),
    "tilewright.compiler.graph": ("tilewright.kinds.gemm.lower", ("FusedInput",)),
    "tilewright.compiler.graph node": ("tilewright.kinds.gemm.node", ("GemmNode",)),
    "tilewright.compiler.report": ("tilewright.kinds.gemm.report", ("GemmReport",)),
    "tilewright.compiler.capture": ("tilewright.kinds.gemm.capture", ("capture_gemms",)),
    "tilewright.compiler.capture kind": ("tilewright.kinds.gemm.kind", ("gemm_problem",)),
    "tilewright.problem": ("tilewright.kinds.gemm.problem", ("GemmProblem",)),
}


@pytest.mark.parametrize("module", sorted(MOVED_NAMES))
def test_moved_names_resolve_at_the_old_module_with_a_warning(module):
    new_name, names = MOVED_NAMES[module]
    module = module.split()[0]
    old = importlib.import_module(module)
    new = importlib.import_module(new_name)
    for name in names:
        with pytest.warns(DeprecationWarning, match=f"{module}.{name} moved to {new_name}"):
            assert getattr(old, name) is getattr(new, name)
    with pytest.raises(AttributeError):
        old.no_such_name


def _shim_files() -> dict[str, str]:
    """Every module of the package that is an alias shim, by module name -> the new name."""
    found = {}
    for f in PKG.rglob("*.py"):
        text = f.read_text()
        if "alias(__name__," not in text:
            continue
        call = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "alias")
        parts = f.relative_to(PKG).with_suffix("").parts
        name = ".".join(("tilewright",) + (parts[:-1] if parts[-1] == "__init__" else parts))
        found[name] = call.args[1].value
    return found


def test_the_table_lists_every_shim():
    assert _shim_files() == MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_new_module_and_warns(old):
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is new and sys.modules[old] is new
    # what a caller of the old path uses is the new module's own object
    public = [n for n in vars(new) if not n.startswith("_")]
    assert public and all(getattr(module, n) is getattr(new, n) for n in public)


@pytest.mark.parametrize("old", sorted(MOVED_PACKAGES))
def test_old_package_warns_and_reexports(old):
    new = importlib.import_module(MOVED_PACKAGES[old])
    saved = sys.modules.pop(old, None)
    try:
        with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED_PACKAGES[old]}"):
            module = importlib.import_module(old)
        homes = [new] + [importlib.import_module(f"{new.__name__}.{m}") for m in ("problem", "checks")
                         if importlib.util.find_spec(f"{new.__name__}.{m}")]
        assert module.__all__ and all(any(getattr(module, n) is getattr(h, n, None) for h in homes)
                                      for n in module.__all__)
    finally:
        if saved is not None:
            sys.modules[old] = saved


def _imports(path: Path) -> set[str]:
    names = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
    return names


def _old_imports(path: Path, old: set[str]) -> list[str]:
    trees = tuple(f"{t}." for t in MOVED_TREES)
    return sorted(n for n in _imports(path) if n in old or n.startswith(trees))


def test_tilewright_imports_only_the_new_paths():
    """The suite runs with DeprecationWarning ignored (pyproject.toml); this keeps tilewright's
    own modules, templates and rendered kernels off the old paths anyway."""
    old = set(MOVED) | set(MOVED_PACKAGES) | set(MOVED_TREES) | {f"{m.split()[0]}.{n}" for m, (_, names) in MOVED_NAMES.items() for n in names}
    shims = {PKG.joinpath(*name.split(".")[1:]).with_suffix(".py") for name in MOVED}
    shims |= {PKG.joinpath(*name.split(".")[1:], "__init__.py") for name in MOVED}  # a package moved
    shims |= {PKG.joinpath(*name.split(".")[1:], "__init__.py") for name in MOVED_PACKAGES}
    shims |= {PKG.joinpath(*name.split(".")[1:]).with_suffix(".py") for name in MOVED_PACKAGES}
    shims |= {PKG.joinpath(*name.split(".")[1:], "__init__.py") for name in MOVED_TREES}
    bad = {}
    for f in PKG.rglob("*.py"):
        if f not in shims and (hits := _old_imports(f, old)):
            bad[str(f.relative_to(PKG))] = sorted(hits)
    for f in (PKG.parent / "docs" / "examples").glob("*.py"):  # what kernel authors copy
        if f.exists() and (hits := _old_imports(f, old)):
            bad[f"docs/examples/{f.name}"] = sorted(hits)
    for f in PKG.rglob("*.jinja"):
        if hits := {o for o in old if f"from {o} import" in f.read_text() or f"import {o}\n" in f.read_text()}:
            bad[str(f.relative_to(PKG))] = sorted(hits)
    assert not bad, f"import the new paths: {bad}"


def test_kernel_graph_gemms_is_the_gemm_kinds_with_a_warning():
    """``KernelGraph.gemms`` (the GEMM kind's nodes) is ``kinds.gemm.node.gemm_nodes(kg)`` now."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from tilewright.compiler.lower import lower
    from tilewright.kinds.gemm.node import GemmNode, gemm_nodes

    gm = make_fx(lambda a, b: torch.relu(a @ b) @ b)(torch.randn(8, 8), torch.randn(8, 8))
    kg = lower(gm)
    with pytest.warns(DeprecationWarning, match="KernelGraph.gemms moved to tilewright.kinds.gemm.node.gemm_nodes"):
        old = kg.gemms
    assert old == gemm_nodes(kg) and len(old) == 2 and all(isinstance(n, GemmNode) for n in old)
