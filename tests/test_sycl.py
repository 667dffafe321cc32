"""The SYCL backend (Intel XPU): loop kernels rendered by the SYCL templates for the ``xpu``
target, built at run time by the SYCL runtime and run on the OpenCL CPU device of
``intel-opencl-rt`` with CPU tensors, into NaN-poisoned outputs, against the torch emitter's
float64 reference (‖out − ref‖ / ‖ref‖ per output dtype); ragged sizes (not multiples of the
work-group size), looped rows, non-contiguous inputs; and the one-line refusal when the runtime
is missing.

Needs the ``sycl`` extra (``pip install 'tilewright[sycl]'``, which ``make setup`` installs) and
a C++ compiler; without them the device tests are skipped with the reason and only the refusal
tests run. Each distinct kernel costs one SYCL build (~2-4 s): kernels are shared across tests
(the device caches bundles per source, and the work-group size is a launch parameter, so every
``WG`` tried runs the same build).
"""

from __future__ import annotations

import importlib.metadata

import pytest
import sympy
import torch

from loop_check import BF16, F, FP16, ints, randn
from test_loop_kernels import FACTORY, assert_matches_reference, loop_problems
from tilewright.autotune.kinds import LOOP_TOLERANCE, LoopInputs, loop_error, make_loop_inputs, poisoned_loop_outputs
from tilewright.ir import expr as E
from tilewright.ir.index import contiguous_strides, variables
from tilewright.ir.kernel import Buffer, LoopKernel, Store
from tilewright.ir.ops import OPS
from tilewright.problem import LoopProblem
from tilewright.runtime import sycl as runtime
from tilewright.runtime import toolchain
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template, templates_for

XPU = get_target("xpu")
MISSING = runtime.unavailable_reason()
needs_sycl = pytest.mark.skipif(MISSING is not None, reason=f"SYCL runtime unavailable: {MISSING}")
WGS = (16, 128)  # 16: every size here is ragged against it; 128: rows shorter than the group


def run_sycl(problem: LoopProblem, params: dict, inputs: LoopInputs | None = None):
    """The SYCL template's outputs (into NaN-poisoned buffers) and the float64 reference."""
    template = get_template(f"sycl.{problem.kind}")
    launch = FACTORY.compile(template.render(problem, template.space.complete(params), XPU))
    x = inputs or make_loop_inputs(problem, "cpu", seed=1)
    outs = poisoned_loop_outputs(problem, "cpu")
    got = launch(*x.tensors, *x.sizes, outs=outs)
    assert all(g is o for g, o in zip(got, outs)), "the kernel must write the buffers it is handed"
    return got, FACTORY.reference(problem, x)


# -- the refusal: a missing runtime is one line naming the extra; nothing else breaks ----------
def test_a_missing_sycl_runtime_refuses_with_one_line_naming_the_extra(monkeypatch):
    real = importlib.metadata.version

    def version(dist):
        if dist == "intel-sycl-rt":
            raise importlib.metadata.PackageNotFoundError(dist)
        return real(dist)

    runtime.wheels.cache_clear()
    monkeypatch.setattr(importlib.metadata, "version", version)
    try:
        why = runtime.unavailable_reason()
        assert why is not None and "\n" not in why
        assert "pip install 'tilewright[sycl]'" in why and "intel-sycl-rt" in why
        (problem,) = loop_problems(lambda a: a.exp(), randn(3, 5))
        support = get_template("sycl.pointwise").supports(problem, XPU)
        assert not support and support.reason == why
    finally:
        monkeypatch.undo()
        runtime.wheels.cache_clear()


def test_a_missing_compiler_refuses_naming_it(monkeypatch):
    if isinstance(runtime.wheels(), str):
        pytest.skip("the wheels are missing too (that refusal is tested above)")
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)  # the shared probe (runtime.toolchain.host_cxx)
    why = runtime.unavailable_reason()
    assert why is not None and "C++ compiler" in why and "g++" in why


def test_sycl_templates_serve_only_the_xpu_target():
    (problem,) = loop_problems(lambda a: a.exp(), randn(3, 5))
    assert {t.id for t in templates_for("pointwise", "xpu")} >= {"sycl.pointwise"}
    for name in ("cpu", "cuda:sm_90a", "mps"):
        support = get_template("sycl.pointwise").supports(problem, get_target(name))
        assert not support and "xpu" in support.reason
    assert "sycl.pointwise" not in {t.id for t in templates_for("pointwise", "cpu")}


