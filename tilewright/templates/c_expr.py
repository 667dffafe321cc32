"""What the C++-family expression emitters share (C++ for the host, SYCL): values held in their
compute type, converted and rounded the same way, stored as their element type; and how the
C family prints integer index expressions (:class:`CIndexPrinter`, MSL's too) and reduction
identities.

Each language's emitter (``templates/cpp/emit.py``, ``templates/sycl/emit.py``) subclasses
:class:`CFamilyExpr` and names its tables (``CTYPE``: compute type -> C type, ``STORAGE``:
element type -> C type, ``HELPERS``: helper name -> source, ``MATH``: the op table of
:func:`tilewright.templates.c_math.math_table` in its spelling of math functions) and its
``HALF`` type (``_Float16`` on the host, ``sycl::half`` in SYCL).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import sympy

from tilewright.errors import UnsupportedProblemError
from tilewright.ir import dtypes
from tilewright.ir.emitter import ExprEmitter
from tilewright.ir.expr import Node
from tilewright.ir.index import CodePrinter
from tilewright.templates import c_math


class CFamilyExpr(ExprEmitter):
    """Conversions, loads, stores, ops and helpers of a C++-family emitter (subclasses set the
    tables).

    Args:
        load, index, acc, reduce: hooks returning the code of those nodes; ``load(node)`` and
            ``reduce(node, operand_code)`` may emit statements through :meth:`line` first.
    """

    CTYPE: ClassVar[dict[str, str]] = {}
    STORAGE: ClassVar[dict[str, str]] = {}
    HELPERS: ClassVar[dict[str, str]] = {}
    MATH: ClassVar[dict[str, tuple[c_math.Render, tuple[str, ...]]]] = {}
    # helper -> the identifiers whose use in an op's code needs it; None: every helper the op
    # may call is rendered
    HELPER_CALLS: ClassVar[dict[str, tuple[str, ...]] | None] = None
    HALF: ClassVar[str] = "_Float16"

    def literal(self, value: object, dtype: str) -> str:
        return c_math.literal(value, dtype)

    def op_code(self, n: Node, args: list[str]) -> str:
        operand = dtypes.compute_type(n.src[-1].dtype if n.op == "where" else n.src[0].dtype)
        render, helpers = self.MATH[n.op]
        code = render(*args, operand)
        if self.HELPER_CALLS is None:
            self.helpers_used.update(helpers)
        else:
            self.helpers_used.update(h for h in helpers if any(i in code for i in self.HELPER_CALLS[h]))
        return code

    def declare(self, name: str, n: Node, code: str) -> str:
        return f"const {self.CTYPE[dtypes.compute_type(n.dtype)]} {name} = {code};"

    def convert(self, code: str, src: str, dst: str) -> str:
        """Code converting a value held in ``src``'s compute type to ``dst``'s compute type,
        rounding where ``dst`` is narrower (to nearest even)."""
        cdst = dtypes.compute_type(dst)
        if dst == "bool":
            return f"({code} != 0)"
        if dst == "bf16":
            self.helpers_used.add("tw_bf16")
            return f"tw_round_bf16(float({code}))"
        if dst == "fp16":
            return f"float({self.HALF}(float({code})))"
        if dtypes.compute_type(src) == cdst:
            return code  # widening a narrow float held in fp32 already
        return f"{self.CTYPE[cdst]}({code})"

    def load_value(self, element: str, dtype: str) -> str:
        """A buffer element (C++ of its storage type) as a value of its compute type."""
        if dtype == "bf16":
            self.helpers_used.add("tw_bf16")
            return f"tw_bf16_to_f({element})"
        if dtype == "fp16":
            return f"float({element})"
        return element

    def store_value(self, code: str, src: str, dst: str) -> str:
        """Code converting a computed value to the stored element type ``dst``."""
        if dst == "bool":
            return f"({code} != 0)" if src != "bool" else code
        if dst == "bf16":
            self.helpers_used.add("tw_bf16")
            return f"tw_f_to_bf16(float({code}))"
        if dst == "fp16":
            return f"{self.HALF}(float({code}))"
        return f"{self.STORAGE[dst]}({code})"

    def helpers(self) -> str:
        """Source of the helper functions the rendered statements call."""
        return "\n".join(self.HELPERS[h].strip("\n") + "\n" for h in sorted(self.helpers_used))


class CIndexPrinter(CodePrinter):
    """Integer index expressions as C-family code (``int64_t``; C++, SYCL, MSL).

    C's ``/`` truncates toward zero where a floor is wanted: ``floor(a/b)`` prints as ``a / b``
    where the numerator is provably non-negative, otherwise from the true remainder as
    :class:`~tilewright.ir.index.CodePrinter` does; ``ceiling(a/b)`` as ``(a + b - 1) / b`` (the
    values indices take are non-negative). ``Max``/``Min`` fold pairwise through ``MAX``/``MIN``
    (64-bit operands), integers beyond 32 bits print as 64-bit literals."""

    FLOORDIV = "/"
    MAX: ClassVar[str] = "tw_max"
    MIN: ClassVar[str] = "tw_min"

    def _print_ceiling(self, expr: sympy.Expr) -> str:
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den == 1:
            return self._print(num)
        d = self._print(den)
        return f"((({self._print(num)}) + ({d}) - 1) / ({d}))"

    def _fold(self, expr: sympy.Expr, fn: str) -> str:
        out = f"int64_t({self._print(expr.args[0])})"
        for a in expr.args[1:]:
            out = f"{fn}({out}, int64_t({self._print(a)}))"
        return out

    def _print_Max(self, expr: sympy.Expr) -> str:
        return self._fold(expr, self.MAX)

    def _print_Min(self, expr: sympy.Expr) -> str:
        return self._fold(expr, self.MIN)

    def _print_Integer(self, expr: sympy.Expr) -> str:
        return f"int64_t({int(expr)}LL)" if abs(int(expr)) > 2**31 - 1 else f"{int(expr)}L"


def reduction_identity(kind: str, ct: str, literal: Callable[[object, str], str],
                       int_limit: Callable[[str, bool], str], language: str) -> str:
    """The identity of a ``kind`` reduction (``sum``, ``prod``, ``max``/``argmax``,
    ``min``/``argmin``, ``any``, ``all``, Welford's parts) held in compute type ``ct``, as code:
    ``literal(value, ct)`` for numbers, ``int_limit(ct, low)`` for an integer type's lowest or
    highest value.

    Raises:
        UnsupportedProblemError: a reduction kind the C-family templates do not know.
    """
    if kind in ("sum", "welford_mean", "welford_m2"):
        return literal(0, ct)
    if kind == "prod":
        return literal(1, ct)
    if kind in ("max", "argmax", "min", "argmin"):
        low = kind in ("max", "argmax")
        if dtypes.is_float(ct):
            return literal(float("-inf") if low else float("inf"), ct)
        if ct == "bool":
            return "false" if low else "true"
        return int_limit(ct, low)
    if kind in ("any", "all"):
        return "false" if kind == "any" else "true"
    raise UnsupportedProblemError(f"{language} reductions do not know {kind!r}")
