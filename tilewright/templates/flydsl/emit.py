"""The FlyDSL emitter of the expression IR: a DAG of :mod:`tilewright.ir.expr` nodes as lines of
FlyDSL Python (``import flydsl.expr as fx``), one scalar value per lane (element).

:class:`FlyExpr` renders values in topological order, each once (nodes are hash-consed, so
identity is equality and this is CSE), as ``tN = <expr>`` lines a template places inside its
``@flyc.kernel`` function, where FlyDSL traces them to MLIR. As in the SYCL and Metal emitters,
``load``, ``index``, ``acc`` (a GEMM's fp32 accumulator element) and ``reduce`` depend on the
kernel, so the template supplies them as hooks; arithmetic, math, casts and comparisons come
from one table here, each computing what its torch function (:data:`tilewright.ir.ops.OPS`)
computes.

Types: a value is a FlyDSL ``Numeric`` of its compute type
(:func:`tilewright.ir.dtypes.compute_type`): fp16 and bf16 are held in ``fx.Float32`` and
rounded (to nearest even: LLVM's ``fptrunc``, ``v_cvt_pk_bf16_f32`` on gfx950) where stored or
explicitly cast; integers in ``fx.Int64``/``Int32``/...; bool in ``fx.Boolean``. fp64 is held
in ``fx.Float64`` for arithmetic only; fp8 is refused (:func:`unsupported_dtype`).

Math, measured on flydsl 0.5.0 compile-only for gfx950 (no ROCm device library is linked, so an
op MLIR lowers to an ``__ocml_*`` call fails to link, and some LLVM intrinsics -- tanh, sinh,
cosh, tan, asin, acos, atan, atan2 -- silently compile to an empty kernel):

* native and correct: + - * / (IEEE division), ``fx.max``/``fx.min`` (NaN-propagating, as
  torch.maximum), ``math.exp``, ``expm1``, ``log``, ``log1p``, ``sqrt``, ``rsqrt``, ``absf``,
  ``copysign``, ``trunc``, ``roundeven``, comparisons, select, integer ``//`` (floor) and
  ``%`` (C remainder, corrected to Python's where torch wants it);
* built here from those (:data:`HELPERS`): exp2/log2 (the ``v_exp_f32``/``v_log_f32``
  instructions through ``rocdl`` with LLVM's denormal scaling), log10, floor, ceil, tanh,
  sinh, cosh, sigmoid, pow, erf (Maclaurin series and Numerical Recipes' ``erfcc``), erfinv
  (Giles 2011);
* refused with a reason (:func:`unsupported_op`): sin, cos, tan, asin, acos, atan, atan2, and
  floor division / remainder on floats (ocml's ``fmod`` and ``floor`` again); any math op on
  fp64 (ocml's f64 functions).
"""

from __future__ import annotations

import math
from typing import Callable

from tilewright.errors import UnsupportedProblemError
from tilewright.ir import dtypes
from tilewright.ir.emitter import ExprEmitter
from tilewright.ir.expr import Node

# compute type -> FlyDSL scalar type
FLY = {"fp64": "fx.Float64", "fp32": "fx.Float32", "i64": "fx.Int64", "i32": "fx.Int32",
       "i16": "fx.Int16", "i8": "fx.Int8", "u8": "fx.Uint8", "bool": "fx.Boolean"}
# element type -> FlyDSL type of a buffer's elements
STORAGE = {**FLY, "fp16": "fx.Float16", "bf16": "fx.BFloat16"}

_NO_DEVICE_LIB = ("lowers to ROCm's device library (ocml) or to an LLVM intrinsic the gfx950 "
                  "backend drops, and the compile-only FlyDSL setup links no device library")
REFUSED = {op: f"{op} {_NO_DEVICE_LIB}; run this kernel on ATen or Triton"
           for op in ("sin", "cos", "tan", "asin", "acos", "atan", "atan2")}
_FLOAT_REFUSED = {op: f"{op} on floats {_NO_DEVICE_LIB} (fmod/floor); integers are supported"
                  for op in ("floordiv", "mod", "fmod", "truncdiv")}
# ops that are plain arithmetic on fp64 too; every other float op is math (ocml on f64)
_F64_OK = {"add", "sub", "mul", "truediv", "neg", "abs", "maximum", "minimum", "where", "copysign",
           "eq", "ne", "lt", "le", "gt", "ge", "isnan", "sign", "reciprocal", "trunc", "round"}


