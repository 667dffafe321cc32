"""What the C++-family expression emitters share (C++ for the host, SYCL): values held in their
compute type, converted and rounded the same way, stored as their element type.

Each language's emitter (``templates/cpp/emit.py``, ``templates/sycl/emit.py``) subclasses
:class:`CFamilyExpr` and names its tables (``CTYPE``: compute type -> C type, ``STORAGE``:
element type -> C type, ``HELPERS``: helper name -> source) and its ``HALF`` type; only the
half type differs (``_Float16`` on the host, ``sycl::half`` in SYCL).
"""

from __future__ import annotations

from typing import ClassVar

from tilewright.ir import dtypes
from tilewright.ir.emitter import ExprEmitter
from tilewright.ir.expr import Node


class CFamilyExpr(ExprEmitter):
    """Conversions, loads, stores and helpers of a C++-family emitter (subclasses set the
    tables and ``literal``/``op_code``)."""

    CTYPE: ClassVar[dict[str, str]] = {}
    STORAGE: ClassVar[dict[str, str]] = {}
    HELPERS: ClassVar[dict[str, str]] = {}
    HALF: ClassVar[str] = "_Float16"

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
