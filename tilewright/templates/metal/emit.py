"""The Metal Shading Language emitter of the expression IR: a DAG of
:mod:`tilewright.ir.expr` nodes as scalar MSL statements, one value per thread.

:class:`MetalExpr` renders values in topological order, each once (nodes are hash-consed, so
identity is equality and this is CSE), as ``const <type> tN = <expr>;`` lines a template places
in its kernel. What a ``load``, an ``index`` and a ``reduce`` mean depends on the kernel, so the
template supplies them as hooks; arithmetic, math, casts and comparisons are rendered here,
from one table whose meaning is :data:`tilewright.ir.ops.OPS` (torch's).

Types: narrow floats (fp16, bf16) are computed in ``float`` and rounded where stored or
explicitly cast (``static_cast<bfloat>``, Metal 3.1's bfloat; ``half``). Metal has no
``double`` and no fp8: :func:`unsupported_dtype` says so, and templates refuse such kernels.
Math Metal lacks (erf, erfinv, expm1, log1p, torch's pow, floor division and remainder on
floats) comes from small inline helpers (:data:`HELPERS`); the rest uses ``metal::precise::``
so a fast-math compile keeps full-precision transcendental functions.
"""

from __future__ import annotations

from typing import Callable

import sympy

from tilewright.ir import dtypes
from tilewright.ir.emitter import ExprEmitter
from tilewright.ir.expr import Node
from tilewright.templates.c_expr import CIndexPrinter

# IR dtype -> MSL scalar type (a buffer's element type; compute types use dtypes.compute_type)
MSL_TYPE = {"fp32": "float", "fp16": "half", "bf16": "bfloat", "i64": "long", "i32": "int",
            "i16": "short", "i8": "char", "u8": "uchar", "bool": "bool"}

_INT_MIN = {"i64": "(-9223372036854775807L - 1)", "i32": "(-2147483647 - 1)", "i16": "(-32768)",
            "i8": "(-128)", "u8": "0", "bool": "false"}
_INT_MAX = {"i64": "9223372036854775807L", "i32": "2147483647", "i16": "32767", "i8": "127",
            "u8": "255", "bool": "true"}


def unsupported_dtype(dtype: str) -> str | None:
    """Why Metal cannot hold ``dtype`` (None when it can)."""
    if dtype == "fp64":
        return "Metal has no 64-bit floats (fp64): run this kernel on ATen or cast to fp32"
    if dtype in ("fp8e4m3", "fp8e5m2"):
        return f"Metal has no fp8 type ({dtype}): run this kernel on ATen"
    if dtype not in MSL_TYPE:
        return f"no Metal type for {dtype}"
    return None


def ctype(dtype: str) -> str:
    """The MSL type a value of ``dtype`` is computed in (float for fp16/bf16)."""
    return MSL_TYPE[dtypes.compute_type(dtype)]


def type_min(dtype: str) -> str:
    """The lowest value of a compute type, as MSL (``-INFINITY`` for floats)."""
    return "(-INFINITY)" if dtypes.is_float(dtype) else _INT_MIN[dtype]


def type_max(dtype: str) -> str:
    return "INFINITY" if dtypes.is_float(dtype) else _INT_MAX[dtype]


def literal(value: object, dtype: str) -> str:
    """A constant of compute type ``dtype`` as MSL (``1.5f``, ``INFINITY``, ``NAN``, ``7L``)."""
    dtype = dtypes.compute_type(dtype)
    if dtype == "bool":
        return "true" if value else "false"
    if dtypes.is_float(dtype):
        v = float(value)  # type: ignore[arg-type]
        if v != v:
            return "NAN"
        if v in (float("inf"), float("-inf")):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(v)
        text = text if ("." in text or "e" in text) else text + ".0"
        return f"({text}f)" if v < 0 else f"{text}f"
    v = int(value)  # type: ignore[call-overload]
    if dtype == "i64" and v == -2**63:
        return _INT_MIN["i64"]
    text = f"{v}L" if dtype == "i64" else str(v)
    return f"({text})" if v < 0 else text


