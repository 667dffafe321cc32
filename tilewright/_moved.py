"""Old import paths of modules that moved (issue 30: a kind is its folder), kept for one release.

A module left at its old path is a two-line shim calling :func:`alias`: importing it warns once
(:class:`DeprecationWarning`, naming the new path) and makes the old name the *same module
object* as the new one, so ``tilewright.attention.problem.AttentionProblem is
tilewright.kinds.attention.problem.AttentionProblem``, and monkeypatching either name patches
both. Internal code imports the new paths only (``tests/test_moved.py`` checks both).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType
from typing import Any, Callable

REMOVED_IN = "the next release"

MOVED: dict[str, str] = {}
"""Old module name -> new module name, for every shim that has been imported (what
``tests/test_moved.py`` and a reader grepping for an old name find)."""


def alias(old: str, new: str) -> ModuleType:
    """Make module ``old`` (a shim being imported) the module ``new``, with a
    :class:`DeprecationWarning` to the importer.

    Raises:
        ImportError: ``new`` cannot be imported (the error of that import).
    """
    module = importlib.import_module(new)
    MOVED[old] = new
    # stacklevel: this function, the shim's body, then (importlib's frames are skipped) the importer
    warnings.warn(f"{old} moved to {new}; import it from there ({old} is removed in {REMOVED_IN})",
                  DeprecationWarning, stacklevel=3)
    # the import system returns whatever sys.modules holds once the shim has run
    sys.modules[old] = module
    return module


def alias_package(old: str, new: str) -> ModuleType:
    """Make package ``old`` (a shim ``__init__`` being imported) the package ``new``, and each
    module of ``new`` its old name's, so ``old.<module>`` is never loaded a second time from
    the new folder (the import system finds an aliased package's modules on its new
    ``__path__``); one DeprecationWarning, naming the new path.

    Raises:
        ImportError: ``new`` or one of its modules cannot be imported.
    """
    import pkgutil

    package = importlib.import_module(new)
    for info in pkgutil.iter_modules(package.__path__):
        sys.modules[f"{old}.{info.name}"] = importlib.import_module(f"{new}.{info.name}")
        MOVED[f"{old}.{info.name}"] = f"{new}.{info.name}"
    MOVED[old] = new
    warnings.warn(f"{old} moved to {new}; import it from there ({old} is removed in {REMOVED_IN})",
                  DeprecationWarning, stacklevel=3)
    sys.modules[old] = package
    return package


def moved_names(module: str, moved: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for a module that stays while some of its names moved:
    ``moved`` maps each old name to its new module. Reading one warns (DeprecationWarning,
    naming the new path) and returns the new module's object; any other missing name is an
    AttributeError, as without the hook. Use: ``__getattr__ = moved_names(__name__, {...})``.
    """

    def __getattr__(name: str) -> Any:
        new = moved.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {new}; import it from there (the old name is removed in "
                      f"{REMOVED_IN})", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__
