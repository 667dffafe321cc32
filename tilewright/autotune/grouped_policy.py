"""Candidates for a grouped GEMM: ATen (``torch._grouped_mm``) first, then the grouped templates'
own seed tiles, ranked by a roofline over the problem's bytes and FLOPs.

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

from dataclasses import dataclass

import dataclasses
from typing import Any

from tilewright._config import config
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.cost_model import CostEstimate, estimate_gemm
from tilewright.grouped import GroupedGemmProblem
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec, get_template, templates_for


def roofline_ms(problem: GroupedGemmProblem, target: Target) -> float:
    """max(bytes / bandwidth, FLOPs / peak) in ms, from the target's figures (0 when absent)."""
    bw = target.hbm_gbps or 0
    tflops = target.peak(problem.dtype) if target.peak_tflops else 0
    t_mem = problem.min_bytes / (bw * 1e6) if bw else 0.0
    t_math = problem.flops / (tflops * 1e9) if tflops else 0.0
    return max(t_mem, t_math)


def estimate(problem: GroupedGemmProblem, params: dict[str, Any], target: Target, *,
             efficiency: float = 1.0) -> CostEstimate:
    """Predicted time (ms) of a grouped GEMM on its synthetic even offsets: the dense cost model
    on G equal GEMMs of one group's share of the ragged dim (a batched GEMM of batch G), so
    each group's partial tile is paid for. An estimate for ranking tiles ahead of time
    (``tilewright aot``), not a measurement."""
    gemm = problem.as_gemm()
    share = {d: getattr(problem, d) for d in "MNK"}
    if problem.ragged:
        share[problem.ragged] = max(1, share[problem.ragged] // problem.G)
    gemm = dataclasses.replace(gemm, M=share["M"], N=share["N"], K=share["K"], batch=problem.G, batched=True)
    return estimate_gemm(gemm, params, target, efficiency=efficiency)


@dataclass(frozen=True)
class GroupedGemmPolicy:
    max_candidates: int = 4

    def ranked(self, problem: GroupedGemmProblem, target: Target, template: TemplateSpec
               ) -> list[tuple[float, dict[str, Any]]]:
        """(predicted ms, params) for one template, best first: its seed tiles that its
        ``check`` accepts, ranked by :func:`estimate` (what ``tilewright aot`` builds); none
        for a fused gated product the template does not render (``fuses_glu``)."""
        if problem.glu and not template.fuses_glu:
            return []
        seen, scored = set(), []
        for params in template.seed_params(problem, target) or []:
            params = template.space.complete(params)
            key = tuple(sorted(params.items(), key=lambda kv: kv[0]))
            if key in seen or template.check(params, problem, target):
                continue
            seen.add(key)
            scored.append((estimate(problem, params, target, efficiency=template.efficiency(target)).ms, params))
        return sorted(scored, key=lambda item: item[0])

    def candidates(self, problem: GroupedGemmProblem, target: Target) -> list[Candidate]:
        aten = get_template("aten.grouped_gemm")
        base = roofline_ms(problem, target)
        out = [Candidate.of(aten.id, aten.source_hash, {}, rank=0, predicted_ms=base / 0.8 if base else None)]
        if target.interpreted and config.force_backend == "auto":
            return out
        per_template: list[list[tuple]] = []
        for template in templates_for("grouped_gemm", target.backend, jit=True):
            if template.backend == "aten" or not template.supports(problem, target):
                continue
            if problem.glu and not template.fuses_glu:
                continue
            seen, legal = set(), []
            seeds = template.seed_params(problem, target) or []
            for params in seeds[:1] if target.interpreted else seeds:
                params = template.space.complete(params)
                key = tuple(params.items())
                if key in seen or template.check(params, problem, target):
                    continue
                seen.add(key)
                legal.append((template, params))
            per_template.append(legal)
        # round-robin over the templates, each in its own seed order, so the budget measures
        # every template's best guess before anyone's second
        for i in range(max(map(len, per_template), default=0)):
            for template, params in (seeds[i] for seeds in per_template if i < len(seeds)):
                out.append(Candidate.of(template.id, template.source_hash, params, rank=len(out),
                                        predicted_ms=base or None))
        budget = min(config.max_candidates, self.max_candidates)
        return out[:1 + budget]
