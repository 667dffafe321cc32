"""The Triton dequantise-in-prologue block-scaled template (``triton.gemm_nvfp4``) on MX operands:
MXFP4 (packed E2M1) and MXFP8 (E4M3) with E8M0 scales per 32, in the interpreter against float64
with a NaN-poisoned output (ragged M and N, split-K, swap-AB, the epilogue), and built ahead of
time for sm_90a and gfx950 (its MMA: wgmma, v_mfma)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err

from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.quant import mx
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

CPU = get_target("cpu")


def mx_problem(fmt: str, M: int, N: int, K: int) -> GemmProblem:
    return GemmProblem(M=M, N=N, K=K, dtype=fmt, out_dtype="fp32", layout_b="col", scale_layout="row",
                       epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu")),
                       epilogue_inputs=(EpilogueInput("N", "fp32"),), op="mx_mm")


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("M,split,swap,block_k", [(37, 1, False, 64), (5, 2, True, 32), (17, 4, False, 32)])
def test_mx_dequant_template_matches_float64(fmt, M, split, swap, block_k):
    N, K = 72, 256
    g = torch.Generator().manual_seed(M * 7 + split)
    # magnitudes spread over octaves so the blocks get different E8M0 scales
    spread = torch.exp2(torch.randint(-5, 6, (1, K // 32), generator=g).float()).repeat_interleave(32, -1)
    a, b = mx.quantize(torch.randn(M, K, generator=g) * spread, fmt), mx.quantize(torch.randn(N, K, generator=g), fmt)
    bias = torch.randn(N, generator=g)
    prob = mx_problem(fmt, M, N, K)
    t = get_template("triton.gemm_nvfp4")
    assert t.supports(prob, CPU).ok
    params = t.space.complete({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": block_k, "GROUP_M": 4,
                               "num_warps": 4, "num_stages": 2, "SPLIT_K": split, "SWAP_AB": swap})
    assert t.check(params, prob, CPU) is None
    launch = load_module(t.render(prob, params, CPU).source, name=f"mx_{fmt}", interpret=True).launch
    out = torch.full((M, N), float("nan"))
    launch(a.data, b.data, bias.expand(M, N), out=out, a_scale=a.scale, b_scale=b.scale)
    ref = F.gelu(a.dequantize(torch.float64) @ b.dequantize(torch.float64).t() + bias.double())
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-5, rel_err(out, ref)


def test_the_block_scaled_mma_twin_stays_nvfp4_only():
    why = get_template("triton.gemm_nvfp4_mma").supports(mx_problem("mxfp8", 128, 128, 256), get_target("sm_100a"))
    assert not why.ok and "NVFP4" in why.reason


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_mx_dequant_template_builds_for_sm90a_and_gfx950(tmp_path, fmt):
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.verify import verify

    t = get_template("triton.gemm_nvfp4")
    prob = mx_problem(fmt, 128, 256, 512)
    jobs = []
    for name in ("sm_90a", "gfx950"):
        target = get_target(name)
        params = t.space.complete({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4})
        assert t.check(params, prob, target) is None
        r = t.render(prob, params, target)
        jobs.append((target, params, CompileJob(f"{fmt}_{name}", r.source, r.aot.to_json(), target.triton)))
    for (target, params, _), res in zip(jobs, compile_jobs([j for *_, j in jobs], tmp_path)):
        assert res.ok, res.error[-500:]
        arts = {k: tmp_path / v for k, v in res.artifacts.items()}
        v = verify(arts, t.expected_instructions(prob, params, target))
        assert v.ok, (target.name, v.failures)


def test_device_check_times_mxfp8_rows(tmp_path):
    """bench/device_check.sh's block-scaled suite holds MXFP8 rows (what F.scaled_mm lowers to),
    and the bench runs one with its scales (tilewright's kernel and ATen's, both checked)."""
    import dataclasses

    from tilewright.autotune.shapes import NamedProblem
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.perf.run import run_suite
    from tilewright.perf.suites import mxfp8_problem, suite_problems

    mx_rows = [p for p in suite_problems("nvfp4-check") if p.problem.dtype == "mxfp8"]
    assert len(mx_rows) == 4 and {p.problem.M for p in mx_rows} == {16}
    tiny = mxfp8_problem(dataclasses.replace(mx_rows[0].problem, M=4, N=64, K=64))
    doc = run_suite("mx-tiny", [NamedProblem("mxfp8.tiny.M4", tiny)], CPU, default_factory, out=tmp_path / "b.json")
    (row,) = doc["results"]
    assert "error" not in row, row
    for impl in ("tilewright", "aten"):
        assert row["impls"][impl]["rel_err"] < 8e-3, row["impls"]


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_a_nan_scale_makes_its_rows_nan_and_no_others(fmt):
    """E8M0 byte 255 is NaN (OCP MX v1.0): the rows that read it are NaN, as the dequantised
    reference says; every other output is finite and right."""
    M, N, K = 9, 40, 128
    g = torch.Generator().manual_seed(11)
    a, b = mx.quantize(torch.randn(M, K, generator=g), fmt), mx.quantize(torch.randn(N, K, generator=g), fmt)
    a.scale.view(torch.uint8)[3, 2] = 255
    prob = mx_problem(fmt, M, N, K)
    t = get_template("triton.gemm_nvfp4")
    params = t.space.complete({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4})
    launch = load_module(t.render(prob, params, CPU).source, name=f"mx_nan_{fmt}", interpret=True).launch
    out = torch.zeros(M, N)
    launch(a.data, b.data, torch.zeros(N).expand(M, N), out=out, a_scale=a.scale, b_scale=b.scale)
    ref = F.gelu(a.dequantize(torch.float64) @ b.dequantize(torch.float64).t())
    assert out[3].isnan().all() and ref[3].isnan().all()
    keep = torch.arange(M) != 3
    assert torch.isfinite(out[keep]).all() and rel_err(out[keep], ref[keep]) < 1e-5
