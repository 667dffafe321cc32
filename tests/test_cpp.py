"""The C++ loop kernels of the ``cpu`` target (``cpp.pointwise``, ``cpp.reduction``): rendered
per LoopProblem (made by the pipeline's own stages, or built by hand from the IR), built with the
host compiler, run into NaN-poisoned outputs and compared with the torch emitter's float64
reference (‖out − ref‖ / ‖ref‖ per output dtype): every op of the IR's table, reductions of every
kind in the persistent and the looped form, non-contiguous and broadcast inputs, masks, gathers,
combo kernels, bf16/fp16 rounding (ties and subnormals), integer division of negatives, NaN and
infinities; a compiled Llama block with the cpp templates forced against eager; the compile
cache across processes.

Each distinct kernel is one g++ build (~1-2 s): every knob is a run-time argument, so all the
parameter settings of a kernel share one library, and the libraries are cached by hash under
the session's cache dir.
"""

from __future__ import annotations

import pytest
import torch

from loop_check import BF16, F, FP16, ints, randn
from test_loop_kernels import FACTORY, assert_matches_reference, loop_problems
from test_sycl import OP_GROUPS, _op_kernel, _tensors
from tilewright.autotune.kinds import LOOP_TOLERANCE, LoopInputs, loop_error, make_loop_inputs, poisoned_loop_outputs
from tilewright.problem import LoopProblem
from tilewright.runtime import cpp as runtime
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template, templates_for

CPU = get_target("cpu")
MISSING = runtime.unavailable_reason()
needs_cxx = pytest.mark.skipif(MISSING is not None, reason=f"no C++ compiler: {MISSING}")
REDUCTION_PARAMS = ({"PERSISTENT": True}, {"PERSISTENT": False})
POINTWISE_PARAMS = ({"BLOCK": 4096}, {"BLOCK": 256})


def run_cpp(problem: LoopProblem, params: dict, inputs: LoopInputs | None = None, threads: int | None = None):
    """The C++ template's outputs (into NaN-poisoned buffers) and the float64 reference."""
    template = get_template(f"cpp.{problem.kind}")
    launch = FACTORY.compile(template.render(problem, template.space.complete(params), CPU))
    x = inputs or make_loop_inputs(problem, "cpu", seed=1)
    outs = poisoned_loop_outputs(problem, "cpu")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        got = launch(*x.tensors, *x.sizes, outs=outs)
    finally:
        torch.set_num_threads(before)
    assert all(g is o for g, o in zip(got, outs)), "the kernel must write the buffers it is handed"
    return got, FACTORY.reference(problem, x)


def params_for(problem: LoopProblem):
    return REDUCTION_PARAMS if problem.kind == "reduction" else POINTWISE_PARAMS


# -- every pointwise op, built by hand from the IR (the SYCL test's groups) ----------------------
@needs_cxx
@pytest.mark.parametrize("group", sorted(OP_GROUPS))
def test_every_pointwise_op_matches_the_reference(group):
    problem = _op_kernel(OP_GROUPS[group])
    x = LoopInputs(_tensors(), [])
    assert not x.tensors[0].is_contiguous()
    for params in POINTWISE_PARAMS:
        got, ref = run_cpp(problem, params, x)
        for b, o, r in zip(problem.kernel.outputs, got, ref):
            name = list(OP_GROUPS[group])[int(b.name[3:])]
            err = loop_error(o, r, b.dtype)
            assert err <= LOOP_TOLERANCE.get(b.dtype, 0.0), f"{name} ({params}): error {err:.3g}"


def test_the_cpp_templates_serve_only_the_cpu_target():
    (problem,) = loop_problems(lambda a: a.exp(), randn(3, 5))
    assert {"cpp.pointwise", "cpp.reduction"} <= {t.id for t in templates_for("pointwise", "cpu")} | \
        {t.id for t in templates_for("reduction", "cpu")}
    for name in ("xpu", "cuda:sm_90a", "mps"):
        support = get_template("cpp.pointwise").supports(problem, get_target(name))
        assert not support and "cpu" in support.reason


def test_a_missing_compiler_refuses_with_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(runtime.shutil, "which", lambda name: None)
    why = runtime.unavailable_reason()
    assert why is not None and "\n" not in why and "g++" in why
    (problem,) = loop_problems(lambda a: a.exp(), randn(3, 5))
    support = get_template("cpp.pointwise").supports(problem, CPU)
    assert not support and support.reason == why


