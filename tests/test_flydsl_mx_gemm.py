"""flydsl.mx_gemm: MXFP4/MXFP8 block-scaled GEMM for gfx950's scaled MFMA.

Refusals come with reasons and before compiling; the torch replay of the kernel's index and
scale math (mx_emulate) matches the float64 reference on ragged shapes and fails when that math
is wrong; gfx950 builds (5 compiles, skipped without the FlyDSL toolchain) contain the scaled
MFMA, spill nothing, and allocate exactly the LDS the model predicts."""

from __future__ import annotations

import importlib.util

import dataclasses
from pathlib import Path

import pytest
import torch

from tilewright.autotune.inputs import rel_error
from tilewright.compiler import aot
from tilewright.compiler.capture import CapturedKernel
from tilewright.errors import UnsupportedProblemError
from tilewright.ir import expr as E
from tilewright.ir.epilogue import dumps
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.templates.flydsl import runtime as fly_runtime
from tilewright.runtime.aot import compile_jobs
from tilewright.runtime.targets import get_target
from tilewright.runtime.verify import verify
from tilewright.templates import get_template
from tilewright.templates.flydsl import mx_emulate
from tilewright.templates.flydsl.mx_gemm import Geometry, geometry

GFX950 = get_target("hip:gfx950")
MX = get_template("flydsl.mx_gemm")
TOOLCHAIN = fly_runtime.toolchain_problem()
needs_flydsl = pytest.mark.skipif(TOOLCHAIN is not None, reason=f"FlyDSL toolchain: {TOOLCHAIN}")
# relative error a correct kernel stays under, by output dtype (bf16 output rounding dominates)
TOL = {"bf16": 1e-2, "fp32": 1e-5}
SIN_IR = dumps(E.op("sin", E.acc()))
# bias [N] + gelu, then a per-row fp32 scale and a bf16 residual: every load pattern
FULL = dict(epilogue=(EpilogueOp("mul", input=0), EpilogueOp("add", input=1), EpilogueOp("gelu"),
                      EpilogueOp("mul", input=2), EpilogueOp("add", input=3)),
            epilogue_inputs=(EpilogueInput("", "fp32"), EpilogueInput("N", "bf16"),
                             EpilogueInput("M", "fp32"), EpilogueInput("MN", "bf16")))


def mx(fmt: str, M: int = 200, N: int = 136, K: int = 512, **kw) -> GemmProblem:
    """A ragged MX GEMM whose epilogue is alpha = 0.5 * a 0-dim fp32 tensor (global scales)."""
    kw.setdefault("epilogue", (EpilogueOp("mul", input=0), EpilogueOp("mul", scalar=0.5)))
    kw.setdefault("epilogue_inputs", (EpilogueInput("", "fp32"),))
    kw.setdefault("scale_layout", "row")
    return GemmProblem(M=M, N=N, K=K, dtype=fmt, layout_b="col", **kw)


def tile(bm, bn, bk, warps=4, stages=2, group=8) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_warps": warps,
            "num_stages": stages}


# -- refusals -----------------------------------------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("flydsl") is None,
                    reason="flydsl is not installed: these refusals are the ones past the package")
def test_supports_refuses_with_reasons():
    p = mx("mxfp4")
    assert MX.supports(p, GFX950) or TOOLCHAIN
    cases = [
        (mx("mxfp4"), get_target("hip:gfx942"), "gfx950"),
        (mx("mxfp4"), get_target("cpu"), "gfx950"),
        (GemmProblem(M=64, N=64, K=256, dtype="nvfp4", layout_b="col", scale_layout="row"), GFX950, "nvfp4"),
        (mx("mxfp8", scale_layout="swizzled"), GFX950, "scale layout"),
        (dataclasses.replace(mx("mxfp4"), layout_b="row"), GFX950, "K-major"),
        (mx("mxfp4", K=96), GFX950, "multiple of 128"),
        (mx("mxfp4", dynamic=frozenset({"K"})), GFX950, "K must be static"),
        (mx("mxfp4", epilogue=(EpilogueOp("add", input=0),), epilogue_inputs=(EpilogueInput("N", "fp8e4m3"),)),
         GFX950, "epilogue input dtype"),
        (mx("mxfp4", epilogue=(), epilogue_inputs=(), epilogue_ir=SIN_IR), GFX950, "sin"),
    ]
    for problem, target, why in cases:
        support = MX.supports(problem, target)
        assert not support and why in support.reason, (problem.describe(), support.reason)
    with pytest.raises(UnsupportedProblemError, match="gfx950"):
        MX.render(p, tile(64, 64, 256), get_target("hip:gfx942"))


def test_supports_names_the_fix_when_the_toolchain_is_missing(monkeypatch):
    monkeypatch.setattr(fly_runtime, "toolchain_problem", lambda: fly_runtime.NOT_INSTALLED)
    reason = MX.supports(mx("mxfp4"), GFX950).reason
    assert "pip install" in reason and "flydsl" in reason
    MX.render(mx("mxfp4"), tile(64, 64, 256), GFX950)  # rendering needs only jinja


