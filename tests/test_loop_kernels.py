"""The loop kernels themselves: each Triton template rendered for a LoopProblem (made by the
pipeline's own stages), run into NaN-poisoned outputs and compared with the torch emitter's
float64 reference; the interpreter's rounding; the emitter's edge cases compiled for a GPU."""

from __future__ import annotations

import json

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from loop_check import BF16, F, FP16, FP32, SHAPE, check_against_eager, ints, randn, rel_error, run_triton, unit
from tilewright.autotune.kinds import (
    LOOP_TOLERANCE, LoopInputs, kind_of, loop_error, make_loop_inputs, poisoned_loop_outputs,
)
from tilewright.compiler.decompositions import decomposition_table
from tilewright.compiler.graph import FusedNode
from tilewright.compiler.lower import lower, lower_loop_nodes
from tilewright.kinds.loop.fusion.schedule import schedule
from tilewright.compiler.kernel_factory import TemplateKernelFactory
from tilewright.problem import LoopProblem
from tilewright.runtime.aot import CompileJob, compile_jobs
from tilewright.runtime.targets import get_target, triton_can_target
from tilewright.templates import get_template


# -- the kernels themselves: rendered per LoopProblem, poisoned outputs, float64 reference -------
def loop_problems(fn, *args) -> list[LoopProblem]:
    """The LoopProblems the pipeline would make for ``fn`` on ``args`` (ATen graph with the
    backend's decompositions, lowered, loop nodes made and scheduled)."""
    gm: fx.GraphModule = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*args)
    kg = lower(gm)
    lower_loop_nodes(kg, gm)
    schedule(kg, gm)
    return [n.problem for n in kg.nodes if isinstance(n, FusedNode)]


FACTORY = TemplateKernelFactory()
REDUCTION_PARAMS = [dict(XBLOCK=1, PERSISTENT=True), dict(XBLOCK=4, PERSISTENT=True),
                    dict(XBLOCK=1, PERSISTENT=False, RBLOCK=16), dict(XBLOCK=2, PERSISTENT=False, RBLOCK=16)]
POINTWISE_PARAMS = [dict(XBLOCK=16), dict(XBLOCK=64)]


def run_template(problem: LoopProblem, params: dict, cpu, inputs: LoopInputs | None = None):
    """The Triton template's outputs (into poisoned buffers) and the float64 reference."""
    template = get_template(f"triton.{problem.kind}")
    launch = FACTORY.compile(template.render(problem, template.space.complete(params), cpu))
    x = inputs or make_loop_inputs(problem, "cpu", seed=1)
    outs = poisoned_loop_outputs(problem, "cpu")
    assert all(o.isnan().all() if o.is_floating_point() else True for o in outs)
    got = launch(*x.tensors, *x.sizes, outs=outs)
    assert all(g is o for g, o in zip(got, outs)), "the kernel must write the buffers it is handed"
    return got, FACTORY.reference(problem, x)


def assert_matches_reference(problem: LoopProblem, got, ref) -> None:
    for b, o, r in zip(problem.kernel.outputs, got, ref):
        err = loop_error(o, r, b.dtype)
        tol = LOOP_TOLERANCE.get(b.dtype, 0.0)
        assert err <= tol, f"{problem.describe()} {b.name}: error {err:.3g} > {tol:.0e}"


