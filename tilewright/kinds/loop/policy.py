"""Candidate policy for loop kernels (pointwise, reduction): a few block shapes per problem,
chosen from its sizes, never a grid.

* pointwise: XBLOCK from 256 to 2048 elements with enough warps to give each thread 4-8
  elements (128-bit accesses), fewer when the tensor is small;
* reduction: a persistent row (RBLOCK = the row rounded up to a power of two) whenever it fits
  the register budget (``TritonReduction.check``), with several rows per program for short rows;
  a looped row (RBLOCK 1024-4096) for long ones, and one looped candidate beside the persistent
  ones for rows long enough that the choice is close;
* the interpreter (the CPU, when Triton is forced): the fewest programs, since each costs
  Python time;
* on targets with a Tensor Data Mover (gfx1250), every proposal also with ``DESC`` (dense
  loads and stores through tensor descriptors), where the template accepts it.

ATen (the torch emitter) is rank 0, except on a CPU for a kernel that carries the ATen ops it
replaced (or is one native op: :mod:`tilewright.templates.aten.unfused`): those come first and
the torch form second, both timed, so a tie keeps what eager ran (with autotune off, which
runs rank 0 unchecked, the torch form stays first). On the CPU in ``auto`` mode, other templates are offered only when
they run compiled there (:func:`offered_on`: C++ kernels, not interpreted Triton). The cost model
(:func:`~tilewright.kinds.loop.cost.estimate_loop`) ranks the rest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tilewright._config import config
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.cost_model import LAUNCH_US
from tilewright.kinds.loop.cost import estimate_loop
from tilewright.autotune.policy_base import CandidatePolicy
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates import TemplateSpec, get_template


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _warps(elements: int) -> int:
    """Warps for a block of ``elements``: about 8 elements per thread, 1..16 warps."""
    w = max(1, min(16, elements // 256))
    return 1 << (w.bit_length() - 1)


def pointwise_params(problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
    n = max(problem.xnumel, 1)
    if target.interpreted:
        return [{"XBLOCK": min(max(_pow2(n), 16), 65536), "num_warps": 4}]  # the knob starts at 16
    out = []
    for xblock in (256, 512, 1024, 2048):
        xb = min(xblock, max(_pow2(n), 16))
        out.append({"XBLOCK": xb, "num_warps": _warps(xb)})
    return out


def reduction_params(problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
    x, r = max(problem.xnumel, 1), max(problem.rnumel, 1)
    rp = _pow2(r)
    if target.interpreted:
        xblock = min(_pow2(x), max(1, 65536 // rp), 4096)
        out = [{"XBLOCK": xblock, "RBLOCK": 1024, "PERSISTENT": True, "num_warps": 4}]
        if rp > 4096:
            out.append({"XBLOCK": min(_pow2(x), 16), "RBLOCK": 4096, "PERSISTENT": False, "num_warps": 4})
        return out
    out = []
    for xblock in (1, 2, 4, 8, 16, 32, 64):
        if xblock > _pow2(x) or xblock * rp > 16384:
            continue
        out.append({"XBLOCK": xblock, "RBLOCK": 1024, "PERSISTENT": True, "num_warps": _warps(xblock * rp)})
    if rp >= 2048:
        for rblock in (1024, 2048, 4096):
            if rblock < rp:
                out.append({"XBLOCK": 1, "RBLOCK": rblock, "PERSISTENT": False, "num_warps": _warps(rblock)})
    return out


class LoopPolicy(CandidatePolicy):
    """Candidates for a pointwise or reduction problem (see the module docstring): the shared
    skeleton (:class:`~tilewright.autotune.policy_base.CandidatePolicy`) with the ATen ops
    themselves and the torch form first, interpreted kernels offered on the CPU only where
    they run compiled (:func:`offered_on`), and the block shapes of :meth:`block_proposals`."""

    interpreted_aten_only = False  # offered_on decides, per template

    def __init__(self, kind: str):
        self.kind = kind

    def templates_kind(self, problem: LoopProblem) -> str:
        return self.kind

    def block_proposals(self, problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
        """The block shapes of the module docstring (with ``DESC`` twins on TDM targets)."""
        out = reduction_params(problem, target) if self.kind == "reduction" else pointwise_params(problem, target)
        if target.has("tdm"):
            out = [p | {"DESC": True} for p in out] + out
        return out

    def proposals(self, problem: LoopProblem, target: Target, template: TemplateSpec) -> list[dict[str, Any]]:
        """The template's own knobs (Metal's simdgroups per threadgroup) when it seeds them,
        else :meth:`block_proposals`; each with only the knobs the template has."""
        seeds = template.seed_params(problem, target)
        names = set(template.space.names())
        return [{k: v for k, v in p.items() if k in names}
                for p in (seeds if seeds is not None else self.block_proposals(problem, target))]

    def estimate(self, problem: LoopProblem, params: dict[str, Any], target: Target, template: TemplateSpec) -> float:
        return estimate_loop(problem, params, target).ms

    def head(self, problem: LoopProblem, target: Target) -> list[Candidate]:
        aten = get_template(f"aten.{self.kind}")
        launch_ms = 0.0 if target.interpreted else LAUNCH_US * 1e-3
        bw = max(target.hbm_gbps, 1.0) * 1e9
        torch_form = Candidate.of(aten.id, aten.source_hash, {}, rank=0,
                                  predicted_ms=problem.min_bytes / (bw * 0.7) * 1e3 + launch_ms)
        program = program_candidates(problem, target, rank=0)
        if program and config.autotune:
            # the ops as eager ran them come first: a tie keeps them (never slower than eager)
            return program + [dataclasses.replace(torch_form, rank=1)]
        # autotune off runs rank 0 unchecked: only the torch form is trusted so
        return [torch_form] + [dataclasses.replace(c, rank=1) for c in program]

    def offers(self, template: TemplateSpec, problem: LoopProblem, target: Target) -> bool:
        return template.backend != "aten" and offered_on(template, target) and bool(template.supports(problem, target))

    def choose(self, per_template: list, problem: LoopProblem, target: Target, budget: int) -> list:
        """The fastest predicted; equal predictions in template id order."""
        everything = [(ms, t, p) for t, options in per_template for ms, p in options]
        everything.sort(key=lambda item: (item[0], item[1].id))
        return everything[:budget]


def offered_on(template: TemplateSpec, target: Target) -> bool:
    """Whether the policy offers ``template``'s kernels on ``target``. On an interpreted target
    (the CPU) in ``auto`` mode, only templates whose kernels run compiled there: those that
    declare ``compiled_on_cpu = True`` (C++ loop kernels). Interpreted Triton only loses to
    ATen on a CPU (see policy.py); forcing a backend offers it anyway."""
    if not target.interpreted or config.force_backend != "auto":
        return True
    return bool(getattr(template, "compiled_on_cpu", False))


def program_candidates(problem: LoopProblem, target: Target, rank: int) -> list[Candidate]:
    """On a CPU, the ATen ops the kernel replaced (or the one native op it is), when the
    kernel carries them (``LoopProblem.unfused``): timed against the fused kernels, so a
    compiled graph never makes more calls than eager where that is faster."""
    if target.backend != "cpu" or not problem.unfused:
        return []
    from tilewright.templates.aten.unfused import program_digest

    t = get_template(f"aten.unfused_{problem.kind}")
    if not t.supports(problem, target):  # an empty kernel, say
        return []
    return [Candidate.of(t.id, t.source_hash, {"program": program_digest(problem.unfused)}, rank=rank,
                         predicted_ms=None)]