def test_rendered_source_is_a_free_function_nd_range_kernel():
    (problem,) = loop_problems(lambda a: a.softmax(-1), randn(3, 13))  # rows past unroll_reductions
    t = get_template("sycl.reduction")
    src = t.render(problem, {}, XPU).source if MISSING is None else None
    if src is None:
        pytest.skip(f"SYCL runtime unavailable: {MISSING}")
    assert "SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))" in src
    assert 'extern "C"' in src and "sycl::reduce_over_group" in src
    # the work-group size is a launch parameter: every WG renders the same SYCL source
    other = t.render(problem, {"WG": 16}, XPU).source
    assert src.split("'''")[1] == other.split("'''")[1]


# -- every pointwise op, one kernel per group of ops, built by hand from the IR ----------------
SHAPE = (7, 13)  # 91 elements: ragged against every work-group size
X = variables("x", 2)
# inputs: normal floats (read transposed: non-contiguous), positive, in (-0.9, 0.9), nonzero
# integers, booleans, bf16 and fp16 values
INPUTS = [("a", "fp32", (1, 7)), ("p", "fp32", None), ("u", "fp32", None), ("i", "i64", None),
          ("j", "i64", None), ("m", "bool", None), ("h", "bf16", None), ("g", "fp16", None),
          ("d", "fp64", None)]


def _inputs() -> tuple[list[Buffer], dict[str, E.Node]]:
    bufs, nodes = [], {}
    for k, (name, dt, stride) in enumerate(INPUTS):
        shape = tuple(sympy.Integer(s) for s in SHAPE)
        st = tuple(sympy.Integer(s) for s in stride) if stride else contiguous_strides(shape)
        bufs.append(Buffer(f"in{k}", dt, shape, st))
        nodes[name] = E.load(f"in{k}", X, dt)
    return bufs, nodes


def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    a = torch.randn(SHAPE[::-1], generator=g).t()  # strides (1, 7)
    p = torch.rand(SHAPE, generator=g) * 2 + 0.1
    u = torch.rand(SHAPE, generator=g) * 1.8 - 0.9
    i = torch.randint(-20, 20, SHAPE, generator=g)
    j = torch.randint(1, 6, SHAPE, generator=g) * (torch.randint(0, 2, SHAPE, generator=g) * 2 - 1)
    m = torch.rand(SHAPE, generator=g) > 0.5
    h = torch.randn(SHAPE, generator=g).to(BF16)
    gg = torch.randn(SHAPE, generator=g).to(FP16)
    d = torch.randn(SHAPE, generator=g).double()
    return [a, p, u, i, j, m, h, gg, d]


def _op_kernel(values: dict[str, E.Node]) -> LoopProblem:
    bufs, _ = _inputs()
    shape = tuple(sympy.Integer(s) for s in SHAPE)
    outs, stores = [], []
    for k, (name, v) in enumerate(values.items()):
        outs.append(Buffer(f"out{k}", v.dtype, shape, contiguous_strides(shape)))
        stores.append(Store(f"out{k}", X, v))
    kernel = LoopKernel(shape, (), tuple(bufs), tuple(outs), tuple(stores))
    return LoopProblem(kernel, op="+".join(values))