# -- reductions and fused kernels from the pipeline's own stages -------------------------------
ROW = 37  # two whole steps of 16 lanes and a ragged tail of 5
KERNELS = {
    "softmax": (lambda a: a.softmax(-1), lambda: [randn(5, ROW)]),
    "softmax_long_rows": (lambda a: a.softmax(-1), lambda: [randn(3, 300)]),
    "log_softmax_transposed": (lambda a: a.t().log_softmax(-1), lambda: [randn(ROW, 5)]),
    "layer_norm_with_stats": (lambda a, w, b: torch.native_layer_norm(a, (ROW,), w, b, 1e-5),
                              lambda: [randn(5, ROW), randn(ROW), randn(ROW)]),
    "layer_norm_bf16": (lambda a, w, b: F.layer_norm(a, (ROW,), w, b),
                        lambda: [randn(5, ROW, dtype=BF16), randn(ROW, dtype=BF16), randn(ROW, dtype=BF16)]),
    "layer_norm_gelu": (lambda a, w, b: F.gelu(F.layer_norm(a, (ROW,), w, b)),
                        lambda: [randn(5, ROW), randn(ROW), randn(ROW)]),
    "rms_norm": (lambda a, w: F.rms_norm(a, (ROW,), w, eps=1e-6), lambda: [randn(5, ROW), randn(ROW)]),
    "rms_norm_fp16": (lambda a, w: F.rms_norm(a, (ROW,), w, eps=1e-6),
                      lambda: [randn(5, ROW, dtype=FP16), randn(ROW, dtype=FP16)]),
    "var_mean_large_mean": (lambda a: torch.var_mean(a, 1), lambda: [randn(5, 200) + 1000.0]),
    "std_of_columns": (lambda a: a.std(0), lambda: [randn(ROW, 5)]),
    "argmax_argmin": (lambda a: (a.argmax(1), a.argmin(1)), lambda: [randn(5, ROW)]),
    "max_with_index": (lambda a: a.max(1), lambda: [randn(5, ROW)]),
    "prod_any_all": (lambda a: (a.prod(1), (a > 1).any(1), (a > -2).all(1)), lambda: [randn(5, ROW)]),
    "sum_transposed": (lambda a: a.t().sum(1), lambda: [randn(ROW, 5)]),
    "sum_everything": (lambda a: a.sum(), lambda: [randn(5, ROW)]),
    "integer_max_and_sum": (lambda a: (a.amax(1), a.sum(1), a.argmax(1), a.amin(1)), lambda: [ints(5, ROW)]),
    "mean_of_two_dims": (lambda a: a.mean((0, 2), keepdim=True), lambda: [randn(3, 5, 6)]),
    "centre_rows": (lambda a: a - a.mean(1, keepdim=True), lambda: [randn(5, ROW)]),
    "norm2_fp16": (lambda a: torch.linalg.vector_norm(a, dim=1), lambda: [randn(5, ROW, dtype=FP16)]),
    "pointwise_broadcast": (lambda a, b: a * b + 1, lambda: [randn(5, ROW), randn(ROW)]),
    "pointwise_3d_permuted": (lambda a, b: (a.permute(2, 0, 1) * b).sigmoid(), lambda: [randn(4, 6, 7), randn(7, 1, 6)]),
    "cat_pad": (lambda a, b: F.pad(torch.cat([a, b], 1), (1, 1)).exp(), lambda: [randn(5, ROW), randn(5, 3)]),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, lambda: [randn(10, 6), ints(3, 4, lo=0, hi=10)]),
    "gather": (lambda a, i: torch.gather(a, 1, i) * 2, lambda: [randn(5, ROW), ints(5, 4, lo=0, hi=ROW)]),
    "gelu_residual_bf16": (lambda a, b: (F.gelu(a) * b + a).to(BF16), lambda: [randn(7, 13), randn(13)]),
    "zero_dim": (lambda a, s: a * s + s, lambda: [randn(5, 7), torch.tensor(1.5)]),
    # combo kernels: independent parts in one launch, run part after part
    "combo_three_pointwise": (lambda a, b, c: (a.sin() * 2, (b * 3).exp(), c - 1),
                              lambda: [randn(5, 7), randn(3, 11, seed=1), randn(13, seed=2)]),
    "combo_softmax_hosts_pointwise": (lambda x, y: (torch.softmax(x, -1), y.cos()),
                                      lambda: [randn(6, 24), randn(29, seed=1)]),
}


