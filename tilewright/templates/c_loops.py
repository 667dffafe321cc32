"""What the C++-family loop bodies (C++ for the host CPU, SYCL, Metal's MSL) write alike on top
of the shared schedule (:class:`~tilewright.templates.loop_schedule.LoopSchedule`): index
declarations, an index expression's value, stores through run-time strides, a gathered index
checked against its bound through ``tw_err``, and the refusals their loop templates share.

Each language's ``_Body`` subclasses :class:`CFamilyBody` and names its index type and how it
prints an index expression (:meth:`CFamilyBody.ccode`); only what differs stays in its folder.
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.ir import dtypes
from tilewright.ir.bounds import check_needed, checks_enabled, unchecked_dims, var_ranges
from tilewright.ir.expr import Node
from tilewright.ir.index import offset
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import SUPPORTED, Support
from tilewright.templates.c_math import CTYPE, literal
from tilewright.templates.loop_schedule import LoopSchedule, strided_scan_refusal


class CFamilyBody(LoopSchedule):
    """The hooks a C++-family loop body shares. Subclasses set :attr:`INDEX` (the 64-bit index
    type a checked index is computed in), :attr:`INDEX_ZERO`, :attr:`CHECK_HELPER` (the emitter
    helper that defines ``tw_index``), and implement :meth:`ccode`."""

    INDEX = "int64_t"
    INDEX_ZERO = "int64_t(0)"
    CHECK_HELPER = "tw_index"

    def ccode(self, e: Any, names: dict) -> str:
        """An integer index expression as this language's C (its printer's ``max``/``min``)."""
        raise NotImplementedError

    def extents(self) -> dict:
        """The ranges of the kernel's variables, for proving an index in range."""
        return var_ranges(self.k)

    def index_code(self, e: sympy.Expr) -> str:
        return self.ccode(e, self.names)

    def declare_index(self, name: str, text: str) -> str:
        return f"const int64_t {name} = {text};"

    def _index(self, n: Node) -> str:
        return f"{self.e.CTYPE[dtypes.compute_type(n.dtype)]}({self.ccode(n.arg, self.names)})"

    def check_gathered(self, n: Node, buf: Any, idx: list, names: dict, mask: str | None = None) -> None:
        """Check, in place in ``idx``/``names``, each gathered dim of load ``n`` not proven in
        range against its extent (``tw_index``: eager's IndexError through ``tw_err``); a lane
        where ``mask`` (a C condition) is false checks 0 instead of an index that may be anything."""
        for d in unchecked_dims(self.k, n, idx, self.extents()) if checks_enabled() else ():
            checked = self.e.fresh()
            self.e.helpers_used.add(self.CHECK_HELPER)
            at = self.ccode(idx[d], names)
            if mask is not None:
                at = f"({mask} ? {self.INDEX}({at}) : {self.INDEX_ZERO})"
            self.e.line(f"const {self.INDEX} {checked} = tw_index({at}, {self.ccode(buf.shape[d], self.names)}, tw_err);")
            idx[d] = sympy.Symbol(checked, integer=True)
            names[idx[d]] = checked

    def read(self, n: Node, buf: Any, idx: list, names: dict, own: Node | None) -> str:
        """Load ``n``'s element of ``buf`` at ``idx`` through the run-time strides, in its compute
        type; where the load has its own mask ``own`` (a cat's, a pad's), 0 elsewhere."""
        strides = [sympy.Symbol(f"{buf.name}_s{d}") for d in range(len(buf.shape))]
        off = self.ccode(offset(idx, strides), names)
        value = self.e.load_value(f"{buf.name}[{off}]", buf.dtype)
        ct = dtypes.compute_type(n.dtype)
        if buf.dtype != n.dtype and dtypes.compute_type(buf.dtype) != ct:
            value = f"{CTYPE[ct]}({value})"
        if own is not None:  # a masked load (cat, pad): only where the mask holds, else 0
            return f"({self.e.names[own]} ? {CTYPE[ct]}({value}) : {literal(0, ct)})"
        return value

    def write_store(self, s, buf, node: Node, value: str, guard: str | None) -> None:
        strides = [sympy.Symbol(f"{buf.name}_s{d}") for d in range(len(buf.shape))]
        off = self.ccode(offset(s.index, strides), self.names)
        text = f"{buf.name}[{off}] = {self.e.store_value(value, node.dtype, buf.dtype)};"
        if s.mask is not None:  # a combo kernel's part: only its own share of the space
            text = f"if ({self.e.emit(s.mask)}) {text}"
        self.e.line(text)

    def _checked(self, n: Node, value: str, bound: str, mask: str | None) -> str:
        """A gathered index checked against its bound (a view's extent): eager's IndexError
        through ``tw_err``, 0 in its place (nothing read outside memory)."""
        if not check_needed(n, self.extents()):
            return value
        at = f"{self.INDEX}({value})"
        if mask is not None:  # a lane outside its part (a cat's, a combo kernel's): nothing to check
            at = f"({mask} ? {at} : {self.INDEX_ZERO})"
        name = self.e.fresh()
        self.e.helpers_used.add(self.CHECK_HELPER)
        self.e.line(f"const {self.INDEX} {name} = tw_index({at}, {self.INDEX}({bound}), tw_err);")
        return name


def loop_support(template: Any, problem: Any, target: Target, *, backend: str, kernels: str,
                 language: str, storage: Any, scans_and_scatters: bool = False) -> Support:
    """The refusals a C++-family loop template shares: not its kind of loop kernel, a target of
    another backend than ``backend`` (``kernels`` names them: "SYCL kernels"), a buffer dtype
    with no ``language`` conversion (not in ``storage``), a GEMM accumulator, a strided scan or
    scatter (unless the language writes them: ``scans_and_scatters``, C++); else ``SUPPORTED``."""
    if not isinstance(problem, LoopProblem) or problem.kind != template.op:
        return Support(False, f"{template.id} runs {template.op} loop kernels")
    if target.backend != backend:
        return Support(False, f"{kernels} are for the {backend} target, not {target.name}")
    for b in problem.kernel.inputs + problem.kernel.outputs:
        if b.dtype not in storage:
            return Support(False, f"{b.dtype} buffers ({b.name}) have no {language} conversion here")
    if any(n.op == "acc" for n in problem.kernel.nodes()):
        return Support(False, "GEMM accumulators belong to a GEMM template")
    if not scans_and_scatters and (why := strided_scan_refusal(problem.kernel)) is not None:
        return Support(False, why)
    return SUPPORTED
