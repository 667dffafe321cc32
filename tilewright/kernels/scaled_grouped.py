"""Block-scaled grouped GEMM (MoE experts in MXFP8, MXFP4 or NVFP4): what the compiler lowers
PyTorch's ``F.scaled_grouped_mm`` / ``torch._scaled_grouped_mm`` to
(:mod:`tilewright.kinds.grouped_gemm.lower_scaled`), as ``torch.ops.tilewright.scaled_grouped_mm``.

The 2d3d case only (the MoE forward): ``a`` (M_total, K) tokens in ragged groups, ``offs``
their int32 end offsets, ``b`` (G, N, K) one weight per expert as stored (K innermost; what
``mat_b.transpose(-2, -1)`` of torch's call is), each with row-major block scales, (M_total,
K/block) and (G, N, K/block). A call is a
:class:`~tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem` whose dtype is the recipe
(:func:`scaled_grouped_problem`; the token count bucketed), run by the kernel the autotuner chose
among the grouped kind's candidates: ``triton.grouped_gemm_scaled`` (dequantising in its
prologue, every Triton target and the CPU interpreted), ``triton.grouped_gemm_scaled_mma``
(``tl.dot_scaled``: block-scaled MMA on sm_100a and gfx950) and ``aten.grouped_gemm``
(dequantised with torch). In a compiled graph the call is a kernel node of the grouped kind.

Decoding torch's scale layouts (swizzled per group, :mod:`tilewright.quant.scales`) to the
row-major matrices is two more ops, ``tilewright.grouped_scales_rows`` and
``tilewright.stacked_scales_rows``, run before the GEMM (one pass over 1/16 to 1/32 of the
operands' bytes, on the device; the offsets are never read on the host).
"""

from __future__ import annotations

from typing import Optional

import torch

from tilewright.autotune.buckets import bucket
from tilewright.errors import InvalidInputError
from tilewright.kinds.grouped_gemm.problem import GLU_ACTIVATIONS, GroupedGemmProblem
from tilewright.problem import DTYPE_NAMES, SCALED_FORMATS, UNARY_EPILOGUES, VALUES_PER_BYTE, EpilogueOp
from tilewright.quant import dequantize_block_scaled, scales

SCALE_DTYPES = {"mxfp4": torch.float8_e8m0fnu, "mxfp8": torch.float8_e8m0fnu, "nvfp4": torch.float8_e4m3fn}
OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def scaled_grouped_problem(a: torch.Tensor, b: torch.Tensor, *, fmt: str, out_dtype: torch.dtype,
                           activation: str = "none", glu: str = "none", global_scales: bool = False,
                           bucketed: bool = True) -> GroupedGemmProblem:
    """The problem of one call (a (M_total, K/pack), b (G, N, K/pack) as stored): the recipe as
    its dtype, the token count at its bucket and marked dynamic (``bucketed``; the compiler
    passes False with a static count), the activation as its epilogue.

    Raises:
        ValueError: sizes the problem refuses (K not whole scale blocks, an odd N under glu).
    """
    M, (G, N, Kp) = a.shape[0], b.shape
    return GroupedGemmProblem(
        case="2d3d", G=max(int(G), 1), M=bucket(int(M)) if bucketed else int(M), N=int(N),
        K=int(Kp) * VALUES_PER_BYTE[fmt], dtype=fmt, out_dtype=DTYPE_NAMES[out_dtype], layout_b="col",
        epilogue=(EpilogueOp(activation),) if activation != "none" else (),
        dynamic=frozenset({"M"}) if bucketed else frozenset(), glu="" if glu == "none" else glu,
        global_scales=global_scales, op="scaled_grouped_mm")


