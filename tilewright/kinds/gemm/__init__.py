"""The GEMM kind's folder: ``policy`` (the seed tiles, :class:`GemmPolicy`, ``POLICIES`` per
target backend), ``kind`` (:class:`GemmKind`, registered once: :data:`tilewright.kinds.BUILTIN`),
``checks`` (inputs, poisoned outputs, the error and tolerance of a result), ``decode`` (the
decode-shape variants: thin tiles, swap-AB, split-K) and ``heuristics`` (nvMatmulHeuristics'
picks, when installed).

Still outside it (issue 30, not moved yet): the problem (:class:`tilewright.problem.GemmProblem`,
below the templates), the lowering and epilogue fusion (:mod:`tilewright.compiler.lower`,
:mod:`tilewright.compiler.fuse`) and the cost model (:mod:`tilewright.autotune.cost_model`).
The names of ``kind`` (``KIND``, ``GemmKind``, ``gemm_problem``, ...) are importable from here,
as from the module this package replaced; they load on first use (the kind imports the
autotuner).
"""

from typing import Any

_MODULES = frozenset({"kind", "policy", "checks", "cost", "decode", "heuristics", "shapes", "lower", "lower_scaled",
                      "fuse"})


def __getattr__(name: str) -> Any:
    # a submodule is the import system's to find, never the kind module's attribute
    if name.startswith("__") or name in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.kind"), name)
