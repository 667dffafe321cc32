"""The Triton emitter of the expression IR: turns a DAG of :mod:`tilewright.ir.expr` nodes into
Triton statements.

:class:`TritonExpr` renders values in topological order, each once (nodes are hash-consed, so
identity is equality and this is CSE), into a list of lines a template places in its kernel.
What a ``load``, an ``index``, the ``acc`` and a ``reduce`` mean depends on the kernel (a loop
kernel's buffers, a GEMM's epilogue inputs), so the template supplies them as hooks; everything
else (arithmetic, math, casts, comparisons) is rendered here, from one table.

Math the interpreter has as builtins (exp, log, sqrt, sin, erf ...) is rendered as such; the rest
uses libdevice on GPU targets and small ``@triton.jit`` helpers written with builtins under the
interpreter (where libdevice returns nothing), whose sources :meth:`TritonExpr.helpers` returns.
Narrow floats are computed in fp32; converting to bf16/fp16 rounds to nearest even, also in the
interpreter (whose own conversion truncates).
"""

from __future__ import annotations

import math

from typing import Callable

from tilewright.ir import dtypes
from tilewright.ir.emitter import ExprEmitter
from tilewright.ir.expr import Node

TL_DTYPE = {"fp64": "tl.float64", "fp32": "tl.float32", "fp16": "tl.float16", "bf16": "tl.bfloat16",
            "fp8e4m3": "tl.float8e4nv", "fp8e5m2": "tl.float8e5", "i64": "tl.int64",
            "i32": "tl.int32", "i16": "tl.int16", "i8": "tl.int8", "u8": "tl.uint8", "bool": "tl.int1"}
POINTER = {"fp64": "*fp64", "fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16", "fp8e4m3": "*fp8e4nv",
           "fp8e5m2": "*fp8e5", "i64": "*i64", "i32": "*i32", "i16": "*i16", "i8": "*i8", "u8": "*u8",
           "bool": "*i1"}

