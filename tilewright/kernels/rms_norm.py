"""``tilewright.kernels.rms_norm``: RMSNorm over the last dim, with a FlyDSL kernel on gfx950
where the gate (:mod:`tilewright.templates.flydsl.gate`) measured it faster, ATen everywhere else.

The math is ``torch.nn.functional.rms_norm(x, (H,), weight, eps)``'s: ``x * rsqrt(mean(x^2) +
eps) * weight`` computed in fp32 and cast back to x's dtype (HF's ``Qwen3RMSNorm`` computes the
same statistic; it rounds to x's dtype before the weight multiply, so bf16 results can differ
from it by one rounding).

The FlyDSL kernel is the ``flydsl.reduction`` template's (``templates/flydsl/loops.py``, the
IR's reduction kind) for the loop kernel tilewright's pipeline makes from a reference RMSNorm
(:func:`reference_loop_problem`); :func:`_build_flydsl` is the hook the gate calls. Where that
template is missing or refuses, the hook says so and the call runs ATen.
"""

from __future__ import annotations

import functools

import torch

from tilewright.errors import InvalidInputError
from tilewright.templates.flydsl import gate

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _aten(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps).to(x.dtype)


def _validate(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise InvalidInputError("rms_norm: x and weight must be tensors")
    if x.dim() == 0:
        raise InvalidInputError("rms_norm: x is a scalar; give it at least one dim (..., H)")
    if tuple(weight.shape) != (x.shape[-1],):
        raise InvalidInputError(
            f"rms_norm: weight has shape {tuple(weight.shape)} but x's last dim is {x.shape[-1]}; "
            f"pass a weight of shape ({x.shape[-1]},), one scale per element of the normalised dim")
    if not x.is_floating_point() or not weight.is_floating_point():
        raise InvalidInputError(f"rms_norm: x ({x.dtype}) and weight ({weight.dtype}) must be floating point")
    if weight.device != x.device:
        raise InvalidInputError(f"rms_norm: x is on {x.device} but weight on {weight.device}; move them to one device")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise InvalidInputError(f"rms_norm: eps must be a number >= 0, got {eps!r}")


def _key(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[gate.GateKey | None, str | None]:
    why = gate.device_problem(x.device)
    if why:
        return None, why
    if x.dtype not in _DTYPES or weight.dtype not in _DTYPES:
        return None, f"dtypes {x.dtype}/{weight.dtype}: the FlyDSL kernel takes float32, bfloat16 or float16"
    if not x.is_contiguous() or not weight.is_contiguous():
        return None, "a non-contiguous input: the FlyDSL kernel reads dense rows (pass x.contiguous())"
    if (x.requires_grad or weight.requires_grad) and torch.is_grad_enabled():
        return None, "an input that requires grad: the FlyDSL kernel is forward-only (ATen has the backward)"
    H = x.shape[-1]
    rows = x.numel() // max(H, 1)
    if rows == 0 or H == 0:
        return None, "an empty input"
    dtypes = f"{_DTYPES[x.dtype]}x{_DTYPES[weight.dtype]}"
    return gate.GateKey("rms_norm", (gate.bucket_rows(rows), H, float(eps)), dtypes, gate.device_arch(x.device)), None


@functools.lru_cache(maxsize=64)
def reference_loop_problem(dtype: torch.dtype, weight_dtype: torch.dtype, eps: float):
    """The RMSNorm loop kernel tilewright's pipeline makes from the reference math (fp32, one
    cast back): traced with ``make_fx`` over symbolic shapes, lowered and fused as
    ``torch.compile(backend="tilewright")`` does. Sizes are run-time values (``z0`` rows, ``z1``
    = H; the trace's 64 x 256 are only hints); eps is baked in. Buffers: ``in0`` = x (z0, z1),
    ``in1`` = weight (z1,), ``out0`` (z0, z1) of x's dtype.

    Raises:
        gate.FlyDslUnavailable: the pipeline made anything but that one reduction kernel.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    from tilewright.compiler.decompositions import decomposition_table
    from tilewright.compiler.lower import lower
    from tilewright.compiler.pipeline import fuse
    from tilewright.kinds.gemm.node import gemm_nodes

    def reference(x, w):
        h = x.to(torch.float32)
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.to(torch.float32)).to(x.dtype)

    gm = make_fx(reference, decomposition_table=decomposition_table(), tracing_mode="symbolic")(
        torch.empty(64, 256, dtype=dtype), torch.empty(256, dtype=weight_dtype))
    kg = lower(gm)
    fuse(kg, gm)
    placeholders = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    fused = list(kg.fused)
    if len(fused) != 1 or gemm_nodes(kg) or list(fused[0].inputs) != placeholders or \
            fused[0].problem.kind != "reduction" or len(fused[0].problem.kernel.outputs) != 1:
        raise gate.FlyDslUnavailable(f"the pipeline made {[f.problem.describe() for f in fused]} of "
                                     f"the reference RMSNorm, not one reduction over (x, weight)")
    return fused[0].problem


def loop_sizes(problem, x2d: torch.Tensor) -> tuple[list[int], int, int]:
    """The run-time sizes of :func:`reference_loop_problem`'s kernel for rows ``x2d`` (rows, H):
    its size symbols in order (read off x's buffer shape), xnumel (rows) and rnumel (H)."""
    k = problem.kernel
    values = {sym: n for sym, n in zip(k.inputs[0].shape, x2d.shape)}
    sizes = [int(values[s]) for s in k.size_symbols()]
    return sizes, int(k.xnumel.subs(values)), int(k.rnumel.subs(values))


def _build_flydsl(key: gate.GateKey, x: torch.Tensor, weight: torch.Tensor, eps: float):
    """The FlyDSL RMSNorm launcher: the ``flydsl.reduction`` template (loops.py) rendered for
    :func:`reference_loop_problem`, imported, and called through its module's ``launch`` (the
    loop-kernel contract: inputs, sizes, ``outs``; the stream is the module's). FlyDSL compiles
    at the first call. UNTESTED ON HARDWARE: this host has no gfx950; the rendered kernel is
    compile-checked and its launch checked against the kernel's signature.

    Raises:
        gate.FlyDslUnavailable: the template is not in this build or refuses the problem.
    """
    from tilewright.runtime.loader import load_module
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    try:
        template = get_template("flydsl.reduction")
    except KeyError:
        raise gate.FlyDslUnavailable("the flydsl.loops template (flydsl.reduction, the IR's reduction "
                                     "kind) is not in this build, so there is no FlyDSL RMSNorm kernel") from None
    problem = reference_loop_problem(x.dtype, weight.dtype, float(eps))
    target = get_target("hip:gfx950")
    support = template.problem_support(problem, target)
    if not support:
        raise gate.FlyDslUnavailable(f"flydsl.reduction refuses this RMSNorm: {support.reason}")
    # the largest workgroup the row fills (params from this H; the source stays size-generic)
    H_name = problem.kernel.inputs[1].shape[0].name
    params = template.seed_params(problem.with_sizes(**{H_name: x.shape[-1]}), target)[-1]
    rendered = template.render(problem, params, target)
    module = load_module(rendered.source, name="flydsl_rms_norm", interpret=False)

    def launch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x2d = x.view(-1, x.shape[-1])
        out = torch.empty_like(x)
        sizes, _, _ = loop_sizes(problem, x2d)
        module.launch(x2d, weight, *sizes, outs=(out.view(x2d.shape),))
        return out

    return launch


gate.FLYDSL_BUILDERS.setdefault("rms_norm", _build_flydsl)


def _agree(fly: torch.Tensor, ref: torch.Tensor) -> str | None:
    """The gate's check of a FlyDSL result against ATen's: shape, dtype, and a relative error
    (‖fly − ref‖ / ‖ref‖ in float64) within one rounding of the output dtype."""
    if fly.shape != ref.shape or fly.dtype != ref.dtype:
        return f"it returned {tuple(fly.shape)} {fly.dtype}, not {tuple(ref.shape)} {ref.dtype}"
    tol = 1e-5 if ref.dtype == torch.float32 else 1e-2
    err = ((fly.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()
    return None if err <= tol else f"its relative error against ATen is {err:.2e} (> {tol:.0e})"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of the last dim: ``x * rsqrt(mean(x**2, -1) + eps) * weight``.

    Args:
        x: (..., H), float32/bfloat16/float16 (any float dtype ATen takes), any strides.
        weight: (H,), floating point, on x's device.
        eps: added to the mean square before the reciprocal square root (>= 0).

    Returns:
        Tensor of x's shape and dtype; computed in fp32 (``torch.nn.functional.rms_norm``).

    Raises:
        InvalidInputError: weight not of shape (H,), non-float inputs, mixed devices, a bad eps;
            the message names the fix.
    """
    _validate(x, weight, eps)
    key, _ = _key(x, weight, eps)
    if key is None:
        return _aten(x, weight, eps)
    return gate.run(key, (x, weight, eps), _aten, x.device, _agree)


def explain(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> gate.Route:
    """Which path ``rms_norm(x, weight, eps)`` takes and why; runs nothing."""
    _validate(x, weight, eps)
    key, why = _key(x, weight, eps)
    return gate.route("rms_norm", key, why)