ROW = 37  # over two RBLOCKs of 16: the looped form takes three steps, the last one ragged
KERNELS = {
    "softmax": (lambda a: a.softmax(-1), lambda: [randn(5, ROW)]),
    "log_softmax": (lambda a: a.log_softmax(-1), lambda: [randn(5, ROW)]),
    "layer_norm_with_stats": (lambda a, w, b: torch.native_layer_norm(a, (ROW,), w, b, 1e-5),
                              lambda: [randn(5, ROW), randn(ROW), randn(ROW)]),
    "layer_norm_bf16": (lambda a, w, b: F.layer_norm(a, (ROW,), w, b),
                        lambda: [randn(5, ROW, dtype=BF16), randn(ROW, dtype=BF16), randn(ROW, dtype=BF16)]),
    "rms_norm": (lambda a, w: F.rms_norm(a, (ROW,), w, eps=1e-6), lambda: [randn(5, ROW), randn(ROW)]),
    "var_mean": (lambda a: torch.var_mean(a, 1), lambda: [randn(5, ROW)]),
    "std_of_columns": (lambda a: a.std(0), lambda: [randn(ROW, 5)]),
    "argmax_argmin": (lambda a: (a.argmax(1), a.argmin(1)), lambda: [randn(5, ROW)]),
    "max_with_index": (lambda a: a.max(1), lambda: [randn(5, ROW)]),
    "prod_any_all": (lambda a: (a.prod(1), (a > 1).any(1), (a > -2).all(1)), lambda: [randn(5, ROW)]),
    "sum_transposed": (lambda a: a.t().sum(1), lambda: [randn(ROW, 5)]),
    "sum_everything": (lambda a: a.sum(), lambda: [randn(5, ROW)]),
    "integer_max_and_sum": (lambda a: (a.amax(1), a.sum(1), a.argmax(1)), lambda: [ints(5, ROW)]),
    # a max/min's identity in the type's own range: uint8's 0/255, int16's (2**31 - 1 does not fit)
    "uint8_max_min_arg": (lambda a: (a.amax(1), a.amin(1), a.argmax(1), a.argmin(1)),
                          lambda: [ints(5, ROW, lo=0, hi=256, dtype=torch.uint8)]),
    "int16_max_min_arg": (lambda a: (a.amax(1), a.amin(1), a.argmax(1), a.argmin(1)),
                          lambda: [ints(5, ROW, lo=-300, hi=300, dtype=torch.int16)]),
    "mean_of_two_dims": (lambda a: a.mean((0, 2), keepdim=True), lambda: [randn(3, 5, 6)]),
    "centre_rows": (lambda a: a - a.mean(1, keepdim=True), lambda: [randn(5, ROW)]),
    "norm2_fp16": (lambda a: torch.linalg.vector_norm(a, dim=1), lambda: [randn(5, ROW, dtype=FP16)]),
    "pointwise_broadcast": (lambda a, b: a * b + 1, lambda: [randn(5, ROW), randn(ROW)]),
    "cat_pad": (lambda a, b: F.pad(torch.cat([a, b], 1), (1, 1)).exp(), lambda: [randn(5, ROW), randn(5, 3)]),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, lambda: [randn(10, 6), ints(3, 4, lo=0, hi=10)]),
    "gather": (lambda a, i: torch.gather(a, 1, i) * 2, lambda: [randn(5, ROW), ints(5, 4, lo=0, hi=ROW)]),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_triton_loop_kernels_fill_poisoned_outputs_with_the_reference(name, cpu):
    fn, make = KERNELS[name]
    problems = loop_problems(fn, *make())
    assert problems
    for problem in problems:
        for params in REDUCTION_PARAMS if problem.kind == "reduction" else POINTWISE_PARAMS:
            got, ref = run_template(problem, params, cpu)
            assert_matches_reference(problem, got, ref)


def test_loop_problems_survive_a_json_round_trip():
    # the tuning cache and its exports key problems by this form: -inf constants, masked and
    # gathered loads and reductions included
    from tilewright.autotune.kinds import problem_from_json

    fns = [lambda a, i: (a.masked_fill(a > 1.0, float("-inf")).softmax(-1), F.embedding(i, a)),
           lambda a, i: (torch.var_mean(a, 1), F.pad(a, (1, 2)), a.argmax(0))]
    for fn in fns:
        for problem in loop_problems(fn, randn(5, 7), ints(3, lo=0, hi=5)):
            back = problem_from_json(json.loads(json.dumps(problem.to_json())))
            assert back == problem and back.stable_hash() == problem.stable_hash()


def test_triton_reductions_handle_nan_rows_as_the_reference(cpu):
    x = randn(5, ROW)
    x[1, 20] = x[3, 0] = x[3, 30] = x[4, ROW - 1] = float("nan")
    fns = [lambda a: (a.argmax(1), a.argmin(1)), lambda a: (a.amax(1), a.amin(1)), lambda a: a.max(1),
           lambda a: torch.var_mean(a, 1), lambda a: a.softmax(1)]
    for fn in fns:
        for problem in loop_problems(fn, x):
            for params in REDUCTION_PARAMS:
                got, ref = run_template(problem, params, cpu, LoopInputs([x], []))
                assert_matches_reference(problem, got, ref)


def test_welford_variance_is_stable_for_a_large_mean(cpu):
    x = randn(3, 200) + 1000.0  # sum of squares minus square of sums would lose every digit
    for problem in loop_problems(lambda a: torch.var_mean(a, 1), x):
        for params in REDUCTION_PARAMS:
            got, ref = run_template(problem, params, cpu, LoopInputs([x], []))
            assert_matches_reference(problem, got, ref)
            assert rel_error(got[0], x.double().var(1)) < 1e-4


def test_the_check_catches_elements_a_kernel_does_not_write(cpu):
    (problem,) = loop_problems(lambda a: a.exp() * 2, randn(5, ROW))
    x = make_loop_inputs(problem, "cpu", seed=1)
    ref = FACTORY.reference(problem, x)
    outs = poisoned_loop_outputs(problem, "cpu")
    outs[0].view(-1)[:-1].copy_(ref[0].view(-1)[:-1])  # all but the last element
    assert loop_error(outs[0], ref[0], "fp32") == float("inf")
    err, tol = kind_of(problem).error(problem, outs, ref, False)
    assert not err <= tol


