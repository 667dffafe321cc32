"""Special values as a property of every op: each op of the IR (``ir/ops.py``) and every cast,
on every dtype it applies to (fp32, bf16, fp16, the integers, bool), through every emitter that
runs on this machine, against torch's meaning over infinities, NaN, signed zeros, subnormals,
the dtype's extremes and the integer edges (negative division and remainder, wraparound, bool
arithmetic). The values and the judging are in ``tests/special_values.py``.

A new emitter is one entry of :data:`EMITTERS`. Each (emitter, dtype) is rendered and run once,
in kernels of ``max_outputs`` ops (a kernel that fails to build or run is retried op by op, so
one bad op fails alone), and each (emitter, op, dtype) is a test of its own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import special_values as sv
from tilewright.autotune.kinds import LoopInputs, poisoned_loop_outputs
from tilewright.compiler.kernel_factory import TemplateKernelFactory
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

# the interpreter computes with numpy, which warns where IEEE arithmetic makes inf or NaN
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
FACTORY = TemplateKernelFactory()
Run = Callable[[LoopProblem, list[torch.Tensor]], tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class Emitter:
    """One language as this test runs it: ``run(problem, inputs)`` fills NaN-poisoned outputs."""

    name: str
    unavailable: Callable[[], str | None]  # why it cannot run here, or None
    run: Run
    max_outputs: int = 64  # ops per kernel (Metal binds at most 31 buffers)
    dtypes: tuple[str, ...] = sv.DTYPES
    # the dtypes of the fast tier (None: all); the others are marked slow (seconds per build)
    fast: tuple[str, ...] | None = None


def _launch(template_id: str, target: str, params: dict, loader=None) -> Run:
    def run(problem: LoopProblem, xs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        t = get_template(template_id)
        tgt = get_target(target)
        why = t.supports(problem, tgt)
        if not why:
            pytest.skip(f"{template_id} refuses: {why.reason}")
        rendered = t.render(problem, t.space.complete(params), tgt)
        launch = loader(rendered) if loader else FACTORY.compile(rendered)
        outs = poisoned_loop_outputs(problem, "cpu")
        x = LoopInputs(xs, [])
        got = launch(*x.tensors, *x.sizes, outs=outs)
        assert all(g is o for g, o in zip(got, outs)), "the kernel must write the buffers it is handed"
        return tuple(got)
    return run


def _sycl_missing() -> str | None:
    from tilewright.runtime import sycl

    return sycl.unavailable_reason()


def _metal_missing() -> str | None:
    import shutil

    return None if shutil.which("g++") else "no g++ to build the shaders on the host"


def _metal_loader(rendered):
    from metal_host import host_launcher

    return host_launcher(rendered).launch


def _cpp_missing() -> str | None:
    from tilewright.runtime import cpp

    return cpp.unavailable_reason()


EMITTERS = [
    Emitter("triton-interpreter", lambda: None, _launch("triton.pointwise", "cpu", {"XBLOCK": 64})),
    Emitter("torch", lambda: None, _launch("aten.pointwise", "cpu", {})),
    Emitter("sycl-opencl-cpu", _sycl_missing, _launch("sycl.pointwise", "xpu", {"WG": 16}),
            fast=("fp32", "i32")),
    Emitter("metal-host", _metal_missing, _launch("metal.pointwise", "mps", {"num_warps": 1}, _metal_loader),
            max_outputs=26, fast=("fp32", "i32")),
    Emitter("cpp-host", _cpp_missing, _launch("cpp.pointwise", "cpu", {"BLOCK": 4096})),
]
BY_NAME = {e.name: e for e in EMITTERS}


@functools.lru_cache(maxsize=None)
def results(emitter: str, dtype: str) -> dict[str, torch.Tensor | str]:
    """Every case of ``dtype`` through ``emitter``: its output, or why it failed."""
    e = BY_NAME[emitter]
    xs = sv.inputs(dtype)
    todo = sv.cases(dtype)
    out: dict[str, torch.Tensor | str] = {}
    for start in range(0, len(todo), e.max_outputs):
        chunk = todo[start:start + e.max_outputs]
        try:
            got = e.run(sv.problem(dtype, chunk), xs)
            out |= {c.name: g for c, g in zip(chunk, got)}
        except Exception:  # noqa: BLE001 - one op at a time, so each failure has its own reason
            for c in chunk:
                try:
                    out[c.name] = e.run(sv.problem(dtype, [c]), xs)[0]
                except Exception as err:  # noqa: BLE001
                    out[c.name] = f"{type(err).__name__}: {str(err)[:400]}"
    return out


# (emitter, op, dtype) -> why it is expected to fail (None: any dtype); strict, so a fix shows
XFAIL: dict[tuple[str, str, str | None], str] = {}


def _params():
    for e in EMITTERS:
        for dtype in e.dtypes:
            for name in sv.case_names(dtype):
                reason = XFAIL.get((e.name, name, dtype)) or XFAIL.get((e.name, name, None))
                marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
                if e.fast is not None and dtype not in e.fast:
                    marks.append(pytest.mark.slow)
                yield pytest.param(e.name, dtype, name, marks=marks, id=f"{e.name}-{dtype}-{name}")


@pytest.mark.parametrize("emitter,dtype,name", list(_params()))
def test_special_values_match_torch(emitter, dtype, name):
    why = BY_NAME[emitter].unavailable()
    if why:
        pytest.skip(f"{emitter}: {why}")
    got = results(emitter, dtype)[name]
    if isinstance(got, str):
        pytest.fail(f"{emitter} {name} on {dtype}: {got}")
    case = next(c for c in sv.cases(dtype) if c.name == name)
    bad = sv.mismatches(case, got, sv.inputs(dtype))
    assert not bad, f"{emitter}, {dtype}:\n" + "\n".join(bad)


def test_every_op_of_the_ir_is_covered():
    from tilewright.ir.ops import OPS

    covered = {n for d in sv.DTYPES for n in sv.case_names(d)}
    assert set(OPS) <= covered, f"not covered: {sorted(set(OPS) - covered)}"


# -- compositions: pairs and triples of float ops in one kernel ------------------------------------
@functools.lru_cache(maxsize=None)
def composition_results(emitter: str, dtype: str) -> dict[str, torch.Tensor | str]:
    """Every composition of ``dtype`` through ``emitter`` (as :func:`results`)."""
    e = BY_NAME[emitter]
    xs = sv.inputs(dtype)
    out: dict[str, torch.Tensor | str] = {}
    for chunk in sv.composition_batches(dtype, e.max_outputs):
        try:
            got = e.run(sv.problem(dtype, chunk), xs)
            out |= {c.name: g for c, g in zip(chunk, got)}
        except Exception as err:  # noqa: BLE001 - reported per composition below
            out |= {c.name: f"{type(err).__name__}: {str(err)[:400]}" for c in chunk}
    return out


def _composition_params():
    for e in EMITTERS:
        marks = [pytest.mark.slow] if e.fast is not None else []  # seconds per build
        yield pytest.param(e.name, "fp32", marks=marks, id=f"{e.name}-fp32")


@pytest.mark.parametrize("emitter,dtype", list(_composition_params()))
def test_compositions_keep_nan_inf_and_signed_zeros(emitter, dtype):
    why = BY_NAME[emitter].unavailable()
    if why:
        pytest.skip(f"{emitter}: {why}")
    got = composition_results(emitter, dtype)
    xs = sv.inputs(dtype)
    bad = []
    for case in sv.composition_cases(dtype):
        g = got[case.name]
        bad += [f"{case.name}: {g}"] if isinstance(g, str) else sv.composition_mismatches(case, g, xs, limit=2)
    assert not bad, f"{emitter}, {dtype}: {len(bad)} lines\n" + "\n".join(bad[:40])


# -- the tuner's check: a second input set of special values -------------------------------------
def test_the_check_fails_a_kernel_that_turns_inf_into_nan(monkeypatch):
    from test_loop_kernels import loop_problems

    from tilewright.autotune.candidates import Candidate
    from tilewright.autotune.evaluate import EvalTask, evaluate, forget_inputs
    from tilewright.kinds.loop import special_loop_inputs
    from tilewright.templates.triton import emit

    (problem,) = loop_problems(lambda a: torch.log1p(a.abs()) * 2, torch.randn(5, 37))
    x = special_loop_inputs(problem, "cpu", seed=0)
    assert x is not None and x.tensors[0].isinf().any() and x.tensors[0].isnan().any()
    t = get_template("triton.pointwise")
    cand = Candidate.of(t.id, t.source_hash, t.space.complete({"XBLOCK": 64}))
    forget_inputs()
    ok = evaluate(EvalTask(problem, cand, "cpu", "cpu"), TemplateKernelFactory(), timed=False).record
    assert ok.status == "ok", ok.reason
    # log1p(inf) computed as log(u) * (x / (u - 1)): inf * (inf / inf) = NaN; random normals
    # never show it, the special values do
    bad = emit.HELPERS["_log1p"].replace('tl.where(u == float("inf"), u, tl.log(u) * (x / (u - 1.0)))',
                                         "tl.log(u) * (x / (u - 1.0))")
    assert bad != emit.HELPERS["_log1p"]
    monkeypatch.setitem(emit.HELPERS, "_log1p", bad)
    forget_inputs()
    wrong = evaluate(EvalTask(problem, cand, "cpu", "cpu"), TemplateKernelFactory(), timed=False).record
    assert wrong.status == "wrong" and "special values" in wrong.reason


def test_the_special_value_check_is_skipped_where_eager_arithmetic_disagrees_with_float64():
    from test_loop_kernels import loop_problems

    from tilewright.kinds.loop import special_loop_inputs

    # a subnormal's square underflows to 0 in fp32, not in float64: x*x / (x*x) is NaN in eager
    # arithmetic and 1 in the reference, no one answer, so the check does not judge by it
    (problem,) = loop_problems(lambda a: (a * a) / (a * a).sum(1, keepdim=True), torch.randn(3, 8))
    x = special_loop_inputs(problem, "cpu", seed=0)
    x.tensors[0][1] = torch.finfo(torch.float32).smallest_normal * torch.finfo(torch.float32).eps * 3
    assert TemplateKernelFactory().special_reference(problem, x) is None
    x.tensors[0][1] = 1.0
    assert TemplateKernelFactory().special_reference(problem, x) is not None


# -- scans: every ordered pair of special values as a row, through every emitter that scans -------
# rows of 2 ([a, b]) and of 32 (16 copies of a, then 16 of b: a looped row of RBLOCK 16 carries
# a's prefix into b's step); the long rows leave out the dtype's extremes (16 x max overflows in
# fp32, where eager's CPU cumsum accumulates in float64 and comes back from it)
SCAN_EMITTERS = {
    "triton-persistent": ("triton.reduction", "cpu", {"XBLOCK": 4, "PERSISTENT": True}),
    "triton-looped": ("triton.reduction", "cpu", {"XBLOCK": 4, "PERSISTENT": False, "RBLOCK": 16}),
    "torch": ("aten.reduction", "cpu", {}),
    "cpp-host": ("cpp.reduction", "cpu", {"PERSISTENT": True}),
}
SCAN_DTYPES = ("fp32", "bf16", "fp16", "i64", "i32", "bool")
SCAN_ULPS = {"sum": 4, "prod": 4, "logsumexp": sv.APPROXIMATE_ULPS}


def _scan_kinds(dtype: str) -> list[str]:
    from tilewright.ir import dtypes

    return list(sv.SCAN_KINDS) if dtypes.is_float(dtype) else [k for k in sv.SCAN_KINDS if k != "logsumexp"]


@functools.lru_cache(maxsize=None)
def _scan_results(emitter: str, dtype: str, half: int) -> tuple[list[torch.Tensor], tuple[torch.Tensor, ...]]:
    template_id, target, params = SCAN_EMITTERS[emitter]
    if emitter == "cpp-host" and (why := _cpp_missing()) is not None:
        pytest.skip(f"no C++ compiler: {why}")
    problem, xs = sv.scan_problem(dtype, _scan_kinds(dtype), half)
    return xs, _launch(template_id, target, params)(problem, xs)


def _scan_params():
    for emitter in sorted(SCAN_EMITTERS):
        for dtype in SCAN_DTYPES:
            for half in (1, 16):
                if "looped" in emitter and half == 1 and dtype not in ("fp32", "i64"):
                    continue  # its rows of 32 start with the same pairs, and carry them (~15 s each)
                marks = [] if dtype in ("fp32", "i64") else [pytest.mark.slow]  # ~5 s a build
                yield pytest.param(emitter, dtype, half, marks=marks, id=f"{emitter}-{dtype}-{2 * half}")


@pytest.mark.parametrize("emitter,dtype,half", list(_scan_params()))
def test_scans_match_torch_on_special_values(emitter, dtype, half):
    xs, got = _scan_results(emitter, dtype, half)
    bad = []
    for kind, g in zip(_scan_kinds(dtype), got):
        bad += sv.scan_mismatches(kind, g, xs[0], SCAN_ULPS.get(kind, sv.ULPS))
    assert not bad, f"{emitter}, {dtype}, rows of {2 * half}:\n" + "\n".join(bad)


@pytest.mark.parametrize("template_id,target", [("sycl.reduction", "xpu"), ("metal.reduction", "mps")])
def test_strided_languages_refuse_scans(template_id, target):
    problem, _ = sv.scan_problem("fp32", ["sum"], 1)
    why = get_template(template_id).supports(problem, get_target(target))
    assert not why and "scan" in why.reason


# -- the tuner's check on small tensors, compositions and signed zeros --------------------------------
def _check(problem, monkeypatch=None, **patch):
    from tilewright.autotune.candidates import Candidate
    from tilewright.autotune.evaluate import EvalTask, evaluate, forget_inputs
    from tilewright.templates.triton import emit

    for op, render in patch.items():
        monkeypatch.setitem(emit.MATH, op, (render, ()))
    t = get_template("triton.pointwise")
    cand = Candidate.of(t.id, t.source_hash, t.space.complete({"XBLOCK": 64}))
    forget_inputs()
    return evaluate(EvalTask(problem, cand, "cpu", "cpu"), TemplateKernelFactory(), timed=False).record


def test_the_check_puts_every_special_value_into_a_small_tensor():
    from test_loop_kernels import loop_problems

    from tilewright.kinds.loop import special_loop_inputs

    (problem,) = loop_problems(lambda a: torch.sin(torch.atan(a)), torch.randn(8))
    for seed in range(4):
        x = special_loop_inputs(problem, "cpu", seed=seed).tensors[0]
        assert x.isnan().any() and (x == float("inf")).any() and (x == -float("inf")).any(), x
        assert ((x == 0) & x.signbit()).any() and ((x == 0) & ~x.signbit()).any(), x


def test_the_check_fails_a_composition_that_turns_nan_into_one_on_a_small_tensor(monkeypatch):
    from test_loop_kernels import loop_problems

    # what g++ made of sin(atan(x)) when the libm calls were builtins: copysign(1, x) for NaN
    (problem,) = loop_problems(lambda a: torch.sin(torch.atan(a)), torch.randn(8))
    assert _check(problem).status == "ok"
    bad = _check(problem, monkeypatch, sin=lambda a, dt: f"tl.where({a} != {a}, 1.0, tl.sin({a}))")
    assert bad.status == "wrong" and "special values" in bad.reason


def test_the_check_fails_a_kernel_that_loses_the_sign_of_zero(monkeypatch):
    from test_loop_kernels import loop_problems

    (problem,) = loop_problems(lambda a: -a * torch.exp(a), torch.randn(5, 37))
    assert _check(problem).status == "ok"
    bad = _check(problem, monkeypatch, neg=lambda a, dt: f"(0.0 - {a})")  # -(+0) is -0, 0 - (+0) is +0
    assert bad.status == "wrong" and "special values" in bad.reason, bad
