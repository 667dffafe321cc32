"""The C++ emitter of the expression IR for the host CPU: a DAG of :mod:`tilewright.ir.expr`
nodes as scalar C++ statements for one element, written so that g++ vectorises the loops around
them (``#pragma omp simd``) without changing a result.

Types: values are held in their compute type (:func:`tilewright.ir.dtypes.compute_type`): fp16
and bf16 in ``float``, fp64 in ``double``, integers in ``int64_t`` / ``int32_t`` / ..., bool in
``bool``. bf16 buffers are read and written as their 16 bits (``uint16_t``) with the conversion
written out (round to nearest even, NaN kept quiet); fp16 buffers as ``_Float16``, whose
conversions round to nearest even, subnormals included (g++ ≥ 12, F16C instructions where the
CPU has them). Every op computes what its torch function (:data:`tilewright.ir.ops.OPS`)
computes:

* math calls the C library's single- or double-precision function (``expf``/``exp``); with
  libmvec (``TW_LIBMVEC``, see :mod:`tilewright.runtime.cpp`) g++ calls its SIMD variants in
  vectorised loops;
* ``maximum``/``minimum`` propagate NaN, ``round`` is half to even (``rint``), float floor
  division is torch's (from the remainder), ``mod`` has the divisor's sign;
* integer division and remainder by zero do not trap: the kernel records the error
  (``ZeroDivisionError``, as torch raises) and the launcher raises it; ``INT64_MIN / -1`` wraps
  as torch's floor division does.
"""

from __future__ import annotations

from typing import Any, Callable

import sympy

from tilewright.ir import dtypes
from tilewright.ir.expr import Node
from tilewright.templates.c_expr import CFamilyExpr, CIndexPrinter

# compute type -> C++ type of values
CTYPE = {"fp64": "double", "fp32": "float", "i64": "int64_t", "i32": "int32_t", "i16": "int16_t",
         "i8": "int8_t", "u8": "uint8_t", "bool": "bool"}
# element type -> C++ type of a buffer's elements
STORAGE = {"fp64": "double", "fp32": "float", "fp16": "_Float16", "bf16": "uint16_t",
           "i64": "int64_t", "i32": "int32_t", "i16": "int16_t", "i8": "int8_t", "u8": "uint8_t",
           "bool": "bool"}

# kernel status codes (the Python launcher raises for each; see loops.py.jinja)
ERR_ZERO_DIVISION = 1
ERR_INDEX = 2
ERR_MEMORY = 3

