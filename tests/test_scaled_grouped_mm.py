"""PyTorch's block-scaled ``F.scaled_grouped_mm`` / ``torch._scaled_grouped_mm`` (MoE experts in
MXFP8, MXFP4, NVFP4) lowered to tilewright's Triton grouped GEMM that dequantises in its
prologue, the activation fused: checked on the CPU (interpreter) against a float64 dequantised
reference with ragged groups (an empty one included) and NaN-poisoned outputs; torch's per-group
swizzled scale layout decoded; calls that do not fit stay ATen's with a reason; the fake-tensor
capture (torch has no Meta kernel for ``_scaled_grouped_mm_v2``) and AOT builds for sm_90a and
sm_100a."""

from __future__ import annotations

import pytest
import torch
from conftest import rel_err

import tilewright
from tilewright.compiler.capture import ModelSpec, aten_graphs
from tilewright.demo.scaled_grouped import moe_example
from tilewright.errors import InvalidInputError
from tilewright.autotune.kinds import problem_from_json
from tilewright.compiler.report import collect_reports
from tilewright.kernels import scaled_grouped
from tilewright.kinds.grouped_gemm import checks
from tilewright.kinds.grouped_gemm.lower_scaled import OP, rewrite_all
from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.problem import EpilogueInput, EpilogueOp
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import triton_version
from tilewright.templates import get_template
from tilewright.quant import mx, nvfp4
from tilewright.quant.nvfp4 import swizzle_scales
from tilewright.quant.scales import swizzled_numel, unswizzle_groups, unswizzle_stacked

BF16_TOL = 1e-2  # a bf16 output: ~2^-9 of rounding
FP32_TOL = 1e-6  # fp32 output: the exact dequantised products, summed in fp32


def test_per_group_swizzled_scales_decode_to_rows():
    """Each group's scales swizzled on their own (torch's layout for the token operand), an empty
    group and groups that are not multiples of 128 rows; rows past offs[-1] are ignored."""
    g = torch.Generator().manual_seed(0)
    sizes, cols = [37, 0, 130, 5], 3
    rows = torch.randint(0, 256, (sum(sizes) + 4, cols), generator=g, dtype=torch.uint8)
    ends = torch.tensor(sizes).cumsum(0)
    blocks = [swizzle_scales(rows[e - s:e]) for s, e in zip(sizes, ends.tolist()) if s]
    flat = torch.cat(blocks)
    assert flat.numel() == sum(swizzled_numel(s, cols) for s in sizes if s)
    got = unswizzle_groups(flat, ends.to(torch.int32), rows.shape[0], cols)
    assert torch.equal(got[:sum(sizes)], rows[:sum(sizes)])
    with pytest.raises(InvalidInputError, match="128-row tiles"):
        unswizzle_groups(flat[:-1], ends.to(torch.int32), rows.shape[0], cols)


def test_stacked_swizzled_scales_decode_per_expert():
    g = torch.Generator().manual_seed(1)
    want = torch.randint(0, 256, (3, 70, 5), generator=g, dtype=torch.uint8)
    flat = torch.stack([swizzle_scales(w) for w in want])
    assert torch.equal(unswizzle_stacked(flat, 3, 70, 5), want)
    with pytest.raises(InvalidInputError, match="need"):
        unswizzle_stacked(flat[:2], 3, 70, 5)


