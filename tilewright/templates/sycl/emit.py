"""The SYCL emitter of the expression IR: a DAG of :mod:`tilewright.ir.expr` nodes as C++
statements for one work-item (SYCL device code).

:class:`SyclExpr` renders values in topological order, each once (nodes are hash-consed, so
identity is equality and this is CSE), as ``const <type> tN = ...;`` lines a template places in
its kernel. Like the Triton emitter, what ``load``, ``index``, ``acc`` and ``reduce`` mean
depends on the kernel, so the template supplies them as hooks; arithmetic, math, casts and
comparisons come from one table here, each op computing what its torch function
(:data:`tilewright.ir.ops.OPS`) computes.

Types: values are held in their compute type (:func:`tilewright.ir.dtypes.compute_type`): fp16,
bf16 in ``float``; fp64 in ``double``; integers in ``int64_t`` / ``int32_t`` / ...; bool in
``bool``. bf16 buffers are read and written as their 16 bits (``uint16_t``) with the conversion
written out here (round to nearest even), so no bfloat16 device library is needed; fp16 uses
``sycl::half``. fp8 buffers are refused by the templates. Math calls the device's ``sycl::``
builtins (no SYCL device library is linked: ``-fno-sycl-device-lib=all``); ``erfinv`` and
torch's float floor division are helpers rendered into the source (:data:`HELPERS`).
"""

from __future__ import annotations

from typing import Callable

from tilewright.ir import dtypes
from tilewright.ir.expr import Node
from tilewright.templates.c_expr import CFamilyExpr

# compute type -> C++ type (values)
CTYPE = {"fp64": "double", "fp32": "float", "i64": "int64_t", "i32": "int32_t", "i16": "int16_t",
         "i8": "int8_t", "u8": "uint8_t", "bool": "bool"}
# element type -> C++ type of a buffer's elements
STORAGE = {"fp64": "double", "fp32": "float", "fp16": "sycl::half", "bf16": "uint16_t",
           "i64": "int64_t", "i32": "int32_t", "i16": "int16_t", "i8": "int8_t", "u8": "uint8_t",
           "bool": "bool"}