HELPERS: dict[str, str] = {
    "tw_bf16": '''
// bf16 bits <-> float: round to nearest even, a NaN stays a (quiet) NaN
static inline float tw_bf16_to_f(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t tw_f_to_bf16(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  const uint16_t rounded = uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  return x != x ? uint16_t((u >> 16) | 0x40u) : rounded;
}
static inline float tw_round_bf16(float x) { return tw_bf16_to_f(tw_f_to_bf16(x)); }
''',
    "tw_floordiv": '''
// torch's float floor division (aten div_floor_floating): from the remainder, since
// floor(a / b) is one off where a / b rounds up to an integer (1.0 // 0.1 is 9, not 10)
#define TW_FLOORDIV(T, SUFFIX)                                                  \\
  static inline T tw_floordiv(T a, T b) {                                       \\
    if (b == T(0)) return a / b;                                                \\
    const T mod = fmod##SUFFIX(a, b);                                           \\
    T div = (a - mod) / b;                                                      \\
    if (mod != T(0) && ((b < T(0)) != (mod < T(0)))) div -= T(1);              \\
    if (div == T(0)) return copysign##SUFFIX(T(0), a / b);                      \\
    T fl = floor##SUFFIX(div);                                                  \\
    if (div - fl > T(0.5)) fl += T(1);                                          \\
    return fl;                                                                  \\
  }
TW_FLOORDIV(float, f)
TW_FLOORDIV(double, )
#undef TW_FLOORDIV
''',
    "tw_int_div": '''
// integer division and remainder that never trap: by zero the kernel reports
// ZeroDivisionError (as torch raises) and the value is 0; a signed MIN / -1 wraps (as torch)
template <typename T> static inline T tw_idiv_trunc(T a, T b, int64_t *err) {
  if (b == T(0)) { __atomic_store_n(err, int64_t(1), __ATOMIC_RELAXED); return T(0); }
  if (T(-1) < T(0) && b == T(-1)) return T(uint64_t(0) - uint64_t(a));
  return T(a / b);
}
template <typename T> static inline T tw_idiv_floor(T a, T b, int64_t *err) {
  if (b == T(0)) { __atomic_store_n(err, int64_t(1), __ATOMIC_RELAXED); return T(0); }
  if (T(-1) < T(0) && b == T(-1)) return T(uint64_t(0) - uint64_t(a));
  const T q = T(a / b);
  return T(q - T((a % b != 0) && ((a < 0) != (b < 0))));
}
template <typename T> static inline T tw_imod(T a, T b, int64_t *err) {
  if (b == T(0)) { __atomic_store_n(err, int64_t(1), __ATOMIC_RELAXED); return T(0); }
  if (T(-1) < T(0) && b == T(-1)) return T(0);
  const T r = T(a % b);
  return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
}
template <typename T> static inline T tw_ifmod(T a, T b, int64_t *err) {
  if (b == T(0)) { __atomic_store_n(err, int64_t(1), __ATOMIC_RELAXED); return T(0); }
  if (T(-1) < T(0) && b == T(-1)) return T(0);
  return T(a % b);
}
''',
    "tw_index": '''
// a gathered index checked against its dim: out of range the kernel reports IndexError (as
// torch raises) and reads element 0 instead of memory it does not own
static inline int64_t tw_index(int64_t i, int64_t size, int64_t *err) {
  if (i < 0 || i >= size) { __atomic_store_n(err, int64_t(2), __ATOMIC_RELAXED); return 0; }
  return i;
}
''',
    "tw_erfinv": '''
// Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision
template <typename T> static inline T tw_erfinv(T xin) {
  const float x = float(xin);
  float w = -logf((1.0f - x) * (1.0f + x));
  float p;
  if (w < 5.0f) {
    w = w - 2.5f;
    p = 2.81022636e-08f;
    p = 3.43273939e-07f + p * w;
    p = -3.5233877e-06f + p * w;
    p = -4.39150654e-06f + p * w;
    p = 0.00021858087f + p * w;
    p = -0.00125372503f + p * w;
    p = -0.00417768164f + p * w;
    p = 0.246640727f + p * w;
    p = 1.50140941f + p * w;
  } else {
    w = sqrtf(w) - 3.0f;
    p = -0.000200214257f;
    p = 0.000100950558f + p * w;
    p = 0.00134934322f + p * w;
    p = -0.00367342844f + p * w;
    p = 0.00573950773f + p * w;
    p = -0.0076224613f + p * w;
    p = 0.00943887047f + p * w;
    p = 1.00167406f + p * w;
    p = 2.83297682f + p * w;
  }
  if (fabsf(x) > 1.0f) return T(__builtin_nanf(""));
  if (fabsf(x) == 1.0f) return T(x * __builtin_inff());
  return T(p * x);
}
''',
}


# the C library's math functions the ops call (operand count); declared by the kernel's prelude
# (not <cmath>: half a second less per build), each in float ("expf") and double ("exp")
LIBM = {"exp": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1, "log10": 1, "log1p": 1, "sqrt": 1,
        "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1, "sinh": 1, "cosh": 1, "tanh": 1,
        "erf": 1, "floor": 1, "ceil": 1, "trunc": 1, "rint": 1, "fabs": 1, "fmod": 2, "pow": 2, "atan2": 2,
        "copysign": 2}

# helper -> the identifiers whose use needs it
HELPER_CALLS = {"tw_floordiv": ("tw_floordiv(",), "tw_int_div": ("tw_idiv_", "tw_imod<", "tw_ifmod<"),
                "tw_erfinv": ("tw_erfinv(",)}


def literal(value: object, dtype: str) -> str:
    """A constant of compute type ``dtype`` as C++ (infinities and NaN as builtins)."""
    ct = dtypes.compute_type(dtype)
    if ct == "bool":
        return "true" if value else "false"
    if dtypes.is_float(ct):
        v = float(value)  # type: ignore[arg-type]
        suffix = "f" if ct == "fp32" else ""
        if v != v:
            return f"__builtin_nan{suffix}(\"\")"
        if v in (float("inf"), float("-inf")):
            return f"({'-' if v < 0 else ''}__builtin_inf{suffix}())"
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        return f"{text}{suffix}"
    v = int(value)  # type: ignore[call-overload]
    if ct == "i64":
        return "(-9223372036854775807LL - 1)" if v == -2**63 else f"int64_t({v}LL)"
    return f"{CTYPE[ct]}({v})"


