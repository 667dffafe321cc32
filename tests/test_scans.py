"""Scans (cumsum, cumprod, logcumsumexp, cummax/cummin values and indices) as loop kernels: each
rendered by the Triton templates (persistent rows and looped rows that carry the prefix across
RBLOCK steps, into NaN-poisoned outputs, against the float64 torch form), compiled end to end
against eager in float64, fused with what precedes and follows them, along any dim, on
non-contiguous inputs and ragged rows; the torch form against eager; the languages that have
no scans refuse them with a reason (C++ runs them: tests/test_cpp_rowops.py)."""

from __future__ import annotations

import pytest
import torch

from loop_check import BF16, check_against_eager, ints, randn
from test_loop_kernels import REDUCTION_PARAMS, assert_matches_reference, loop_problems, run_template
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

ROW = 37  # over two RBLOCKs of 16: the looped form takes three steps, the last one ragged

SCANS = {
    "cumsum": (lambda a: a.cumsum(-1), lambda: [randn(5, ROW)]),
    "cumsum_bf16": (lambda a: a.cumsum(-1), lambda: [randn(5, ROW, dtype=BF16)]),
    "cumsum_int32_to_int64": (lambda a: a.cumsum(1), lambda: [ints(5, ROW, dtype=torch.int32)]),
    "cumsum_bool": (lambda a: (a > 0).cumsum(1), lambda: [randn(5, ROW)]),
    "cumprod": (lambda a: (a * 0.2 + 1).cumprod(-1), lambda: [randn(5, ROW)]),
    "logcumsumexp": (lambda a: torch.logcumsumexp(a * 3, -1), lambda: [randn(5, ROW)]),
    "cummax": (lambda a: torch.cummax(a, 1), lambda: [randn(5, ROW)]),
    "cummin_values_only": (lambda a: torch.cummin(a, 1).values * 2, lambda: [randn(5, ROW)]),
    "cummax_ties": (lambda a: torch.cummax(a.round(), 1), lambda: [randn(5, ROW)]),
    "cummin_int": (lambda a: torch.cummin(a, 1), lambda: [ints(5, ROW, lo=-3, hi=3)]),
    # the carry starts at the type's own extreme (uint8: 0 / 255; int8: -128 / 127)
    "cummax_uint8": (lambda a: torch.cummax(a, 1), lambda: [ints(5, ROW, lo=0, hi=256, dtype=torch.uint8)]),
    "cummin_int8": (lambda a: torch.cummin(a, 1), lambda: [ints(5, ROW, lo=-128, hi=128, dtype=torch.int8)]),
    "cumsum_dim0": (lambda a: (a.sin() * 2).cumsum(0) + 1, lambda: [randn(ROW, 5)]),
    "cummax_middle_dim": (lambda a: torch.cummax(a, 1).indices, lambda: [randn(3, ROW, 4)]),
    "cumsum_transposed_input": (lambda a: a.t().cumsum(1), lambda: [randn(ROW, 5)]),
    "softmax_then_cumsum": (lambda a: a.softmax(-1).cumsum(-1) * 2, lambda: [randn(5, ROW)]),
    "cumsum_then_sum": (lambda a: (a.cumsum(-1), a.cumsum(-1).sum(-1)), lambda: [randn(5, ROW)]),
    "cumsum_of_cumsum": (lambda a: a.cumsum(-1).cumsum(-1), lambda: [randn(5, ROW)]),
}


@pytest.mark.parametrize("name", sorted(SCANS))
def test_scan_kernels_fill_poisoned_outputs_with_the_reference(name, cpu):
    fn, make = SCANS[name]
    problems = loop_problems(fn, *make())
    assert [p.kind for p in problems] == ["reduction"], "one row kernel per scan graph"
    for problem in problems:
        assert problem.kernel.scans()
        for params in REDUCTION_PARAMS + [dict(XBLOCK=8, PERSISTENT=False, RBLOCK=16)]:
            got, ref = run_template(problem, params, cpu)
            assert_matches_reference(problem, got, ref)


@pytest.mark.parametrize("name", ["cumsum", "cummax", "logcumsumexp", "cumsum_dim0", "cumsum_bf16",
                                  "cumsum_int32_to_int64", "softmax_then_cumsum", "cummax_middle_dim"])
def test_compiled_scans_match_eager_in_one_kernel(name):
    fn, make = SCANS[name]
    check_against_eager(fn, *make(), kernels=1)


def test_a_scan_fuses_with_the_pointwise_ops_before_and_after_it_along_a_leading_dim():
    # (4, 6, 5) scanned along dim 1, a square-free shape: the pointwise ops are placed by the
    # data flow around the scan's rows
    check_against_eager(lambda a, b: torch.cumsum(a.exp() * b, 1).tanh() + b, randn(4, 6, 5), randn(4, 6, 5),
                        kernels=1)


def test_a_scan_over_a_square_shape_places_its_neighbours_by_the_data_flow():
    check_against_eager(lambda a: (a * 2).cumsum(0) - a, randn(9, 9), kernels=1)


def test_reading_a_scan_at_another_element_keeps_it_in_memory():
    # x[i] - cumsum[i - 1] (an exclusive prefix through a slice) reads the scan off its own
    # element: the scan is stored and the difference is a second kernel
    fn = lambda a: a[:, 1:] - a.cumsum(1)[:, :-1]  # noqa: E731
    check_against_eager(fn, randn(5, ROW), kernels=2)


