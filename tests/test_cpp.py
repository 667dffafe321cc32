"""The C++ loop kernels of the ``cpu`` target (``cpp.pointwise``, ``cpp.reduction``): rendered
per LoopProblem (made by the pipeline's own stages, or built by hand from the IR), built with the
host compiler, run into NaN-poisoned outputs and compared with the torch emitter's float64
reference (‖out − ref‖ / ‖ref‖ per output dtype): every op of the IR's table, reductions of every
kind in the persistent and the looped form, non-contiguous and broadcast inputs, masks, gathers,
combo kernels, bf16/fp16 rounding (ties and subnormals), integer division of negatives, NaN and
infinities; a compiled Llama block with the cpp templates forced against eager; the compile
cache across processes.

Each distinct kernel is one g++ build (~0.6 s): the block size is a run-time argument (one
library serves every value), ``PERSISTENT`` changes the source only where a pass buffers
something, and the libraries are cached by hash under the session's cache dir.
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
from tilewright.runtime import toolchain
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
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)  # the shared probe (runtime.toolchain.host_cxx)
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


# -- rounding and special values -----------------------------------------------------------------
def _cast_kernel(src: str, dst: str, n: int) -> LoopProblem:
    import sympy

    from tilewright.ir import expr as E
    from tilewright.ir.index import contiguous_strides, variables
    from tilewright.ir.kernel import Buffer, LoopKernel, Store

    shape = (sympy.Integer(n),)
    x = variables("x", 1)
    value = E.cast(E.load("in0", x, src), dst, explicit=True)
    kernel = LoopKernel(shape, (), (Buffer("in0", src, shape, contiguous_strides(shape)),),
                        (Buffer("out0", dst, shape, contiguous_strides(shape)),), (Store("out0", x, value),))
    return LoopProblem(kernel, op=f"to_{dst}")


def _rounding_cases() -> torch.Tensor:
    f32 = torch.float32
    bits = torch.tensor([
        0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x3F808001,  # bf16 ties to even, just below/above
        0x00008000, 0x00018000, 0x00000001, 0x007FFFFF, 0x00400000,  # fp32 subnormals (bf16 ties among them)
        0x7F7FFFFF, 0x7F7F8000, 0xFF7F8000, 0x80000000, 0x7FC00000, 0x7F800000, 0xFF800000,  # overflow, -0, NaN, inf
    ], dtype=torch.int64).to(torch.int32).view(f32)
    fp16 = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -11, 2 ** -25, 3 * 2 ** -25, 2 ** -24, 5.96e-8, 6.1e-5, 65504.0,
                         65519.0, 65520.0, -65520.0, 1e-9, -2.5e-8], dtype=f32)
    return torch.cat([bits, fp16, torch.randn(200, generator=torch.Generator().manual_seed(3)) * 1e-38,
                      torch.randn(200, generator=torch.Generator().manual_seed(4)) * 300])


@needs_cxx
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
def test_narrow_float_stores_round_to_nearest_even_bit_for_bit(dtype):
    """Ties to even, subnormals, overflow to infinity, -0 and NaN, as torch's own conversion."""
    from tilewright.ir import dtypes

    x = _rounding_cases()
    problem = _cast_kernel("fp32", dtypes.name_of(dtype), x.numel())
    got, _ = run_cpp(problem, {"BLOCK": 4096}, LoopInputs([x], []))
    want = x.to(dtype)
    assert torch.equal(got[0].isnan(), want.isnan())
    assert torch.equal(got[0].view(torch.int16)[~want.isnan()], want.view(torch.int16)[~want.isnan()])


