"""The grouped-GEMM kind, one folder: ``torch._grouped_mm``'s four shape cases (MoE experts)
with a fused epilogue.

============== ===========================================================================
``problem``    :class:`GroupedGemmProblem`, the shape cases, synthetic tuning offsets: what the
               templates and the tuning cache see
``checks``     inputs, the poisoned output, running a launcher, the error, the float64 reference
``policy``     candidates and the cost estimate per template
``lower``      ``aten._grouped_mm`` in an FX graph -> ``tilewright.grouped_mm`` with its
               epilogue folded in
``kind``       :class:`GroupedGemmKind`, registered once (:data:`tilewright.kinds.BUILTIN`)
============== ===========================================================================

The templates live in the language folders (``templates/<language>/grouped*``), the public op
``grouped_mm`` in :mod:`tilewright.kernels.grouped`. Importing this package imports only the
problem, so the templates (below the autotuner and the compiler) can; ``KIND`` and
``GroupedGemmKind`` load on first use.
"""

from typing import Any

from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem, case_of


def __getattr__(name: str) -> Any:
    # the kind imports the autotuner: loaded when asked for, never by a template's import
    if name in ("KIND", "GroupedGemmKind", "grouped_gemm_problem"):
        from tilewright.kinds.grouped_gemm import kind

        return getattr(kind, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GroupedGemmKind", "GroupedGemmProblem", "KIND", "case_of", "grouped_gemm_problem"]
