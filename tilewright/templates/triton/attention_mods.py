"""An attention problem's score_mod and mask_mod as Triton statements, for the attention
templates (the IR's Triton emitter with the attention kernels' hooks).

The rendered statements expect in scope, inside a key tile: ``s`` (the fp32 scores of the
tile, [BLOCK_M, BLOCK_N]), the index code the template names for ``b``, ``h``, ``m``, ``n``
(scalars or broadcastable blocks: ``offs_m[:, None]``), the row and column bounds masks named
``row_ok``/``col_ok`` (blocks of the same shapes as ``m``/``n``), and for each capture ``k`` its
pointer ``C{k}`` and strides ``c{k}_s{d}``. Loads of captures are masked to in-bounds rows and
columns (a gathered index read in a padded lane is 0, so never out of range).

A gathered index not proven inside its bound (``bias[n]`` over a dynamic key length,
``bias[doc[m]]``; :func:`~tilewright.kinds.attention.mods.needs_check`) is checked on the tile's
live lanes (``row_ok & col_ok``) and read as 0 where it fails: under the interpreter the failing
lanes store status 2 into ``TW_ERR`` (a one-element int32 buffer the launcher raises eager's
IndexError for, :func:`tilewright.runtime.status.raise_status`), on a GPU a device assert (the
kernel launched with ``debug=True``), as the loop kernels do.
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


def _emitter(interpreted: bool, names: IndexNames, prefix: str, extents: dict | None = None) -> TritonExpr:
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
    def checked(n: Node, value: str, bound: str, mask: str | None) -> str:
        if extents is None or not mods.needs_check(n, extents):
            return value  # proven in range (or config.index_checks off)
        live = " & ".join(f"({x})" for x in (names.row_ok, names.col_ok, mask) if x)
        ok = e.fresh()
        e.line(f"{ok} = ({value} >= 0) & ({value} < {bound})")
        if interpreted:
            bad = e.fresh()
            e.line(f"{bad} = (~{ok}) & {live}")
            e.line(f"tl.store(TW_ERR + {bad}.to(tl.int32) * 0, 2, mask={bad})")
        else:
            e.line(f"tl.device_assert({ok} | ~({live}), 'index out of bounds')")
        safe = e.fresh()
        e.line(f"{safe} = tl.where({ok}, {value}, 0)")
        return safe

    e.checked = checked
    return e


def index_checks(problem: AttentionProblem) -> bool:
    """Whether the problem's modifications gather through an index not proven in range (the
    kernels then take ``TW_ERR`` and check it; see the module docstring)."""
    sizes, dynamic = _sizes(problem)
    return any(mods.unchecked_indices(mods.loads(t), sizes, dynamic) for t in (problem.score_mod, problem.mask_mod))


def _sizes(problem: AttentionProblem) -> tuple[dict[str, int], set[str]]:
    sizes = {"b": problem.B, "h": problem.H, "m": problem.Sq, "n": problem.Skv}
    dynamic = {v for v, d in (("b", "B"), ("m", "Sq"), ("n", "Skv")) if d in problem.dynamic}
    return sizes, dynamic


def render_all(problem: AttentionProblem, interpreted: bool, names: IndexNames = IndexNames()
               ) -> tuple[RenderedMod, RenderedMod, RenderedMod, str]:
    """(score_mod, mask_mod, derivative of the score_mod w.r.t. the score, the ``@triton.jit``
    helpers they call). The derivative is rendered for backward problems only (else empty).

    Raises:
        NotDifferentiable: a backward problem whose score_mod has no derivative rule.
    """
    from tilewright.ir.bounds import checks_enabled

    helpers: set[str] = set()
    out = []
    extents = mods.index_extents(*_sizes(problem)) if checks_enabled() else None
    sm = mods.loads(problem.score_mod)
    deriv = mods.score_derivative(sm) if problem.direction == "backward" else None
    for text, prefix in ((problem.score_mod, "sm"), (problem.mask_mod, "mk"),
                         (mods.dumps(deriv) if deriv is not None else "", "dm")):
        value = mods.loads(text)
        if value is None:
            out.append(RenderedMod("", ""))
            continue
        e = _emitter(interpreted, names, prefix, extents)
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
