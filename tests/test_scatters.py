"""Indexing that writes (index_put with and without accumulate, scatter, scatter_add,
scatter_reduce sum/amax/amin/mean with include_self either way, index_add, the embedding's
backward) as scatter loop kernels: compiled with Triton forced (the interpreter) and as the
torch form, against eager in float64; duplicate, negative and out-of-range indices;
non-contiguous operands; values computed by the ops before the scatter fuse into its kernel;
deterministic mode; the languages without scatters refuse them (C++ runs them:
tests/test_cpp_rowops.py)."""

from __future__ import annotations

import pytest
import torch

import tilewright
from loop_check import check_against_eager, ints, randn, rel_error, to_reference
from test_loop_kernels import loop_problems
from tilewright.compiler.report import collect_reports
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _dups(n: int, hi: int, seed: int = 0, lo: int = 0) -> torch.Tensor:
    """``n`` indices in [lo, hi) with many repeats (n > hi - lo)."""
    return torch.randint(lo, hi, (n,), generator=torch.Generator().manual_seed(seed))


OPS = {
    # name: (fn, args, generated kernels when compiled)
    "index_put_accumulate_duplicates": (
        lambda x, i, v: torch.index_put(x, (i,), v.exp(), accumulate=True),
        lambda: [randn(10, 8), _dups(23, 10), randn(23, 8)], 2),
    "index_put_negative_indices": (
        lambda x, i, v: torch.index_put(x, (i,), v * 3),
        lambda: [randn(10, 8), torch.tensor([-1, 3, -10, 5]), randn(4, 8)], 2),
    "index_put_two_index_tensors": (
        lambda x, i, j, v: torch.index_put(x, (i, j), v, accumulate=True),
        lambda: [randn(6, 7, 3), _dups(9, 6, 1), _dups(9, 7, 2, lo=-7), randn(9, 3)], 2),
    "index_put_non_adjacent_indices": (
        lambda x, i, j, v: torch.ops.aten.index_put(x, [i, None, j], v, True),
        lambda: [randn(6, 4, 7), _dups(9, 6, 1), _dups(9, 7, 2), randn(9, 4)], 2),
    "scatter_src": (lambda x, i, v: x.scatter(1, i, v),
                    lambda: [randn(5, 9), torch.stack([torch.randperm(9)[:4] for _ in range(5)]), randn(5, 4)], 2),
    "scatter_add_duplicates": (lambda x, i, v: x.scatter_add(1, i, v.sin()),
                               lambda: [randn(5, 9), ints(5, 12, lo=0, hi=9), randn(5, 12)], 2),
    "scatter_add_transposed_self": (lambda x, i, v: x.t().scatter_add(0, i, v),
                                    lambda: [randn(5, 9), ints(12, 5, lo=0, hi=9), randn(12, 5)], 2),
    "scatter_amax": (lambda x, i, v: x.scatter_reduce(0, i, v, "amax"),
                     lambda: [randn(6, 4), ints(9, 4, lo=0, hi=6), randn(9, 4)], 2),
    "scatter_amin_without_self": (lambda x, i, v: x.scatter_reduce(0, i, v, "amin", include_self=False),
                                  lambda: [randn(6, 4), ints(9, 4, lo=0, hi=6), randn(9, 4)], 3),
    "scatter_sum_without_self": (lambda x, i, v: x.scatter_reduce(0, i, v, "sum", include_self=False),
                                 lambda: [randn(6, 4), ints(9, 4, lo=0, hi=6), randn(9, 4)], 3),
    "scatter_mean": (lambda x, i, v: x.scatter_reduce(0, i, v, "mean"),
                     lambda: [randn(6, 4), ints(9, 4, lo=0, hi=6), randn(9, 4)], 3),
    "scatter_mean_int_without_self": (lambda x, i, v: x.scatter_reduce(0, i, v, "mean", include_self=False),
                                      lambda: [ints(6, 4), ints(9, 4, lo=0, hi=6), ints(9, 4)], 4),
    "index_add_alpha": (lambda x, i, v: x.index_add(0, i, v, alpha=2),
                        lambda: [randn(6, 4), ints(9, lo=0, hi=6), randn(9, 4)], 2),
    "int_scatter_add": (lambda x, i, v: x.scatter_add(0, i, v),
                        lambda: [ints(6, 4, dtype=torch.int32), ints(9, 4, lo=0, hi=6), ints(9, 4, dtype=torch.int32)], 2),
    "inverse_permutation_of_a_sort": (lambda i: torch.empty_like(i).index_put((i,), torch.arange(i.numel())),
                                      lambda: [torch.randperm(16, generator=torch.Generator().manual_seed(3))], 2),
    "histc_of_expert_ids": (lambda e: torch.histc(e.float(), 8, 0, 7),
                            lambda: [torch.cat([ints(40, lo=0, hi=8), torch.tensor([7, 0, 9, -1])])], 2),
    "histc_of_floats_with_nan": (lambda x: torch.histc(x, 10, -1.5, 2.0),
                                 lambda: [torch.cat([randn(50), torch.tensor([float("nan"), 2.0, -1.5, 5.0])])], 2),
    "embedding_dense_backward": (lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, 10, 2, False),
                                 lambda: [randn(3, 5, 8), ints(3, 5, lo=0, hi=10)], 2),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_scatters_compile_to_triton_kernels_matching_eager(name):
    fn, make, kernels = OPS[name]
    check_against_eager(fn, *make(), kernels=kernels)