def unsupported_dtype(dtype: str) -> str | None:
    """Why this emitter cannot hold ``dtype`` in a buffer (None when it can)."""
    if dtype in ("fp8e4m3", "fp8e5m2"):
        return f"the FlyDSL emitter writes no fp8 ({dtype}) conversion: run this kernel on ATen"
    if dtype not in STORAGE:
        return f"no FlyDSL type for {dtype}"
    return None


def unsupported_op(n: Node) -> str | None:
    """Why node ``n`` cannot be rendered for gfx950 compile-only (None when it can)."""
    if n.op in REFUSED:
        return REFUSED[n.op]
    if n.op in ("const", "load", "index", "acc", "reduce", "cast"):
        return unsupported_dtype(n.dtype) if n.op in ("load", "cast") else None
    operand = dtypes.compute_type(n.src[-1].dtype if n.op == "where" else n.src[0].dtype)
    if n.op in _FLOAT_REFUSED and dtypes.is_float(operand):
        return _FLOAT_REFUSED[n.op]
    if operand == "fp64" and n.op not in _F64_OK:
        return f"{n.op} on fp64 {_NO_DEVICE_LIB}"
    return None


def check_nodes(nodes) -> str | None:
    """The first reason any of ``nodes`` cannot be rendered (None when all can)."""
    for n in nodes:
        why = unsupported_op(n)
        if why:
            return why
    return None


def literal(value: object, dtype: str) -> str:
    """A constant of compute type ``dtype`` as FlyDSL (``fx.Float32(1.5)``, ``fx.Int64(7)``;
    infinities and NaN through ``float(...)``)."""
    ct = dtypes.compute_type(dtype)
    if ct == "bool":
        return f"fx.Boolean({bool(value)})"
    if dtypes.is_float(ct):
        v = float(value)  # type: ignore[arg-type]
        text = repr(v) if math.isfinite(v) else f'float("{v}")'
        return f"{FLY[ct]}({text})"
    return f"{FLY[ct]}({int(value)})"  # type: ignore[call-overload]


# -- helpers rendered into the kernel module (Python functions FlyDSL traces inline) -----------
# PRIMS touch FlyDSL internals (rocdl intrinsics, select); HELPERS are written only in terms of
# fx.math, arithmetic, comparisons and PRIMS, so a test can run them on torch tensors with a shim.
PRIMS = '''
from flydsl._mlir import ir as _tw_ir
from flydsl._mlir.dialects import rocdl as _tw_rocdl


def _tw_sel(c, a, b):
    return c.select(a, b)


def _tw_hw_exp2(x):
    # v_exp_f32 (2**x, 1 ulp; denormal results flush: _tw_exp2 scales around that)
    return fx.Float32(_tw_rocdl.exp2(_tw_ir.F32Type.get(), x.ir_value()))


def _tw_hw_log2(x):
    # v_log_f32 (log2, 1 ulp; denormal inputs read as 0: _tw_log2 scales around that)
    return fx.Float32(_tw_rocdl.log(_tw_ir.F32Type.get(), x.ir_value()))
'''


def _erf_series() -> str:
    # Maclaurin series erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))  (A&S 7.1.5),
    # eight terms: at |x| = 0.5 the next term is ~1e-11 of the value
    coef = [2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(8)]
    p = repr(coef[-1])
    for c in reversed(coef[:-1]):
        p = f"({c!r} + z * {p})"
    return p


HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "_tw_exp2": ('''
def _tw_exp2(x):
    # 2**x with denormal results: below -126 compute 2**(x+64) * 2**-64 (LLVM's AMDGPU exp2 lowering)
    small = x < -126.0
    y = _tw_hw_exp2(_tw_sel(small, x + 64.0, x))
    return _tw_sel(small, y * 5.421010862427522e-20, y)
''', ()),
    "_tw_log2": ('''
def _tw_log2(x):
    # log2 of denormal inputs: scale by 2**32 first, subtract 32 after (LLVM's AMDGPU log2 lowering)
    tiny = x < 1.1754943508222875e-38
    y = _tw_hw_log2(_tw_sel(tiny, x * 4294967296.0, x))
    return _tw_sel(tiny, y - 32.0, y)
''', ()),
    "_tw_floor": ('''
def _tw_floor(x):
    # trunc rounds toward zero: one less where that rounded up (negative non-integers);
    # NaN, infinities, -0.0 and |x| >= 2**23 pass unchanged
    t = fx.math.trunc(x)
    return _tw_sel(t > x, t - 1.0, t)
''', ()),
    "_tw_ceil": ('''
def _tw_ceil(x):
    t = fx.math.trunc(x)
    return _tw_sel(t < x, t + 1.0, t)
''', ()),
    "_tw_tanh": ('''
def _tw_tanh(x):
    # tanh|x| = -expm1(-2|x|) / (2 + expm1(-2|x|)): expm1 keeps full relative accuracy near 0
    e = fx.math.expm1(fx.math.absf(x) * -2.0)
    return fx.math.copysign(-e / (e + 2.0), x)
''', ()),
    "_tw_sinh": ('''
def _tw_sinh(x):
    # |x| < 1: (e + e / (e + 1)) / 2 with e = expm1|x| (no cancellation); else u - 1/(4u) with
    # u = exp(|x| - ln 2) = exp|x| / 2, which overflows only where sinh does
    a = fx.math.absf(x)
    e = fx.math.expm1(a)
    u = fx.math.exp(a - 0.6931471805599453)
    s = _tw_sel(a < 1.0, (e + e / (e + 1.0)) * 0.5, u - 0.25 / u)
    return fx.math.copysign(s, x)
''', ()),
    "_tw_cosh": ('''
def _tw_cosh(x):
    # u + 1/(4u) with u = exp(|x| - ln 2): overflows only where cosh does
    u = fx.math.exp(fx.math.absf(x) - 0.6931471805599453)
    return u + 0.25 / u
''', ()),
    "_tw_sigmoid": ('''
def _tw_sigmoid(x):
    return 1.0 / (1.0 + fx.math.exp(-x))
''', ()),
    "_tw_pow": ('''
def _tw_pow(a, b):
    # torch.pow on floats: 2**(b log2|a|), the sign from an odd integer b, NaN for a negative
    # base with a non-integer b; pow(a, 0) = pow(1, b) = 1 (NaN included). Relative error about
    # |b log2 a| * 2**-23 (1e-5 where the result is near fp32's range ends).
    r = _tw_exp2(b * _tw_log2(fx.math.absf(a)))
    integral = fx.math.trunc(b) == b
    odd = integral & (fx.math.trunc(b * 0.5) * 2.0 != b)
    neg = _tw_sel(integral, _tw_sel(odd, -r, r), float("nan"))
    r = _tw_sel(a < 0.0, neg, r)
    return _tw_sel((b == 0.0) | (a == 1.0), 1.0, r)
''', ("_tw_exp2", "_tw_log2")),
    "_tw_erf": (f'''
def _tw_erf(x):
    # |x| < 0.5: Maclaurin series (Abramowitz & Stegun 7.1.5), 8 terms. Otherwise 1 - erfc|x| with
    # erfc from the Chebyshev fit of Press et al., Numerical Recipes in C (2nd ed., 1992),
    # sec. 6.2, erfcc: fractional error below 1.2e-7 everywhere, so erf's absolute error is too.
    a = fx.math.absf(x)
    z = x * x
    small = x * {_erf_series()}
    t = 1.0 / (1.0 + 0.5 * a)
    q = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    erfc = t * fx.math.exp(q - z)
    return _tw_sel(a < 0.5, small, fx.math.copysign(1.0 - erfc, x))
''', ()),
    "_tw_erfinv": ('''
def _tw_erfinv(x):
    # Giles, "Approximating the erfinv function" (GPU Computing Gems Jade, 2011), single precision
    w = -fx.math.log((1.0 - x) * (1.0 + x))
    w1 = w - 2.5
    p1 = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p1 = c + p1 * w1
    w2 = fx.math.sqrt(w) - 3.0
    p2 = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        p2 = c + p2 * w2
    r = _tw_sel(w < 5.0, p1, p2) * x
    a = fx.math.absf(x)
    r = _tw_sel(a == 1.0, x * float("inf"), r)
    return _tw_sel(a > 1.0, x * float("nan"), r)
''', ()),
}

Render = Callable[..., str]


def _bin(sym: str) -> Render:
    return lambda a, b, dt: f"({a} {sym} {b})"


def _int_or(float_code: Callable[[str], str], int_code: Callable[[str, str], str]) -> Render:
    return lambda a, dt: float_code(a) if dtypes.is_float(dt) else int_code(a, FLY[dt])


def _h(name: str, *args: str) -> str:
    return f"{name}({', '.join(args)})"