def zero(dtype: str) -> str:
    return literal(0, dtype)


class MetalIndexPrinter(CIndexPrinter):
    """Integer index expressions as MSL: the C family's (C's truncating ``/`` and ``%``, see
    :class:`~tilewright.templates.c_expr.CIndexPrinter`), but ``Max``/``Min`` as conditionals
    (MSL's ``max`` wants one operand type) and integers beyond 32 bits with an ``L`` suffix."""

    def _minmax(self, args, op: str) -> str:
        out = self._print(args[0])
        for a in args[1:]:
            b = self._print(a)
            out = f"(({out}) {op} ({b}) ? ({out}) : ({b}))"
        return out

    def _print_Max(self, expr: sympy.Expr) -> str:
        return self._minmax(expr.args, ">")

    def _print_Min(self, expr: sympy.Expr) -> str:
        return self._minmax(expr.args, "<")

    def _print_Integer(self, expr: sympy.Expr) -> str:
        v = int(expr)
        return f"{v}L" if abs(v) >= 2**31 else str(v)


def index_code(e: sympy.Expr, names: dict[sympy.Symbol, str] | None = None) -> str:
    """``e`` as MSL integer code (see :class:`MetalIndexPrinter`)."""
    return MetalIndexPrinter(names).doprint(sympy.sympify(e))


