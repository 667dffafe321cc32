"""Activation quantisation as loop nodes: ``tilewright.nvfp4_quantize`` with a calibrated global
scale becomes two pointwise nodes (the packed E2M1 bytes and the E4M3 block scales), so the
fusion scheduler puts them in the kernel of the value they quantise (an RMSNorm, a SwiGLU, a
residual add) and that kernel writes what the NVFP4 GEMM reads: no separate launch, and the
bf16 activation never goes to memory.

The arithmetic is :func:`tilewright.quant.nvfp4.quantize`'s, operation for operation, so the
bytes are the same (``tests/test_fused_quant.py`` compares them):

* ``encode = 1 / global_scale``; a block's scale is ``e4m3(min(amax / 6 * encode, 448))``, the
  E4M3 rounding written with the IR's own ops (:func:`e4m3_round`: a power-of-two quantum per
  binade, then round half to even), so no emitter needs an fp8 conversion of its own;
* each value is ``x * encode / scale`` (0 where the scale is 0), encoded to E2M1 by counting
  the midpoints below it, ties to the even code (:func:`e2m1_code`), with its sign bit;
* the even element of a pair goes to the low nibble.

Every block needs its 16 values and every byte its block's scale, so a kernel lane computes
its block's values again (a fused producer is recomputed per lane, from cache): loads, not
stores, are what a memory-bound kernel pays for.

Refused (the op stays ATen's, :class:`Unsupported`): a per-call global scale (it is the amax of
the whole tensor: a grid-wide reduction before any block can be scaled), a use of the op's third
output (the global scale: read the calibrated one itself), K not a multiple of 16 or symbolic.
"""

from __future__ import annotations

import operator

import sympy
import torch

import tilewright.quant.ops  # noqa: F401 - registers torch.ops.tilewright.nvfp4_quantize
from tilewright._config import config
from tilewright.kinds.loop.lower import LoopLowering, Scalar, Unsupported, lowering
from tilewright.kinds.loop.lower.reductions import _meta
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.quant.nvfp4 import BLOCK, E2M1_MAX, E4M3_MAX

# E4M3 (fn): normal binades 2^-6 .. 2^8 with 3 mantissa bits, subnormals in steps of 2^-9
_E4M3_MIN_EXP, _E4M3_MAX_EXP, _E4M3_MANTISSA = -6, 8, 3
# the midpoints between neighbouring E2M1 magnitudes; at the k-th one the lower code is k, so
# a tie goes up where k is odd (to the even code), down where k is even
_E2M1_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def e4m3_round(v: E.Node) -> E.Node:
    """fp32 ``v`` (>= 0, <= 448, or NaN) rounded to the nearest E4M3 value, ties to even, as
    fp32: ``round(v / q) * q`` with ``q`` the quantum of ``v``'s binade (a power of two, so the
    scaling is exact). NaN stays NaN (no comparison holds: q is the subnormal one)."""
    inv_q, q = E.const(2.0 ** (_E4M3_MANTISSA - _E4M3_MIN_EXP), "fp32"), E.const(2.0 ** (_E4M3_MIN_EXP - _E4M3_MANTISSA), "fp32")
    for e in range(_E4M3_MIN_EXP + 1, _E4M3_MAX_EXP + 1):
        at_least = E.op("ge", v, E.const(2.0 ** e, "fp32"))
        inv_q = E.where(at_least, E.const(2.0 ** (_E4M3_MANTISSA - e), "fp32"), inv_q)
        q = E.where(at_least, E.const(2.0 ** (e - _E4M3_MANTISSA), "fp32"), q)
    return E.op("mul", E.op("round", E.op("mul", v, inv_q)), q)


def e2m1_code(x: E.Node) -> E.Node:
    """The E2M1 code (i32 0..15, bit 3 the sign) of fp32 ``x``, as
    :func:`tilewright.quant.nvfp4.e2m1_encode`: magnitudes saturate at 6, NaN is +-0, ties to
    the even code."""
    a = E.op("abs", x)
    a = E.where(E.op("isnan", a), E.const(0.0, "fp32"), E.op("minimum", a, E.const(E2M1_MAX, "fp32")))
    code = E.const(0, "i32")
    for k, mid in enumerate(_E2M1_MIDS):
        above = E.op("ge" if k % 2 else "gt", a, E.const(mid, "fp32"))
        code = E.op("add", code, E.cast(above, "i32"))
    # the sign bit, -0 and a negative NaN included
    negative = E.op("lt", E.op("copysign", E.const(1.0, "fp32"), x), E.const(0.0, "fp32"))
    return E.op("add", code, E.where(negative, E.const(8, "i32"), E.const(0, "i32")))


