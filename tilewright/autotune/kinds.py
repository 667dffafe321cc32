"""Problem kinds, as the autotuner sees them: how to make inputs, poisoned outputs, run a
launcher, and judge its result against the reference. One entry per kind ("gemm", and the loop
kinds "pointwise" and "reduction"); select, evaluate, warm and bench go through these and know no
kind themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from tilewright.autotune import inputs as gemm_inputs
from tilewright.ir import dtypes
from tilewright.ir.index import static_or_hint
from tilewright import grouped
from tilewright.problem import GemmProblem, LoopProblem

# ‖out − ref‖ / ‖ref‖ allowed per output dtype (integers and booleans: the fraction of elements
# that differ)
LOOP_TOLERANCE = {"fp64": 1e-10, "fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2}
DISCRETE_TOLERANCE = 1e-3


@dataclass
class LoopInputs:
    """Tensors for one run of a loop kernel: its inputs (in their traced layouts) and the values
    of its size symbols."""

    tensors: list[torch.Tensor]
    sizes: list[int]

    def as_reference(self) -> "LoopInputs":
        return self  # the torch emitter converts to float64 itself


def _strided_random(shape: Sequence[int], stride: Sequence[int], dtype: str, device: torch.device,
                    gen: torch.Generator, bounds: tuple[int, int] | None) -> torch.Tensor:
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(n > 0 for n in shape) else 0
    if dtype == "bool":
        base = torch.randint(0, 2, (span,), generator=gen).bool()
    elif dtypes.is_int(dtype) and bounds:
        lo, hi = bounds
        base = torch.randint(lo, max(hi, lo + 1), (span,), generator=gen).to(dtypes.TORCH[dtype])
    elif dtypes.is_int(dtype):
        # never zero (an integer divisor of 0 raises in the reference); both signs but for u8
        base = torch.randint(1, 16, (span,), generator=gen)
        if dtype != "u8":
            base = base * (torch.randint(0, 2, (span,), generator=gen) * 2 - 1)
        base = base.to(dtypes.TORCH[dtype])
    else:
        base = torch.randn(span, generator=gen).to(dtypes.TORCH[dtype])
    return base.to(device).as_strided(tuple(shape), tuple(stride))


def make_loop_inputs(problem: LoopProblem, device: torch.device | str, seed: int = 0) -> LoopInputs:
    """Random inputs (normal floats, never zeros; integers inside their index bounds) laid out
    as traced, and the sizes the problem is tuned at."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    sizes = problem.size_map
    tensors = []
    for b in problem.kernel.inputs:
        shape = [static_or_hint(s, sizes) for s in b.shape]
        stride = [static_or_hint(s, sizes) for s in b.stride]
        tensors.append(_strided_random(shape, stride, b.dtype, device, gen, b.bounds))
    return LoopInputs(tensors, [static_or_hint(s, sizes) for s in problem.kernel.size_symbols()])


# the second check input set of a loop kernel: every float input has one of these in every
# SPECIAL_EVERY elements, the rest random normals (a row keeps its scale, so a sum or a norm of
# it stays finite). No extremes: an fp32 kernel overflows where a float64 reference does not.
SPECIAL_VALUES = (float("inf"), float("-inf"), float("nan"), 0.0, -0.0, "subnormal", "-subnormal")
SPECIAL_EVERY = 5


def special_loop_inputs(problem: LoopProblem, device: torch.device | str, seed: int = 0) -> LoopInputs | None:
    """:func:`make_loop_inputs` with :data:`SPECIAL_VALUES` mixed into every float input (a
    kernel that turns inf into NaN, or loses a subnormal, fails its check on them); None when
    the kernel reads no float. The values sit at positions that vary with ``seed``."""
    x = make_loop_inputs(problem, device, seed)
    gen = torch.Generator().manual_seed(seed + 7919)
    touched = False
    for t, b in zip(x.tensors, problem.kernel.inputs):
        if not dtypes.is_float(b.dtype) or t.numel() == 0:
            continue
        span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        flat = t.as_strided((span,), (1,), t.storage_offset())
        fi = torch.finfo(t.dtype)
        sub = fi.smallest_normal * fi.eps * 3  # a subnormal of this dtype
        values = torch.tensor([sub if v == "subnormal" else -sub if v == "-subnormal" else v
                               for v in SPECIAL_VALUES], dtype=torch.float64).to(t.dtype)
        start = int(torch.randint(0, min(SPECIAL_EVERY, span), (1,), generator=gen))
        where = torch.arange(start, span, SPECIAL_EVERY)
        flat[where.to(flat.device)] = values[torch.arange(len(where)) % len(values)].to(flat.device)
        touched = True
    return x if touched else None


# integers: a value the type holds (a uint8 cannot hold -12345) that kernels rarely write
_POISON = {"bool": True, "u8": 251, "i8": -123}