@pytest.mark.parametrize("name", ["index_put_accumulate_duplicates", "scatter_amin_without_self", "scatter_mean",
                                  "embedding_dense_backward", "index_put_two_index_tensors"])
def test_the_torch_form_of_a_scatter_matches_eager(name):
    fn, make, _ = OPS[name]
    args = make()
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend="aten"), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright")(*args)
    assert all(r.fallback is None for r in reports) and sum(r.loop_kernels for r in reports) >= 2
    assert rel_error(out, fn(*to_reference(args)).to(out.dtype)) <= 2e-5


@pytest.mark.parametrize("adjacent", [True, False])
def test_index_with_several_tensors_is_one_gather_kernel(adjacent):
    # x[:, i, j] keeps the broadcast index dims where the tensors are; x[i, :, j] puts them first
    fn = (lambda x, i, j: x[:, i, j] * 2) if adjacent else (lambda x, i, j: x[i, :, j] * 2)  # noqa: E731
    x = randn(5, 6, 7)
    i, j = ints(3, 1, lo=-5, hi=5), ints(4, lo=-7, hi=7)
    check_against_eager(fn, x, i, j, kernels=1)


def test_scatter_reduce_keeps_special_values_as_torch():
    # NaN in the values or in self propagates through amax/amin (the atomics on the bits would
    # drop or replace it); infinities win; zeros compare equal (their sign is the order's)
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([1.0, -0.0, 0.0, 5.0, nan, 2.0, -inf, inf])
    i = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 5, 6, 7, 4])
    v = torch.tensor([nan, 2.0, 0.0, -0.0, 1.0, 3.0, -inf, inf, -0.0, 1.0, -1.0, 7.0])
    for reduce in ("amax", "amin", "sum", "mean"):
        for include_self in (True, False):
            fn = lambda x, i, v: x.scatter_reduce(0, i, v, reduce, include_self=include_self)  # noqa: E731
            torch._dynamo.reset()
            with tilewright.config.patch(force_backend="triton", strict=True):
                got = torch.compile(fn, backend="tilewright")(x, i, v)
            want = fn(x, i, v)
            same = (got == want) | (got.isnan() & want.isnan())
            assert same.all(), (reduce, include_self, got, want)


def test_values_computed_before_a_scatter_fuse_into_its_kernel():
    # the exp and the product are computed where they are scattered (2 kernels: the target's
    # copy of x * 2, then the scatter); the + 1 after it needs the whole result (a third)
    fn = lambda x, i, v, w: torch.index_put(x * 2, (i,), (v * w).exp(), accumulate=True) + 1  # noqa: E731
    reports = check_against_eager(fn, randn(10, 8), _dups(23, 10), randn(23, 8), randn(8), kernels=3)
    assert sum(r.extern_ops for r in reports) == 0


