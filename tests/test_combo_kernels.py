"""Combo kernels (independent loop kernels in one launch) and recomputed load-free values: the
scheduler's launch savers, checked in the interpreter against float64 eager."""

from __future__ import annotations

import sympy
import torch

from loop_check import check_against_eager, check_training
from tilewright.autotune.kinds import loop_error, make_loop_inputs, poisoned_loop_outputs
from tilewright.kinds.loop.fusion import BuiltKernel, combine
from tilewright.ir import expr as E
from tilewright.ir.index import var
from tilewright.ir.kernel import Buffer, LoopKernel, Store, size_symbol
from tilewright.compiler.kernel_factory import default_factory
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template
from tilewright.autotune.candidates import Candidate


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_independent_kernels_of_different_shapes_launch_once():
    def fn(a, b, c):
        return a.sin() * 2, (b * 3).exp(), c - 1

    args = [torch.randn(s, generator=_gen(i)) for i, s in enumerate([(5, 7), (3, 11), (13,)])]
    check_against_eager(fn, *args, kernels=1)


def test_a_reduction_hosts_pointwise_parts_in_whole_rows():
    # the softmax is the host; the pointwise part of 29 elements fills rows of 24 after it
    def fn(x, y):
        return torch.softmax(x, -1), y.cos()

    x = torch.randn(6, 24, generator=_gen(0))
    y = torch.randn(29, generator=_gen(1))
    check_against_eager(fn, x, y, kernels=1)


def test_reductions_over_rows_of_different_lengths_launch_once():
    # the shorter rows use the first lanes of the longer ones; the lanes past them add each
    # reduction's identity (a max of -inf, an argmax that loses every tie, a product's 1), so
    # an all-negative row, a NaN and ties still come out as eager's
    def fn(x, y):
        return x.sum(-1), y.amax(-1), y.argmax(-1), (y * 0.1).prod(-1), (y > 0).any(-1), y.argmin(-1)

    y = -torch.rand(3, 5, generator=_gen(1)) - 1
    y[1, 2] = float("nan")
    y[2, 1] = y[2, 3] = -0.5
    check_against_eager(fn, torch.randn(4, 9, generator=_gen(0)), y, kernels=1)


def test_a_layer_norm_backward_and_its_column_sums_launch_once():
    # GPT-2's backward, from the saved normalised input: the input's gradient reduces rows of
    # 64, the weight's and bias's gradients columns of 32; one launch, as Inductor's CPU
    # backend puts them in one function
    def fn(g, xhat, w, rstd):
        gw = g * w
        dx = rstd * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
        return dx, (g * xhat).sum(0), g.sum(0)

    check_against_eager(fn, torch.randn(32, 64, generator=_gen(0)), torch.randn(32, 64, generator=_gen(1)),
                        torch.randn(64, generator=_gen(2)), torch.rand(32, 1, generator=_gen(3)) + 0.5, kernels=1)


def test_welford_is_never_a_shorter_host():
    def fn(x, y):
        return x.sum(-1), y.var(-1)

    check_against_eager(fn, torch.randn(4, 9, generator=_gen(0)), torch.randn(3, 5, generator=_gen(1)),
                        kernels=2)


def test_a_zero_size_part_combines_and_writes_nothing():
    def fn(a, b):
        return a + 1, b * 2

    check_against_eager(fn, torch.randn(6, 5, generator=_gen(0)), torch.randn(0, 5), kernels=1)


def test_dependent_kernels_never_combine():
    # the second reduction reads the first one's result at other rows: two kernels, in order
    # (rows longer than config.unroll_reductions: shorter ones become pointwise and fuse)
    def fn(x):
        s = x.sum(-1)
        return (x.t() * s).sum(-1)

    check_against_eager(fn, torch.randn(12, 12, generator=_gen(0)), kernels=2)