@needs_cxx
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_cpp_loop_kernels_fill_poisoned_outputs_with_the_reference(name):
    fn, make = KERNELS[name]
    problems = loop_problems(fn, *make())
    assert problems
    if name.startswith("combo"):
        assert len(problems) == 1 and problems[0].kernel.parts, "expected one combo kernel"
    for problem in problems:
        for params in params_for(problem):
            got, ref = run_cpp(problem, params)
            assert_matches_reference(problem, got, ref)


@needs_cxx
def test_cpp_reductions_handle_nan_and_infinite_rows_as_the_reference():
    nan = randn(6, ROW)
    nan[1, 20] = nan[3, 0] = nan[3, 30] = nan[4, ROW - 1] = float("nan")
    inf = nan.clone()
    inf[5] = float("-inf")  # all -inf: argmax is the first, max -inf, softmax NaN
    inf[0, 3] = inf[0, 17] = float("inf")  # two maxima: argmax the first
    fns = [lambda a: (a.argmax(1), a.argmin(1)), lambda a: (a.amax(1), a.amin(1)), lambda a: a.max(1),
           lambda a: a.softmax(1), lambda a: (a.sum(1), a.prod(1), a.mean(1))]
    # var_mean only with NaN: with an infinity the exact mean (the reference's) is inf where
    # eager's own Welford gives NaN; the persistent form computes the first, the looped the second
    cases = [(fn, x) for fn in fns for x in (nan, inf)] + [(lambda a: torch.var_mean(a, 1), nan)]
    for fn, x in cases:
        for problem in loop_problems(fn, x):
            for params in REDUCTION_PARAMS:
                got, ref = run_cpp(problem, params, LoopInputs([x], []))
                assert_matches_reference(problem, got, ref)


@needs_cxx
def test_argmax_ties_take_the_first_index_in_every_lane_layout():
    # equal maxima placed in different lanes and steps of the 16-lane accumulators
    x = torch.zeros(4, 70)
    x[0, [5, 21, 69]] = 3.0
    x[1, [40, 8]] = 3.0
    x[2, [64, 63]] = -1.0
    x[3, [33, 1]] = float("nan")
    for fn in (lambda a: (a.argmax(1), a.argmin(1)),):
        for problem in loop_problems(fn, x):
            for params in REDUCTION_PARAMS:
                got, _ = run_cpp(problem, params, LoopInputs([x], []))
                assert torch.equal(got[0], x.argmax(1)) and torch.equal(got[1], x.argmin(1))


@needs_cxx
def test_welford_variance_is_stable_for_a_large_mean():
    x = randn(3, 200) + 1000.0  # sum of squares minus square of sums would lose every digit
    for problem in loop_problems(lambda a: torch.var_mean(a, 1), x):
        for params in REDUCTION_PARAMS:
            got, ref = run_cpp(problem, params, LoopInputs([x], []))
            assert_matches_reference(problem, got, ref)
            assert loop_error(got[0], x.double().var(1), "fp32") < 1e-4


@needs_cxx
def test_kernels_read_the_layout_they_are_handed_at_run_time():
    # traced contiguous, run on a strided view: strides are kernel arguments
    for fn in (lambda a: a.softmax(-1), lambda a: a.exp() + 1):
        (problem,) = loop_problems(fn, randn(5, ROW))
        base = randn(10, 2 * ROW, seed=4)
        view = base[::2, ::2]
        assert view.shape == (5, ROW) and not view.is_contiguous()
        for params in params_for(problem):
            got, ref = run_cpp(problem, params, LoopInputs([view], []))
            assert_matches_reference(problem, got, ref)


@needs_cxx
def test_threads_split_rows_and_blocks_without_changing_a_result():
    # large enough to go parallel (>= 32768 elements); the results must equal one thread's
    for fn, args in ((lambda a: a.softmax(-1), [randn(64, 1000)]), (lambda a: F.silu(a) * 2, [randn(300, 257)])):
        (problem,) = loop_problems(fn, *args)
        x = LoopInputs(args, [])
        for params in params_for(problem):
            one, ref = run_cpp(problem, params, x, threads=1)
            two, _ = run_cpp(problem, params, x, threads=2)
            assert_matches_reference(problem, two, ref)
            assert all(torch.equal(a, b) for a, b in zip(one, two))