# helper name -> MSL source; placed once before the kernel by the template
HELPERS: dict[str, str] = {
    "tw_index": """
// a gathered index checked against its dim: out of range the kernel reports IndexError through
// tw_err (the launcher raises it, as eager does) and reads element 0 instead of memory it does
// not own (every lane that fails writes the same value: no atomic needed)
inline long tw_index(long i, long size, device int* err) {
    if (i < 0 || i >= size) { err[0] = 2; return 0; }
    return i;
}""",
    "tw_max": """
// torch.maximum: NaN wins (metal::fmax would return the other operand)
inline float tw_max(float a, float b) { return (isnan(a) || a > b) ? a : b; }""",
    "tw_min": """
inline float tw_min(float a, float b) { return (isnan(a) || a < b) ? a : b; }""",
    "tw_floordiv_f": """
// torch's float floor division (aten div_floor_floating): from the remainder, since floor(a / b)
// is one off where a / b rounds up to an integer (1.0 // 0.1 is 9, not 10)
inline float tw_floordiv_f(float a, float b) {
    const float mod = fmod(a, b);
    float div = (a - mod) / b;
    if (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) div -= 1.0f;
    float fl = floor(div);
    if (div - fl > 0.5f) fl += 1.0f;
    const float q = a / b;
    const float sgn = (q < 0.0f || (q == 0.0f && signbit(q))) ? -0.0f : 0.0f;
    return b == 0.0f ? q : (div != 0.0f ? fl : sgn);
}""",
    "tw_mod_f": """
// torch.remainder on floats: the result takes the divisor's sign
inline float tw_mod_f(float a, float b) {
    const float r = fmod(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}""",
    "tw_pow": """
// torch.pow is C99 pow: 1 for a**0 and 1**b (NaN operands included) and for (-1)**(+-inf); the
// magnitude from |a|, the sign of an odd integer power of a negative base (-0 and -inf
// included), NaN for a finite negative base and a finite non-integer exponent
inline float tw_pow(float a, float b) {
    if (b == 0.0f || a == 1.0f) return 1.0f;
    if (isnan(a) || isnan(b)) return NAN;
    const float x = fabs(a);
    if (isinf(b)) return x == 1.0f ? 1.0f : ((x > 1.0f) == (b > 0.0f) ? INFINITY : 0.0f);
    const float mag = precise::pow(x, b);
    const bool is_int = floor(b) == b;
    const bool odd = is_int && fmod(fabs(b), 2.0f) == 1.0f;
    if (signbit(a) && !isinf(a) && a != 0.0f && !is_int) return NAN;  // neither is NaN here
    return (signbit(a) && odd) ? -mag : mag;
}""",
    "tw_expm1": """
// exp(x) - 1 cancels near 0 (MSL has no expm1): a Taylor series there
inline float tw_expm1(float x) {
    const float small = x + x * x * (0.5f + x * (1.0f / 6.0f + x * (1.0f / 24.0f + x * (1.0f / 120.0f))));
    return x == 0.0f ? x : (fabs(x) < 0.03125f ? small : precise::exp(x) - 1.0f);  // expm1(-0) is -0
}""",
    "tw_log1p": """
// log(1 + x) loses x when |x| << 1 (MSL has no log1p): log(u) * x / (u - 1), u = 1 + x
inline float tw_log1p(float x) {
    const float u = 1.0f + x;
    // u = inf: log1p(inf) is inf (log(u) * (x / (u - 1)) would be NaN); log1p(-inf) is NaN
    return (u == 1.0f || u == INFINITY) ? (u == 1.0f ? x : u) : precise::log(u) * (x / (u - 1.0f));
}""",
    "tw_erf": """
// MSL has no erf: the Taylor series below 0.5 (next term < 3e-8 relative), Abramowitz and
// Stegun 7.1.26 above (absolute error <= 1.5e-7)
inline float tw_erf(float x) {
    const float ax = fabs(x);
    const float x2 = x * x;
    const float small = x * 1.1283791670955126f * (1.0f + x2 * (-1.0f / 3.0f + x2 * (0.1f + x2 * (-1.0f / 42.0f
                        + x2 * (1.0f / 216.0f + x2 * (-1.0f / 1320.0f))))));
    const float t = 1.0f / (1.0f + 0.3275911f * ax);
    const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    const float big = 1.0f - poly * precise::exp(-x2);
    return isnan(x) ? x : (ax < 0.5f ? small : copysign(big, x));
}""",
    "tw_erfinv": """
// Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision
inline float tw_erfinv(float x) {
    float w = -precise::log((1.0f - x) * (1.0f + x));
    float p;
    if (w < 5.0f) {
        w = w - 2.5f;
        p = 2.81022636e-08f;
        p = 3.43273939e-07f + p * w; p = -3.5233877e-06f + p * w; p = -4.39150654e-06f + p * w;
        p = 0.00021858087f + p * w; p = -0.00125372503f + p * w; p = -0.00417768164f + p * w;
        p = 0.246640727f + p * w; p = 1.50140941f + p * w;
    } else {
        w = precise::sqrt(w) - 3.0f;
        p = -0.000200214257f;
        p = 0.000100950558f + p * w; p = 0.00134934322f + p * w; p = -0.00367342844f + p * w;
        p = 0.00573950773f + p * w; p = -0.0076224613f + p * w; p = 0.00943887047f + p * w;
        p = 1.00167406f + p * w; p = 2.83297682f + p * w;
    }
    const float r = fabs(x) > 1.0f ? NAN : p * x;
    return fabs(x) == 1.0f ? x * INFINITY : r;
}""",
}

Render = Callable[..., str]


def _bin(sym: str) -> Render:
    return lambda a, b, dt: f"({a} {sym} {b})"


def _float_or_int(f: Render, i: Render) -> Render:
    return lambda *args: f(*args) if dtypes.is_float(args[-1]) else i(*args)


def _int_floordiv(a: str, b: str, dt: str) -> str:
    # C division truncates; torch floors: one less where the remainder and divisor differ in sign
    return f"({a} / {b} - ((({a} % {b}) != 0) && ((({a} % {b}) < 0) != ({b} < 0)) ? 1 : 0))"


def _int_mod(a: str, b: str, dt: str) -> str:
    r = f"({a} % {b})"
    return f"(({r} != 0 && (({r} < 0) != ({b} < 0))) ? {r} + {b} : {r})"


def _precise(fn: str) -> Render:
    return lambda a, dt: f"precise::{fn}({a})"


