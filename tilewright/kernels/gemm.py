"""``tilewright.kernels.gemm``: one GEMM with a fused epilogue, tuned per shape, as a PyTorch op.

Also registered as the custom op ``torch.ops.tilewright.gemm`` so it can be called inside models
that other backends (Inductor, aot_eager) compile with ``fullgraph=True``: Dynamo cannot trace
into an interpreted Triton kernel, but it treats a custom op as opaque.
"""

from __future__ import annotations

from typing import Optional

import torch

from tilewright._config import config
from tilewright.errors import InvalidInputError
from tilewright.kernels.launchers import tuned_launcher
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import DTYPE_NAMES, GEMM_INPUT_DTYPES, UNARY_EPILOGUES, EpilogueInput, EpilogueOp


def _layout(t: torch.Tensor) -> str:
    if t.stride(-1) == 1 or t.shape[-1] == 1:
        return "row"
    if t.stride(-2) == 1 or t.shape[-2] == 1:
        return "col"
    return "strided"


def _pattern(t: torch.Tensor, out_shape: tuple[int, ...], what: str) -> str:
    dims = ("B", "M", "N")[-len(out_shape):]
    if t.dim() > len(out_shape):
        raise InvalidInputError(f"{what} has {t.dim()} dims but the output has {len(out_shape)}")
    varies = []
    for i, size in enumerate(t.shape):
        j = len(out_shape) - t.dim() + i
        if size == 1:
            continue
        if size != out_shape[j]:
            raise InvalidInputError(
                f"{what} of shape {tuple(t.shape)} does not broadcast to the output "
                f"{tuple(out_shape)}; give it shape ({out_shape[-1]},) (one per column), "
                f"({out_shape[-2]}, 1) (one per row) or {tuple(out_shape)}")
        varies.append(dims[j])
    return "".join(varies)


def validate(a: torch.Tensor, b: torch.Tensor, tensors: dict[str, torch.Tensor | None]) -> None:
    """Raise :class:`InvalidInputError` naming the problem and its fix."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise InvalidInputError(f"gemm: {name} must be a tensor, got {type(t).__name__}")
        if t.dim() not in (2, 3):
            raise InvalidInputError(
                f"gemm: {name} must be 2-D (rows, cols) or 3-D (batch, rows, cols); got shape {tuple(t.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise InvalidInputError(
            f"gemm: a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's last dim (K={a.shape[-1]}) must "
            f"equal b's second-to-last ({b.shape[-2]}); for a weight stored (N, K) pass weight.t()")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0] and 1 not in (a.shape[0], b.shape[0]):
        raise InvalidInputError(f"gemm: batch sizes {a.shape[0]} and {b.shape[0]} differ")
    if a.dtype != b.dtype:
        raise InvalidInputError(
            f"gemm: a is {a.dtype} but b is {b.dtype}; cast one of them, e.g. b.to(a.dtype)")
    if DTYPE_NAMES.get(a.dtype) not in GEMM_INPUT_DTYPES:
        raise InvalidInputError(f"gemm: dtype {a.dtype} is not supported; use float32, float16 or bfloat16")
    for name, t in [("b", b)] + [(k, v) for k, v in tensors.items() if v is not None]:
        if t.device != a.device:
            raise InvalidInputError(
                f"gemm: a is on {a.device} but {name} is on {t.device}; move them to one device")
        if name != "b" and DTYPE_NAMES.get(t.dtype) not in GEMM_INPUT_DTYPES:
            raise InvalidInputError(
                f"gemm: {name} has dtype {t.dtype}; use float32, float16 or bfloat16 (e.g. {name}.float())")


def gemm_impl(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
              residual: Optional[torch.Tensor], activation: str, alpha: float,
              out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    validate(a, b, {"bias": bias, "residual": residual})
    if activation not in ("none",) + UNARY_EPILOGUES:
        raise InvalidInputError(
            f"gemm: activation {activation!r} unknown; use one of none, {', '.join(UNARY_EPILOGUES)}")
    out_dtype = out_dtype or a.dtype
    if DTYPE_NAMES.get(out_dtype) not in GEMM_INPUT_DTYPES:
        raise InvalidInputError(f"gemm: out_dtype {out_dtype} unsupported; use float32/float16/bfloat16")
    batched = a.dim() == 3 or b.dim() == 3
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    out_shape = (batch, M, N) if batched else (M, N)
    ops, inputs, tensors = [], [], []
    if alpha != 1.0:
        ops.append(EpilogueOp("mul", scalar=float(alpha)))
    for name, t in (("bias", bias), ("residual", residual)):
        if t is None:
            continue
        if name == "residual" and activation != "none":
            ops.append(EpilogueOp(activation))
            activation = "none"
        inputs.append(EpilogueInput(_pattern(t, out_shape, name), DTYPE_NAMES[t.dtype]))
        tensors.append(t.expand(out_shape))
        ops.append(EpilogueOp("add", input=len(inputs) - 1))
    if activation != "none":
        ops.append(EpilogueOp(activation))
    problem = GemmProblem(M=M, N=N, K=K, batch=batch, batched=batched, dtype=DTYPE_NAMES[a.dtype],
                          out_dtype=DTYPE_NAMES[out_dtype], layout_a=_layout(a), layout_b=_layout(b),
                          epilogue=tuple(ops), epilogue_inputs=tuple(inputs), op="gemm")
    return tuned_launcher(problem, a.device)(a, b, *tensors)


@torch.library.custom_op("tilewright::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
             residual: Optional[torch.Tensor], activation: str, alpha: float,
             out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return gemm_impl(a, b, bias, residual, activation, alpha, out_dtype)


@_gemm_op.register_fake
def _gemm_fake(a, b, bias, residual, activation, alpha, out_dtype):
    batched = a.dim() == 3 or b.dim() == 3
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    shape = (batch, a.shape[-2], b.shape[-1]) if batched else (a.shape[-2], b.shape[-1])
    return a.new_empty(shape, dtype=out_dtype or a.dtype)


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
         activation: str | None = "none", residual: torch.Tensor | None = None, alpha: float = 1.0,
         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``activation(alpha * a @ b + bias) + residual`` in one tuned kernel.

    Args:
        a: (M, K) or (batch, M, K), float32/float16/bfloat16, any strides.
        b: (K, N) or (batch, K, N), same dtype and device as ``a``; for a Linear weight stored
            (N, K), pass ``weight.t()`` (read through its strides, not copied).
        bias: broadcastable to the output: (N,) per column, (M, 1) per row, or (M, N).
        activation: "none" (or None), "relu", "gelu", "gelu_tanh", "silu", "sigmoid" or
            "tanh"; applied before ``residual`` is added.
        residual: broadcastable to the output, added last.
        alpha: scale of the product (NaN and infinities as IEEE arithmetic has them).
        out_dtype: output dtype (default: ``a``'s); accumulation is always fp32.

    Returns:
        (M, N) or (batch, M, N) tensor of ``out_dtype``.

    The kernel is the one the autotuner chose for this problem under the settings in force at
    this call (``tilewright.config``; inside ``config.patch(...)`` those of the block), tuned at
    the first call under them (see docs/config.md, "When settings take effect").

    Raises:
        InvalidInputError: shapes, dtypes or devices that do not fit, with the fix in the message.
        ConfigError: a ``TILEWRIGHT_*`` environment variable has a bad value.
    """
    config.raise_env_error()  # here, not under the dispatcher: the traceback stays the caller's
    # validate here too: mixed devices (say cpu and meta) would otherwise dispatch to the fake
    validate(a, b, {"bias": bias, "residual": residual})
    activation = "none" if activation is None else activation
    return torch.ops.tilewright.gemm(a, b, bias, residual, activation, float(alpha), out_dtype)


