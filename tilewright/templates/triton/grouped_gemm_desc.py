"""Persistent Triton grouped GEMM that reads its operands through tensor descriptors.

The same work decomposition as ``triton.grouped_gemm`` (a fixed grid walking the (group, tile)
items, each group's [start, end) read from the int32 end offsets *on the device*, never on
the host), with A and B tiles loaded by ``tl.make_tensor_descriptor`` descriptors: TMA
(``cp.async.bulk.tensor``) on sm_90a/sm_100a, the Tensor Data Mover on gfx1250, the portable
path on gfx950 and in the Triton interpreter (which runs descriptors, so the tests check the
numbers on the CPU). Following ``triton.gemm_tma`` for dense GEMM.

One descriptor per operand for the whole launch, 3-D (group, rows, columns) where the operand
has a group dim, so no descriptor is rebuilt per group. A descriptor clips at the *tensor's*
edge, not at a group's, so the group boundary is handled where it matters:

* ragged M (2d3d) / ragged N (3d2d): a tile may read the next group's rows / columns; they
  only feed output elements the masked store skips (each output row/column depends on its own
  A row / B column only);
* ragged K (2d2d): the K slice past the group's end is zeroed in registers (``tl.where``)
  before the dot, in both operands, so the next group's values (or an uninitialised tail
  past ``offs[-1]``, even NaN) never enter the sum.

Descriptors need a unit-stride inner dim and 16-byte aligned base, outer and group strides;
the launcher copies an operand that is not (``tma_ready``: correct, slower) and ``supports``
refuses static layouts no descriptor can describe. A fused gated product (``problem.glu``)
reads B's gate and up tiles through the same descriptor, ``half`` columns apart. The tile knobs
(16 to 256 elements a side) always fit a TMA box (at most 256 a side, inner dim >= 32 bytes for
these 2- and 4-byte dtypes).
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.targets import Target
from tilewright.templates.base import InstructionCheck, Params, Support
from tilewright.templates.triton.grouped_gemm import TritonGroupedGemm


def contiguous_dims(problem: GroupedGemmProblem) -> dict[str, str]:
    """Each operand's unit-stride dim: A's K (row-major) or M, B's N (row-major) or K."""
    return {"A": "M" if problem.layout_a == "col" else "K", "B": "K" if problem.layout_b == "col" else "N"}


def ragged_align(problem: GroupedGemmProblem) -> int:
    """Elements a group's first tile start is rounded down to: a descriptor block's offset
    along the contiguous dim must be 16-byte aligned (the interpreter asserts it), so where the
    ragged dim is an operand's contiguous one, 16 bytes' worth; 1 elsewhere."""
    if problem.ragged and problem.ragged in contiguous_dims(problem).values():
        return 16 // ELEMENT_BYTES[problem.dtype]
    return 1


class TritonGroupedGemmDesc(TritonGroupedGemm):
    id = "triton.grouped_gemm_desc"
    jinja = "grouped_gemm_desc.py.jinja"
    kernel_name = "tw_grouped_gemm_desc_kernel"
    buffered_stages_offset = 0  # measured: a descriptor pipeline holds num_stages tile copies

    def problem_support(self, problem: GroupedGemmProblem, target: Target) -> Support:
        base = super().problem_support(problem, target)
        if not base:
            return base
        if target.backend == "cuda" and not target.has("tma"):
            return Support(False, f"{target.name} has no TMA")
        if target.backend == "hip" and target.arch not in ("gfx1250", "gfx950"):
            return Support(False, f"tensor descriptors are not generated for {target.arch}")
        if "strided" in (problem.layout_a, problem.layout_b):
            return Support(False, "a descriptor needs one contiguous dim in each operand")
        eb = ELEMENT_BYTES[problem.dtype]
        # the contiguous dim of each operand, whose rows must be 16-byte multiples (unless the
        # size is dynamic: the launcher then pads a ragged one at run time)
        for name, dim in contiguous_dims(problem).items():
            size = getattr(problem, dim)
            if dim not in problem.dynamic and (size * eb) % 16:
                return Support(False, f"{name}'s rows ({dim}={size}) are {size * eb} bytes, not a multiple "
                                      f"of 16: a descriptor cannot read them in place (triton.grouped_gemm can)")
        if problem.glu and problem.layout_b == "row" and ("N" in problem.dynamic or (problem.out_n * eb) % 16):
            return Support(False, f"B's up half starts N/2={problem.out_n} columns in, not a 16-byte aligned "
                                  f"descriptor offset (triton.grouped_gemm can)")
        return base

    def context(self, problem: GroupedGemmProblem, params: Params, target: Target) -> dict[str, Any]:
        ctx = super().context(problem, params, target)
        ctx.update(a_col_major=problem.layout_a == "col", b_col_major=problem.layout_b == "col",
                   align=ragged_align(problem))
        return ctx

    def expected_instructions(self, problem: GroupedGemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        checks = super().expected_instructions(problem, params, target)
        if target.backend == "cuda":
            checks.append(InstructionCheck("ptx", (r"cp\.async\.bulk\.tensor",), (), "TMA tile loads"))
        elif target.arch == "gfx1250":
            checks.append(InstructionCheck("amdgcn", (r"tensor_load_to_lds",), (), "TDM tile loads"))
        return checks

    def efficiency(self, target: Target) -> float:
        # as triton.gemm_tma: TMA/TDM free the warps from address math (10-20% on Hopper)
        return 1.15 if target.has("tma") or target.has("tdm") else 1.0
