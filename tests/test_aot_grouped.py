"""Ahead-of-time planning and builds of grouped GEMMs, on the Qwen3-30B-A3B shapes of
``bench/cases/llm_gemm_shapes.json`` (``tilewright.demo.models:qwen3_moe_shapes``): the experts'
``F.grouped_mm`` calls are captured as grouped problems, planned through the grouped policy for
every template ``templates_for("grouped_gemm", ...)`` lists (FlyDSL's included on gfx950), named,
described, built and checked for their MMA instructions."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tilewright.compiler import aot
from tilewright.compiler.capture import capture_kernels, load_model
from tilewright.grouped import GroupedGemmProblem
from tilewright.problem import GemmProblem
from tilewright.runtime.aot import compile_jobs
from tilewright.runtime.targets import get_target
from tilewright.templates import templates_for

ROOT = Path(__file__).resolve().parents[1]
SPEC = "tilewright.demo.models:qwen3_moe_shapes"
QWEN = json.loads((ROOT / "bench/cases/llm_gemm_shapes.json").read_text())["models"]["qwen3-30b-a3b"]
TOKENS = 16  # qwen3_moe_shapes' default: the experts see TOKENS * top_k rows


@pytest.fixture(scope="module")
def captured():
    return capture_kernels(load_model(SPEC))


def _grouped(captured) -> list[GroupedGemmProblem]:
    return [c.problem for c in captured if isinstance(c.problem, GroupedGemmProblem)]


def test_the_shapes_file_becomes_dense_and_grouped_problems(captured):
    dense = sorted((c.problem.M, c.problem.N, c.problem.K) for c in captured if isinstance(c.problem, GemmProblem))
    assert dense == sorted((TOKENS, QWEN[p]["N"], QWEN[p]["K"]) for p in ("qkv_proj", "o_proj"))
    grouped = _grouped(captured)
    gu, down = QWEN["expert_gate_up_proj"], QWEN["expert_down_proj"]
    rows = TOKENS * gu["top_k"]
    assert sorted((p.case, p.G, p.M, p.N, p.K) for p in grouped) == sorted(
        [("2d3d", gu["experts"], rows, gu["N"], gu["K"]), ("2d3d", down["experts"], rows, down["N"], down["K"])])
    # the gate_up projection carries its fused silu(gate) * up (a kernel without it would
    # compute the wrong thing), the down projection none
    assert sorted(p.glu for p in grouped) == ["", "silu"]
    for p in grouped:
        assert p.dtype == "bf16" and p.layout_b == "col"  # (experts, N, K) weights, transposed
        assert p.dynamic == frozenset({"M"})  # the token count: tuned per bucket


@pytest.mark.parametrize("target_name", ["gfx950", "sm_90a"])
def test_grouped_problems_plan_through_every_grouped_template(captured, target_name):
    target = get_target(target_name)
    kernels, refused = aot.plan(captured, [target])
    names = [k.name for k in kernels]
    assert len(names) == len(set(names)) and all(n.startswith(f"{target.arch}/") for n in names)
    templates = [t for t in templates_for("grouped_gemm", target.backend) if t.backend != "aten"]
    assert "triton.grouped_gemm" in {t.id for t in templates}
    for p in _grouped(captured):
        planned = [k for k in kernels if k.captured.problem == p]
        assert {k.kind for k in planned} == {"grouped_gemm"}
        text = p.describe()
        said_no = {r["template"] for r in refused if r["problem"] == text}
        for t in templates:  # each template either planned a kernel or said why not
            assert t.id in {k.template.id for k in planned} | said_no, (t.id, target_name)
        ours = next(k for k in planned if k.template.id == "triton.grouped_gemm")
        assert ours.job.spec["language"] == "triton" and ours.job.spec["pointer_types"]["OFFS"] == "*i32"
        assert ours.predicted_ms > 0 and ours.bound in ("compute", "memory", "latency")
        assert f"_{p.case}_g{p.G}_{p.M}x{p.N}x{p.K}_" in ours.name
        assert aot.describe_problem(p).startswith(f"grouped_mm 2d3d G={p.G} {p.M}x{p.N}x{p.K}")
        assert aot.describe_params(ours.params).startswith("{BLOCK_M}x{BLOCK_N}x{BLOCK_K}".format(**ours.params))
        # tiles that fit a group's share of the tokens (a 1-token group wastes the rest)
        assert ours.params["BLOCK_M"] <= max(16, p.M // p.G * 2)
    if target_name == "gfx950":
        fly = [t for t in templates if t.backend == "flydsl"]
        for t in fly:  # generic: whatever FlyDSL registers for the op is planned or refused
            assert any(k.template is t for k in kernels) or any(r["template"] == t.id for r in refused)


def test_one_grouped_kernel_builds_per_target_with_its_mma(captured, tmp_path):
    """Two Triton compiles: the down projection's grouped kernel for gfx950 (MFMA) and
    sm_90a (warp-level mma.sync for a 16-row tile)."""
    p = next(p for p in _grouped(captured) if p.K == QWEN["expert_down_proj"]["K"])
    cap = [c for c in captured if c.problem == p]
    kernels, _ = aot.plan(cap, [get_target("gfx950"), get_target("sm_90a")])
    chosen = [k for k in kernels if k.template.id == "triton.grouped_gemm"]
    assert len(chosen) == 2
    results = {r.name: r for r in compile_jobs([k.job for k in chosen], tmp_path, workers=2, timeout_s=600)}
    from tilewright.runtime.verify import verify

    for k in chosen:
        r = results[k.name]
        assert r.ok, r.error[-2000:]
        checks = k.template.expected_instructions(p, k.params, k.target)
        assert checks, k.target.name
        v = verify({stage: tmp_path / rel for stage, rel in r.artifacts.items()}, checks)
        assert v.ok, v.failures
        assert all(n > 0 for n in v.counts.values())


# -- the MXFP4 variant: dense projections as MXFP4Linear -------------------------------------------
MX_SPEC = "tilewright.demo.models:qwen3_moe_shapes_mxfp4"


@pytest.fixture(scope="module")
def captured_mx():
    return capture_kernels(load_model(MX_SPEC))


def _mx(captured_mx) -> list[GemmProblem]:
    return [c.problem for c in captured_mx if isinstance(c.problem, GemmProblem)]


def test_mxfp4_variant_plans_flydsl_mx_gemm_for_the_dense_projections(captured_mx):
    from tilewright.templates.flydsl.runtime import toolchain_problem

    dense = _mx(captured_mx)
    assert sorted((p.M, p.N, p.K) for p in dense) == sorted((TOKENS, QWEN[p]["N"], QWEN[p]["K"])
                                                            for p in ("qkv_proj", "o_proj"))
    for p in dense:  # activations quantised per call, weights stored (N, K/2): one MX GEMM each
        assert (p.dtype, p.out_dtype, p.layout_a, p.layout_b, p.scale_layout, p.op) == \
            ("mxfp4", "bf16", "row", "col", "row", "mx_mm")
        assert p.epilogue == ()  # no bias, no alpha: MX needs no per-tensor scale
    assert len(_grouped(captured_mx)) == 2  # the experts stay bf16 grouped GEMMs
    kernels, refused = aot.plan(captured_mx, [get_target("gfx950")])
    why = toolchain_problem()
    for p in dense:
        planned = [k for k in kernels if k.captured.problem == p]
        if why is not None:  # refused, and the reason names the fix
            assert not planned and any(r["template"] == "flydsl.mx_gemm" and why in r["reason"] for r in refused)
            continue
        # FlyDSL's scaled-MFMA GEMM, beside the Triton kernels that dequantise MX in their
        # prologue (the MX path of every Triton target since block-scaled scaled_mm)
        ids = [k.template.id for k in planned]
        assert ids.count("flydsl.mx_gemm") == 1 and set(ids) <= {"flydsl.mx_gemm", "triton.gemm_nvfp4"}, refused
        k = next(k for k in planned if k.template.id == "flydsl.mx_gemm")
        assert k.name.startswith(f"gfx950/mx_mm_{p.M}x{p.N}x{p.K}_mxfp4_") and k.job.spec["language"] == "flydsl"
        assert p.K % k.params["BLOCK_K"] == 0 and k.predicted_ms > 0


def test_one_mxfp4_projection_builds_with_the_scaled_mfma(captured_mx, tmp_path):
    """One FlyDSL compile (~6-12 s): o_proj's MX GEMM for gfx950, checked for the FP4 scaled
    MFMA, LDS traffic and no spills, and its measured resources against the template's model."""
    from tilewright.templates.flydsl.runtime import toolchain_problem
    from tilewright.runtime.verify import verify
    from tilewright.templates.flydsl.mx_gemm import geometry

    if (why := toolchain_problem()) is not None:
        pytest.skip(f"FlyDSL toolchain missing ({why}); run `make flydsl-setup`")
    p = next(p for p in _mx(captured_mx) if p.K == QWEN["o_proj"]["K"])
    kernels, refused = aot.plan([c for c in captured_mx if c.problem == p], [get_target("gfx950")])
    (k,) = [k for k in kernels if k.template.id == "flydsl.mx_gemm"]
    (r,) = compile_jobs([k.job], tmp_path, workers=1, timeout_s=600)
    assert r.ok, r.error[-2000:]
    checks = k.template.expected_instructions(p, k.params, k.target)
    v = verify({stage: tmp_path / rel for stage, rel in r.artifacts.items()}, checks)
    assert v.ok, v.failures
    g = geometry(p, k.params)
    (mfma,) = [n for pat, n in v.counts.items() if pat.startswith("v_mfma_scale_f32_16x16x128_f8f6f4")]
    assert "cbsz:4" in next(pat for pat in v.counts if pat.startswith("v_mfma_scale"))  # FP4 operands
    assert mfma >= g.tm * g.tn * g.ksteps  # at least one K tile's worth of scaled MFMAs
    assert r.metadata["lds_bytes"] == g.lds_B and r.metadata["scratch_bytes"] == 0
    assert 0 < r.metadata["vgprs"] <= 256 and r.metadata["agprs"] == 0