# helper name -> source, for the interpreter (and for ops libdevice lacks)
HELPERS: dict[str, str] = {
    "_floordiv_f": '''
@triton.jit
def _floordiv_f(a, b):
    # torch's float floor division (aten div_floor_floating): from the remainder, since
    # floor(a / b) is one off where a / b rounds up to an integer (1.0 // 0.1 is 9, not 10)
    mod = a % b
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    q = a / b
    zero = tl.where((q < 0) | ((q == 0) & (1.0 / q < 0)), -0.0, 0.0)
    return tl.where(b == 0, q, tl.where(div != 0, fl, zero))
''',
    "_tanh": '''
@triton.jit
def _tanh(x):
    # 1 - 2/(e^2x + 1) loses small values to cancellation: Taylor series near 0
    ax = tl.abs(x)
    small = x - x * x * x / 3.0 + 2.0 * x * x * x * x * x / 15.0
    t = tl.exp(-2.0 * ax)
    big = (1.0 - t) / (1.0 + t)
    big = tl.where(x < 0, -big, big)
    return tl.where(x == 0, x, tl.where(ax < 0.0625, small, big))  # tanh(-0) is -0
''',
    "_expm1": '''
@triton.jit
def _expm1(x):
    # exp(x) - 1 cancels near 0: a Taylor series there
    small = x + x * x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0))))
    return tl.where(x == 0, x, tl.where(tl.abs(x) < 0.03125, small, tl.exp(x) - 1.0))  # expm1(-0) is -0
''',
    "_log1p": '''
@triton.jit
def _log1p(x):
    # log(1 + x) loses x when |x| << 1: log(u) * x / (u - 1) with u = 1 + x is exact to rounding;
    # at u = inf that would be inf * (inf / inf): log1p(inf) is inf
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.where(u == float("inf"), u, tl.log(u) * (x / (u - 1.0))))
''',
    "_atan": '''
@triton.jit
def _atan(x):
    # range reduction to |t| <= tan(pi/12), then an odd polynomial (Cephes atanf coefficients)
    ax = tl.abs(x)
    inv = ax > 1.0
    t = tl.where(inv, 1.0 / ax, ax)
    hi = t > 0.2679491924311227
    t = tl.where(hi, (t - 0.5773502691896258) / (1.0 + 0.5773502691896258 * t), t)
    z = t * t
    p = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * t + t
    p = tl.where(hi, p + 0.5235987755982988, p)
    p = tl.where(inv, 1.5707963267948966 - p, p)
    return tl.where(x == 0, x, tl.where(x < 0, -p, p))  # atan(-0) is -0
''',
    "_round": '''
@triton.jit
def _round(x):
    # half to even, as torch.round (libdevice's rint). Not floor(x + 0.5): x + 0.5 itself rounds
    # where x's ulp is 1 (fp32 8388609 + 0.5 is 8388610). x - floor(x) is exact in any float
    # type, and is NaN at the infinities, where no comparison holds and floor(x) is x.
    r = tl.floor(x)
    d = x - r
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), r + 1.0, r)
    return tl.where(r == 0, x * 0.0, r)  # a zero keeps x's sign: round(-0.3) is -0
''',
    "_trunc": '''
@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))
''',
    "_erfinv": '''
@triton.jit
def _erfinv(x):
    # Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision
    w = -tl.log((1.0 - x) * (1.0 + x))
    a = w - 2.5
    p = 2.81022636e-08
    p = 3.43273939e-07 + p * a
    p = -3.5233877e-06 + p * a
    p = -4.39150654e-06 + p * a
    p = 0.00021858087 + p * a
    p = -0.00125372503 + p * a
    p = -0.00417768164 + p * a
    p = 0.246640727 + p * a
    p = 1.50140941 + p * a
    b = tl.sqrt(tl.maximum(w, 5.0)) - 3.0
    q = -0.000200214257
    q = 0.000100950558 + q * b
    q = 0.00134934322 + q * b
    q = -0.00367342844 + q * b
    q = 0.00573950773 + q * b
    q = -0.0076224613 + q * b
    q = 0.00943887047 + q * b
    q = 1.00167406 + q * b
    q = 2.83297682 + q * b
    r = tl.where(w < 5.0, p, q) * x
    r = tl.where(tl.abs(x) > 1.0, float("nan"), r)  # outside the domain (w is NaN there)
    return tl.where(tl.abs(x) == 1.0, x * float("inf"), r)
''',
    "_pow": '''
@triton.jit
def _pow(a, b):
    # torch.pow is C99 pow: |a|**b (in fp64, so an fp32 result is rounded once: pow(3.4e38, 1)
    # stays finite), the sign of an odd integer power of a negative base (-0 and -inf included),
    # NaN for a finite negative base and a finite non-integer exponent, and 1 for a**0, 1**b and
    # (-1)**(+-inf), NaN operands included
    mag = tl.exp2(b.to(tl.float64) * tl.log2(tl.abs(a).to(tl.float64))).to(a.dtype)
    finite_b = tl.abs(b) < float("inf")
    is_int = finite_b & (tl.floor(b) == b)
    odd = is_int & ((b - 2.0 * tl.floor(b * 0.5)) != 0.0)
    neg = (a < 0) | ((a == 0) & (1.0 / a < 0))
    mag = tl.where(neg & odd, -mag, mag)
    mag = tl.where((a < 0) & (a > float("-inf")) & finite_b & ~is_int, float("nan"), mag)
    one = (b == 0.0) | (a == 1.0) | ((tl.abs(a) == 1.0) & ~finite_b & (b == b))
    return tl.where(one, 1.0, mag)
''',
    "_atan2": '''
@triton.jit
def _atan2(y, x):
    # C99 atan2 with its special cases: the angle of |y|/|x| in [0, pi/2], reflected for a
    # negative x (-0 included) and negated for a negative y (-0 included); two infinities give
    # pi/4, two zeros 0, a NaN operand NaN. Both as one shape first: a 0-d operand loaded
    # once is a scalar, whose comparisons the interpreter keeps as int32, and "&" of those with
    # a float test failed ("ufunc 'bitwise_and' not supported": fuzzer find)
    y, x = tl.broadcast(y, x)
    ny = (y < 0) | ((y == 0) & (1.0 / y < 0))
    nx = (x < 0) | ((x == 0) & (1.0 / x < 0))
    ay, ax = tl.abs(y), tl.abs(x)
    q = _atan(ay / ax)
    q = tl.where((ay == float("inf")) & (ax == float("inf")), 0.7853981633974483, q)
    q = tl.where((ay == 0) & (ax == 0), 0.0, q)
    r = tl.where(nx, 3.141592653589793 - q, q)
    r = tl.where(ny, -r, r)
    return tl.where((x != x) | (y != y), float("nan"), r)
''',
    "_bf16_rne": '''
@triton.jit
def _bf16_rne(x):
    # fp32 -> bf16 rounding to nearest even, returned in fp32 (the interpreter's own
    # conversion truncates); NaN stays NaN
    u = x.to(tl.uint32, bitcast=True)
    u = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000
    return tl.where(x != x, x, u.to(tl.float32, bitcast=True))
''',
    "_bf16_to_f32": '''
@triton.jit
def _bf16_to_f32(x):
    # bf16 -> fp32 by its bits, exact for every value: the interpreter's own conversion flushes
    # or mangles subnormals (9.2e-41 becomes 0)
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
''',
    "_f32_to_bf16": '''
@triton.jit
def _f32_to_bf16(x):
    # an fp32 already rounded to bf16 (_bf16_rne) -> bf16 by its top 16 bits: the interpreter's
    # own conversion flushes subnormals (1e-40 becomes 0)
    return (x.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
''',
    "_div_rn": '''
@triton.jit
def _div_rn(a, b):
    # fp32 a / b rounded to nearest even, as torch divides: Triton's "/" is div.full.f32 on
    # NVIDIA (within 2 ulp), which moves a quotient rounded again later (an E4M3 block scale,
    # an E2M1 code at a tie: kinds/loop/lower/quantize.py) off torch's bits
    a, b = tl.broadcast(a, b)
    return tl.div_rn(a, b)
''',
    "_fp16_rne": '''
@triton.jit
def _fp16_rne(x):
    # fp32 -> fp16 rounding to nearest even via the fp64 path numpy rounds correctly
    return x.to(tl.float64).to(tl.float16).to(tl.float32)
''',
}


