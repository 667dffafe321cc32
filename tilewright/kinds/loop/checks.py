"""What the autotuner needs of the loop kind: random inputs in the kernel's layouts (and a set
with special values), NaN-poisoned outputs, running a launcher, and the error measure with its
tolerances per output dtype."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from tilewright.ir import dtypes
from tilewright.ir.index import static_or_hint
from tilewright.problem import LoopProblem

# ‖out − ref‖ / ‖ref‖ allowed per output dtype (integers and booleans: the fraction of elements
# that differ)
LOOP_TOLERANCE = {"fp64": 1e-10, "fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2}
DISCRETE_TOLERANCE = 1e-3


@dataclass
class LoopInputs:
    """Tensors for one run of a loop kernel: its inputs (in their traced layouts) and the values
    of its size symbols; ``scatters``: the kernel updates one of its inputs in the graph (a
    scatter's target), so a timed run must be handed its outputs (LoopKind.run_timed)."""

    tensors: list[torch.Tensor]
    sizes: list[int]
    scatters: bool = False

    def as_reference(self) -> "LoopInputs":
        return self  # the torch emitter converts to float64 itself


def _strided_random(shape: Sequence[int], stride: Sequence[int], dtype: str, device: torch.device,
                    gen: torch.Generator, bounds: tuple[int, int] | None) -> torch.Tensor:
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(n > 0 for n in shape) else 0
    if dtype == "bool":
        base = torch.randint(0, 2, (span,), generator=gen).bool()
    elif dtypes.is_int(dtype) and bounds:
        info = torch.iinfo(dtypes.TORCH[dtype])  # a uint8 index input is never drawn negative
        lo = min(max(bounds[0], info.min), info.max)
        hi = max(min(bounds[1], info.max + 1), lo + 1)
        base = torch.randint(lo, hi, (span,), generator=gen).to(dtypes.TORCH[dtype])
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
        tensors.append(_strided_random(shape, stride, b.dtype, device, gen, b.bounds_at(sizes)))
    return LoopInputs(tensors, [static_or_hint(s, sizes) for s in problem.kernel.size_symbols()],
                      scatters=any(b.init for b in problem.kernel.outputs))


# the second check input set of a loop kernel: every float input has one of these in every
# SPECIAL_EVERY elements, the rest random normals (a row keeps its scale, so a sum or a norm of
# it stays finite). No extremes: an fp32 kernel overflows where a float64 reference does not.
SPECIAL_VALUES = (float("nan"), float("inf"), float("-inf"), -0.0, 0.0, "subnormal", "-subnormal", -float("nan"))
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
        # every value at least once where the tensor has room for them all (a tensor of 8 had
        # only inf and -inf at a spacing of 5, and a kernel turning NaN into 1 passed), NaN first
        every = max(1, min(SPECIAL_EVERY, span // len(values)))
        start = int(torch.randint(0, min(every, span), (1,), generator=gen))
        where = torch.arange(start, span, every)
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


def loop_error(out: torch.Tensor, ref: torch.Tensor, dtype: str, signed_zeros: bool = False) -> float:
    """Relative error of one output. Non-finite reference values (log of a negative input) must
    be matched exactly (NaN by NaN, inf by the same inf), and with ``signed_zeros`` a zero of the
    reference by a zero of the same sign (inf otherwise); integer and boolean outputs count the
    fraction of elements that differ."""
    o, r = out.detach().cpu(), ref.detach().cpu()
    if o.shape != r.shape:
        return float("inf")
    if not dtypes.is_float(dtype):
        return (o.to(torch.float64) != r.to(torch.float64)).double().mean().item() if o.numel() else 0.0
    o, r = o.double(), r.double()
    if signed_zeros:
        zero = r == 0
        if bool((zero & ((o != 0) | (torch.signbit(o) != torch.signbit(r)))).any()):
            return float("inf")
    # the usual case in three passes: a finite norm of the reference says every reference value
    # is finite (an inf or NaN makes it inf or NaN), and then a finite norm of the difference
    # says every output value is; otherwise (or where a norm overflows) the exact rule below
    den = r.norm().item()
    if math.isfinite(den):
        num = (o - r).norm().item()
        if math.isfinite(num):
            return num / den if den > 0 else num
    finite = torch.isfinite(r)
    # NaN where the reference has NaN, the same infinities where it has them (no NaN there, by
    # the first test), finite values elsewhere; masked by where(), not copied out by indexing
    inf_r, zero = torch.isinf(r), o.new_zeros(())
    if not torch.equal(torch.isnan(o), torch.isnan(r)) or \
            not torch.equal(torch.where(inf_r, o, zero), torch.where(inf_r, r, zero)):
        return float("inf")
    if bool((finite & ~torch.isfinite(o)).any()):
        return float("inf")
    num, den = torch.where(finite, o - r, zero).norm().item(), torch.where(finite, r, zero).norm().item()
    return num / den if den > 0 else num


def _loop_run(launch: Callable, x: LoopInputs, outs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(launch(*x.tensors, *x.sizes, outs=outs))


# ops whose zero has no one sign: torch.maximum(-0.0, 0.0) is either zero, depending on
# whether its loop ran vectorised (measured, torch 2.13: a length of 4 or of 32 differ)
_UNSIGNED_ZERO_OPS = frozenset({"maximum", "minimum"})


def _pointwise_outputs(kernel: Any) -> set[str]:
    """The outputs whose every store is element by element (no reduction, scan or scatter)
    and whose zeros have one sign (a sum's zero depends on its order and its start value; a
    maximum's on the implementation)."""
    from tilewright.ir import expr as E

    stores = [s for k in (kernel.parts or (kernel,)) for s in k.stores]
    out = {s.buffer for s in stores}
    for s in stores:
        if s.is_scatter or any(n.is_reduce or n.is_scan or n.op in _UNSIGNED_ZERO_OPS
                               for n in E.toposort([s.value])):
            out.discard(s.buffer)
    return out


def _loop_error(problem: LoopProblem, result: Sequence[torch.Tensor], ref: Sequence[torch.Tensor],
                tf32: bool) -> tuple[float, float]:
    """The worst output's error relative to its own tolerance (returned as (error, tolerance))."""
    worst_err, worst_tol = 0.0, 1.0
    signed = _pointwise_outputs(problem.kernel)
    for b, o, r in zip(problem.kernel.outputs, result, ref):
        tol = LOOP_TOLERANCE.get(b.dtype, DISCRETE_TOLERANCE)
        err = loop_error(o, r, b.dtype, signed_zeros=b.name in signed)
        if err != err or err / tol > worst_err / worst_tol:
            worst_err, worst_tol = err, tol
    return worst_err, worst_tol


