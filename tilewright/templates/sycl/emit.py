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
torch's float floor division are helpers rendered into the source (:data:`HELPERS`). The op
table, the integer division helpers and ``erfinv`` are the C++ family's
(:mod:`tilewright.templates.c_math`, shared with the host C++ emitter).
"""

from __future__ import annotations

from tilewright.templates.c_expr import CFamilyExpr
from tilewright.templates.c_math import (  # noqa: F401 - CTYPE and literal are this module's names too
    CTYPE, Render, erfinv_source, int_div_source, literal, math_table,
)
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
''' + int_div_source(lambda status: f"tw_report(err, {status});") + '''// a gathered index checked against its dim: out of range the kernel reports IndexError (as
// eager raises) and reads element 0 instead of memory it does not own
static inline int64_t tw_index(int64_t i, int64_t size, int64_t *err) {
  if (i < 0 || i >= size) { tw_report(err, 2); return 0; }
  return i;
}
''',
    "tw_erfinv": erfinv_source("sycl::log", "sycl::sqrt", "sycl::fabs"),
}


def _fn(name: str) -> Render:
    """A device builtin of one or two operands: ``sycl::exp`` for every float type."""
    def render(*args: str) -> str:
        *ops, _ = args
        return f"sycl::{name}({', '.join(ops)})"
    return render


# op -> (render(args..., operand compute dtype) -> code, the helpers it calls)
MATH = math_table(_fn, rsqrt=(lambda a, dt: f"sycl::rsqrt({a})", ()))


class SyclExpr(CFamilyExpr):
    """Renders expression DAGs into SYCL C++ statements (see the module docstring and
    :class:`~tilewright.templates.c_expr.CFamilyExpr`)."""

    CTYPE, STORAGE, HELPERS, MATH, HALF = CTYPE, STORAGE, HELPERS, MATH, "sycl::half"
