"""Grouped GEMM (``torch._grouped_mm`` / ``F.grouped_mm``) as a problem kind, "grouped_gemm".

G independent GEMMs in one launch, as MoE layers run their experts. The four shape cases of
``_grouped_mm(a, b, offs)`` (``offs``: int32 *end* offsets along the ragged dimension, one per
group, on the operands' device; group g spans ``[offs[g-1], offs[g])``, ``offs[-1] = 0``):

========  ===============  ===============  ===============  ==========================
case      a                b                out              ragged dim (offs along)
========  ===============  ===============  ===============  ==========================
"2d3d"    (M_total, K)     (G, K, N)        (M_total, N)     M: tokens (MoE forward)
"2d2d"    (M, K_total)     (K_total, N)     (G, M, N)        K: tokens (weight gradient)
"3d2d"    (G, M, K)        (K, N_total)     (M, N_total)     N
"3d3d"    (G, M, K)        (G, K, N)        (G, M, N)        none (a batched GEMM, no offs)
========  ===============  ===============  ===============  ==========================

Empty groups are allowed (an empty group of the ragged-K case writes ``epilogue(0)``, the
product of nothing; ``_grouped_mm`` writes 0 there, which is the same without an epilogue).
Rows (2d3d) or columns (3d2d) past ``offs[-1]`` are not part of any group and are not written.

Offsets are a run-time input, never part of the problem: a kernel is tuned once per problem
(bucketed on the ragged total, the token count) with *synthetic* even, 16-aligned offsets
(:func:`synthetic_offsets`), and the problem records that (``offsets="even"``) in its JSON and
description, so a cache entry says what it was measured on.

The epilogue is :class:`~tilewright.kinds.gemm.problem.GemmProblem`'s (kinds list or IR, applied to the
fp32 accumulator). Epilogue inputs are passed in their *natural* shapes, one dim per letter of
their broadcast pattern: "B" the group (G), "M" the output rows, "N" the output columns. So a
per-group bias of the 2d3d case is pattern "BN", a (G, N) tensor, read at the group each row
belongs to; a SwiGLU ``silu(gate) * up`` is a "mul" by an "MN" input (an output-shaped tensor).

A gated product computed by the GEMM itself (``glu``, what the MoE expert MLP's gate_up
projection is followed by: ``gate, up = out.chunk(2, -1); act(gate) * up``, HF transformers'
``_default_apply_gate``) is a problem field: the GEMM's N columns are the gate half followed by
the up half, the kernel computes both (output column j pairs GEMM columns j and j + N/2) and
writes ``glu(acc)[..., j] = act(acc[..., j]) * acc[..., j + N/2]``, N/2 columns. The epilogue
then runs on that product, so its inputs are shaped like the (…, N/2) output.

Block-scaled grouped GEMMs (``F.scaled_grouped_mm``, MoE experts in MXFP8, MXFP4, NVFP4) are
the same problem with the block-scale recipe as its ``dtype``, as
:class:`~tilewright.problem.GemmProblem` has it ("mxfp8", "mxfp4", "nvfp4": values and one
scale per 16 or 32 values along K): the 2d3d case only, A (M_total, K/pack) rows of packed K,
B stored (G, N, K/pack) (``layout_b == "col"``), row-major block scales (M_total, K/block) and
(G, N, K/block); ``global_scales`` adds NVFP4's fp32 per-group decode scales, (G,) for each
operand, their product the group's alpha, applied to the accumulator before the gated product
and the epilogue. Kernels take ``launch(a, b, offs, a_scale, b_scale[, global_a, global_b],
*epilogue_inputs, out=None)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import (ELEMENT_BYTES, SCALED_FORMATS, VALUES_PER_BYTE, EpilogueInput, EpilogueOp,
                                decode_epilogue, json_digest)

CASES = ("2d3d", "2d2d", "3d2d", "3d3d")
RAGGED = {"2d3d": "M", "2d2d": "K", "3d2d": "N", "3d3d": ""}
OFFSET_KINDS = ("even",)
GLU_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu", "sigmoid", "tanh")
ALIGN = 16  # synthetic groups are multiples of this (when the total allows)


def case_of(a_dim: int, b_dim: int) -> str:
    """The shape case of operands with these ranks; ValueError names the accepted ranks."""
    case = f"{a_dim}d{b_dim}d"
    if case not in CASES:
        raise ValueError(f"grouped GEMM operands must be 2-D or 3-D, got a {a_dim}-D and a {b_dim}-D "
                         f"tensor (cases: {', '.join(CASES)})")
    return case


@dataclass(frozen=True)
class GroupedGemmProblem:
    """One grouped GEMM with its fused epilogue, as templates and the autotuner see it.

    Attributes:
        case: "2d3d", "2d2d", "3d2d" or "3d3d" (see the module docstring).
        G: number of groups.
        M, N, K: sizes; the ragged one (``ragged``) is the *total* over all groups (M for 2d3d,
            K for 2d2d, N for 3d2d), the others are per group. Tuned at a bucket when dynamic.
        dtype, out_dtype: operand and output element types ("fp32", "fp16", "bf16"; a fused
            cast changes out_dtype). A block-scale recipe ("mxfp8", "mxfp4", "nvfp4") as dtype
            makes it a block-scaled grouped GEMM (module docstring; out_dtype defaults to bf16).
        layout_a, layout_b: "row" / "col" / "strided" as in GemmProblem (kernels take any
            strides; recorded for the cache key and the cost model).
        epilogue, epilogue_inputs, epilogue_ir: as GemmProblem's; input patterns are over
            (B = group, M, N) of the output, see the module docstring.
        dynamic: dims ("M", "N", "K") whose size varies at run time.
        offsets: how the tuning offsets were made ("even": :func:`synthetic_offsets`).
        glu: "" or the gate's activation (one of GLU_ACTIVATIONS) of a gated product fused
            after the GEMM (module docstring): N is then the GEMM's width (gate and up halves,
            even, not ragged) and the output has N/2 columns.
        op: the ATen op it came from, for display.
        global_scales: NVFP4 only: fp32 per-group decode scales for A and B, (G,) each, whose
            product scales each group's accumulator (``F.scaled_grouped_mm``'s
            ``[BlockWise1x16, TensorWise]`` recipe).
    """

    case: str
    G: int
    M: int
    N: int
    K: int
    dtype: str
    out_dtype: str = ""
    layout_a: str = "row"
    layout_b: str = "row"
    epilogue: tuple[EpilogueOp, ...] = ()
    epilogue_inputs: tuple[EpilogueInput, ...] = ()
    epilogue_ir: str = ""
    dynamic: frozenset[str] = field(default_factory=frozenset)
    offsets: str = "even"
    glu: str = ""
    op: str = "grouped_mm"
    global_scales: bool = False

    kind = "grouped_gemm"  # class attribute: the problem kind (not a field)

    def __post_init__(self) -> None:
        if self.case not in CASES:
            raise ValueError(f"grouped GEMM case {self.case!r}; known: {CASES}")
        if self.offsets not in OFFSET_KINDS:
            raise ValueError(f"offsets {self.offsets!r}; known: {OFFSET_KINDS}")
        if self.epilogue_ir and self.epilogue:
            raise ValueError("an epilogue is either a list of kinds or IR, not both")
        if not self.out_dtype:
            object.__setattr__(self, "out_dtype", "bf16" if self.dtype in SCALED_FORMATS else self.dtype)
        if self.dtype in SCALED_FORMATS:
            self._check_block_scaled()
        elif self.global_scales:
            raise ValueError(f"global_scales are NVFP4's per-group decode scales, not for a {self.dtype} problem")
        for name in ("G", "M", "N", "K"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"GroupedGemmProblem.{name} must be a non-negative int, got {v!r}")
        if self.G < 1:
            raise ValueError("a grouped GEMM needs at least one group")
        if self.glu:
            if self.glu not in GLU_ACTIVATIONS:
                raise ValueError(f"glu activation {self.glu!r}; known: {', '.join(GLU_ACTIVATIONS)}")
            if self.ragged == "N":
                raise ValueError("a gated product (glu) splits each group's N columns in halves: the 3d2d "
                                 "case's N is ragged (its groups are columns), use glu with 2d3d, 2d2d or 3d3d")
            if self.N % 2:
                raise ValueError(f"a gated product (glu) needs an even N (gate and up halves), got N={self.N}")
        for op in self.epilogue:
            if op.input is not None and not 0 <= op.input < len(self.epilogue_inputs):
                raise ValueError(f"epilogue input index {op.input} out of range")
        for inp in self.epilogue_inputs:
            if "B" in inp.broadcast and not self.out_3d and self.case != "2d3d":
                raise ValueError(f"a per-group epilogue input ({inp.broadcast!r}) of the {self.case} case: "
                                 f"its output rows and columns do not each belong to one group")
            if "M" in inp.broadcast and "B" in inp.broadcast and not self.out_3d:
                raise ValueError(f"pattern {inp.broadcast!r}: a 2-D output's rows are already per group; "
                                 f"use 'MN' for a full output-shaped tensor")

    def _check_block_scaled(self) -> None:
        if self.case != "2d3d":
            raise ValueError(f"a block-scaled grouped GEMM ({self.dtype}) is the 2d3d case (the MoE forward), "
                             f"not {self.case}")
        if self.layout_a != "row" or self.layout_b != "col":
            raise ValueError(f"{self.dtype} grouped GEMMs take A (M, K) row-major and B stored (G, N, K): "
                             f"layout_a='row', layout_b='col'")
        if self.K % SCALED_FORMATS[self.dtype] and "K" not in self.dynamic:
            raise ValueError(f"{self.dtype} needs K divisible by its {SCALED_FORMATS[self.dtype]}-value blocks, "
                             f"got K={self.K}")
        if self.global_scales and self.dtype != "nvfp4":
            raise ValueError(f"global_scales are NVFP4's per-group decode scales, not {self.dtype}'s")
        if self.out_dtype not in ("fp32", "fp16", "bf16"):
            raise ValueError(f"a block-scaled grouped GEMM writes fp32/fp16/bf16, not {self.out_dtype}")

    # -- shapes ---------------------------------------------------------------------------------
    @property
    def block_scaled(self) -> bool:
        """A and B carry per-block scales (dtype is a recipe of ``SCALED_FORMATS``)."""
        return self.dtype in SCALED_FORMATS

    @property
    def block(self) -> int:
        """Values per block scale along K (0 when not block-scaled)."""
        return SCALED_FORMATS.get(self.dtype, 0)

    @property
    def pack(self) -> int:
        """K values per stored byte of a block-scaled operand (1 otherwise)."""
        return VALUES_PER_BYTE.get(self.dtype, 1)

    @property
    def ragged(self) -> str:
        """The dim ``offs`` runs along ("M", "K", "N"; "" for 3d3d)."""
        return RAGGED[self.case]

    @property
    def active_groups(self) -> int:
        """Groups that can hold rows: with the tokens ragged (2d3d) at most one per token, so a
        decode step of a few tokens over many experts touches only those experts' weights (the
        grouped cost models and the Metal gemv's decode test use it)."""
        return max(1, min(self.G, self.M)) if self.ragged == "M" else self.G

    @property
    def out_3d(self) -> bool:
        return self.case in ("2d2d", "3d3d")

    @property
    def a_shape(self) -> tuple[int, ...]:
        return (self.M, self.K) if self.case.startswith("2d") else (self.G, self.M, self.K)

    @property
    def b_shape(self) -> tuple[int, ...]:
        return (self.K, self.N) if self.case.endswith("2d") else (self.G, self.K, self.N)

    @property
    def out_n(self) -> int:
        """The output's columns: N, or N/2 under a fused gated product (``glu``)."""
        return self.N // 2 if self.glu else self.N

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.G, self.M, self.out_n) if self.out_3d else (self.M, self.out_n)

    def input_shape(self, inp: EpilogueInput) -> tuple[int, ...]:
        """The natural shape of an epilogue input (one dim per pattern letter; N is the
        output's columns, N/2 under ``glu``)."""
        size = {"B": self.G, "M": self.M, "N": self.out_n}
        return tuple(size[d] for d in inp.broadcast)

    # -- derived quantities ---------------------------------------------------------------------
    @property
    def flops(self) -> int:
        """Multiply-adds counted as 2 FLOPs (the ragged dim is summed over groups once)."""
        return 2 * self.M * self.N * self.K * (self.G if self.case == "3d3d" else 1)

    @property
    def min_bytes(self) -> int:
        """A, B, out and the epilogue inputs, each crossing memory once."""
        def n(shape: Sequence[int]) -> int:
            out = 1
            for s in shape:
                out *= s
            return out
        e_in, e_out = ELEMENT_BYTES[self.dtype], ELEMENT_BYTES[self.out_dtype]
        total = (n(self.a_shape) + n(self.b_shape)) * e_in + n(self.out_shape) * e_out + 4 * self.G
        for inp in self.epilogue_inputs:
            total += n(self.input_shape(inp)) * ELEMENT_BYTES.get(inp.dtype, 4)
        return int(total + 8 * self.G * self.global_scales)

    def with_sizes(self, **sizes: int) -> "GroupedGemmProblem":
        return dataclasses.replace(self, **sizes)

    def as_gemm(self) -> GemmProblem:
        """A GemmProblem with the same dtypes and epilogue (for the epilogue's IR and the
        tolerance); its sizes are a group's share, for display only."""
        scaled = dict(layout_b="col", scale_layout="row") if self.block_scaled else {}
        return GemmProblem(M=self.M, N=self.out_n, K=self.K, dtype=self.dtype, out_dtype=self.out_dtype,
                           batch=self.G if self.out_3d else 1, batched=self.out_3d, **scaled,
                           epilogue=self.epilogue, epilogue_inputs=self.epilogue_inputs,
                           epilogue_ir=self.epilogue_ir, op=self.op)

    # -- identity -------------------------------------------------------------------------------
    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["dynamic"] = sorted(self.dynamic)
        d["kind"] = self.kind
        if not d["epilogue_ir"]:
            del d["epilogue_ir"]
        for key in ("glu", "global_scales"):  # absent unless set: older cache entries keep their keys
            if not d[key]:
                del d[key]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "GroupedGemmProblem":
        d = dict(d)
        d.pop("kind", None)
        return cls(**decode_epilogue(d))

    def stable_hash(self) -> str:
        return json_digest(self.to_json())

    def describe_epilogue(self) -> str:
        text = self.as_gemm().describe_epilogue()
        return f"{self.glu}(gate)*up, then {text}" if self.glu else text

    def describe(self) -> str:
        cast = f"→{self.out_dtype}" if self.out_dtype != self.dtype else ""
        ragged = f" ragged {self.ragged}" if self.ragged else ""
        alpha = " per-group alpha" if self.global_scales else ""
        return (f"{self.op} {self.case} G={self.G} {self.M}x{self.N}x{self.K}{ragged} {self.dtype}{alpha}{cast} "
                f"A:{self.layout_a} B:{self.layout_b} offsets: {self.offsets} "
                f"epilogue: {self.describe_epilogue()}")