SM90 = get_target("cuda:sm_90a")


@pytest.mark.skipif(triton_can_target(SM90) is not None, reason=str(triton_can_target(SM90)))
def test_emitter_edge_cases_compile_for_a_gpu(tmp_path):
    """What the interpreter forgives must also compile (no GPU needed): constant stores,
    constant operands of pow/copysign/atan2, integer -> bf16/fp16, a masked load of a 0-d
    tensor in a pointwise and a reduction kernel, libdevice's math."""
    fns = [
        (lambda a: (a + 1, torch.zeros(3, 4), torch.ones(3, dtype=torch.int64), torch.full((2, 5), True)), [randn(*SHAPE)]),
        (lambda a: (torch.pow(2.0, a), a.abs() ** 3.5, torch.copysign(a, -0.0), torch.atan2(a, torch.tensor(0.5))),
         [randn(*SHAPE)]),
        (lambda a: (a.to(BF16), a.to(FP16) * 2), [ints(*SHAPE, dtype=torch.int32)]),
        (lambda g, x: torch.ops.aten.select_backward(g.expand(7), [7, 13], 1, 12) * x[:, None], [torch.tensor(2.0), randn(7)]),
        (lambda g, x: (torch.ops.aten.select_backward(g.expand(7), [7, 13], 1, 12) * x[:, None]).sum(1),
         [torch.tensor(2.0), randn(7)]),
        (lambda a: (torch.erfinv(a), torch.tan(a), torch.round(a * 4)), [unit(*SHAPE)]),
    ]
    jobs = []
    for i, (fn, args) in enumerate(fns):
        for k, problem in enumerate(loop_problems(fn, *args)):
            template = get_template(f"triton.{problem.kind}")
            rendered = template.render(problem, template.space.complete({}), SM90)
            jobs.append(CompileJob(f"case{i}_{k}", rendered.source, rendered.aot.to_json(), SM90.triton))
    for r in compile_jobs(jobs, tmp_path, workers=2, timeout_s=300):
        assert r.ok, f"{r.name}: {r.status} {r.error[-500:]}"


def test_interpreted_stores_round_to_nearest_even_like_eager():
    """The interpreter's fp32 -> bf16/fp16 conversion truncates; the emitter rounds to nearest
    even first, so a bf16 result is as close to the float64 truth as eager's (truncation would
    double the error)."""
    a, b, c = randn(64, 96, seed=1), randn(96, seed=2), randn(64, 1, seed=3)
    exact = a.double() * b.double() + c.double() * 0.37
    for dtype in (BF16, FP16):
        out, _ = run_triton(lambda x, y, z: (x * y + z * 0.37).to(dtype), a, b, c)
        eager = (a * b + c * 0.37).to(dtype)
        truncated = ((a * b + c * 0.37).view(torch.int32) & (-65536)).view(FP32) if dtype == BF16 else None
        err, err_eager = rel_error(out, exact), rel_error(eager, exact)
        assert err <= 1.05 * err_eager, f"{dtype}: {err:.3g} vs eager {err_eager:.3g}"
        assert torch.equal(out, eager)  # and in fact bit for bit the same rounding
        if truncated is not None:  # the test can tell: truncation is about twice as far off
            assert rel_error(truncated, exact) > 1.6 * err_eager


def test_interpreted_bf16_inputs_and_outputs_round_like_eager():
    a, b = randn(64, 96, dtype=BF16, seed=1), randn(96, dtype=BF16, seed=2)
    out, _ = run_triton(lambda x, y: F.gelu(x) * y + 1.0, a, b)
    eager = F.gelu(a) * b + 1.0
    exact = F.gelu(a.double()) * b.double() + 1.0
    assert rel_error(out, exact) <= 1.05 * rel_error(eager, exact)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "var"])
def test_rows_longer_than_4096_match_eager(name):
    # past 4096 the interpreter's policy proposes a looped candidate beside the persistent one;
    # the looped form itself (argmax, layer norm, welford ...) is checked at the kernel level
    # below with short RBLOCKs
    fns = {"softmax": lambda a: a.softmax(-1), "var": lambda a: a.var(-1)}
    check_against_eager(fns[name], randn(2, 4200) + (100.0 if name == "var" else 0.0), kernels=1)


def test_rows_of_a_reduction_kernel_match_for_every_block_shape_tried(cpu):
    (problem,) = loop_problems(lambda a: a.softmax(-1), randn(9, 70))
    for params in REDUCTION_PARAMS + [dict(XBLOCK=16, PERSISTENT=True), dict(XBLOCK=8, PERSISTENT=False, RBLOCK=32)]:
        got, ref = run_template(problem, params, cpu)
        assert_matches_reference(problem, got, ref)

