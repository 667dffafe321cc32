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
  libmvec (``TW_LIBMVEC``, see :mod:`tilewright.templates.cpp.runtime`) g++ calls its SIMD variants in
  vectorised loops;
* the op table, the integer division helpers and ``erfinv`` are the C++ family's
  (:mod:`tilewright.templates.c_math`, shared with SYCL): integer division and remainder by zero
  record the error (an atomic store) and the launcher raises it.
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.templates.c_expr import CFamilyExpr, CIndexPrinter
from tilewright.templates.c_math import (  # noqa: F401 - CTYPE and literal are this module's names too
    CTYPE, Render, erfinv_source, int_div_source, literal, math_table,
)
from tilewright.templates.cpp.rowops_helpers import HELPERS as ROWOPS_HELPERS
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
// (branch-free: a select would be control flow to g++ 12, which then leaves a loop that also
// calls a libmvec function, such as a soft-capping score_mod's tanhf, scalar)
static inline uint16_t tw_f_to_bf16(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = 0u - uint32_t(x != x);  // all ones for a NaN
  return uint16_t((rounded & ~nan) | (((u >> 16) | 0x40u) & nan));
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
''' + int_div_source(lambda status: f"__atomic_store_n(err, int64_t({status}), __ATOMIC_RELAXED);"),
    "tw_index": '''
// a gathered index checked against its dim: out of range the kernel reports IndexError (as
// torch raises) and reads element 0 instead of memory it does not own
static inline int64_t tw_index(int64_t i, int64_t size, int64_t *err) {
  if (i < 0 || i >= size) { __atomic_store_n(err, int64_t(2), __ATOMIC_RELAXED); return 0; }
  return i;
}
''',
    **ROWOPS_HELPERS,  # tw_in_dim, tw_prefix_sum (rowops.py)
    "tw_erfinv": erfinv_source("logf", "sqrtf", "fabsf"),
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


def _fn(name: str) -> Render:
    """A libm function of one or two operands: ``expf`` on fp32, ``exp`` on fp64."""
    def render(*args: str) -> str:
        *ops, dt = args
        return f"{name}{'f' if dt == 'fp32' else ''}({', '.join(ops)})"
    return render


# op -> (render(args..., operand compute dtype) -> code, the helpers it may call)
MATH = math_table(_fn)


class CppExpr(CFamilyExpr):
    """Renders expression DAGs into C++ statements (see the module docstring and
    :class:`~tilewright.templates.c_expr.CFamilyExpr`)."""

    CTYPE, STORAGE, HELPERS, MATH, HALF = CTYPE, STORAGE, HELPERS, MATH, "_Float16"
    HELPER_CALLS = HELPER_CALLS


class CPrinter(CIndexPrinter):
    """Integer index expressions as C++ (see :class:`~tilewright.templates.c_expr.CIndexPrinter`)."""


def ccode(e: Any, names: dict[sympy.Symbol, str] | None = None) -> str:
    return CPrinter(names).doprint(sympy.sympify(e))
