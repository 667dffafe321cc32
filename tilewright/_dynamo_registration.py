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


class _Loader(importlib.abc.Loader):
    """The registry module's own loader, registering the backend once the module has run."""

    def __init__(self, inner: Any):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _register(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... for inspect
        return getattr(self._inner, name)


class _RegistryFinder(importlib.abc.MetaPathFinder):
    """Finds Dynamo's registry module through the other finders and wraps its loader; removes
    itself from ``sys.meta_path`` once it has done so."""

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        if fullname != REGISTRY:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Make ``backend="tilewright"`` resolve by name (called by ``import tilewright``)."""
    registry = sys.modules.get(REGISTRY)
    if registry is not None and hasattr(registry, "register_backend"):
        _register(registry)
    elif not any(isinstance(f, _RegistryFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryFinder())