def _operands(fmt: str, sizes, N: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    G, M = len(sizes), sum(sizes)
    x, w = torch.randn(M, K, generator=g) * 3, torch.randn(G, N, K, generator=g)
    if fmt == "nvfp4":
        qa, qb = nvfp4.quantize(x, torch.ones(())), [nvfp4.quantize(w[i], torch.ones(())) for i in range(G)]
        ga, gb = torch.rand(G, generator=g) + 0.5, torch.rand(G, generator=g) + 0.5
    else:
        qa, qb, ga, gb = mx.quantize(x, fmt), [mx.quantize(w[i], fmt) for i in range(G)], None, None
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    return (qa.data, qa.scale, torch.stack([q.data for q in qb]), torch.stack([q.scale for q in qb]), offs, ga, gb)


SCALED = ("triton.grouped_gemm_scaled", "triton.grouped_gemm_scaled_mma")  # the tuner may pick either


def _problem(fmt, G, M, N, K, *, activation="none", out_dtype="fp32", glu="", bias=False):
    """A block-scaled grouped problem as the compiler builds it (the recipe as its dtype)."""
    ops = ((EpilogueOp("add", input=0),) if bias else ()) + ((EpilogueOp(activation),) if activation != "none" else ())
    return GroupedGemmProblem("2d3d", G, M, N, K, fmt, out_dtype=out_dtype, layout_b="col", epilogue=ops,
                              epilogue_inputs=(EpilogueInput("BN", "fp32"),) if bias else (), glu=glu,
                              global_scales=fmt == "nvfp4", op="scaled_grouped_mm")


@pytest.mark.parametrize("template_id,fmt,activation,out_dtype,glu,bias", [
    ("triton.grouped_gemm_scaled", "mxfp8", "silu", "fp32", "", False),
    ("triton.grouped_gemm_scaled", "mxfp4", "none", "fp32", "", True),
    ("triton.grouped_gemm_scaled", "nvfp4", "gelu", "fp32", "", False),
    ("triton.grouped_gemm_scaled", "mxfp8", "none", "bf16", "", False),
    ("triton.grouped_gemm_scaled", "nvfp4", "relu", "fp32", "gelu", False),
    ("triton.grouped_gemm_scaled_mma", "mxfp8", "silu", "fp32", "silu", True),
    ("triton.grouped_gemm_scaled_mma", "mxfp4", "none", "fp32", "", False),
    ("aten.grouped_gemm", "nvfp4", "silu", "fp32", "silu", False),
])
def test_the_templates_match_float64_on_ragged_groups(cpu, template_id, fmt, activation, out_dtype, glu, bias):
    """Fresh random packed operands and scales; groups of 20, 0 (empty), 37 and 7 tokens (none a
    multiple of the tile), K = 96 (a partial K step; MXFP4 128), N = 40 (a partial tile), a
    per-group bias read at each row's group; the output poisoned with NaN: every grouped row is
    written, the 5 rows past offs[-1] are not (by the Triton kernels). ``tl.dot_scaled`` runs in
    the interpreter for MX (exact with E8M0 scales); NVFP4's E4M3 scales it would misread."""
    p = _problem(fmt, 4, 69, 40, 128 if fmt == "mxfp4" else 96, activation=activation, out_dtype=out_dtype,
                 glu=glu, bias=bias)
    template = get_template(template_id)
    if template_id.endswith("_mma") and triton_version() < (3, 9):
        assert not template.supports(p, cpu)  # triton 3.6's interpreter fails in tl.dot_scaled
        pytest.skip("the Triton interpreter runs tl.dot_scaled from triton 3.9")
    assert template.supports(p, cpu), template.supports(p, cpu).reason
    params = (template.seed_params(p, cpu) or [{}])[0]
    r = template.render(p, params, cpu)
    launch = load_module(r.source, name=r.name, interpret=r.interpret).launch
    x = checks.make_inputs(p, "cpu", seed=7, offs=torch.tensor([20, 20, 57, 64], dtype=torch.int32))
    out = checks.run(launch, x, checks.poisoned_output(p, "cpu"))
    ref = checks.reference(p, x)
    rows = 64
    assert not out[:rows].isnan().any()
    if template_id != "aten.grouped_gemm":
        assert out[rows:].isnan().all()
    tol = FP32_TOL if out_dtype == "fp32" else BF16_TOL
    assert rel_err(out[:rows], ref[:rows]) < tol, rel_err(out[:rows], ref[:rows])


def test_the_reference_is_the_dequantised_product(cpu):
    """The kind's float64 reference (what every candidate is checked against) equals the
    hand-written dequantise-and-loop reference of the op, alpha and gated product included."""
    p = _problem("nvfp4", 3, 40, 32, 64, activation="relu", glu="silu")
    x = checks.make_inputs(p, "cpu", seed=3, offs=torch.tensor([9, 9, 40], dtype=torch.int32))
    ref = checks.reference(p, x)
    want = scaled_grouped.reference(x.a, x.scales[0], x.b, x.scales[1], x.offs, *x.scales[2:], fmt="nvfp4",
                                    activation="relu", glu="silu")
    assert rel_err(ref, want) < 1e-12


def test_the_policy_offers_tiles_of_both_templates_and_aten():
    """sm_100a: the block-scaled MMA's 128-row tiles and the dequantising template's, ATen's
    prediction beside them; sm_90a (no block-scaled MMA): the dequantising one only."""
    from tilewright.kinds.grouped_gemm.policy import GroupedGemmPolicy
    from tilewright.runtime.targets import get_target

    p = _problem("mxfp8", 8, 2048, 512, 1024, activation="silu", out_dtype="bf16")
    policy, sm100 = GroupedGemmPolicy(), get_target("sm_100a")
    mma = policy.ranked(p, sm100, get_template("triton.grouped_gemm_scaled_mma"))
    deq = policy.ranked(p, sm100, get_template("triton.grouped_gemm_scaled"))
    assert len(mma) >= 2 and len(deq) >= 2 and all(params["BLOCK_M"] == 128 for _, params in mma)
    assert len({tuple(sorted(q.items())) for _, q in deq}) == len(deq)
    assert policy.aten_ms(p, sm100) > 0
    assert not get_template("triton.grouped_gemm_scaled_mma").supports(p, get_target("sm_90a"))
    assert policy.ranked(p, get_target("sm_90a"), get_template("triton.grouped_gemm_scaled"))


def test_the_tuner_measures_both_triton_templates_and_checks_them(cpu, fresh_cache):
    """Triton forced on the CPU: the grouped policy's candidates for an MXFP8 problem are both
    block-scaled templates (the interpreter times one tile of each), each checked against the
    float64 reference on the kind's random operands before one wins."""
    from tilewright.autotune.select import select
    from tilewright.compiler.kernel_factory import default_factory

    p = _problem("mxfp8", 4, 64, 32, 64, activation="silu", out_dtype="bf16")
    with tilewright.config.patch(force_backend="triton"):
        sel = select(p, cpu, default_factory)
    tried = {r.candidate.template_id for r in sel.results}
    # triton 3.6's interpreter cannot run tl.dot_scaled: the MMA template refuses there
    want = set(SCALED) if triton_version() >= (3, 9) else {"triton.grouped_gemm_scaled"}
    assert tried == want and sel.winner.template_id in want, (tried, sel.reason)
    assert all(r.record.status == "ok" and r.record.rel_err < 1e-2 for r in sel.results), [r.record for r in sel.results]


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_the_op_runs_its_tuned_kernel(fmt, fresh_cache):
    """``tilewright.scaled_grouped_mm`` called eagerly (what a call the compiler cannot make a
    kernel node runs): the problem built from the call, ATen's candidate on the CPU, float64."""
    a, sa, b, sb, offs, ga, gb = _operands(fmt, [13, 0, 30], N=32, K=64)
    out = scaled_grouped.scaled_grouped_mm(a, sa, b, sb, offs, ga, gb, fmt=fmt, out_dtype=torch.float32,
                                           activation="gelu")
    ref = scaled_grouped.reference(a, sa, b, sb, offs, ga, gb, fmt=fmt, activation="gelu")
    assert rel_err(out, ref) < FP32_TOL, rel_err(out, ref)


def test_bad_operands_are_refused_with_the_fix():
    a, sa, b, sb, offs, *_ = _operands("mxfp8", [8, 8], N=16, K=64)
    with pytest.raises(InvalidInputError, match="int32 end offsets"):
        scaled_grouped.scaled_grouped_mm(a, sa, b, sb, offs.long(), fmt="mxfp8")
    with pytest.raises(InvalidInputError, match="row-major scales"):
        scaled_grouped.scaled_grouped_mm(a, sa[:, :1], b, sb, offs, fmt="mxfp8")
    with pytest.raises(InvalidInputError, match="contiguous along K"):
        scaled_grouped.scaled_grouped_mm(a, sa, b.transpose(1, 2).contiguous().transpose(1, 2), sb, offs, fmt="mxfp8")


def _wrapper_calls(tmp_path) -> list[str]:
    (wrapper,) = list(tmp_path.glob("run_*/*/wrapper.py"))
    return [ln.split("=", 1)[1].strip().split("(")[0] for ln in wrapper.read_text().splitlines()
            if "=" in ln and ln.startswith("    ") and not ln.strip().startswith(("#", "("))]


def _compiled(model, args, tmp_path):
    """``model`` compiled with Triton forced (the interpreter on the CPU); (output, the one
    grouped kernel's (problem, winning template)), the wrapper's only GEMM call being it."""
    with torch.no_grad(), tilewright.config.patch(debug_dir=str(tmp_path), force_backend="triton"), \
            collect_reports() as reports:
        out = torch.compile(model, backend="tilewright")(*args)
    found = [(problem_from_json(k.problem_json), k.winner.split("[")[0])
             for r in reports for k in r.kernels if k.kind == "grouped_gemm"]
    assert len(found) == 1, found
    calls = _wrapper_calls(tmp_path)
    assert sum(c.startswith("grouped_gemm_") for c in calls) == 1, calls
    return out, found[0], calls


@pytest.mark.slow
@pytest.mark.parametrize("recipe,swizzled", [("mxfp8", True), ("mxfp4", True), ("nvfp4_global", True),
                                             ("mxfp8", False)])
def test_compiled_moe_is_one_grouped_kernel_with_the_activation(tmp_path, recipe, swizzled):
    """``silu(F.scaled_grouped_mm(...))``, which eager torch cannot run on a CPU, compiled: the
    scales decoded, one block-scaled grouped GEMM with the silu fused, against float64."""
    torch._dynamo.reset()
    model, args = moe_example(recipe, swizzled=swizzled)
    with pytest.raises((NotImplementedError, RuntimeError)):
        model(*args)
    out, (problem, winner), calls = _compiled(model, args, tmp_path)
    ref = model.reference(*args)
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) < BF16_TOL, rel_err(out, ref)
    assert winner in SCALED and problem.dtype == recipe.split("_")[0], (winner, problem.describe())
    assert problem.epilogue == (EpilogueOp("silu"),) and problem.global_scales == (recipe == "nvfp4_global")
    assert not [c for c in calls if "silu" in c.lower()], calls


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4_global"])
def test_gate_up_projection_fuses_its_gated_product(tmp_path, recipe):
    """The MoE expert MLP's ``silu(gate) * up`` after the block-scaled gate_up call: one
    kernel writes the (M_total, N/2) product (no split, silu or mul left), against float64."""
    torch._dynamo.reset()
    model, args = moe_example(recipe, sizes=(9, 0, 23), glu=True)
    out, (problem, winner), calls = _compiled(model, args, tmp_path)
    ref = model.reference(*args)
    assert out.shape == (32, 32) and rel_err(out, ref) < BF16_TOL, rel_err(out, ref)
    assert winner in SCALED and problem.glu == "silu", (winner, problem.describe())
    assert not [c for c in calls if any(w in c.lower() for w in ("silu", "mul", "split", "slice"))], calls