def test_load_free_values_are_recomputed_by_their_readers():
    # an iota read by two kernels is not a kernel of its own (and does not keep them apart)
    def fn(x, y):
        pos = torch.arange(x.shape[-1], dtype=torch.float32)
        return torch.softmax(x + pos, -1), y * pos

    check_against_eager(fn, torch.randn(4, 8, generator=_gen(0)), torch.randn(3, 8, generator=_gen(1)),
                        kernels=1)


def test_combo_kernels_train_like_eager():
    def fn(q, k):  # rotary-like: two heads counts, one cos/sin table
        pos = torch.arange(q.shape[-2], dtype=torch.float32)[:, None] * torch.arange(q.shape[-1])
        return (q * pos.cos()).sum(), (k * pos.sin()).sum()

    q = torch.randn(2, 4, 5, 8, generator=_gen(0), requires_grad=True)
    k = torch.randn(2, 2, 5, 8, generator=_gen(1), requires_grad=True)
    check_training(fn, q, k)


def _pointwise(n: int, op: str) -> BuiltKernel:
    x0 = var("x", 0)
    value = E.op(op, E.load("in0", (x0,), "fp32"))
    k = LoopKernel((sympy.Integer(n),), (), (Buffer("in0", "fp32", (sympy.Integer(n),), (sympy.Integer(1),)),),
                   (Buffer("out0", "fp32", (sympy.Integer(n),), (sympy.Integer(1),)),), (Store("out0", (x0,), value),))
    return BuiltKernel(k, [f"src_{op}"], [f"dst_{op}"], [])


def test_combined_kernel_writes_every_element_of_each_part_and_nothing_else():
    """At the kernel level: the Triton combo of three parts against the float64 torch form,
    outputs poisoned with NaN first, so an element a part forgets (or writes twice into another
    part's buffer) shows."""
    built = combine([_pointwise(37, "exp"), _pointwise(5, "sin"), _pointwise(64, "neg")])
    assert len(built.kernel.parts) == 3 and built.kernel.ranges == (sympy.Integer(106),)
    problem = LoopProblem(built.kernel, (), frozenset(), "combo")
    cpu = get_target("cpu")
    x = make_loop_inputs(problem, "cpu", seed=3)
    aten = get_template("aten.pointwise")
    ref = default_factory.build(problem, Candidate.of(aten.id, aten.source_hash), cpu)(
        *x.tensors, reference=True)
    triton = get_template("triton.pointwise")
    for xblock in (16, 128):
        launch = default_factory.build(problem, Candidate.of(triton.id, triton.source_hash,
                                                             {"XBLOCK": xblock, "num_warps": 4}), cpu)
        outs = poisoned_loop_outputs(problem, "cpu")
        launch(*x.tensors, outs=outs)
        for o, r in zip(outs, ref):
            assert loop_error(o, r, "fp32") < 1e-6


def test_symbolic_sizes_combine():
    z = size_symbol(0)
    x0 = var("x", 0)
    a = LoopKernel((z,), (), (Buffer("in0", "fp32", (z,), (sympy.Integer(1),)),),
                   (Buffer("out0", "fp32", (z,), (sympy.Integer(1),)),),
                   (Store("out0", (x0,), E.load("in0", (x0,), "fp32") + 1.0),))
    s = sympy.Symbol("s0", integer=True, positive=True)
    built = combine([BuiltKernel(a, ["p"], ["q"], [s]), _pointwise(9, "exp")])
    assert built.symbols == [s] and built.kernel.ranges == (z + 9,)
    problem = LoopProblem(built.kernel, (("z0", 11),), frozenset({"z0"}), "combo")
    x = make_loop_inputs(problem, "cpu", seed=1)
    triton = get_template("triton.pointwise")
    launch = default_factory.build(problem, Candidate.of(triton.id, triton.source_hash,
                                                         {"XBLOCK": 32, "num_warps": 4}), get_target("cpu"))
    outs = poisoned_loop_outputs(problem, "cpu")
    launch(*x.tensors, *x.sizes, outs=outs)
    assert torch.allclose(outs[0], x.tensors[0] + 1) and torch.allclose(outs[1], x.tensors[1].exp())
