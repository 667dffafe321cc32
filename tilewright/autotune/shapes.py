"""A named problem: what ``tilewright warm``, the benchmark suites and the tuning workers pass
around (a problem of any kind with a stable, readable id).

GEMM problems from a shapes file (``bench/cases/llm_gemm_shapes.json``) are the GEMM kind's:
:mod:`tilewright.kinds.gemm.shapes` (``load_shapes``, ``problems_from_shapes``,
``ShapesFileError``); those names resolve here for one release, with a DeprecationWarning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilewright._moved import moved_names

_MOVED = {name: "tilewright.kinds.gemm.shapes" for name in (
    "PHASES", "ShapesFileError", "load_shapes", "problems_from_shapes", "_layer_problem")}


@dataclass(frozen=True)
class NamedProblem:
    """A problem and a stable, readable id ("llama-3-8b.qkv_proj.M16")."""

    name: str
    problem: Any  # a problem of any kind


__getattr__ = moved_names(__name__, _MOVED)
