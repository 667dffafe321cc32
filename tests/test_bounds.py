"""No wrong answer at the edges (issue 27): an index out of range and an integer division by
zero behave as eager's in every emitter that runs them.

* Gathers (embedding, gather, index_select, ``x[i]``) and scatters (scatter_add,
  scatter_reduce, index_add, index_put) with index -1 or ``size``: the kernel raises
  IndexError (eager raises IndexError or RuntimeError; a compiled graph's run-time guard then
  reruns it on ATen, so the user sees eager's own message). -1 is valid only where eager wraps
  it (``x[i]``, ``index_put``), and reads the last row there.
* Integer floor/trunc division, remainder and fmod by zero: RuntimeError "ZeroDivisionError"
  on the CPU; a quotient that a ``cat`` or ``pad`` does not keep is no error.
* Indices proven in range are not checked; ``config.index_checks`` turns the checks off; on a
  GPU the checks are device asserts, compiled with debug on.

Emitters: Triton (the interpreter: an explicit check, since ``tl.device_assert`` does nothing
there), C++, SYCL (the OpenCL CPU device), Metal (run on the host), and the torch form.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from metal_host import host_launcher
from test_loop_kernels import loop_problems

import tilewright
from tilewright.autotune.kinds import make_loop_inputs, poisoned_loop_outputs
from tilewright.compiler.kernel_factory import TemplateKernelFactory
from tilewright.compiler.report import collect_reports
from tilewright.runtime import cpp as cpp_runtime
from tilewright.runtime import sycl as sycl_runtime
from tilewright.runtime.metal_check import check_shader
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

FACTORY = TemplateKernelFactory()
CPU, XPU, MPS = get_target("cpu"), get_target("xpu"), get_target("mps")
NO_CXX = cpp_runtime.unavailable_reason()
NO_SYCL = sycl_runtime.unavailable_reason()
# emitter -> (template language, target, why it cannot run here or None)
EMITTERS = {
    "triton": ("triton", CPU, None),
    "cpp": ("cpp", CPU, NO_CXX),
    "sycl": ("sycl", XPU, NO_SYCL),
    "metal": ("metal", MPS, NO_CXX),
    "torch": ("aten", CPU, None),
}
SCATTERING = ("triton", "torch")  # the others refuse scatters (no atomics written for them)

W = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
GATHERS = {
    # name: (fn, index shape, eager wraps -1)
    "embedding": (lambda w, i: F.embedding(i, w) * 2, (4,), False),
    "index_select": (lambda w, i: w.index_select(0, i) + 1, (4,), False),
    "gather": (lambda w, i: w.gather(0, i) * 3, (2, 3), False),
    "advanced_index": (lambda w, i: w[i] * 2, (4,), True),
}
SCATTERS = {
    "scatter_add": (lambda w, i, v: (w * 1).scatter_add(0, i, v), (2, 3), (2, 3), False),
    "scatter_amax": (lambda w, i, v: (w * 1).scatter_reduce(0, i, v, "amax"), (2, 3), (2, 3), False),
    "index_add": (lambda w, i, v: (w * 1).index_add(0, i, v), (3,), (3, 3), False),
    "index_put": (lambda w, i, v: torch.index_put(w * 1, (i,), v, accumulate=True), (3,), (3, 3), True),
}
DIVISIONS = {
    "floor_divide": lambda a, b: a // b,
    "trunc_divide": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": lambda a, b: a % b,
    "fmod": lambda a, b: torch.fmod(a, b),
}


def _skip_unless(emitter: str) -> None:
    why = EMITTERS[emitter][2]
    if why is not None:
        pytest.skip(f"{emitter}: {why}")


def _launcher(emitter: str, problem):
    lang, target, _ = EMITTERS[emitter]
    template = get_template(f"{lang}.{problem.kind}")
    params = template.space.complete({}) if hasattr(template, "space") else {}
    rendered = template.render(problem, params, target)
    if emitter == "metal":
        check_shader(rendered.meta["shader"])
        return host_launcher(rendered).launch
    return FACTORY.compile(rendered)


def _run(emitter: str, problem, tensors: list[torch.Tensor]):
    outs = poisoned_loop_outputs(problem, "cpu")
    return _launcher(emitter, problem)(*tensors, outs=outs)


def _with_index(problem, tensors: list[torch.Tensor], index: torch.Tensor) -> list[torch.Tensor]:
    """The kernel's inputs with ``index`` in place of the index buffer (an int64 input)."""
    out = list(tensors)
    spots = [k for k, b in enumerate(problem.kernel.inputs) if b.dtype == "i64"]
    assert len(spots) == 1, [b.name for b in problem.kernel.inputs]
    out[spots[0]] = index
    return out