def poisoned_loop_outputs(problem: LoopProblem, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """Output buffers full of NaN (integers: a value no kernel writes here), in the kernel's
    layout, so elements a kernel fails to write show up."""
    sizes = problem.size_map
    outs = []
    for b in problem.kernel.outputs:
        shape = [static_or_hint(s, sizes) for s in b.shape]
        stride = [static_or_hint(s, sizes) for s in b.stride]
        t = torch.empty_strided(shape, stride, dtype=dtypes.TORCH[b.dtype], device=device)
        fill = float("nan") if dtypes.is_float(b.dtype) else _POISON.get(b.dtype, -12345)
        t.fill_(fill)
        outs.append(t)
    return tuple(outs)


def loop_error(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> float:
    """Relative error of one output. Non-finite reference values (log of a negative input) must
    be matched exactly (NaN by NaN, inf by the same inf); integer and boolean outputs count the
    fraction of elements that differ."""
    o, r = out.detach().cpu(), ref.detach().cpu()
    if o.shape != r.shape:
        return float("inf")
    if not dtypes.is_float(dtype):
        return (o.to(torch.float64) != r.to(torch.float64)).double().mean().item() if o.numel() else 0.0
    o, r = o.double(), r.double()
    finite = torch.isfinite(r)
    if not torch.equal(torch.isnan(o), torch.isnan(r)) or not torch.equal(o[torch.isinf(r)], r[torch.isinf(r)]):
        return float("inf")
    if (~torch.isfinite(o[finite])).any():
        return float("inf")
    num, den = (o[finite] - r[finite]).norm().item(), r[finite].norm().item()
    return num / den if den > 0 else num


@dataclass(frozen=True)
class Kind:
    """What the autotuner needs to know of one problem kind."""

    name: str
    make_inputs: Callable[[Any, torch.device | str, int], Any]
    poisoned: Callable[[Any, torch.device | str], Any]
    run: Callable[[Callable, Any, Any], Any]
    error: Callable[[Any, Any, Any, bool], tuple[float, float]]
    # (problem, device, seed) -> a second check input set of special values, or None
    special_inputs: Callable[[Any, torch.device | str, int], Any] | None = None


def _gemm_run(launch: Callable, x: gemm_inputs.GemmInputs, out: torch.Tensor) -> torch.Tensor:
    return launch(x.a, x.b, *x.epilogue_inputs, out=out, **x.scale_kwargs)


def _gemm_error(problem: GemmProblem, result: torch.Tensor, ref: torch.Tensor, tf32: bool) -> tuple[float, float]:
    return gemm_inputs.rel_error(result, ref), gemm_inputs.tolerance(problem, tf32)


def _loop_run(launch: Callable, x: LoopInputs, outs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(launch(*x.tensors, *x.sizes, outs=outs))


def _loop_error(problem: LoopProblem, result: Sequence[torch.Tensor], ref: Sequence[torch.Tensor],
                tf32: bool) -> tuple[float, float]:
    """The worst output's error relative to its own tolerance (returned as (error, tolerance))."""
    worst_err, worst_tol = 0.0, 1.0
    for b, o, r in zip(problem.kernel.outputs, result, ref):
        tol = LOOP_TOLERANCE.get(b.dtype, DISCRETE_TOLERANCE)
        err = loop_error(o, r, b.dtype)
        if err != err or err / tol > worst_err / worst_tol:
            worst_err, worst_tol = err, tol
    return worst_err, worst_tol


KINDS: dict[str, Kind] = {
    "gemm": Kind("gemm", gemm_inputs.make_inputs, gemm_inputs.poisoned_output, _gemm_run, _gemm_error),
    "pointwise": Kind("pointwise", make_loop_inputs, poisoned_loop_outputs, _loop_run, _loop_error,
                      special_loop_inputs),
    "reduction": Kind("reduction", make_loop_inputs, poisoned_loop_outputs, _loop_run, _loop_error,
                      special_loop_inputs),
    # synthetic even, aligned offsets (tilewright.grouped.synthetic_offsets)
    "grouped_gemm": Kind("grouped_gemm", grouped.make_inputs, grouped.poisoned_output, grouped.run, grouped.error),
}


def kind_name(problem: Any) -> str:
    return "gemm" if isinstance(problem, GemmProblem) else problem.kind


def kind_of(problem: Any) -> Kind:
    """The :class:`Kind` of a problem."""
    return KINDS[kind_name(problem)]


def problem_from_json(d: dict) -> Any:
    """A problem back from its ``to_json()`` (loop problems carry a "kind")."""
    if d.get("kind") in ("pointwise", "reduction"):
        return LoopProblem.from_json(d)
    if d.get("kind") == "grouped_gemm":
        return grouped.GroupedGemmProblem.from_json(d)
    return GemmProblem.from_json(d)
