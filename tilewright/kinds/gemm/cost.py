"""The GEMM kind's analytic cost model: predicted time of a tiled kernel on a target, with
nothing run.

For GPUs it is a roofline with tile and wave effects:

* compute: every launched tile does BLOCK_M x BLOCK_N x K multiply-adds (padding included, the
  *tile efficiency* loss), at the target's dense peak scaled by how well a tile that size feeds
  the tensor cores; tiles run in waves over the SMs/CUs, and a partly filled last wave costs a
  full one (*wave quantisation*);
* memory: each wave of tiles (GROUP_M rows of tiles wide with the swizzle) reads its A and B
  panels from DRAM once, the rest of its reuse hits L2; plus the output and epilogue inputs;
* the kernel takes the larger of the two, plus a fixed launch latency.

For the ``cpu`` target (Triton interpreter) the cost is Python overhead per main-loop step, so
the model counts steps; the constants were measured on this project's 2-core CI machine.

It moved here from :mod:`tilewright.autotune.cost_model` (issue 30: the autotuner names no
kind), whose :class:`~tilewright.autotune.cost_model.CostEstimate`, launch latency and
interpreter constants it shares.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from tilewright.autotune.cost_model import INTERP_MAC_MS, INTERP_STEP_MS, LAUNCH_US, CostEstimate
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.targets import Target


def _mma_efficiency(bm: int, bn: int, bk: int, num_warps: int) -> float:
    """Fraction of peak a tile shape sustains: small tiles cannot hide load latency or keep the
    tensor cores fed. 128x128x64 and larger reach ~0.8 of peak in practice."""
    area = min(bm * bn, 128 * 256) / (128 * 256)
    depth = min(bk, 64) / 64
    return 0.8 * (0.35 + 0.65 * math.sqrt(area)) * (0.7 + 0.3 * depth)


def estimate_gemm(problem: GemmProblem, params: Mapping[str, Any], target: Target, *,
                  efficiency: float = 1.0, register_pressure: float = 1.0) -> CostEstimate:
    """Predicted time of a tiled GEMM with ``params`` (BLOCK_M/N/K, num_warps, SPLIT_K) on
    ``target``. ``params`` without tile sizes get a 128x128x64 tile. ``efficiency`` is the
    template's relative tensor-core efficiency (TMA/TDM pipelines > 1); the sustained rate
    stays below 95% of peak whatever it says. ``register_pressure`` (the template's
    ``register_pressure``: >= 1 for tiles near or over the register budget, calibrated on AOT
    builds) stretches the kernel's compute and memory time: fewer resident programs hide less
    latency, and spills add local-memory traffic."""
    if params.get("SWAP_AB"):
        problem = problem.transposed()  # the kernel computes C^T = B^T A^T
    bm = params.get("BLOCK_M", 128)
    bn = params.get("BLOCK_N", 128)
    bk = params.get("BLOCK_K", 64)
    split_k = params.get("SPLIT_K", 1)
    tiles_m = math.ceil(problem.M / bm) if problem.M else 0
    tiles_n = math.ceil(problem.N / bn) if problem.N else 0
    tiles = problem.batch * tiles_m * tiles_n * split_k
    padded = problem.batch * tiles_m * bm * tiles_n * bn
    tile_eff = (problem.batch * problem.M * problem.N / padded) if padded else 1.0

    if target.interpreted:
        steps = tiles * max(1, math.ceil(problem.K / split_k / bk))
        ms = steps * (INTERP_STEP_MS + INTERP_MAC_MS * bm * bn * bk) + tiles * 0.5
        return CostEstimate(ms, ms, 0.0, "compute", float(tiles), tile_eff)

    eb = ELEMENT_BYTES[problem.dtype]
    peak = target.peak(problem.dtype) * 1e12  # FLOP/s
    eff = min(_mma_efficiency(bm, bn, bk, params.get("num_warps", 4)) * efficiency, 0.95)
    if bm < 64 and (target.has("wgmma") or target.has("tcgen05")):
        eff *= 0.5  # below 64 rows the warpgroup MMA is out of reach: mma.sync at ~half rate
    per_sm = peak / target.num_sms * eff
    flops_per_tile = 2.0 * bm * bn * math.ceil(problem.K / split_k)
    waves = tiles / target.num_sms if target.num_sms else tiles
    compute_s = math.ceil(waves) * flops_per_tile / per_sm if tiles else 0.0

    # DRAM traffic: the tiles of one wave (num_sms of them, GROUP_M rows of tiles by
    # num_sms / GROUP_M columns with the swizzle) fetch their A and B panels once; panels
    # shared inside the wave come from L2. The wave walks K in step, so what L2 must hold at a
    # time is one K slice of those panels, never the whole K: long K does not spill.
    group = params.get("GROUP_M", 8)
    rows = max(1, min(group, tiles_m))
    cols = max(1, min(math.ceil(target.num_sms / rows), tiles_n))
    waves_total = math.ceil(tiles / (rows * cols)) if tiles else 0
    panel = (rows * bm + cols * bn) * math.ceil(problem.K / split_k) * eb
    operands = waves_total * panel
    operands = max(operands, problem.batch * (problem.M * problem.K + problem.K * problem.N) * eb)
    out_and_epilogue = problem.min_bytes - problem.batch * (problem.M * problem.K + problem.K * problem.N) * eb
    out_extra = (split_k - 1) * problem.batch * problem.M * problem.N * 4 * 2  # fp32 partials
    # few programs cannot pull full bandwidth: about half the SMs busy are needed to saturate
    # HBM (the reason split-K helps decode GEMMs)
    busy = min(tiles, target.num_sms) / max(target.num_sms * 0.5, 1)
    bandwidth = target.hbm_gbps * 1e9 * min(1.0, busy)
    memory_s = (operands + out_and_epilogue + out_extra) / bandwidth

    compute_s *= register_pressure
    memory_s *= register_pressure
    ms = max(compute_s, memory_s) * 1e3 + LAUNCH_US * 1e-3 * (2 if split_k > 1 else 1)
    if max(compute_s, memory_s) * 1e3 < LAUNCH_US * 1e-3:
        bound = "latency"
    else:
        bound = "compute" if compute_s >= memory_s else "memory"
    return CostEstimate(ms, compute_s * 1e3, memory_s * 1e3, bound, waves, tile_eff)


def roofline_ms(problem: GemmProblem, target: Target) -> float:
    """The floor no kernel beats: max(FLOPs / peak, minimum bytes / bandwidth), ms."""
    compute = problem.flops / (target.peak(problem.dtype) * 1e12)
    memory = problem.min_bytes / (target.hbm_gbps * 1e9)
    return max(compute, memory) * 1e3
