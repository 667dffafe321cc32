"""The Metal (MPS) backend as far as Linux can prove it: the loop-kernel, GEMM and gemv
templates render Metal Shading Language for the ``mps`` target; every shader generated for the
demo's models passes the host syntax check (g++/clang++ ``-fsyntax-only`` with
``runtime/metal_shim.h``); seeded errors fail it with the compiler's own message; the rendered
launcher dispatches the right threads and threadgroup sizes and, with no MPS runtime, refuses in
one line; ``tilewright aot --target mps`` writes checked shaders and a manifest; and the shaders
run on the host (``tests/metal_host.py``: OS threads, barriers and SIMD-group exchanges in place
of a GPU) into NaN-poisoned outputs, matching the float64 reference.

What this cannot show (no Apple compiler or GPU here): Apple's compiler's own verdict, speed,
and behaviour the host emulation does not model (fast math, real simdgroup scheduling).
"""

from __future__ import annotations

import json
import types

import pytest
import sympy
import torch

from tilewright.templates.loop_schedule import strided_scan_refusal
from tilewright.compiler.capture import ModelSpec, capture_kernels, load_model
from tilewright.errors import EnvironmentMismatchError, UnsupportedProblemError
from tilewright.ir import expr as E
from tilewright.ir.index import contiguous_strides, var
from tilewright.ir.kernel import Buffer, LoopKernel, Store, size_symbol
from tilewright.ir.ops import OPS
from tilewright.problem import LoopProblem
from tilewright.runtime.metal_check import NO_RUNTIME, MetalShaderError, check_shader, kernel_names
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template, templates_for

MPS = get_target("mps")
POINTWISE = get_template("metal.pointwise")
REDUCTION = get_template("metal.reduction")


def settings(problem: LoopProblem) -> list[dict]:
    """The policy's settings for a problem, plus the looped form of every reduction whose row
    allows one (a threadgroup of 32 threads walking it), so both paths are checked."""
    t = REDUCTION if problem.kind == "reduction" else POINTWISE
    out = [p for p in t.seed_params(problem, MPS) if t.check(p, problem, MPS) is None]
    looped = {"XBLOCK": 1, "num_warps": 1, "PERSISTENT": False}
    if problem.kind == "reduction" and looped not in out and t.check(looped, problem, MPS) is None:
        out.append(looped)
    assert out, f"no legal Metal setting for {problem.describe()}"
    return out


def render(problem: LoopProblem, params: dict):
    t = REDUCTION if problem.kind == "reduction" else POINTWISE
    return t.render(problem, params, MPS)


def launcher(rendered) -> types.ModuleType:
    """The rendered Python launcher as a module (importing it compiles nothing)."""
    mod = types.ModuleType(rendered.name)
    exec(compile(rendered.source, rendered.name, "exec"), mod.__dict__)
    return mod


# -- small kernels built by hand ----------------------------------------------------------------
X0, R0 = var("x", 0), var("r", 0)
Z0, Z1 = size_symbol(0), size_symbol(1)


def row_reduction(kind: str, dtype: str = "fp32", rows: int = 6, row: int = 300,
                  dynamic: bool = False) -> LoopProblem:
    """``out0[x] = kind(in0[x, :])`` (both Welford values for ``welford``)."""
    inb = Buffer("in0", dtype, (Z0, Z1), (Z1, sympy.Integer(1)))
    v = E.cast(E.load("in0", (X0, R0), dtype), "fp32") if dtype in ("bf16", "fp16") else E.load("in0", (X0, R0), dtype)
    kinds = ("welford_mean", "welford_m2") if kind == "welford" else (kind,)
    outs, stores = [], []
    for k, kd in enumerate(kinds):
        red = E.reduce(kd, v)
        outs.append(Buffer(f"out{k}", red.dtype, (Z0,), (sympy.Integer(1),)))
        stores.append(Store(f"out{k}", (X0,), red))
    kernel = LoopKernel((Z0,), (Z1,), (inb,), tuple(outs), tuple(stores))
    return LoopProblem(kernel, (("z0", rows), ("z1", row)), frozenset({"z0"}) if dynamic else frozenset(), kind)


def softmax_problem(row: int = 300) -> LoopProblem:
    """Two dependent reductions (max, then the sum of exponentials) and a per-element store."""
    inb = Buffer("in0", "bf16", (Z0, Z1), (Z1, sympy.Integer(1)))
    v = E.cast(E.load("in0", (X0, R0), "bf16"), "fp32")
    e = E.op("exp", v - E.reduce("max", v))
    out = E.cast(e / E.reduce("sum", e), "bf16")
    kernel = LoopKernel((Z0,), (Z1,), (inb,), (Buffer("out0", "bf16", (Z0, Z1), (Z1, sympy.Integer(1))),),
                        (Store("out0", (X0, R0), out),))
    return LoopProblem(kernel, (("z0", 4), ("z1", row)), op="softmax")


