"""flydsl.gemm and flydsl.grouped_gemm: the gfx950 MFMA GEMM templates with the fused epilogue.

What runs here: registration and refusals (no compiler needed), the gfx950 policy's refusals
before compiling, the torch-form proof of the kernels' index math (emulate.py) on ragged shapes
against float64, and -- with the FlyDSL compile-only toolchain (`make flydsl-setup`) -- a spread
of tiles compiled for gfx950, checked for their instructions, and the LDS model compared with
the compiled `.amdhsa_group_segment_fixed_size`. The kernels themselves never run here (no AMD
GPU): their numerics are the emulation's, their code is compile-checked only.
"""

from __future__ import annotations

import re

import pytest
import torch

from tilewright.errors import UnsupportedProblemError
from tilewright.grouped import GroupedGemmProblem
from tilewright.ir import expr as E
from tilewright.ir.epilogue import dumps, problem_epilogue
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.templates.flydsl import runtime as fly_runtime
from tilewright.runtime.targets import get_target
from tilewright.runtime.verify import verify
from tilewright.templates import get_template, templates_for
from tilewright.templates.flydsl import emulate, limits

GEMM = get_template("flydsl.gemm")
GROUPED = get_template("flydsl.grouped_gemm")
GFX950 = get_target("hip:gfx950")
BIAS_GELU = GemmProblem(M=200, N=136, K=256, dtype="bf16", layout_b="col",
                        epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu")),
                        epilogue_inputs=(EpilogueInput("N", "bf16"),))
MOE = GroupedGemmProblem(case="2d3d", G=8, M=1000, N=256, K=256, dtype="bf16", layout_b="col",
                         epilogue=(EpilogueOp("add", input=0), EpilogueOp("silu")),
                         epilogue_inputs=(EpilogueInput("BN", "bf16"),))


@pytest.fixture
def toolchain():
    why = fly_runtime.toolchain_problem()
    if why:
        pytest.skip(f"FlyDSL compile-only toolchain not ready ({why}); run `make flydsl-setup`")


# -- registration and refusals ---------------------------------------------------------------
def test_registered_for_hip_as_gemm_and_grouped_gemm():
    assert GEMM in templates_for("gemm", "hip") and GROUPED in templates_for("grouped_gemm", "hip")
    assert GEMM.op == "gemm" and GROUPED.op == "grouped_gemm"
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "INTERLEAVE"} \
        == set(GEMM.space.names())


def test_missing_toolchain_is_refused_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWRIGHT_FLYDSL_ROCM", str(tmp_path / "nothing"))
    for template, problem in ((GEMM, BIAS_GELU), (GROUPED, MOE)):
        why = template.supports(problem, GFX950).reason
        assert "make flydsl-setup" in why or "pip install" in why


def test_a_compiled_model_on_gfx950_is_offered_flydsl_only_where_flydsl_builds(monkeypatch):
    # each module has its launcher: with FlyDSL and its toolchain the autotuner of a compiled
    # model on gfx950 gets the FlyDSL candidates; without them the templates stay aot_only
    # (built by `tilewright aot` where it can, never offered), for the toolchain's reason
    from tilewright.autotune.policy import policy_for

    monkeypatch.setattr(fly_runtime, "toolchain_problem", lambda: None)
    assert GEMM.supports(BIAS_GELU, GFX950) and not GEMM.aot_only and not GROUPED.aot_only
    assert GEMM in templates_for("gemm", "hip", jit=True)
    offered = {c.template_id for c in policy_for("gemm", GFX950).candidates(BIAS_GELU, GFX950)}
    assert "flydsl.gemm" in offered
    monkeypatch.setattr(fly_runtime, "toolchain_problem", lambda: "flydsl is not installed: pip install")
    assert GEMM.aot_only and GROUPED.aot_only and "pip install" in GEMM.aot_only_reason
    assert GEMM in templates_for("gemm", "hip") and GEMM not in templates_for("gemm", "hip", jit=True)
    offered = {c.template_id for c in policy_for("gemm", GFX950).candidates(BIAS_GELU, GFX950)}
    assert offered and not any(t.startswith("flydsl.") for t in offered)


