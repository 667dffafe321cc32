"""The fuzzer's oracle: a program compiled with ``backend="tilewright"`` under one emitter mode
must behave like eager.

* Errors: where eager raises, the compiled program raises (an error, not a wrong answer); where
  eager returns, it returns.
* Every output has eager's dtype and shape.
* Floats: each element's class (NaN, +inf, -inf, +0, -0, finite) matches one of the references
  at that element: eager, the program run in float64 (narrow-float inputs exact) or in fp32 (a
  fused kernel computes narrow floats in fp32 and rounds once; eager rounds after every op, so
  either is right). Finite values: ``||out - ref|| / max(||ref||, M)`` within the tolerance of
  the least precise float dtype the program holds, ``ref`` taking at each element the closest
  reference of the element's class; ``M`` is the largest magnitude among the output's
  ancestors times ``sqrt(numel)``, so a result that cancels huge values is judged against the
  values it cancels.
* Where the program takes a max or min (``maximum``, ``clamp``, ``amax``...), +0 and -0 are one
  class: IEEE 754 leaves ``max(+0, -0)`` unspecified and eager itself answers either way (its
  scalar loop returns the first argument, its vector loop the second).
* Integers and booleans: equal to one of the references.
* In a forced mode, no generated candidate of a kernel may fail the tuner's check ("wrong"):
  the check is a safety net, a kernel it catches is a bug even when the answer comes out right.

A mismatch raises a :class:`Find` subclass, one per kind of find, so hypothesis reports
distinct bugs separately.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import torch

import tilewright
from tilewright.compiler.report import collect_reports

# the emitter modes: config settings (graph_race off: the compiled graph, not the race's choice
# of eager, is what is checked; timing kept short, it decides nothing here)
FAST = dict(strict=True, graph_race="off", bench_rep=1, bench_min_rep=1, bench_warmup=0, bench_budget_ms=0.0)
MODES: dict[str, dict[str, Any]] = {
    "triton": dict(force_backend="triton"),
    "cpp": dict(force_backend="cpp"),
    "sycl": dict(force_backend="sycl", cpu_target="xpu"),
    "auto": dict(),
}
# relative error allowed per dtype (of the least precise float the program holds)
REL_TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
# ops whose result for (+0, -0) IEEE 754 leaves unspecified (see the module docstring), by the
# name of their ATen packet
ZERO_SIGN_FREE = {"maximum", "minimum", "fmax", "fmin", "max", "min", "amax", "amin", "clamp", "clamp_min",
                  "clamp_max", "clip", "relu", "relu6", "hardtanh", "threshold", "cummax", "cummin",
                  "max_pool2d", "adaptive_max_pool2d", "aminmax", "scatter_reduce", "index_reduce"}


def unavailable(mode: str) -> str | None:
    """Why ``mode`` cannot run on this machine (None when it can)."""
    if mode == "cpp":
        from tilewright.runtime import cpp
        return cpp.unavailable_reason()
    if mode == "sycl":
        from tilewright.runtime import sycl
        return sycl.unavailable_reason()
    return None


class Find(AssertionError):
    """The compiled program disagrees with eager."""


class SpuriousError(Find):
    """Compiled raised where eager returns."""


class MissingError(Find):
    """Eager raises, compiled returned a value."""


class WrongMeta(Find):
    """An output's dtype, shape or count differs from eager's."""


class SpecialMismatch(Find):
    """NaN, inf or signed-zero positions differ from every reference."""


class WrongValue(Find):
    """Finite values differ beyond the dtype's tolerance (or integers differ)."""


class SavedByCheck(Find):
    """A generated candidate failed the tuner's check (the answer was saved by ATen)."""


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for v in out for t in _flat(v)] if isinstance(out, (tuple, list)) else []


def _cast_inputs(xs: list[torch.Tensor], to: torch.dtype, only: tuple[torch.dtype, ...]) -> list[torch.Tensor]:
    return [x.to(to) if x.dtype in only else x for x in xs]


