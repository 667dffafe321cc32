"""The outer-reduction order of ``cpp.reduction`` (``ORDER="outer"``, templates/cpp/outer.py):
reductions over the outer dims of a row-major tensor (a norm's weight gradient) run r outermost
and a vectorised loop over x inside. Each case: NaN-poisoned outputs against the float64
reference, fp32 and bf16, ragged sizes, 2-D and 3-D, keepdim, NaN/inf for max/min, a strided
view run by the general instance, threads; and which kernels the order refuses."""

from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch

from loop_check import BF16, randn
from test_cpp import needs_cxx, run_cpp
from test_loop_kernels import assert_matches_reference, loop_problems
from tilewright.autotune.kinds import LoopInputs
from tilewright.ir import expr as E
from tilewright.ir.index import contiguous_strides
from tilewright.ir.kernel import Buffer, LoopKernel, Store
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template
from tilewright.templates.cpp.outer import outer_refusal

CPU = get_target("cpu")
OUTER = {"PERSISTENT": False, "ORDER": "outer"}

CASES = {
    "norm_weight_grad_3d": (lambda g, n: (g * n).sum(dim=(0, 1)), lambda: [randn(2, 24, 128), randn(2, 24, 128, seed=1)]),
    # RMSNorm's backward: the input's gradient factor stored per element beside the weight's
    "norm_backward_pair": (lambda a, b, w, n: ((a + b) * w, ((a + b) * n).sum(dim=(0, 1))),
                           lambda: [randn(2, 13, 67), randn(2, 13, 67, seed=1), randn(67, seed=2), randn(2, 13, 67, seed=3)]),
    "ragged_2d": (lambda a: a.sum(0), lambda: [randn(37, 301)]),
    "ragged_keepdim_bias": (lambda a, b: (a + b).sum(0, keepdim=True) * 0.5, lambda: [randn(19, 77), randn(77, seed=1)]),
    "middle_dim_3d": (lambda a: a.sum(1), lambda: [randn(3, 45, 29)]),
    "prod_max_min": (lambda a: (a.prod(0), a.amax(0), a.amin(0)), lambda: [randn(11, 53) * 0.5 + 1.0]),
    "bf16_in_out": (lambda g, n: (g * n).sum(dim=(0, 1)).to(BF16), lambda: [randn(3, 17, 70).to(BF16), randn(3, 17, 70, seed=2).to(BF16)]),
    "mean_over_rows": (lambda a: a.mean(0), lambda: [randn(50, 130)]),
}


def _outer_problems(fn, args):
    problems = [p for p in loop_problems(fn, *args) if p.kind == "reduction"]
    assert problems
    for p in problems:
        assert outer_refusal(p.kernel) is None, outer_refusal(p.kernel)
        assert OUTER in get_template("cpp.reduction").seed_params(p, CPU), "the tuner must be offered the outer order"
    return problems


@needs_cxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_outer_order_fills_poisoned_outputs_with_the_reference(name):
    fn, make = CASES[name]
    args = make()
    for problem in _outer_problems(fn, args):
        got, ref = run_cpp(problem, OUTER)  # fresh random inputs of the problem's own
        assert_matches_reference(problem, got, ref)


def _norm_backward_kernel(b: int, t: int, h: int) -> LoopProblem:
    """The fused kernel of an RMSNorm backward in a Llama training step (demo.llama_train's
    ``add+mul+sum [h x reduce b*t]``): ``g = g1 + g2`` (two GEMM outputs, [b*t, h]) stored per
    element times the weight, beside the weight's gradient ``sum(g * x * rstd, dim=(0, 1))``."""
    x0 = sympy.Symbol("x0", integer=True, nonnegative=True)
    r0, r1 = (sympy.Symbol(f"r{i}", integer=True, nonnegative=True) for i in range(2))
    I = sympy.Integer
    bt, bth, bt1 = (I(b * t), I(h)), (I(b), I(t), I(h)), (I(b), I(t), I(1))
    ins = [Buffer("in0", "fp32", bt, contiguous_strides(bt)), Buffer("in1", "fp32", bt, contiguous_strides(bt)),
           Buffer("in2", "fp32", (I(h),), (I(1),)), Buffer("in3", "fp32", bth, contiguous_strides(bth)),
           Buffer("in4", "fp32", bt1, contiguous_strides(bt1))]
    outs = [Buffer("out0", "fp32", bth, contiguous_strides(bth)),
            Buffer("out1", "fp32", (I(1), I(1), I(h)), contiguous_strides((I(1), I(1), I(h))))]
    g = E.op("add", E.load("in0", (t * r0 + r1, x0), "fp32"), E.load("in1", (t * r0 + r1, x0), "fp32"))
    xr = E.op("mul", E.load("in3", (r0, r1, x0), "fp32"), E.load("in4", (r0, r1, 0), "fp32"))
    stores = (Store("out0", (r0, r1, x0), E.op("mul", g, E.load("in2", (x0,), "fp32"))),
              Store("out1", (I(0), I(0), x0), E.reduce("sum", E.op("mul", g, xr))))
    return LoopProblem(LoopKernel((I(h),), (I(b), I(t)), tuple(ins), tuple(outs), stores), op="add+mul+sum")