def all_reductions(dtype: str, row: int, dynamic: bool = False) -> LoopProblem:
    """Every reduction kind of one row, each stored to its own output."""
    inb = Buffer("in0", dtype, (Z0, Z1), (Z1, sympy.Integer(1)))
    v = E.load("in0", (X0, R0), dtype)
    v = E.cast(v, "fp32") if dtype == "bf16" else v
    kinds = ["sum", "prod", "max", "min", "argmax", "argmin", "any", "all"]
    kinds += ["welford_mean", "welford_m2"] if dtype in ("fp32", "bf16") else []
    reds = [E.reduce(k, v) for k in kinds]
    reds.append(E.op("sub", v, E.reduce("max", v)))  # a per-element value after its reduction
    outs = tuple(Buffer(f"out{k}", r.dtype, (Z0, Z1) if k == len(reds) - 1 else (Z0,),
                        (Z1, sympy.Integer(1)) if k == len(reds) - 1 else (sympy.Integer(1),))
                 for k, r in enumerate(reds))
    stores = tuple(Store(f"out{k}", (X0, R0) if k == len(reds) - 1 else (X0,), r) for k, r in enumerate(reds))
    return LoopProblem(LoopKernel((Z0,), (Z1,), (inb,), outs, stores), (("z0", 5), ("z1", row)),
                       frozenset({"z0"}) if dynamic else frozenset(), op=f"all {dtype}")


SHAPE = (sympy.Integer(3), sympy.Integer(40))
EVERY_OP_DTYPES = ("fp32", "i32", "bool", "bf16", "i32")


def every_op_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    shape = tuple(int(s) for s in SHAPE)
    j = torch.randint(1, 10, shape, generator=g, dtype=torch.int32) * (torch.randint(0, 2, shape, generator=g) * 2 - 1)
    return [torch.randn(shape, generator=g) * 2, torch.randint(-20, 20, shape, generator=g, dtype=torch.int32),
            torch.rand(shape, generator=g) > 0.5, torch.randn(shape, generator=g).bfloat16(), j.int()]
X = (var("x", 0), var("x", 1))


def every_op_problems(per_kernel: int = 24) -> list[LoopProblem]:
    """Pointwise kernels storing every op of :data:`OPS` (float, integer and boolean operands),
    each value to its own output, ``per_kernel`` outputs a kernel (Metal binds at most 31
    buffers)."""
    ins = [Buffer(f"in{k}", dt, SHAPE, contiguous_strides(SHAPE)) for k, dt in enumerate(EVERY_OP_DTYPES)]
    a, i, m = E.load("in0", X, "fp32"), E.load("in1", X, "i32"), E.load("in2", X, "bool")
    h = E.cast(E.load("in3", X, "bf16"), "fp32")
    j = E.load("in4", X, "i32")  # never zero: the divisor of the integer divisions
    positive = E.op("gt", a, E.const(0.0, "fp32"))
    values: list[E.Node] = []
    for name, info in OPS.items():
        if name == "where":
            values.append(E.where(m, a, h))
        elif info.result == "bool" and info.name.startswith("logical"):
            values.append(E.op(name, *([m, positive][:info.arity])))
        elif info.domain == "int":
            values.append(E.op(name, *([i, j][:info.arity])))
        else:
            values.append(E.op(name, *([a, h][:info.arity])))
            if info.domain == "any":
                values.append(E.op(name, *([i, j][:info.arity])))
    values.append(E.cast(E.op("mul", h, a), "bf16", explicit=True))  # an explicit round
    values.append(E.index(X[0] * 40 + X[1], "i64"))
    values.append(E.load("in0", (E.indirect_symbol(0), X[1]), "fp32", indirect=(E.op("mod", i, E.const(3, "i32")),)))
    values.append(E.load("in0", X, "fp32", mask=E.op("lt", E.index(X[1]), E.const(5, "i64"))))
    problems = []
    for start in range(0, len(values), per_kernel):
        chunk = values[start:start + per_kernel]
        outs = tuple(Buffer(f"out{k}", v.dtype, SHAPE, contiguous_strides(SHAPE)) for k, v in enumerate(chunk))
        stores = tuple(Store(f"out{k}", X, v) for k, v in enumerate(chunk))
        problems.append(LoopProblem(LoopKernel(SHAPE, (), tuple(ins), outs, stores), op=f"ops {start}+"))
    return problems