def nvfp4_block_scale(block: list[E.Node], encode: E.Node) -> E.Node:
    """The E4M3 scale (fp32, E4M3-exact) of one block of 16 fp32 values."""
    amax = E.op("abs", block[0])
    for v in block[1:]:
        amax = E.op("maximum", amax, E.op("abs", v))  # NaN propagates, as torch's amax
    scaled = E.op("mul", E.op("truediv", amax, E.const(E2M1_MAX, "fp32")), encode)
    return e4m3_round(E.op("minimum", scaled, E.const(E4M3_MAX, "fp32")))


def nvfp4_code(x: E.Node, scale: E.Node, encode: E.Node) -> E.Node:
    """The E2M1 code (i32) of fp32 ``x`` in a block of scale ``scale``."""
    zero, one = E.const(0.0, "fp32"), E.const(1.0, "fp32")
    positive = E.op("gt", scale, zero)
    scaled = E.op("truediv", E.op("mul", x, encode), E.where(positive, scale, one))
    return e2m1_code(E.where(positive, scaled, zero))


def _static_k(x) -> int:
    K = sympy.sympify(x.shape[-1]) if x.shape else None
    if K is None or not K.is_Integer:
        raise Unsupported("NVFP4 quantisation in a loop kernel needs a static K (the last dim)")
    if int(K) % BLOCK:
        raise Unsupported(f"K={int(K)} is not a multiple of {BLOCK}: the op raises as it does unfused")
    return int(K)


@lowering(torch.ops.tilewright.nvfp4_quantize.default)
def _nvfp4_quantize(ctx: LoopLowering, node, a):
    if not config.fuse_quantisation:
        raise Unsupported("TILEWRIGHT_FUSE_QUANTISATION=0")
    x = ctx.value(a["x"])
    if isinstance(x, Scalar) or not dtypes.is_float(x.dtype) or not x.shape:
        raise Unsupported("quantises float tensors of at least one dim")
    if a["global_scale"] is None:
        raise Unsupported("a per-call global scale is the whole tensor's amax: calibrate the layer to fuse")
    gs = ctx.value(a["global_scale"])
    if isinstance(gs, Scalar) or any(s != 1 for s in gs.shape):
        raise Unsupported("the global scale is not a one-element tensor")
    if any(u.target is operator.getitem and u.args[1] == 2 and u.users for u in node.users):
        raise Unsupported("the op's global-scale output is read: read the calibrated scale instead")
    _static_k(x)
    encode = E.op("truediv", E.const(1.0, "fp32"), E.cast(gs.load((0,) * len(gs.shape)), "fp32"))
    names = ctx.output_names(node, 3)
    vals = node.meta["val"]
    lead_n = len(x.shape) - 1

    def value(lead, k) -> E.Node:
        return E.cast(x.load(tuple(lead) + (k,)), "fp32")

    def scale_of(lead, b) -> E.Node:
        return nvfp4_block_scale([value(lead, BLOCK * b + t) for t in range(BLOCK)], encode)

    def packed(idx):
        lead, j = idx[:lead_n], idx[lead_n]
        s = scale_of(lead, sympy.floor(j / (BLOCK // 2)))
        lo, hi = (nvfp4_code(value(lead, 2 * j + t), s, encode) for t in (0, 1))
        return E.op("add", lo, E.op("mul", hi, E.const(16, "i32")))

    def scales(idx):
        return scale_of(idx[:lead_n], idx[lead_n])

    used = {u.args[1] for u in node.users if u.target is operator.getitem and u.users}
    out = [None, None, None]
    if 0 in used:
        out[0] = ctx.loop(node, packed, name=names[0], meta=_meta(vals[0]))
    if 1 in used:
        out[1] = ctx.loop(node, scales, name=names[1], meta=_meta(vals[1]))
    if not any(out):
        raise Unsupported("no output is used")
    return tuple(out)


__all__ = ["e2m1_code", "e4m3_round", "nvfp4_block_scale", "nvfp4_code"]