def test_v1_mxfp8_call_lowers_too():
    """``torch._scaled_grouped_mm`` with E8M0 scales (MXFP8; swizzled, as CUDA's torch infers)."""
    model, (x, offs, sa) = moe_example("mxfp8")
    w, ws = model.w, model.w_scale

    def f(x, offs, sa):
        return torch._scaled_grouped_mm(x, w.transpose(-2, -1), sa.reshape(-1, 4), ws, offs=offs,
                                        out_dtype=torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(f, backend="tilewright")(x, offs, sa)
    rows = int(offs[-1])
    want = model.reference(x, offs, sa)[:rows]  # silu of the product: compare the same
    assert rel_err(torch.nn.functional.silu(out[:rows].double()), want) < BF16_TOL


@pytest.mark.slow
def test_token_counts_that_vary_at_run_time():
    """``dynamic=True``: one compiled graph for two token splits of different totals (the A
    scales' length follows them)."""
    torch._dynamo.reset()
    model, _ = moe_example("mxfp8")
    f = torch.compile(model, backend="tilewright", dynamic=True)
    for sizes in [(20, 0, 37, 7), (5, 40, 0, 90)]:
        _, args = moe_example("mxfp8", sizes=sizes)
        with torch.no_grad():
            out = f(*args)
        ref = model.reference(*args)
        assert out.shape == (sum(sizes), 64) and rel_err(out, ref) < BF16_TOL, (sizes, rel_err(out, ref))


@pytest.mark.parametrize("change,reason", [
    (lambda a: a.__setitem__(6, [2]), "different recipes"),
    (lambda a: a.__setitem__(11, [0, 1]), "contraction_dim"),
    (lambda a: a.__setitem__(4, [7]), "swizzle type 7"),
])
def test_calls_that_do_not_fit_stay_aten_with_a_reason(change, reason):
    model, args = moe_example("mxfp8")
    (gm,) = aten_graphs(ModelSpec(model, args)).values()
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten._scaled_grouped_mm_v2.default]
    new = list(node.args) + [None] * (12 - len(node.args))
    new[11] = new[11] or []
    change(new)
    node.args = tuple(new)
    before = len(gm.graph.nodes)
    assert rewrite_all(gm) == 0 and len(gm.graph.nodes) == before
    assert reason in node.meta["tilewright_aten_reason"], node.meta["tilewright_aten_reason"]