def test_out_of_range_indices_are_never_written_by_the_kernel_and_raise_in_both_forms(cpu):
    from tilewright.autotune.kinds import LoopInputs
    from tilewright.compiler.kernel_factory import TemplateKernelFactory

    fn = lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True)  # noqa: E731
    x, v = randn(6, 4), randn(5, 4)
    problems = loop_problems(fn, x, torch.tensor([0, 1, 2, 3, 4]), v)
    scatter = next(p for p in problems if p.kernel.scatters())
    factory = TemplateKernelFactory()
    bad = torch.tensor([0, 7, 2, -9, 4])  # 7 and -9 (-3 after wrapping) are out of range
    names = [b.name for b in scatter.kernel.inputs]
    target_pos = names.index(scatter.kernel.outputs[0].init)
    tensors = [None] * len(names)
    tensors[target_pos] = x.clone()
    for k, b in enumerate(scatter.kernel.inputs):
        if k != target_pos:
            tensors[k] = bad if b.dtype == "i64" else v
    t = get_template("triton.pointwise")
    launch = factory.compile(t.render(scatter, t.space.complete({"XBLOCK": 16}), cpu))
    # the kernel raises as eager (issue 27: it used to drop them silently) and writes only the
    # in-range rows, checks on or off
    out = x.clone()
    with pytest.raises(IndexError, match="index out of range"):
        launch(*tensors, outs=(out,))
    want = x.clone()
    want[[0, 2, 4]] += v[[0, 2, 4]]
    assert torch.equal(out, want), "only the in-range rows change"
    with tilewright.config.patch(index_checks=False):
        (out,) = factory.compile(t.render(scatter, t.space.complete({"XBLOCK": 16}), cpu))(*tensors)
    assert torch.equal(out, want), "only the in-range rows change"
    aten = get_template("aten.pointwise")
    with pytest.raises(IndexError, match="out of bounds"):
        factory.compile(aten.render(scatter, {}, cpu))(*tensors)


def test_float_accumulation_stays_aten_under_deterministic_algorithms():
    fn, make, _ = OPS["index_put_accumulate_duplicates"]
    args = make()
    torch._dynamo.reset()
    prior = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
            out = torch.compile(fn, backend="tilewright")(*args)
    finally:
        torch.use_deterministic_algorithms(prior)
    assert sum(r.extern_ops for r in reports) == 1, "index_put(accumulate=True) runs on ATen"
    assert rel_error(out, fn(*to_reference(args)).float()) <= 2e-5
    # integers add exactly in any order: they still scatter in a kernel
    fn, make, _ = OPS["int_scatter_add"]
    torch._dynamo.reset()
    torch.use_deterministic_algorithms(True)
    try:
        with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
            torch.compile(fn, backend="tilewright")(*make())
    finally:
        torch.use_deterministic_algorithms(prior)
    assert sum(r.extern_ops for r in reports) == 0


@pytest.mark.parametrize("template_id,target", [("sycl.pointwise", "xpu"), ("metal.pointwise", "mps"),
                                                ("flydsl.pointwise", "hip:gfx950")])
def test_languages_without_scatters_refuse_them_with_a_reason(template_id, target):
    fn, make, _ = OPS["scatter_add_transposed_self"]
    scatter = next(p for p in loop_problems(fn, *make()) if p.kernel.scatters())
    why = get_template(template_id).supports(scatter, get_target(target))
    assert not why and "scatter" in why.reason


def test_scatter_problems_survive_a_json_round_trip():
    from tilewright.problem import LoopProblem

    fn, make, _ = OPS["index_put_two_index_tensors"]
    for p in loop_problems(fn, *make()):
        q = LoopProblem.from_json(p.to_json())
        assert q.kernel == p.kernel and q.stable_hash() == p.stable_hash()
