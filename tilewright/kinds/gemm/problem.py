"""The GEMM kind's problem: one GEMM with its fused epilogue, as templates and the autotuner see
it (:class:`GemmProblem`), concrete sizes, dtypes, operand layouts and a fused epilogue. It knows
nothing of FX graphs; the compiler builds one from its kernel graph's ``GemmNode`` (symbolic sizes
resolved to hints or buckets, :func:`tilewright.kinds.gemm.kind.gemm_problem`), the offline
warmer from a shape list. Sizes are plain ints; ``dynamic`` names the dimensions that vary at run
time, so templates keep those generic (masks, 64-bit indexing).

The GEMM is ``out[b] = epilogue(A[b] @ B[b])`` with A of shape (batch, M, K), B (batch, K, N),
out (batch, M, N), accumulated in fp32. It moved here from :mod:`tilewright.problem` (issue 30),
where the name resolves for one release with a DeprecationWarning; the dtype tables and the
epilogue steps stay there, shared with the other kinds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from tilewright.problem import ELEMENT_BYTES, SCALED_FORMATS, EpilogueInput, EpilogueOp, decode_epilogue, json_digest


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM with its fused epilogue, as templates and the autotuner see it.

    Attributes:
        M, N, K: sizes (ints; a dynamic size holds the hint or bucket it is tuned at).
        batch: batch count (1 for a plain 2-D GEMM; ``batched`` tells bmm from mm).
        dtype: A and B element type ("fp32", "fp16", "bf16").
        out_dtype: output element type (a fused cast changes it).
        layout_a: "row" (K contiguous), "col" (M contiguous) or "strided".
        layout_b: "row" (N contiguous), "col" (K contiguous) or "strided".
        epilogue, epilogue_inputs: the fused elementwise steps and the tensors they read.
        dynamic: names of dims ("M", "N", "K", "batch") whose size varies at run time.
        op: the ATen op it came from ("mm", "addmm", "bmm", "baddbmm", "linear"), for display.
        scale_layout: for block-scaled dtypes (``SCALED_FORMATS``), how the block scales are
            stored: "row" ((rows, K/block) row-major) or "swizzled" (the 128x4 tiled layout of
            Blackwell's block-scaled MMA, ``tilewright.quant.nvfp4.swizzle_scales``); "" else.
        store_acc: the kernel also writes the product itself, before its epilogue, as a second
            output in ``dtype`` (the GEMM's own value is needed elsewhere too, e.g. saved for
            the backward): ``launch(..., out=(out, acc_out))`` returns both.
        acc_after: with ``store_acc``, how many leading epilogue steps the stored product
            includes (an addmm's bias: the GEMM node's own value is ``acc + bias``).
        epilogue_ir: an epilogue that is not a list of the kinds above: any pointwise chain, as
            the JSON of an expression-IR DAG (:func:`tilewright.ir.epilogue.problem_epilogue`)
            over ``acc`` and the loads of ``e{k}`` (``epilogue_inputs[k]``); ``epilogue`` is
            then empty.

    Block-scaled problems: A is (M, K) and B is stored as (N, K) (``layout_b == "col"``), both
    packed along K; ``launch(a, b, *epilogue_inputs, a_scale=..., b_scale=...)`` receives the
    scales; the per-tensor global scales are epilogue multiplies (alpha).
    """

    M: int
    N: int
    K: int
    dtype: str
    out_dtype: str = ""
    batch: int = 1
    batched: bool = False
    layout_a: str = "row"
    layout_b: str = "row"
    epilogue: tuple[EpilogueOp, ...] = ()
    epilogue_inputs: tuple[EpilogueInput, ...] = ()
    dynamic: frozenset[str] = field(default_factory=frozenset)
    op: str = "mm"
    scale_layout: str = ""
    store_acc: bool = False
    acc_after: int = 0
    epilogue_ir: str = ""

    kind: ClassVar[str] = "gemm"  # the problem kind (tilewright.kinds); not a field, not in the JSON

    def __post_init__(self) -> None:
        if self.epilogue_ir and self.epilogue:
            raise ValueError("an epilogue is either a list of kinds or IR, not both")
        if self.acc_after and (not self.store_acc or self.epilogue_ir or self.acc_after > len(self.epilogue)):
            raise ValueError("acc_after counts leading epilogue kinds of a problem that stores its product")
        if self.store_acc and self.dtype not in ("fp32", "fp16", "bf16"):
            raise ValueError(f"store_acc needs float operands, not {self.dtype}")
        if not self.out_dtype:
            object.__setattr__(self, "out_dtype", "bf16" if self.dtype in SCALED_FORMATS else self.dtype)
        if self.dtype in SCALED_FORMATS:
            if self.scale_layout not in ("row", "swizzled"):
                raise ValueError(f"{self.dtype} problems need scale_layout 'row' or 'swizzled'")
            if self.K % SCALED_FORMATS[self.dtype] and "K" not in self.dynamic:
                raise ValueError(f"{self.dtype} needs K divisible by {SCALED_FORMATS[self.dtype]}")
        elif self.scale_layout:
            raise ValueError(f"scale_layout is only for block-scaled dtypes, not {self.dtype}")
        for name in ("M", "N", "K", "batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"GemmProblem.{name} must be a non-negative int, got {v!r}")
        for op in self.epilogue:
            if op.input is not None and not 0 <= op.input < len(self.epilogue_inputs):
                raise ValueError(f"epilogue input index {op.input} out of range")

    # -- derived quantities -------------------------------------------------------------------
    @property
    def flops(self) -> int:
        """Multiply-adds counted as 2 FLOPs."""
        return 2 * self.batch * self.M * self.N * self.K

    @property
    def block_scaled(self) -> bool:
        """A and B carry per-block scales (nvfp4, mxfp4, mxfp8)."""
        return self.dtype in SCALED_FORMATS

    @property
    def min_bytes(self) -> int:
        """Bytes that must cross memory at least once: A, B, out and epilogue inputs."""
        e_in, e_out = ELEMENT_BYTES[self.dtype], ELEMENT_BYTES[self.out_dtype]
        total = self.batch * (self.M * self.K + self.K * self.N) * e_in
        total += self.batch * self.M * self.N * e_out
        if self.store_acc:
            total += self.batch * self.M * self.N * e_in
        sizes = {"": 1, "M": self.M, "N": self.N, "MN": self.M * self.N}
        for inp in self.epilogue_inputs:
            b = self.batch if inp.broadcast.startswith("B") else 1
            total += b * sizes[inp.broadcast.lstrip("B")] * ELEMENT_BYTES.get(inp.dtype, 4)
        return int(total)

    def with_sizes(self, **sizes: int) -> "GemmProblem":
        return dataclasses.replace(self, **sizes)

    def transposed(self) -> "GemmProblem":
        """The problem of computing C^T = B^T A^T (swap-AB): M and N trade places, each
        operand's layout flips, and epilogue inputs broadcast over the swapped dims."""
        flip = {"row": "col", "col": "row", "strided": "strided"}
        swap = str.maketrans("MN", "NM")
        inputs = tuple(EpilogueInput("".join(sorted(i.broadcast.translate(swap), key="BMN".index)), i.dtype)
                       for i in self.epilogue_inputs)
        dynamic = frozenset({"M": "N", "N": "M"}.get(d, d) for d in self.dynamic)
        ir = self.epilogue_ir
        if ir:  # the inputs' loads swap their m and n too
            from tilewright.ir.epilogue import swap_mn

            ir = swap_mn(ir)
        return dataclasses.replace(self, M=self.N, N=self.M, layout_a=flip[self.layout_b],
                                   layout_b=flip[self.layout_a], epilogue_inputs=inputs, dynamic=dynamic,
                                   epilogue_ir=ir)

    # -- identity -----------------------------------------------------------------------------
    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["dynamic"] = sorted(self.dynamic)
        for name in ("store_acc", "acc_after", "epilogue_ir"):
            if not d[name]:
                del d[name]  # problems without it keep the keys they always had
        return d

    @classmethod
    def from_json(cls, d: dict) -> "GemmProblem":
        d = dict(d)
        return cls(**decode_epilogue(d))

    def stable_hash(self) -> str:
        return json_digest(self.to_json())

    def describe_epilogue(self) -> str:
        if self.epilogue_ir:
            from tilewright.ir.epilogue import problem_epilogue
            from tilewright.ir.expr import render

            text = "ir: " + render(problem_epilogue(self), 5)
        else:
            text = " → ".join(op.describe(self.epilogue_inputs) for op in self.epilogue) or "-"
        return f"(store acc) {text}" if self.store_acc else text

    def describe(self) -> str:
        b = f"{self.batch}x" if self.batched else ""
        cast = f"→{self.out_dtype}" if self.out_dtype != self.dtype else ""
        return (f"{self.op} {b}{self.M}x{self.N}x{self.K} {self.dtype}{cast} "
                f"A:{self.layout_a} B:{self.layout_b} epilogue: {self.describe_epilogue()}")
