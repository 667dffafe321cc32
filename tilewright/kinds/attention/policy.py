"""Candidates for an attention problem: ATen first, then the Triton attention templates' tiles,
ranked by a roofline of the attention's own shape.

Prefill (many query rows) goes to ``triton.attention``; decode-shaped problems (GROUP x Sq query
rows per KV head at most 128) also to ``triton.attention_decode``, whose key split fills the
machine when ``B x H`` programs would not; the estimate decides between them. Each template proposes its seed tiles (BLOCK_M, BLOCK_N,
warps, stages, the split; with ``DESC`` where the target moves tiles with TMA/TDM), its
``check`` refuses those that exceed the target's shared memory/LDS or registers before
anything compiles, and :func:`estimate` ranks the rest. As for the other kinds, interpreted
kernels are proposed only when a backend is forced (they can only lose to ATen on a CPU), and
then one tile per template. Templates compiled for the CPU (``cpp.attention``: C++, not
interpreted Triton) are offered there under ``auto`` too, their first seeds in their own order
(the interpreter's estimate says nothing of them), and timed against ATen like every
candidate: they run only where they win.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tilewright.autotune.cost_model import INTERP_MAC_MS, INTERP_STEP_MS, LAUNCH_US, CostEstimate
from tilewright.autotune.policy_base import CandidatePolicy
from tilewright.kinds.attention.problem import AttentionProblem
from tilewright.kinds.loop.policy import offered_on
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec

# tiles moved by TMA/TDM free the warps from address math: a prior (as triton.gemm_tma's and
# the grouped descriptor template's 1.15) until a device measures it
DESC_EFFICIENCY = 1.15
CPU_SEEDS = 2  # compiled CPU candidates (cpp.attention) timed per problem: each is a build


def estimate(problem: AttentionProblem, params: dict[str, Any], target: Target, *,
             efficiency: float = 1.0) -> CostEstimate:
    """Predicted time (ms) of an attention kernel with ``params``: the larger of the tensor-core
    time of every launched (query tile, key tile) pair, padding included, at a fraction of peak
    that grows with the tile, and of Q/K/V/out crossing DRAM (K and V once per query tile, the
    L2 catching the reuse within a wave), with wave quantisation over the SMs; a decode split
    multiplies the programs and adds its combine pass. Under the interpreter: Python per key
    step plus numpy per multiply-add. An estimate for ranking tiles, not a measurement."""
    bm, bn = int(params.get("BLOCK_M", 64)), int(params.get("BLOCK_N", 64))
    split = int(params.get("SPLIT", 1))
    decode = "SPLIT" in params
    rows = problem.group * problem.Sq if decode else problem.Sq
    heads = problem.H_kv if decode else problem.H
    m_tiles = math.ceil(max(rows, 1) / bm)
    n_tiles = math.ceil(max(problem.Skv, 1) / bn)
    programs = m_tiles * problem.B * heads * split
    steps = m_tiles * n_tiles * problem.B * heads * problem.density
    d = problem.D + problem.Dv
    macs = steps * bm * bn * d * (2.5 if problem.direction == "backward" else 1)
    if target.interpreted:
        ms = steps * INTERP_STEP_MS + macs * INTERP_MAC_MS
        return CostEstimate(ms, ms, 0.0, "latency", float(programs), 1.0)
    peak = target.peak(problem.dtype) if problem.dtype != "fp32" else target.peak("fp32")
    area = min(bm * bn, 128 * 128) / (128 * 128)
    engine = bool(params.get("DESC")) and (target.has("tma") or target.has("tdm"))
    if engine:
        efficiency *= DESC_EFFICIENCY
    mma = 0.7 * (0.35 + 0.65 * math.sqrt(area)) * efficiency
    compute_ms = 2 * macs / (peak * 1e9 * mma) if peak else 0.0
    resident = max(1, target.num_sms)
    waves = programs / resident
    compute_ms *= math.ceil(waves) / max(waves, 1e-9) if waves > 1 else 1 / max(waves, 1e-9) ** 0.5
    e = 2 if problem.dtype != "fp32" else 4
    kv_bytes = problem.B * problem.H_kv * problem.Skv * d * e * problem.density
    reread = max(1.0, m_tiles * (heads / problem.H_kv if not decode else 1) / max(1.0, math.ceil(waves)))
    memory_bytes = problem.min_bytes + kv_bytes * (reread - 1)
    if decode:
        memory_bytes += problem.B * problem.H * problem.Sq * split * (problem.Dv + 2) * 4 * 2
    memory_ms = memory_bytes / (target.hbm_gbps * 1e6) if target.hbm_gbps else 0.0
    if engine:  # the loop kernels' descriptor credit (kinds/loop/cost.estimate_loop): 1.1x bandwidth
        memory_ms /= 1.1
    launches = (2 if decode else 1) + (2 if problem.direction == "backward" else 0)
    ms = max(compute_ms, memory_ms) + launches * LAUNCH_US / 1000
    bound = "compute" if compute_ms >= memory_ms else "memory"
    return CostEstimate(ms, compute_ms, memory_ms, bound, waves, 1.0)


def roofline_ms(problem: AttentionProblem, target: Target) -> float:
    """max(bytes / bandwidth, FLOPs / peak) in ms (0 when the target has no figures)."""
    bw = target.hbm_gbps or 0
    tflops = target.peak(problem.dtype) if target.peak_tflops else 0
    return max(problem.min_bytes / (bw * 1e6) if bw else 0.0, problem.flops / (tflops * 1e9) if tflops else 0.0)


@dataclass(frozen=True)
class AttentionPolicy(CandidatePolicy):
    """The shared skeleton (:class:`~tilewright.autotune.policy_base.CandidatePolicy`) with
    ATen predicted at its roofline over 0.5, the templates' seed tiles ranked by
    :func:`estimate`, one tile per template when interpreted kernels are forced."""

    max_candidates: int = 4

    def aten_ms(self, problem: AttentionProblem, target: Target) -> float | None:
        base = roofline_ms(problem, target)
        return base / 0.5 if base else None

    def estimate(self, problem: AttentionProblem, params: dict[str, Any], target: Target,
                 template: TemplateSpec) -> float:
        return estimate(problem, params, target, efficiency=template.efficiency(target)).ms

    interpreted_aten_only = False  # offered_on decides, per template

    def offers(self, template: TemplateSpec, problem: AttentionProblem, target: Target) -> bool:
        """On the CPU under ``auto``, compiled templates only (``cpp.attention``)."""
        return offered_on(template, target) and super().offers(template, problem, target)

    def options(self, problem: AttentionProblem, target: Target, template: TemplateSpec) -> list:
        if target.interpreted and getattr(template, "compiled_on_cpu", False):
            # its own seeds in its order (decode's packed task first where it fits), ahead of
            # any interpreted kernel: the interpreter's estimate says nothing of compiled C++
            return [(0.0, p) for p in self.legal(problem, target, template)[:CPU_SEEDS]]
        ranked = self.ranked(problem, target, template)
        return ranked[:1] if target.interpreted else ranked
