"""NVFP4 ops: activation quantisation and the NVFP4 GEMM, as ``torch.library`` custom ops.

``torch.ops.tilewright.nvfp4_mm`` is what the compiler lowers to one GEMM node: the two
per-tensor decode scales (alpha = global_scale_a × global_scale_b) and the bias become
epilogue steps of that GEMM, so no separate dequantise or scale kernel runs.
"""

from __future__ import annotations

from typing import Optional

import torch

from tilewright.errors import InvalidInputError
from tilewright.kernels.launchers import tuned_launcher
from tilewright.kernels.mx import block_scaled_problem
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.quant.ops import nvfp4_quantize  # noqa: F401 - the public op, defined with the format


def nvfp4_problem(M: int, N: int, K: int, out_dtype: torch.dtype, bias: torch.Tensor | None) -> GemmProblem:
    """The GEMM ``nvfp4_mm`` runs: alpha as two scalar multiplies, then the bias."""
    return block_scaled_problem("nvfp4", M, N, K, out_dtype, 2, bias, "nvfp4_mm")


@torch.library.custom_op("tilewright::nvfp4_mm", mutates_args=())
def nvfp4_mm(a: torch.Tensor, a_scale: torch.Tensor, a_global_scale: torch.Tensor,
             b: torch.Tensor, b_scale: torch.Tensor, b_global_scale: torch.Tensor,
             bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    """``dequant(a) @ dequant(b).T * (gs_a * gs_b) + bias``: a uint8 (M, K/2), b uint8 (N, K/2)
    (an NVFP4 weight as stored), scales float8_e4m3fn (rows, K/16), global scales fp32 ().

    Raises:
        InvalidInputError: shapes or dtypes that do not describe NVFP4 operands.
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise InvalidInputError(f"nvfp4_mm: a {tuple(a.shape)} and b {tuple(b.shape)} must be (M, K/2) and (N, K/2)")
    if a_scale.shape != (a.shape[0], a.shape[1] // 8) or b_scale.shape != (b.shape[0], b.shape[1] // 8):
        raise InvalidInputError("nvfp4_mm: block scales must be (rows, K/16), row-major")
    M, N, K = a.shape[0], b.shape[0], a.shape[1] * 2
    problem = nvfp4_problem(M, N, K, out_dtype, bias)
    eps = [a_global_scale.float().expand(M, N), b_global_scale.float().expand(M, N)]
    if bias is not None:
        eps.append(bias.expand(M, N))
    return tuned_launcher(problem, a.device)(a, b, *eps, a_scale=a_scale, b_scale=b_scale)


@nvfp4_mm.register_fake
def _(a, a_scale, a_global_scale, b, b_scale, b_global_scale, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)