def test_fake_tensors_trace_f_scaled_grouped_mm():
    """Torch 2.11/2.13 register no Meta kernel for ``_scaled_grouped_mm_v2``: fake tracing ran it
    on the CPU and failed, so no backend ever saw the call. tilewright registers one: the graph
    holds the call with its (M_total, N) bf16 value, and lowering retargets it."""
    model, args = moe_example("mxfp8", sizes=(8, 0, 9))
    (gm,) = aten_graphs(ModelSpec(model, args)).values()
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten._scaled_grouped_mm_v2.default]
    val = node.meta["val"]
    assert tuple(val.shape) == (17, 64) and val.dtype == torch.bfloat16
    assert rewrite_all(gm) == 2  # retargeted, then the silu folded into it
    (op,) = [n for n in gm.graph.nodes if n.target is OP]
    assert op.args[7:] == ("mxfp8", torch.bfloat16, "silu", "none")


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4", "nvfp4_global"])
def test_aot_capture_plans_the_block_scaled_templates(recipe):
    """``tilewright aot``'s capture (fake tensors: eager torch cannot run the model here) holds the
    call as one block-scaled grouped problem, and the plan builds the block-scaled MMA template
    for sm_100a (and gfx950 for MX, whose scaled MFMA takes E8M0 scales) with its scaled MMA
    instruction promised, the dequantising template for every target, sm_90a included."""
    from tilewright.compiler import aot
    from tilewright.compiler.capture import capture_kernels
    from tilewright.runtime.targets import get_target

    model, args = moe_example(recipe, glu=recipe == "nvfp4_global")
    (problem,) = [c.problem for c in capture_kernels(ModelSpec(model, args)) if isinstance(c.problem, GroupedGemmProblem)]
    assert (problem.dtype, problem.case, problem.layout_b) == (recipe.split("_")[0], "2d3d", "col")
    assert problem.global_scales == (recipe == "nvfp4_global") and problem.dynamic == frozenset({"M"})
    captured = [c for c in capture_kernels(ModelSpec(model, args)) if c.problem == problem]
    targets = [get_target(n) for n in ("sm_100a", "gfx950", "sm_90a")]
    kernels, refused = aot.plan(captured, targets)
    built = {(k.target.name, k.template.id) for k in kernels}
    for t in targets:
        assert (t.name, "triton.grouped_gemm_scaled") in built, t.name
    # NVFP4 (and, here, its gated product) on sm_100a's block-scaled MMA needs triton >= 3.9
    mma_targets = ({"sm_100a"} if recipe != "nvfp4_global" or triton_version() >= (3, 9) else set()) | \
        ({"gfx950"} if recipe != "nvfp4_global" else set())
    assert {t.split(":")[-1] for t, tid in built if tid == "triton.grouped_gemm_scaled_mma"} == mma_targets
    for k in kernels:
        if k.template.id == "triton.grouped_gemm_scaled_mma":
            (check,) = k.template.expected_instructions(problem, k.params, k.target)
            assert "block_scale" in check.require[0] or "v_mfma_scale" in check.require[0], check
            assert k.job.spec["pointer_types"]["OFFS"] == "*i32"
    assert any(r["target"] == targets[2].name and r["template"] == "triton.grouped_gemm_scaled_mma" for r in refused)


