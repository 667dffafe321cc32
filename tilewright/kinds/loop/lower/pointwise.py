"""Lowering rules for elementwise ATen ops: arithmetic, math, comparisons, activations and their
backward formulas, casts, copies and constant fills. An activation is one line here (its formula
in IR ops), and becomes a fusable pointwise op everywhere: loop kernels and GEMM epilogues."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.fx as fx

from tilewright.kinds.loop.lower import (
    LoopLowering, Promotion, Scalar, Unsupported, View, computation_dtype, lowering,
)
from tilewright.ir import dtypes
from tilewright.ir import expr as E

aten = torch.ops.aten
prims = torch.ops.prims
DEFAULT, TO_FLOAT, BOOL = Promotion.DEFAULT, Promotion.INT_TO_FLOAT, Promotion.ALWAYS_BOOL
N = E.Node


def elementwise(ctx: LoopLowering, node: fx.Node, operands: list[Any], fn: Callable[..., N],
                kind: Promotion = DEFAULT, operand_dtype: str | None = None):
    """A loop node computing ``fn(*operands)`` element by element (operands broadcast, converted
    to the computation dtype, or to ``operand_dtype`` when given)."""
    cdt = operand_dtype or computation_dtype(node, operands, kind)
    vals = [ctx.value(o) for o in operands]
    return ctx.loop(node, lambda idx: fn(*[ctx.operand(v, idx, cdt) for v in vals]))


def _c(x: N, value: float) -> N:
    """A constant of ``x``'s dtype."""
    return E.const(value, x.dtype)


# -- direct IR ops --------------------------------------------------------------------------------
UNARY = {
    aten.neg: ("neg", DEFAULT), aten.abs: ("abs", DEFAULT), aten.exp: ("exp", TO_FLOAT),
    aten.exp2: ("exp2", TO_FLOAT), aten.expm1: ("expm1", TO_FLOAT), aten.log: ("log", TO_FLOAT),
    aten.log2: ("log2", TO_FLOAT), aten.log10: ("log10", TO_FLOAT), aten.log1p: ("log1p", TO_FLOAT),
    aten.sqrt: ("sqrt", TO_FLOAT), aten.rsqrt: ("rsqrt", TO_FLOAT), aten.sin: ("sin", TO_FLOAT),
    aten.cos: ("cos", TO_FLOAT), aten.tan: ("tan", TO_FLOAT), aten.asin: ("asin", TO_FLOAT),
    aten.acos: ("acos", TO_FLOAT), aten.atan: ("atan", TO_FLOAT), aten.sinh: ("sinh", TO_FLOAT),
    aten.cosh: ("cosh", TO_FLOAT), aten.tanh: ("tanh", TO_FLOAT), aten.sigmoid: ("sigmoid", TO_FLOAT),
    aten.erf: ("erf", TO_FLOAT), aten.erfinv: ("erfinv", TO_FLOAT), aten.reciprocal: ("reciprocal", TO_FLOAT),
    aten.sign: ("sign", DEFAULT), aten.isnan: ("isnan", BOOL), aten.isinf: ("isinf", BOOL),
    aten.bitwise_not: ("bitwise_not", DEFAULT),
}
FLOAT_ONLY = {"floor", "ceil", "trunc", "round"}
BINARY = {
    aten.mul: ("mul", DEFAULT), aten.maximum: ("maximum", DEFAULT), aten.minimum: ("minimum", DEFAULT),
    aten.fmod: ("fmod", DEFAULT), aten.remainder: ("mod", DEFAULT), aten.atan2: ("atan2", TO_FLOAT),
    aten.eq: ("eq", BOOL), aten.ne: ("ne", BOOL), aten.lt: ("lt", BOOL), aten.le: ("le", BOOL),
    aten.gt: ("gt", BOOL), aten.ge: ("ge", BOOL), aten.bitwise_and: ("bitwise_and", DEFAULT),
    aten.bitwise_or: ("bitwise_or", DEFAULT), aten.bitwise_xor: ("bitwise_xor", DEFAULT),
    aten.copysign: ("copysign", TO_FLOAT),
}
LOGICAL = {aten.logical_and: "logical_and", aten.logical_or: "logical_or", aten.logical_xor: "logical_xor"}


