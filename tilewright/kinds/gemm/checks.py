"""Fresh random inputs for a GEMM problem, laid out as the problem says, and the checks that
compare a candidate's output with the float64 reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import DTYPES

# ‖out − ref‖ / ‖ref‖ allowed per output (or input) dtype; TF32 loosens fp32 to 5e-3
REL_TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2, "fp64": 1e-10}


@dataclass
class GemmInputs:
    """Tensors for one run: a (batch?, M, K), b (batch?, K, N), epilogue inputs broadcast to the
    output shape, and a poisoned output buffer."""

    a: torch.Tensor
    b: torch.Tensor
    epilogue_inputs: list[torch.Tensor]
    a_scale: torch.Tensor | None = None  # block scales of block-scaled formats
    b_scale: torch.Tensor | None = None

    @property
    def scale_kwargs(self) -> dict[str, torch.Tensor]:
        """``a_scale=``/``b_scale=`` for ``launch`` when the problem is block-scaled."""
        if self.a_scale is None:
            return {}
        return {"a_scale": self.a_scale, "b_scale": self.b_scale}

    def as_dtype(self, dtype: torch.dtype) -> "GemmInputs":
        """Float operands and epilogue inputs in ``dtype``; packed operands and their block
        scales stay as they are (their dequantisation is exact in any float type)."""
        packed = self.a_scale is not None
        return GemmInputs(self.a if packed else self.a.to(dtype), self.b if packed else self.b.to(dtype),
                          [e.to(dtype) for e in self.epilogue_inputs], self.a_scale, self.b_scale)


_GEN_CHUNK = 1 << 24  # elements drawn at a time: a 1 GiB bf16 weight never exists in fp32 whole


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
           gen: torch.Generator) -> torch.Tensor:
    """Normal samples of ``shape`` in ``dtype`` on ``device``, drawn in float32 on the host a
    slab of rows at a time, so the peak extra memory is one slab, not the whole tensor in
    float32. The same values as one ``torch.randn(shape)`` when it fits in one slab."""
    out = torch.empty(shape, dtype=dtype, device=device)
    flat = out.view(-1, shape[-1]) if out.numel() else out
    rows = max(1, _GEN_CHUNK // max(1, shape[-1]))
    for r in range(0, flat.shape[0] if out.numel() else 0, rows):
        part = flat[r:r + rows]
        part.copy_(torch.randn(part.shape, generator=gen, dtype=torch.float32))
    return out


def _matrix(rows: int, cols: int, layout: str, batch: int | None, dtype: torch.dtype,
            device: torch.device, gen: torch.Generator) -> torch.Tensor:
    lead = (batch,) if batch is not None else ()
    if layout == "col":
        return _randn((*lead, cols, rows), dtype, device, gen).transpose(-1, -2)
    if layout == "strided":
        return _randn((*lead, rows, 2 * cols), dtype, device, gen)[..., ::2]
    return _randn((*lead, rows, cols), dtype, device, gen)


def output_shape(problem: GemmProblem) -> tuple[int, ...]:
    return (problem.batch, problem.M, problem.N) if problem.batched else (problem.M, problem.N)


def make_inputs(problem: GemmProblem, device: torch.device | str, seed: int = 0) -> GemmInputs:
    """Random normal inputs (never zeros) with the problem's layouts and dtypes."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    batch = problem.batch if problem.batched else None
    shape = output_shape(problem)
    if problem.block_scaled:
        a, a_scale, b, b_scale = _block_scaled_operands(problem, device, gen)
        return GemmInputs(a, b, _epilogue_inputs(problem, shape, device, gen), a_scale, b_scale)
    dt = DTYPES[problem.dtype]
    a = _matrix(problem.M, problem.K, problem.layout_a, batch, dt, device, gen)
    b = _matrix(problem.K, problem.N, problem.layout_b, batch, dt, device, gen)
    return GemmInputs(a, b, _epilogue_inputs(problem, shape, device, gen))