@needs_cxx
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
def test_narrow_float_loads_are_exact_subnormals_included(dtype):
    from tilewright.ir import dtypes

    x = _rounding_cases().to(dtype)
    problem = _cast_kernel(dtypes.name_of(dtype), "fp32", x.numel())
    got, _ = run_cpp(problem, {"BLOCK": 4096}, LoopInputs([x], []))
    assert torch.equal(got[0].isnan(), x.isnan()) and torch.equal(got[0][~x.isnan()], x.float()[~x.isnan()])


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8], ids=str)
def test_integer_division_and_remainder_of_negatives_match_torch_exactly(dtype):
    a = torch.tensor([7, -7, 7, -7, 0, 1, -1, 13, -13, 100, -100, 5], dtype=dtype)
    b = torch.tensor([2, 2, -2, -2, 3, -3, 3, 5, -5, 7, -7, -1], dtype=dtype)
    fns = (lambda p, q: p // q, lambda p, q: p % q, lambda p, q: torch.div(p, q, rounding_mode="trunc"),
           lambda p, q: torch.fmod(p, q))
    for fn in fns:
        (problem,) = loop_problems(fn, a, b)
        got, _ = run_cpp(problem, {"BLOCK": 4096}, LoopInputs([a, b], []))
        assert torch.equal(got[0], fn(a, b)), (problem.op, got[0], fn(a, b))


