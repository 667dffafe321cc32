"""Short static reductions (at most config.unroll_reductions elements) are lowered as pointwise expressions
(kinds/loop/lower/unroll.py), so they fuse into their consumers; their answers stay eager's:
checked against float64 (floats) or exactly (integers, bools), NaN propagated by max/min,
non-contiguous inputs, a leading reduced dim, and the size limits on both sides."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tilewright
from tilewright.ir import expr as E
from tilewright.kinds.loop.lower import lower_loops
from tilewright.kinds.loop.lower.unroll import unrolled_reduction

UNROLL_MAX = tilewright.config.unroll_reductions

# the generated C++ kernels themselves: no graph race, no ATen candidate, failures raised
GENERATED = dict(graph_race="off", force_backend="cpp", strict=True)


def _loop_nodes(fn, *inputs):
    gm = make_fx(fn)(*inputs)
    nodes, _ = lower_loops(gm, set())
    return list(nodes.values())


@pytest.mark.parametrize("n,unrolled", [(1, True), (2, True), (UNROLL_MAX, True), (UNROLL_MAX + 1, False)])
def test_row_length_decides(n, unrolled):
    (node,) = _loop_nodes(lambda x: x.sum(-1), torch.randn(5, n))
    assert node.is_reduction is not unrolled


def test_the_setting_turns_it_off():
    with tilewright.config.patch(unroll_reductions=0):
        (node,) = _loop_nodes(lambda x: x.sum(-1), torch.randn(5, 2))
    assert node.is_reduction


def test_positions_and_moments_keep_their_row_loop():
    nodes = _loop_nodes(lambda x: (x.argmax(-1), x.var(-1)), torch.randn(5, 4))
    assert nodes and all(n.is_reduction for n in nodes)


def test_symbolic_or_empty_extents_are_not_unrolled():
    j = sympy.Symbol("j0", integer=True)
    body = E.reduce("sum", E.load("x", (j,), "fp32"))
    assert unrolled_reduction(body, [j], [sympy.Symbol("s0", integer=True, positive=True)]) is None
    assert unrolled_reduction(body, [j], [sympy.Integer(0)]) is None
    assert unrolled_reduction(body, [j], [sympy.Integer(3)]) is not None


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _check(fn, *inputs, tol=1e-6):
    torch._dynamo.reset()
    with tilewright.config.patch(**GENERATED):
        out = torch.compile(fn, backend="tilewright")(*inputs)
    ref = fn(*(t.double() if t.is_floating_point() else t for t in inputs))
    for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        assert o.dtype == (r.dtype if not r.is_floating_point() else o.dtype)
        if r.is_floating_point():
            assert o.shape == r.shape
            assert _rel(o, r) <= tol, _rel(o, r)
        else:
            assert torch.equal(o, r)


def test_every_kind_against_float64():
    def fn(x, w):
        # top-2 weights renormalised (a MoE router), a mean, max/min and a product over 3 rows
        s = x.sum(-1, keepdim=True)
        return (x / s, x.mean(-1), w.amax(0), w.amin(0), w.prod(0), torch.softmax(x, -1))
    _check(fn, torch.rand(37, 2) + 0.5, torch.randn(3, 11))


def test_non_contiguous_and_leading_dims():
    x = torch.randn(6, 4, 9).transpose(0, 2)  # (9, 4, 6), strides not the sizes'
    _check(lambda t: (t.sum(1), t.amax((1,), keepdim=True) + t), x)


def test_max_and_min_propagate_nan():
    x = torch.randn(8, 4)
    x[3, 2] = float("nan")
    torch._dynamo.reset()
    with tilewright.config.patch(**GENERATED):
        out = torch.compile(lambda t: (t.amax(-1), t.amin(-1), t.sum(-1)), backend="tilewright")(x)
    for o, r in zip(out, (x.amax(-1), x.amin(-1), x.sum(-1))):
        assert torch.equal(o.isnan(), r.isnan())
        assert torch.allclose(o[~o.isnan()], r[~r.isnan()])


def test_integers_and_bools_exact():
    g = torch.Generator().manual_seed(3)
    i = torch.randint(-50, 50, (10, 3), generator=g)
    b = torch.rand(10, 5, generator=g) > 0.5
    _check(lambda t, m: (t.sum(-1), t.prod(-1), t.amax(-1), m.any(-1), m.all(-1)), i, b)


def test_chained_short_reductions_are_not_inlined_into_one_huge_kernel():
    # each unrolled sum inlined into the next made one expression of 8**3 loads (12 s of compile;
    # four chained, 8**4 and 45 s): the scheduler refuses merges past MAX_LOADS distinct loads
    from tilewright.compiler.report import collect_reports
    from tilewright.kinds.loop.fusion.schedule import MAX_LOADS

    x = torch.randn(3, 8, 8, 8, 8)
    torch._dynamo.reset()
    with tilewright.config.patch(**GENERATED), collect_reports() as reports:
        out = torch.compile(lambda t: t.sum(-1).sum(-1).sum(-1).sum(-1), backend="tilewright")(x)
    kernels = [k for r in reports for k in r.kernels]
    assert len(kernels) >= 2 and 8 ** 4 > MAX_LOADS
    ref = x.double().sum((-1, -2, -3, -4))
    assert _rel(out, ref) <= 1e-6