# Backward in ATen: d(a @ b) needs no kernel of ours. With an activation, the pre-activation
# alpha * a @ b + bias is recomputed (cheaper than saving it) and autograd differentiates the
# activation; the residual's gradient is the incoming one.
_ACTIVATIONS = {
    "relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
    "gelu_tanh": lambda z: torch.nn.functional.gelu(z, approximate="tanh"),
    "sigmoid": torch.sigmoid, "tanh": torch.tanh,
}


def _setup_context(ctx, inputs, output):
    a, b, bias, residual, activation, alpha, out_dtype = inputs
    ctx.save_for_backward(a, b, bias)
    ctx.activation, ctx.alpha = activation, alpha
    ctx.residual_shape = tuple(residual.shape) if residual is not None else None


def _reduce_to(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Sum ``grad`` over the dims a broadcast operand of ``shape`` was expanded along."""
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for i, s in enumerate(shape):
        if s == 1 and grad.shape[i] != 1:
            grad = grad.sum(i, keepdim=True)
    return grad


def _backward(ctx, grad):
    a, b, bias = ctx.saved_tensors
    g = grad
    if ctx.activation != "none":
        with torch.enable_grad():
            z = (ctx.alpha * torch.matmul(a.detach(), b.detach())).float()
            if bias is not None:
                z = z + bias.detach().float()
            z.requires_grad_(True)
            (g,) = torch.autograd.grad(_ACTIVATIONS[ctx.activation](z), z, grad.float())
    gbias = _reduce_to(g, tuple(bias.shape)).to(bias.dtype) if bias is not None else None
    g = g.to(a.dtype) * ctx.alpha
    ga = _reduce_to(g @ b.transpose(-1, -2), tuple(a.shape))
    gb = _reduce_to(a.transpose(-1, -2) @ g, tuple(b.shape))
    gres = _reduce_to(grad, ctx.residual_shape) if ctx.residual_shape is not None else None
    return ga, gb, gbias, gres, None, None, None


_gemm_op.register_autograd(_backward, setup_context=_setup_context)


__all__ = ["gemm", "gemm_impl", "validate"]
