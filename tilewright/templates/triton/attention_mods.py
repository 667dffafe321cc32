"""An attention problem's score_mod and mask_mod as Triton statements, for the attention
templates (the IR's Triton emitter with the attention kernels' hooks).

The rendered statements expect in scope, inside a key tile: ``s`` (the fp32 scores of the
tile, [BLOCK_M, BLOCK_N]), the index code the template names for ``b``, ``h``, ``m``, ``n``
(scalars or broadcastable blocks: ``offs_m[:, None]``), the row and column bounds masks named
``row_ok``/``col_ok`` (blocks of the same shapes as ``m``/``n``), and for each capture ``k`` its
pointer ``C{k}`` and strides ``c{k}_s{d}``. Loads of captures are masked to in-bounds rows and
columns (a gathered index read in a padded lane is 0, so never out of range).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from tilewright.kinds.attention import mods
from tilewright.kinds.attention.problem import AttentionProblem
from tilewright.ir import dtypes
from tilewright.ir.expr import Node, indirect_symbol, load_indirect, load_mask
from tilewright.ir.index import code
from tilewright.templates.triton.emit import TL_DTYPE, TritonExpr


@dataclass(frozen=True)
class IndexNames:
    """How a template names the index variables and bounds masks in a tile."""

    b: str = "off_b"
    h: str = "off_h"
    m: str = "offs_m[:, None]"
    n: str = "offs_n[None, :]"
    row_ok: str = "row_ok"
    col_ok: str = "col_ok"

    def symbols(self) -> dict[sympy.Symbol, str]:
        return {mods.B_VAR: self.b, mods.H_VAR: self.h, mods.M_VAR: self.m, mods.N_VAR: self.n}


@dataclass(frozen=True)
class RenderedMod:
    """Statements (relative indentation) and the name holding the result ("" when absent)."""

    code: str
    value: str


def _emitter(interpreted: bool, names: IndexNames, prefix: str) -> TritonExpr:
    sym = names.symbols()
    e: TritonExpr

    def index(n: Node) -> str:
        return f"({code(n.arg, sym)})"

    def load(n: Node) -> str:
        name, idx, _ = n.arg
        k = int(name[1:])
        local = dict(sym)
        for j, v in enumerate(load_indirect(n)):
            local[indirect_symbol(j)] = f"{e.names[v]}.to(tl.int64)"
        terms = [f"({code(i, local)}) * c{k}_s{d}" for d, i in enumerate(idx) if i != 0]
        ptr = f"C{k} + " + " + ".join(terms) if terms else f"C{k}"
        used = mods.uses(n)
        masks = ([names.row_ok] if "m" in used else []) + ([names.col_ok] if "n" in used else [])
        own = load_mask(n)
        if own is not None:
            masks.append(e.names[own])
        value = f"tl.load({ptr}, mask={' & '.join(masks)}, other=0)" if masks else f"tl.load({ptr})"
        if n.dtype == "bool":
            return f"({value} != 0)"
        return f"{value}.to({TL_DTYPE[dtypes.compute_type(n.dtype)]})"

    e = TritonExpr(interpreted=interpreted, load=load, index=index, acc=lambda n: "s", prefix=prefix)
    # problem_support refuses an index to check (mods.unchecked_indices): what is left is proven
    e.checked = lambda n, value, bound, mask: value
    return e


def render_all(problem: AttentionProblem, interpreted: bool, names: IndexNames = IndexNames()
               ) -> tuple[RenderedMod, RenderedMod, RenderedMod, str]:
    """(score_mod, mask_mod, derivative of the score_mod w.r.t. the score, the ``@triton.jit``
    helpers they call). The derivative is rendered for backward problems only (else empty).

    Raises:
        NotDifferentiable: a backward problem whose score_mod has no derivative rule.
    """
    helpers: set[str] = set()
    out = []
    sm = mods.loads(problem.score_mod)
    deriv = mods.score_derivative(sm) if problem.direction == "backward" else None
    for text, prefix in ((problem.score_mod, "sm"), (problem.mask_mod, "mk"),
                         (mods.dumps(deriv) if deriv is not None else "", "dm")):
        value = mods.loads(text)
        if value is None:
            out.append(RenderedMod("", ""))
            continue
        e = _emitter(interpreted, names, prefix)
        name = e.emit(value)
        if value.dtype != "bool" and dtypes.compute_type(value.dtype) != "fp32":
            name = e.convert(name, value.dtype, "fp32")
        if value.dtype == "bool" and name in ("True", "False"):
            name = f"tl.full(s.shape, {name}, tl.int1)"
        elif value.op == "const":
            name = f"tl.full(s.shape, {name}, tl.float32)"
        helpers |= e.helpers_used
        out.append(RenderedMod("\n".join(e.lines), name))
    probe = TritonExpr(interpreted=interpreted, load=lambda n: "")
    probe.helpers_used = helpers
    return out[0], out[1], out[2], probe.helpers()