# op -> (render(operand codes..., operand compute dtype) -> code, helpers it calls)
MATH: dict[str, tuple[Render, tuple[str, ...]]] = {
    # on booleans torch's add is a logical or and mul a logical and
    "add": (lambda a, b, dt: f"({a} || {b})" if dt == "bool" else f"({a} + {b})", ()),
    "sub": (_bin("-"), ()),
    "mul": (lambda a, b, dt: f"({a} && {b})" if dt == "bool" else f"({a} * {b})", ()),
    "truediv": (_bin("/"), ()),
    "floordiv": (_float_or_int(lambda a, b, dt: f"tw_floordiv_f({a}, {b})", _int_floordiv), ("tw_floordiv_f",)),
    "truncdiv": (_float_or_int(lambda a, b, dt: f"trunc({a} / {b})", _bin("/")), ()),
    "mod": (_float_or_int(lambda a, b, dt: f"tw_mod_f({a}, {b})", _int_mod), ("tw_mod_f",)),
    "fmod": (_float_or_int(lambda a, b, dt: f"fmod({a}, {b})", _bin("%")), ()),
    "pow": (lambda a, b, dt: f"tw_pow({a}, {b})", ("tw_pow",)),
    "maximum": (_float_or_int(lambda a, b, dt: f"tw_max({a}, {b})", lambda a, b, dt: f"max({a}, {b})"), ("tw_max",)),
    "minimum": (_float_or_int(lambda a, b, dt: f"tw_min({a}, {b})", lambda a, b, dt: f"min({a}, {b})"), ("tw_min",)),
    "atan2": (lambda a, b, dt: f"precise::atan2({a}, {b})", ()),
    "copysign": (lambda a, b, dt: f"copysign({a}, {b})", ()),
    "neg": (lambda a, dt: f"(-{a})", ()),
    "abs": (_float_or_int(lambda a, dt: f"fabs({a})", lambda a, dt: f"abs({a})"), ()),
    "reciprocal": (lambda a, dt: f"(1.0f / {a})", ()),
    # torch.sign(NaN) is 0
    "sign": (_float_or_int(lambda a, dt: f"static_cast<float>(({a} > 0.0f) - ({a} < 0.0f))",
                           lambda a, dt: f"static_cast<{MSL_TYPE[dt]}>(({a} > 0) - ({a} < 0))"), ()),
    "exp": (_precise("exp"), ()),
    "exp2": (_precise("exp2"), ()),
    "expm1": (lambda a, dt: f"tw_expm1({a})", ("tw_expm1",)),
    "log": (_precise("log"), ()),
    "log2": (_precise("log2"), ()),
    "log10": (_precise("log10"), ()),
    "log1p": (lambda a, dt: f"tw_log1p({a})", ("tw_log1p",)),
    "sqrt": (_precise("sqrt"), ()),
    "rsqrt": (_precise("rsqrt"), ()),
    "sin": (_precise("sin"), ()),
    "cos": (_precise("cos"), ()),
    "tan": (_precise("tan"), ()),
    "asin": (_precise("asin"), ()),
    "acos": (_precise("acos"), ()),
    "atan": (_precise("atan"), ()),
    "sinh": (_precise("sinh"), ()),
    "cosh": (_precise("cosh"), ()),
    "tanh": (_precise("tanh"), ()),
    "sigmoid": (lambda a, dt: f"(1.0f / (1.0f + precise::exp(-{a})))", ()),
    "erf": (lambda a, dt: f"tw_erf({a})", ("tw_erf",)),
    "erfinv": (lambda a, dt: f"tw_erfinv({a})", ("tw_erfinv",)),
    "floor": (lambda a, dt: f"floor({a})", ()),
    "ceil": (lambda a, dt: f"ceil({a})", ()),
    "trunc": (lambda a, dt: f"trunc({a})", ()),
    "round": (lambda a, dt: f"rint({a})", ()),  # half to even, as torch.round
    "isnan": (_float_or_int(lambda a, dt: f"isnan({a})", lambda a, dt: "false"), ()),
    "isinf": (_float_or_int(lambda a, dt: f"isinf({a})", lambda a, dt: "false"), ()),
    "eq": (_bin("=="), ()),
    "ne": (_bin("!="), ()),
    "lt": (_bin("<"), ()),
    "le": (_bin("<="), ()),
    "gt": (_bin(">"), ()),
    "ge": (_bin(">="), ()),
    "logical_not": (lambda a, dt: f"({a} == 0)" if dt != "bool" else f"(!{a})", ()),
    "logical_and": (lambda a, b, dt: f"(({a} != 0) && ({b} != 0))", ()),
    "logical_or": (lambda a, b, dt: f"(({a} != 0) || ({b} != 0))", ()),
    "logical_xor": (lambda a, b, dt: f"(({a} != 0) != ({b} != 0))", ()),
    "bitwise_not": (lambda a, dt: f"(!{a})" if dt == "bool" else f"(~{a})", ()),
    "bitwise_and": (_bin("&"), ()),
    "bitwise_or": (_bin("|"), ()),
    "bitwise_xor": (_bin("^"), ()),
    "where": (lambda c, a, b, dt: f"({c} ? {a} : {b})", ()),
}


