"""Indices checked against the dim the user indexed (issue 27): a gather through a view and a
one-hot scatter raise eager's error for an index outside that dim, in every emitter.

* A gather reads a view (``w[:3][i]``, ``w[1:4].index_select(0, i)``, an expanded 0-d
  tensor): its index must lie inside the *view's* dim, which the buffer's dim behind it may
  exceed. The buffer's check let ``i = 4`` read ``w[4]``; now each gathered index is a
  ``checked`` node bounded by the view's extent (:func:`tilewright.ir.expr.checked`).
* The one-hot ``scatter`` (an index of size 1 along ``dim``, as nll_loss's backward makes) is a
  pointwise compare of each position with the index: an index outside the dim matched nothing
  and the write was dropped without an error.

Outputs are poisoned (NaN) before each run; in-range results must equal eager's exactly.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_bounds import EMITTERS, _run, _skip_unless
from test_loop_kernels import loop_problems

import tilewright
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

CPU = get_target("cpu")
W = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
T = torch.tensor(2.5)
# name: (fn, table, good index, bad indices); every bad index is inside the buffer's dim
VIEW_GATHERS = {
    "index_of_a_slice": (lambda w, i: w[:3][i] * 2, W, [0, 2, -1, 1], [3, 4, -4]),
    "index_select_of_a_slice": (lambda w, i: w[1:4].index_select(0, i) + 1, W, [0, 2, 1, 2], [3, -1]),
    "embedding_of_a_slice": (lambda w, i: F.embedding(i, w[:3]) * 2, W, [2, 0, 1, 1], [3, 4]),
    "gather_of_a_column_slice": (lambda w, i: w[:, :2].gather(1, i) * 3, W,
                                 [[0, 1]] * 5, [[0, 2]] + [[1, 0]] * 4),
    "index_of_an_expanded_scalar": (lambda t, i: t.expand(4)[i] * 2, T, [0, 3, -1, 2], [4, 7, -5]),
}


def _tensors(problem, table: torch.Tensor, index: torch.Tensor) -> list[torch.Tensor]:
    return [index if b.dtype == "i64" else table for b in problem.kernel.inputs]


def _gather_case(name: str):
    fn, table, good, bad = VIEW_GATHERS[name]
    good_i = torch.tensor(good)
    (problem,) = loop_problems(fn, table, good_i)
    return fn, table, good_i, bad, problem


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
@pytest.mark.parametrize("name", sorted(VIEW_GATHERS))
def test_a_gather_through_a_view_is_checked_against_the_views_dim(emitter, name):
    _skip_unless(emitter)
    if emitter == "sycl" and name != "index_of_a_slice":
        pytest.skip("SYCL builds take ~4 s each: one view gather covers its check")
    fn, table, good, bad, problem = _gather_case(name)
    (got,) = _run(emitter, problem, _tensors(problem, table, good))
    assert torch.equal(got, fn(table, good)), f"{emitter}: in range must match eager"
    bads = [torch.tensor(bad)] if isinstance(bad[0], list) else [good.clone().index_fill_(0, torch.tensor([1]), b)
                                                                 for b in bad]
    for i in bads:
        with pytest.raises(IndexError):
            _run(emitter, problem, _tensors(problem, table, i))
            pytest.fail(f"{emitter}: index {i.tolist()} read the buffer outside the view")


ONE_HOT_X = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_a_one_hot_scatter_out_of_range_raises_and_writes_in_range(emitter):
    # nll_loss's backward form: scatter(x, 1, index (N, 1), value); 6 and -1 were dropped
    _skip_unless(emitter)
    fn = lambda x, i: x.scatter(1, i, -1.0) * 2  # noqa: E731
    good = torch.tensor([[1], [5], [0], [3]])
    (problem,) = loop_problems(fn, ONE_HOT_X, good)
    assert not problem.kernel.scatters(), "the one-hot form is one pointwise kernel"
    (got,) = _run(emitter, problem, _tensors(problem, ONE_HOT_X, good))
    assert torch.equal(got, fn(ONE_HOT_X, good))
    for b in (6, -1):
        i = good.clone()
        i[2, 0] = b
        with pytest.raises(IndexError):
            _run(emitter, problem, _tensors(problem, ONE_HOT_X, i))
            pytest.fail(f"{emitter}: a one-hot write to {b} was dropped")


def test_a_view_gathers_index_is_checked_once_and_not_when_proven():
    # the view's check makes the buffer's redundant (one report); i % 3 is proven below 3
    triton = get_template("triton.pointwise")
    src = lambda p: triton.render(p, triton.space.complete({}), CPU).source  # noqa: E731
    i = torch.tensor([0, 2, 1, 1])
    (view,) = loop_problems(lambda w, i: w[:3][i] * 2, W, i)
    (mod,) = loop_problems(lambda w, i: w[:3][i % 3] * 2, W, i)
    (clamped,) = loop_problems(lambda w, i: w[1:4][i.clamp(0, 2)] * 2, W, i)
    assert src(view).count("tl.store(tw_err") == 1
    assert "tw_err" not in src(mod) and "tw_err" not in src(clamped)
    with tilewright.config.patch(index_checks=False):
        assert "tw_err" not in src(view)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["triton", "cpp", "aten"])
def test_compiled_view_gathers_and_one_hot_scatters_raise_eagers_error(backend):
    # through torch.compile: eager's own error type and message reach the user, in-range
    # calls of the same compiled function still match eager
    from tilewright.runtime import cpp as cpp_runtime

    if backend == "cpp" and cpp_runtime.unavailable_reason() is not None:
        pytest.skip(cpp_runtime.unavailable_reason())
    fast = dict(force_backend=backend, graph_race="off", bench_rep=1, bench_min_rep=1, bench_warmup=0,
                bench_budget_ms=0.0)
    cases = [(lambda w, i: w[:3][i] * 2, W, torch.tensor([0, 2, 1]), torch.tensor([0, 4, 1])),
             (lambda x, i: x.scatter(1, i, -1.0) * 2, ONE_HOT_X, torch.tensor([[1], [5], [0], [3]]),
              torch.tensor([[1], [6], [0], [3]]))]
    for fn, table, good, bad in cases:
        try:
            fn(table, bad)
        except (IndexError, RuntimeError) as e:
            want = e
        torch._dynamo.reset()
        with tilewright.config.patch(**fast):
            compiled = torch.compile(fn, backend="tilewright", dynamic=False)
            assert torch.equal(compiled(table, good), fn(table, good))
            with pytest.raises(type(want)) as got:
                compiled(table, bad)
            assert str(want) in str(got.value)
            assert torch.equal(compiled(table, good), fn(table, good))
