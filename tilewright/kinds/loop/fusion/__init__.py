"""The loop kind's fusion: which loop nodes share a kernel, and that kernel.

============== ===========================================================================
``schedule``   the fusion scheduler (networkx): greedy vertical and horizontal merges by the
               bytes they save, then combo kernels; each group a
               :class:`~tilewright.compiler.graph.FusedNode` carrying its
               :class:`~tilewright.problem.LoopProblem`
``build``      a group of loop nodes -> one :class:`~tilewright.ir.kernel.LoopKernel`
               (its iteration space, where each member sits, what is inlined or stored),
               or :class:`FusionError` saying why not
``bounds``     the bounds of the integer values a kernel indexes with (what tuning draws)
``combo``      independent kernels launched as one (:func:`combine`)
============== ===========================================================================

The compiler's fuse stage runs the scheduler after lowering the loop nodes
(:func:`tilewright.compiler.pipeline.fuse`). These modules sit in the compiler's layer (they
read its kernel graph); they were ``compiler/fusion.py`` and ``compiler/schedule.py``, old
paths kept for one release (issue 30: the compiler names no kind).
"""

from tilewright.kinds.loop.fusion.build import BuiltKernel, FusionError, build_kernel
from tilewright.kinds.loop.fusion.combo import combine

__all__ = ["BuiltKernel", "FusionError", "build_kernel", "combine"]
