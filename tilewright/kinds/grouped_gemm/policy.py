"""Candidates for a grouped GEMM: ATen (``torch._grouped_mm``) first (predicted at its roofline
over 0.8), then the grouped templates' own seed tiles, each predicted by its kernel's cost model
(:func:`estimate_for`: the tiled model, or the gemv model for decode-shaped gemv templates), which
is what a remote target chooses by.

Like the GEMM policy, interpreted kernels are proposed only when a backend is forced (they can
only lose to ATen on a CPU), and then one tile per template (timing the interpreter says nothing
about tiles). Templates take turns (each one's first seed, then each one's second, ...), so the
candidate budget reaches every template. A problem with a fused gated product
(``problem.glu``) goes only to templates that render it (``fuses_glu``: ATen and the Triton
ones); any other would drop the product. Every candidate is measured on the problem's
synthetic, even and aligned offsets (``problem.offsets``); the problem is bucketed on its
ragged total (the token count) by whoever builds it (``tilewright.kernels.grouped``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tilewright.autotune.cost_model import LAUNCH_US, CostEstimate
from tilewright.autotune.policy_base import CandidatePolicy
from tilewright.kinds.gemm.cost import estimate_gemm
from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec


def roofline_ms(problem: GroupedGemmProblem, target: Target) -> float:
    """max(bytes / bandwidth, FLOPs / peak) in ms, from the target's figures (0 when absent);
    the bytes leave out the weights of groups that cannot hold rows
    (:attr:`~tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem.active_groups`)."""
    bw = target.hbm_gbps or 0
    tflops = target.peak(problem.dtype) if target.peak_tflops else 0
    idle = (problem.G - problem.active_groups) * problem.K * problem.N * ELEMENT_BYTES[problem.dtype]
    t_mem = (problem.min_bytes - idle) / (bw * 1e6) if bw else 0.0
    t_math = problem.flops / (tflops * 1e9) if tflops else 0.0
    return max(t_mem, t_math)


def estimate(problem: GroupedGemmProblem, params: dict[str, Any], target: Target, *,
             efficiency: float = 1.0) -> CostEstimate:
    """Predicted time (ms) of a grouped GEMM on its synthetic even offsets: the dense cost model
    on equal GEMMs of one group's share of the ragged dim (a batched GEMM over the groups that
    hold rows, :attr:`~tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem.active_groups`), so each group's
    partial tile is paid for. An estimate for ranking tiles ahead of time (``tilewright aot``)
    and on remote targets, not a measurement."""
    gemm = problem.as_gemm()
    share = {d: getattr(problem, d) for d in "MNK"}
    groups = problem.active_groups
    if problem.ragged:
        share[problem.ragged] = max(1, share[problem.ragged] // groups)
    gemm = dataclasses.replace(gemm, M=share["M"], N=share["N"], K=share["K"], batch=groups, batched=True)
    return estimate_gemm(gemm, params, target, efficiency=efficiency)


# A gemv streams the weights straight from memory (lanes along K, no staging through shared
# memory, no padded rows), where a tiled kernel stages 8-row tiles between barriers: credited
# with this much more of the memory bandwidth on decode shapes. A prior, not a measurement:
# PyTorch reports 1.32-1.34x MoE decode tokens/s on an M3 Ultra from its grouped_mm gemv path;
# no Mac has measured tilewright's (see docs/metal.md).
GEMV_STREAM_EFFICIENCY = 1.3


def estimate_gemv(problem: GroupedGemmProblem, params: dict[str, Any], target: Target) -> CostEstimate:
    """Predicted time (ms) of a grouped gemv (templates with ``schedule == "gemv"``: one
    simdgroup/warp per output column, lanes along K, ``BLOCK_M`` rows per pass over the weights):
    the weights of the groups holding rows, read once per pass, plus the activations, the output
    and the epilogue inputs once, over the bandwidth the busy threadgroups draw
    (:data:`GEMV_STREAM_EFFICIENCY`); the multiply-adds at half the fp32 rate (no matrix units)."""
    groups = problem.active_groups
    rows = -(-problem.M // groups) if problem.ragged == "M" else problem.M
    passes = -(-rows // params.get("BLOCK_M", 8))
    eb = ELEMENT_BYTES[problem.dtype]
    weights = groups * problem.K * problem.N * eb * passes
    everything_else = problem.min_bytes - problem.G * problem.K * problem.N * eb
    threadgroups = groups * -(-problem.out_n // params.get("BLOCK_N", 4))
    busy = min(1.0, threadgroups / max(target.num_sms * 0.5, 1))
    bandwidth = (target.hbm_gbps or 1) * 1e9 * busy * GEMV_STREAM_EFFICIENCY
    memory_s = (weights + everything_else) / bandwidth
    compute_s = problem.flops / (target.peak("fp32") * 1e12 * 0.5) if target.peak_tflops else 0.0
    ms = max(compute_s, memory_s) * 1e3 + LAUNCH_US * 1e-3
    bound = "latency" if max(compute_s, memory_s) * 1e3 < LAUNCH_US * 1e-3 else \
        "compute" if compute_s >= memory_s else "memory"
    return CostEstimate(ms, compute_s * 1e3, memory_s * 1e3, bound, threadgroups / max(target.num_sms, 1), 1.0)


def estimate_for(template: TemplateSpec, problem: GroupedGemmProblem, params: dict[str, Any],
                 target: Target) -> CostEstimate:
    """The estimate of ``template``'s kernel: :func:`estimate_gemv` for gemv-shaped templates,
    :func:`estimate` for tiled ones."""
    if template.schedule == "gemv":
        return estimate_gemv(problem, params, target)
    return estimate(problem, params, target, efficiency=template.efficiency(target))


@dataclass(frozen=True)
class GroupedGemmPolicy(CandidatePolicy):
    """The shared skeleton (:class:`~tilewright.autotune.policy_base.CandidatePolicy`) with
    ATen predicted at its roofline over 0.8, a fused gated product offered only to templates
    that render it, and the templates taking turns (module docstring)."""

    max_candidates: int = 4

    def aten_ms(self, problem: GroupedGemmProblem, target: Target) -> float | None:
        base = roofline_ms(problem, target)
        return base / 0.8 if base else None

    def offers(self, template: TemplateSpec, problem: GroupedGemmProblem, target: Target) -> bool:
        return super().offers(template, problem, target) and not (problem.glu and not template.fuses_glu)

    def estimate(self, problem: GroupedGemmProblem, params: dict[str, Any], target: Target,
                 template: TemplateSpec) -> float:
        return estimate_for(template, problem, params, target).ms

    def ranked(self, problem: GroupedGemmProblem, target: Target, template: TemplateSpec
               ) -> list[tuple[float, dict[str, Any]]]:
        """(predicted ms, params) for one template, best first: its seed tiles that its
        ``check`` accepts, ranked by :func:`estimate_for` (what ``tilewright aot`` builds); none
        for a fused gated product the template does not render (``fuses_glu``)."""
        if problem.glu and not template.fuses_glu:
            return []
        return super().ranked(problem, target, template)

    def options(self, problem: GroupedGemmProblem, target: Target, template: TemplateSpec) -> list:
        """The template's legal seed tiles in its own order (the first alone when interpreted),
        each with its own estimate (what a remote target, with no device to measure on,
        chooses by, and what orders the table ``explain`` prints; None without target figures)."""
        seeds = list(self.proposals(problem, target, template))
        legal = self.legal(problem, target, template, seeds[:1] if target.interpreted else seeds)
        known = bool(roofline_ms(problem, target))
        return [(self.estimate(problem, p, target, template) if known else None, p) for p in legal]

    def choose(self, per_template: list, problem: GroupedGemmProblem, target: Target, budget: int) -> list:
        """Round-robin over the templates, each in its own seed order, so the budget measures
        every template's best guess before anyone's second."""
        out = []
        for i in range(max((len(options) for _, options in per_template), default=0)):
            out += [(options[i][0], t, options[i][1]) for t, options in per_template if i < len(options)]
        return out[:budget]