# -- registration and refusals ------------------------------------------------------------------
def test_metal_templates_serve_the_mps_target_only():
    assert {"metal.pointwise"} <= {t.id for t in templates_for("pointwise", "mps")}
    assert {"metal.reduction"} <= {t.id for t in templates_for("reduction", "mps")}
    assert not any(t.backend == "metal" for t in templates_for("pointwise", "cuda"))
    p = softmax_problem()
    assert REDUCTION.supports(p, MPS)
    refusal = REDUCTION.supports(p, get_target("sm_90a"))
    assert not refusal and "mps target only" in refusal.reason
    assert not POINTWISE.supports(p, MPS)  # a reduction is not the pointwise template's


def test_what_metal_cannot_hold_or_launch_is_refused_with_a_reason():
    fp64 = row_reduction("sum", "fp64")
    why = REDUCTION.supports(fp64, MPS)
    assert not why and "no 64-bit floats" in why.reason
    with pytest.raises(UnsupportedProblemError, match="no 64-bit floats"):
        REDUCTION.render(fp64, {}, MPS)
    long_row = row_reduction("sum", row=3000)
    assert "loop over the row" in REDUCTION.check({"num_warps": 4, "PERSISTENT": True}, long_row, MPS)
    assert "persistent form" in REDUCTION.check({"num_warps": 32, "PERSISTENT": False}, row_reduction("sum", row=48), MPS)
    # 40 tensors: over Metal's 31 buffer arguments
    shape = (sympy.Integer(8),)
    ins = tuple(Buffer(f"in{k}", "fp32", shape, (sympy.Integer(1),)) for k in range(40))
    total = E.load("in0", (X0,), "fp32")
    for k in range(1, 40):
        total = total + E.load(f"in{k}", (X0,), "fp32")
    wide = LoopProblem(LoopKernel(shape, (), ins, (Buffer("out0", "fp32", shape, (sympy.Integer(1),)),),
                                  (Store("out0", (X0,), total),)))
    assert "31 buffer arguments" in POINTWISE.supports(wide, MPS).reason


# -- every shader of the demo's models passes the check -----------------------------------------
@pytest.fixture(scope="module")
def demo_problems() -> dict[str, list[LoopProblem]]:
    from tilewright.demo.models import load_minilm, minilm_inputs

    minilm = load_minilm()
    specs = {"llama_bf16_inference": (load_model("tilewright.demo.models:llama_bf16_example"), False),
             "llama_fp32_training": (load_model("tilewright.demo.models:llama_train_example"), True),
             "minilm_inference": (ModelSpec(minilm, (minilm_inputs(minilm),), name="minilm"), False)}
    return {name: [c.problem for c in capture_kernels(spec, train=train)] for name, (spec, train) in specs.items()}


@pytest.mark.parametrize("model", ["llama_bf16_inference", "llama_fp32_training", "minilm_inference"])
def test_every_shader_of_the_demo_models_passes_the_metal_check(demo_problems, model):
    # scans and scatters (the embedding's backward) Metal refuses by design, naming why
    problems = [p for p in demo_problems[model] if isinstance(p, LoopProblem) and not strided_scan_refusal(p.kernel)]
    assert problems and {p.kind for p in problems} == {"pointwise", "reduction"} or model == "minilm_inference"
    checked = 0
    for p in problems:
        for params in settings(p):
            r = render(p, params)
            shader = r.meta["shader"]
            assert kernel_names(shader) == [f"tw_{p.kind}"]
            check_shader(shader)
            checked += 1
            if p.kind == "reduction":
                # simdgroup reductions, then threadgroup memory across simdgroups
                assert "threadgroup_barrier(mem_flags::mem_threadgroup)" in shader
                assert "simd_sum(" in shader or "simd_shuffle_xor(" in shader or "_t0[" in shader
                assert ("for (int rindex = tid; rindex < rnumel; rindex += ntg)" in shader) != params["PERSISTENT"]
            else:
                assert "for (int xindex = gid; xindex < xnumel; xindex += gsize)" in shader
    assert checked >= len(problems)


def test_every_op_of_the_ir_renders_to_a_shader_that_passes_the_check():
    shaders = [render(p, {"num_warps": 4}).meta["shader"] for p in every_op_problems()]
    for shader in shaders:
        check_shader(shader)
    shader = "\n".join(shaders)
    # the math MSL lacks comes from the shader's own helpers, not from names Metal does not have
    for helper in ("tw_erf(", "tw_erfinv(", "tw_expm1(", "tw_log1p(", "tw_pow(", "tw_floordiv_f(", "tw_mod_f("):
        assert helper in shader
    assert "static_cast<bfloat>" in shader and "precise::exp(" in shader


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "i32", "i64"])
def test_every_reduction_kind_passes_the_check_persistent_and_looped(dtype):
    short, long_ = all_reductions(dtype, row=200), all_reductions(dtype, row=3000, dynamic=True)
    for p, params in ((short, {"num_warps": 8, "PERSISTENT": True}), (short, {"num_warps": 2, "PERSISTENT": False}),
                      (long_, {"num_warps": 32, "PERSISTENT": False})):
        assert REDUCTION.check(params, p, MPS) is None
        shader = render(p, params).meta["shader"]
        check_shader(shader)
        if dtype == "i64":
            # no 64-bit SIMD shuffles in MSL: the tree over threadgroup memory, one slot per thread
            assert f"threadgroup long tw_tg_long_t0[{params['num_warps'] * 32}];" in shader
            assert "simd_shuffle_xor(a0" not in shader and "simd_any(a0)" in shader  # bools still SIMD
        else:
            assert "simd_sum(a0)" in shader and "simd_shuffle_xor(a0, o)" in shader
    assert "const long xnumel" in render(long_, {"num_warps": 32, "PERSISTENT": False}).meta["shader"]  # dynamic: 64-bit