def _op_groups() -> dict[str, dict[str, E.Node]]:
    _, n = _inputs()
    a, p, u, i, j, m, d = n["a"], n["p"], n["u"], n["i"], n["j"], n["m"], n["d"]
    h = E.cast(n["h"], "fp32")  # narrow floats computed in fp32, as lowering does
    gf = E.cast(n["g"], "fp32")
    unary_domain = {"log": p, "log2": p, "log10": p, "log1p": p, "sqrt": p, "rsqrt": p,
                    "asin": u, "acos": u, "erfinv": u, "reciprocal": p}
    float_unary = {op: E.op(op, unary_domain.get(op, a)) for op, info in OPS.items()
                   if info.arity == 1 and info.domain == "float"}
    float_unary |= {f"{op}_f": E.op(op, a) for op in ("neg", "abs", "sign")}
    float_unary["isnan"] = E.op("isnan", E.op("log", a))  # NaN where a < 0
    float_unary["isinf"] = E.op("isinf", E.op("truediv", a, E.const(0.0, "fp32")))
    binary_f = {op: E.op(op, a, p) for op, info in OPS.items()
                if info.arity == 2 and info.domain in ("float", "any") and info.result == "same"}
    binary_f["pow_neg_base"] = E.op("pow", a, E.const(3.0, "fp32"))
    binary_f |= {f"{op}_cmp": E.cast(E.op(op, a, u), "fp32") for op in ("eq", "ne", "lt", "le", "gt", "ge")}
    binary_f["where"] = E.where(E.op("gt", a, u), a, p)
    binary_f["max_nan"] = E.op("maximum", E.op("log", a), p)  # NaN propagates
    binary_f["bf16_in_out"] = E.cast(E.op("mul", h, p) + 1.0, "bf16", explicit=True)
    binary_f["fp16_in_out"] = E.cast(E.op("add", gf, a), "fp16", explicit=True)
    binary_f["fp64"] = E.op("mul", d, E.op("exp", d))
    binary_f["to_bf16_explicit"] = E.cast(E.cast(a, "bf16", explicit=True), "fp32")
    integer = {f"{op}_i": E.op(op, i, j) for op, info in OPS.items()
               if info.arity == 2 and info.domain in ("int", "any") and info.result == "same"}
    integer |= {f"{op}_i": E.op(op, i) for op in ("neg", "abs", "sign", "bitwise_not")}
    integer |= {f"{op}_b": E.op(op, m, E.op("gt", a, E.const(0.0, "fp32")))
                for op in ("logical_and", "logical_or", "logical_xor")}
    integer["logical_not"] = E.op("logical_not", m)
    integer["bool_add"] = E.op("add", m, m)
    integer["int_to_float"] = E.cast(i, "fp32") * 0.5
    integer["float_to_int"] = E.cast(a * 10.0, "i64")
    integer["iota"] = E.index(X[0] * 13 + X[1], "i64")
    integer["where_masked_load"] = E.load("in3", X, "i64", mask=E.op("lt", E.index(X[1]), E.const(5, "i64")))
    integer["gather"] = E.load("in0", (E.indirect_symbol(0), X[1]), "fp32",
                               indirect=(E.op("mod", i, E.const(7, "i64")),))
    return {"float_unary": float_unary, "binary_float": binary_f, "integer_bool": integer}


OP_GROUPS = _op_groups()


@needs_sycl
@pytest.mark.parametrize("group", sorted(OP_GROUPS))
def test_every_pointwise_op_matches_the_reference(group):
    problem = _op_kernel(OP_GROUPS[group])
    x = LoopInputs(_tensors(), [])
    assert not x.tensors[0].is_contiguous()
    for wg in WGS:
        got, ref = run_sycl(problem, {"WG": wg}, x)
        for b, o, r in zip(problem.kernel.outputs, got, ref):
            name = list(OP_GROUPS[group])[int(b.name[3:])]
            err = loop_error(o, r, b.dtype)
            assert err <= LOOP_TOLERANCE.get(b.dtype, 0.0), f"{name} (WG={wg}): error {err:.3g}"


def test_the_op_groups_cover_every_op_of_the_table():
    used = {n.op for group in OP_GROUPS.values() for v in group.values() for n in E.toposort([v])}
    assert set(OPS) <= used, f"not exercised: {sorted(set(OPS) - used)}"


# -- reductions and fused kernels from the pipeline's own stages -------------------------------
ROW = 37  # over two work-groups of 16: three strides of the row, the last one ragged
KERNELS = {
    "softmax": (lambda a: a.softmax(-1), lambda: [randn(5, ROW)]),
    "softmax_long_rows": (lambda a: a.softmax(-1), lambda: [randn(3, 300)]),
    "log_softmax_transposed": (lambda a: a.t().log_softmax(-1), lambda: [randn(ROW, 5)]),
    "layer_norm_with_stats": (lambda a, w, b: torch.native_layer_norm(a, (ROW,), w, b, 1e-5),
                              lambda: [randn(5, ROW), randn(ROW), randn(ROW)]),
    "layer_norm_bf16": (lambda a, w, b: F.layer_norm(a, (ROW,), w, b),
                        lambda: [randn(5, ROW, dtype=BF16), randn(ROW, dtype=BF16), randn(ROW, dtype=BF16)]),
    "rms_norm": (lambda a, w: F.rms_norm(a, (ROW,), w, eps=1e-6), lambda: [randn(5, ROW), randn(ROW)]),
    "var_mean_large_mean": (lambda a: torch.var_mean(a, 1), lambda: [randn(5, 200) + 1000.0]),
    "std_of_columns": (lambda a: a.std(0), lambda: [randn(ROW, 5)]),
    "argmax_argmin": (lambda a: (a.argmax(1), a.argmin(1)), lambda: [randn(5, ROW)]),
    "max_with_index": (lambda a: a.max(1), lambda: [randn(5, ROW)]),
    "prod_any_all": (lambda a: (a.prod(1), (a > 1).any(1), (a > -2).all(1)), lambda: [randn(5, ROW)]),
    "sum_everything": (lambda a: a.sum(), lambda: [randn(5, ROW)]),
    "integer_max_and_sum": (lambda a: (a.amax(1), a.sum(1), a.argmax(1)), lambda: [ints(5, ROW)]),
    "mean_of_two_dims": (lambda a: a.mean((0, 2), keepdim=True), lambda: [randn(3, 5, 6)]),
    "norm2_fp16": (lambda a: torch.linalg.vector_norm(a, dim=1), lambda: [randn(5, ROW, dtype=FP16)]),
    "cat_pad": (lambda a, b: F.pad(torch.cat([a, b], 1), (1, 1)).exp(), lambda: [randn(5, ROW), randn(5, 3)]),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, lambda: [randn(10, 6), ints(3, 4, lo=0, hi=10)]),
    "gelu_residual_bf16": (lambda a, b: (F.gelu(a) * b + a).to(BF16), lambda: [randn(7, 13), randn(13)]),
    # combo kernels: independent parts in one launch, each store masked to its share
    "combo_three_pointwise": (lambda a, b, c: (a.sin() * 2, (b * 3).exp(), c - 1),
                              lambda: [randn(5, 7), randn(3, 11, seed=1), randn(13, seed=2)]),
    "combo_softmax_hosts_pointwise": (lambda x, y: (torch.softmax(x, -1), y.cos()),
                                      lambda: [randn(6, 24), randn(29, seed=1)]),
}