def test_cummax_and_cummin_follow_torch_on_nan_and_ties():
    nan = float("nan")
    x = torch.tensor([[1.0, 3.0, 3.0, nan, 2.0, nan, 5.0], [0.0, -0.0, 0.0, -0.0, 1.0, 1.0, -1.0],
                      [-2.0, -2.0, -3.0, -3.0, nan, -4.0, -4.0]])
    for fn in (lambda a: torch.cummax(a, 1), lambda a: torch.cummin(a, 1)):
        want = fn(x)
        for params in REDUCTION_PARAMS:
            (problem,) = loop_problems(fn, x)
            from tilewright.autotune.kinds import LoopInputs

            got, _ = run_template(problem, params, get_target("cpu"), LoopInputs([x], []))
            values, indices = got if problem.kernel.outputs[0].dtype == "fp32" else got[::-1]
            assert torch.equal(indices, want.indices), (params, indices, want.indices)
            same = (values == want.values) | (values.isnan() & want.values.isnan())
            assert same.all() and torch.equal(values.signbit(), want.values.signbit()), params


def test_logcumsumexp_keeps_infinities_and_nan_as_torch():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf, -inf, 0.0, -inf], [inf, 1.0, -inf, inf], [-inf, inf, 2.0, nan],
                      [0.0, -30.0, -60.0, -90.0]])
    fn = lambda a: torch.logcumsumexp(a, 1)  # noqa: E731
    (problem,) = loop_problems(fn, x)
    from tilewright.autotune.kinds import LoopInputs

    for params in REDUCTION_PARAMS:
        (got,), _ = run_template(problem, params, get_target("cpu"), LoopInputs([x], []))
        want = fn(x)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[want.isinf()], want[want.isinf()])
        fin = want.isfinite()
        assert torch.allclose(got[fin], want[fin], rtol=1e-6, atol=0), (got, want)  # log1p: 1e-13 survives


def test_the_torch_form_of_a_scan_matches_eager():
    from tilewright.compiler.kernel_factory import TemplateKernelFactory

    factory = TemplateKernelFactory()
    for name in ("cumsum_bf16", "cummax", "cumsum_dim0", "logcumsumexp"):
        fn, make = SCANS[name]
        args = make()
        (problem,) = loop_problems(fn, *args)
        t = get_template("aten.reduction")
        launch = factory.compile(t.render(problem, {}, get_target("cpu")))
        from tilewright.autotune.kinds import poisoned_loop_outputs

        got = launch(*args, outs=poisoned_loop_outputs(problem, "cpu"))
        want = fn(*args)
        want = list(want) if isinstance(want, tuple) else [want]
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            assert torch.allclose(g.double(), w.double(), rtol=1e-5 if w.dtype != BF16 else 1e-2, atol=1e-6), name


@pytest.mark.parametrize("template_id,target", [("sycl.reduction", "xpu"), ("metal.reduction", "mps"),
                                                ("flydsl.reduction", "hip:gfx950")])
def test_languages_without_scans_refuse_them_with_a_reason(template_id, target, monkeypatch):
    # the template's own refusal, also where its toolchain is not installed (the GPU machine has
    # no sycl or flydsl: the language check would answer first)
    from tilewright.runtime.languages import Language
    monkeypatch.setattr(Language, "check", lambda self: None)
    (problem,) = loop_problems(SCANS["cumsum"][0], *SCANS["cumsum"][1]())
    why = get_template(template_id).supports(problem, get_target(target))
    assert not why and "scan" in why.reason


def test_scans_and_scatters_compile_for_a_gpu(tmp_path):
    """The interpreter forgives what a GPU compile may not: scans persistent and looped (tuple
    scans, the carry's tl.reduce), atomics (add on fp32/bf16/i64, max/min with the NaN
    exchange), plain scatter stores; built for sm_90a and gfx950 with no GPU."""
    from tilewright.runtime.aot import CompileJob, compile_jobs

    fns = [
        (lambda a: (torch.cummax(a, 1), a.cumsum(1), torch.logcumsumexp(a, 1), (a * 0.1 + 1).cumprod(0)),
         [randn(5, ROW)]),
        (lambda x, i, v: (torch.index_put(x, (i,), v, accumulate=True), x.scatter_reduce(0, i[:, None].expand(9, 8), v, "amax"),
                          x.scatter_reduce(0, i[:, None].expand(9, 8), v, "amin"), torch.index_put(x, (i,), v)),
         [randn(10, 8), ints(9, lo=0, hi=10), randn(9, 8)]),
        (lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True), [randn(10, 8, dtype=BF16), ints(9, lo=0, hi=10),
                                                                     randn(9, 8, dtype=BF16)]),
        (lambda x, i, v: x.scatter_add(0, i, v), [ints(6, 4), ints(9, 4, lo=0, hi=6), ints(9, 4)]),
    ]
    jobs = []
    for target in ("sm_90a", "gfx950"):
        tgt = get_target(target)
        for i, (fn, args) in enumerate(fns):
            for k, problem in enumerate(loop_problems(fn, *args)):
                template = get_template(f"triton.{problem.kind}")
                if not template.supports(problem, tgt):
                    continue
                for params in ({}, {"PERSISTENT": False, "RBLOCK": 16}) if problem.kind == "reduction" else ({},):
                    rendered = template.render(problem, template.space.complete(params), tgt)
                    jobs.append(CompileJob(f"{target}_case{i}_{k}_{len(params)}", rendered.source,
                                           rendered.aot.to_json(), tgt.triton))
    assert len(jobs) >= 16
    for r in compile_jobs(jobs, tmp_path, workers=2, timeout_s=300):
        assert r.ok, f"{r.name}: {r.status} {r.error[-800:]}"