@pytest.mark.parametrize("change, words", [
    (dict(dtype="fp32"), "input dtype"),
    (dict(layout_b="row"), "K-contiguous"),
    (dict(layout_a="col"), "K-contiguous"),
    (dict(K=200), "multiple of 32"),
    (dict(dynamic=frozenset({"K"})), "K is dynamic"),
    (dict(batch=4, batched=True), "batched"),
    (dict(epilogue=(), epilogue_inputs=(), epilogue_ir=dumps(E.op("sin", E.acc()))), "sin"),
])
def test_dense_refusals_say_why(change, words):
    import dataclasses

    problem = dataclasses.replace(BIAS_GELU, **change)
    why = GEMM.problem_support(problem, GFX950).reason
    assert words in why, why
    with pytest.raises(UnsupportedProblemError, match=re.escape(words)):
        GEMM.render(problem, {}, GFX950)
    assert "gfx950" in GEMM.problem_support(BIAS_GELU, get_target("hip:gfx942")).reason


@pytest.mark.parametrize("change, words", [
    (dict(case="2d2d", M=64, K=1000), "only the MoE forward"),
    (dict(case="3d3d"), "only the MoE forward"),
    (dict(layout_b="row"), "K-contiguous"),
    (dict(glu="silu"), "gated product"),
    (dict(K=100), "multiple of 32"),
])
def test_grouped_refusals_say_why(change, words):
    import dataclasses

    why = GROUPED.problem_support(dataclasses.replace(MOE, **change), GFX950).reason
    assert words in why, why


@pytest.mark.parametrize("params, K, words", [
    (dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_stages=4), 384, "LDS"),
    (dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, num_stages=2, num_warps=4), 384, "VGPRs"),
    (dict(BLOCK_M=32, BLOCK_N=64, num_warps=8), 384, "do not tile"),
    (dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=8), 384, "128-bit copies"),
    (dict(BLOCK_K=32, INTERLEAVE=True), 384, "INTERLEAVE"),
    (dict(BLOCK_K=128), 320, "multiple of BLOCK_K"),
    (dict(num_stages=5), 384, "num_stages"),
])
def test_illegal_tiles_are_refused_before_compiling(params, K, words):
    import dataclasses

    why = GEMM.check(params, dataclasses.replace(BIAS_GELU, K=K), GFX950)
    assert why and words in why, why
    grouped = {k: v for k, v in params.items() if k != "GROUP_M"}
    why = GROUPED.check(grouped, dataclasses.replace(MOE, K=K), GFX950)
    assert why and words in why, why


def test_seed_params_are_legal_and_the_policy_ranks_them():
    from tilewright.autotune.policy import policy_for

    seeds = GEMM.seed_params(BIAS_GELU, GFX950)
    assert len(seeds) >= 4 and all(GEMM.check(p, BIAS_GELU, GFX950) is None for p in seeds)
    assert GROUPED.seed_params(MOE, GFX950)
    ranked = policy_for("gemm", GFX950).ranked(BIAS_GELU, GFX950, GEMM)
    assert ranked and all(GEMM.check(p, BIAS_GELU, GFX950) is None for _, p in ranked)


def test_the_render_has_its_launcher_and_the_epilogue_from_the_ir_emitter():
    r = GEMM.render(BIAS_GELU, {}, GFX950)
    assert r.aot.language == "flydsl" and r.aot.options == {"gpu_arch": "gfx950"}
    assert "def compile_aot():" in r.source and "@flyc.kernel" in r.source and "def launch(a, b" in r.source
    assert "_tw_erf" in r.source  # gelu's erf built from exp by the emitter (no ocml here)
    g = GROUPED.render(MOE, {}, GFX950)
    assert "fx.memref_load(OFFS, g)" in g.source and "se0_b" in g.source


