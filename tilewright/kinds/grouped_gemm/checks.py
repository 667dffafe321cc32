"""What the autotuner needs of the grouped-GEMM kind: random inputs (on the synthetic even
offsets of :func:`~tilewright.kinds.grouped_gemm.problem.synthetic_offsets` unless given), the
NaN-poisoned output, running a launcher, the error measure (the GEMM kind's) and the float64
reference (the ATen template's float64 path, a loop over groups). Block-scaled problems get
random packed operands and row-major block scales as the dense block-scaled GEMM's checks draw
them (:func:`tilewright.kinds.gemm.checks.make_inputs`), and their per-group global scales."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem, synthetic_offsets
from tilewright.problem import DTYPES


@dataclass
class GroupedInputs:
    """Tensors for one run: the operands, the int32 end offsets (None for 3d3d) and the
    epilogue inputs in their natural shapes; a block-scaled problem's row-major block scales
    and (NVFP4 with ``global_scales``) its fp32 per-group decode scales."""

    a: torch.Tensor
    b: torch.Tensor
    offs: torch.Tensor | None
    epilogue_inputs: list[torch.Tensor]
    scales: list[torch.Tensor] = field(default_factory=list)  # [a_scale, b_scale(, global_a, global_b)]

    def as_dtype(self, dtype: torch.dtype) -> "GroupedInputs":
        """Float operands and epilogue inputs in ``dtype``; packed operands and their scales
        stay as they are (their dequantisation is exact in any float type)."""
        if self.scales:
            return GroupedInputs(self.a, self.b, self.offs, [e.to(dtype) for e in self.epilogue_inputs], self.scales)
        return GroupedInputs(self.a.to(dtype), self.b.to(dtype), self.offs,
                             [e.to(dtype) for e in self.epilogue_inputs])


def _operand(shape: tuple[int, ...], layout: str, dtype: torch.dtype, device, gen) -> torch.Tensor:
    """Random values in ``shape``; "col" stores the last two dims transposed (a view)."""
    if layout == "col":
        swapped = shape[:-2] + (shape[-1], shape[-2])
        return torch.randn(swapped, generator=gen).to(device, dtype).transpose(-1, -2)
    return torch.randn(shape, generator=gen).to(device, dtype)


def make_inputs(problem: GroupedGemmProblem, device: torch.device | str, seed: int = 0,
                offs: torch.Tensor | None = None) -> GroupedInputs:
    """Random operands and epilogue inputs, with :func:`synthetic_offsets` unless ``offs``
    is given (tests pass ragged ones)."""
    gen = torch.Generator().manual_seed(seed)
    scales: list[torch.Tensor] = []
    if problem.block_scaled:
        a, b, scales = _block_scaled(problem, device, seed)
    else:
        dt = DTYPES[problem.dtype]
        a = _operand(problem.a_shape, problem.layout_a, dt, device, gen)
        b = _operand(problem.b_shape, problem.layout_b, dt, device, gen)
    eps = [torch.randn(problem.input_shape(i), generator=gen).to(device, DTYPES[i.dtype])
           for i in problem.epilogue_inputs]
    if offs is None:
        offs = synthetic_offsets(problem, device)
    return GroupedInputs(a, b, offs, eps, scales)


def _block_scaled(problem: GroupedGemmProblem, device, seed: int):
    """Packed A (M, K/pack), B (G, N, K/pack) and their row-major scales, drawn as a dense
    block-scaled GEMM's operands are (A's M rows, then the G experts' N rows as one matrix);
    NVFP4's per-group global scales in [0.5, 1.5)."""
    from tilewright.kinds.gemm.checks import make_inputs as dense_inputs

    G, N = problem.G, problem.N
    gemm = dataclasses.replace(problem.as_gemm(), N=G * N, epilogue=(), epilogue_inputs=(), epilogue_ir="")
    x = dense_inputs(gemm, device, seed)
    b = x.b.reshape(G, N, -1)
    scales = [x.a_scale, x.b_scale.reshape(G, N, -1)]
    if problem.global_scales:
        gen = torch.Generator().manual_seed(seed + 1)
        scales += [(torch.rand(G, generator=gen) + 0.5).to(device) for _ in range(2)]
    return x.a, b, scales


def poisoned_output(problem: GroupedGemmProblem, device: torch.device | str) -> torch.Tensor:
    """The output full of NaN, so anything a kernel fails to write shows up."""
    return torch.full(problem.out_shape, float("nan"), dtype=DTYPES[problem.out_dtype], device=device)


def run(launch, x: GroupedInputs, out: torch.Tensor) -> torch.Tensor:
    return launch(x.a, x.b, x.offs, *x.scales, *x.epilogue_inputs, out=out)


def error(problem: GroupedGemmProblem, result: torch.Tensor, ref: torch.Tensor, tf32: bool) -> tuple[float, float]:
    from tilewright.kinds.gemm import checks as gemm_inputs

    return gemm_inputs.rel_error(result, ref), gemm_inputs.tolerance(problem.as_gemm(), tf32)


def reference(problem: GroupedGemmProblem, x: GroupedInputs) -> torch.Tensor:
    """The float64 result, through the ATen template's float64 path (a loop over groups)."""
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    from tilewright.runtime.loader import load_module

    rendered = get_template("aten.grouped_gemm").render(problem, {}, get_target("cpu"))
    launch = load_module(rendered.source, name=rendered.name, interpret=False).launch
    x = x.as_dtype(torch.float64)
    out = torch.empty(problem.out_shape, dtype=torch.float64, device=x.a.device)
    return launch(x.a, x.b, x.offs, *x.scales, *x.epilogue_inputs, out=out)
