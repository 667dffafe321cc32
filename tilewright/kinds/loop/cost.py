"""The loop kind's cost model: predicted time of a pointwise, reduction or scan kernel
(:class:`~tilewright.problem.LoopProblem`) with given block parameters, with nothing run.

A loop kernel is memory bound, so the model is bytes over sustained bandwidth plus launches
(under the Triton interpreter: Python per program plus numpy per element). The policy ranks its
block shapes by it (:mod:`tilewright.kinds.loop.policy`), and ``tilewright aot`` labels a kernel
with its bound (:meth:`~tilewright.kinds.loop.kind.LoopKind.estimate`). It moved here from
:mod:`tilewright.autotune.cost_model` (issue 30: the autotuner names no kind), whose
:class:`~tilewright.autotune.cost_model.CostEstimate` and launch latency it shares.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from tilewright.autotune.cost_model import LAUNCH_US, CostEstimate
from tilewright.runtime.targets import Target

# Fraction of DRAM bandwidth a well-shaped loop kernel sustains (vectorised, enough bytes in
# flight); measured Triton/Inductor elementwise kernels on H100/H200 reach 0.8-0.9 of the copy rate.
LOOP_BW_EFFICIENCY = 0.85
# Triton interpreter: per program, and per element of a block (numpy), measured on this project's
# CI machine for small elementwise kernels
INTERP_PROGRAM_MS = 0.6
INTERP_ELEMENT_MS = 2e-6
# Bandwidth credit of loop kernels whose dense accesses move whole blocks through tensor
# descriptors (gfx1250 TDM: no per-thread address math or load instructions, the block lands in
# LDS asynchronously). A prior, not a measurement: no gfx1250 has run one yet; the GEMM
# templates credit TMA/TDM 1.15 the same way. Measured choices on the device override it.
LOOP_DESC_EFFICIENCY = 1.1


def estimate_loop(problem, params: Mapping[str, Any], target: Target) -> CostEstimate:
    """Predicted time of a pointwise or reduction kernel (``LoopProblem``) with ``params``
    (XBLOCK, RBLOCK, PERSISTENT, num_warps, and SPLIT: threadgroups per row) on ``target``, in ms.

    A loop kernel is memory bound: the bytes each input and output cross DRAM once (a looped
    reduction reads its row once per pass) over the sustained bandwidth, discounted when the
    block leaves threads idle (fewer elements than threads) or the grid does not fill the
    machine, plus one launch. Under the interpreter the cost is Python per program plus numpy
    per element.
    """
    xnumel, rnumel = max(problem.xnumel, 1), max(problem.rnumel, 1)
    reduction = problem.kind == "reduction"
    xblock = int(params.get("XBLOCK", 1024))
    persistent = bool(params.get("PERSISTENT", True))
    rblock = (1 << max(rnumel - 1, 0).bit_length()) if persistent or not reduction else int(params.get("RBLOCK", 1024))
    # SPLIT: each row over SPLIT threadgroups, one launch per pass (metal.split_reduction)
    split = int(params.get("SPLIT", 1)) if reduction else 1
    programs = math.ceil(xnumel / xblock) * split
    if target.interpreted:
        steps = programs * (1 if persistent or not reduction else math.ceil(rnumel / rblock))
        elems = programs * xblock * (rblock if reduction else 1)
        ms = steps * INTERP_PROGRAM_MS + elems * INTERP_ELEMENT_MS
        return CostEstimate(ms, 0.0, ms, "latency", float(programs), 1.0)
    passes = 1
    if reduction and not persistent:
        passes = 1 + len({id(r) for r in problem.kernel.reductions()})
    launches = passes if split > 1 else 1  # a split row's passes are launches of their own
    bytes_ = problem.min_bytes * (passes if reduction else 1)
    threads = int(params.get("num_warps", 4)) * target.warp_size
    per_program = xblock * (rblock if reduction else 1)
    busy = min(1.0, per_program / threads)
    resident = max(1, target.num_sms * max(1, 2048 // threads))
    fill = min(1.0, programs / max(target.num_sms, 1))
    waves = programs / resident
    eff = LOOP_BW_EFFICIENCY * busy * (0.3 + 0.7 * fill)
    if params.get("DESC"):
        eff = min(1.0, eff * LOOP_DESC_EFFICIENCY)
    memory_ms = bytes_ / (target.hbm_gbps * 1e9 * eff) * 1e3
    ms = memory_ms + LAUNCH_US * 1e-3 * launches
    return CostEstimate(ms, 0.0, memory_ms, "memory" if memory_ms > LAUNCH_US * 1e-3 else "latency",
                        waves, busy)


__all__ = ["INTERP_ELEMENT_MS", "INTERP_PROGRAM_MS", "LOOP_BW_EFFICIENCY", "LOOP_DESC_EFFICIENCY", "estimate_loop"]
