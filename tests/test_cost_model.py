"""The analytic cost model: compute-bound shapes ranked by predicted time, decode shapes
memory-bound, figures consistent with the roofline, and shown by ``tilewright explain``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tilewright.autotune.cost_model import estimate_gemm, roofline_ms
from tilewright.autotune.policy import policy_for
from tilewright.problem import GemmProblem
from tilewright.runtime.targets import get_target, triton_can_target

TARGETS = ["cuda:sm_90a", "cuda:sm_100a", "hip:gfx950", "hip:gfx1250"]


def kernel_target(name: str):
    """The target, or a skip where the installed triton offers no kernels for it (only ATen)."""
    target = get_target(name)
    if why := triton_can_target(target):
        pytest.skip(why)
    return target


@pytest.mark.parametrize("target_name", TARGETS)
def test_compute_bound_shape(target_name):
    target = kernel_target(target_name)
    p = GemmProblem(M=8192, N=8192, K=8192, dtype="bf16", layout_b="col")
    cands = policy_for("gemm", target).candidates(p, target)[1:]
    preds = [c.predicted_ms for c in cands]
    assert preds == sorted(preds)
    best = estimate_gemm(p, cands[0].param_dict, target)
    assert best.bound == "compute"
    # within 2x of the roofline, never below it
    assert roofline_ms(p, target) <= best.ms <= 2 * roofline_ms(p, target)


@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("M", [1, 2, 4, 8, 16])
def test_decode_is_memory_bound(target_name, M):
    target = kernel_target(target_name)
    p = GemmProblem(M=M, N=28672, K=4096, dtype="bf16", layout_b="col")  # Llama-3-8B gate_up
    best = policy_for("gemm", target).candidates(p, target)[1]
    est = estimate_gemm(p, best.param_dict, target)
    assert est.bound == "memory"
    weights_ms = p.N * p.K * 2 / (target.hbm_gbps * 1e9) * 1e3
    assert weights_ms <= est.memory_ms <= 1.5 * weights_ms


def test_bigger_tiles_cost_less_on_a_big_problem():
    target = get_target("cuda:sm_90a")
    p = GemmProblem(M=4096, N=4096, K=4096, dtype="bf16")
    small = estimate_gemm(p, {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}, target)
    large = estimate_gemm(p, {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}, target)
    assert large.ms < small.ms


def test_wave_quantisation_shows():
    target = get_target("cuda:sm_90a")  # 132 SMs
    fits = GemmProblem(M=128 * 132, N=128, K=4096, dtype="bf16")
    spills = GemmProblem(M=128 * 133, N=128, K=4096, dtype="bf16")
    tile = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}
    a, b = estimate_gemm(fits, tile, target), estimate_gemm(spills, tile, target)
    assert b.compute_ms > 1.9 * a.compute_ms  # one extra tile costs a whole wave


def test_explain_prints_prediction_and_bound():
    out = subprocess.run([sys.executable, "-m", "tilewright", "explain", "1", "4096", "4096",
                          "--dtype", "bf16", "--target", "h200"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "memory" in out.stdout and "roofline" in out.stdout and "winner" in out.stdout