def test_check_refuses_before_compiling():
    p4, p8 = mx("mxfp4"), mx("mxfp8")
    assert MX.check(tile(64, 64, 256), p4, GFX950) is None
    assert "BLOCK_K" in MX.check(tile(64, 64, 256), mx("mxfp4", K=384), GFX950)
    assert "multiple of the 32-value" in MX.check(tile(64, 64, 128), mx("mxfp4", K=400, dynamic=frozenset({"K"})), GFX950)
    assert "scale layout" in MX.check(tile(64, 64, 256), mx("mxfp4", scale_layout="swizzled"), GFX950)
    lds = MX.check(tile(256, 256, 512, stages=4), mx("mxfp8", K=1024), GFX950)
    assert "LDS" in lds and "163840" in lds
    assert "VGPR" in MX.check(tile(256, 256, 128, warps=4), p8, GFX950)
    assert "16-byte loads" in MX.check(tile(32, 32, 128), p4, GFX950)
    assert "one of" in MX.check({**tile(64, 64, 256), "num_stages": 1}, p4, GFX950)
    with pytest.raises(UnsupportedProblemError, match="LDS"):
        MX.render(mx("mxfp8", K=1024), tile(256, 256, 512, stages=4), GFX950)
    seeds = MX.seed_params(p4, GFX950)
    assert seeds and all(MX.check(s, p4, GFX950) is None for s in seeds)


def test_lds_model_counts_padded_rows_of_every_stage():
    g = Geometry("mxfp4", 128, 64, 256, 8, 4, 3)
    assert g.lds_B == 3 * (128 + 64) * (256 // 2 + 16)
    assert Geometry("mxfp8", 64, 64, 128, 8, 4, 2).lds_B == 2 * 128 * (128 + 16)


# -- the numerics proof (torch replay of the kernel's index and scale math) ----------------------
PROOF = [
    ("mxfp4", (136, 72, 512), Geometry("mxfp4", 64, 64, 256, 8, 4, 2), "bf16"),
    ("mxfp8", (100, 40, 384), Geometry("mxfp8", 64, 64, 128, 2, 4, 3), "bf16"),
    ("mxfp8", (70, 150, 256), Geometry("mxfp8", 128, 64, 256, 1, 8, 2), "fp32"),
    ("mxfp4", (130, 40, 256), Geometry("mxfp4", 128, 128, 256, 8, 4, 3), "fp32"),
]


def _run_proof(fmt, shape, g, out_dtype, seed=0):
    M, N, K = shape
    gen = torch.Generator().manual_seed(seed)
    a, sa = mx_emulate.random_operand(fmt, M, K, gen)
    b, sb = mx_emulate.random_operand(fmt, N, K, gen)
    alpha = 0.5 * float(torch.rand((), generator=gen)) + 0.25
    out = torch.full((M, N), float("nan"), dtype=getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[out_dtype]))
    mx_emulate.emulate(g, a, sa, b, sb, out, alpha)
    return rel_error(out, mx_emulate.reference(fmt, a, sa, b, sb, alpha))


@pytest.mark.parametrize("fmt,shape,g,out_dtype", PROOF, ids=[f"{p[0]}-{p[1]}-{p[3]}" for p in PROOF])
def test_kernel_math_matches_float64(fmt, shape, g, out_dtype):
    assert g.refusal() is None
    err = _run_proof(fmt, shape, g, out_dtype)
    assert err < TOL[out_dtype], err