def _is_f(dt: str) -> bool:
    return dtypes.is_float(dt)


def _fn(name: str) -> Callable[..., str]:
    """A libm function of one or two operands: ``expf`` on fp32, ``exp`` on fp64."""
    def render(*args: str) -> str:
        *ops, dt = args
        return f"{name}{'f' if dt == 'fp32' else ''}({', '.join(ops)})"
    return render


def _maxmin(cmp: str) -> Callable[[str, str, str], str]:
    def render(a: str, b: str, dt: str) -> str:
        if _is_f(dt):  # NaN propagates (torch.maximum/minimum)
            return f"(({a} != {a} || {b} != {b}) ? {a} + {b} : ({a} {cmp} {b} ? {a} : {b}))"
        return f"({a} {cmp} {b} ? {a} : {b})"
    return render


def _mod(a: str, b: str, dt: str) -> str:
    # Python's remainder: the result has the divisor's sign
    r = f"{_fn('fmod')(a, b, dt)}"
    return f"({r} != 0 && (({r} < 0) != ({b} < 0)) ? {CTYPE[dt]}({r} + {b}) : {CTYPE[dt]}({r}))"


Render = Callable[..., str]
_BIN = lambda sym: (lambda a, b, dt: f"{CTYPE[dt]}({a} {sym} {b})")  # noqa: E731
_CMP = lambda sym: (lambda a, b, dt: f"({a} {sym} {b})")  # noqa: E731
_F1 = lambda name: (lambda a, dt: _fn(name)(a, dt))  # noqa: E731
_INT_DIV = ("tw_int_div",)