@needs_cxx
@pytest.mark.parametrize("shape", [(2, 24, 128), (3, 7, 45)])
def test_outer_order_stores_per_element_values_beside_the_reduction(shape):
    problem = _norm_backward_kernel(*shape)
    assert outer_refusal(problem.kernel) is None
    for params in (OUTER, {"PERSISTENT": True}):
        got, ref = run_cpp(problem, params)
        assert_matches_reference(problem, got, ref)


@needs_cxx
def test_outer_max_min_propagate_nan_and_infinities():
    x = randn(9, 40)
    x[2, 3] = x[7, 3] = float("nan")
    x[0, 5] = float("nan")
    x[:, 6] = float("-inf")
    x[4, 8] = float("inf")
    x[8, 9] = float("nan")  # NaN in the last step of r
    for problem in _outer_problems(lambda a: (a.amax(0), a.amin(0), a.sum(0)), [x]):
        got, ref = run_cpp(problem, OUTER, LoopInputs([x], []))
        assert_matches_reference(problem, got, ref)
        assert got[0][[3, 5, 9]].isnan().all() and got[1][[3, 5, 9]].isnan().all()
        assert got[0][6] == float("-inf") and got[0][8] == float("inf")


@needs_cxx
def test_outer_order_reads_a_strided_view_through_the_general_instance():
    (problem,) = _outer_problems(lambda a: a.sum(0), [randn(21, 33)])
    base = randn(42, 99, seed=3)
    view = base[::2, ::3]
    assert view.shape == (21, 33) and not view.is_contiguous()
    got, ref = run_cpp(problem, OUTER, LoopInputs([view], []))
    assert_matches_reference(problem, got, ref)


@needs_cxx
def test_outer_threads_take_blocks_without_changing_a_result():
    x = randn(6, 40, 1000)  # 240000 elements: parallel; 4 blocks of the last dim per row
    (problem,) = _outer_problems(lambda a: a.sum(1), [x])
    one, ref = run_cpp(problem, OUTER, LoopInputs([x], []), threads=1)
    two, _ = run_cpp(problem, OUTER, LoopInputs([x], []), threads=2)
    assert_matches_reference(problem, two, ref)
    assert torch.equal(one[0], two[0])


def test_outer_order_refuses_what_it_cannot_compute_exactly_or_would_not_pay():
    cases = {
        "inner reduction": (lambda a: a.sum(1), randn(8, 64)),
        "argmax": (lambda a: a.argmax(0), randn(8, 64)),
        "welford": (lambda a: torch.var_mean(a, 0), randn(8, 64)),
        "per-element store of a reduced value": (lambda a: a.softmax(0), randn(8, 64)),
        "centred": (lambda a: a - a.mean(0), randn(8, 64)),
    }
    template = get_template("cpp.reduction")
    for what, (fn, x) in cases.items():
        for p in loop_problems(fn, x):
            if p.kind != "reduction":
                continue
            assert outer_refusal(p.kernel) is not None, what
            assert template.check(OUTER, p, CPU) is not None, what
            assert OUTER not in template.seed_params(p, CPU), what


def test_outer_order_refuses_a_layout_not_contiguous_along_x():
    # a column of a row-major tensor's transpose: x strided, r contiguous; row order reads it better
    problem = _norm_backward_kernel(2, 5, 12)
    k = problem.kernel
    bt = (sympy.Integer(10), sympy.Integer(12))
    strided = tuple(dataclasses.replace(b, stride=(sympy.Integer(1), sympy.Integer(10))) if b.name == "in0" else b
                    for b in k.inputs)
    assert all(b.shape == bt for b in strided if b.name == "in0")
    why = outer_refusal(dataclasses.replace(k, inputs=strided))
    assert why is not None and "in0" in why
