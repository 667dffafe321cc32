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
from test_bounds import EMITTERS, FACTORY, _run, _skip_unless
from test_loop_kernels import loop_problems

import tilewright
from tilewright.autotune.kinds import make_loop_inputs
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

CPU = get_target("cpu")
W = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
T = torch.tensor(2.5)
# name: (fn, table, good index, bad indices); every bad index is inside the buffer's dim
VIEW_GATHERS = {
    "index_of_a_slice": (lambda w, i: w[:3][i] * 2, W, [0, 2, -1, 1], [3, 4, -4]),
    "index_select_of_a_slice": (lambda w, i: w[1:4].index_select(0, i) + 1, W, [0, 2, 1, 2], [3, -1]),
    # one index for every lane: the interpreter refused the check's scalar mask
    "index_select_of_a_slice_at_a_0d_index": (lambda w, i: w[1:4].index_select(0, i) + 1, W, 2, [3, -1]),
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
    if not good.ndim:
        bads = [torch.tensor(b) for b in bad]
    elif isinstance(bad[0], list):
        bads = [torch.tensor(bad)]
    else:
        bads = [good.clone().index_fill_(0, torch.tensor([1]), b) for b in bad]
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


# -- attention modifications ----------------------------------------------------------------------
def test_a_modifications_gather_through_a_loaded_index_is_unproven():
    # score + bias[doc[m]]: doc's values are data, so the gather is checked (the attention
    # kernels check it on their live lanes); bias[h] with a bias of H entries is proven: no check
    from tilewright.kinds.attention import mods
    from tilewright.ir import expr as E

    sizes = {"b": 1, "h": 4, "m": 16, "n": 16}
    doc = E.load("c1", (mods.M_VAR,), "i64")
    by_doc = E.op("add", mods.score(), E.load("c0", (E.indirect_symbol(0),), "fp32", indirect=(E.checked(doc, 4),)))
    by_head = E.op("add", mods.score(), E.load("c0", (E.indirect_symbol(0),), "fp32",
                                               indirect=(E.checked(mods.index_var("h"), 4),)))
    assert len(mods.unchecked_indices(by_doc, sizes)) == 1
    assert mods.unchecked_indices(by_head, sizes) == []
    assert len(mods.unchecked_indices(by_head, {**sizes, "h": 5})) == 1  # 5 heads, 4 biases
    with tilewright.config.patch(index_checks=False):
        assert mods.unchecked_indices(by_doc, sizes) == []
    env = {"score": torch.zeros(1, 1, 16, 1), "b": torch.zeros(1, 1, 1, 1, dtype=torch.int64),
           "h": torch.zeros(1, 1, 1, 1, dtype=torch.int64), "m": torch.arange(16).view(1, 1, 16, 1),
           "n": torch.zeros(1, 1, 1, 1, dtype=torch.int64), "c0": torch.arange(4.0), "c1": torch.arange(16) // 4}
    assert torch.equal(mods.evaluate(by_doc, env, reference=False).flatten(), (torch.arange(16) // 4).float())
    env["c1"] = torch.arange(16) // 4 + 1
    with pytest.raises(IndexError):
        mods.evaluate(by_doc, env, reference=False)


@pytest.mark.parametrize("template", ["triton.attention", "triton.attention_decode", "triton.attention_bwd"])
def test_the_triton_attention_kernels_check_a_modifications_gather(template):
    """score + bias[doc[m]] in each Triton attention kernel (the interpreter): float64-right
    while doc stays inside bias's 4 entries, eager's IndexError (the kernel's TW_ERR status)
    once it does not. The kernels had refused such a problem (ATen's attention ran it)."""
    from tilewright.kinds.attention import checks, mods
    from tilewright.kinds.attention.problem import AttentionProblem, Capture
    from tilewright.ir import expr as E
    from tilewright.runtime.loader import load_module
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    cpu = get_target("cpu")
    doc = E.load("c1", (mods.M_VAR,), "i64")
    by_doc = E.op("add", mods.score(), E.load("c0", (E.indirect_symbol(0),), "fp32", indirect=(E.checked(doc, 4),)))
    Sq = 2 if template == "triton.attention_decode" else 16
    p = AttentionProblem(B=1, H=2, H_kv=1, Sq=Sq, Skv=16, D=16, Dv=16, dtype="fp32", scale=0.25,
                         direction="backward" if template.endswith("bwd") else "forward",
                         score_mod=mods.dumps(by_doc), captures=(Capture((4,), "fp32"), Capture((Sq,), "i64")))
    t = get_template(template)
    params = t.space.complete(dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1))
    assert t.supports(p, cpu) and t.check(params, p, cpu) is None
    rendered = t.render(p, params, cpu)
    assert "TW_ERR" in rendered.source
    launch = load_module(rendered.source, name=rendered.name, interpret=True).launch
    x = checks.make_inputs(p, "cpu", seed=4)
    x.tensors[x.names.index("c1")] = torch.arange(Sq) * 4 // Sq  # documents 0..3
    result = checks.run(launch, x, checks.poisoned(p, "cpu"))
    worst, tol = checks.error(p, result, checks.reference(p, x), False)
    assert worst <= tol
    bad = torch.arange(Sq) * 4 // Sq
    bad[-1] = 4  # the last row reads bias[4]
    x.tensors[x.names.index("c1")] = bad
    with pytest.raises(IndexError, match="out of range"):
        checks.run(launch, x, checks.poisoned(p, "cpu"))


@pytest.mark.slow
def test_a_compiled_flex_score_mod_gather_out_of_range_raises_eagers_error():
    # forced Triton returned an answer for bias[doc[m]] with doc[m] == 4 and 4 biases
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=gen) for _ in range(3))
    bias, doc = torch.randn(4, generator=gen), torch.arange(16) // 4

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: s + bias[doc[m]])

    want = f(q, k, v)
    torch._dynamo.reset()
    fast = dict(force_backend="triton", strict=True, graph_race="off", bench_rep=1, bench_min_rep=1,
                bench_warmup=0, bench_budget_ms=0.0)
    with tilewright.config.patch(**fast):
        compiled = torch.compile(f, backend="tilewright")
        torch.testing.assert_close(compiled(q, k, v), want)
        doc.add_(1)
        with pytest.raises(IndexError, match="out of bounds"):
            compiled(q, k, v)


@pytest.mark.parametrize("emitter", ["triton", "cpp", "torch", "metal"])
def test_a_cat_with_an_empty_part_reads_nothing_of_it(emitter):
    # the other lanes read the empty part masked off: the torch form (the tuner's reference)
    # read its element 0 all the same (IndexError: no candidate worked; a cat of an empty
    # gather, found while checking the view gathers)
    _skip_unless(emitter)
    fn = lambda e, j: torch.cat([e, j]) * 2  # noqa: E731
    e, j = torch.zeros(0, 3), torch.randn(3, 3, generator=torch.Generator().manual_seed(3))
    (problem,) = loop_problems(fn, e, j)
    by_shape = {(0, 3): e, (3, 3): j}
    tensors = [by_shape[tuple(int(s) for s in b.shape)] for b in problem.kernel.inputs]
    (got,) = _run(emitter, problem, tensors)
    assert torch.equal(got, fn(e, j))
    ref = FACTORY.reference(problem, make_loop_inputs(problem, "cpu", seed=1))
    assert ref[0].shape == got.shape
