"""The decode policy for block-scaled GEMMs: swap-AB and split-K in the NVFP4 Triton templates
(proven in the interpreter through the dequantise-in-prologue path, whose E4M3 scales the
interpreter reads correctly, and AOT-checked on sm_100a's block-scaled tcgen05), the bounded
candidate list up to M = 128 on Blackwell, nvMatmulHeuristics' fp4 answers, cold-cache timing
(weights and scales rotated), and the NVFP4 decode bench suites."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from tilewright.autotune.decode import BLOCKSCALED_TILES, blockscaled_variants, decode_limit
from tilewright.autotune.evaluate import input_set_count
from tilewright.autotune.inputs import make_inputs
from tilewright.autotune.policy import policy_for
from tilewright.perf.suites import nvfp4_problem, suite_problems
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.quant import nvfp4
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

SM100, SM90, CPU = get_target("cuda:sm_100a"), get_target("cuda:sm_90a"), get_target("cpu")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def decode_problem(M: int, N: int = 4096, K: int = 4096) -> GemmProblem:
    return nvfp4_problem(GemmProblem(M, N, K, "bf16", layout_b="col"))


# -- numerics in the interpreter -------------------------------------------------------------------
@pytest.mark.parametrize("M,split,swap", [(1, 1, True), (3, 2, True), (5, 4, False), (16, 2, True), (17, 4, False)])
def test_nvfp4_swap_ab_and_split_k_match_float64(M, split, swap):
    N, K = 80, 192
    a, b = nvfp4.quantize(torch.randn(M, K)), nvfp4.quantize(torch.randn(N, K) * 3)
    bias, res = torch.randn(N), torch.randn(M, N)
    ops = (EpilogueOp("mul", input=0), EpilogueOp("mul", input=1), EpilogueOp("add", input=2),
           EpilogueOp("gelu"), EpilogueOp("add", input=3))
    inputs = (EpilogueInput("", "fp32"), EpilogueInput("", "fp32"), EpilogueInput("N", "fp32"),
              EpilogueInput("MN", "fp32"))
    prob = GemmProblem(M=M, N=N, K=K, dtype="nvfp4", out_dtype="fp32", layout_b="col", scale_layout="row",
                       epilogue=ops, epilogue_inputs=inputs)
    t = get_template("triton.gemm_nvfp4")
    params = t.space.complete({"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4,
                               "num_stages": 2, "SPLIT_K": split, "SWAP_AB": swap})
    assert t.check(params, prob, CPU) is None
    launch = load_module(t.render(prob, params, CPU).source, name="nvfp4_decode", interpret=True).launch
    out = torch.full((M, N), float("nan"))
    launch(a.data, b.data, a.global_scale.expand(M, N), b.global_scale.expand(M, N),
           bias.expand(M, N), res, out=out, a_scale=a.scale, b_scale=b.scale)
    ref = F.gelu(nvfp4.reference_mm(a, b).double() + bias.double()) + res.double()
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-5


def test_split_k_refuses_a_k_too_short():
    t = get_template("triton.gemm_nvfp4")
    prob = decode_problem(4, 256, 64)
    assert "too short" in t.check(t.space.complete({"SPLIT_K": 4, "BLOCK_K": 64}), prob, CPU)


# -- ahead of time: the block-scaled MMA with swap-AB and split-K -------------------------------------
@pytest.mark.slow
def test_swap_ab_and_split_k_keep_the_block_scaled_tcgen05(tmp_path):
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.verify import verify

    t = get_template("triton.gemm_nvfp4_mma")
    prob = decode_problem(8)
    if not t.supports(prob, SM100):
        pytest.skip(t.supports(prob, SM100).reason)
    settings = [{"BLOCK_N": 16, "SWAP_AB": True}, {"BLOCK_N": 32, "SWAP_AB": True, "SPLIT_K": 4}]
    jobs = []
    for i, s in enumerate(settings):
        params = t.space.complete({"BLOCK_K": 256, **s})
        assert t.check(params, prob, SM100) is None
        r = t.render(prob, params, SM100)
        jobs.append((CompileJob(f"mma{i}", r.source, r.aot.to_json(), SM100.triton), params))
    for (job, params), res in zip(jobs, compile_jobs([j for j, _ in jobs], tmp_path)):
        assert res.ok, res.error[-500:]
        arts = {k: tmp_path / v for k, v in res.artifacts.items()}
        v = verify(arts, t.expected_instructions(prob, params, SM100))
        assert v.ok, v.failures
        assert re.search(r"tcgen05\.mma\S*kind::mxf4nvf4\.block_scale\.block16", arts["ptx"].read_text())


# -- the policy ------------------------------------------------------------------------------------------
def test_block_scaled_decode_reaches_m_128_on_blackwell_only():
    assert decode_limit(decode_problem(128), SM100) == 128
    assert decode_limit(decode_problem(128), SM90) == 64
    assert decode_limit(GemmProblem(128, 4096, 4096, "bf16"), SM100) == 64


@pytest.mark.parametrize("M", [1, 8, 16, 64, 128])
def test_block_scaled_decode_list_is_bounded_with_both_orientations(M):
    knobs = set(get_template("triton.gemm_nvfp4_mma").space.names())
    variants = blockscaled_variants(decode_problem(M), SM100, knobs)
    assert len(variants) <= 4 * len(BLOCKSCALED_TILES)
    swapped = [v for v in variants if v["SWAP_AB"]]
    assert bool(swapped) == (M <= 4096 // 4)
    assert all(v["BLOCK_N"] == min(max(16, 1 << (M - 1).bit_length()), 64) for v in swapped)
    if M <= 16:  # a few tokens against a 4096x4096 weight: too few tiles to fill 148 SMs
        assert any(v["SPLIT_K"] > 1 for v in variants)


@pytest.mark.parametrize("M", [1, 16, 96])
def test_blackwell_candidates_hold_swap_ab_and_split_k_block_scaled_kernels(M):
    problem = decode_problem(M)
    templates = [get_template("triton.gemm_nvfp4"), get_template("triton.gemm_nvfp4_mma")]
    policy = policy_for("gemm", SM100)
    for t in templates:
        if not t.supports(problem, SM100):
            continue
        ranked = policy.ranked(problem, SM100, t)
        assert any(p["SWAP_AB"] for _, p in ranked), t.id
        if M <= 16:
            assert any(p["SPLIT_K"] > 1 for _, p in ranked), t.id
    cands = policy.candidates(problem, SM100, [t for t in templates if t.supports(problem, SM100)])
    assert any(c.param_dict.get("SWAP_AB") for c in cands)


def test_heuristics_answer_for_nvfp4_in_both_orientations():
    from tilewright.autotune import heuristics

    assert heuristics.precision_of(decode_problem(8)) == "OOTST"
    assert heuristics.precision_of(GemmProblem(8, 64, 64, "bf16")) == "TST"  # not "BSB" (uint8)
    if not heuristics.available():
        pytest.skip("nvidia-matmul-heuristics is not installed")
    got = heuristics.heuristic_params(decode_problem(8), SM100)
    assert got and {p["SWAP_AB"] for p in got} == {False, True}
    assert all(p["BLOCK_M"] > 0 and p["BLOCK_N"] > 0 for p in got)
    assert heuristics.heuristic_params(decode_problem(8), SM90)  # H200's model answers too


# -- cold-cache timing ------------------------------------------------------------------------------------
def test_decode_timing_rotates_weights_and_scales():
    problem = decode_problem(8, 2048, 2048)
    assert input_set_count(problem, "cuda:sm_100a") >= 2
    sets = [make_inputs(problem, "cpu", seed) for seed in range(2)]
    assert not torch.equal(sets[0].b, sets[1].b)
    s0, s1 = sets[0].scale_kwargs, sets[1].scale_kwargs
    assert set(s0) == {"a_scale", "b_scale"}
    assert not torch.equal(s0["b_scale"].view(torch.uint8), s1["b_scale"].view(torch.uint8))


# -- the suites -----------------------------------------------------------------------------------------------
def test_nvfp4_decode_suites():
    full = suite_problems("nvfp4-decode")
    assert {p.problem.M for p in full} == {1, 2, 4, 8, 16, 32, 64}
    assert {p.name.split(".")[1] for p in full} == {"llama-3-8b", "qwen3-30b-a3b"}
    assert all(p.problem.dtype == "nvfp4" and p.problem.scale_layout == "row" and not p.problem.batched
               and [op.kind for op in p.problem.epilogue] == ["mul", "mul"] for p in full)
    check = suite_problems("nvfp4-check")
    assert {p.problem.M for p in check} == {1, 16, 64} and not any("lm_head" in p.name for p in check)


def test_bench_runs_block_scaled_problems_with_their_scales(tmp_path):
    from tilewright.autotune.shapes import NamedProblem
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.perf.run import run_suite

    problems = [NamedProblem("nvfp4.tiny.M4", decode_problem(4, 64, 64))]
    doc = run_suite("nvfp4-tiny", problems, CPU, default_factory, out=tmp_path / "b.json")
    (row,) = doc["results"]
    assert "error" not in row, row
    for impl in ("tilewright", "aten"):  # without their scales the launchers would refuse to run
        assert row["impls"][impl]["rel_err"] < 8e-3, row["impls"]  # bf16 out: ~2^-8 relative