HELPERS: dict[str, str] = {
    "tw_bf16": '''
// bf16 bits <-> float (round to nearest even; NaN stays NaN): no bfloat16 device library
static inline float tw_bf16_to_f(uint16_t b) { return sycl::bit_cast<float>(uint32_t(b) << 16); }
static inline uint16_t tw_f_to_bf16(float x) {
  uint32_t u = sycl::bit_cast<uint32_t>(x);
  if (x != x) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float tw_round_bf16(float x) { return tw_bf16_to_f(tw_f_to_bf16(x)); }
''',
    "tw_floordiv": '''
// torch's float floor division (aten div_floor_floating): from the remainder, since
// floor(a / b) is one off where a / b rounds up to an integer (1.0 // 0.1 is 9, not 10)
template <typename T> static inline T tw_floordiv(T a, T b) {
  if (b == T(0)) return a / b;
  T mod = sycl::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != T(0) && ((b < T(0)) != (mod < T(0)))) div -= T(1);
  if (div == T(0)) return sycl::copysign(T(0), a / b);
  T fl = sycl::floor(div);
  if (div - fl > T(0.5)) fl += T(1);
  return fl;
}
''',
    "tw_int_div": '''
// integer division and remainder that never trap (the OpenCL CPU device runs x86 code: a
// division by zero or MIN / -1 would be SIGFPE): by zero the kernel reports ZeroDivisionError
// (as eager's CPU kernels raise) through tw_err and the value is 0; MIN / -1 wraps (as torch)
static inline void tw_report(int64_t *err, int64_t status) {
  sycl::atomic_ref<int64_t, sycl::memory_order::relaxed, sycl::memory_scope::device> flag(*err);
  flag.store(status);
}
template <typename T> static inline T tw_idiv_trunc(T a, T b, int64_t *err) {
  if (b == T(0)) { tw_report(err, 1); return T(0); }
  if (T(-1) < T(0) && b == T(-1)) return T(uint64_t(0) - uint64_t(a));
  return T(a / b);
}
template <typename T> static inline T tw_idiv_floor(T a, T b, int64_t *err) {
  if (b == T(0)) { tw_report(err, 1); return T(0); }
  if (T(-1) < T(0) && b == T(-1)) return T(uint64_t(0) - uint64_t(a));
  const T q = T(a / b);
  return T(q - T((a % b != 0) && ((a < 0) != (b < 0))));
}
template <typename T> static inline T tw_imod(T a, T b, int64_t *err) {
  if (b == T(0)) { tw_report(err, 1); return T(0); }
  if (T(-1) < T(0) && b == T(-1)) return T(0);
  const T r = T(a % b);
  return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
}
template <typename T> static inline T tw_ifmod(T a, T b, int64_t *err) {
  if (b == T(0)) { tw_report(err, 1); return T(0); }
  if (T(-1) < T(0) && b == T(-1)) return T(0);
  return T(a % b);
}
// a gathered index checked against its dim: out of range the kernel reports IndexError (as
// eager raises) and reads element 0 instead of memory it does not own
static inline int64_t tw_index(int64_t i, int64_t size, int64_t *err) {
  if (i < 0 || i >= size) { tw_report(err, 2); return 0; }
  return i;
}
''',
    "tw_erfinv": '''
// Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision
template <typename T> static inline T tw_erfinv(T xin) {
  float x = float(xin);
  float w = -sycl::log((1.0f - x) * (1.0f + x));
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
    w = sycl::sqrt(w) - 3.0f;
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
  if (sycl::fabs(x) > 1.0f) return T(__builtin_nanf(""));
  if (sycl::fabs(x) == 1.0f) return T(x * __builtin_inff());
  return T(p * x);
}
''',
}


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
        return f"{text}{suffix}" if ct == "fp32" else text
    v = int(value)  # type: ignore[call-overload]
    if ct == "i64":
        return "(-9223372036854775807LL - 1)" if v == -2**63 else f"int64_t({v}LL)"
    return f"{CTYPE[ct]}({v})"


def _is_f(dt: str) -> bool:
    return dtypes.is_float(dt)


def _floordiv(a: str, b: str, dt: str) -> str:
    if _is_f(dt):
        return f"tw_floordiv({a}, {b})"
    return f"tw_idiv_floor<{CTYPE[dt]}>({a}, {b}, tw_err)"


def _mod(a: str, b: str, dt: str) -> str:
    # Python's remainder: the result has the divisor's sign
    if not _is_f(dt):
        return f"tw_imod<{CTYPE[dt]}>({a}, {b}, tw_err)"
    r = f"sycl::fmod({a}, {b})"
    return f"({r} != 0 && (({r} < 0) != ({b} < 0)) ? {CTYPE[dt]}({r} + {b}) : {CTYPE[dt]}({r}))"


def _maxmin(cmp: str) -> Callable[[str, str, str], str]:
    def render(a: str, b: str, dt: str) -> str:
        if _is_f(dt):  # NaN propagates (torch.maximum/minimum)
            return f"(({a} != {a} || {b} != {b}) ? {a} + {b} : ({a} {cmp} {b} ? {a} : {b}))"
        return f"({a} {cmp} {b} ? {a} : {b})"
    return render


Render = Callable[..., str]
_BIN = lambda sym: (lambda a, b, dt: f"{CTYPE[dt]}({a} {sym} {b})")  # noqa: E731
_CMP = lambda sym: (lambda a, b, dt: f"({a} {sym} {b})")  # noqa: E731
_F1 = lambda fn: (lambda a, dt: f"sycl::{fn}({a})")  # noqa: E731