@pytest.mark.slow
def test_cli_builds_flydsl_dense_grouped_and_mxfp4_kernels_for_gfx950(tmp_path):
    """``tilewright aot`` for gfx950 on the Qwen3-MoE shapes, bf16 and MXFP4 variants (issue 11's
    done-when): FlyDSL dense (``flydsl.gemm``), grouped (``flydsl.grouped_gemm``) and MXFP4
    (``flydsl.mx_gemm``) kernels are all built and keep their instruction promises."""
    from tilewright.templates.flydsl.runtime import toolchain_problem

    if (why := toolchain_problem()) is not None:
        pytest.skip(f"FlyDSL toolchain missing ({why}); run `make flydsl-setup`")
    built: dict[str, set[str]] = {}
    out = tmp_path / "aot"  # one folder: the variants' expert GEMMs are the same kernels, built once
    for spec in (SPEC, MX_SPEC):
        proc = subprocess.run([sys.executable, "-m", "tilewright", "aot", spec, "--target", "gfx950",
                               "--out", str(out)], capture_output=True, text=True, timeout=3000)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        manifest = json.loads((out / "manifest.json").read_text())
        kinds = manifest["summary"]["by_kind"]
        assert kinds.get("grouped_gemm", 0) >= 2 and kinds.get("gemm", 0) >= 2, kinds
        for k in manifest["kernels"]:
            assert k["status"] in ("built", "cached"), (k["name"], k["error"][-1000:])
            assert k["verify"] and k["verify"]["ok"], (k["name"], k["verify"])
            built.setdefault(k["template"], set()).add(spec)
    assert built.get("flydsl.gemm") == {SPEC}
    assert built.get("flydsl.grouped_gemm") == {SPEC, MX_SPEC}
    assert built.get("flydsl.mx_gemm") == {MX_SPEC}


