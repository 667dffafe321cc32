"""``tilewright.kernels.topk``: ``torch.topk`` with a FlyDSL kernel on gfx950 where the gate
(:mod:`tilewright.templates.flydsl.gate`) measured it faster, ATen everywhere else.

The FlyDSL path takes the MoE router's case: the last dim of a 2-D (or flattened N-D) tensor
with a contiguous last dim, at most 256 long, k 1..8, fp32/bf16/fp16. Any other valid input runs
``torch.topk`` itself, so it gets ATen's exact result.
"""

from __future__ import annotations

import torch

from tilewright.errors import InvalidInputError
from tilewright.templates.flydsl import gate

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _aten(x: torch.Tensor, k: int, dim: int, largest: bool, sorted: bool):
    return torch.topk(x, k, dim=dim, largest=largest, sorted=sorted)


def _validate(x: torch.Tensor, k: int, dim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise InvalidInputError(f"topk: x must be a tensor, got {type(x).__name__}")
    if isinstance(k, bool) or not isinstance(k, int):
        raise InvalidInputError(f"topk: k must be an int, got {type(k).__name__}")
    if not -max(x.dim(), 1) <= dim < max(x.dim(), 1):
        raise InvalidInputError(f"topk: dim {dim} is out of range for a {x.dim()}-D tensor; use -1 for the last")
    size = x.shape[dim] if x.dim() else 1
    if not 0 <= k <= size:
        raise InvalidInputError(f"topk: k={k} but dim {dim} has {size} elements; pass k between 0 and {size}")


def _key(x: torch.Tensor, k: int, dim: int, largest: bool,
         sorted: bool) -> tuple[gate.GateKey | None, str | None]:
    """The gate's key for a call the FlyDSL kernel can serve, else (None, why not)."""
    why = gate.device_problem(x.device)
    if why:
        return None, why
    if dim not in (-1, x.dim() - 1) or x.dim() == 0:
        return None, f"dim={dim}: the FlyDSL kernel selects along the last dim (dim=-1) only"
    if x.dtype not in _DTYPES:
        return None, f"dtype {x.dtype}: the FlyDSL kernel takes float32, bfloat16 or float16"
    if not sorted:
        return None, "sorted=False: ATen's unsorted order is its own; only sorted=True is served"
    if x.requires_grad and torch.is_grad_enabled():
        return None, "an input that requires grad: the FlyDSL kernel is forward-only (ATen has the backward)"
    from tilewright.templates.flydsl import topk as template  # here: off the CPU import path

    E = x.shape[-1]
    problem = template.TopkProblem(E=E, k=k, dtype=_DTYPES[x.dtype], largest=largest)
    support = template.TEMPLATE.supports(problem, _gfx950())
    if not support:
        return None, support.reason
    if not x.is_contiguous():
        return None, "a non-contiguous input: the FlyDSL kernel reads dense rows (pass x.contiguous())"
    rows = x.numel() // max(E, 1)
    if rows == 0:
        return None, "no rows"
    return gate.GateKey("topk", (gate.bucket_rows(rows), E, k, largest), problem.dtype,
                        gate.device_arch(x.device)), None


def _gfx950():
    from tilewright.runtime.targets import get_target

    return get_target("hip:gfx950")


def _build_flydsl(key: gate.GateKey, x, k, dim, largest, sorted):
    """The real launcher: render the template for this class, import it and wrap its module's
    ``launch`` (the tensor mapping and the current stream are the module's; FlyDSL compiles at
    the first call). UNTESTED ON HARDWARE: this host has no gfx950; the kernel is compile-checked
    and its launch checked against the kernel's signature (tests/test_flydsl_launch.py)."""
    from tilewright.runtime.loader import load_module
    from tilewright.templates.flydsl import topk as template

    problem = template.TopkProblem(E=x.shape[-1], k=k, dtype=key.dtype, largest=largest)
    rendered = template.TEMPLATE.render(problem, {"ROWS": 4}, _gfx950())
    module = load_module(rendered.source, name=f"flydsl_{rendered.name}", interpret=False)

    def launch(x, k, dim, largest, sorted):
        values, indices = module.launch(x.reshape(-1, x.shape[-1]))
        out_shape = (*x.shape[:-1], k)
        return torch.return_types.topk((values.view(out_shape), indices.view(out_shape)))

    return launch


gate.FLYDSL_BUILDERS.setdefault("topk", _build_flydsl)


def _nan_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _agree(x: torch.Tensor):
    """The gate's check of a FlyDSL result: ATen's values exactly, int64 indices that point at
    them (ties may be ordered differently: torch leaves that open)."""
    def check(fly, ref) -> str | None:
        values, indices = fly
        if indices.dtype != torch.int64 or not _nan_equal(values, ref.values):
            return "its values differ from torch.topk's"
        if not _nan_equal(x.gather(-1, indices), values):
            return "its indices do not point at its values"
        return None
    return check


def topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """``torch.topk(x, k, dim, largest, sorted)``: the FlyDSL kernel where the gate chose it.

    Args:
        x: any shape and dtype ``torch.topk`` takes. The FlyDSL path: ROCm gfx950, last dim
            (``dim=-1``) of at most 256 elements, contiguous, float32/bfloat16/float16,
            ``sorted=True``, ``1 <= k <= 8``.
        k: how many to select, ``0 <= k <= x.shape[dim]``.
        dim: the dim to select along.
        largest: the largest (True) or the smallest.
        sorted: values in order (ATen's flag; ``False`` always runs ATen).

    Returns:
        ``torch.return_types.topk(values, indices)``: values of x's dtype, int64 indices, the
        shape of x with ``dim`` of size k. On the FlyDSL path NaN counts as largest and -0.0
        equals +0.0 as in ATen, and ties come out lowest index first (``torch.topk`` leaves the
        order of ties unspecified, so indices of tied values may differ from ATen's).

    Raises:
        InvalidInputError: ``k`` outside ``0..x.shape[dim]``, ``dim`` out of range, or ``x`` not a
            tensor; the message names the fix.
    """
    _validate(x, k, dim)
    key, _ = _key(x, k, dim, largest, sorted)
    if key is None:
        return _aten(x, k, dim, largest, sorted)
    return gate.run(key, (x, k, dim, largest, sorted), _aten, x.device, _agree(x))


def explain(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> gate.Route:
    """Which path ``topk(x, k, dim, largest, sorted)`` takes and why; runs nothing."""
    _validate(x, k, dim)
    key, why = _key(x, k, dim, largest, sorted)
    return gate.route("topk", key, why)
