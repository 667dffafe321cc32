"""The Triton GEMM templates' epilogue hook: the epilogue's IR rendered by the IR's Triton
emitter (Inductor's ``store_output`` idea), so no template interprets epilogue ops itself.

The rendered statements update ``acc``, the fp32 accumulator tile, in place. They expect in
scope: ``offs_m``, ``offs_n`` (the tile's row and column indices), ``mask_m``, ``mask_n``,
``c_mask``, ``pid_b``, and for each epilogue input ``k`` its pointer ``E{k}`` and strides
``stride_e{k}b/m/n``. Masked-off lanes read 1.0, so no 0/0 appears in lanes never stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewright.ir.expr import Node
from tilewright.templates.triton.emit import TritonExpr


@dataclass(frozen=True)
class RenderedEpilogue:
    """Statements (4-space relative indentation, re-indent with jinja's ``indent``) and the
    source of the ``@triton.jit`` helpers they call (module level)."""

    code: str
    helpers: str
    stored: str = ""  # the variable holding the stored product (store_acc), set by the code


def _load(n: Node) -> str:
    return _pointer_load(n) + ".to(tl.float32)"


def _pointer_load(n: Node) -> str:
    name, idx, _ = n.arg
    k = int(name[1:])
    dims = {str(v) for v in idx}
    boff = f"pid_b * stride_e{k}b + " if "b" in dims else ""
    if {"m", "n"} <= dims:
        return (f"tl.load(E{k} + {boff}offs_m[:, None] * stride_e{k}m + offs_n[None, :] * stride_e{k}n, "
                f"mask=c_mask, other=1.0)")
    if "n" in dims:
        return f"tl.load(E{k} + {boff}offs_n * stride_e{k}n, mask=mask_n, other=1.0)[None, :]"
    if "m" in dims:
        return f"tl.load(E{k} + {boff}offs_m * stride_e{k}m, mask=mask_m, other=1.0)[:, None]"
    return f"tl.load(E{k} + pid_b * stride_e{k}b)" if boff else f"tl.load(E{k})"


def render_epilogue(value: Node, interpreted: bool, stored: Node | None = None) -> RenderedEpilogue:
    """The epilogue expression ``value`` (:func:`tilewright.ir.epilogue.problem_epilogue`) as
    Triton statements; see the module docstring. ``stored``: a value on the way (the product a
    store_acc problem also writes), emitted first and named in the result."""
    e = TritonExpr(interpreted=interpreted, load=_load, acc=lambda n: "acc", prefix="ep")
    kept = e.emit(stored) if stored is not None else ""
    if kept == "acc":  # the plain accumulator: keep it under a name the epilogue does not reuse
        kept = e.fresh()
        e.line(f"{kept} = acc")
    value = e.emit(value)
    lines = e.lines + ([f"acc = {value}"] if value != "acc" else [])
    return RenderedEpilogue("\n".join(lines), e.helpers(), kept)