def _register_table() -> None:
    for target, (name, kind) in UNARY.items():
        def rule(ctx, node, a, name=name, kind=kind):
            return elementwise(ctx, node, [a["self"]], lambda x: E.op(name, x), kind)
        lowering(target)(rule)
    for target, (name, kind) in BINARY.items():
        def rule(ctx, node, a, name=name, kind=kind):
            return elementwise(ctx, node, [a["self"], a["other"]], lambda x, y: E.op(name, x, y), kind)
        lowering(target)(rule)
    for target, name in LOGICAL.items():
        def rule(ctx, node, a, name=name):
            return elementwise(ctx, node, [a["self"], a["other"]], lambda x, y: E.op(name, x, y),
                               operand_dtype="bool")
        lowering(target)(rule)


_register_table()


@lowering(aten.floor, aten.ceil, aten.trunc, aten.round.default)
def _rounding(ctx, node, a):
    name = str(node.target).split(".")[1]
    if not dtypes.is_float(dtypes.name_of(node.meta["val"].dtype)):
        return elementwise(ctx, node, [a["self"]], lambda x: x)  # integers are already whole
    return elementwise(ctx, node, [a["self"]], lambda x: E.op(name, x))


@lowering(aten.round.decimals)
def _round_decimals(ctx, node, a):
    """torch.round(x, decimals=d) as eager computes it, in the compute type: rint(x * 10^d) /
    10^d, or for d < 0 rint(x / 10^-d) * 10^-d (so 10^d itself is never a fraction)."""
    d = int(a.get("decimals", 0))
    if not dtypes.is_float(dtypes.name_of(node.meta["val"].dtype)):
        raise Unsupported("round(decimals=...) of an integer tensor")
    scale = float(10 ** abs(d))

    def fn(x: N) -> N:
        if d < 0:
            return E.op("round", x / _c(x, scale)) * _c(x, scale)
        return E.op("round", x * _c(x, scale)) / _c(x, scale)
    return elementwise(ctx, node, [a["self"]], fn)


@lowering(aten.angle)
def _angle(ctx, node, a):
    """torch.angle of a real tensor: pi where x < 0, else 0, and NaN where x is NaN (in the
    float dtype eager returns: integers give the default float)."""
    if node.args[0].meta["val"].is_complex():
        raise Unsupported("angle of a complex tensor")

    def fn(x: N) -> N:
        zero_or_pi = E.where(E.op("lt", x, _c(x, 0)), _c(x, math.pi), _c(x, 0))
        return E.where(E.op("isnan", x), x, zero_or_pi)
    return elementwise(ctx, node, [a["self"]], fn, TO_FLOAT)


@lowering(aten.logical_not)
def _logical_not(ctx, node, a):
    return elementwise(ctx, node, [a["self"]], lambda x: E.op("logical_not", x), operand_dtype="bool")


@lowering(aten.add, aten.sub, aten.rsub)
def _add_sub(ctx, node, a):
    alpha = a.get("alpha", 1)
    if isinstance(alpha, fx.Node):
        raise Unsupported("tensor alpha")
    op = "add" if node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    rsub = node.target in (aten.rsub.Tensor, aten.rsub.Scalar)

    def fn(x: N, y: N) -> N:
        # alpha scales the subtrahend: self - alpha * other, and rsub's other - alpha * self
        if alpha != 1 and rsub:
            x = x * _c(x, alpha)
        elif alpha != 1:
            y = y * _c(y, alpha)
        return E.op(op, y, x) if rsub else E.op(op, x, y)
    return elementwise(ctx, node, [a["self"], a["other"]], fn)


@lowering(aten.div.Tensor, aten.div.Scalar)
def _div(ctx, node, a):
    return elementwise(ctx, node, [a["self"], a["other"]], lambda x, y: x / y, TO_FLOAT)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, node, a):
    mode = a["rounding_mode"]
    if mode is None:
        return elementwise(ctx, node, [a["self"], a["other"]], lambda x, y: x / y, TO_FLOAT)
    name = {"floor": "floordiv", "trunc": "truncdiv"}[mode]
    return elementwise(ctx, node, [a["self"], a["other"]], lambda x, y: E.op(name, x, y))


