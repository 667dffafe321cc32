"""The Triton GEMM templates' epilogue hook: the epilogue's IR rendered by the IR's Triton
emitter (Inductor's ``store_output`` idea), so no template interprets epilogue ops itself.

The rendered statements update ``acc``, the fp32 accumulator tile, in place. They expect in
scope: ``offs_m``, ``offs_n`` (the tile's row and column indices), ``mask_m``, ``mask_n``,
``c_mask``, ``pid_b``, and for each epilogue input ``k`` its pointer ``E{k}`` and strides
``stride_e{k}b/m/n``. Masked-off lanes read 1.0, so no 0/0 appears in lanes never stored.

The templates store ``out_value`` (and ``stored_value``) converted to the output's element type.
On a GPU that conversion rounds to nearest even and the values are ``acc`` itself; under the
Triton interpreter, whose fp32 -> bf16 conversion truncates (twice eager's error), they are
rounded to nearest even first, as the loop kernels' stores are (``TritonExpr.convert``).
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
    out_value: str = "acc"  # what the template converts to C's element type and stores
    stored_value: str = ""  # the same for the stored product (store_acc)


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


def _for_store(e: TritonExpr, var: str, dtype: str) -> str:
    """``var`` (an fp32 tile) ready to be converted to ``dtype`` by a store: rounded to nearest
    even first under the interpreter (its own fp32 -> bf16 conversion truncates); unchanged on
    a GPU, whose conversion already rounds to nearest even."""
    if e.interpreted and dtype in ("bf16", "fp16"):
        # bf16 as a bf16 block made by its bits (the template's own conversion is then a no-op:
        # the interpreter's would flush subnormals)
        return e.store_value(var, "fp32", dtype) if dtype == "bf16" else e.convert(var, "fp32", dtype)
    return var


def render_epilogue(value: Node, interpreted: bool, stored: Node | None = None, *,
                    out_dtype: str = "fp32", stored_dtype: str = "fp32") -> RenderedEpilogue:
    """The epilogue expression ``value`` (:func:`tilewright.ir.epilogue.problem_epilogue`) as
    Triton statements; see the module docstring. ``stored``: a value on the way (the product a
    store_acc problem also writes), emitted first and named in the result. ``out_dtype`` /
    ``stored_dtype``: the element types those values are stored as."""
    e = TritonExpr(interpreted=interpreted, load=_load, acc=lambda n: "acc", prefix="ep")
    kept = e.emit(stored) if stored is not None else ""
    if kept == "acc":  # the plain accumulator: keep it under a name the epilogue does not reuse
        kept = e.fresh()
        e.line(f"{kept} = acc")
    value = e.emit(value)
    lines = e.lines + ([f"acc = {value}"] if value != "acc" else [])
    out_value = _for_store(e, "acc", out_dtype)
    stored_value = _for_store(e, kept, stored_dtype) if kept else ""
    return RenderedEpilogue("\n".join(lines), e.helpers(), kept, out_value, stored_value)
