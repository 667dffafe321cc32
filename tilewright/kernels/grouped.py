"""Grouped GEMM as an op: ``grouped_mm(a, b, offs)`` (``torch._grouped_mm``'s four shape cases,
see :mod:`tilewright.kinds.grouped_gemm`) with a fused epilogue, run by the kernel the autotuner chose,
and ``torch.ops.tilewright.grouped_mm``, the custom op the compiler lowers
``aten._grouped_mm`` to.

The offsets stay on the device: the problem is built from shapes only (the ragged total
bucketed, so every token count in a bucket shares one tuned kernel) and the kernel reads
``offs`` itself.
"""

from __future__ import annotations

from typing import Optional

import torch

from tilewright.autotune.buckets import bucket
from tilewright.errors import InvalidInputError
from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem, case_of
from tilewright.kernels.launchers import tuned_launcher
from tilewright.kernels.gemm import _layout
from tilewright.problem import DTYPE_NAMES, GEMM_INPUT_DTYPES, UNARY_EPILOGUES, EpilogueInput, EpilogueOp


def grouped_problem(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
                    activation: str = "none", multiply: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None, glu: str = "none") -> GroupedGemmProblem:
    """The problem of one call: sizes from the shapes (the ragged total at its bucket, marked
    dynamic), dtypes, layouts and the epilogue ``activation(acc + bias) * multiply``, where
    ``acc`` is the product or, with ``glu``, the gated product ``glu(gate) * up`` of its halves.

    Raises:
        ValueError: operands of the wrong rank, dtype or sizes; the message says which.
    """
    case = case_of(a.dim(), b.dim())
    if a.dtype != b.dtype or DTYPE_NAMES.get(a.dtype) not in GEMM_INPUT_DTYPES:
        raise ValueError(f"grouped_mm takes two fp32/fp16/bf16 operands of one dtype, got {a.dtype} and {b.dtype}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"grouped_mm: a's last dim ({a.shape[-1]}) must equal b's K dim ({b.shape[-2]})")
    if case == "2d3d":
        G, M, N, K = b.shape[0], a.shape[0], b.shape[2], a.shape[1]
    elif case == "2d2d":
        G, M, N, K = 0, a.shape[0], b.shape[1], a.shape[1]
    elif case == "3d2d":
        G, M, N, K = a.shape[0], a.shape[1], b.shape[1], a.shape[2]
    else:
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"grouped_mm 3d3d: a has {a.shape[0]} groups, b {b.shape[0]}")
        G, M, N, K = a.shape[0], a.shape[1], b.shape[2], a.shape[2]
    sizes = {"M": M, "N": N, "K": K}
    ragged = {"2d3d": "M", "2d2d": "K", "3d2d": "N"}.get(case)
    if ragged:
        sizes[ragged] = bucket(sizes[ragged])  # the token count: tuned per bucket
    ops, inputs = [], []
    if glu not in ("none", None, "") and bias is not None:
        raise ValueError("grouped_mm: a bias with glu is ambiguous (before or after the gated product?); "
                         "add it to the operands' product yourself")
    if bias is not None:
        pattern = "N" if case == "3d2d" else "BN"
        inputs.append(EpilogueInput(pattern, DTYPE_NAMES[bias.dtype]))
        ops.append(EpilogueOp("add", input=0))
    if activation not in ("none", None):
        if activation not in UNARY_EPILOGUES:
            raise ValueError(f"activation {activation!r}; known: none, {', '.join(UNARY_EPILOGUES)}")
        ops.append(EpilogueOp(activation))
    if multiply is not None:  # SwiGLU-style: silu(gate) * up, up output-shaped
        inputs.append(EpilogueInput("BMN" if case in ("2d2d", "3d3d") else "MN", DTYPE_NAMES[multiply.dtype]))
        ops.append(EpilogueOp("mul", input=len(inputs) - 1))
    return GroupedGemmProblem(
        case=case, G=max(G, 1), **sizes, dtype=DTYPE_NAMES[a.dtype],
        out_dtype=DTYPE_NAMES[out_dtype or a.dtype], layout_a=_layout(a), layout_b=_layout(b),
        epilogue=tuple(ops), epilogue_inputs=tuple(inputs),
        dynamic=frozenset({ragged}) if ragged else frozenset(), glu="" if glu in ("none", None) else glu)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, *,
               bias: torch.Tensor | None = None, activation: str = "none",
               multiply: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
               glu: str = "none") -> torch.Tensor:
    """``(activation(grouped_mm(a, b, offs) + bias)) * multiply`` in one tuned kernel.

    Args:
        a, b: the operands of one of the four cases (tilewright.kinds.grouped_gemm.problem): (M_total, K) x
            (G, K, N), (M, K_total) x (K_total, N), (G, M, K) x (K, N_total), (G, M, K) x
            (G, K, N); fp32/fp16/bf16, any strides.
        offs: int32 end offsets along the ragged dim, (G,), on the operands' device (None for
            3d3d). Never read on the host.
        bias: per group, (G, N) (3d2d: (N_total,)).
        activation: "none" or a unary epilogue kind ("silu", "gelu", ...), after the bias.
        multiply: an output-shaped tensor multiplied in last (SwiGLU's up projection).
        out_dtype: the output dtype (a fused cast; default a's). Accumulation is fp32.
        glu: "none" or the gate's activation of a fused gated product: the product's N columns
            are gate then up halves and the result is ``glu(gate) * up`` (N/2 columns), what
            the MoE expert MLP does after its gate_up projection (HF transformers'
            ``_default_apply_gate``); the epilogue above then applies to that. Not with bias,
            not for 3d2d (ragged N).

    Returns:
        (M_total, N), (G, M, N), (M, N_total) or (G, M, N) of ``out_dtype`` (N/2 with glu).

    Raises:
        InvalidInputError (a ValueError): operands, offsets, a bias, multiply or glu that do not
            fit (the message says which and the shape expected).
    """
    if out_dtype is not None and DTYPE_NAMES.get(out_dtype) not in GEMM_INPUT_DTYPES:
        raise InvalidInputError(f"grouped_mm: out_dtype {out_dtype}; pass torch.float32, float16 or bfloat16")
    problem = grouped_problem(a, b, bias=bias, activation=activation, multiply=multiply, out_dtype=out_dtype,
                              glu=glu)
    if problem.ragged and (offs is None or offs.dtype != torch.int32 or offs.dim() != 1):
        raise InvalidInputError(f"grouped_mm {problem.case} needs offs, a 1-D int32 tensor of end offsets")
    if problem.case == "2d2d":
        problem = problem.with_sizes(G=offs.shape[0])
    _check_shapes(problem, a, b, offs, bias, multiply)
    if problem.ragged and offs.device.type == "cpu":
        _check_offsets(problem, offs)
    extra = [t for t in (bias, multiply) if t is not None]
    return tuned_launcher(problem, a.device)(a, b, offs, *extra)