@lowering(aten.floor_divide)
def _floor_divide(ctx, node, a):
    return elementwise(ctx, node, [a["self"], a["other"]], lambda x, y: E.op("floordiv", x, y))


@lowering(aten.pow.Tensor_Scalar)
def _pow_scalar(ctx, node, a):
    e = a["exponent"]
    if isinstance(e, fx.Node):
        raise Unsupported("tensor exponent")
    if isinstance(e, (int, float)) and float(e).is_integer() and abs(e) <= 4:
        n = int(e)

        def fn(x: N) -> N:
            if n == 0:
                return _c(x, 1)
            out = x
            for _ in range(abs(n) - 1):
                out = out * x
            return E.op("reciprocal", out) if n < 0 else out
        kind = TO_FLOAT if n < 0 else DEFAULT
        return elementwise(ctx, node, [a["self"], e], lambda x, _e: fn(x), kind)
    if e == 0.5:
        return elementwise(ctx, node, [a["self"], e], lambda x, _e: E.op("sqrt", x), TO_FLOAT)
    if e == -0.5:
        return elementwise(ctx, node, [a["self"], e], lambda x, _e: E.op("rsqrt", x), TO_FLOAT)
    return elementwise(ctx, node, [a["self"], e], lambda x, y: E.op("pow", x, y))


@lowering(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(ctx, node, a):
    if not dtypes.is_float(dtypes.name_of(node.meta["val"].dtype)):
        raise Unsupported("integer pow")
    return elementwise(ctx, node, [a["self"], a["exponent"]], lambda x, y: E.op("pow", x, y))


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx, node, a):
    cdt = computation_dtype(node, [a["self"], a["other"]], DEFAULT)
    cond, x, y = ctx.value(a["condition"]), ctx.value(a["self"]), ctx.value(a["other"])
    return ctx.loop(node, lambda idx: E.where(ctx.operand(cond, idx, "bool"), ctx.operand(x, idx, cdt),
                                              ctx.operand(y, idx, cdt)))


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx, node, a):
    cdt = dtypes.compute_type(dtypes.name_of(node.meta["val"].dtype))
    x, mask, v = ctx.value(a["self"]), ctx.value(a["mask"]), ctx.value(a["value"])
    return ctx.loop(node, lambda idx: E.where(ctx.operand(mask, idx, "bool"), ctx.operand(v, idx, cdt),
                                              ctx.operand(x, idx, cdt)))


# -- activations and their gradients ----------------------------------------------------------------
def _relu(x: N) -> N:
    return E.op("maximum", x, _c(x, 0))


def _gelu(x: N, approximate: str) -> N:
    if approximate == "tanh":
        inner = _c(x, math.sqrt(2 / math.pi)) * (x + _c(x, 0.044715) * x * x * x)
        return _c(x, 0.5) * x * (_c(x, 1) + E.op("tanh", inner))
    return _c(x, 0.5) * x * (_c(x, 1) + E.op("erf", x * _c(x, 1 / math.sqrt(2))))


def _silu(x: N) -> N:
    return x * E.op("sigmoid", x)


@lowering(aten.relu)
def _relu_rule(ctx, node, a):
    return elementwise(ctx, node, [a["self"]], _relu)


@lowering(aten.gelu)
def _gelu_rule(ctx, node, a):
    return elementwise(ctx, node, [a["self"]], lambda x: _gelu(x, a["approximate"]), TO_FLOAT)


@lowering(aten.silu)
def _silu_rule(ctx, node, a):
    return elementwise(ctx, node, [a["self"]], _silu, TO_FLOAT)


@lowering(aten.hardtanh)
def _hardtanh(ctx, node, a):
    lo, hi = a["min_val"], a["max_val"]
    return elementwise(ctx, node, [a["self"]], lambda x: E.op("minimum", E.op("maximum", x, _c(x, lo)), _c(x, hi)))


@lowering(aten.leaky_relu)
def _leaky_relu(ctx, node, a):
    s = a["negative_slope"]
    return elementwise(ctx, node, [a["self"]], lambda x: E.where(E.op("gt", x, _c(x, 0)), x, x * _c(x, s)))