def test_the_proof_fails_when_the_math_is_wrong(monkeypatch):
    fmt, shape, g, out_dtype = PROOF[0]
    right = mx_emulate.scale_offset
    # the scale of the neighbouring 32-value block: every lane still gets a plausible scale
    monkeypatch.setattr(mx_emulate, "scale_offset",
                        lambda g, lane, *a: right(g, (lane + 16) % 64, *a))
    assert _run_proof(fmt, shape, g, out_dtype) > 10 * TOL[out_dtype]
    monkeypatch.undo()
    # the K loop reading LDS stage 0 every step: the ring's slot order is checked too
    offsets = mx_emulate.operand_offsets
    monkeypatch.setattr(mx_emulate, "operand_offsets", lambda g, lane, pos, tile, ks, stage, is_b:
                        offsets(g, lane, pos, tile, ks, 0, is_b))
    assert _run_proof(fmt, shape, g, out_dtype) > 10 * TOL[out_dtype]
    monkeypatch.undo()
    # result register r written one row off: the poisoned rows it misses stay NaN
    coords = mx_emulate.out_coords
    monkeypatch.setattr(mx_emulate, "out_coords", lambda *a: (lambda rc: (rc[0] // 2, rc[1]))(coords(*a)))
    assert _run_proof(fmt, shape, g, out_dtype) == float("inf")


def test_epilogue_sees_each_elements_own_row_and_column():
    # a bias per column and a scale per row: an element handed another's (m, n) is caught
    fmt, (M, N, K), g = "mxfp8", (100, 72, 256), Geometry("mxfp8", 64, 64, 128, 8, 4, 2)
    gen = torch.Generator().manual_seed(1)
    a, sa = mx_emulate.random_operand(fmt, M, K, gen)
    b, sb = mx_emulate.random_operand(fmt, N, K, gen)
    bias, rows = torch.randn(N, generator=gen), torch.rand(M, generator=gen) + 0.5
    out = torch.full((M, N), float("nan"))
    mx_emulate.emulate(g, a, sa, b, sb, out, epilogue=lambda acc, m, n: torch.relu(acc + bias[n]) * rows[m])
    ref = torch.relu(mx_emulate.reference(fmt, a, sa, b, sb) + bias.double()) * rows.double()[:, None]
    assert rel_error(out, ref) < TOL["fp32"]


def test_reference_decodes_mx_formats():
    # E2M1 code 0x2 = 1.0, 0xF = -6; E4M3 0x38 = 1.0; E8M0 128 = 2
    a = torch.tensor([[0xF2] * 16], dtype=torch.uint8)
    assert mx_emulate.decode_values("mxfp4", a)[0, :2].tolist() == [1.0, -6.0]
    assert mx_emulate.decode_values("mxfp8", torch.tensor([[0x38]], dtype=torch.uint8)).item() == 1.0
    assert mx_emulate.decode_scales(torch.tensor([128, 125], dtype=torch.uint8)).tolist() == [2.0, 0.25]


# -- gfx950 builds --------------------------------------------------------------------------------
COMPILES = [
    ("mxfp4", tile(64, 64, 256), {}),
    ("mxfp4", tile(128, 128, 256, stages=3), {}),
    ("mxfp8", tile(64, 64, 128), FULL),
    ("mxfp8", tile(128, 64, 256, warps=8), {}),
]


@needs_flydsl
@pytest.mark.parametrize("fmt,params,epilogue", COMPILES,
                         ids=[f"{f}-{p['BLOCK_M']}x{p['BLOCK_N']}x{p['BLOCK_K']}" + ("-full-epilogue" if e else "")
                              for f, p, e in COMPILES])
def test_compiles_for_gfx950_with_the_scaled_mfma(tmp_path, fmt, params, epilogue):
    problem = mx(fmt, **epilogue)
    rendered = MX.render(problem, params, GFX950)
    assert rendered.aot.language == "flydsl" and rendered.aot.options == {"gpu_arch": "gfx950"}
    if epilogue:  # every input pattern is read through its strides, gelu through the emitter
        assert all(f"E{k}, " in rendered.source for k in range(4)) and "_tw_erf" in rendered.source
    src = tmp_path / "kernel.py"
    src.write_text(rendered.source)
    res = fly_runtime.compile_source(src, "gfx950", tmp_path / "dump")
    result = verify({"amdgcn": res.isa_path}, MX.expected_instructions(problem, params, GFX950))
    assert result.ok, result.failures
    g = geometry(problem, params)
    mfma = [n for p, n in result.counts.items() if p.startswith("v_mfma_scale")][0]
    assert mfma >= g.tm * g.tn * g.ksteps  # at least one K tile's worth
    assert res.lds_bytes == g.lds_B == rendered.meta["lds_bytes"]
    assert res.scratch_bytes == 0 and res.agprs == 0 and res.vgprs <= 256
    assert abs(g.vgpr_estimate() - res.vgprs) <= 0.25 * res.vgprs, (g.vgpr_estimate(), res.vgprs)


@needs_flydsl
def test_aot_plan_builds_an_mxfp4_linear_for_gfx950(tmp_path):
    # a hand-built capture of an MXFP4 GEMM with two global scales in its epilogue (the model
    # path, MXFP4Linear on the Qwen3-MoE shapes, is in tests/test_aot_grouped.py)
    problem = mx("mxfp4", M=256, N=512, K=1024,
                 epilogue=(EpilogueOp("mul", input=0), EpilogueOp("mul", input=1)),
                 epilogue_inputs=(EpilogueInput("", "fp32"), EpilogueInput("", "fp32")))
    kernels, refused = aot.plan([CapturedKernel(problem, ["inference.gemm_0"])], [GFX950])
    # beside the Triton kernels that dequantise MX in their prologue (test_aot_grouped.py)
    (k,) = [k for k in kernels if k.template.id == "flydsl.mx_gemm"] or [refused]
    (r,) = compile_jobs([k.job], tmp_path)
    assert r.ok, r
    arts = {"amdgcn": tmp_path / r.artifacts["amdgcn"]}
    checks = MX.expected_instructions(problem, k.params, GFX950)
    assert verify(arts, checks).ok
    assert r.metadata["shared"] == geometry(problem, k.params).lds_B
    assert Path(tmp_path / r.artifacts["source"]).read_text() == k.job.source
