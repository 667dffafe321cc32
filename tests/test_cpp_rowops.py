"""Scans and scatters as C++ loop kernels (``templates/cpp/rowops.py``): every scan of
``test_scans`` and every scatter of ``test_scatters`` rendered by ``cpp.reduction`` /
``cpp.pointwise`` into NaN-poisoned outputs against the float64 torch form; torch's special
values (cummax/cummin NaN and ties, logcumsumexp infinities, amax/amin NaN); duplicates combined
in eager's order (bit for bit with eager's fp32 sums), the same on one thread and two; indices out
of range raise IndexError and write nothing; layouts handed at run time; the compiled pipeline
running them as C++ with the pointwise ops around them fused.

Each distinct kernel is one g++ build (~0.6 s), cached by hash for the session.
"""

from __future__ import annotations

import pytest
import torch

import tilewright
from loop_check import ints, randn, rel_error, to_reference
from test_cpp import CPU, MISSING, run_cpp
from test_loop_kernels import FACTORY, assert_matches_reference, loop_problems
from test_scans import SCANS
from test_scatters import OPS, _dups
from tilewright.autotune.kinds import LoopInputs
from tilewright.compiler.report import collect_reports
from tilewright.templates import get_template

pytestmark = [pytest.mark.skipif(MISSING is not None, reason=f"no C++ compiler: {MISSING}"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]
REDUCTION_PARAMS = ({"PERSISTENT": True}, {"PERSISTENT": False})
FORCED = dict(force_backend="cpp", strict=True, bench_rep=1, bench_min_rep=1, bench_warmup=0, bench_budget_ms=0.0)


def _params(problem):
    return REDUCTION_PARAMS if problem.kind == "reduction" else ({"BLOCK": 256},)


@pytest.mark.parametrize("name", sorted(SCANS))
def test_cpp_scans_fill_poisoned_outputs_with_the_reference(name):
    fn, make = SCANS[name]
    (problem,) = loop_problems(fn, *make())
    assert problem.kernel.scans() and get_template("cpp.reduction").supports(problem, CPU)
    for params in REDUCTION_PARAMS:
        got, ref = run_cpp(problem, params)
        assert_matches_reference(problem, got, ref)


# tw_prefix_sum's four types (16 lanes of fp32 and int32, 8 of fp64 and int64), rows shorter
# than a vector, a vector and a ragged tail, several vectors
SUM_CASES = [(torch.float32, 5), (torch.float32, 16), (torch.float32, 1000), (torch.float64, 37),
             (torch.float64, 3), (torch.int64, 37), (torch.int32, 53)]


@pytest.mark.parametrize("dtype,row", SUM_CASES, ids=[f"{d}-{r}".replace("torch.", "") for d, r in SUM_CASES])
def test_cpp_cumsum_of_every_summed_type_matches_eager(dtype, row):
    x = randn(3, row, seed=row).to(dtype) if dtype.is_floating_point else ints(3, row, lo=-1000, hi=1000, dtype=dtype)
    fn = (lambda a: (a * 3).cumsum(1, dtype=torch.int32)) if dtype == torch.int32 else (lambda a: (a * 3).cumsum(1))
    (problem,) = loop_problems(fn, x)
    want = fn(x.double() if dtype.is_floating_point else x)
    for params in REDUCTION_PARAMS:
        (got,), ref = run_cpp(problem, params, LoopInputs([x], []))
        assert got.dtype == fn(x).dtype
        if dtype.is_floating_point:
            assert rel_error(got, want) <= (1e-12 if dtype == torch.float64 else 2e-6)
        else:
            assert torch.equal(got, want)


def test_a_scan_of_a_value_constant_along_its_row_is_computed_per_element():
    # the operand does not vary along the row, its prefix does: it must not be hoisted out of
    # the row loop as a row value
    x = randn(5, 1)
    (problem,) = loop_problems(lambda a: (a * 2).expand(5, 37).cumsum(1) + 1, x)
    for params in REDUCTION_PARAMS:
        got, ref = run_cpp(problem, params, LoopInputs([x], []))
        assert_matches_reference(problem, got, ref)
        assert torch.allclose(got[0], (x * 2).expand(5, 37).cumsum(1) + 1)


def test_cpp_scans_follow_torch_on_nan_ties_zeros_and_infinities():
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, 3.0, 3.0, nan, 2.0, nan, 5.0], [0.0, -0.0, 0.0, -0.0, 1.0, 1.0, -1.0],
                      [-2.0, -2.0, -3.0, -3.0, nan, -4.0, -4.0], [-0.0, -0.0, 1.0, -inf, inf, 2.0, 0.5]])
    for fn in (lambda a: torch.cummax(a, 1), lambda a: torch.cummin(a, 1)):
        want = fn(x)
        (problem,) = loop_problems(fn, x)
        for params in REDUCTION_PARAMS:
            got, _ = run_cpp(problem, params, LoopInputs([x], []))
            values, indices = got if problem.kernel.outputs[0].dtype == "fp32" else got[::-1]
            assert torch.equal(indices, want.indices), (params, indices, want.indices)
            same = (values == want.values) | (values.isnan() & want.values.isnan())
            assert same.all() and torch.equal(values.signbit(), want.values.signbit()), params
    # a cumsum starts from +0 (eager: 0 + -0 = +0), a logcumsumexp keeps equal infinities and NaN
    z = torch.tensor([[-0.0, -0.0, 1.0], [-inf, -inf, 0.0], [inf, 1.0, -inf], [-inf, inf, nan]])
    for fn in (lambda a: a.cumsum(1), lambda a: torch.logcumsumexp(a, 1)):
        (problem,) = loop_problems(fn, z)
        want = fn(z)
        for params in REDUCTION_PARAMS:
            (got,), _ = run_cpp(problem, params, LoopInputs([z], []))
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.signbit(), want.signbit())
            fin = want.isfinite()
            assert torch.equal(got[want.isinf()], want[want.isinf()])
            assert torch.allclose(got[fin], want[fin], rtol=1e-6, atol=0)