def _check(a, a_scale, b, b_scale, offs, global_a, global_b, fmt, out_dtype, activation, glu) -> None:
    if fmt not in SCALED_FORMATS:
        raise InvalidInputError(f"scaled_grouped_mm: format {fmt!r}; known: {', '.join(SCALED_FORMATS)}")
    if out_dtype not in OUT_DTYPES:
        raise InvalidInputError(f"scaled_grouped_mm: out_dtype {out_dtype}; pass float32, float16 or bfloat16")
    if activation not in ("none", *UNARY_EPILOGUES):
        raise InvalidInputError(f"scaled_grouped_mm: activation {activation!r}; known: none, {', '.join(UNARY_EPILOGUES)}")
    if glu not in ("none", *GLU_ACTIVATIONS):
        raise InvalidInputError(f"scaled_grouped_mm: glu {glu!r}; known: none, {', '.join(GLU_ACTIVATIONS)}")
    if glu != "none" and b.shape[1] % 2:
        raise InvalidInputError(f"scaled_grouped_mm: a gated product (glu) needs an even N, got {b.shape[1]}")
    if a.dim() != 2 or b.dim() != 3 or a.shape[1] != b.shape[2]:
        raise InvalidInputError(f"scaled_grouped_mm takes a (M_total, K/pack) and b (G, N, K/pack) as stored; "
                                f"got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.stride(1) != 1 or b.stride(2) != 1:
        raise InvalidInputError("scaled_grouped_mm: a and b must be contiguous along K (row-major a, b stored (G, N, K))")
    M, (G, N, Kp) = a.shape[0], b.shape
    K, block = Kp * VALUES_PER_BYTE[fmt], SCALED_FORMATS[fmt]
    if K % block:
        raise InvalidInputError(f"scaled_grouped_mm {fmt}: K={K} is not a multiple of its {block}-value blocks")
    if tuple(a_scale.shape) != (M, K // block) or tuple(b_scale.shape) != (G, N, K // block):
        raise InvalidInputError(f"scaled_grouped_mm: row-major scales ({M}, {K // block}) and ({G}, {N}, {K // block}) "
                                f"expected, got {tuple(a_scale.shape)} and {tuple(b_scale.shape)}")
    if a_scale.stride(-1) != 1 or b_scale.stride(-1) != 1:
        raise InvalidInputError("scaled_grouped_mm: scales must be contiguous along their blocks")
    if offs is None or offs.dtype != torch.int32 or tuple(offs.shape) != (G,) or offs.device != a.device:
        raise InvalidInputError(f"scaled_grouped_mm needs offs, int32 end offsets of shape ({G},) on {a.device}")
    if (global_a is None) != (global_b is None):
        raise InvalidInputError("scaled_grouped_mm: pass both per-group global scales or neither")
    if global_a is not None:
        if fmt != "nvfp4" or global_a.numel() != G or global_b.numel() != G or \
                global_a.dtype != torch.float32 or global_b.dtype != torch.float32:
            raise InvalidInputError(f"scaled_grouped_mm: global scales are NVFP4's, fp32 with one value per group ({G})")


def scaled_grouped_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                      offs: torch.Tensor, global_a: torch.Tensor | None = None,
                      global_b: torch.Tensor | None = None, *, fmt: str = "mxfp8",
                      out_dtype: torch.dtype = torch.bfloat16, activation: str = "none",
                      glu: str = "none") -> torch.Tensor:
    """``activation(alpha_g * dequant(a[rows of g]) @ dequant(b[g]).T)`` for each row group g.

    Args:
        a: (M_total, K) float8_e4m3fn (mxfp8) or (M_total, K/2) packed E2M1 bytes
            (float4_e2m1fn_x2 or uint8; mxfp4, nvfp4), K innermost.
        a_scale: (M_total, K/block) row-major block scales: float8_e8m0fnu (MX, block 32; or its
            uint8 bytes) or float8_e4m3fn (NVFP4, block 16).
        b: (G, N, K) or (G, N, K/2): each expert's weight as stored, K innermost.
        b_scale: (G, N, K/block).
        offs: int32 end offsets of the row groups, (G,), on a's device (never read on the host).
        global_a, global_b: NVFP4's fp32 per-group decode scales, (G,) each (alpha = their product).
        fmt: "mxfp8", "mxfp4" or "nvfp4"; out_dtype: float32, float16 or bfloat16;
        activation: "none" or a unary epilogue kind, applied to the fp32 accumulator.
        glu: "none" or the gate's activation of a gated product (the MoE gate_up projection):
            the N columns are the gate half then the up half, the result ``glu(gate) * up``
            (N/2 columns), then ``activation``.

    Returns:
        (M_total, N) (N/2 with ``glu``) of ``out_dtype``, from the kernel the autotuner chose for
        the call's problem (:func:`scaled_grouped_problem`); rows past ``offs[-1]`` are
        unspecified (the Triton kernels leave them unwritten, ATen's writes zeros). Where no
        Triton template serves the chip (an sm_80 has no e4m3 conversions) ATen's runs.

    Raises:
        InvalidInputError: shapes, dtypes, layouts or offsets that do not fit (the message says which).
    """
    from tilewright.kernels.launchers import tuned_launcher

    _check(a, a_scale, b, b_scale, offs, global_a, global_b, fmt, out_dtype, activation, glu)
    problem = scaled_grouped_problem(a, b, fmt=fmt, out_dtype=out_dtype, activation=activation, glu=glu,
                                     global_scales=global_a is not None)
    extra = [global_a.reshape(-1).contiguous(), global_b.reshape(-1).contiguous()] if global_a is not None else []
    return tuned_launcher(problem, a.device)(a, b, offs, a_scale, b_scale, *extra)



def reference(a, a_scale, b, b_scale, offs, global_a=None, global_b=None, *, fmt="mxfp8",
              activation="none", glu="none") -> torch.Tensor:
    """The float64 result of :func:`scaled_grouped_mm` (dequantised operands, a loop over the
    groups with host offsets); rows past ``offs[-1]`` are NaN."""
    from tilewright.kinds.grouped_gemm.problem import group_starts_ends
    import torch.nn.functional as F

    raw = (lambda t: t.view(torch.uint8)) if VALUES_PER_BYTE[fmt] == 2 else (lambda t: t)
    A = dequantize_block_scaled(fmt, raw(a), a_scale, torch.float64)
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.float64)
    for g, (s, e) in enumerate(zip(*group_starts_ends(offs.cpu()))):
        if e <= s:
            continue
        B = dequantize_block_scaled(fmt, raw(b[g]), b_scale[g], torch.float64)
        y = A[s:e] @ B.t()
        if global_a is not None:
            y = y * (global_a.reshape(-1)[g].double() * global_b.reshape(-1)[g].double())
        out[s:e] = y
    acts = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid,
            "tanh": torch.tanh, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}
    if glu != "none":
        gate, up = out.chunk(2, -1)
        out = acts[glu](gate) * up
    return acts[activation](out)


