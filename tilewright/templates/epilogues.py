"""Matching a GEMM problem's fused epilogue from a template: :func:`computes_epilogue`.

A GEMM template computes one epilogue (or renders any, through
:func:`tilewright.templates.triton.epilogue.render_epilogue`). The problem holds its epilogue
either as a list of :class:`~tilewright.problem.EpilogueOp` (``problem.epilogue``: bias, the
activations, residuals) or, for any other pointwise chain, as expression IR
(``problem.epilogue_ir``, with ``problem.epilogue`` empty); a template asks this module rather
than reading either form."""

from __future__ import annotations

from typing import Any, Callable

from tilewright.ir.epilogue import mismatch
from tilewright.templates.base import SUPPORTED, Support


def computes_epilogue(problem: Any, fn: Callable[..., Any]) -> Support:
    """``SUPPORTED`` when ``problem``'s fused epilogue computes ``fn(acc, e0, e1, ...)``, else
    ``Support(False, reason)`` naming the epilogue and a value where the two differ.

    ``fn`` is written in torch over float64 tensors: ``acc`` the product (M, N) elementwise,
    ``e0, ...`` the epilogue inputs at the same elements, e.g. ``lambda acc: torch.relu(acc) ** 2``
    for ``relu(x @ w) ** 2`` (held as IR: ``mul(fp16(where(lt(acc, 0), 0, acc)), ...)``), or
    ``lambda acc, bias: F.gelu(acc + bias)``. The comparison is of the math, in float64
    (:func:`tilewright.ir.epilogue.mismatch`): the roundings eager makes between its ops are not
    the epilogue's meaning (the kernel's check against float64 judges them). A problem that is
    not a GEMM, or whose epilogue inputs ``fn`` cannot take, is refused with the reason. The
    inputs' broadcast patterns (``problem.epilogue_inputs[k].broadcast``: ``"N"`` for a bias)
    are the template's own check."""
    if not hasattr(problem, "epilogue_inputs"):
        return Support(False, f"not a GEMM problem ({type(problem).__name__})")
    why = mismatch(problem, fn)
    return SUPPORTED if why is None else Support(False, why)