@needs_sycl
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_sycl_loop_kernels_fill_poisoned_outputs_with_the_reference(name):
    fn, make = KERNELS[name]
    problems = loop_problems(fn, *make())
    assert problems
    if name.startswith("combo"):
        assert len(problems) == 1 and problems[0].kernel.parts, "expected one combo kernel"
    for problem in problems:
        for wg in WGS:
            got, ref = run_sycl(problem, {"WG": wg})
            assert_matches_reference(problem, got, ref)


@needs_sycl
def test_sycl_reductions_handle_nan_rows_as_the_reference():
    x = randn(5, ROW)
    x[1, 20] = x[3, 0] = x[3, 30] = x[4, ROW - 1] = float("nan")
    for fn in (lambda a: (a.argmax(1), a.argmin(1)), lambda a: a.max(1), lambda a: a.softmax(-1)):
        for problem in loop_problems(fn, x):
            for wg in WGS:
                got, ref = run_sycl(problem, {"WG": wg}, LoopInputs([x], []))
                assert_matches_reference(problem, got, ref)


@needs_sycl
def test_kernels_read_the_layout_they_are_handed_at_run_time():
    # traced contiguous, run on a strided view: strides are kernel arguments
    (problem,) = loop_problems(lambda a: a.softmax(-1), randn(5, ROW))
    base = randn(10, 2 * ROW, seed=4)
    view = base[::2, ::2]
    assert view.shape == (5, ROW) and not view.is_contiguous()
    got, ref = run_sycl(problem, {"WG": 16}, LoopInputs([view], []))
    assert_matches_reference(problem, got, ref)


@needs_sycl
def test_usm_staging_gives_the_same_result_as_zero_copy():
    """The CPU device reads host memory in place (zero-copy); the USM staging path a device
    without system allocations takes must give the same bits."""
    dev = runtime.device()
    assert dev.info.system_usm, f"{dev.info.name}: expected the OpenCL CPU device to read host memory"
    (problem,) = loop_problems(lambda a, b: a * b + 1, randn(5, ROW), randn(ROW))
    template = get_template("sycl.pointwise")
    src = template.render(problem, {}, XPU).source
    module_launch = FACTORY.compile(template.render(problem, {}, XPU))
    x = make_loop_inputs(problem, "cpu", seed=2)
    direct = module_launch(*x.tensors)[0]
    k = runtime.kernel(src.split("'''")[1], "tw_sycl_pointwise")
    out = poisoned_loop_outputs(problem, "cpu")[0]
    a, b = x.tensors
    k.launch([a, b, out, *a.stride(), *b.stride(), *out.stride(), out.numel()], 256, 256, stage=True)
    assert torch.equal(out, direct)


@needs_sycl
def test_the_device_is_the_opencl_cpu_device_and_builds_are_shared():
    dev = runtime.device()
    assert dev.info.backend == "opencl", dev.info
    before = dev.builds
    (problem,) = loop_problems(lambda a: a.softmax(-1), randn(5, ROW))
    for wg in WGS:
        run_sycl(problem, {"WG": wg})
    assert dev.builds - before <= 1, "one build per kernel source, whatever the work-group size"


