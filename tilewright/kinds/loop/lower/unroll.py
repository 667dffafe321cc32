"""Short reductions as pointwise expressions.

A reduction over a few elements known at compile time (the top-2 routing weights of a mixture of
experts summed per token, a softmax over 8 experts, a sum over a size-1 dim) is cheaper written
out, ``x[..., 0] + x[..., 1]``, than run as a row op: the node becomes pointwise, so the fusion
scheduler can put it into its consumer's loop (a gather's, an RMSNorm's row) where a reduction
producer would have stayed a kernel of its own. Inductor does the same for reductions of at most
``torch._inductor.config.unroll_reductions_threshold`` (8) elements; here
``config.unroll_reductions`` (8) sets the limit.

The unrolled value combines the elements in the reduction's own order (row-major over the reduced
dims), in the reduction's accumulation dtype, with the pointwise op of the same meaning (``max``:
``maximum``, which propagates NaN as ``amax`` does).
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import sympy

from tilewright._config import config
from tilewright.ir import expr as E

COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum",
           "any": "logical_or", "all": "logical_and"}
"""Reduction kind -> the pointwise op that combines two partial results. Positions (argmax),
Welford's moments and anything else keep their row loop."""


def unrolled_reduction(body: E.Node, red_vars: Sequence[sympy.Symbol],
                       ranges: Sequence[sympy.Expr]) -> E.Node | None:
    """``body`` (a reduction node's, holding one ``reduce`` over ``red_vars`` with extents
    ``ranges``) with its reduction written out, or None where it stays a reduction: extents not
    static, more than ``config.unroll_reductions`` elements, none (an empty reduction keeps its identity
    and its errors), or not exactly one ``reduce`` of a kind in :data:`COMBINE`."""
    if not all(isinstance(r, (int, sympy.Integer)) for r in ranges):
        return None
    extents = [int(r) for r in ranges]
    if not 1 <= math.prod(extents) <= config.unroll_reductions:
        return None
    reduces = [n for n in E.toposort([body]) if n.op == "reduce"]
    if len(reduces) != 1 or reduces[0].arg not in COMBINE:
        return None
    red = reduces[0]
    operand = red.src[0]
    if operand.dtype != red.dtype:
        return None
    combine = COMBINE[red.arg]
    total: E.Node | None = None
    for point in itertools.product(*(range(e) for e in extents)):
        subs = {v: sympy.Integer(p) for v, p in zip(red_vars, point)}
        (element,) = E.substitute_vars([operand], subs)
        total = element if total is None else E.op(combine, total, element)
    assert total is not None
    (flat,) = E.rewrite([body], lambda n, src: total if n is red else None)
    return flat