# -- the index math, in torch form, against float64 ---------------------------------------------
def _rand(*shape, dtype=torch.bfloat16, gen=None):
    return (torch.randn(*shape, generator=gen) * 0.5 + 0.1).to(dtype)


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("tile", [
    emulate.Tile(64, 64, 64, GROUP_M=4, num_stages=3),
    emulate.Tile(32, 128, 32, GROUP_M=1, num_stages=4),
    emulate.Tile(128, 64, 64, GROUP_M=8, num_stages=2, num_warps=8),
], ids=["64x64x64-s3", "32x128x32-s4", "128x64x64-s2-w8"])
def test_dense_index_math_matches_float64_and_writes_each_element_once(tile):
    g = torch.Generator().manual_seed(0)
    M, N, K = 200, 136, 128  # neither M nor N a multiple of any tile
    a, b = _rand(M, K, gen=g), _rand(N, K, gen=g)
    bias, row, res = _rand(N, gen=g), _rand(M, dtype=torch.float32, gen=g), _rand(M, N, gen=g)
    problem = GemmProblem(M=M, N=N, K=K, dtype="bf16", layout_b="col",
                          epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu"), EpilogueOp("mul", input=1),
                                    EpilogueOp("add", input=2), EpilogueOp("mul", scalar=0.5)),
                          epilogue_inputs=(EpilogueInput("N", "bf16"), EpilogueInput("M", "fp32"),
                                           EpilogueInput("MN", "bf16")))
    out, writes = emulate.dense(a, b, tile, problem_epilogue(problem), (bias, row, res), ("N", "M", "MN"),
                                out_dtype=torch.float32)
    acc = a.double() @ b.double().T
    ref = (torch.nn.functional.gelu(acc + bias.double()) * row.double()[:, None] + res.double()) * 0.5
    assert torch.equal(writes, torch.ones_like(writes))
    assert _rel(out, ref) < 1e-6


def test_dense_emulation_fails_on_a_wrong_swizzle(monkeypatch):
    """The proof can fail: a swizzle that maps two blocks to one tile leaves elements unwritten."""
    monkeypatch.setattr(emulate, "swizzle", lambda pid, M, N, t: (pid % 2, 0))
    a, b = _rand(100, 64), _rand(100, 64)
    _, writes = emulate.dense(a, b, emulate.Tile(32, 32, 64), E.acc())
    assert not torch.equal(writes, torch.ones_like(writes))


@pytest.mark.parametrize("sizes", [
    [0, 1, 64, 0, 37, 130],  # empty groups, a one-token group, a tile-aligned one
    [5, 0, 0, 0],            # everything in the first group
    [0, 0, 70, 1],           # leading empty groups
], ids=["mixed", "first-only", "leading-empty"])
@pytest.mark.parametrize("tile", [emulate.Tile(64, 128, 64, num_stages=3), emulate.Tile(32, 64, 32, num_stages=2)],
                         ids=["64x128x64", "32x64x32"])
def test_grouped_index_math_over_ragged_offsets(sizes, tile):
    g = torch.Generator().manual_seed(1)
    G, N, K = len(sizes), 96, 128
    total = sum(sizes)
    T = total + 3  # rows past offs[-1] belong to no group and must stay unwritten
    a, b = _rand(T, K, gen=g), _rand(G, N, K, gen=g)
    bias = _rand(G, N, gen=g)
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    problem = GroupedGemmProblem(case="2d3d", G=G, M=T, N=N, K=K, dtype="bf16", layout_b="col",
                                 epilogue=(EpilogueOp("add", input=0), EpilogueOp("silu")),
                                 epilogue_inputs=(EpilogueInput("BN", "bf16"),))
    out, writes = emulate.grouped(a, b, offs, tile, problem_epilogue(problem), (bias,), ("BN",))
    ref = torch.full((T, N), float("nan"), dtype=torch.float64)
    start = 0
    for gi, end in enumerate(offs.tolist()):
        acc = a[start:end].double() @ b[gi].double().T + bias[gi].double()
        ref[start:end] = torch.nn.functional.silu(acc)
        start = end
    assert torch.equal(writes[:total], torch.ones_like(writes[:total]))
    assert not writes[total:].any() and out[total:].isnan().all()
    assert _rel(out[:total], ref[:total]) < 1e-6


