"""The GEMM kind's part of ``tilewright aot``/``warm``'s capture: a model's distinct GEMM
problems (its ``capture`` hook is :meth:`~tilewright.kinds.gemm.kind.GemmKind.capture`, the
default over its :class:`~tilewright.kinds.gemm.node.GemmNode`\\ s). It moved here from
:mod:`tilewright.compiler.capture`, where the name resolves for one release with a
DeprecationWarning.
"""

from __future__ import annotations

from tilewright.compiler.capture import CapturedKernel, ModelSpec, capture_kernels
from tilewright.kinds.gemm.kind import KIND


def capture_gemms(spec: ModelSpec, *, train: bool = False) -> list[CapturedKernel]:
    """Distinct GEMM problems of the model, in first-seen order, with their uses
    (:func:`~tilewright.compiler.capture.capture_kernels` of the GEMM kind)."""
    return [c for c in capture_kernels(spec, train=train) if c.problem.kind in KIND.names]