def test_cpp_scans_read_the_layout_they_are_handed():
    fn = lambda a: torch.cummax(a.exp(), 1).values + a.cumsum(1)  # noqa: E731
    (problem,) = loop_problems(fn, randn(5, 37))
    view = randn(74, 10, seed=3).t()[::2, ::2]  # (5, 37), neither dim contiguous
    assert view.shape == (5, 37)
    for params in REDUCTION_PARAMS:
        got, ref = run_cpp(problem, params, LoopInputs([view], []))
        assert_matches_reference(problem, got, ref)
        assert torch.allclose(got[0], fn(view), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(OPS))
def test_cpp_scatters_fill_poisoned_outputs_with_the_reference_on_one_thread_and_two(name):
    fn, make, _ = OPS[name]
    args = make()
    for problem in loop_problems(fn, *args):
        t = get_template(f"cpp.{problem.kind}")
        assert t.supports(problem, CPU), t.supports(problem, CPU).reason
        for params in _params(problem):
            one, ref = run_cpp(problem, params, threads=1)
            assert_matches_reference(problem, one, ref)
            two, _ = run_cpp(problem, params, threads=2)
            assert all(torch.equal(a, b) for a, b in zip(one, two)), "threads changed a result"


SUMS_IN_ORDER = {
    # eager's CPU kernels add duplicates in the index's order; so do the C++ kernels: fp32 bit for bit
    "index_put_accumulate": (lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
                             lambda: [randn(10, 8), _dups(230, 10), randn(230, 8, scale=1e3)]),
    "scatter_add_along_rows": (lambda x, i, v: x.scatter_add(1, i, v),
                               lambda: [randn(5, 9), ints(5, 120, lo=0, hi=9), randn(5, 120, scale=1e3)]),
    "scatter_add_along_columns": (lambda x, i, v: x.scatter_add(0, i, v),
                                  lambda: [randn(6, 40), ints(300, 40, lo=0, hi=6), randn(300, 40, scale=1e3)]),
    "index_add": (lambda x, i, v: x.index_add(0, i, v), lambda: [randn(6, 33), _dups(200, 6), randn(200, 33, scale=1e3)]),
    # a plain write with duplicates: the last in the index's order, as eager's (serial) kernel
    "index_put_duplicates_last_wins": (lambda x, i, v: torch.index_put(x, (i,), v),
                                       lambda: [randn(10, 8), _dups(230, 10), randn(230, 8)]),
}


@pytest.mark.parametrize("name", sorted(SUMS_IN_ORDER))
def test_cpp_scatters_combine_duplicates_in_eagers_order_bit_for_bit(name):
    fn, make = SUMS_IN_ORDER[name]
    args = make()
    want = fn(*args)
    (scatter,) = [p for p in loop_problems(fn, *args) if p.kernel.scatters()]
    names = [b.name for b in scatter.kernel.inputs]
    # the kernel's inputs: the index, the values, and the target it starts from
    by_dtype = {"i64": args[1]}
    tensors = [args[0] if n == scatter.kernel.outputs[0].init else by_dtype.get(b.dtype, args[2])
               for n, b in zip(names, scatter.kernel.inputs)]
    for threads in (1, 2):
        (got,), _ = run_cpp(scatter, {"BLOCK": 256}, LoopInputs(tensors, []), threads=threads)
        assert torch.equal(got, want), (threads, (got - want).abs().max())


def test_cpp_scatter_reduce_keeps_special_values_as_torch():
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([1.0, -0.0, 0.0, 5.0, nan, 2.0, -inf, inf])
    i = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 5, 6, 7, 4])
    v = torch.tensor([nan, 2.0, 0.0, -0.0, 1.0, 3.0, -inf, inf, -0.0, 1.0, -1.0, 7.0])
    for reduce in ("amax", "amin", "sum", "mean"):
        for include_self in (True, False):
            fn = lambda x, i, v: x.scatter_reduce(0, i, v, reduce, include_self=include_self)  # noqa: E731
            torch._dynamo.reset()
            with tilewright.config.patch(**FORCED), collect_reports() as reports:
                got = torch.compile(fn, backend="tilewright")(x, i, v)
            assert all(k.winner.startswith("cpp.") for r in reports for k in r.kernels)
            want = fn(x, i, v)
            same = (got == want) | (got.isnan() & want.isnan())
            assert same.all() and torch.equal(got.signbit(), want.signbit()), (reduce, include_self, got, want)


