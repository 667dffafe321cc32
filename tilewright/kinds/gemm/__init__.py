"""The GEMM kind's folder: ``policy`` (the seed tiles, :class:`GemmPolicy`, ``POLICIES`` per
target backend) and ``kind`` (:class:`GemmKind`, registered once: :data:`tilewright.kinds.BUILTIN`).

Still outside it (issue 30, not moved yet): the problem (:class:`tilewright.problem.GemmProblem`,
below the templates), the lowering and epilogue fusion (the compiler's core op:
:mod:`tilewright.compiler.lower`, :mod:`tilewright.compiler.fuse`), the cost model, inputs and
checks and the decode variants (:mod:`tilewright.autotune.cost_model`, ``inputs``, ``decode``,
``heuristics``). The names of ``kind`` (``KIND``, ``GemmKind``, ``gemm_problem``, ...) are
importable from here, as from the module this package replaced; they load on first use (the
kind imports the autotuner).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__") or name in ("kind", "policy"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.kind"), name)