def _block_scaled_operands(problem: GemmProblem, device: torch.device, gen: torch.Generator):
    """Random NVFP4 operands (every E2M1 code, E4M3 scales spread over 2^-4..2^4) or MX ones
    (:func:`tilewright.quant.mx.random_operand`)."""
    from tilewright.quant.nvfp4 import BLOCK, swizzle_scales

    if problem.dtype in ("mxfp4", "mxfp8") and problem.scale_layout == "row":
        from tilewright.quant.mx import random_operand

        return [t.to(device) for rows in (problem.M, problem.N)
                for t in random_operand(problem.dtype, rows, problem.K, gen)]
    if problem.dtype != "nvfp4":
        raise NotImplementedError(f"random inputs for {problem.dtype}")
    out = []
    for rows in (problem.M, problem.N):
        data = torch.randint(0, 256, (rows, problem.K // 2), generator=gen, dtype=torch.uint8)
        exps = torch.randint(-4, 5, (rows, problem.K // BLOCK), generator=gen).float()
        scale = torch.exp2(exps).to(torch.float8_e4m3fn)
        if problem.scale_layout == "swizzled":
            scale = swizzle_scales(scale)
        out += [data.to(device), scale.to(device)]
    return out


def _epilogue_inputs(problem: GemmProblem, shape: tuple[int, ...], device: torch.device,
                     gen: torch.Generator) -> list[torch.Tensor]:
    eps = []
    for inp in problem.epilogue_inputs:
        pattern = inp.broadcast
        full = {"B": problem.batch, "M": problem.M, "N": problem.N}
        dims = ("B", "M", "N") if problem.batched else ("M", "N")
        real = [full[d] if d in pattern else 1 for d in dims]
        t = torch.randn(*real, generator=gen, dtype=torch.float32).to(device, DTYPES[inp.dtype])
        eps.append(t.expand(*shape))
    return eps


def poisoned_output(problem: GemmProblem, device: torch.device | str) -> torch.Tensor | tuple:
    """An output buffer full of NaN, so elements a kernel fails to write show up (a problem
    that stores its product too: the pair (out, product))."""
    out = torch.full(output_shape(problem), float("nan"), dtype=DTYPES[problem.out_dtype], device=device)
    if problem.store_acc:
        return out, torch.full(output_shape(problem), float("nan"), dtype=DTYPES[problem.dtype], device=device)
    return out


def rel_error(out: torch.Tensor | tuple, ref: torch.Tensor | tuple) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf when out has NaN/inf the reference lacks. For
    pairs (a problem storing its product too), the worse of the two."""
    if isinstance(out, tuple) or isinstance(ref, tuple):
        if not (isinstance(out, tuple) and isinstance(ref, tuple)) or len(out) != len(ref):
            return float("inf")
        return max(rel_error(o, r) for o, r in zip(out, ref))
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if o.shape != r.shape:
        return float("inf")
    bad = ~torch.isfinite(o) & torch.isfinite(r)
    if bad.any():
        return float("inf")
    # where the reference is NaN or infinite (alpha=nan, an overflow), the kernel must be too
    special = ~torch.isfinite(r)
    if special.any():
        same_nan = torch.equal(torch.isnan(o[special]), torch.isnan(r[special]))
        inf = torch.isinf(r)
        if not same_nan or not torch.equal(o[inf], r[inf]):
            return float("inf")
        o, r = o[~special], r[~special]
    denom = r.norm().item()
    num = (o - r).norm().item()
    return num / denom if denom > 0 else num


def tolerance(problem: GemmProblem, allow_tf32: bool = False) -> float:
    """The relative error a correct kernel stays under for this problem's dtypes."""
    tol = max(REL_TOLERANCE.get(problem.dtype, 1e-2), REL_TOLERANCE.get(problem.out_dtype, 1e-2))
    if problem.dtype == "fp32" and allow_tf32:
        tol = max(tol, 5e-3)
    return tol