# op -> (render(args..., operand compute dtype) -> code, the helpers it calls)
MATH: dict[str, tuple[Render, tuple[str, ...]]] = {
    # on booleans torch's add is a logical or and mul a logical and
    "add": (lambda a, b, dt: f"({a} || {b})" if dt == "bool" else f"{CTYPE[dt]}({a} + {b})", ()),
    "sub": (_BIN("-"), ()),
    "mul": (lambda a, b, dt: f"({a} && {b})" if dt == "bool" else f"{CTYPE[dt]}({a} * {b})", ()),
    "truediv": (_BIN("/"), ()),
    # integer division and remainder read the kernel's error flag ``tw_err``
    "floordiv": (_floordiv, ("tw_floordiv", "tw_int_div")),
    "truncdiv": (lambda a, b, dt: f"sycl::trunc({a} / {b})" if _is_f(dt)
                 else f"tw_idiv_trunc<{CTYPE[dt]}>({a}, {b}, tw_err)", ("tw_int_div",)),
    "mod": (_mod, ("tw_int_div",)),
    "fmod": (lambda a, b, dt: f"sycl::fmod({a}, {b})" if _is_f(dt) else f"tw_ifmod<{CTYPE[dt]}>({a}, {b}, tw_err)",
             ("tw_int_div",)),
    "pow": (lambda a, b, dt: f"sycl::pow({a}, {b})", ()),
    "maximum": (_maxmin(">"), ()),
    "minimum": (_maxmin("<"), ()),
    "atan2": (lambda a, b, dt: f"sycl::atan2({a}, {b})", ()),
    "copysign": (lambda a, b, dt: f"sycl::copysign({a}, {b})", ()),
    "neg": (lambda a, dt: f"{CTYPE[dt]}(-{a})", ()),
    "abs": (lambda a, dt: f"sycl::fabs({a})" if _is_f(dt) else f"{CTYPE[dt]}({a} < 0 ? -{a} : {a})", ()),
    "reciprocal": (lambda a, dt: f"({CTYPE[dt]}(1) / {a})", ()),
    "sign": (lambda a, dt: f"{CTYPE[dt]}(({a} > 0) - ({a} < 0))", ()),  # torch.sign(NaN) is 0
    "exp": (_F1("exp"), ()), "exp2": (_F1("exp2"), ()), "expm1": (_F1("expm1"), ()),
    "log": (_F1("log"), ()), "log2": (_F1("log2"), ()), "log10": (_F1("log10"), ()),
    "log1p": (_F1("log1p"), ()), "sqrt": (_F1("sqrt"), ()), "rsqrt": (_F1("rsqrt"), ()),
    "sin": (_F1("sin"), ()), "cos": (_F1("cos"), ()), "tan": (_F1("tan"), ()),
    "asin": (_F1("asin"), ()), "acos": (_F1("acos"), ()), "atan": (_F1("atan"), ()),
    "sinh": (_F1("sinh"), ()), "cosh": (_F1("cosh"), ()), "tanh": (_F1("tanh"), ()),
    "sigmoid": (lambda a, dt: f"({CTYPE[dt]}(1) / ({CTYPE[dt]}(1) + sycl::exp(-{a})))", ()),
    "erf": (_F1("erf"), ()),
    "erfinv": (lambda a, dt: f"tw_erfinv({a})", ("tw_erfinv",)),
    "floor": (_F1("floor"), ()), "ceil": (_F1("ceil"), ()), "trunc": (_F1("trunc"), ()),
    "round": (_F1("rint"), ()),  # half to even, as torch.round
    "isnan": (lambda a, dt: f"({a} != {a})" if _is_f(dt) else "false", ()),
    "isinf": (lambda a, dt: f"(sycl::fabs({a}) == __builtin_inf())" if _is_f(dt) else "false", ()),
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


class SyclExpr(CFamilyExpr):
    """Renders expression DAGs into SYCL C++ statements (see the module docstring).

    Args:
        load, index, acc, reduce: hooks returning the code of those nodes; ``load(node)`` and
            ``reduce(node, operand_code)`` may emit statements through :meth:`line` first.
    """

    CTYPE, STORAGE, HELPERS, HALF = CTYPE, STORAGE, HELPERS, "sycl::half"

    def literal(self, value: object, dtype: str) -> str:
        return literal(value, dtype)

    def op_code(self, n: Node, args: list[str]) -> str:
        operand = dtypes.compute_type(n.src[-1].dtype if n.op == "where" else n.src[0].dtype)
        render, helpers = MATH[n.op]
        self.helpers_used.update(helpers)
        return render(*args, operand)
