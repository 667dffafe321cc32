"""CuTeDSL templates on a machine without a GPU: they register without the DSL, refuse with
reasons, follow the PDL setting, render PDL calls exactly when asked, and (with
nvidia-cutlass-dsl installed) compile ahead of time for sm_90a/sm_100a in the AOT workers into
PTX that uses wgmma / tcgen05 (block-scaled where promised), TMA and griddepcontrol exactly as
promised; the launcher's arguments match the compiled host function."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import tilewright
from tilewright.autotune.policy import policy_for
from tilewright.autotune.select import filter_forced
from tilewright.compiler import aot
from tilewright.compiler.capture import CapturedKernel, ModelSpec
from tilewright.errors import InvalidInputError, UnsupportedProblemError
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.quant.nvfp4 import quantize, swizzle_scales
from tilewright.runtime import cutedsl as dsl_runtime
from tilewright.runtime.aot import CompileJob, compile_jobs
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.runtime.verify import verify
from tilewright.templates import get_template, templates_for

SM90, SM100 = get_target("cuda:sm_90a"), get_target("cuda:sm_100a")
GEMM90, GEMM100 = get_template("cutedsl.gemm_sm90"), get_template("cutedsl.gemm_sm100")
BLOCKSCALED = get_template("cutedsl.blockscaled_sm100")

# bias, then a residual at half weight, then SiLU: an epilogue every dense test carries
BF16 = GemmProblem(M=300, N=512, K=384, dtype="bf16", layout_b="col",
                   epilogue=(EpilogueOp("add", input=0), EpilogueOp("add", input=1, scale=0.5),
                             EpilogueOp("silu")),
                   epilogue_inputs=(EpilogueInput("N", "bf16"), EpilogueInput("MN", "bf16")))
FP8 = GemmProblem(M=256, N=512, K=512, dtype="fp8e4m3", out_dtype="bf16", layout_b="col",
                  epilogue=(EpilogueOp("mul", input=0), EpilogueOp("mul", input=1)),
                  epilogue_inputs=(EpilogueInput("M", "fp32"), EpilogueInput("N", "fp32")))


def nvfp4_problem(**kw) -> GemmProblem:
    """An NVFP4 linear as the lowering produces it: the two global decode scales (alpha) as
    multiplies by 0-dim tensors, then a bias."""
    args = dict(M=200, N=384, K=512, dtype="nvfp4", layout_b="col", scale_layout="swizzled",
                epilogue=(EpilogueOp("mul", input=0), EpilogueOp("mul", input=1), EpilogueOp("add", input=2)),
                epilogue_inputs=(EpilogueInput("", "fp32"), EpilogueInput("", "fp32"), EpilogueInput("N", "bf16")))
    args.update(kw)
    return GemmProblem(**args)


def params_for(template, problem, target, **overrides) -> dict:
    """The template's first seed that is legal with ``overrides`` applied (its pipeline made
    shallower when the overrides need more shared memory)."""
    with tilewright.config.patch(pdl="auto"):
        for seed in template.seed_params(problem, target):
            params = {**seed, **overrides}
            while template.check(params, problem, target) and params["num_stages"] > 2:
                params["num_stages"] -= 1
            if template.check(params, problem, target) is None:
                return params
    raise AssertionError(f"no legal {template.id} setting with {overrides}")


@pytest.fixture
def dsl():
    """Tests that compile need nvidia-cutlass-dsl (make test installs it: the cutedsl extra)."""
    return pytest.importorskip("cutlass")


# -- registration, refusals, parameters ------------------------------------------------------------
def test_registered_for_cuda_and_refusing_without_the_dsl(monkeypatch):
    ids = {t.id for t in templates_for("gemm", "cuda")}
    assert {"cutedsl.gemm_sm90", "cutedsl.gemm_sm100", "cutedsl.blockscaled_sm100"} <= ids
    assert not any(t.backend == "cutedsl" for t in templates_for("gemm", "hip"))
    monkeypatch.setattr(dsl_runtime, "available", lambda: False)
    support = GEMM90.supports(BF16, SM90)
    assert not support and support.reason == "nvidia-cutlass-dsl is not installed"
    # rendering needs only jinja
    source = GEMM90.render(BF16, params_for(GEMM90, BF16, SM90), SM90).source
    assert "def compile_aot(arch, dump_dir):" in source and "def launch(" in source


def test_refusals_name_the_reason(monkeypatch):
    monkeypatch.setattr(dsl_runtime, "available", lambda: True)
    cases = [
        (GEMM90, BF16, SM100, "generates for sm_90a"),
        (GEMM100, BF16, SM90, "generates for sm_100a"),
        (GEMM90, GemmProblem(M=64, N=64, K=64, dtype="fp32"), SM90, "input dtype fp32"),
        (GEMM90, GemmProblem(M=64, N=64, K=64, dtype="fp8e4m3", layout_b="row"), SM90, "K-major"),
        (GEMM100, GemmProblem(M=64, N=64, K=68, dtype="bf16"), SM100, "16-byte multiples"),
        (GEMM100, GemmProblem(M=64, N=64, K=64, dtype="bf16", layout_a="strided"), SM100, "strided"),
        (GEMM100, GemmProblem(M=64, N=64, K=64, dtype="bf16", batch=2, batched=True), SM100, "batched"),
        (GEMM100, GemmProblem(M=64, N=64, K=0, dtype="bf16"), SM100, "K == 0"),
        (GEMM100, GemmProblem(M=64, N=64, K=64, dtype="bf16", out_dtype="fp8e4m3"), SM100, "output dtype"),
        (BLOCKSCALED, BF16, SM100, "block-scaled"),
        (BLOCKSCALED, nvfp4_problem(layout_b="row"), SM100, "K-major"),
        (BLOCKSCALED, nvfp4_problem(), SM90, "generates for sm_100a"),
    ]
    for template, problem, target, reason in cases:
        support = template.supports(problem, target)
        assert not support and reason in support.reason, (template.id, problem.describe(), support.reason)
    with pytest.raises(UnsupportedProblemError, match="generates for sm_90a"):
        GEMM90.render(BF16, GEMM90.space.default(), SM100)
    params = params_for(GEMM100, BF16, SM100)
    assert "shared memory" in GEMM100.check({**params, "BLOCK_N": 256, "num_stages": 8}, BF16, SM100)
    assert "128 bytes" in GEMM100.check({**params, "BLOCK_K": 128}, BF16, SM100)
    assert "consumer warp groups" in GEMM90.check({**params_for(GEMM90, BF16, SM90), "BLOCK_M": 64,
                                                   "num_warps": 12}, BF16, SM90)
    assert "BLOCK_N=16 is not one of" in BLOCKSCALED.check(
        {**params_for(BLOCKSCALED, nvfp4_problem(), SM100), "BLOCK_N": 16}, nvfp4_problem(), SM100)


def test_pdl_setting_picks_the_variants(monkeypatch):
    monkeypatch.setattr(dsl_runtime, "available", lambda: True)
    for mode, expected in (("off", {False}), ("on", {True}), ("auto", {False, True})):
        with tilewright.config.patch(pdl=mode):
            for template, problem, target in ((GEMM90, BF16, SM90), (GEMM100, BF16, SM100),
                                              (BLOCKSCALED, nvfp4_problem(), SM100)):
                ranked = policy_for("gemm", target).ranked(problem, target, template)
                assert ranked and {p["PDL"] for _, p in ranked} == expected, (mode, template.id)
                assert all(template.check(p, problem, target) is None for _, p in ranked)
            forbidden = not expected.issuperset({True})
            params = params_for(GEMM100, BF16, SM100, PDL=True)
            assert (GEMM100.check(params, BF16, SM100) is not None) == forbidden


def test_policy_uses_the_templates_own_seeds(monkeypatch):
    monkeypatch.setattr(dsl_runtime, "available", lambda: True)
    big = GemmProblem(M=8192, N=8192, K=8192, dtype="bf16", layout_b="col")
    ranked = policy_for("gemm", SM100).ranked(big, SM100, GEMM100)
    assert any(p["CTA_GROUP"] == 2 for _, p in ranked), "2-CTA tiles are proposed for big problems"
    decode = GemmProblem(M=8, N=4096, K=4096, dtype="bf16", layout_b="col")
    assert policy_for("gemm", SM100).ranked(decode, SM100, GEMM100)[0][1]["BLOCK_M"] == 64
    # under auto the measured candidates hold the best tile with and without PDL
    # (CuTeDSL alone: with every language in, four slots go to each template's best first)
    with tilewright.config.patch(pdl="auto", max_candidates=4, force_backend="cutedsl"):
        cands = [c for c in policy_for("gemm", SM100).candidates(big, SM100) if c.backend == "cutedsl"]
    first = cands[0].param_dict
    assert any(c.param_dict == {**first, "PDL": not first["PDL"]} for c in cands)
    # a forced backend keeps only its candidates
    with tilewright.config.patch(force_backend="cutedsl"):
        kept, why = filter_forced(policy_for("gemm", SM90).candidates(big, SM90))
    assert kept and {c.backend for c in kept} == {"cutedsl"} and why == "forced cutedsl"


def test_pdl_twins_are_built_together_and_named_apart():
    ranked = [(1.0, {"BLOCK_M": 128, "PDL": False, "x": 1}), (1.0, {"BLOCK_M": 128, "PDL": True, "x": 1}),
              (2.0, {"BLOCK_M": 64, "PDL": False, "x": 1})]
    assert aot._with_pdl_twins(ranked, 1) == ranked[:2]
    cap = CapturedKernel(BF16, ["inference.gemm_0"])
    names = {aot._kernel_name(SM100, cap, GEMM100, {**params_for(GEMM100, BF16, SM100), "PDL": pdl})
             for pdl in (False, True)}
    assert len(names) == 2 and all("PDL" in n for n in names)


# -- rendered source (CHECK-style) -----------------------------------------------------------------
@pytest.mark.parametrize("template,problem,target", [(GEMM90, BF16, SM90), (GEMM100, BF16, SM100),
                                                     (BLOCKSCALED, nvfp4_problem(), SM100)],
                         ids=["sm90", "sm100", "blockscaled"])
def test_source_has_pdl_calls_exactly_when_asked(template, problem, target):
    for pdl in (False, True):
        src = template.render(problem, params_for(template, problem, target, PDL=pdl), target).source
        calls = ("cute.arch.griddepcontrol_wait()", "cute.arch.griddepcontrol_launch_dependents()")
        assert all((c in src) == pdl for c in calls), pdl
        assert f"PDL = {pdl}" in src and "use_pdl=PDL" in src
        # the wait comes before the first TMA load; launch_dependents after the last
        if pdl:
            producer = src[src.index("cute.arch.griddepcontrol_wait()"):]
            assert producer.index("tma_bar_ptr") < producer.index("griddepcontrol_launch_dependents")
    # the arch is never left to CuTeDSL: every compile goes through compile_options(arch, ...)
    compiles = [line for line in src.splitlines() if "cute.compile(" in line]
    assert len(compiles) == 2 and all("options=rt.compile_options(arch" in line for line in compiles)
    assert "rt.compile_options(arch, dump_dir)" in src


def test_source_fuses_the_epilogue():
    src = BLOCKSCALED.render(nvfp4_problem(), params_for(BLOCKSCALED, nvfp4_problem(), SM100), SM100).source
    assert "s0 = mE0[0].to(ACC)" in src and "s1 = mE1[0].to(ACC)" in src  # alpha, read once
    assert "x = x * s0" in src and "x = x * s1" in src and "x = x + rE2.load().to(ACC)" in src
    assert "tcgen05.Field.SFA" in src and "swizzle_scales" in src
    src = GEMM90.render(BF16, params_for(GEMM90, BF16, SM90), SM90).source
    assert "(rE1.load().to(ACC) * 0.5)" in src and "cute.math.exp(-x)" in src
    assert "cute.elem_less(cCs[v], (M, N))" in src  # edge tiles are predicated


def test_compile_options_never_default_the_arch():
    assert dsl_runtime.compile_options("sm_90a", "/tmp/d") == \
        "--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir /tmp/d"
    for bad in ("", None, "90a"):
        with pytest.raises(ValueError, match="explicit architecture"):
            dsl_runtime.compile_options(bad)


# -- ahead-of-time compiles ------------------------------------------------------------------------
# (label, template, problem, target, parameter overrides, PDL settings to build)
AOT_CASES = [
    ("sm90-bf16", GEMM90, BF16, SM90, {}, (False, True)),
    ("sm90-bf16-cluster2x1", GEMM90, BF16, SM90, {"CLUSTER_M": 2}, (True,)),
    ("sm90-fp8", GEMM90, FP8, SM90, {}, (False,)),
    ("sm100-bf16", GEMM100, BF16, SM100, {"CTA_GROUP": 1}, (False, True)),
    ("sm100-bf16-2cta", GEMM100, BF16, SM100, {"CTA_GROUP": 2, "BLOCK_N": 256}, (True,)),
    ("sm100-fp8", GEMM100, FP8, SM100, {}, (False,)),
    ("blockscaled-nvfp4", BLOCKSCALED, nvfp4_problem(), SM100, {"CTA_GROUP": 1}, (False, True)),
    ("blockscaled-nvfp4-2cta", BLOCKSCALED, nvfp4_problem(scale_layout="row"), SM100, {"CTA_GROUP": 2}, (True,)),
    ("blockscaled-mxfp4", BLOCKSCALED, nvfp4_problem(dtype="mxfp4"), SM100, {"BLOCK_N": 256}, (False,)),
    ("blockscaled-mxfp8", BLOCKSCALED, nvfp4_problem(dtype="mxfp8"), SM100, {}, (True,)),
]


@pytest.mark.slow
def test_every_template_compiles_with_and_without_pdl(tmp_path, dsl):
    """Each template for its arch in the AOT workers (PDL on/off pairs for the three main
    cases), checked against the instructions the template promises."""
    jobs, meta = [], {}
    for label, template, problem, target, overrides, pdls in AOT_CASES:
        for pdl in pdls:
            params = params_for(template, problem, target, PDL=pdl, **overrides)
            rendered = template.render(problem, params, target)
            assert rendered.aot.language == "cutedsl" and rendered.aot.options == {"gpu_arch": target.arch}
            name = f"{label}-pdl{int(pdl)}"
            jobs.append(CompileJob(name, rendered.source, rendered.aot.to_json(), target.triton))
            meta[name] = (template, problem, target, params)
    results = compile_jobs(jobs, tmp_path, workers=2, timeout_s=600)
    failures, arts = [], {}
    for r in results:
        template, problem, target, params = meta[r.name]
        if not r.ok:
            failures.append(f"{r.name}: {r.status} {r.error[-600:]}")
            continue
        assert {"source", "ptx", "cubin"} <= set(r.artifacts), r.artifacts
        arts[r.name] = {k: tmp_path / p for k, p in r.artifacts.items()}
        ptx = arts[r.name]["ptx"].read_text()
        # compiled for the arch asked for, never CuTeDSL's default
        assert re.search(rf"^\.target\s+{target.arch}\b", ptx, re.M), r.name
        assert r.metadata["gpu_arch"] == target.arch
        checks = template.expected_instructions(problem, params, target)
        v = verify(arts[r.name], checks)
        if not v.ok:
            failures.append(f"{r.name}: {v.failures}")
    assert not failures, "\n".join(failures)
    # the promises can fail: a PDL=False kernel does not keep PDL=True's, and vice versa
    template, problem, target, params = meta["blockscaled-nvfp4-pdl0"]
    on = template.expected_instructions(problem, {**params, "PDL": True}, target)
    off = template.expected_instructions(problem, params, target)
    assert not verify(arts["blockscaled-nvfp4-pdl0"], on).ok
    assert not verify(arts["blockscaled-nvfp4-pdl1"], off).ok
    # block-scaled MMAs are promised, and a dense kernel does not have them
    assert "block_scale" in " ".join(c.require[0] for c in BLOCKSCALED.mma_checks(problem, params))
    assert not verify(arts["sm100-bf16-pdl0"], BLOCKSCALED.mma_checks(problem, params)).ok
    # re-running rebuilds nothing
    assert {r.status for r in compile_jobs(jobs[:2], tmp_path)} == {"cached"}


@pytest.mark.slow
def test_aot_build_for_sm100a_lists_pdl_kernels(tmp_path, dsl):
    linear = nn.Linear(64, 128).to(torch.bfloat16)
    spec = ModelSpec(linear, (torch.randn(32, 64, dtype=torch.bfloat16),), {}, "linear")
    with tilewright.config.patch(pdl="auto"):
        report = aot.build(spec, ["sm_100a"], tmp_path, workers=2)
    assert report.ok, [(k.name, k.result.error[-500:] if k.result else None, k.verify_failures)
                       for k in report.kernels]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    ours = [k for k in manifest["kernels"] if k["template"] == "cutedsl.gemm_sm100"]
    assert ours and {k["params"]["PDL"] for k in ours} == {False, True}, "PDL twins, both built"
    for k in ours:
        assert k["status"] == "built" and k["verify"]["ok"] and k["aot"]["language"] == "cutedsl"
        assert {"source", "ptx", "cubin"} <= set(k["artifacts"])
        pdl = ("griddepcontrol" in " ".join(k["verify"]["counts"]))
        assert pdl == k["params"]["PDL"]
    # the block-scaled template refused this bf16 GEMM, with its reason
    assert any(r["template"] == "cutedsl.blockscaled_sm100" and "block-scaled" in r["reason"]
               for r in manifest["refused"])


def test_nvfp4_plan_picks_the_blockscaled_kernel_with_pdl(monkeypatch):
    """What ``tilewright aot`` would build for an NVFP4 linear on sm_100a with PDL forced on
    (the compile itself is covered by test_every_template_compiles_with_and_without_pdl)."""
    monkeypatch.setattr(dsl_runtime, "available", lambda: True)
    with tilewright.config.patch(pdl="on"):
        kernels, refused = aot.plan([CapturedKernel(nvfp4_problem(), ["inference.gemm_0"])], [SM100])
    ours = [k for k in kernels if k.template is BLOCKSCALED]
    assert len(ours) == 1 and ours[0].params["PDL"] is True
    assert ours[0].job.spec["language"] == "cutedsl" and ours[0].job.spec["options"] == {"gpu_arch": "sm_100a"}
    assert "griddepcontrol_wait()" in ours[0].job.source and "-PDL1" in ours[0].name
    assert {r["template"] for r in refused} >= {"cutedsl.gemm_sm100", "cutedsl.gemm_sm90"}


# -- the launcher, up to the driver ------------------------------------------------------------------
@pytest.mark.slow
def test_launcher_arguments_match_the_compiled_host_function(dsl):
    """On the CPU nothing launches (no driver), but the compiled function checks the argument
    list the launcher builds: count, pointer and integer types."""
    import cuda.bindings.driver as cuda

    problem = GemmProblem(M=70, N=96, K=128, dtype="bf16", layout_b="row",
                          epilogue=(EpilogueOp("add", input=0), EpilogueOp("mul", input=1),
                                    EpilogueOp("add", input=2), EpilogueOp("mul", input=3)),
                          epilogue_inputs=(EpilogueInput("N", "fp32"), EpilogueInput("", "fp32"),
                                           EpilogueInput("MN", "bf16"), EpilogueInput("M", "bf16")))
    module = load_module(GEMM100.render(problem, params_for(GEMM100, problem, SM100), SM100).source,
                         name="cutedsl_sm100", interpret=False)
    fn = module.compiled("sm_100a")
    M, N, K = 70, 96, 128
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    eps = [torch.randn(N).expand(M, N), torch.tensor(2.0).expand(M, N),
           torch.randn(M, N).bfloat16(), torch.randn(M, 1).bfloat16().expand(M, N)]
    out = torch.empty(M, N, dtype=torch.bfloat16)
    args, keep = module.host_args(a, b, eps, out, 148, cuda.CUstream(0))
    exe_args, _ = fn.generate_execution_args(*args)
    assert len(exe_args) == len(args)
    with pytest.raises(Exception):
        fn.generate_execution_args(*args[:-1])
    with pytest.raises(InvalidInputError, match="CUDA tensors"):
        module.launch(a, b, *eps)

    q = nvfp4_problem(scale_layout="row")
    module = load_module(BLOCKSCALED.render(q, params_for(BLOCKSCALED, q, SM100), SM100).source,
                         name="cutedsl_nvfp4", interpret=False)
    qa, qb = quantize(torch.randn(q.M, q.K)), quantize(torch.randn(q.N, q.K))
    ga, gb = qa.global_scale.reshape(1, 1).expand(q.M, q.N), qb.global_scale.reshape(1, 1).expand(q.M, q.N)
    out = torch.empty(q.M, q.N, dtype=torch.bfloat16)
    eps = [ga, gb, torch.randn(q.N).bfloat16().expand(q.M, q.N)]
    args, keep = module.host_args(qa.data, qb.data, qa.scale, qb.scale, eps, out, 148, cuda.CUstream(0))
    module.compiled("sm_100a").generate_execution_args(*args)
    # "row" scales are swizzled by the launcher into exactly swizzle_scales' bytes
    assert torch.equal(keep[2], swizzle_scales(qa.scale.view(torch.uint8)))
    with pytest.raises(InvalidInputError, match="a_scale and b_scale"):
        module.launch(qa.data, qb.data, *eps)