@torch.library.custom_op("tilewright::scaled_grouped_mm", mutates_args=())
def _scaled_grouped_mm_op(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                          offs: torch.Tensor, global_a: Optional[torch.Tensor], global_b: Optional[torch.Tensor],
                          fmt: str, out_dtype: torch.dtype, activation: str = "none",
                          glu: str = "none") -> torch.Tensor:
    """:func:`scaled_grouped_mm` as the compiler's op (what ``_scaled_grouped_mm`` lowers to)."""
    return scaled_grouped_mm(a, a_scale, b, b_scale, offs, global_a, global_b, fmt=fmt, out_dtype=out_dtype,
                             activation=activation, glu=glu)


@_scaled_grouped_mm_op.register_fake
def _(a, a_scale, b, b_scale, offs, global_a, global_b, fmt, out_dtype, activation="none", glu="none"):
    return a.new_empty((a.shape[0], b.shape[1] // 2 if glu != "none" else b.shape[1]), dtype=out_dtype)


@torch.library.custom_op("tilewright::grouped_scales_rows", mutates_args=())
def grouped_scales_rows(scale: torch.Tensor, offs: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Row-major (rows, cols) scales of a 2-D operand in ragged row groups from torch's
    per-group SWIZZLE_32_4_4 layout (:func:`tilewright.quant.scales.unswizzle_groups`)."""
    return scales.unswizzle_groups(scale, offs, rows, cols)


@grouped_scales_rows.register_fake
def _(scale, offs, rows, cols):
    return scale.new_empty((rows, cols))


@torch.library.custom_op("tilewright::stacked_scales_rows", mutates_args=())
def stacked_scales_rows(scale: torch.Tensor, groups: int, rows: int, cols: int) -> torch.Tensor:
    """(groups, rows, cols) row-major scales from one SWIZZLE_32_4_4 block per group
    (:func:`tilewright.quant.scales.unswizzle_stacked`)."""
    return scales.unswizzle_stacked(scale, groups, rows, cols)


@stacked_scales_rows.register_fake
def _(scale, groups, rows, cols):
    return scale.new_empty((groups, rows, cols))