def _index(shape: tuple[int, ...], bad: int | None) -> torch.Tensor:
    i = torch.arange(torch.Size(shape).numel()).reshape(shape) % 5
    if bad is not None:
        i.view(-1)[1] = bad
    return i


def _gather_problem(name: str):
    fn, shape, _ = GATHERS[name]
    (problem,) = loop_problems(fn, W, _index(shape, None))
    return problem


def _inputs_for(problem, w: torch.Tensor, index: torch.Tensor, v: torch.Tensor | None = None):
    x = make_loop_inputs(problem, "cpu", seed=1)
    tensors = _with_index(problem, x.tensors, index)
    for k, b in enumerate(problem.kernel.inputs):
        if b.dtype == "fp32" and tuple(tensors[k].shape) == tuple(w.shape) and b.init is None:
            tensors[k] = w
        elif v is not None and b.dtype == "fp32" and tuple(tensors[k].shape) == tuple(v.shape):
            tensors[k] = v
    return tensors


# -- gathers --------------------------------------------------------------------------------------
@pytest.mark.parametrize("emitter", sorted(EMITTERS))
@pytest.mark.parametrize("name", sorted(GATHERS))
def test_a_gather_out_of_range_raises_and_in_range_matches_eager(emitter, name):
    _skip_unless(emitter)
    if emitter == "sycl" and name in ("index_select", "gather"):
        pytest.skip("SYCL builds take ~4 s each: its gathers share one load path, covered by the others")
    fn, shape, wraps = GATHERS[name]
    problem = _gather_problem(name)
    for bad in (-1, 5, 2 ** 40):
        i = _index(shape, bad)
        if bad == -1 and wraps:
            (got,) = _run(emitter, problem, _inputs_for(problem, W, i))
            assert torch.equal(got, fn(W, i)), f"{emitter}: -1 must read the last row (eager wraps it)"
            continue
        with pytest.raises(IndexError):
            _run(emitter, problem, _inputs_for(problem, W, i))
    i = _index(shape, 4)
    (got,) = _run(emitter, problem, _inputs_for(problem, W, i))
    assert torch.equal(got, fn(W, i))


# -- scatters -------------------------------------------------------------------------------------
@pytest.mark.parametrize("emitter", SCATTERING)
@pytest.mark.parametrize("name", sorted(SCATTERS))
def test_a_scatter_out_of_range_raises_and_writes_nothing_outside(emitter, name):
    fn, ishape, vshape, wraps = SCATTERS[name]
    v = torch.randn(vshape, generator=torch.Generator().manual_seed(1))
    problems = loop_problems(fn, W, _index(ishape, None), v)
    scatter = next(p for p in problems if p.kernel.scatters())
    for bad in (-1, 5):
        i = _index(ishape, bad)
        tensors = _inputs_for(scatter, W, i, v)
        target = next(k for k, b in enumerate(scatter.kernel.inputs) if b.name == scatter.kernel.outputs[0].init)
        tensors[target] = W.clone()
        if bad == -1 and wraps:
            _run(emitter, scatter, tensors)
            continue
        with pytest.raises(IndexError):
            _run(emitter, scatter, tensors)


# -- integer division by zero ---------------------------------------------------------------------
A = torch.tensor([7, -7, 3, 5, -9])
B = torch.tensor([2, 3, 1, -3, 4])