@lowering(aten.softplus)
def _softplus(ctx, node, a):
    beta, threshold = a["beta"], a["threshold"]

    def fn(x: N) -> N:
        bx = x * _c(x, beta)
        return E.where(E.op("gt", bx, _c(x, threshold)), x,
                       E.op("log1p", E.op("exp", bx)) / _c(x, beta))
    return elementwise(ctx, node, [a["self"]], fn, TO_FLOAT)


@lowering(aten.elu)
def _elu(ctx, node, a):
    alpha, scale, in_scale = a["alpha"], a["scale"], a["input_scale"]

    def fn(x: N) -> N:
        neg = _c(x, alpha) * E.op("expm1", x * _c(x, in_scale))
        # zeros take the linear side, as eager's: elu(+0) is +0 and elu(-0) is -0 even for a
        # negative alpha, where expm1(0) * alpha is -0 (fuzzer find)
        return E.where(E.op("ge", x, _c(x, 0)), x, neg) * _c(x, scale)
    return elementwise(ctx, node, [a["self"]], fn, TO_FLOAT)


@lowering(aten.hardsigmoid)
def _hardsigmoid(ctx, node, a):
    return elementwise(ctx, node, [a["self"]], lambda x: E.op(
        "minimum", E.op("maximum", x + _c(x, 3), _c(x, 0)), _c(x, 6)) / _c(x, 6))


@lowering(aten.hardswish)
def _hardswish(ctx, node, a):
    return elementwise(ctx, node, [a["self"]], lambda x: x * E.op(
        "minimum", E.op("maximum", x + _c(x, 3), _c(x, 0)), _c(x, 6)) / _c(x, 6))


@lowering(aten.mish)
def _mish(ctx, node, a):
    return elementwise(ctx, node, [a["self"]], lambda x: x * E.op(
        "tanh", E.where(E.op("gt", x, _c(x, 20)), x, E.op("log1p", E.op("exp", x)))), TO_FLOAT)


@lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx, node, a):
    lo, hi = a["min"], a["max"]
    ops = [a["self"]] + [v for v in (lo, hi) if v is not None]

    def fn(x: N, *bounds: N) -> N:
        b = list(bounds)
        if lo is not None:
            x = E.op("maximum", x, b.pop(0))
        if hi is not None:
            x = E.op("minimum", x, b.pop(0))
        return x
    return elementwise(ctx, node, ops, fn)


@lowering(aten.clamp_min, aten.clamp_max)
def _clamp_one(ctx, node, a):
    name = "maximum" if "clamp_min" in str(node.target) else "minimum"
    bound = a["min"] if name == "maximum" else a["max"]
    return elementwise(ctx, node, [a["self"], bound], lambda x, b: E.op(name, x, b))


@lowering(aten.threshold)
def _threshold(ctx, node, a):
    t, v = a["threshold"], a["value"]
    return elementwise(ctx, node, [a["self"]], lambda x: E.where(E.op("le", x, _c(x, t)), _c(x, v), x))


@lowering(aten.threshold_backward)
def _threshold_backward(ctx, node, a):
    t = a["threshold"]
    return elementwise(ctx, node, [a["grad_output"], a["self"]],
                       lambda g, x: E.where(E.op("le", x, _c(x, t)), _c(g, 0), g))


@lowering(aten.sigmoid_backward)
def _sigmoid_backward(ctx, node, a):
    return elementwise(ctx, node, [a["grad_output"], a["output"]], lambda g, y: g * (_c(y, 1) - y) * y)


@lowering(aten.tanh_backward)
def _tanh_backward(ctx, node, a):
    return elementwise(ctx, node, [a["grad_output"], a["output"]], lambda g, y: g * (_c(y, 1) - y * y))


@lowering(aten.silu_backward)
def _silu_backward(ctx, node, a):
    def fn(g: N, x: N) -> N:
        s = E.op("sigmoid", x)
        return g * s * (_c(x, 1) + x * (_c(x, 1) - s))
    return elementwise(ctx, node, [a["grad_output"], a["self"]], fn, TO_FLOAT)