# -- offsets ------------------------------------------------------------------------------------
def synthetic_offsets(problem: GroupedGemmProblem, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The tuning offsets: the ragged total split evenly over the groups, each group a multiple
    of 16 when the total allows, the last group taking the rest (int32 end offsets on
    ``device``); None for the 3d3d case, which has none."""
    if not problem.ragged:
        return None
    total = getattr(problem, problem.ragged)
    share = total // problem.G
    if share >= ALIGN:
        share -= share % ALIGN
    ends = [share * (g + 1) for g in range(problem.G - 1)] + [total]
    return torch.tensor(ends, dtype=torch.int32, device=device)


def group_starts_ends(offs: torch.Tensor) -> tuple[list[int], list[int]]:
    """Host copies of each group's [start, end) (a device sync: reference and fallback only)."""
    ends = [int(v) for v in offs.tolist()]
    return [0] + ends[:-1], ends


def broadcast_epilogue_input(problem: GroupedGemmProblem, t: torch.Tensor, inp: EpilogueInput,
                             offs: torch.Tensor | None, rows: int) -> torch.Tensor:
    """An epilogue input in its natural shape, broadcast to the output shape (``rows``: the
    output's rows at this call). A per-group input of the 2d3d case is gathered at each row's
    group, found on the device (searchsorted over the end offsets: no host sync)."""
    if not problem.out_3d and "B" in inp.broadcast:
        gid = torch.searchsorted(offs.to(torch.int64), torch.arange(rows, device=t.device), right=True).clamp_(max=t.shape[0] - 1)
        t = t[gid]  # (M, N) or (M,)
        return t if t.dim() == 2 else t[:, None]
    dims = ("B", "M", "N") if problem.out_3d else ("M", "N")
    shape = [t.shape[inp.broadcast.index(d)] if d in inp.broadcast else 1 for d in dims]
    return t.reshape(shape)