def _check_shapes(problem: GroupedGemmProblem, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None,
                  bias: torch.Tensor | None, multiply: torch.Tensor | None) -> None:
    """Shapes and devices only (nothing is read: the offsets' values stay on the device, and
    the kernels clamp them to the ragged total; host offsets are checked by
    :func:`_check_offsets`).

    Raises:
        InvalidInputError: offsets of the wrong length or device, a bias or multiply of the wrong
            shape; the message gives the shape expected.
    """
    G = problem.G
    if problem.ragged:
        if tuple(offs.shape) != (G,):
            raise InvalidInputError(f"grouped_mm {problem.case}: offs has {offs.shape[0]} entries for {G} groups; "
                                    f"pass one int32 end offset per group, shape ({G},)")
        if offs.device != a.device:
            raise InvalidInputError(f"grouped_mm: offs is on {offs.device}, the operands on {a.device}; "
                                    f"move offs to {a.device}")
    n = b.shape[-1] // 2 if problem.glu else b.shape[-1]
    if bias is not None:
        want = (n,) if problem.case == "3d2d" else (G, n)
        if tuple(bias.shape) != want or bias.device != a.device:
            raise InvalidInputError(f"grouped_mm {problem.case}: bias of shape {tuple(bias.shape)} on {bias.device}; "
                                    f"pass {'a per-column' if problem.case == '3d2d' else 'a per-group'} bias of "
                                    f"shape {want} on {a.device}")
    if multiply is not None:
        want = _grouped_mm_fake(a, b, offs, None, None, "none", problem.glu or "none").shape
        if tuple(multiply.shape) != tuple(want) or multiply.device != a.device:
            raise InvalidInputError(f"grouped_mm: multiply of shape {tuple(multiply.shape)}; pass an output-shaped "
                                    f"tensor {tuple(want)} on {a.device}")


def _check_offsets(problem: GroupedGemmProblem, offs: torch.Tensor) -> None:
    """Offsets in host memory (reading them costs no device sync): they must be non-negative
    and non-decreasing, PyTorch's contract for ``_grouped_mm``. Eager does not check: on a CPU
    it computes group g over rows [offs[g-1], offs[g]) when that is not empty, a later group
    overwriting an earlier one's rows (offsets [8, 4, 12, 16]: rows 4-7 from expert 2), and
    negative offsets give rows of no clear meaning; the kernels clamp instead (each row to the
    first group whose end passes it). Rather than a third answer, such offsets are refused. On a
    device the offsets are never read on the host (that would synchronise every call): there
    the kernels' clamping stands (docs/architecture.md, "Grouped GEMMs").

    Raises:
        InvalidInputError: a negative offset or one smaller than the one before it.
    """
    values = offs.tolist()
    for g, (prev, cur) in enumerate(zip([0] + values, values)):
        if cur < prev:
            what = "negative" if cur < 0 else f"smaller than offs[{g - 1}] = {prev}"
            raise InvalidInputError(
                f"grouped_mm {problem.case}: offs[{g}] = {cur} is {what}; offsets are the groups' end "
                f"positions along the ragged dim, non-negative and non-decreasing (an empty group "
                f"repeats the previous offset), as torch._grouped_mm requires: got {values}")


@torch.library.custom_op("tilewright::grouped_mm", mutates_args=())
def _grouped_mm_op(a: torch.Tensor, b: torch.Tensor, offs: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], out_dtype: Optional[torch.dtype],
                   activation: str = "none", glu: str = "none") -> torch.Tensor:
    """``aten._grouped_mm``'s signature (and a fused gated product, activation and cast), run
    by the tuned kernel: what the compiler lowers ``_grouped_mm`` to
    (:mod:`tilewright.kinds.grouped_gemm.lower`)."""
    return grouped_mm(a, b, offs, bias=bias, out_dtype=out_dtype, activation=activation, glu=glu)


@_grouped_mm_op.register_fake
def _grouped_mm_fake(a, b, offs, bias, out_dtype, activation="none", glu="none"):
    case = case_of(a.dim(), b.dim())
    n = b.shape[-1] // 2 if glu not in ("none", "") else b.shape[-1]
    shape = {"2d3d": (a.shape[0], n), "2d2d": (offs.shape[0], a.shape[0], n),
             "3d2d": (a.shape[1], n), "3d3d": (a.shape[0], a.shape[1], n)}[case]
    return a.new_empty(shape, dtype=out_dtype or a.dtype)
