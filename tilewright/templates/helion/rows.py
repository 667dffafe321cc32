"""Helion templates over rows (RMSNorm, softmax): a loop kernel that reduces its last dim.

The kernel sees 2-D tensors (rows, N): the problem's outer dims are folded into rows by views,
and a problem whose rows are not one stride apart is refused (no copy: outputs must be written
in place). Knobs: ``XBLOCK`` rows per program (Helion's first block), ``PERSISTENT`` whole rows
in registers or ``RBLOCK`` a looped reduction (Helion's ``reduction_loops``), warps, stages,
indexing. Seeds: Helion's default config, then the loop policy's rules (rows per program while
a program holds at most 16K elements, warps for about 8 elements per thread, a looped
reduction beside them for long rows; under the interpreter the fewest programs).
"""

from __future__ import annotations

from typing import Any, Mapping

import sympy

from tilewright.ir.index import code, product
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import Knob, ParamSpace, Support, powers_of_two
from tilewright.templates.helion.base import COMMON_KNOBS, HelionTemplate
from tilewright.templates.helion.calls import HelionCall, evaluate, interface_for

ROW_SPACE = ParamSpace((
    Knob("XBLOCK", powers_of_two(1, 4096), 1, "rows per program (Helion's block_sizes[0])"),
    Knob("PERSISTENT", (True, False), True, "whole rows in registers (reduction_loops [None])"),
    Knob("RBLOCK", powers_of_two(16, 4096), 1024, "the looped reduction's block when not PERSISTENT"),
) + COMMON_KNOBS)
ROW_FIELDS: Mapping[str, tuple[str, int | None]] = {
    "XBLOCK": ("block_sizes", 0), "RBLOCK": ("reduction_loops", 0), "num_warps": ("num_warps", None),
    "num_stages": ("num_stages", None), "indexing": ("indexing", None)}
FLOATS = ("fp32", "fp16", "bf16")


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _warps(elements: int) -> int:
    w = max(1, min(16, elements // 256))
    return 1 << (w.bit_length() - 1)


def row_index(problem: LoopProblem) -> tuple[sympy.Expr, ...] | Support:
    """The index of one element of a row, ``(x0, ..., xk, r0)``, or why the problem is not a
    row kernel (a combo kernel, several reduced dims, no reduction)."""
    k = problem.kernel
    if k.parts:
        return Support(False, "a combo kernel (several kernels launched as one)")
    if len(k.reduction_ranges) != 1:
        return Support(False, f"reduces {len(k.reduction_ranges)} dims; a row kernel reduces one, the last")
    if any(b.dtype not in FLOATS for b in k.inputs + k.outputs):
        return Support(False, "reads or writes a non-float (or fp64/fp8) tensor")
    return (*k.x_vars, k.r_vars[0])


class RowTemplate(HelionTemplate):
    """A Helion template for a row kernel (see the module docstring)."""

    op = "reduction"
    space = ROW_SPACE
    fields = ROW_FIELDS

    def rows(self, problem: LoopProblem, name: str) -> str:
        """The expression for buffer ``name`` as (rows, N): itself when the kernel has one outer
        dim, else a view folding the outer dims (in the launcher's size names)."""
        k = problem.kernel
        buf = k.buffer(name)
        if len(buf.shape) == 1 or len(k.ranges) == 1:
            return name
        return f"{name}.view({code(product(k.ranges))}, {code(product(k.reduction_ranges))})"

    def viewable(self, problem: LoopProblem, call: HelionCall) -> Support | HelionCall:
        """``call``, or why its views of the problem's tensors do not exist (rows that are not
        one stride apart)."""
        try:
            evaluate(call, interface_for(problem).names(problem))
        except RuntimeError as e:
            return Support(False, f"the rows cannot be viewed as (rows, N) without a copy: {e}".split("\n")[0])
        return call

    def params_of(self, cfg: Any) -> dict[str, Any]:
        """A Helion config as this template's knobs."""
        c = cfg.config
        loops = c.get("reduction_loops") or [None]
        out = {"XBLOCK": c["block_sizes"][0], "PERSISTENT": loops[0] is None, "num_warps": c["num_warps"],
               "num_stages": c["num_stages"], "indexing": c["indexing"] if isinstance(c["indexing"], str) else "pointer"}
        if loops[0] is not None:
            out["RBLOCK"] = loops[0]
        return out

    def seed_params(self, problem: LoopProblem, target: Target) -> list[dict[str, Any]] | None:
        spec = self.spec_or_none(problem, target)
        if spec is None:
            return []
        seeds = [self.params_of(spec.default_config())] + self.shape_seeds(problem, target)
        if target.has("tma") or target.has("tdm"):
            seeds += [s | {"indexing": "tensor_descriptor"} for s in seeds]
        return seeds

    def shape_seeds(self, problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
        x, r = max(problem.xnumel, 1), max(problem.rnumel, 1)
        rp = _pow2(r)
        top = self.bound(problem, target).config_spec.block_sizes[0].max_size
        if target.interpreted:  # each program costs Python time: the fewest
            return [{"XBLOCK": min(_pow2(x), max(1, 65536 // rp), top), "PERSISTENT": True, "num_warps": 4}]
        out = []
        for xblock in (1, 2, 4, 8, 16, 32, 64):
            if xblock <= min(_pow2(x), top) and xblock * rp <= 16384:
                out.append({"XBLOCK": xblock, "PERSISTENT": True, "num_warps": _warps(xblock * rp)})
        if rp >= 2048:
            out += [{"XBLOCK": 1, "PERSISTENT": False, "RBLOCK": rb, "num_warps": _warps(rb)}
                    for rb in (1024, 2048, 4096) if rb < rp]
        return out