@pytest.mark.parametrize("emitter", sorted(set(EMITTERS) - {"metal"}))  # Metal: GPU semantics
def test_integer_division_by_zero_raises_zero_division_error(emitter):
    # one kernel (a SYCL build is ~4 s), each op with a divisor of its own: a zero in one
    # divisor tests that op alone
    _skip_unless(emitter)
    ops = list(DIVISIONS.values())

    def fn(a, *divisors):
        return tuple(op(a, d) for op, d in zip(ops, divisors))

    (problem,) = loop_problems(fn, A, *[B + k for k in range(len(ops))])
    assert len(problem.kernel.inputs) == 1 + len(ops)
    for k, name in enumerate(DIVISIONS):
        divisors = [B.clone() for _ in ops]
        divisors[k][3] = 0
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            _run(emitter, problem, [A, *divisors])
            pytest.fail(f"{emitter}: {name} by zero returned")
    got = _run(emitter, problem, [A, *[B] * len(ops)])
    for g, want in zip(got, fn(A, *[B] * len(ops))):
        assert torch.equal(g, want)


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_a_quotient_a_cat_or_pad_does_not_keep_is_no_error(emitter):
    # the lanes of a cat outside the quotient's part read 0 for the divisor (masked loads): the
    # C++ kernel raised ZeroDivisionError for every torch.cat([a // b, c])
    _skip_unless(emitter)
    c = torch.tensor([1, 2, 3])
    cases = [(lambda a, b, c: torch.cat([a // b, c]) * 2, (A, B, c)),
             (lambda a, b: F.pad(a % b, (2, 1)) + 1, (A, B))]
    for fn, args in cases[:1] if emitter == "sycl" else cases:  # a SYCL build is ~4 s
        (problem,) = loop_problems(fn, *args)
        (got,) = _run(emitter, problem, list(args))
        assert torch.equal(got, fn(*args))


# -- what is proven is not checked; the setting; the GPU ----------------------------------------
def test_an_index_proven_in_range_is_not_checked_and_the_setting_turns_checks_off():
    # w[i % 5]: a modulo by the dim; histc's bin: clamped at both ends
    (mod,) = loop_problems(lambda w, i: w[i % 5] * 2, W, _index((4,), None))
    (gather,) = loop_problems(lambda w, i: F.embedding(i, w) * 2, W, _index((4,), None))
    hist = next(p for p in loop_problems(lambda x: torch.histc(x, 4, -1.0, 1.0) * 2, torch.randn(20))
                if p.kernel.scatters())
    triton = get_template("triton.pointwise")
    src = lambda p: triton.render(p, triton.space.complete({}), CPU).source  # noqa: E731
    assert "tw_err" in src(gather)
    assert "tw_err" not in src(mod) and "tw_err" not in src(hist)
    if NO_CXX is None:
        cpp = get_template("cpp.pointwise")
        assert "tw_index(" in cpp.render(gather, cpp.space.complete({}), CPU).source
        assert "tw_index(" not in cpp.render(mod, cpp.space.complete({}), CPU).source
    with tilewright.config.patch(index_checks=False):
        assert "tw_err" not in src(gather)


def test_gpu_kernels_assert_with_debug_compilation_and_no_overflow_sanitizer():
    sm90 = get_target("cuda:sm_90a")
    problem = _gather_problem("embedding")
    triton = get_template("triton.pointwise")
    rendered = triton.render(problem, triton.space.complete({}), sm90)
    assert "tl.device_assert(" in rendered.source and "tw_err" not in rendered.source
    assert "debug=True, sanitize_overflow=False" in rendered.source  # the JIT launch
    assert rendered.aot.options.get("debug") is True and rendered.aot.options.get("sanitize_overflow") is False
    # integer division on a GPU: no check (eager's CUDA kernels divide by zero without an error)
    (div,) = loop_problems(DIVISIONS["floor_divide"], A, B)
    plain = triton.render(div, triton.space.complete({}), sm90)
    assert "device_assert" not in plain.source and "debug=True" not in plain.source


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["triton", "cpp", "aten"])
def test_compiled_models_raise_eagers_error_for_a_bad_index_or_a_zero_divisor(backend):
    if backend == "cpp" and NO_CXX is not None:
        pytest.skip(NO_CXX)
    fast = dict(force_backend=backend, bench_rep=1, bench_min_rep=1, bench_warmup=0, bench_budget_ms=0.0)
    cases = [(lambda w, i: F.embedding(i, w) * 2, (W, _index((4,), -1)), IndexError, "index out of range"),
             (lambda w, i: w.gather(0, i) * 2, (W, _index((2, 3), 5)), RuntimeError, "out of bounds"),
             (DIVISIONS["remainder"], (A, torch.tensor([2, 0, 1, 3, 4])), RuntimeError, "ZeroDivisionError")]
    for fn, args, exc, match in cases:
        torch._dynamo.reset()
        with tilewright.config.patch(**fast):
            compiled = torch.compile(fn, backend="tilewright", dynamic=False)
            with pytest.raises(exc, match=match):
                compiled(*args)


def test_flydsl_refuses_a_gather_it_cannot_check_unless_checks_are_off():
    # FlyDSL kernels have no device assert or error flag written: an unproven gather is
    # refused with its reason (it runs on Triton or ATen); a proven one renders
    gfx950 = get_target("gfx950")
    flydsl = get_template("flydsl.pointwise")
    gather = _gather_problem("embedding")
    (mod,) = loop_problems(lambda w, i: w[i % 5] * 2, W, _index((4,), None))
    why = flydsl.supports(gather, gfx950)
    if not why and "not installed" in why.reason:  # torch 2.11's compat venv, the GPU machine
        pytest.skip(why.reason)
    assert not why and "not proven in range" in why.reason
    assert flydsl.supports(mod, gfx950)
    with tilewright.config.patch(index_checks=False):
        assert flydsl.supports(gather, gfx950)


@pytest.mark.slow
def test_the_gpu_build_keeps_the_assert_and_drops_it_with_checks_off(tmp_path):
    # compile-only (no GPU needed): Triton drops tl.device_assert unless built with debug; the
    # sm_90a build of a checked gather must call __assertfail, the unchecked one must not
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.targets import triton_can_target

    sm90 = get_target("cuda:sm_90a")
    if triton_can_target(sm90) is not None:
        pytest.skip(str(triton_can_target(sm90)))
    triton = get_template("triton.pointwise")
    problem = _gather_problem("embedding")
    jobs = []
    for checks in (True, False):
        with tilewright.config.patch(index_checks=checks):
            r = triton.render(problem, triton.space.complete({}), sm90)
        jobs.append(CompileJob(f"checks_{checks}", r.source, r.aot.to_json(), sm90.triton))
    results = {r.name: r for r in compile_jobs(jobs, tmp_path, workers=1, timeout_s=300)}
    ptx = {}
    for name, r in results.items():
        assert r.ok, r.error
        ptx[name] = (tmp_path / r.artifacts["ptx"]).read_text()
    assert "__assertfail" in ptx["checks_True"]
    assert "__assertfail" not in ptx["checks_False"]


# an index made of an integer input: the tuner's random values for the input must keep the
# index in range, or every candidate fails on them and a valid model's kernel moves to ATen with
# a warning (nll_loss(x, -t), a new-user trial: "Target -4 is out of bounds" for targets in
# (-10, 0])
MADE_INDICES = {
    "negated, nll_loss's ignore_index": (lambda a, t: F.nll_loss(a, -t), [-1, -9, 0]),
    "shifted down": (lambda a, t: a.gather(1, (t - 1).unsqueeze(1)).sum(), [1, 10, 5]),
    "two minus": (lambda a, t: a.gather(1, (2 - t).unsqueeze(1)).sum(), [2, -7, 0]),
    # advanced indexing wraps negative indices: valid for i in [-3, 3) over 10 columns, though
    # each use alone would draw i where the other's index is out of range
    "plus and minus five, wrapped": (lambda a, t: a[:, t + 5] + a[:, t - 5], [0, 1, -2]),
    # an unsigned input under a negative coefficient: never drawn negative (it would wrap to 255)
    "uint8, negated": (lambda a, t: a[:, -t.long()] * 2, torch.tensor([1, 3, 8], dtype=torch.uint8)),
}


@pytest.mark.parametrize("case", sorted(MADE_INDICES))
def test_tuning_draws_an_input_whose_index_stays_in_range(case):
    fn, t = MADE_INDICES[case]
    a, t = torch.randn(3, 10).log_softmax(-1), torch.as_tensor(t)
    (problem,) = loop_problems(fn, a, t)
    for seed in range(4):
        x = make_loop_inputs(problem, "cpu", seed)
        (ints,) = [v for v in x.tensors if not v.is_floating_point()]
        (floats,) = [v for v in x.tensors if v.is_floating_point()]
        try:
            out = fn(floats, ints)
        except (IndexError, RuntimeError) as e:  # eager's refusal of an index out of range
            pytest.fail(f"seed {seed}: tuning drew {ints.tolist()}, which makes an index out of range: {e}")
        assert torch.isfinite(out).all(), (seed, ints.tolist())


@pytest.mark.skipif(NO_CXX is not None, reason=str(NO_CXX))
def test_a_model_indexing_with_a_negated_target_compiles_with_no_warning():
    fn, t = MADE_INDICES["negated, nll_loss's ignore_index"]
    a, t = torch.randn(3, 10).log_softmax(-1), torch.tensor(t)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught, collect_reports() as reports:
        warnings.simplefilter("always")
        out = torch.compile(fn, backend="tilewright")(a, t)
    torch.testing.assert_close(out, fn(a, t))
    assert not [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    assert not [k.winner for r in reports for k in r.kernels if k.winner.startswith("aten.")]


def _cache_write(cache, new, past):
    # a static KV cache's write at past + arange(new tokens), and the next position: one combo
    # kernel whose first part reads `past` with no bound and whose scatter indexes through it
    # (GPT-2's static-cache generate(): tuning drew `past` up to the cache's length, every
    # candidate failed, and these kernels moved to ATen with warnings)
    return past + new.shape[0], cache.index_put((past + torch.arange(new.shape[0]),), new * 2)


@pytest.mark.skipif(NO_CXX is not None, reason=str(NO_CXX))
@pytest.mark.parametrize("past", [0, 1])
def test_a_cache_write_at_past_plus_arange_compiles_with_no_warning(past):
    # 4 new rows into 5: only past 0 and 1 fit, most draws below the cache's length do not
    cache, new, past = torch.randn(5, 8), torch.randn(4, 8), torch.tensor(past)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught, collect_reports() as reports:
        warnings.simplefilter("always")
        out = torch.compile(_cache_write, backend="tilewright")(cache, new, past)
    for got, ref in zip(out, _cache_write(cache, new, past)):
        torch.testing.assert_close(got, ref)
    assert not [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    assert not [k.winner for r in reports for k in r.kernels if k.winner.startswith("aten.")]