# op -> (render(args..., operand compute dtype) -> code, the helpers it may call); integer
# division and remainder read the kernel's error flag ``tw_err``
MATH: dict[str, tuple[Render, tuple[str, ...]]] = {
    # on booleans torch's add is a logical or and mul a logical and
    "add": (lambda a, b, dt: f"({a} || {b})" if dt == "bool" else f"{CTYPE[dt]}({a} + {b})", ()),
    "sub": (_BIN("-"), ()),
    "mul": (lambda a, b, dt: f"({a} && {b})" if dt == "bool" else f"{CTYPE[dt]}({a} * {b})", ()),
    "truediv": (_BIN("/"), ()),
    "floordiv": (lambda a, b, dt: f"tw_floordiv({a}, {b})" if _is_f(dt)
                 else f"tw_idiv_floor<{CTYPE[dt]}>({a}, {b}, tw_err)", ("tw_floordiv",) + _INT_DIV),
    "truncdiv": (lambda a, b, dt: f"{_fn('trunc')(f'{a} / {b}', dt)}" if _is_f(dt)
                 else f"tw_idiv_trunc<{CTYPE[dt]}>({a}, {b}, tw_err)", _INT_DIV),
    "mod": (lambda a, b, dt: _mod(a, b, dt) if _is_f(dt) else f"tw_imod<{CTYPE[dt]}>({a}, {b}, tw_err)", _INT_DIV),
    "fmod": (lambda a, b, dt: _fn("fmod")(a, b, dt) if _is_f(dt) else f"tw_ifmod<{CTYPE[dt]}>({a}, {b}, tw_err)",
             _INT_DIV),
    "pow": (_fn("pow"), ()),
    "maximum": (_maxmin(">"), ()),
    "minimum": (_maxmin("<"), ()),
    "atan2": (_fn("atan2"), ()),
    "copysign": (_fn("copysign"), ()),
    "neg": (lambda a, dt: f"{CTYPE[dt]}(-{a})", ()),
    "abs": (lambda a, dt: _fn("fabs")(a, dt) if _is_f(dt) else f"{CTYPE[dt]}({a} < 0 ? -{a} : {a})", ()),
    "reciprocal": (lambda a, dt: f"({CTYPE[dt]}(1) / {a})", ()),
    # torch.sign(NaN) is 0, not NaN (measured, torch 2.13)
    "sign": (lambda a, dt: f"{CTYPE[dt]}(({a} > 0) - ({a} < 0))", ()),
    "exp": (_F1("exp"), ()), "exp2": (_F1("exp2"), ()), "expm1": (_F1("expm1"), ()),
    "log": (_F1("log"), ()), "log2": (_F1("log2"), ()), "log10": (_F1("log10"), ()),
    "log1p": (_F1("log1p"), ()), "sqrt": (_F1("sqrt"), ()),
    "rsqrt": (lambda a, dt: f"({CTYPE[dt]}(1) / {_fn('sqrt')(a, dt)})", ()),
    "sin": (_F1("sin"), ()), "cos": (_F1("cos"), ()), "tan": (_F1("tan"), ()),
    "asin": (_F1("asin"), ()), "acos": (_F1("acos"), ()), "atan": (_F1("atan"), ()),
    "sinh": (_F1("sinh"), ()), "cosh": (_F1("cosh"), ()), "tanh": (_F1("tanh"), ()),
    "sigmoid": (lambda a, dt: f"({CTYPE[dt]}(1) / ({CTYPE[dt]}(1) + {_fn('exp')(f'-{a}', dt)}))", ()),
    "erf": (_F1("erf"), ()),
    "erfinv": (lambda a, dt: f"tw_erfinv({a})", ("tw_erfinv",)),
    "floor": (_F1("floor"), ()), "ceil": (_F1("ceil"), ()), "trunc": (_F1("trunc"), ()),
    "round": (_F1("rint"), ()),  # half to even under the default rounding mode, as torch.round
    "isnan": (lambda a, dt: f"({a} != {a})" if _is_f(dt) else "false", ()),
    "isinf": (lambda a, dt: f"({_fn('fabs')(a, dt)} == {literal(float('inf'), dt)})" if _is_f(dt) else "false", ()),
    "eq": (_CMP("=="), ()), "ne": (_CMP("!="), ()), "lt": (_CMP("<"), ()),
    "le": (_CMP("<="), ()), "gt": (_CMP(">"), ()), "ge": (_CMP(">="), ()),
    "logical_not": (lambda a, dt: f"(!{a})", ()),
    "logical_and": (lambda a, b, dt: f"({a} && {b})", ()),
    "logical_or": (lambda a, b, dt: f"({a} || {b})", ()),
    "logical_xor": (lambda a, b, dt: f"(bool({a}) != bool({b}))", ()),
    "bitwise_not": (lambda a, dt: f"{CTYPE[dt]}(~{a})" if dt != "bool" else f"(!{a})", ()),
    "bitwise_and": (lambda a, b, dt: f"{CTYPE[dt]}({a} & {b})", ()),
    "bitwise_or": (lambda a, b, dt: f"{CTYPE[dt]}({a} | {b})", ()),
    "bitwise_xor": (lambda a, b, dt: f"{CTYPE[dt]}({a} ^ {b})", ()),
    "where": (lambda c, a, b, dt: f"({c} ? {a} : {b})", ()),
}


class CppExpr(CFamilyExpr):
    """Renders expression DAGs into C++ statements (see the module docstring).

    Args:
        load, index, acc, reduce: hooks returning the code of those nodes; ``load(node)`` and
            ``reduce(node, operand_code)`` may emit statements through :meth:`line` first.
    """

    CTYPE, STORAGE, HELPERS, HALF = CTYPE, STORAGE, HELPERS, "_Float16"

    def literal(self, value: object, dtype: str) -> str:
        return literal(value, dtype)

    def op_code(self, n: Node, args: list[str]) -> str:
        operand = dtypes.compute_type(n.src[-1].dtype if n.op == "where" else n.src[0].dtype)
        render, helpers = MATH[n.op]
        code = render(*args, operand)
        self.helpers_used.update(h for h in helpers if any(ident in code for ident in HELPER_CALLS[h]))
        return code


class CPrinter(CIndexPrinter):
    """Integer index expressions as C++ (see :class:`~tilewright.templates.c_expr.CIndexPrinter`)."""


def ccode(e: Any, names: dict[sympy.Symbol, str] | None = None) -> str:
    return CPrinter(names).doprint(sympy.sympify(e))