@needs_cxx
def test_integer_division_by_zero_raises_as_torch_instead_of_trapping():
    a = torch.tensor([7, -7, 3], dtype=torch.int64)
    b = torch.tensor([2, 0, 1], dtype=torch.int64)
    for fn in (lambda p, q: p // q, lambda p, q: p % q, lambda p, q: torch.fmod(p, q)):
        (problem,) = loop_problems(fn, a, b)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            run_cpp(problem, {"BLOCK": 4096}, LoopInputs([a, b], []))
    # the most negative integer by -1 wraps, as torch's floor division does (no SIGFPE)
    m = torch.tensor([-2 ** 63], dtype=torch.int64)
    (problem,) = loop_problems(lambda p, q: (p // q, p % q), m, torch.tensor([-1]))
    got, _ = run_cpp(problem, {"BLOCK": 4096}, LoopInputs([m, torch.tensor([-1])], []))
    assert got[0].item() == -2 ** 63 and got[1].item() == 0


@needs_cxx
def test_a_gather_out_of_range_raises_index_error_and_reads_nothing_outside():
    w = randn(10, 6)
    (problem,) = loop_problems(lambda w, i: F.embedding(i, w) * 2, w, ints(3, 4, lo=0, hi=10))
    for bad in (10, -11, 2 ** 40):
        i = ints(3, 4, lo=0, hi=10)
        i[1, 2] = bad
        with pytest.raises(IndexError, match="index out of range"):
            run_cpp(problem, {"BLOCK": 4096}, LoopInputs([w, i], []))


@needs_cxx
def test_float_ops_on_nan_infinities_and_signed_zeros_match_the_reference():
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0])
    x = _tensors()
    g = torch.Generator().manual_seed(5)
    for k in (0, 1, 2, 8):  # a (transposed), p, u and the fp64 input: special values in every row
        flat = x[k].reshape(-1) if x[k].is_contiguous() else None
        pick = specials[torch.randint(0, len(specials), (x[k].numel() // 3,), generator=g)].to(x[k].dtype)
        pos = torch.randperm(x[k].numel(), generator=g)[:pick.numel()]
        if flat is None:
            x[k] = x[k].contiguous().t().contiguous().t()  # same strides as traced, writable
            flat = x[k].t().reshape(-1)
            flat[pos] = pick
            x[k] = flat.view(x[k].shape[::-1]).t()
        else:
            flat[pos] = pick
    for group in ("float_unary", "binary_float"):
        problem = _op_kernel(OP_GROUPS[group])
        got, ref = run_cpp(problem, {"BLOCK": 4096}, LoopInputs(x, []))
        for b, o, r in zip(problem.kernel.outputs, got, ref):
            name = list(OP_GROUPS[group])[int(b.name[3:])]
            if name in ("erfinv",):  # its input is meant to lie in (-1, 1)
                continue
            err = loop_error(o, r.to(o.dtype), b.dtype)
            assert err <= LOOP_TOLERANCE.get(b.dtype, 0.0), f"{name}: error {err:.3g}"


# -- the compile cache ---------------------------------------------------------------------------
TINY = r'''
#include <stdint.h>
extern "C" int64_t tw_cpp_kernel(const int64_t *args) {
  float *out = reinterpret_cast<float *>(args[0]);
  for (int64_t i = 0; i < args[1]; ++i) out[i] = float(i) * 0.5f + float(args[2]);
  return 0;
}
'''
CHILD = r'''
import json, sys, torch
from tilewright.runtime import cpp
k = cpp.kernel(sys.argv[1], "tw_cpp_kernel", name="tiny")
out = torch.empty(7)
status = cpp.ctypes_launcher()(k.address, out.data_ptr(), 7, 3)
print(json.dumps({"status": status, "out": out.tolist(), "builds": cpp.stats["builds"], "path": str(k.path)}))
'''


def _child(cache, source: str = TINY):
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TILEWRIGHT_CACHE_DIR=str(cache))
    return subprocess.Popen([sys.executable, "-c", CHILD, source], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True), json


def _result(proc_json):
    proc, json = proc_json
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


WANT = [i * 0.5 + 3 for i in range(7)]


@needs_cxx
def test_processes_building_the_same_kernel_build_it_once_and_a_later_one_reuses_it(tmp_path):
    both = [_child(tmp_path), _child(tmp_path)]  # at the same time: one builds, one waits
    results = [_result(p) for p in both]
    assert all(r["out"] == WANT and r["status"] == 0 for r in results)
    assert sum(r["builds"] for r in results) == 1, results
    later = _result(_child(tmp_path))
    assert later["builds"] == 0 and later["out"] == WANT and later["path"] == results[0]["path"]


@needs_cxx
def test_a_corrupted_or_partial_cached_library_is_rebuilt_not_loaded(fresh_cache):
    lib = runtime.build(TINY, "tiny")
    built = runtime.stats["builds"]
    damages = {
        "truncated": lambda data: lib.write_bytes(data[: len(data) // 2]),  # a copy cut short
        "garbage": lambda data: lib.write_bytes(bytes(len(data))),  # same size, wrong bytes
        # the build was interrupted before its digest was written
        "digest missing": lambda data: lib.with_name(lib.name + ".sha256").unlink(),
    }
    for name, damage in damages.items():
        damage(lib.read_bytes())
        assert not runtime.is_valid(lib), name
        assert runtime.build(TINY, "tiny") == lib
        built += 1
        assert runtime.stats["builds"] == built, f"{name}: not rebuilt"
        assert runtime.is_valid(lib) and lib.read_bytes()[:4] == b"\x7fELF", name
    # and a new process loads and runs what was rebuilt
    again = _result(_child(fresh_cache))
    assert again["builds"] == 0 and again["out"] == WANT


@needs_cxx
def test_a_kernel_that_does_not_compile_names_the_error_and_the_source(fresh_cache):
    from tilewright.errors import KernelCompileError

    with pytest.raises(KernelCompileError, match="did not build") as info:
        runtime.kernel('extern "C" long broken( {', "broken")
    assert ".cpp" in str(info.value)


@needs_cxx
def test_the_launcher_is_cheap_per_call():
    """The C extension packs the arguments (ctypes' conversions cost ~10x more); a launch of a
    kernel doing nothing costs at most a few µs even on a loaded 2-core machine."""
    import time

    k = runtime.kernel(TINY, "tw_cpp_kernel", name="tiny")
    call = runtime.launcher()
    assert call is not runtime.ctypes_launcher(), "the launcher extension did not build"
    out = torch.empty(1)
    args = [out.data_ptr(), 0, 0] + [0] * 20
    best = min(_timed(lambda: call(k.address, *args), time) for _ in range(5))
    assert best < 20e-6, f"{best * 1e6:.1f} µs per launch"
    assert runtime.ctypes_launcher()(k.address, out.data_ptr(), 1, 2) == 0 and out.item() == 2.0


def _timed(fn, time, n=2000):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


# -- cpp.gemm: ATen's product, the epilogue in one C++ pass -----------------------------------------
def _gemm_problems():
    from tilewright.ir import expr as E
    from tilewright.ir.epilogue import dumps, input_load
    from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem

    clamp = E.op("minimum", E.op("maximum", E.acc(), E.const(-0.5, "fp32")), input_load(0, "N", "fp32"))
    return {
        "fp32_bias_gelu": GemmProblem(M=37, N=45, K=29, dtype="fp32", op="addmm",
                                      epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu")),
                                      epilogue_inputs=(EpilogueInput("N", "fp32"),)),
        "bf16_silu_mul_residual": GemmProblem(
            M=70, N=33, K=100, dtype="bf16", layout_b="strided",
            epilogue=(EpilogueOp("silu"), EpilogueOp("mul", input=0)), epilogue_inputs=(EpilogueInput("MN", "bf16"),)),
        "fp16_batched_row_scale_to_fp32": GemmProblem(
            M=19, N=23, K=40, dtype="fp16", out_dtype="fp32", batch=3, batched=True, op="bmm",
            epilogue=(EpilogueOp("mul", input=0), EpilogueOp("sub", scalar=0.25, reverse=True)),
            epilogue_inputs=(EpilogueInput("BM", "fp16"),)),
        "fp32_ir_epilogue_clamp": GemmProblem(M=33, N=17, K=65, dtype="fp32", epilogue_ir=dumps(clamp),
                                              epilogue_inputs=(EpilogueInput("N", "fp32"),)),
    }


GEMMS = _gemm_problems()


@needs_cxx
@pytest.mark.parametrize("name", sorted(GEMMS))
def test_cpp_gemm_fills_a_poisoned_output_with_the_reference(name):
    from tilewright.autotune.inputs import make_inputs, poisoned_output, rel_error, tolerance

    problem = GEMMS[name]
    template = get_template("cpp.gemm")
    assert template.supports(problem, CPU)
    launch = FACTORY.compile(template.render(problem, {}, CPU))
    x = make_inputs(problem, "cpu", seed=1)
    out = poisoned_output(problem, "cpu")
    got = launch(x.a, x.b, *_expanded(problem, x), out=out)
    assert got is out, "written into the buffer given"
    ref = FACTORY.reference(problem, x)
    # as close to float64 as eager: ATen's product in the operands' dtype, then the epilogue
    err, tol = rel_error(got, ref), tolerance(problem)
    assert err <= tol, f"{problem.describe()}: error {err:.3g} > {tol:.0e}"


def _expanded(problem, x):
    """The epilogue inputs as the wrapper hands them: expanded to the output's shape."""
    shape = (problem.batch, problem.M, problem.N) if problem.batched else (problem.M, problem.N)
    return [e.expand(shape) for e in x.epilogue_inputs]


def test_cpp_gemm_refuses_what_it_does_not_do():
    from tilewright.problem import GemmProblem

    t = get_template("cpp.gemm")
    assert "no epilogue" in t.supports(GemmProblem(M=8, N=8, K=8, dtype="fp32"), CPU).reason
    assert not t.supports(GEMMS["fp32_bias_gelu"], get_target("cuda:sm_90a"))
    assert "fp8" in t.supports(GemmProblem(M=8, N=8, K=8, dtype="fp8e4m3", out_dtype="bf16",
                                           epilogue=GEMMS["fp32_bias_gelu"].epilogue,
                                           epilogue_inputs=GEMMS["fp32_bias_gelu"].epilogue_inputs), CPU).reason