@pytest.mark.skipif(importlib.util.find_spec("flydsl") is None,
                    reason="flydsl is not installed: these refusals are the ones past the package")
def test_problems_without_a_kernel_are_reported_with_every_reason(captured_mx, tmp_path, monkeypatch):
    # no FlyDSL toolchain and no Triton MX kernel: nothing builds the MX projections for gfx950;
    # the report says which problems are left to ATen there and why, template by template (the
    # CLI prints it)
    from tilewright.templates import get_template

    monkeypatch.setenv("TILEWRIGHT_FLYDSL_ROCM", str(tmp_path / "nothing"))
    gfx950 = get_target("gfx950")
    mx = [c for c in captured_mx if isinstance(c.problem, GemmProblem)]
    kernels, refused = aot.plan(mx, [gfx950])
    # without FlyDSL the Triton kernel that dequantises MX in its prologue still covers them
    assert kernels and {k.template.id for k in kernels} == {"triton.gemm_nvfp4"}
    assert {k.captured.problem for k in kernels} == {c.problem for c in mx}
    monkeypatch.setattr(get_template("triton.gemm_nvfp4"), "check",
                        lambda params, problem, target: "switched off by this test")
    kernels, refused = aot.plan(mx, [gfx950])
    report = aot.AotReport(tmp_path, "mx", [gfx950], kernels, refused)
    assert not kernels and len(report.uncovered) == len(mx) == 2
    for r in report.uncovered:
        assert "make flydsl-setup" in r["reasons"]["flydsl.mx_gemm"] and "triton.gemm" in r["reasons"]
    assert report.manifest()["summary"]["uncovered"] == 2
