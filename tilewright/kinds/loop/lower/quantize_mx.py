"""MX activation quantisation (OCP MX v1.0 MXFP4 / MXFP8) as loop nodes, so the fusion
scheduler puts it in the kernel of the value it quantises, as :mod:`.quantize` does for NVFP4.

``tilewright.mx_quantize`` needs no calibration (each 32-element block has its own power-of-two
scale), so it always fuses. Its arithmetic is :func:`tilewright.quant.mx.quantize`'s, and the
bytes are the same (``tests/test_fused_mx_quant.py``):

* a block holding a NaN or an infinity gets scale byte 255 (NaN) and zero values;
* the shared exponent is ``floor(log2(amax)) - emax_elem``, clamped to -127 (a zero block gets
  -127). ``floor(log2)`` is found without a bitcast or ``frexp`` op: a ladder of exact
  power-of-two scalings (:func:`floor_log2`) brings ``amax`` into [1, 2) and counts the steps,
  so every emitter computes it with comparisons and multiplies it already has;
* each value is ``x * 2^-exp``; ``2^-exp`` is built from the bits of the exponent
  (:func:`pow2`), a product of exact powers of two, so it equals torch's ``ldexp``;
* MXFP4: the E2M1 code of that (:func:`.quantize.e2m1_code`), pairs packed low nibble first;
  MXFP8: clamped to +-448 and rounded to E4M3 in IR arithmetic (:func:`.quantize.e4m3_round`),
  so the store's fp8 conversion is exact in every emitter.

E8M0 is no dtype of the kernel IR: before lowering (the loop kind's ``rewrite_fx``),
:func:`expose_scale_bytes` retargets the op
to ``tilewright.mx_quantize_bytes`` (the scales as uint8) and views its scale output as
``float8_e8m0fnu`` (a free view), so the fused kernel stores the scale bytes as ``u8``.

Refused (the op stays an ATen call of its own): K symbolic or not a multiple of 32, a
non-float input, ``TILEWRIGHT_FUSE_QUANTISATION=0``.
"""

from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx

import tilewright.quant.ops  # noqa: F401 - registers torch.ops.tilewright.mx_quantize*
from tilewright._config import config
from tilewright.kinds.loop.lower import LoopLowering, Scalar, Unsupported, lowering
from tilewright.kinds.loop.lower.quantize import e2m1_code, e4m3_round
from tilewright.kinds.loop.lower.reductions import _meta
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.quant.mx import BLOCK, E8M0_BIAS, FORMATS

aten = torch.ops.aten
MX_QUANTIZE = torch.ops.tilewright.mx_quantize.default
MX_QUANTIZE_BYTES = torch.ops.tilewright.mx_quantize_bytes.default

# a power-of-two factor 2^-exp is 2^_POW2_LOW times the powers of the bits of exp's offset;
# exp lies in [-127, 125] (floor(log2) of a finite fp32 is at most 127, emax_elem at least 2),
# so every partial product stays a normal fp32
_POW2_LOW = -125


def _c(v: float) -> E.Node:
    return E.const(float(v), "fp32")


def _i(v: int) -> E.Node:
    return E.const(int(v), "i32")


def floor_log2(a: E.Node) -> E.Node:
    """i32 ``floor(log2(a))`` of a finite fp32 ``a`` > 0 (subnormals included), exactly: ``a``
    is scaled by powers of two (exact) until it lies in [1, 2), counting the exponents. For
    ``a == 0`` it is -191 (callers select their own value for a zero)."""
    v, e = a, _i(0)
    for s in (64, 32, 16, 8, 4, 2, 1):  # down: a < 2^128, so at most 127
        big = E.op("ge", v, _c(2.0 ** s))
        v = E.where(big, E.op("mul", v, _c(2.0 ** -s)), v)
        e = E.op("add", e, E.where(big, _i(s), _i(0)))
    for s in (64, 64, 32, 16, 8, 4, 2, 1):  # up: a >= 2^-149; after each step v >= 2^(1-s)
        small = E.op("lt", v, _c(2.0 ** (1 - s)))
        v = E.where(small, E.op("mul", v, _c(2.0 ** s)), v)
        e = E.op("sub", e, E.where(small, _i(s), _i(0)))
    return e


def pow2(n: E.Node) -> E.Node:
    """fp32 ``2^n`` for an i32 ``n`` in [-125, 127], exactly: ``2^-125`` times ``2^(2^b)`` for
    each set bit ``b`` of ``n + 125``, low bits first (every partial product a normal fp32
    power of two, at most the result)."""
    m = E.op("add", n, _i(-_POW2_LOW))
    p = _c(2.0 ** _POW2_LOW)
    for b in range(8):
        bit = E.op("ne", E.op("bitwise_and", m, _i(1 << b)), _i(0))
        # 2^128 is no fp32 (nor, for Triton, an fp32 literal): bit 7 multiplies by 2^64 twice
        for factor in ((2.0 ** 64, 2.0 ** 64) if b == 7 else (2.0 ** (1 << b),)):
            p = E.op("mul", p, E.where(bit, _c(factor), _c(1.0)))
    return p


