"""MX ops (OCP MX v1.0 MXFP4 / MXFP8): activation quantisation and the MX GEMM, as
``torch.library`` custom ops.

``torch.ops.tilewright.mx_mm`` is what the compiler lowers to one block-scaled GEMM node
(``GemmProblem(dtype=fmt, layout_b="col", scale_layout="row")``, see
:func:`tilewright.kinds.gemm.lower.lower_mx_mm`): the optional per-tensor ``alpha`` and the bias
become epilogue steps of that GEMM. Eagerly it dequantises both operands to float32 and runs
one float32 matmul and the epilogue in float32, the arithmetic of the ATen template
(``templates/aten/gemm.py.jinja``) the compiled graph falls back to and, in float64, the
autotuner's reference.
"""

from __future__ import annotations

from typing import Optional

import torch

from tilewright.errors import InvalidInputError
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import DTYPE_NAMES, SCALED_FORMATS, VALUES_PER_BYTE, EpilogueInput, EpilogueOp
from tilewright.quant import dequantize_block_scaled, mx
from tilewright.quant.ops import mx_quantize, mx_quantize_bytes  # noqa: F401 - the public ops, defined with the format

# the block scales' dtype per format (raw uint8 bytes are taken too)
SCALE_DTYPES = {"mxfp4": torch.float8_e8m0fnu, "mxfp8": torch.float8_e8m0fnu, "nvfp4": torch.float8_e4m3fn}


def block_scaled_problem(fmt: str, M: int, N: int, K: int, out_dtype: torch.dtype,
                         scalars: int, bias: torch.Tensor | None, op: str) -> GemmProblem:
    """The GEMM a block-scaled op runs (NVFP4 or MX): ``scalars`` multiplies by fp32 0-dim
    inputs (the per-tensor decode scales, alpha), then the bias add over N; K-major operands
    (B stored (N, K)) with row-major block scales."""
    ops = [EpilogueOp("mul", input=i) for i in range(scalars)]
    inputs = [EpilogueInput("", "fp32")] * scalars
    if bias is not None:
        inputs.append(EpilogueInput("N", DTYPE_NAMES[bias.dtype]))
        ops.append(EpilogueOp("add", input=scalars))
    return GemmProblem(M=M, N=N, K=K, dtype=fmt, out_dtype=DTYPE_NAMES[out_dtype], layout_b="col",
                       scale_layout="row", epilogue=tuple(ops), epilogue_inputs=tuple(inputs), op=op)


def mx_problem(M: int, N: int, K: int, fmt: str, out_dtype: torch.dtype,
               alpha: torch.Tensor | None, bias: torch.Tensor | None) -> GemmProblem:
    """The GEMM ``mx_mm`` runs (what its lowering produces)."""
    return block_scaled_problem(fmt, M, N, K, out_dtype, int(alpha is not None), bias, "mx_mm")


def _check_operands(a, a_scale, b, b_scale, fmt: str) -> int:
    """K of an ``mx_mm`` call; raises InvalidInputError for operands that are not of ``fmt``."""
    if fmt not in SCALED_FORMATS:
        raise InvalidInputError(f"mx_mm: not a block-scaled format: {fmt!r} (takes {', '.join(SCALED_FORMATS)})")
    vpb, block, sdt = VALUES_PER_BYTE[fmt], SCALED_FORMATS[fmt], SCALE_DTYPES[fmt]
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise InvalidInputError(f"mx_mm: a {tuple(a.shape)} and b {tuple(b.shape)} must be "
                                f"(M, K/{vpb}) and (N, K/{vpb})")
    K = a.shape[1] * vpb
    for name, t, s in (("a", a, a_scale), ("b", b, b_scale)):
        if s.shape != (t.shape[0], K // block) or s.dtype not in (sdt, torch.uint8):
            raise InvalidInputError(f"mx_mm: {name}_scale {tuple(s.shape)} {s.dtype} must be {sdt} "
                                    f"(rows, K/{block}) = ({t.shape[0]}, {K // block}), row-major")
    return K


@torch.library.custom_op("tilewright::mx_mm", mutates_args=())
def mx_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
          alpha: Optional[torch.Tensor], bias: Optional[torch.Tensor], fmt: str,
          out_dtype: torch.dtype) -> torch.Tensor:
    """``dequant(a) @ dequant(b).T * alpha + bias`` in float32, returned as ``out_dtype``.

    Args:
        a: activations as stored by :func:`mx_quantize`, (M, K/2) uint8 (mxfp4) or (M, K)
            float8_e4m3fn (mxfp8); a_scale float8_e8m0fnu (M, K/32).
        b: the weight as stored, (N, K/2) or (N, K), with b_scale (N, K/32).
        alpha: optional fp32 0-dim multiplier; bias: optional (N,) in any float dtype.
        fmt: "mxfp4" or "mxfp8"; or "nvfp4" (packed E2M1 with float8_e4m3fn scales (rows,
            K/16), torch's single-level NVFP4 recipe: no global scales, or their product as
            alpha).

    Raises:
        InvalidInputError: shapes or dtypes that do not describe operands of ``fmt``.
    """
    _check_operands(a, a_scale, b, b_scale, fmt)
    if fmt == "nvfp4" and a_scale.dtype == torch.uint8:  # raw bytes of E4M3 scales
        a_scale, b_scale = a_scale.view(torch.float8_e4m3fn), b_scale.view(torch.float8_e4m3fn)
    acc = dequantize_block_scaled(fmt, a, a_scale) @ dequantize_block_scaled(fmt, b, b_scale).t()
    if alpha is not None:
        acc = acc * alpha.float()
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(out_dtype)


@mx_mm.register_fake
def _(a, a_scale, b, b_scale, alpha, bias, fmt, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)