def _floordiv(a: str, b: str, dt: str) -> str:
    if dtypes.is_float(dt):
        return f"_floordiv_f({a}, {b})"
    return f"(({a}) // ({b}) - ((({a}) % ({b}) != 0) & ((({a}) < 0) != (({b}) < 0))).to({TL_DTYPE[dt]}))"


def _mod(a: str, b: str, dt: str) -> str:
    r = f"(({a}) % ({b}))"
    return f"tl.where(({r} != 0) & (({r} < 0) != (({b}) < 0)), {r} + ({b}), {r})"


def _truncdiv(a: str, b: str, dt: str) -> str:
    return f"_trunc({a} / {b})" if dtypes.is_float(dt) else f"(({a}) // ({b}))"


def _maxmin(fn: str) -> Callable[[str, str, str], str]:
    def render(a: str, b: str, dt: str) -> str:
        if dtypes.is_float(dt):
            return f"tl.{fn}({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"
        return f"tl.{fn}({a}, {b})"
    return render


# the signed integer of a float's width (its sign bit is the integer's)
_SIGNED = {"fp32": "tl.int32", "fp64": "tl.int64"}

# op -> (render(args..., dtype) -> code, the helpers it calls)
Render = Callable[..., str]
_BIN = lambda sym: (lambda a, b, dt: f"({a} {sym} {b})")  # noqa: E731
MATH: dict[str, tuple[Render, tuple[str, ...]]] = {
    # on booleans torch's add is a logical or and mul a logical and (int1 + int1 would wrap)
    "add": (lambda a, b, dt: f"({a} | {b})" if dt == "bool" else f"({a} + {b})", ()),
    "sub": (_BIN("-"), ()),
    "mul": (lambda a, b, dt: f"({a} & {b})" if dt == "bool" else f"({a} * {b})", ()),
    "truediv": (_BIN("/"), ()),
    "floordiv": (_floordiv, ("_floordiv_f",)),
    "truncdiv": (_truncdiv, ("_trunc",)),
    "mod": (_mod, ()),
    "fmod": (_BIN("%"), ()),
    "pow": (lambda a, b, dt: f"_pow({a}, {b})", ("_pow",)),
    "maximum": (_maxmin("maximum"), ()),
    "minimum": (_maxmin("minimum"), ()),
    "atan2": (lambda a, b, dt: f"_atan2({a}, {b})", ("_atan2", "_atan")),
    # by the sign bit, which a NaN has too (copysign(1, -nan) is -1)
    # floats negate as x * -1.0: triton 3.6's interpreter (the GPU machine's) computes -x as 0 - x,
    # so -(+0.0) was +0.0 there (copysign(a, -0.0) gave |a|); compiled, the product is an fneg
    "copysign": (lambda a, b, dt: f"tl.where({b}.to({_SIGNED[dt]}, bitcast=True) < 0, tl.abs({a}) * -1.0, tl.abs({a}))", ()),
    "neg": (lambda a, dt: f"({a} * -1.0)" if dtypes.is_float(dt) else f"(-{a})", ()),
    "abs": (lambda a, dt: f"tl.abs({a})", ()),
    "reciprocal": (lambda a, dt: f"(1.0 / {a})", ()),
    # torch.sign(NaN) is 0, not NaN (numpy's)
    # a bool is its own sign (no bool subtraction: triton 3.6's interpreter refuses numpy's)
    "sign": (lambda a, dt: a if dt == "bool" else f"(({a} > 0).to({TL_DTYPE[dt]}) - ({a} < 0).to({TL_DTYPE[dt]}))", ()),
    "exp": (lambda a, dt: f"tl.exp({a})", ()),
    "exp2": (lambda a, dt: f"tl.exp2({a})", ()),
    "expm1": (lambda a, dt: f"_expm1({a})", ("_expm1",)),
    "log": (lambda a, dt: f"tl.log({a})", ()),
    "log2": (lambda a, dt: f"tl.log2({a})", ()),
    "log10": (lambda a, dt: f"(tl.log2({a}) * 0.30102999566398120)", ()),
    "log1p": (lambda a, dt: f"_log1p({a})", ("_log1p",)),
    "sqrt": (lambda a, dt: f"tl.sqrt({a})", ()),
    "rsqrt": (lambda a, dt: f"tl.rsqrt({a})", ()),
    "sin": (lambda a, dt: f"tl.sin({a})", ()),
    "cos": (lambda a, dt: f"tl.cos({a})", ()),
    "tan": (lambda a, dt: f"(tl.sin({a}) / tl.cos({a}))", ()),
    "asin": (lambda a, dt: f"_atan({a} / tl.sqrt((1.0 - {a}) * (1.0 + {a})))", ("_atan",)),
    "acos": (lambda a, dt: f"(1.5707963267948966 - _atan({a} / tl.sqrt((1.0 - {a}) * (1.0 + {a}))))",
             ("_atan",)),
    "atan": (lambda a, dt: f"_atan({a})", ("_atan",)),
    "sinh": (lambda a, dt: f"(0.5 * (_expm1({a}) - _expm1(-{a})))", ("_expm1",)),
    "cosh": (lambda a, dt: f"(0.5 * (tl.exp({a}) + tl.exp(-{a})))", ()),
    "tanh": (lambda a, dt: f"_tanh({a})", ("_tanh",)),
    "sigmoid": (lambda a, dt: f"(1.0 / (1.0 + tl.exp(-{a})))", ()),
    "erf": (lambda a, dt: f"tl.erf({a})", ()),
    "erfinv": (lambda a, dt: f"_erfinv({a})", ("_erfinv",)),
    "floor": (lambda a, dt: f"tl.floor({a})", ()),
    "ceil": (lambda a, dt: f"tl.ceil({a})", ()),
    "trunc": (lambda a, dt: f"_trunc({a})", ("_trunc",)),
    "round": (lambda a, dt: f"_round({a})", ("_round",)),
    "isnan": (lambda a, dt: f"({a} != {a})", ()),
    "isinf": (lambda a, dt: f"(tl.abs({a}) == float('inf'))", ()),
    "eq": (_BIN("=="), ()),
    "ne": (_BIN("!="), ()),
    "lt": (_BIN("<"), ()),
    "le": (_BIN("<="), ()),
    "gt": (_BIN(">"), ()),
    "ge": (_BIN(">="), ()),
    "logical_not": (lambda a, dt: f"({a} == 0)", ()),
    "logical_and": (_BIN("&"), ()),
    "logical_or": (_BIN("|"), ()),
    "logical_xor": (_BIN("^"), ()),
    "bitwise_not": (lambda a, dt: f"(~{a})" if dt != "bool" else f"({a} == 0)", ()),
    "bitwise_and": (_BIN("&"), ()),
    "bitwise_or": (_BIN("|"), ()),
    "bitwise_xor": (_BIN("^"), ()),
    "where": (lambda c, a, b, dt: f"tl.where({c}, {a}, {b})", ()),
}