def test_cpp_scatter_indices_out_of_range_raise_and_write_nothing():
    fn = lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True)  # noqa: E731
    x, v = randn(6, 4), randn(5, 4)
    scatter = next(p for p in loop_problems(fn, x, torch.tensor([0, 1, 2, 3, 4]), v) if p.kernel.scatters())
    bad = torch.tensor([0, 7, 2, -9, 4])  # 7 and -9 (-3 after wrapping) are out of range
    names = [b.name for b in scatter.kernel.inputs]
    tensors = [x.clone() if n == scatter.kernel.outputs[0].init else bad if b.dtype == "i64" else v
               for n, b in zip(names, scatter.kernel.inputs)]
    t = get_template("cpp.pointwise")
    want = x.clone()
    want[[0, 2, 4]] += v[[0, 2, 4]]
    launch = FACTORY.compile(t.render(scatter, t.space.complete({}), CPU))
    out = x.clone()
    with pytest.raises(IndexError, match="index out of range"):
        launch(*tensors, outs=(out,))
    assert torch.equal(out, want), "only the in-range rows change"
    with tilewright.config.patch(index_checks=False):
        (out,) = FACTORY.compile(t.render(scatter, t.space.complete({}), CPU))(*tensors)
    assert torch.equal(out, want), "only the in-range rows change"
    # scatter_add refuses what is out of range the same way
    fn = lambda x, i, v: x.scatter_add(1, i, v)  # noqa: E731
    args = [randn(5, 9), ints(5, 12, lo=0, hi=9), randn(5, 12)]
    scatter = next(p for p in loop_problems(fn, *args) if p.kernel.scatters())
    idx = args[1].clone()
    idx[3, 7] = 9
    names = [b.name for b in scatter.kernel.inputs]
    tensors = [args[0] if n == scatter.kernel.outputs[0].init else idx if b.dtype == "i64" else args[2]
               for n, b in zip(names, scatter.kernel.inputs)]
    with pytest.raises(IndexError, match="index out of range"):
        FACTORY.compile(t.render(scatter, t.space.complete({}), CPU))(*tensors)


def test_a_scan_and_scatters_compile_to_cpp_kernels_with_their_pointwise_ops_fused():
    def fn(x, index, src, dest, upd):
        return (torch.cumsum(x.exp() * 0.5, 1).tanh().scatter_add(1, index, src.sigmoid())
                .index_add(0, dest, upd * 2))
    args = [randn(37, 70), ints(37, 20, lo=0, hi=70), randn(37, 20), _dups(15, 37), randn(15, 70)]
    torch._dynamo.reset()
    with tilewright.config.patch(**FORCED), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright", dynamic=False)(*args)
    kernels = [k for r in reports for k in r.kernels]
    assert kernels and all(k.winner.startswith("cpp.") for k in kernels), [(k.op, k.winner) for k in kernels]
    assert sum(r.extern_ops for r in reports) == 0
    ops = " ".join(k.op for k in kernels)
    assert "exp" in ops and "cumsum" in ops and "tanh" in ops, ops  # one kernel: exp, cumsum, tanh
    assert rel_error(out, fn(*to_reference(args)).float()) <= 2e-5


@pytest.mark.parametrize("name", ["cumsum_of_cumsum", "softmax_then_cumsum", "cummax_middle_dim"])
def test_compiled_cpp_scans_match_eager(name):
    fn, make = SCANS[name]
    check_against_eager_cpp(fn, *make())


def check_against_eager_cpp(fn, *args):
    """``fn`` compiled with the C++ templates forced, every kernel a C++ one, against ``fn`` in
    float64 (``loop_check.check_against_eager`` asserts Triton kernels)."""
    torch._dynamo.reset()
    with tilewright.config.patch(**FORCED), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright", dynamic=False)(*args)
    assert all(k.winner.startswith("cpp.") for r in reports for k in r.kernels)
    ref = fn(*to_reference(args))
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for o, r in zip(outs, refs):
        assert rel_error(o, r.to(o.dtype)) <= (2e-5 if o.is_floating_point() else 0)



def test_cpp_scans_split_rows_across_threads_without_changing_a_result():
    # 64 x 700 goes parallel (>= 32768 elements): each thread its own row buffers
    x = randn(64, 700, seed=5)
    (problem,) = loop_problems(lambda a: (torch.cumsum(a.exp(), 1), torch.cummax(a, 1).values * 2), x)
    for params in REDUCTION_PARAMS:
        one, ref = run_cpp(problem, params, LoopInputs([x], []), threads=1)
        two, _ = run_cpp(problem, params, LoopInputs([x], []), threads=2)
        assert_matches_reference(problem, two, ref)
        assert all(torch.equal(a, b) for a, b in zip(one, two))
