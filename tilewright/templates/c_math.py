"""The op table and helper sources the C++-family emitters share (C++ for the host, SYCL):
every op of :data:`tilewright.ir.ops.OPS` as C++ computing what its torch function computes,
given how the language spells a math function (``expf``/``exp`` from the C library on the host,
``sycl::exp`` in SYCL device code) and how a kernel reports an error (an atomic store on the host,
a ``sycl::atomic_ref`` in SYCL).

* ``maximum``/``minimum`` propagate NaN, ``round`` is half to even (``rint``), float floor
  division is torch's (from the remainder, the language's ``tw_floordiv`` helper), ``mod`` has the
  divisor's sign, ``sign(NaN)`` is 0 (measured, torch 2.13);
* integer division and remainder by zero do not trap: the kernel records ``ZeroDivisionError``
  (status 1, as torch raises) through its error flag ``tw_err`` and the launcher raises it;
  ``MIN / -1`` wraps as torch's floor division does (:func:`int_div_source`).
"""

from __future__ import annotations

from typing import Callable

from tilewright.ir import dtypes

# compute type -> C++ type of values
CTYPE = {"fp64": "double", "fp32": "float", "i64": "int64_t", "i32": "int32_t", "i16": "int16_t",
         "i8": "int8_t", "u8": "uint8_t", "bool": "bool"}

Render = Callable[..., str]
# fn(name) -> render(*operands, compute dtype) -> the language's call of math function ``name``
MathFunction = Callable[[str], Render]


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


def int_div_source(report: Callable[[int], str]) -> str:
    """The integer division and remainder helpers (``tw_idiv_trunc``, ``tw_idiv_floor``,
    ``tw_imod``, ``tw_ifmod``) that never trap; ``report(status)`` is the language's statement
    storing ``status`` into ``*err``."""
    zero = f"if (b == T(0)) {{ {report(1)} return T(0); }}"
    return f'''template <typename T> static inline T tw_idiv_trunc(T a, T b, int64_t *err) {{
  {zero}
  if (T(-1) < T(0) && b == T(-1)) return T(uint64_t(0) - uint64_t(a));
  return T(a / b);
}}
template <typename T> static inline T tw_idiv_floor(T a, T b, int64_t *err) {{
  {zero}
  if (T(-1) < T(0) && b == T(-1)) return T(uint64_t(0) - uint64_t(a));
  const T q = T(a / b);
  return T(q - T((a % b != 0) && ((a < 0) != (b < 0))));
}}
template <typename T> static inline T tw_imod(T a, T b, int64_t *err) {{
  {zero}
  if (T(-1) < T(0) && b == T(-1)) return T(0);
  const T r = T(a % b);
  return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
}}
template <typename T> static inline T tw_ifmod(T a, T b, int64_t *err) {{
  {zero}
  if (T(-1) < T(0) && b == T(-1)) return T(0);
  return T(a % b);
}}
'''


def erfinv_source(log: str, sqrt: str, fabs: str) -> str:
    """``tw_erfinv``: Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), in
    single precision, calling the language's single-precision ``log``, ``sqrt`` and ``fabs``."""
    return f'''
// Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision
template <typename T> static inline T tw_erfinv(T xin) {{
  const float x = float(xin);
  float w = -{log}((1.0f - x) * (1.0f + x));
  float p;
  if (w < 5.0f) {{
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
  }} else {{
    w = {sqrt}(w) - 3.0f;
    p = -0.000200214257f;
    p = 0.000100950558f + p * w;
    p = 0.00134934322f + p * w;
    p = -0.00367342844f + p * w;
    p = 0.00573950773f + p * w;
    p = -0.0076224613f + p * w;
    p = 0.00943887047f + p * w;
    p = 1.00167406f + p * w;
    p = 2.83297682f + p * w;
  }}
  if ({fabs}(x) > 1.0f) return T(__builtin_nanf(""));
  if ({fabs}(x) == 1.0f) return T(x * __builtin_inff());
  return T(p * x);
}}
'''


def _is_f(dt: str) -> bool:
    return dtypes.is_float(dt)


def _maxmin(cmp: str) -> Render:
    def render(a: str, b: str, dt: str) -> str:
        if _is_f(dt):  # NaN propagates (torch.maximum/minimum)
            return f"(({a} != {a} || {b} != {b}) ? {a} + {b} : ({a} {cmp} {b} ? {a} : {b}))"
        return f"({a} {cmp} {b} ? {a} : {b})"
    return render


