"""Helpers for the loop-kernel tests: compile a function with generated Triton loop kernels
(the interpreter on the CPU), prove they ran on Triton, and compare with a float64 eager
reference."""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import torch

import tilewright
from tilewright.compiler.report import GraphReport, collect_reports

# ‖out − ref‖ / ‖ref‖ allowed per output dtype, against a float64 reference
REL_TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}



def tolerance(out: torch.Tensor, args: Sequence[Any]) -> float:
    """The relative error allowed for ``out``: its dtype's, or the least precise float input's
    when that is looser (eager rounds each op's result to bf16 where a fused kernel does not, so
    a bf16 program is only as exact as bf16 even where it returns fp32); 0 for integer and
    boolean results, which must be exact."""
    if not out.is_floating_point():
        return 0.0
    ins = [REL_TOL.get(a.dtype, 0.0) for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    return max([REL_TOL.get(out.dtype, 0.0)] + ins)


# tuning kept short: the interpreter's timings decide nothing here
FAST = dict(force_backend="triton", strict=True, bench_rep=1, bench_min_rep=1, bench_warmup=0,
            bench_budget_ms=0.0)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (the absolute error when the reference is all zeros);
    integer and boolean results: the fraction of elements that differ."""
    o, r = out.detach(), ref.detach()
    assert o.shape == r.shape, f"shape {tuple(o.shape)} != reference {tuple(r.shape)}"
    if not (o.dtype.is_floating_point or r.dtype.is_floating_point):
        return (o.long() != r.long()).double().mean().item() if o.numel() else 0.0
    o, r = o.double(), r.double()
    assert torch.equal(torch.isnan(o), torch.isnan(r)), "NaNs where the reference has none (or not)"
    inf = torch.isinf(r)
    assert torch.equal(o[inf], r[inf]), "infinities differ from the reference"
    fin = torch.isfinite(r)
    assert torch.isfinite(o[fin]).all(), "infinities where the reference is finite"
    num = (o[fin] - r[fin]).norm().item()
    den = r[fin].norm().item()
    return num / den if den > 0 else num


def to_reference(x: Any) -> Any:
    """Floats as float64 (leaves requires_grad off), everything else unchanged."""
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().double()
    if isinstance(x, (list, tuple)):
        return type(x)(to_reference(v) for v in x)
    return x


def flat_outputs(out: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) result, in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for v in out for t in flat_outputs(v)]


def run_triton(fn: Callable, *args: Any, **patch: Any) -> tuple[Any, list[GraphReport]]:
    """``fn(*args)`` compiled by tilewright with Triton forced; the result and the reports of the
    graphs compiled. Asserts every generated loop kernel's winner is a Triton kernel."""
    with tilewright.config.patch(**(FAST | patch)), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright", dynamic=False)(*args)
    assert_on_triton(reports)
    return out, reports


def assert_on_triton(reports: Sequence[GraphReport]) -> None:
    """Every graph compiled (no eager fallback) and every generated loop kernel chosen is a
    Triton kernel."""
    assert reports, "nothing was compiled"
    for r in reports:
        assert r.fallback is None, f"graph fell back to eager: {r.fallback}"
        for k in r.kernels:
            assert k.winner.startswith("triton."), f"{k.op} ran on {k.winner}: {k.reason}"


def loop_kernels(reports: Sequence[GraphReport]) -> int:
    """Generated loop kernels over all the graphs compiled."""
    return sum(r.loop_kernels for r in reports)


def check_against_eager(fn: Callable, *args: Any, kernels: int | None = None,
                        rtol: float | None = None, ref_fn: Callable | None = None) -> list[GraphReport]:
    """Compile ``fn`` with Triton loop kernels, run it on ``args`` and compare every output with
    ``fn`` (or ``ref_fn``) run eagerly in float64, by the relative error allowed for the output's
    dtype. ``kernels``: the number of generated loop kernels expected (at least one when None).
    Returns the graph reports."""
    out, reports = run_triton(fn, *args)
    n = loop_kernels(reports)
    if kernels is None:
        assert n >= 1, "no generated loop kernel ran"
    else:
        assert n == kernels, f"{n} loop kernels, expected {kernels}"
    ref = (ref_fn or fn)(*to_reference(args))
    eager = fn(*args)
    outs, refs, eagers = flat_outputs(out), flat_outputs(ref), flat_outputs(eager)
    assert len(outs) == len(refs)
    for o, r, e in zip(outs, refs, eagers):
        assert o.dtype == e.dtype, f"dtype {o.dtype} != eager's {e.dtype}"
        assert o.shape == e.shape, f"shape {tuple(o.shape)} != eager's {tuple(e.shape)}"
        tol = rtol if rtol is not None else tolerance(o, args)
        err = rel_error(o, r.to(o.dtype))  # the reference rounded once: overflow is inf too
        assert err <= tol, f"relative error {err:.3g} > {tol:.0e} ({o.dtype})"
    return reports


def check_training(fn: Callable, *args: Any, seed: int = 0, fwd_kernels: int | None = None,
                   bwd_kernels: int | None = None) -> list[GraphReport]:
    """Compile ``fn`` with Triton loop kernels and train through it once: the forward outputs
    and the gradients of every ``requires_grad`` argument (for a random output gradient) must
    match ``fn`` run eagerly in float64. ``fwd_kernels``/``bwd_kernels``: the loop kernels each
    graph must have (unchecked when None). A module's parameters count as leaves too; its
    reference is a float64 copy. Returns the graph reports (forward, then backward)."""
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad] + params
    assert leaves, "nothing requires grad"
    gen = torch.Generator().manual_seed(seed)
    # the backward graph compiles when the backward runs: inside the patch too
    with tilewright.config.patch(**FAST), collect_reports() as reports:
        outs = flat_outputs(torch.compile(fn, backend="tilewright", dynamic=False)(*args))
        grads_out = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
        got = torch.autograd.grad(outs, leaves, grads_out)
    assert_on_triton(reports)
    kinds = [r.kind for r in reports]
    assert "forward" in kinds and "backward" in kinds, f"graphs compiled: {kinds}"
    fwd = next(r for r in reports if r.kind == "forward")
    bwd = next(r for r in reports if r.kind == "backward")
    if fwd_kernels is not None:
        assert fwd.loop_kernels == fwd_kernels, f"forward: {fwd.loop_kernels} loop kernels, expected {fwd_kernels}"
    if bwd_kernels is not None:
        assert bwd.loop_kernels == bwd_kernels, f"backward: {bwd.loop_kernels} loop kernels, expected {bwd_kernels}"
    ref_args = [a.detach().double().requires_grad_(a.requires_grad)
                if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    ref_leaves = [a for a, orig in zip(ref_args, args) if isinstance(orig, torch.Tensor) and orig.requires_grad]
    ref_fn = fn
    if isinstance(fn, torch.nn.Module):
        ref_fn = copy.deepcopy(fn).double()
        ref_leaves += list(ref_fn.parameters())
    ref_outs = flat_outputs(ref_fn(*ref_args))
    ref_grads = torch.autograd.grad(ref_outs, ref_leaves, [g.double() for g in grads_out])
    for k, (o, r) in enumerate(zip(outs, ref_outs)):
        err = rel_error(o, r)
        assert err <= tolerance(o, args), f"output {k}: relative error {err:.3g} ({o.dtype})"
    for k, (g, r, leaf) in enumerate(zip(got, ref_grads, leaves)):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape
        err = rel_error(g, r)
        assert err <= tolerance(g, args), f"gradient {k}: relative error {err:.3g} ({g.dtype})"
    return reports


# -- inputs: fresh random values in each op's domain, never exact zeros ----------------------
F = torch.nn.functional
FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
LOW = [FP16, BF16]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, dtype: torch.dtype = FP32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """Normal values (never exact zeros in practice)."""
    return (torch.randn(*shape, generator=_gen(seed)) * scale).to(dtype)


def positive(*shape: int, dtype: torch.dtype = FP32, seed: int = 0) -> torch.Tensor:
    """Values in [0.1, 2.1)."""
    return (torch.rand(*shape, generator=_gen(seed)) * 2 + 0.1).to(dtype)


def unit(*shape: int, dtype: torch.dtype = FP32, seed: int = 0) -> torch.Tensor:
    """Values in (-0.9, 0.9), the domain of asin, acos, erfinv."""
    return (torch.rand(*shape, generator=_gen(seed)) * 1.8 - 0.9).to(dtype)


def ints(*shape: int, lo: int = -20, hi: int = 20, dtype: torch.dtype = torch.int64, seed: int = 0) -> torch.Tensor:
    """Random integers in [lo, hi)."""
    return torch.randint(lo, hi, shape, generator=_gen(seed)).to(dtype)


def nonzero_ints(*shape: int, dtype: torch.dtype = torch.int64, seed: int = 0) -> torch.Tensor:
    """Random integers in ±[1, 6): divisors of both signs."""
    g = _gen(seed)
    mag = torch.randint(1, 6, shape, generator=g)
    return (mag * (torch.randint(0, 2, shape, generator=g) * 2 - 1)).to(dtype)


SHAPE = (7, 13)  # odd on both sides: every block has a ragged edge


def strided_refusal(kernel_report) -> str | None:
    """Why a language whose lanes walk a row with a stride (SYCL, Metal, FlyDSL) runs a
    reported kernel elsewhere by design: an attention kernel (no template of theirs), or a loop
    kernel with a scan or a scatter (``templates/loop_schedule.strided_scan_refusal``); None for
    a kernel those languages must run."""
    from tilewright.kinds import problem_from_json
    from tilewright.problem import LoopProblem
    from tilewright.templates.loop_schedule import strided_scan_refusal

    if kernel_report.kind == "attention":
        return "attention has no template in this language (docs/attention.md)"
    problem = problem_from_json(kernel_report.problem_json)
    return strided_scan_refusal(problem.kernel) if isinstance(problem, LoopProblem) else None