def _run(fn: Callable, xs: list[torch.Tensor]) -> tuple[list[torch.Tensor] | None, BaseException | None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return _flat(fn(*[x.clone() if x.is_contiguous() else x for x in xs])), None
        except Exception as e:  # noqa: BLE001 - any error is an outcome to compare
            return None, e


def _classes(t: torch.Tensor, zero_sign: bool = True) -> torch.Tensor:
    """Per element: 0 finite nonzero, 1 NaN, 2 +inf, 3 -inf, 4 +0, 5 -0 (4 for either zero
    when not ``zero_sign``)."""
    t = t.double()
    c = torch.zeros(t.shape, dtype=torch.int8)
    c[torch.isnan(t)] = 1
    c[t == math.inf] = 2
    c[t == -math.inf] = 3
    zero = t == 0
    c[zero & ~torch.signbit(t)] = 4
    c[zero & torch.signbit(t)] = 5 if zero_sign else 4
    return c


def _tolerance(xs: list[torch.Tensor], values: list[torch.Tensor]) -> float:
    floats = [t.dtype for t in xs + values if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return max([REL_TOL.get(d, 0.0) for d in floats] + [REL_TOL[torch.float32]])


def compare(outs: list[torch.Tensor], eager: list[torch.Tensor], refs: list[list[torch.Tensor]],
            tol: float, scale: list[float], zero_sign: bool = True) -> None:
    """Judge ``outs`` against ``eager`` and the extra references (see the module docstring);
    ``scale[k]`` is the magnitude output ``k`` is judged against at least; ``zero_sign=False``
    takes +0 and -0 as one class (a program with a max or min)."""
    if len(outs) != len(eager):
        raise WrongMeta(f"{len(outs)} outputs, eager has {len(eager)}")
    for k, (o, e) in enumerate(zip(outs, eager)):
        if o.dtype != e.dtype or tuple(o.shape) != tuple(e.shape):
            raise WrongMeta(f"output {k}: {o.dtype} {tuple(o.shape)}, eager {e.dtype} {tuple(e.shape)}")
        cands = [e] + [r[k].to(e.dtype) for r in refs if r is not None and len(r) == len(outs)
                       and tuple(r[k].shape) == tuple(e.shape)]
        if not o.is_floating_point():
            if not any(torch.equal(o, c) for c in cands):
                bad = (o != e).nonzero()[:5].tolist()
                raise WrongValue(f"output {k} ({o.dtype}): {o.tolist()} != eager {e.tolist()} (first at {bad})")
            continue
        oc = _classes(o, zero_sign)
        ok = torch.zeros(o.shape, dtype=torch.bool)
        for c in cands:
            ok |= oc == _classes(c, zero_sign)
        if not ok.all():
            at = (~ok).nonzero()[0].tolist()
            idx = tuple(at)
            raise SpecialMismatch(f"output {k} ({o.dtype}) at {idx}: got {o[idx].item()!r}, eager "
                                  f"{e[idx].item()!r}, exact {cands[-1][idx].item()!r}")
        # per element the closest reference of the same class: each element may follow eager's
        # rounding or the exact one, and the norm judges how far the whole is from that choice
        o64 = o.double()
        stack = torch.stack([c.double() for c in cands])
        same = torch.stack([oc == _classes(c, zero_sign) for c in cands]) & torch.isfinite(stack)
        dist = torch.where(same, (stack - o64).abs(), torch.full_like(stack, math.inf))
        best = stack.gather(0, dist.argmin(0, keepdim=True))[0] if o.numel() else o64
        fin = torch.isfinite(o64)
        num = (o64[fin] - best[fin]).norm().item()
        den = max(best[fin].norm().item(), scale[k] * math.sqrt(max(o.numel(), 1)), 1e-30)
        if num / den > tol:
            raise WrongValue(f"output {k} ({o.dtype}): relative error {num / den:.3g} > {tol:.0e} "
                             f"(got {o.flatten()[:8].tolist()}, eager {e.flatten()[:8].tolist()})")


def _scales(program, xs: list[torch.Tensor]) -> list[float]:
    """Per output: the largest finite magnitude among it and its ancestors, run in float64."""
    from fuzz_program import Builder, Ref
    b = Builder("ref")
    for inp, x in zip(program.inputs, _cast_inputs(xs, torch.float64, (torch.float16, torch.bfloat16, torch.float32))):
        b.values[inp.name] = x
    try:
        for s in program.steps:
            b.add_step(s.op, s.args, s.kwargs, b.call(s.op, s.args, s.kwargs))
    except Exception:  # noqa: BLE001 - float64 need not run everything (view.dtype): no scale
        return [0.0] * len(program.outputs)
    out = []
    for name in program.outputs:
        m = 0.0
        for n in b.ancestors(name) | {name}:
            t = b.values.get(n)
            if isinstance(t, torch.Tensor) and t.numel() and (t.is_floating_point() or t.dtype != torch.bool):
                f = t.double().abs()
                f = f[torch.isfinite(f)]
                m = max(m, f.max().item() if f.numel() else 0.0)
        out.append(m)
    _ = Ref
    return out


def check(fn: Callable, inputs: list[torch.Tensor], mode: str, dynamic: bool = False, program=None) -> None:
    """Compile ``fn`` under ``mode`` and judge it on ``inputs`` against eager (raises a
    :class:`Find`). ``program``: the :class:`~fuzz_program.Program` of ``fn`` (for the
    magnitudes of its intermediates), optional."""
    eager, eager_err = _run(fn, inputs)
    torch._dynamo.reset()
    with tilewright.config.patch(**(FAST | MODES[mode])), collect_reports() as reports:
        compiled = torch.compile(fn, backend="tilewright", dynamic=dynamic)
        outs, err = _run(compiled, inputs)
    if eager_err is not None:
        if err is None:
            raise MissingError(f"eager raises {type(eager_err).__name__}: {str(eager_err)[:200]}; compiled returned")
        return
    if err is not None:
        raise SpuriousError(f"compiled raised {type(err).__name__}: {str(err)[:1500]}") from err
    refs = [_run(fn, _cast_inputs(inputs, torch.float64, (torch.float16, torch.bfloat16, torch.float32)))[0],
            _run(fn, _cast_inputs(inputs, torch.float32, (torch.float16, torch.bfloat16)))[0]]
    tol = _tolerance(inputs, eager)
    if program is not None:
        tol = max(tol, _tolerance([], [v for v in _program_values(program, inputs)]))
    scale = _scales(program, inputs) if program is not None else [0.0] * len(eager)
    if len(scale) != len(eager):
        scale = [max(scale + [0.0])] * len(eager)
    compare(outs, eager, refs, tol, scale, zero_sign=program is None or not _takes_max_or_min(program))
    _check_candidates(reports, mode)


def _takes_max_or_min(program) -> bool:
    """Whether a step of ``program`` is an op in :data:`ZERO_SIGN_FREE`."""
    def packet(op) -> str:
        name = getattr(op, "__name__", str(op))  # aten.maximum.default -> "maximum.default"
        return name.split(".")[0].rstrip("_")
    return any(packet(s.op) in ZERO_SIGN_FREE for s in program.steps)


def _program_values(program, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    from fuzz_program import Builder
    b = Builder("eager")
    for inp, x in zip(program.inputs, inputs):
        b.values[inp.name] = x
    try:
        for s in program.steps:
            b.add_step(s.op, s.args, s.kwargs, b.call(s.op, s.args, s.kwargs))
    except Exception:  # noqa: BLE001
        pass
    return [v for v in b.values.values() if isinstance(v, torch.Tensor)]


def _check_candidates(reports, mode: str) -> None:
    for r in reports:
        for k in r.kernels:
            for c in k.candidates:
                if c.status == "wrong" and not c.name.startswith("aten."):
                    raise SavedByCheck(f"{k.op}: candidate {c.name} failed the tuner's check "
                                       f"(rel_err {c.rel_err}, {c.reason[:300]}); winner {k.winner}")