def math_table(fn: MathFunction, **overrides: tuple[Render, tuple[str, ...]]
               ) -> dict[str, tuple[Render, tuple[str, ...]]]:
    """op -> (render(args..., operand compute dtype) -> code, the helpers it may call), with
    math functions spelled by ``fn``; ``overrides`` replace single ops (a language's own
    ``rsqrt``). Integer division and remainder read the kernel's error flag ``tw_err``."""
    int_div = ("tw_int_div",)
    ct = CTYPE

    def f1(name: str) -> Render:
        return lambda a, dt: fn(name)(a, dt)

    def binop(sym: str) -> Render:
        return lambda a, b, dt: f"{ct[dt]}({a} {sym} {b})"

    def cmp(sym: str) -> Render:
        return lambda a, b, dt: f"({a} {sym} {b})"

    def mod(a: str, b: str, dt: str) -> str:
        if not _is_f(dt):
            return f"tw_imod<{ct[dt]}>({a}, {b}, tw_err)"
        r = fn("fmod")(a, b, dt)  # Python's remainder: the result has the divisor's sign
        return f"({r} != 0 && (({r} < 0) != ({b} < 0)) ? {ct[dt]}({r} + {b}) : {ct[dt]}({r}))"

    table: dict[str, tuple[Render, tuple[str, ...]]] = {
        # on booleans torch's add is a logical or and mul a logical and
        "add": (lambda a, b, dt: f"({a} || {b})" if dt == "bool" else f"{ct[dt]}({a} + {b})", ()),
        "sub": (binop("-"), ()),
        "mul": (lambda a, b, dt: f"({a} && {b})" if dt == "bool" else f"{ct[dt]}({a} * {b})", ()),
        "truediv": (binop("/"), ()),
        "floordiv": (lambda a, b, dt: f"tw_floordiv({a}, {b})" if _is_f(dt)
                     else f"tw_idiv_floor<{ct[dt]}>({a}, {b}, tw_err)", ("tw_floordiv",) + int_div),
        "truncdiv": (lambda a, b, dt: fn("trunc")(f"{a} / {b}", dt) if _is_f(dt)
                     else f"tw_idiv_trunc<{ct[dt]}>({a}, {b}, tw_err)", int_div),
        "mod": (mod, int_div),
        "fmod": (lambda a, b, dt: fn("fmod")(a, b, dt) if _is_f(dt)
                 else f"tw_ifmod<{ct[dt]}>({a}, {b}, tw_err)", int_div),
        "pow": (fn("pow"), ()),
        "maximum": (_maxmin(">"), ()),
        "minimum": (_maxmin("<"), ()),
        "atan2": (fn("atan2"), ()),
        "copysign": (fn("copysign"), ()),
        "neg": (lambda a, dt: f"{ct[dt]}(-{a})", ()),
        "abs": (lambda a, dt: fn("fabs")(a, dt) if _is_f(dt) else f"{ct[dt]}({a} < 0 ? -{a} : {a})", ()),
        "reciprocal": (lambda a, dt: f"({ct[dt]}(1) / {a})", ()),
        # torch.sign(NaN) is 0, not NaN (measured, torch 2.13)
        "sign": (lambda a, dt: f"{ct[dt]}(({a} > 0) - ({a} < 0))", ()),
        "rsqrt": (lambda a, dt: f"({ct[dt]}(1) / {fn('sqrt')(a, dt)})", ()),
        "sigmoid": (lambda a, dt: f"({ct[dt]}(1) / ({ct[dt]}(1) + {fn('exp')(f'-{a}', dt)}))", ()),
        "erfinv": (lambda a, dt: f"tw_erfinv({a})", ("tw_erfinv",)),
        "round": (f1("rint"), ()),  # half to even under the default rounding mode, as torch.round
        "isnan": (lambda a, dt: f"({a} != {a})" if _is_f(dt) else "false", ()),
        "isinf": (lambda a, dt: f"({fn('fabs')(a, dt)} == {literal(float('inf'), dt)})" if _is_f(dt)
                  else "false", ()),
        "eq": (cmp("=="), ()), "ne": (cmp("!="), ()), "lt": (cmp("<"), ()),
        "le": (cmp("<="), ()), "gt": (cmp(">"), ()), "ge": (cmp(">="), ()),
        "logical_not": (lambda a, dt: f"(!{a})", ()),
        "logical_and": (lambda a, b, dt: f"({a} && {b})", ()),
        "logical_or": (lambda a, b, dt: f"({a} || {b})", ()),
        "logical_xor": (lambda a, b, dt: f"(bool({a}) != bool({b}))", ()),
        "bitwise_not": (lambda a, dt: f"{ct[dt]}(~{a})" if dt != "bool" else f"(!{a})", ()),
        "bitwise_and": (lambda a, b, dt: f"{ct[dt]}({a} & {b})", ()),
        "bitwise_or": (lambda a, b, dt: f"{ct[dt]}({a} | {b})", ()),
        "bitwise_xor": (lambda a, b, dt: f"{ct[dt]}({a} ^ {b})", ()),
        "where": (lambda c, a, b, dt: f"({c} ? {a} : {b})", ()),
    }
    for name in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "sin", "cos", "tan",
                 "asin", "acos", "atan", "sinh", "cosh", "tanh", "erf", "floor", "ceil", "trunc"):
        table[name] = (f1(name), ())
    table.update(overrides)
    return table