class MetalExpr(ExprEmitter):
    """Renders expression DAGs into MSL statements (see the module docstring).

    Args:
        load, index, reduce, acc: hooks returning the code of those nodes; ``load(node)`` and
            ``reduce(node, operand_code)`` may emit statements through :meth:`line` first.
        prefix: temporaries are ``{prefix}0``, ``{prefix}1``, ...
    """

    def __init__(self, *, load: Callable[[Node], str], index: Callable[[Node], str] | None = None,
                 reduce: Callable[[Node, str], str] | None = None, acc: Callable[[Node], str] | None = None,
                 prefix: str = "t"):
        super().__init__(load=load, index=index, acc=acc, reduce=reduce, prefix=prefix, indent="    ")

    # -- scopes: a C block's values die with it, so the emitter forgets them too ---------------
    def open(self, header: str) -> None:
        """``header {`` and a new scope (a loop or a conditional body)."""
        self.line(f"{header} {{" if header else "{")
        self.indent += "    "
        self.push()

    def close(self) -> None:
        self.pop()
        self.indent = self.indent[:-4]
        self.line("}")

    def literal(self, value: object, dtype: str) -> str:
        return literal(value, dtype)

    def inline(self, n: Node, code: str) -> bool:
        return n.op == "const" or code.isidentifier()  # a literal, or a value already named

    def declare(self, name: str, n: Node, code: str) -> str:
        return f"const {ctype(n.dtype)} {name} = {code};"

    def op_code(self, n: Node, args: list[str]) -> str:
        operand = dtypes.compute_type(n.src[-1].dtype if n.op == "where" else n.src[0].dtype)
        render, helpers = MATH[n.op]
        code = render(*args, operand)
        self.helpers_used.update(h for h in helpers if h in code)
        return code


    def convert(self, code: str, src: str, dst: str) -> str:
        """Code converting a value held in ``src``'s compute type to ``dst``'s, rounding where
        ``dst`` is a narrow float (Metal's conversions round to nearest even)."""
        if dst == "bool":
            return code if src == "bool" else f"({code} != 0)"
        if dst in ("bf16", "fp16"):  # round once to the narrow type, then compute in float
            via = code if dtypes.is_float(src) else f"static_cast<float>({code})"
            return f"static_cast<float>(static_cast<{MSL_TYPE[dst]}>({via}))"
        if dtypes.compute_type(src) == dtypes.compute_type(dst):
            return code
        return f"static_cast<{ctype(dst)}>({code})"

    def store_value(self, code: str, src: str, dst: str) -> str:
        """Code converting a computed value to the stored element type ``dst``."""
        if dst == "bool":
            return code if src == "bool" else f"({code} != 0)"
        return f"static_cast<{MSL_TYPE[dst]}>({code})"

    def helpers(self) -> str:
        """Source of the inline helpers the rendered statements call."""
        return "\n".join(HELPERS[h].strip("\n") for h in sorted(self.helpers_used))
