"""``backend="tilewright"`` by name from a plain checkout on ``PYTHONPATH``.

The ``torch_dynamo_backends`` entry point (pyproject.toml) makes the name known only where the
package is installed: a checkout used through ``PYTHONPATH`` (the GPU machine's
``bench/device_check.sh``) has no package metadata, and ``torch.compile(f, backend="tilewright")``
raised ``InvalidBackend``. ``import tilewright`` therefore registers the name with Dynamo's
registry itself, without importing torch: ``import tilewright`` stays light (no torch, ~25 ms),
so the registration waits for Dynamo's registry module to be imported (a finder on
``sys.meta_path`` that runs once) or happens at once when it already is. What is registered is
:func:`tilewright`, a small function that imports the compiler on the first compile and hands the
graph to :func:`tilewright.compiler.backend.tilewright_backend` (the entry point's target).

The same finder hooks Dynamo's trace rules: torch 2.11 has no rule for ``torch._scaled_mm_v2``
(``F.scaled_mm``) and graph-breaks on it, so it is marked in-graph as torch 2.13 marks it
(:data:`IN_GRAPH`), and block-scaled ``F.scaled_mm`` reaches tilewright under both versions.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

NAME = "tilewright"
REGISTRY = "torch._dynamo.backends.registry"


def tilewright(gm: Any, example_inputs: list[Any], **kwargs: Any) -> Any:
    """Dynamo backend ``"tilewright"`` as registered by ``import tilewright``: the same as
    :func:`tilewright.compiler.backend.tilewright_backend` (imported here, on the first compile,
    so that registering costs no torch import)."""
    from tilewright.compiler.backend import tilewright_backend

    return tilewright_backend(gm, example_inputs, **kwargs)


def _register(registry: Any) -> None:
    """Register :func:`tilewright` under :data:`NAME` unless the name is already taken (by an
    earlier registration) or Dynamo has found the installed entry point: it loads that itself,
    and registers it then, which would fail ("duplicate name") had this registered first. That
    load imports tilewright, which lands here while the entry point is being loaded."""
    taken = getattr(registry, "_COMPILER_FNS", {})
    entry_point = getattr(registry, "_BACKENDS", {}).get(NAME)
    if NAME not in taken and entry_point is None:
        registry.register_backend(compiler_fn=tilewright, name=NAME)


# torch 2.11's Dynamo has no trace rule for these builtins (2.13 lists them): it graph-breaks on
# ``F.scaled_mm`` and runs it eagerly, where tilewright never sees it. They are ordinary ATen ops
# with fake-tensor kernels in both versions (``_scaled_grouped_mm_v2`` once
# :mod:`tilewright._scaled_grouped_meta` gives it one), so they are marked in-graph as 2.13 does.
IN_GRAPH = ("torch._scaled_mm_v2", "torch._scaled_grouped_mm_v2")


TRACE_RULES = "torch._dynamo.trace_rules"


def _mark_in_graph(trace_rules: Any) -> None:
    """Add :data:`IN_GRAPH` to ``trace_rules`` (the module, once it has run) where missing."""
    import torch

    from tilewright import _scaled_grouped_meta

    _scaled_grouped_meta.register()  # F.scaled_grouped_mm has no fake kernel in torch 2.11/2.13
    rules = getattr(trace_rules, "torch_c_binding_in_graph_functions", None)
    in_graph = getattr(trace_rules, "TorchInGraphFunctionVariable", None)
    if rules is None or in_graph is None:
        return
    missing = [n for n in IN_GRAPH if n not in rules and hasattr(torch, n.split(".", 1)[1])]
    for name in missing:
        rules[name] = in_graph
    if missing and hasattr(trace_rules.get_torch_obj_rule_map, "cache_clear"):
        trace_rules.get_torch_obj_rule_map.cache_clear()


HOOKS = {REGISTRY: _register, TRACE_RULES: _mark_in_graph}


class _Loader(importlib.abc.Loader):
    """A hooked module's own loader, running its hook (:data:`HOOKS`) once the module has run."""

    def __init__(self, inner: Any, fullname: str = REGISTRY):
        self._inner = inner
        self._fullname = fullname

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        HOOKS[self._fullname](module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... for inspect
        return getattr(self._inner, name)


class _RegistryFinder(importlib.abc.MetaPathFinder):
    """Finds the hooked modules (:data:`HOOKS`: Dynamo's registry and its trace rules) through
    the other finders and wraps their loaders; removes itself from ``sys.meta_path`` once it
    has done so for all of them."""

    def __init__(self, names: set[str] | None = None):
        self.pending = set(HOOKS) if names is None else set(names)

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        if not self.pending:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    """Make ``backend="tilewright"`` resolve by name (called by ``import tilewright``), and
    ``F.scaled_mm`` traceable where Dynamo lacks its rule (:data:`IN_GRAPH`)."""
    pending = set()
    registry = sys.modules.get(REGISTRY)
    if registry is not None and hasattr(registry, "register_backend"):
        _register(registry)
    else:
        pending.add(REGISTRY)
    rules = sys.modules.get(TRACE_RULES)
    if rules is not None and hasattr(rules, "torch_c_binding_in_graph_functions"):
        _mark_in_graph(rules)
    else:
        pending.add(TRACE_RULES)
    if pending and not any(isinstance(f, _RegistryFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryFinder(pending))