@lowering(aten.gelu_backward)
def _gelu_backward(ctx, node, a):
    def fn(g: N, x: N) -> N:
        if a["approximate"] == "tanh":
            k0, k1 = math.sqrt(2 / math.pi), 0.044715
            inner = _c(x, k0) * (x + _c(x, k1) * x * x * x)
            t = E.op("tanh", inner)
            left = _c(x, 0.5) * x
            right = _c(x, 1) + t
            d_inner = _c(x, k0) * (_c(x, 1) + _c(x, 3 * k1) * x * x)
            return g * (_c(x, 0.5) * right + left * (_c(x, 1) - t * t) * d_inner)
        cdf = _c(x, 0.5) * (_c(x, 1) + E.op("erf", x * _c(x, 1 / math.sqrt(2))))
        pdf = E.op("exp", _c(x, -0.5) * x * x) * _c(x, 1 / math.sqrt(2 * math.pi))
        return g * (cdf + x * pdf)
    return elementwise(ctx, node, [a["grad_output"], a["self"]], fn, TO_FLOAT)


@lowering(aten.hardtanh_backward)
def _hardtanh_backward(ctx, node, a):
    lo, hi = a["min_val"], a["max_val"]
    return elementwise(ctx, node, [a["grad_output"], a["self"]], lambda g, x: E.where(
        E.op("logical_or", E.op("le", x, _c(x, lo)), E.op("ge", x, _c(x, hi))), _c(g, 0), g))


@lowering(aten.addcmul)
def _addcmul(ctx, node, a):
    v = a["value"]
    return elementwise(ctx, node, [a["self"], a["tensor1"], a["tensor2"]],
                       lambda x, p, q: x + _c(x, v) * p * q)


@lowering(aten.addcdiv)
def _addcdiv(ctx, node, a):
    v = a["value"]
    return elementwise(ctx, node, [a["self"], a["tensor1"], a["tensor2"]],
                       lambda x, p, q: x + _c(x, v) * (p / q), TO_FLOAT)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx, node, a):
    return elementwise(ctx, node, [a["self"], a["end"], a["weight"]], lambda x, e, w: x + w * (e - x))


# -- casts, copies, constants ----------------------------------------------------------------------
@lowering(aten._to_copy.default, prims.convert_element_type.default)
def _to_copy(ctx, node, a):
    src = a.get("self", a.get("a"))
    val = node.meta["val"]
    if isinstance(src, fx.Node) and src.meta["val"].device != val.device:
        raise Unsupported("device transfer")
    if a.get("layout") not in (None, torch.strided) or a.get("pin_memory"):
        raise Unsupported("layout or pinned copy")
    x = ctx.value(src)
    if isinstance(x, Scalar):
        raise Unsupported("scalar source")
    out = dtypes.name_of(val.dtype)
    return ctx.loop(node, lambda idx: E.cast(x.load(idx), out, explicit=True))


@lowering(aten.clone.default, aten.lift_fresh_copy.default, aten.contiguous.default)
def _clone(ctx, node, a):
    x = ctx.value(a["self"])
    if isinstance(x, Scalar):
        raise Unsupported("scalar")
    return ctx.loop(node, lambda idx: x.load(idx))


@lowering(aten.copy.default)
def _copy(ctx, node, a):
    src = ctx.value(a["src"])
    out = dtypes.name_of(node.meta["val"].dtype)
    if isinstance(src, Scalar) or a["src"].meta["val"].device != node.meta["val"].device:
        raise Unsupported("copy across devices")
    return ctx.loop(node, lambda idx: E.cast(ctx.operand(src, idx, src.dtype), out, explicit=True))


@lowering(aten.alias.default, aten.detach.default)
def _identity(ctx, node, a):
    x = ctx.value(a["self"])
    if isinstance(x, Scalar):
        raise Unsupported("scalar")
    return View(x, x.shape, lambda idx: idx)


def _fill(ctx, node, value: Any):
    if not isinstance(value, (bool, int, float)):
        raise Unsupported("a fill value that is not a number")
    out = dtypes.name_of(node.meta["val"].dtype)
    return ctx.loop(node, lambda idx: E.const(value, out))


@lowering(aten.full.default, aten.full_like.default, aten.new_full.default)
def _full(ctx, node, a):
    return _fill(ctx, node, a["fill_value"])


@lowering(aten.fill.Scalar)
def _fill_scalar(ctx, node, a):
    return _fill(ctx, node, a["value"])


@lowering(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default)
def _zeros(ctx, node, a):
    return _fill(ctx, node, 0)


@lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(ctx, node, a):
    return _fill(ctx, node, 1)


@lowering(aten.scalar_tensor.default)
def _scalar_tensor(ctx, node, a):
    return _fill(ctx, node, a["s"])


@lowering(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(ctx, node, a):
    start = a.get("start", 0) or 0
    step = a.get("step", 1) or 1
    if any(isinstance(v, fx.Node) for v in (start, step)):
        raise Unsupported("symbolic arange start/step")
    out = dtypes.name_of(node.meta["val"].dtype)
    cdt = dtypes.compute_type(out) if dtypes.is_float(out) else "i64"

    def body(idx):
        i = E.cast(E.index(idx[0]), cdt)
        return E.const(start, cdt) + i * E.const(step, cdt)
    return ctx.loop(node, body)


@lowering(prims.iota.default)
def _iota(ctx, node, a):
    start, step = a["start"], a["step"]
    out = dtypes.name_of(node.meta["val"].dtype)
    return ctx.loop(node, lambda idx: E.const(start, out) + E.cast(E.index(idx[0]), out) * E.const(step, out))


__all__ = ["elementwise"]


# -- prims: the same meanings under prims' names (some decompositions produce them) ----------------
def _register_prims() -> None:
    for name, (op, kind) in {
        "add": ("add", DEFAULT), "sub": ("sub", DEFAULT), "mul": ("mul", DEFAULT),
        "maximum": ("maximum", DEFAULT), "minimum": ("minimum", DEFAULT), "pow": ("pow", DEFAULT),
        "lt": ("lt", BOOL), "le": ("le", BOOL), "gt": ("gt", BOOL), "ge": ("ge", BOOL), "eq": ("eq", BOOL),
        "ne": ("ne", BOOL), "bitwise_and": ("bitwise_and", DEFAULT), "bitwise_or": ("bitwise_or", DEFAULT),
        "remainder": ("mod", DEFAULT), "fmod": ("fmod", DEFAULT), "atan2": ("atan2", DEFAULT),
    }.items():
        if hasattr(prims, name):
            lowering(getattr(prims, name).default)(
                lambda ctx, node, a, op=op, kind=kind: elementwise(ctx, node, [a["self"], a["other"]],
                                                                  lambda x, y: E.op(op, x, y), kind))
    # on integers, floor/ceil/trunc leave them as they are, and the float-valued ones stay ATen:
    # their meta says int64 where eager's prims.exp(int64) returns fp32, so no kernel can match
    # both (fuzzer find: an int64 operand reached the kernel's exp)
    for name in ("neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin",
                 "cos", "tan", "tanh", "erf", "sign", "reciprocal", "floor", "ceil", "trunc",
                 "bitwise_not", "asin", "acos", "atan", "sinh", "cosh"):
        if not hasattr(prims, name):
            continue

        def rule(ctx, node, a, op=name):
            if not dtypes.is_float(dtypes.name_of(node.meta["val"].dtype)):
                if op in FLOAT_ONLY:
                    return elementwise(ctx, node, [a["self"]], lambda x: x)  # integers are already whole
                if op not in _INTEGER_PRIMS:
                    raise Unsupported(f"prims.{op} of an integer tensor")
            return elementwise(ctx, node, [a["self"]], lambda x: E.op(op, x))
        lowering(getattr(prims, name).default)(rule)


_INTEGER_PRIMS = {"neg", "abs", "sign", "bitwise_not"}


_register_prims()


@lowering(prims.div.default)
def _prims_div(ctx, node, a):
    # prims.div truncates integers
    is_float = dtypes.is_float(dtypes.name_of(node.meta["val"].dtype))
    return elementwise(ctx, node, [a["self"], a["other"]],
                       (lambda x, y: x / y) if is_float else (lambda x, y: E.op("truncdiv", x, y)))


@lowering(prims.where.default)
def _prims_where(ctx, node, a):
    cdt = dtypes.compute_type(dtypes.name_of(node.meta["val"].dtype))
    cond, x, y = ctx.value(a["pred"]), ctx.value(a["a"]), ctx.value(a["b"])
    return ctx.loop(node, lambda idx: E.where(ctx.operand(cond, idx, "bool"), ctx.operand(x, idx, cdt),
                                              ctx.operand(y, idx, cdt)))
