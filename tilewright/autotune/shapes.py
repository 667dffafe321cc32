"""A named problem: what ``tilewright warm``, the benchmark suites and the tuning workers pass
around (a problem of any kind with a stable, readable id).

GEMM problems from a shapes file (``bench/cases/llm_gemm_shapes.json``) are the GEMM kind's:
:mod:`tilewright.kinds.gemm.shapes` (``load_shapes``, ``problems_from_shapes``,
``ShapesFileError``); those names resolve here for one release, with a DeprecationWarning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

_MOVED = {name: "tilewright.kinds.gemm.shapes" for name in (
    "PHASES", "ShapesFileError", "load_shapes", "problems_from_shapes", "_layer_problem")}


@dataclass(frozen=True)
class NamedProblem:
    """A problem and a stable, readable id ("llama-3-8b.qkv_proj.M16")."""

    name: str
    problem: Any  # a problem of any kind


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        warnings.warn(f"tilewright.autotune.shapes.{name} moved to {_MOVED[name]}; import it from there (the "
                      f"old name is removed in the next release)", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
