"""The GEMM kind's folder, "gemm" (mm, addmm, bmm, baddbmm, scaled_mm, the block-scaled NVFP4/MX
GEMMs, each with its fused epilogue), registered once (:data:`tilewright.kinds.BUILTIN`).

================ =========================================================================
``problem``      :class:`GemmProblem` (below the templates, which import it)
``checks``       inputs (block-scaled operands with their scales), poisoned outputs, the
                 error of a result and its tolerance
``policy``       the seed tiles, :class:`GemmPolicy`, ``POLICIES`` per target backend
``cost``         the analytic cost model (roofline with tile and wave effects)
``decode``       decode-shape variants: thin tiles, swap-AB, split-K
``heuristics``   nvMatmulHeuristics' picks, when it is installed
``shapes``       GEMM problems from a shapes file (``tilewright warm``, the perf suites)
``kind``         :class:`GemmKind` and :func:`gemm_problem` (a GEMM node's problem)
``lower``        the FX lowering of the GEMM-family calls to ``GemmNode``\\ s
``lower_scaled`` the block-scaled ``_scaled_mm``/``F.scaled_mm`` rewrite before lowering
``fuse``         epilogue fusion: the elementwise chain after a GEMM into its kernel
``transposed``   a CPU linear's weight read in place (B = w.t() passed as w)
``capture``      ``capture_gemms`` (``tilewright aot``/``warm``)
``node``         :class:`GemmNode`, the kind's kernel-graph node (the wrapper, PDL and
                 traffic passes ask it through ``compiler.graph.Node``'s interface)
``report``       :class:`GemmReport`, a GEMM kernel's part of a graph's report
================ =========================================================================

The names of ``kind`` (``KIND``, ``GemmKind``, ``gemm_problem``, ...) are
importable from here, as from the module this package replaced; they load on first use (the
kind imports the autotuner).
"""

from typing import Any

_MODULES = frozenset({"kind", "policy", "checks", "cost", "decode", "heuristics", "shapes", "lower", "lower_scaled",
                      "fuse", "capture", "problem", "transposed", "node", "report"})


def __getattr__(name: str) -> Any:
    # a submodule is the import system's to find, never the kind module's attribute
    if name.startswith("__") or name in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.kind"), name)