# -- seeded errors fail with the compiler's message ----------------------------------------------
@pytest.fixture(scope="module")
def looped_softmax() -> str:
    shader = render(softmax_problem(), {"num_warps": 2, "PERSISTENT": False}).meta["shader"]
    check_shader(shader)
    return shader


def _seed(shader: str, line: str) -> str:
    """``line`` added as the kernel's last statement."""
    head, tail = shader.rstrip().rsplit("}", 1)
    return f"{head}    {line}\n}}{tail}\n"


def test_an_out_of_scope_variable_fails_the_check(looped_softmax):
    # r0 is declared inside the loops over the row; after them it is out of scope
    assert "const int r0 = rindex;" in looped_softmax
    with pytest.raises(MetalShaderError, match=r".r0. was not declared in this scope|use of undeclared identifier .r0."):
        check_shader(_seed(looped_softmax, "const int seeded = r0;"))


def test_a_type_mismatch_fails_the_check(looped_softmax):
    with pytest.raises(MetalShaderError, match=r"cannot convert .*float4.* to .*float|no viable conversion"):
        check_shader(_seed(looped_softmax, "const float seeded = float4(1.0f);"))
    with pytest.raises(MetalShaderError, match=r"read-only|cannot assign"):  # a store through constant memory
        check_shader(_seed(looped_softmax, "meta[0] = 1;"))
    with pytest.raises(MetalShaderError, match=r"no matching function for call to .*simd_shuffle_xor"):
        check_shader(_seed(looped_softmax, "const long seeded = simd_shuffle_xor(7L, 1);"))  # no 64-bit shuffles


def test_a_kernel_argument_without_an_address_space_fails_the_check(looped_softmax):
    seeded = looped_softmax.replace("device bfloat* out0", "bfloat* out0")
    assert seeded != looped_softmax
    with pytest.raises(MetalShaderError, match="has no address space") as info:
        check_shader(seeded)
    assert "T = bfloat*" in str(info.value)  # the compiler names the argument's type


def test_a_function_metal_lacks_fails_the_check(looped_softmax):
    with pytest.raises(MetalShaderError, match=r".erf. was not declared|undeclared identifier .erf."):
        check_shader(_seed(looped_softmax, "const float seeded = erf(1.0f);"))


# -- the launch: geometry, argument order, and the one-line refusal ------------------------------
def test_the_launcher_dispatches_one_thread_per_element_and_one_threadgroup_per_row():
    p = every_op_problems()[0]
    r = render(p, {"num_warps": 4})
    mod = launcher(r)
    assert mod.THREADS_PER_GROUP == 128 and mod.KERNEL == "tw_pointwise"
    assert mod.grid(120) == ((120,), (128,))  # one thread per element
    cap = MPS.num_sms * 8 * 128
    assert mod.grid(10**8) == ((cap,), (128,))  # capped: the grid-stride loop covers the rest
    assert (r.meta["threads"], r.meta["group_size"]) == (120, 128)

    s = softmax_problem(row=300)
    for params, threads in (({"num_warps": 16, "PERSISTENT": True}, 512), ({"num_warps": 4, "PERSISTENT": False}, 128)):
        r = render(s, params)
        mod = launcher(r)
        assert mod.THREADS_PER_GROUP == threads and threads % 32 == 0 and threads <= 1024
        assert mod.grid(4, 300) == ((4 * threads,), (threads,))  # one threadgroup per row
        assert (r.meta["threads"], r.meta["group_size"]) == (4 * threads, threads)
        assert "torch.mps.compile_shader(SHADER)" in r.source
        assert "threads=threads, group_size=group_size" in r.source
        assert mod.SHADER.strip() == r.meta["shader"].strip()