# compiled targets: libdevice's versions (correctly rounded or within an ulp or two)
LIBDEVICE = {
    "tanh": "libdevice.tanh({0})", "expm1": "libdevice.expm1({0})", "log1p": "libdevice.log1p({0})",
    "atan": "libdevice.atan({0})", "asin": "libdevice.asin({0})", "acos": "libdevice.acos({0})",
    "sinh": "libdevice.sinh({0})", "cosh": "libdevice.cosh({0})", "tan": "libdevice.tan({0})",
    "erfinv": "libdevice.erfinv({0})", "pow": "libdevice.pow({0}, {1})", "round": "libdevice.rint({0})",
    "trunc": "libdevice.trunc({0})", "atan2": "libdevice.atan2({0}, {1})", "log10": "libdevice.log10({0})",
}


# binary ops whose code tests and combines its operands (helpers, sign tests): a constant
# operand must be a block like the other one (a Python float would be divided by zero at
# trace time in copysign's test, and the interpreter cannot `&` a block with a 0-d mask)
_TENSOR_OPERANDS = frozenset({"pow", "atan2", "copysign"})


def _broadcast_constants(args: list[str], src: tuple[Node, ...]) -> list[str]:
    """``args`` with each constant operand made a block shaped like a non-constant one."""
    like = next((a for a, s in zip(args, src) if s.op != "const"), None)
    if like is None:
        return args
    def block(a: str, s: Node) -> str:
        if s.op != "const":
            return a
        if isinstance(s.arg, float) and s.arg == 0 and math.copysign(1.0, s.arg) < 0:
            # -0.0 as -1.0 * 0.0: triton 3.6's interpreter fills and negates zeros unsigned
            # (tl.full of -0.0 and -tl.full of 0.0 are +0.0 there: copysign(a, -0.0) was |a|)
            return f"(tl.full({like}.shape, -1.0, {like}.dtype) * 0.0)"
        return f"tl.full({like}.shape, {a}, {like}.dtype)"
    return [block(a, s) for a, s in zip(args, src)]