# op -> (render(args..., operand compute dtype) -> code, the helpers it calls)
MATH: dict[str, tuple[Render, tuple[str, ...]]] = {
    # on booleans torch's add is a logical or and mul a logical and
    "add": (lambda a, b, dt: f"({a} | {b})" if dt == "bool" else f"({a} + {b})", ()),
    "sub": (_bin("-"), ()),
    "mul": (lambda a, b, dt: f"({a} & {b})" if dt == "bool" else f"({a} * {b})", ()),
    "truediv": (_bin("/"), ()),
    # integers only (floats refused): FlyDSL's // is floor division (arith.floordivsi), % is C's
    "floordiv": (_bin("//"), ()),
    "truncdiv": (lambda a, b, dt: f"_tw_sel((({a} % {b}) != 0) & (({a} < 0) != ({b} < 0)), "
                 f"({a} // {b}) + 1, {a} // {b})", ()),
    "mod": (lambda a, b, dt: f"_tw_sel((({a} % {b}) != 0) & ((({a} % {b}) < 0) != ({b} < 0)), "
            f"({a} % {b}) + {b}, {a} % {b})", ()),
    "fmod": (_bin("%"), ()),
    "pow": (lambda a, b, dt: _h("_tw_pow", a, b), ("_tw_pow",)),
    "maximum": (lambda a, b, dt: f"fx.max({a}, {b})", ()),
    "minimum": (lambda a, b, dt: f"fx.min({a}, {b})", ()),
    "copysign": (lambda a, b, dt: f"fx.math.copysign({a}, {b})", ()),
    "neg": (lambda a, dt: f"(-{a})", ()),
    "abs": (_int_or(lambda a: f"fx.math.absf({a})", lambda a, t: f"_tw_sel({a} < 0, -{a}, {a})"), ()),
    "reciprocal": (lambda a, dt: f"({FLY[dt]}(1.0) / {a})", ()),
    "sign": (_int_or(
        lambda a: f"_tw_sel({a} != {a}, {a}, _tw_sel({a} > 0.0, 1.0, _tw_sel({a} < 0.0, -1.0, 0.0)))",
        lambda a, t: f"(_tw_sel({a} > 0, {t}(1), {t}(0)) - _tw_sel({a} < 0, {t}(1), {t}(0)))"), ()),
    "exp": (lambda a, dt: f"fx.math.exp({a})", ()),
    "exp2": (lambda a, dt: _h("_tw_exp2", a), ("_tw_exp2",)),
    "expm1": (lambda a, dt: f"fx.math.expm1({a})", ()),
    "log": (lambda a, dt: f"fx.math.log({a})", ()),
    "log2": (lambda a, dt: _h("_tw_log2", a), ("_tw_log2",)),
    "log10": (lambda a, dt: f"(fx.math.log({a}) * {1 / math.log(10)!r})", ()),
    "log1p": (lambda a, dt: f"fx.math.log1p({a})", ()),
    "sqrt": (lambda a, dt: f"fx.math.sqrt({a})", ()),
    "rsqrt": (lambda a, dt: f"fx.math.rsqrt({a})", ()),
    "sinh": (lambda a, dt: _h("_tw_sinh", a), ("_tw_sinh",)),
    "cosh": (lambda a, dt: _h("_tw_cosh", a), ("_tw_cosh",)),
    "tanh": (lambda a, dt: _h("_tw_tanh", a), ("_tw_tanh",)),
    "sigmoid": (lambda a, dt: _h("_tw_sigmoid", a), ("_tw_sigmoid",)),
    "erf": (lambda a, dt: _h("_tw_erf", a), ("_tw_erf",)),
    "erfinv": (lambda a, dt: _h("_tw_erfinv", a), ("_tw_erfinv",)),
    "floor": (lambda a, dt: _h("_tw_floor", a), ("_tw_floor",)),
    "ceil": (lambda a, dt: _h("_tw_ceil", a), ("_tw_ceil",)),
    "trunc": (lambda a, dt: f"fx.math.trunc({a})", ()),
    "round": (lambda a, dt: f"fx.math.roundeven({a})", ()),  # half to even, as torch.round
    "isnan": (lambda a, dt: f"({a} != {a})" if dtypes.is_float(dt) else "fx.Boolean(False)", ()),
    "isinf": (lambda a, dt: f'(fx.math.absf({a}) == float("inf"))' if dtypes.is_float(dt)
              else "fx.Boolean(False)", ()),
    "eq": (_bin("=="), ()), "ne": (_bin("!="), ()), "lt": (_bin("<"), ()),
    "le": (_bin("<="), ()), "gt": (_bin(">"), ()), "ge": (_bin(">="), ()),
    "logical_not": (lambda a, dt: f"({a} == fx.Boolean(False))", ()),
    "logical_and": (_bin("&"), ()),
    "logical_or": (_bin("|"), ()),
    "logical_xor": (_bin("!="), ()),
    "bitwise_not": (lambda a, dt: f"({a} == fx.Boolean(False))" if dt == "bool" else f"(~{a})", ()),
    "bitwise_and": (_bin("&"), ()),
    "bitwise_or": (_bin("|"), ()),
    "bitwise_xor": (lambda a, b, dt: f"({a} != {b})" if dt == "bool" else f"({a} ^ {b})", ()),
    "where": (lambda c, a, b, dt: f"_tw_sel({c}, {a}, {b})", ()),
}