def test_the_launcher_passes_tensors_in_the_shaders_buffer_order():
    import re

    r = render(softmax_problem(), {"num_warps": 4, "PERSISTENT": False})
    shader = r.meta["shader"]
    bound = re.findall(r"(\w+) \[\[buffer\((\d+)\)\]\]", shader)
    assert [int(i) for _, i in bound] == list(range(len(bound)))
    call = re.search(r"getattr\(_library, KERNEL\)\((.*), threads=", r.source).group(1)
    assert [a.strip() for a in call.split(",")] == [name for name, _ in bound]
    # and the size array in the order the shader unpacks it
    unpacked = re.findall(r"const int (\w+) = static_cast<int>\(meta\[(\d+)\]\);", shader)
    assert [n for n, _ in unpacked] == r.meta["meta_args"]
    packed = re.search(r"meta = torch.tensor\(\[(.*)\],", r.source).group(1)
    assert packed == "*in0.stride(), *out0.stride(), z0, z1, xnumel, rnumel"


def test_launching_without_an_mps_runtime_refuses_in_one_line():
    if torch.backends.mps.is_available():
        pytest.skip("this host has MPS")
    mod = launcher(render(softmax_problem(), {"num_warps": 16, "PERSISTENT": True}))
    x = torch.randn(4, 300).bfloat16()
    with pytest.raises(EnvironmentMismatchError) as info:
        mod.launch(x, 4, 300)
    assert str(info.value) == NO_RUNTIME and "\n" not in str(info.value)
    assert NO_RUNTIME == "Metal kernels need macOS with MPS; on this host they are compile-checked only"


def test_the_policy_proposes_metal_candidates_for_mps():
    from tilewright._config import config
    from tilewright.autotune.loop_policy import LoopPolicy

    s = softmax_problem(row=3000)
    ranked = LoopPolicy("reduction").ranked(s, MPS, REDUCTION)
    assert ranked and all(not p["PERSISTENT"] for _, p in ranked)  # too long for one element per thread
    with config.patch(force_backend="auto"):
        cands = LoopPolicy("reduction").candidates(softmax_problem(row=300), MPS)
    assert cands[0].template_id == "aten.reduction"
    assert any(c.template_id == "metal.reduction" for c in cands)
    from tilewright.autotune.policy import policy_for
    from tilewright.problem import GemmProblem

    with config.patch(force_backend="auto"):
        decode = policy_for("gemm", MPS).candidates(GemmProblem(M=4, N=256, K=128, dtype="bf16"), MPS)
        prefill = policy_for("gemm", MPS).candidates(GemmProblem(M=256, N=256, K=128, dtype="bf16"), MPS)
    assert {"aten.gemm", "metal.gemm", "metal.gemv"} <= {c.template_id for c in decode}
    assert "metal.gemv" not in {c.template_id for c in prefill} and "metal.gemm" in {c.template_id for c in prefill}


def test_rendered_kernels_describe_their_launch_in_json():
    r = render(softmax_problem(), {"num_warps": 4, "PERSISTENT": False})
    meta = {k: v for k, v in r.meta.items() if k != "shader"}
    assert json.loads(json.dumps(meta))["group_size"] == 128


