"""Shape-aware candidate policies: a short ranked list per (op, target), never a grid.

For a GEMM the policy starts from a small table of tile shapes known to do well on the target
class, clamps each to the problem (a 16-row problem gets BLOCK_M = 16, not 128), adds decode
shapes for small M, drops settings the template refuses on the target (shared memory,
registers), removes duplicates, ranks the rest with the cost model and keeps the best
``config.max_candidates``. ATen is always a candidate (rank 0), so the tuner can only win by
beating it. Decode shapes (M <= 64) also get swap-AB and split-K variants (``decode.py``) and,
when nvidia-matmul-heuristics is installed, its picks (``heuristics.py``), all inside the same
budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tilewright._config import config
from tilewright.autotune.cost_model import LAUNCH_US
from tilewright.autotune.policy_base import CandidatePolicy
from tilewright.kinds.gemm.cost import estimate_gemm, roofline_ms
from tilewright.kinds.gemm.decode import decode_limit, decode_variants
from tilewright.kinds.gemm.heuristics import heuristic_params
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.languages import pinned_knobs
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): tile shapes that do well on tensor-core
# GPUs, the same family Triton's tutorials and Inductor's mm configs draw from.
GPU_SEEDS: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 32, 4, 4),
    (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (128, 128, 128, 8, 3),
    (64, 256, 64, 8, 3), (64, 64, 32, 4, 5), (32, 64, 64, 4, 4), (32, 32, 128, 4, 4),
)
# small M (decode): a thin BLOCK_M, wide N and deep K tiles keep the bandwidth busy
DECODE_SEEDS: tuple[tuple[int, int, int, int, int], ...] = (
    (16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (16, 256, 64, 8, 3), (16, 32, 256, 4, 3),
    (32, 64, 128, 4, 4), (32, 128, 64, 4, 4),
)
# the interpreter pays per program-step, so the biggest tiles win
INTERPRETER_SEEDS: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 128, 128, 4, 1), (64, 128, 128, 4, 1), (128, 64, 128, 4, 1), (64, 64, 64, 4, 1),
)


def _pow2_at_least(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def _compiled_on_cpu(template: TemplateSpec, problem: GemmProblem) -> bool:
    """Whether ``template`` runs ``problem`` compiled on the cpu target and offers it there
    without a forced backend (``compiled_on_cpu``, or ``offered_on_cpu(problem)``)."""
    return bool(getattr(template, "compiled_on_cpu", False)
                or getattr(template, "offered_on_cpu", lambda p: False)(problem))


def clamp_tile(problem: GemmProblem, bm: int, bn: int, bk: int) -> tuple[int, int, int]:
    """Shrink a tile to the problem: no dimension larger than the next power of two of the
    size (at least 16, the smallest tl.dot shape)."""
    return (min(bm, _pow2_at_least(problem.M)), min(bn, _pow2_at_least(problem.N)),
            min(bk, _pow2_at_least(problem.K)))


@dataclass(frozen=True)
class GemmPolicy(CandidatePolicy):
    """Candidates for a GEMM on one target class: the shared skeleton
    (:class:`~tilewright.autotune.policy_base.CandidatePolicy`) with ATen at 80% of the roofline
    plus a launch, the seed tiles clamped to the problem (:meth:`tile_params`), and the
    candidate slots of :meth:`choose`.

    Attributes:
        seeds: tile shapes to start from.
        decode_seeds: extra shapes for M <= ``decode_m``.
        decode_m: the M up to which a problem counts as decode.
        max_candidates: cap on generated candidates below ``config.max_candidates``.
    """

    seeds: tuple[tuple[int, int, int, int, int], ...]
    decode_seeds: tuple[tuple[int, int, int, int, int], ...] = ()
    decode_m: int = 64
    # most generated candidates (None: config.max_candidates); interpreted kernels cannot beat
    # ATen on a CPU, so measuring many of them only costs time
    max_candidates: int | None = None

    # on an interpreted target (the CPU) in auto mode, the templates whose kernels run compiled
    # there are offered beside ATen: those that say so (``compiled_on_cpu``: oneDNN's fused
    # linear) or say so for the problem (``offered_on_cpu(problem)``: a C++ epilogue, built per
    # epilogue, where it can pay); the interpreted Triton family only when a backend is forced
    interpreted_aten_only = False

    def fuses_epilogues(self, target: Target) -> bool:
        """Whether the elementwise chain after a GEMM on ``target`` joins the GEMM's kernel
        (:mod:`tilewright.kinds.gemm.fuse`) or is left to the loop kernels around it.

        Not on the CPU in auto mode: there the GEMM's candidates run an epilogue as passes over
        the stored product (ATen, ``cpp.gemm``) or as oneDNN post-ops, while the loop scheduler
        fuses the same ops into the kernel that reads the product next (a residual add into the
        RMSNorm or LayerNorm after it, SwiGLU's silu·mul into one pass), as Inductor does on a
        CPU. Measured on a 2-core CPU, one thread, race off, interleaved with Inductor in one
        process (time relative to Inductor's, fused → left to the loop kernels): demo Llama
        bf16 inference 1.29 → 1.14, its fp32 training step 1.34 → 1.20, BERT tiny 1.19 → 1.10,
        GPT-2 tiny 1.12 → 1.09, the 2-layer MLP 1.04 → 1.02. A backend the user forces keeps
        the fusion, so its templates' epilogues are what runs (``force_backend='cpp'`` runs
        ``cpp.gemm``'s)."""
        return not (target.interpreted and config.force_backend == "auto")

    def offers(self, template: TemplateSpec, problem: GemmProblem, target: Target) -> bool:
        if target.interpreted and config.force_backend == "auto" and not _compiled_on_cpu(template, problem):
            return False
        return super().offers(template, problem, target)

    def tile_params(self, problem: GemmProblem, template: TemplateSpec, target: Target
                    ) -> list[dict[str, Any]]:
        """Legal, distinct parameter settings for one template: its own ``seed_params(problem,
        target)`` when it defines that hook (templates whose knobs are not the Triton family's;
        knobs it leaves out take their defaults), else the seed tiles clamped to the problem, and
        for decode shapes also nvMatmulHeuristics' picks and the swap-AB / split-K variants the
        template can run."""
        knobs = set(template.space.names())
        defaults = template.space.default()
        seeds = template.seed_params(problem, target)
        if seeds is not None:
            proposals = list(seeds)
        else:
            proposals = []
            decode = problem.M <= max(self.decode_m, decode_limit(problem, target))
            if decode and not target.interpreted:
                for p in heuristic_params(problem, target) + decode_variants(problem, target, knobs):
                    kp = problem.transposed() if p.get("SWAP_AB") else problem
                    p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"] = clamp_tile(kp, p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"])
                    proposals.append(p)
            seeds = list(self.decode_seeds) + list(self.seeds) if decode else self.seeds
            for bm, bn, bk, warps, stages in seeds:
                bm, bn, bk = clamp_tile(problem, bm, bn, bk)
                if not target.interpreted:
                    # fewer warps for small tiles: 4 warps need at least a 64x64 tile to stay busy
                    warps = max(1, min(warps, bm * bn // 1024))
                    warps = 1 << (warps.bit_length() - 1)
                proposals.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                  "GROUP_M": 8 if bm >= 64 else 4, "num_warps": warps,
                                  "num_stages": stages})
        out, seen = [], set()
        stages = template.space.knob("num_stages").values if "num_stages" in knobs else ()
        for p in proposals:
            params = {k: p.get(k, defaults[k]) for k in template.space.names()}
            if stages and params["num_stages"] not in stages:
                # an outside proposal (nvMatmulHeuristics says 8 stages): the nearest depth here
                params["num_stages"] = min(stages, key=lambda s: (abs(s - params["num_stages"]), s))
            # knobs the template's compiler needs on this backend (Language.pinned_knobs)
            params.update((k, v) for k, v in pinned_knobs(template.backend, target.backend).items() if k in params)
            key = tuple(params.items())
            if key in seen or template.check(params, problem, target):
                continue
            seen.add(key)
            out.append(params)
        return out

    def legal(self, problem: GemmProblem, target: Target, template: TemplateSpec,
              proposals: Any = None) -> list[dict[str, Any]]:
        return self.tile_params(problem, template, target)

    def estimate(self, problem: GemmProblem, params: dict[str, Any], target: Target, template: TemplateSpec) -> float:
        if target.interpreted and _compiled_on_cpu(template, problem):
            return self.aten_ms(problem, target)  # a library's GEMM too, not interpreted tiles
        return estimate_gemm(problem, params, target, efficiency=template.efficiency(target),
                             register_pressure=template.register_pressure(problem, params, target)).ms

    def aten_ms(self, problem: GemmProblem, target: Target) -> float:
        # a vendor BLAS is taken to reach 80% of the roofline, plus one launch
        launch_ms = 0.0 if target.interpreted else LAUNCH_US * 1e-3
        return roofline_ms(problem, target) / 0.8 + launch_ms

    def choose(self, per_template: list, problem: GemmProblem, target: Target, budget: int) -> list:
        """At most ``budget`` generated kernels in order of predicted time, chosen by the slot
        priorities below."""
        everything = sorted(((ms, t, p) for t, ranked in per_template for ms, p in ranked),
                            key=lambda item: item[0])
        chosen: list[tuple[float, TemplateSpec, dict[str, Any]]] = []

        def take(item) -> None:
            if item is not None and len(chosen) < budget and not any(c[2] is item[2] for c in chosen):
                chosen.append(item)

        # slots in priority order: the predicted best; for decode shapes the best swap-AB and
        # the best split-K setting (a remedy is only known to help once measured); the best of
        # every other template; the PDL twin of each template's best (same tile, the other PDL
        # value, proposed under TILEWRIGHT_PDL=auto); then the rest by predicted time
        take(everything[0] if everything else None)
        take(next((c for c in everything if c[2].get("SWAP_AB") is True), None))
        take(next((c for c in everything if c[2].get("SPLIT_K", 1) > 1), None))
        for t, ranked in per_template:
            take((ranked[0][0], t, ranked[0][1]))
        for ms, t, p in list(chosen):
            if "PDL" in p:
                twin = {**p, "PDL": not p["PDL"]}
                take(next((c for c in everything if c[1] is t and c[2] == twin), None))
        for item in everything:
            take(item)
        chosen.sort(key=lambda item: item[0])
        return chosen


POLICIES: dict[tuple[str, str], Callable[[], GemmPolicy]] = {
    ("gemm", "cuda"): lambda: GemmPolicy(GPU_SEEDS, DECODE_SEEDS),
    ("gemm", "hip"): lambda: GemmPolicy(GPU_SEEDS, DECODE_SEEDS),
    ("gemm", "cpu"): lambda: GemmPolicy(INTERPRETER_SEEDS, max_candidates=2),
}