def literal(value: object, dtype: str) -> str:
    """A constant as Triton source (``float('inf')`` for infinities, NaN as ``float('nan')``)."""
    if dtype == "bool":
        return "True" if value else "False"
    if isinstance(value, float):
        if value != value:
            return "float('nan')"
        if value in (float("inf"), float("-inf")):
            return f"float('{'-' if value < 0 else ''}inf')"
        return repr(value)
    return str(int(value))  # type: ignore[call-overload]


class TritonExpr(ExprEmitter):
    """Renders expression DAGs into Triton statements (see the module docstring).

    Args:
        interpreted: the kernel runs in the Triton interpreter (helpers instead of libdevice,
            RNE conversions to narrow floats).
        load, index, acc, reduce: hooks returning the code of those nodes; ``load(node)`` and
            ``reduce(node, operand_code)`` may emit statements through :meth:`line` first.
    """

    def __init__(self, *, interpreted: bool, load: Callable[[Node], str],
                 index: Callable[[Node], str] | None = None, acc: Callable[[Node], str] | None = None,
                 reduce: Callable[[Node, str], str] | None = None, prefix: str = "t",
                 scan: Callable[[Node, str], str] | None = None, check: Callable[[Node], None] | None = None):
        super().__init__(load=load, index=index, acc=acc, reduce=reduce, prefix=prefix, scan=scan, check=check)
        self.interpreted = interpreted

    def literal(self, value: object, dtype: str) -> str:
        return literal(value, dtype)

    def declare(self, name: str, n: Node, code: str) -> str:
        return f"{name} = {code}"

    def op_code(self, n: Node, args: list[str]) -> str:
        operand_dtype = dtypes.compute_type(n.src[-1].dtype if n.op == "where" else n.src[0].dtype)
        if n.op in _TENSOR_OPERANDS:
            args = _broadcast_constants(args, n.src)
        if not self.interpreted and n.op == "truediv" and operand_dtype == "fp32" \
                and any(src.op != "const" for src in n.src):
            self.helpers_used.add("_div_rn")
            return f"_div_rn({', '.join(_broadcast_constants(args, n.src))})"
        if not self.interpreted and n.op in LIBDEVICE and operand_dtype in ("fp32", "fp64"):
            return LIBDEVICE[n.op].format(*args)
        render, helpers = MATH[n.op]
        self.helpers_used.update(helpers)
        return render(*args, operand_dtype)


    def convert(self, code: str, src: str, dst: str) -> str:
        """Code converting a value held in ``src``'s compute type to ``dst``'s compute type,
        rounding where ``dst`` is narrower (to nearest even, also under the interpreter)."""
        if dst == "bool":
            return f"({code} != 0)"
        if src == "bool" and dtypes.compute_type(dst) != "bool":
            return f"{code}.to({TL_DTYPE[dtypes.compute_type(dst)]})"
        if dst in ("bf16", "fp16"):  # from a float or an integer: round once, to nearest even
            if self.interpreted:
                helper = "_bf16_rne" if dst == "bf16" else "_fp16_rne"
                self.helpers_used.add(helper)
                return f"{helper}({code}.to(tl.float32))"
            return f"{code}.to({TL_DTYPE[dst]}).to(tl.float32)"
        if dtypes.compute_type(src) == dtypes.compute_type(dst):
            return code  # widening a narrow float held in fp32 already
        return f"{code}.to({TL_DTYPE[dtypes.compute_type(dst)]})"

    def load_value(self, code: str, dtype: str) -> str:
        """Code converting a loaded block of element type ``dtype`` to its compute type (bf16
        by its bits under the interpreter, whose own conversion mangles subnormals)."""
        if dtype == "bool":
            return code
        if dtype == "bf16" and self.interpreted:
            self.helpers_used.add("_bf16_to_f32")
            return f"_bf16_to_f32({code})"
        return f"{code}.to({TL_DTYPE[dtypes.compute_type(dtype)]})"

    def store_value(self, code: str, src: str, dst: str) -> str:
        """Code converting a computed value to the stored element type ``dst``."""
        if dst == "bool":
            return f"({code} != 0)" if src != "bool" else code
        if dst == "bf16" and self.interpreted:
            # rounded to nearest even, then by its bits (the interpreter's conversion truncates
            # and flushes subnormals)
            self.helpers_used.add("_f32_to_bf16")
            return f"_f32_to_bf16({self.convert(code, src, dst)})"
        if dst in ("bf16", "fp16") and self.interpreted:
            # via fp32, rounded: the interpreter's own conversion truncates fp32 and takes an
            # integer's bits as if they were a float's
            return f"{self.convert(code, src, dst)}.to({TL_DTYPE[dst]})"
        return f"{code}.to({TL_DTYPE[dst]})"

    def helpers(self) -> str:
        """Source of the ``@triton.jit`` helpers the rendered statements call."""
        return "\n".join(HELPERS[h].strip("\n") + "\n\n" for h in sorted(self.helpers_used))