@pytest.mark.slow
def test_aot_builds_the_scaled_mma_for_sm100a_and_gfx950(tmp_path):
    """``tilewright aot``'s build of the MXFP8 MoE model for sm_100a, gfx950 and sm_90a on this CPU host:
    the manifest lists the block-scaled grouped kernels, each built and its instruction check
    passed (``tcgen05.mma ... block_scale``, ``v_mfma_scale_f32_*_f8f6f4``), beside the
    dequantising template's bf16 MMA."""
    import json

    from tilewright.compiler import aot

    report = aot.build("tilewright.demo.scaled_grouped:mxfp8_moe_example", ["sm_100a", "gfx950", "sm_90a"], tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    grouped = [k for k in manifest["kernels"] if k["kind"] == "grouped_gemm"]
    assert report.ok, [(k.name, k.verify_failures, k.result and k.result.error[-400:]) for k in report.kernels]
    mma = {k["target"].split(":")[-1]: k for k in grouped if k["template"] == "triton.grouped_gemm_scaled_mma"}
    assert set(mma) == {"sm_100a", "gfx950"}, [(k["target"], k["template"]) for k in grouped]
    assert {k["target"].split(":")[-1] for k in grouped if k["template"] == "triton.grouped_gemm_scaled"} == \
        {"sm_100a", "gfx950", "sm_90a"}  # sm_90a has no block-scaled MMA: the dequantising one alone
    for k in grouped:
        assert k["verify"]["ok"] and all(n > 0 for n in k["verify"]["counts"].values()), k["verify"]
    assert any("block_scale" in pat for pat in mma["sm_100a"]["verify"]["counts"])
    assert any("v_mfma_scale" in pat for pat in mma["gfx950"]["verify"]["counts"])


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4_global"])
def test_scaled_grouped_mm_compiled_on_the_gpu(recipe):
    """On the device (eager torch needs sm_100 and FBGEMM for these; tilewright's dequantising
    kernel runs on any Triton GPU): ragged groups with an empty one, against float64."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch._dynamo.reset()
    model, args = moe_example(recipe, sizes=(200, 0, 77, 300), N=192, K=256)
    ref = model.reference(*args)
    with torch.no_grad():
        out = torch.compile(model.cuda(), backend="tilewright")(*[a.cuda() for a in args])
    assert out.is_cuda and rel_err(out.cpu(), ref) < BF16_TOL, rel_err(out.cpu(), ref)


def test_a_gpu_without_e4m3_conversions_falls_back_to_aten():
    """sm_80: Triton cannot convert e4m3 values or scales there; the Triton templates say so and
    the policy leaves ATen's (dequantised with torch), never a compile failure or an error."""
    from tilewright.kinds.grouped_gemm.policy import GroupedGemmPolicy
    from tilewright.runtime.targets import get_target

    p, sm80 = _problem("mxfp8", 4, 256, 64, 128), get_target("sm_80")
    for tid in SCALED:
        why = get_template(tid).supports(p, sm80)
        assert not why and "sm_89 or later" in why.reason, why
    assert get_template("aten.grouped_gemm").supports(p, sm80)
    assert GroupedGemmPolicy().aten_ms(p, sm80) > 0
