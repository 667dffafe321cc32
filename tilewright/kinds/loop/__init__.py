"""The loop-kernel kind, one folder: "pointwise" and "reduction", fused groups of pointwise
ops, reductions, scans and scatters in the expression IR
(:class:`~tilewright.problem.LoopProblem`).

============== ===========================================================================
``checks``     inputs (and a special-values set), poisoned outputs, running a launcher, the
               error measure and its tolerances
``policy``     block shapes per problem, the ATen programs first on a CPU, candidates
``cost``       the cost model the policy ranks block shapes by (bytes over bandwidth, launches)
``kind``       :class:`LoopKind`, registered once (:data:`tilewright.kinds.BUILTIN`), and the
               ATen ops it labels when they stay ATen's
============== ===========================================================================

The FX lowering rules are :mod:`tilewright.kinds.loop.lower`; the fusion scheduler that groups
loop nodes into kernels, and the kernel builder, are :mod:`tilewright.kinds.loop.fusion` (both
in the compiler's layer: they read its kernel graph). The
templates live in the language folders (``templates/<language>/loops*``). The checks'
names are importable from here (as from the module this package replaced); ``KIND``,
``LoopKind`` and the policy load on first use (they import the autotuner).
"""

from typing import Any

from tilewright.kinds.loop.checks import (
    DISCRETE_TOLERANCE, LOOP_TOLERANCE, LoopInputs, _loop_error, _loop_run, loop_error, make_loop_inputs,
    poisoned_loop_outputs, special_loop_inputs,
)

_LAZY = {"KIND": "kind", "LoopKind": "kind", "POINTWISE_OPS": "kind", "REDUCTION_OPS": "kind", "LoopPolicy": "policy"}


def __getattr__(name: str) -> Any:
    # the kind and its policy import the autotuner: loaded when asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DISCRETE_TOLERANCE", "KIND", "LOOP_TOLERANCE", "LoopInputs", "LoopKind", "LoopPolicy", "POINTWISE_OPS",
           "REDUCTION_OPS", "loop_error", "make_loop_inputs", "poisoned_loop_outputs",
           "special_loop_inputs"]