class FlyExpr(ExprEmitter):
    """Renders expression DAGs into FlyDSL Python statements (see the module docstring).

    Args:
        load, index, acc, reduce: hooks returning the code of those nodes (a FlyDSL value of the
            node's compute type); ``load(node)`` and ``reduce(node, operand_code)`` may emit
            statements through :meth:`line` first. ``acc`` is a GEMM epilogue's fp32
            accumulator element.
        prefix, indent: of the names it makes and of its lines (inside the kernel function).

    Raises (from :meth:`emit`):
        UnsupportedProblemError: an op or dtype this emitter refuses (:func:`unsupported_op`);
            templates call :func:`check_nodes` in ``supports`` so this does not happen at render.
    """

    def literal(self, value: object, dtype: str) -> str:
        return literal(value, dtype)

    def declare(self, name: str, n: Node, code: str) -> str:
        return f"{name} = {code}"

    def inline(self, n: Node, code: str) -> bool:
        """Constants, and values that are already a name (a widening that changes nothing)."""
        return n.op == "const" or code.isidentifier()

    def op_code(self, n: Node, args: list[str]) -> str:
        why = unsupported_op(n)
        if why:
            raise UnsupportedProblemError(why)
        operand = dtypes.compute_type(n.src[-1].dtype if n.op == "where" else n.src[0].dtype)
        render, helpers = MATH[n.op]
        self.use(*helpers)
        return render(*args, operand)

    def use(self, *helpers: str) -> None:
        """Mark helpers (and what they call) as needed in the rendered module."""
        for h in helpers:
            if h not in self.helpers_used:
                self.helpers_used.add(h)
                self.use(*HELPERS[h][1])

    def convert(self, code: str, src: str, dst: str) -> str:
        """Code converting a value held in ``src``'s compute type to ``dst``'s compute type,
        rounding to nearest even where ``dst`` is a narrow float."""
        csrc, cdst = dtypes.compute_type(src), dtypes.compute_type(dst)
        if dst == "bool":
            return code if src == "bool" else f"({code} != 0)"
        if src == "bool":
            one, zero = (literal(1, cdst), literal(0, cdst))
            code = f"_tw_sel({code}, {one}, {zero})"
            return code if dst not in ("bf16", "fp16") else self.convert(code, "fp32", dst)
        if dst in ("bf16", "fp16"):
            return f"{code}.to({STORAGE[dst]}).to(fx.Float32)"
        if csrc == cdst:
            return code  # widening a narrow float held in fp32 already
        return f"{code}.to({FLY[cdst]})"

    def load_value(self, element: str, dtype: str) -> str:
        """A buffer element (FlyDSL value of its storage type) as a value of its compute type."""
        return f"{element}.to(fx.Float32)" if dtype in ("bf16", "fp16") else element

    def store_value(self, code: str, src: str, dst: str) -> str:
        """Code converting a computed value (compute type of ``src``) to the stored element type
        ``dst`` (rounding to nearest even for bf16/fp16)."""
        if dst == "bool":
            return code if src == "bool" else f"({code} != 0)"
        if src == "bool":
            code = f"_tw_sel({code}, {literal(1, dtypes.compute_type(dst))}, {literal(0, dtypes.compute_type(dst))})"
        return f"{code}.to({STORAGE[dst]})"

    def helpers(self) -> str:
        """Source of the helper functions the rendered statements call (module level, after
        ``import flydsl.expr as fx``); always includes the primitives (``_tw_sel`` ...)."""
        return PRIMS.strip("\n") + "\n\n" + "".join(
            "\n" + HELPERS[h][0].strip("\n") + "\n" for h in sorted(self.helpers_used))


def helper_source(names=None) -> str:
    """The generic helpers (all, or ``names``) without the FlyDSL primitives: what a test runs on
    torch tensors with a shim ``fx``/``_tw_sel``/``_tw_hw_exp2``/``_tw_hw_log2``."""
    return "".join("\n" + HELPERS[h][0].strip("\n") + "\n" for h in (names or HELPERS))