def test_group_scan_finds_every_tile_once():
    offs = [0, 1, 65, 65, 200]
    found = [emulate.group_of(t, offs, 64) for t in range(len(offs) + 200 // 64 + 1)]
    tiles = [f for f in found if f[2] > f[1]]
    assert [f[0] for f in tiles] == [1, 2, 4, 4, 4]
    assert [f[1] for f in tiles] == [0, 1, 65, 129, 193]


# -- compiled for gfx950 -----------------------------------------------------------------------
SPREAD = [
    pytest.param(GEMM, BIAS_GELU, dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=2), id="dense-128x128x64-s2"),
    pytest.param(GEMM, BIAS_GELU, dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=2), id="dense-256x128x64-w8"),
    pytest.param(GEMM, BIAS_GELU, dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=3, INTERLEAVE=True), id="dense-interleave-s3"),
    pytest.param(GEMM, GemmProblem(M=64, N=96, K=512, dtype="fp16", out_dtype="fp32", layout_b="col"),
                 dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, num_stages=4, GROUP_M=1), id="dense-fp16-64x32x128-s4"),
    pytest.param(GROUPED, MOE, dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_stages=3), id="grouped-64x128x64-s3"),
] + [pytest.param(*p, id=i, marks=pytest.mark.slow) for i, p in [
    ("dense-64x128x32-s4", (GEMM, BIAS_GELU, dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=32, num_stages=4))),
    ("dense-32x64x128", (GEMM, BIAS_GELU, dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, GROUP_M=4))),
    ("dense-128x256x64-interleave", (GEMM, BIAS_GELU, dict(BLOCK_M=128, BLOCK_N=256, INTERLEAVE=True))),
    ("grouped-128x128x64-interleave", (GROUPED, MOE, dict(BLOCK_M=128, BLOCK_N=128, INTERLEAVE=True))),
    ("grouped-fp16-w8", (GROUPED, GroupedGemmProblem(case="2d3d", G=4, M=300, N=128, K=128, dtype="fp16",
                                                   out_dtype="fp32", layout_b="col"),
                         dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=8, num_stages=2))),
]]


@pytest.mark.parametrize("template, problem, params", SPREAD)
def test_tiles_compile_for_gfx950_with_the_promised_instructions(toolchain, tmp_path, template, problem, params):
    r = template.render(problem, params, GFX950)
    src = tmp_path / "kernel.py"
    src.write_text(r.source)
    res = fly_runtime.compile_source(src, "gfx950", tmp_path / "dump")
    v = verify({"amdgcn": res.isa_path}, template.expected_instructions(problem, params, GFX950))
    assert v.ok, v.failures
    p = template.space.complete(params)
    assert res.lds_bytes == r.meta["lds_bytes"] == limits.lds_bytes(
        p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["num_stages"])
    assert res.scratch_bytes == 0 and res.agprs == 0
    assert res.vgprs <= limits.vgpr_estimate(p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["num_warps"]) <= 256
    wm, wn = limits.wave_grid(p["num_warps"])
    per_slab = (p["BLOCK_M"] // (16 * wm)) * (p["BLOCK_N"] // (16 * wn)) * (p["BLOCK_K"] // 32)
    mfma = "v_mfma_f32_16x16x32_" + ("bf16" if problem.dtype == "bf16" else "f16")
    assert res.isa.count(mfma) % per_slab == 0 and res.isa.count(mfma) >= per_slab


def test_aot_plans_and_builds_the_dense_kernel_for_a_linear_model(toolchain, tmp_path):
    from tilewright.compiler import aot
    from tilewright.compiler.capture import ModelSpec

    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU()).to(torch.bfloat16)
    spec = ModelSpec(model, (torch.randn(64, 128, dtype=torch.bfloat16),), {}, "linear")
    report = aot.build(spec, ["gfx950"], tmp_path, workers=1)
    fly = [k for k in report.kernels if k.template.id == "flydsl.gemm"]
    assert fly, [(r["template"], r["reason"]) for r in report.refused]
    for k in fly:
        assert k.result is not None and k.result.ok, k.result.error if k.result else None
        assert k.verified, k.verify_failures
        assert (tmp_path / "kernels" / k.result.artifacts["amdgcn"]).exists()


@pytest.mark.parametrize("lds, scratch, ok", [(65536, 0, True), (163840, 0, True), (163841, 0, False),
                                              (196608, 0, False), (65536, 16, False)])
def test_the_instruction_check_catches_lds_over_the_limit_and_spills(tmp_path, lds, scratch, ok):
    isa = tmp_path / "k.amdgcn"
    isa.write_text("v_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], v[0:3]\n"
                   "buffer_load_dwordx4 v3, s[0:3], 0 offen lds\n"
                   f"  .amdhsa_group_segment_fixed_size {lds}\n"
                   f"  .amdhsa_private_segment_fixed_size {scratch}\n")
    assert verify({"amdgcn": isa}, GEMM.expected_instructions(BIAS_GELU, {}, GFX950)).ok is ok