@needs_sycl
def test_a_kernel_that_does_not_compile_names_the_error():
    from tilewright.errors import KernelCompileError

    with pytest.raises(KernelCompileError, match="did not build"):
        runtime.kernel('#include <sycl/sycl.hpp>\nextern "C" void broken( {', "broken")


# -- the GEMM template: local-memory tiles, fp32 accumulation, the IR epilogue ----------------
def _gemm_problems():
    from tilewright.ir.epilogue import dumps, input_load
    from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem

    clamp = E.op("minimum", E.op("maximum", E.acc(), E.const(-0.5, "fp32")), input_load(0, "N", "fp32"))
    return {
        # ragged everywhere: 37 x 45 x 29 against 16/64 tiles and 8/16 slabs
        "fp32_bias_gelu": GemmProblem(M=37, N=45, K=29, dtype="fp32", op="addmm",
                                      epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu")),
                                      epilogue_inputs=(EpilogueInput("N", "fp32"),)),
        "bf16_transposed_residual_silu": GemmProblem(
            M=70, N=33, K=100, dtype="bf16", layout_a="col", layout_b="strided",
            epilogue=(EpilogueOp("mul", input=0), EpilogueOp("silu")), epilogue_inputs=(EpilogueInput("MN", "bf16"),)),
        "fp16_batched_row_scale_to_fp32": GemmProblem(
            M=19, N=23, K=40, dtype="fp16", out_dtype="fp32", batch=3, batched=True, op="bmm",
            epilogue=(EpilogueOp("mul", input=0), EpilogueOp("sub", scalar=0.25, reverse=True)),
            epilogue_inputs=(EpilogueInput("BM", "fp16"),)),
        "fp32_ir_epilogue_clamp": GemmProblem(M=33, N=17, K=65, dtype="fp32", epilogue_ir=dumps(clamp),
                                              epilogue_inputs=(EpilogueInput("N", "fp32"),)),
        # a training Linear + GELU: the product with its bias is stored too, for the backward
        "bf16_store_acc_bias_then_gelu": GemmProblem(
            M=21, N=38, K=27, dtype="bf16", op="addmm", store_acc=True, acc_after=1,
            epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu")),
            epilogue_inputs=(EpilogueInput("N", "bf16"),)),
    }


GEMMS = _gemm_problems()
GEMM_PARAMS = [{}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=8, THREAD_M=2, THREAD_N=4)]


@needs_sycl
@pytest.mark.parametrize("name", sorted(GEMMS))
def test_sycl_gemm_fills_a_poisoned_output_with_the_reference(name):
    from tilewright.autotune.inputs import make_inputs, poisoned_output, rel_error, tolerance

    problem = GEMMS[name]
    template = get_template("sycl.gemm")
    # the small tile on the first problem only: each parameter set is one more build
    for params in GEMM_PARAMS if name == "fp32_bias_gelu" else GEMM_PARAMS[:1]:
        launch = FACTORY.compile(template.render(problem, params, XPU))
        x = make_inputs(problem, "cpu", seed=1)
        out = poisoned_output(problem, "cpu")
        got = launch(x.a, x.b, *x.epilogue_inputs, out=out)
        assert got is out or all(g is o for g, o in zip(got, out)), "written into the buffers given"
        err, tol = rel_error(got, FACTORY.reference(problem, x)), tolerance(problem)
        assert err <= tol, f"{problem.describe()} {params}: error {err:.3g} > {tol:.0e}"


def test_sycl_gemm_refuses_what_it_does_not_do():
    from tilewright.problem import GemmProblem

    t = get_template("sycl.gemm")
    p = GemmProblem(M=32, N=32, K=32, dtype="fp32")
    assert not t.supports(p, get_target("cuda:sm_90a"))
    assert "fp8e4m3" in t.supports(GemmProblem(M=8, N=8, K=8, dtype="fp8e4m3", out_dtype="bf16"), XPU).reason
    assert "work-items" in t.check(dict(BLOCK_M=128, BLOCK_N=128, THREAD_M=1, THREAD_N=1), p, XPU)


@needs_sycl
def test_the_shim_is_built_once_per_key_and_the_key_follows_the_wheels(tmp_path):
    import dataclasses

    from tilewright._config import config

    w = runtime.wheels()
    lib = runtime.build_shim(w, config.cache_path)  # built here or by the device before
    assert lib.exists() and runtime.shim_key(w) in str(lib)
    assert runtime.build_shim(w, config.cache_path) == lib  # the second call finds it
    other = dataclasses.replace(w, version="2099.1.0")
    assert runtime.shim_key(other) != runtime.shim_key(w)