# -- tilewright aot --target mps ------------------------------------------------------------------
class _Block(torch.nn.Module):
    """RMSNorm, a linear, SiLU and a softmax: GEMMs plus pointwise and reduction loop kernels."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(64)
        self.proj = torch.nn.Linear(64, 96)

    def forward(self, x):
        h = torch.nn.functional.silu(self.proj(self.norm(x)))
        return h.softmax(-1) * 2.0 + x.sum(-1, keepdim=True)


def test_aot_for_mps_writes_checked_shaders_and_a_manifest(tmp_path):
    from tilewright.compiler import aot

    torch.manual_seed(0)
    spec = ModelSpec(_Block(), (torch.randn(2, 8, 64),), name="block")
    report = aot.build(spec, ["mps"], tmp_path)
    assert report.ok and report.kernels
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    kinds = {k["kind"] for k in manifest["kernels"]}
    assert kinds == {"gemm", "pointwise", "reduction"} or kinds == {"gemm", "reduction"}
    for k in manifest["kernels"]:
        assert k["target"] == "mps" and k["template"].startswith("metal.") and k["status"] == "built"
        shader = (tmp_path / "kernels" / k["artifacts"]["metal"]).read_text()
        check_shader(shader)
        launch = k["metadata"]
        assert launch["group_size"] % 32 == 0 and launch["group_size"] <= 1024
        assert "compile_shader" in (tmp_path / "kernels" / k["artifacts"]["py"]).read_text()
    gemm = next(k for k in manifest["kernels"] if k["kind"] == "gemm")
    assert "simdgroup_multiply_accumulate" in (tmp_path / "kernels" / gemm["artifacts"]["metal"]).read_text()
    again = aot.build(spec, ["mps"], tmp_path)
    assert {k.result.status for k in again.kernels} == {"cached"}


# -- numerics: the shaders run on the host (tests/metal_host.py) against the float64 reference ----
def run_on_host(problem: LoopProblem, params: dict, tensors: list[torch.Tensor] | None = None, grid_cap: int | None = None):
    """The Metal kernel's outputs, through its own launcher, into NaN-poisoned buffers; and the
    float64 reference of the torch emitter."""
    from metal_host import host_launcher

    from tilewright.autotune.kinds import LoopInputs, make_loop_inputs, poisoned_loop_outputs
    from tilewright.compiler.kernel_factory import TemplateKernelFactory

    sizes = [problem.size_map[z] for z in problem.kernel.size_symbols()]
    x = LoopInputs(tensors, sizes) if tensors is not None else make_loop_inputs(problem, "cpu", seed=1)
    mod = host_launcher(render(problem, params), grid_cap=grid_cap)
    outs = poisoned_loop_outputs(problem, "cpu")
    got = mod.launch(*x.tensors, *x.sizes, outs=outs)
    assert all(g is o for g, o in zip(got, outs)), "the kernel must write the buffers it is handed"
    (threads,), (group,) = mod._library.calls[-1][0], mod._library.calls[-1][1]
    return got, TemplateKernelFactory().reference(problem, x), (threads, group)


def assert_matches(problem: LoopProblem, got, ref, what: str = "") -> None:
    from tilewright.autotune.kinds import LOOP_TOLERANCE, loop_error

    for b, o, r in zip(problem.kernel.outputs, got, ref):
        err = loop_error(o, r, b.dtype)
        assert err <= LOOP_TOLERANCE.get(b.dtype, 0.0), f"{problem.describe()} {what} {b.name}: error {err:.3g}"


def test_every_op_computes_torchs_meaning_on_the_host():
    for p in every_op_problems():
        # a grid of 50 threads walks the 120 elements in three grid-stride steps
        got, ref, (threads, group) = run_on_host(p, {"num_warps": 1}, every_op_inputs(), grid_cap=50)
        assert (threads, group) == (50, 32)
        assert_matches(p, got, ref)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "i64"])
def test_every_reduction_kind_matches_the_reference_persistent_and_looped(dtype):
    row = 24 if dtype == "i64" else 40  # an int64 product of 24 values in [-3, 4) does not wrap
    p = all_reductions(dtype, row)
    g = torch.Generator().manual_seed(5)
    x = (torch.randint(-3, 4, (5, row), generator=g) if dtype == "i64"
         else (torch.randn(5, row, generator=g) * 0.9 + 0.5).to(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype])))
    x[1, 7] = x[1, 3]  # a tie: argmax/argmin take the first position
    if dtype != "i64":
        x[2, 11] = float("nan")  # NaN wins max/min and argmax/argmin, as in torch
    for params in ({"num_warps": 2, "PERSISTENT": True}, {"num_warps": 1, "PERSISTENT": False}):
        got, ref, (threads, group) = run_on_host(p, params, [x])
        assert group == 32 * params["num_warps"] and threads == 5 * group  # one threadgroup per row
        assert_matches(p, got, ref, str(params))


def test_demo_llama_kernels_match_the_reference_on_the_host(demo_problems):
    for n, p in enumerate(p for p in demo_problems["llama_bf16_inference"] if isinstance(p, LoopProblem)):
        options = settings(p)
        params = options[n % len(options)]  # alternate persistent and looped rows across kernels
        got, ref, _ = run_on_host(p, params)
        assert_matches(p, got, ref, str(params))


def test_a_persistent_kernel_refuses_a_row_longer_than_its_threadgroup():
    # a dynamic row past the bucket the kernel was chosen for: the kernel would drop elements
    mod = launcher(render(softmax_problem(row=300), {"num_warps": 16, "PERSISTENT": True}))
    mod.require_metal_runtime = lambda: None
    mod._library = object()  # never reached
    with pytest.raises(ValueError, match="rows of at most 512 elements .* got 600: use the looped form"):
        mod.launch(torch.randn(4, 600).bfloat16(), 4, 600)


# -- the GEMM: simdgroup_matrix 8x8 tiles, the IR epilogue ------------------------------------------
GEMM = get_template("metal.gemm")


def gemm_problems():
    from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem

    return [
        # ragged in every dim; bias, SiLU and a scaled residual in the epilogue
        GemmProblem(M=37, N=70, K=45, dtype="fp32", op="addmm",
                    epilogue=(EpilogueOp("add", input=0), EpilogueOp("silu"), EpilogueOp("add", input=1, scale=0.5)),
                    epilogue_inputs=(EpilogueInput("N", "fp32"), EpilogueInput("MN", "fp32"))),
        # decode (M <= 8: 8-row tiles), B column-major, GELU (erf, from the shader's helper)
        GemmProblem(M=5, N=96, K=64, dtype="bf16", layout_b="col", epilogue=(EpilogueOp("gelu"),)),
        # batched, A column-major, fp16
        GemmProblem(M=20, N=24, K=33, dtype="fp16", batch=3, batched=True, layout_a="col"),
    ]


def test_metal_gemm_matches_the_reference_on_the_host():
    from metal_host import host_launcher

    from tilewright.autotune.inputs import make_inputs, poisoned_output, rel_error, tolerance
    from tilewright.compiler.kernel_factory import TemplateKernelFactory

    for p in gemm_problems():
        params = GEMM.seed_params(p, MPS)[0]
        assert GEMM.check(params, p, MPS) is None
        r = GEMM.render(p, params, MPS)
        shader = r.meta["shader"]
        check_shader(shader)
        assert "simdgroup_multiply_accumulate(acc[i], ta, tb, acc[i]);" in shader
        assert (p.M > 8) == (params["BLOCK_M"] > 8)  # decode takes the thin tiles
        mod = host_launcher(r)
        x = make_inputs(p, "cpu", seed=1)
        got = mod.launch(x.a, x.b, *x.epilogue_inputs, out=poisoned_output(p, "cpu"))
        (threads,), (group,) = mod._library.calls[-1]
        tiles = -(-p.M // params["BLOCK_M"]) * -(-p.N // params["BLOCK_N"]) * p.batch
        assert (threads, group) == (tiles * params["num_warps"] * 32, params["num_warps"] * 32)
        assert (threads, group) == (r.meta["threads"], r.meta["group_size"])
        err = rel_error(got, TemplateKernelFactory().reference(p, x))
        assert err <= tolerance(p), f"{p.describe_epilogue()} {params}: error {err:.3g}"


def test_the_gemv_path_matches_the_reference_for_decode_shapes():
    from metal_host import host_launcher

    from tilewright.autotune.inputs import make_inputs, poisoned_output, rel_error, tolerance
    from tilewright.compiler.kernel_factory import TemplateKernelFactory
    from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem

    gemv = get_template("metal.gemv")
    decode = [GemmProblem(M=5, N=70, K=100, dtype="bf16", layout_b="col",  # a Linear's weight.t()
                          epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu")),
                          epilogue_inputs=(EpilogueInput("N", "bf16"),)),
              GemmProblem(M=1, N=33, K=17, dtype="fp32"),
              GemmProblem(M=8, N=9, K=64, dtype="fp16", batch=2, batched=True)]
    settings_ = gemv.seed_params(decode[0], MPS)  # 4, 8 and 2 simdgroups: one each
    assert len(settings_) == len(decode)
    for p, params in zip(decode, settings_):
        r = gemv.render(p, params, MPS)
        shader = r.meta["shader"]
        check_shader(shader)
        assert "simd_sum(sums[r])" in shader and "simdgroup_matrix" not in shader
        mod = host_launcher(r)
        x = make_inputs(p, "cpu", seed=1)
        got = mod.launch(x.a, x.b, *x.epilogue_inputs, out=poisoned_output(p, "cpu"))
        (threads,), (group,) = mod._library.calls[-1]
        assert group == 32 * params["num_warps"] and threads == -(-p.N // params["BLOCK_N"]) * p.batch * group
        err = rel_error(got, TemplateKernelFactory().reference(p, x))
        assert err <= tolerance(p), f"{p.M}x{p.N}x{p.K}: error {err:.3g}"
    assert "M <= 8" in gemv.supports(GemmProblem(M=9, N=8, K=8, dtype="fp32"), MPS).reason
    # a dynamic M beyond 8 at run time: the launcher refuses rather than drop rows
    mod = launcher(gemv.render(decode[1], gemv.seed_params(decode[1], MPS)[0], MPS))
    mod.require_metal_runtime, mod._library = (lambda: None), object()
    with pytest.raises(ValueError, match="at most 8 rows, got M=9"):
        mod.launch(torch.randn(9, 17), torch.randn(17, 33))


def test_every_gemm_of_the_demo_models_passes_the_check_or_is_refused_with_a_reason(demo_problems):
    from tilewright.problem import GemmProblem

    built = 0
    for model in ("llama_bf16_inference", "llama_fp32_training"):
        for p in (p for p in demo_problems[model] if isinstance(p, GemmProblem)):
            support = GEMM.supports(p, MPS)
            if not support:
                assert p.store_acc and "store_acc" in support.reason
                continue
            params = [q for q in GEMM.seed_params(p, MPS) if GEMM.check(q, p, MPS) is None]
            check_shader(GEMM.render(p, params[0], MPS).meta["shader"])
            built += 1
    assert built >= 20


def test_the_gemm_refuses_what_it_cannot_run():
    from tilewright.problem import GemmProblem

    assert "mps target only" in GEMM.supports(gemm_problems()[0], get_target("sm_90a")).reason
    assert "fp32, fp16 and bf16" in GEMM.supports(GemmProblem(M=8, N=8, K=8, dtype="fp8e4m3"), MPS).reason
    stored = GemmProblem(M=8, N=8, K=8, dtype="bf16", store_acc=True)
    assert "store_acc" in GEMM.supports(stored, MPS).reason
    assert "do not split" in GEMM.check({"BLOCK_M": 8, "BLOCK_N": 8, "num_warps": 2}, gemm_problems()[0], MPS)


# -- policies respect the threadgroup limits (32 KiB of threadgroup memory, 1024 threads) ----------
_TG_BYTES = {"float": 4, "int": 4, "uint": 4, "long": 8, "ulong": 8, "half": 2, "bfloat": 2,
             "short": 2, "ushort": 2, "char": 1, "uchar": 1, "bool": 1}


def declared_threadgroup_bytes(shader: str) -> int:
    """Bytes of the ``threadgroup T name[N];`` arrays a shader declares, read off its text (so
    the template's own count, ``meta["threadgroup_bytes"]``, is checked against the shader)."""
    import re

    return sum(_TG_BYTES[t] * int(n) for t, n in re.findall(r"threadgroup (\w+) \w+\[(\d+)\];", shader))


def test_metal_limits_are_the_targets_and_an_oversized_tile_is_refused_with_the_reason():
    import dataclasses

    from tilewright.problem import GemmProblem

    assert (MPS.smem_per_block, MPS.max_threads_per_block) == (32 * 1024, 1024)
    p = GemmProblem(M=256, N=256, K=256, dtype="fp32")
    biggest = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 8}  # exactly 32 KiB: fits
    assert GEMM.check(biggest, p, MPS) is None
    r = GEMM.render(p, biggest, MPS)
    assert r.meta["threadgroup_bytes"] == declared_threadgroup_bytes(r.meta["shader"]) == 32 * 1024
    # a part with half the threadgroup memory and threads (the limits come from the target)
    small = dataclasses.replace(MPS, name="mps-small", smem_per_block=16 * 1024, max_threads_per_block=512)
    why = GEMM.check(biggest, p, small)
    assert why == ("32768 bytes of threadgroup memory, over the 16384 a threadgroup may use on mps-small: "
                   "smaller BLOCK_M, BLOCK_N or BLOCK_K")
    with pytest.raises(UnsupportedProblemError, match="over the 16384 a threadgroup may use"):
        GEMM.render(p, biggest, small)
    row = row_reduction("sum", row=1000)
    assert REDUCTION.check({"num_warps": 32, "PERSISTENT": True}, row, MPS) is None
    assert REDUCTION.check({"num_warps": 32, "PERSISTENT": True}, row, small) == (
        "1024 threads per threadgroup, over the 512 mps-small allows: lower num_warps")
    assert "over the 512" in POINTWISE.check({"num_warps": 32}, every_op_problems()[0], small)
    tiny = dataclasses.replace(small, max_threads_per_block=256)
    assert "512 threads per threadgroup, over the 256" in get_template("metal.gemv").check(
        {"BLOCK_N": 16, "num_warps": 16}, GemmProblem(M=4, N=64, K=64, dtype="fp32"), tiny)
    # and the policies propose only what fits the smaller part
    from tilewright.autotune.policy import policy_for

    tiles = policy_for("gemm", small).tile_params(p, GEMM, small)
    assert tiles and all(4 * (t["BLOCK_M"] * t["BLOCK_K"] + t["BLOCK_K"] * t["BLOCK_N"] + t["BLOCK_M"] * t["BLOCK_N"])
                         <= 16 * 1024 for t in tiles)
    assert all(q["num_warps"] * 32 <= 512 for q in REDUCTION.seed_params(row, small))


def test_every_metal_candidate_the_policies_propose_for_the_demo_fits_the_threadgroup_limits(demo_problems):
    from tilewright._config import config
    from tilewright.autotune.loop_policy import LoopPolicy
    from tilewright.autotune.policy import policy_for
    from tilewright.problem import GemmProblem

    seen = 0
    with config.patch(force_backend="auto"):
        for problems in demo_problems.values():
            for p in problems:
                if isinstance(p, GemmProblem):
                    cands = policy_for("gemm", MPS).candidates(p, MPS)
                else:
                    cands = LoopPolicy(p.kind).candidates(p, MPS)
                for c in (c for c in cands if c.template_id.startswith("metal.")):
                    t = get_template(c.template_id)
                    assert t.check(c.param_dict, p, MPS) is None
                    r = t.render(p, c.param_dict, MPS)
                    group, tg_bytes = r.meta["group_size"], r.meta["threadgroup_bytes"]
                    assert group % 32 == 0 and group <= MPS.max_threads_per_block, (c.name, group)
                    assert tg_bytes == declared_threadgroup_bytes(r.meta["shader"]), c.name
                    assert tg_bytes <= MPS.smem_per_block, (c.name, tg_bytes)
                    seen += 1
    assert seen >= 100
