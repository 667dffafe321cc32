"""Candidates for a grouped GEMM: ATen (``torch._grouped_mm``) first, then the grouped templates'
own seed tiles, ranked by a roofline over the problem's bytes and FLOPs.

Like the GEMM policy, interpreted kernels are proposed only when a backend is forced (they can
only lose to ATen on a CPU). Every candidate is measured on the problem's synthetic, even and
aligned offsets (``problem.offsets``); the problem is bucketed on its ragged total (the token
count) by whoever builds it (``tilewright.kernels.grouped``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewright._config import config
from tilewright.autotune.candidates import Candidate
from tilewright.grouped import GroupedGemmProblem
from tilewright.runtime.targets import Target
from tilewright.templates import get_template, templates_for


def roofline_ms(problem: GroupedGemmProblem, target: Target) -> float:
    """max(bytes / bandwidth, FLOPs / peak) in ms, from the target's figures (0 when absent)."""
    bw = target.hbm_gbps or 0
    tflops = target.peak(problem.dtype) if target.peak_tflops else 0
    t_mem = problem.min_bytes / (bw * 1e6) if bw else 0.0
    t_math = problem.flops / (tflops * 1e9) if tflops else 0.0
    return max(t_mem, t_math)


@dataclass(frozen=True)
class GroupedGemmPolicy:
    max_candidates: int = 4

    def candidates(self, problem: GroupedGemmProblem, target: Target) -> list[Candidate]:
        aten = get_template("aten.grouped_gemm")
        base = roofline_ms(problem, target)
        out = [Candidate.of(aten.id, aten.source_hash, {}, rank=0, predicted_ms=base / 0.8 if base else None)]
        if target.interpreted and config.force_backend == "auto":
            return out
        for template in templates_for("grouped_gemm", target.backend):
            if template.backend == "aten" or not template.supports(problem, target):
                continue
            seen = set()
            for params in template.seed_params(problem, target):
                params = template.space.complete(params)
                key = tuple(params.items())
                if key in seen or template.check(params, problem, target):
                    continue
                seen.add(key)
                out.append(Candidate.of(template.id, template.source_hash, params, rank=len(out),
                                        predicted_ms=base or None))
        budget = min(config.max_candidates, self.max_candidates)
        return out[:1 + budget]