def mx_block(block: list[E.Node], fmt: str) -> tuple[E.Node, E.Node, E.Node]:
    """(bad, scale byte i32, factor 2^-exp fp32) of one block of 32 fp32 values."""
    amax = E.op("abs", block[0])
    for v in block[1:]:
        amax = E.op("maximum", amax, E.op("abs", v))  # NaN propagates
    bad = E.op("logical_or", E.op("isnan", amax), E.op("isinf", amax))
    amax = E.where(bad, _c(0.0), amax)
    emax = FORMATS[fmt][0]
    exp = E.where(E.op("gt", amax, _c(0.0)), E.op("sub", floor_log2(amax), _i(emax)), _i(-E8M0_BIAS))
    exp = E.op("maximum", exp, _i(-E8M0_BIAS))
    byte = E.where(bad, _i(255), E.op("add", exp, _i(E8M0_BIAS)))
    return bad, byte, pow2(E.op("neg", exp))


def mx_element(x: E.Node, bad: E.Node, factor: E.Node, fmt: str) -> E.Node:
    """An element's stored value: the i32 E2M1 code (mxfp4) or the E4M3-exact fp32 (mxfp8)."""
    scaled = E.op("mul", E.where(bad, _c(0.0), x), factor)
    if fmt == "mxfp4":
        return e2m1_code(scaled)
    top = FORMATS[fmt][1]
    clamped = E.op("maximum", E.op("minimum", scaled, _c(top)), _c(-top))
    return E.op("copysign", e4m3_round(E.op("abs", clamped)), clamped)


def expose_scale_bytes(gm: fx.GraphModule) -> int:
    """Retarget each ``tilewright.mx_quantize`` to ``tilewright.mx_quantize_bytes`` and view
    its scale output as ``float8_e8m0fnu`` (free), so a loop kernel can store the scales as
    bytes. Returns the number retargeted (0 when quantisation fusion is off)."""
    if not config.fuse_quantisation:
        return 0
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target != MX_QUANTIZE:
            continue
        node.target = MX_QUANTIZE_BYTES
        val = node.meta.get("val")
        if isinstance(val, (tuple, list)) and len(val) == 2:
            node.meta["val"] = (val[0], val[1].view(torch.uint8))
        for user in list(node.users):
            if user.target is not operator.getitem or user.args[1] != 1:
                continue
            e8m0 = user.meta.get("val")
            if e8m0 is not None:
                user.meta["val"] = e8m0.view(torch.uint8)
            with gm.graph.inserting_after(user):
                view = gm.graph.call_function(aten.view.dtype, (user, torch.float8_e8m0fnu))
            if e8m0 is not None:
                view.meta["val"] = e8m0
            user.replace_all_uses_with(view, delete_user_cb=lambda n, v=view: n is not v)
        done += 1
    if done:
        gm.recompile()
    return done


@lowering(MX_QUANTIZE_BYTES)
def _mx_quantize(ctx: LoopLowering, node, a):
    if not config.fuse_quantisation:
        raise Unsupported("TILEWRIGHT_FUSE_QUANTISATION=0")
    x, fmt = ctx.value(a["x"]), a["fmt"]
    if fmt not in FORMATS:
        raise Unsupported(f"not an MX format: {fmt!r} (the op raises as it does unfused)")
    if isinstance(x, Scalar) or not dtypes.is_float(x.dtype) or not x.shape:
        raise Unsupported("quantises float tensors of at least one dim")
    K = sympy.sympify(x.shape[-1])
    if not K.is_Integer or int(K) % BLOCK:
        raise Unsupported(f"MX quantisation in a loop kernel needs a static K that is a multiple of {BLOCK}")
    names = ctx.output_names(node, 2)
    vals = node.meta["val"]
    lead_n = len(x.shape) - 1
    vpb = FORMATS[fmt][2]

    def value(lead, k) -> E.Node:
        return E.cast(x.load(tuple(lead) + (k,)), "fp32")

    def block_of(lead, b):
        return mx_block([value(lead, BLOCK * b + t) for t in range(BLOCK)], fmt)

    def data(idx):
        lead, j = idx[:lead_n], idx[lead_n]
        bad, _, factor = block_of(lead, sympy.floor(j * vpb / BLOCK))
        if vpb == 1:
            return mx_element(value(lead, j), bad, factor, fmt)
        lo, hi = (mx_element(value(lead, 2 * j + t), bad, factor, fmt) for t in (0, 1))
        return E.op("add", lo, E.op("mul", hi, _i(16)))

    def scales(idx):
        return block_of(idx[:lead_n], idx[lead_n])[1]

    used = {u.args[1] for u in node.users if u.target is operator.getitem and u.users}
    out = [None, None]
    if 0 in used:
        out[0] = ctx.loop(node, data, name=names[0], meta=_meta(vals[0]))
    if 1 in used:
        out[1] = ctx.loop(node, scales, name=names[1], meta=_meta(vals[1]))
    if not any(out):
        raise Unsupported("no output is used")
    return tuple(out)


__all__ = ["expose_scale_bytes", "floor_log2", "mx_block", "mx_element", "pow2"]
