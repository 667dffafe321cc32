"""``triton.attention_bwd``: dQ, dK and dV of attention, FlashAttention-2's backward (Dao, 2023,
algorithm 2) in three launches:

1. the delta pre-pass: ``delta = rowsum(dO ∘ O)`` (minus the lse's own gradient when the lse
   was used), and the saved lse converted to base 2;
2. dK and dV: one program per BLOCK_N keys of one KV head walks every query tile that can see
   them (the causal range, or the block mask's transposed ``q_*`` lists), for each query head of
   the GQA group, recomputing ``P = exp2(s' log2 e - lse2)``: no atomics;
3. dQ: one program per BLOCK_M query rows walks the key tiles the forward walked.

A score_mod enters through its derivative with respect to the score
(:func:`tilewright.kinds.attention.mods.score_derivative`), evaluated at the raw score. ``DESC`` reads
Q, K, V and dO through tensor descriptors. ``tilewright aot`` compiles the dK/dV kernel (it holds
four of the five products and the descriptor loads) with the instruction checks.
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.attention import mods
from tilewright.kinds.attention.problem import AttentionProblem
from tilewright.kinds.attention.reference import SATURATED_LSE
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.targets import Target
from tilewright.templates.base import Params, Support
from tilewright.templates.triton.attention import AttentionTemplate, head_pad, tiles
from tilewright.templates.triton.emit import TritonExpr


class TritonAttentionBackward(AttentionTemplate):
    id = "triton.attention_bwd"
    jinja = "attention_bwd.py.jinja"
    kernel_name = "tw_attention_bwd"
    direction = "backward"

    def problem_support(self, problem: AttentionProblem, target: Target) -> Support:
        base = super().problem_support(problem, target)
        if not base:
            return base
        try:
            mods.score_derivative(mods.loads(problem.score_mod))
        except mods.NotDifferentiable as e:
            return Support(False, f"the score_mod has no derivative here ({e})")
        return base

    def smem_bytes(self, problem: AttentionProblem, params: Params) -> int:
        """The dK/dV kernel: K and V tiles held, num_stages + 1 copies of the Q and dO tiles and
        the transposed P and dS operands. Measured (triton 3.9, bf16, D=128, 2 stages, 128x64):
        181 KB on sm_90a, 247 KB on sm_100a; this model says 256 KB, refusing it on both."""
        e = ELEMENT_BYTES[problem.dtype]
        dp, dvp = head_pad(problem.D), head_pad(problem.Dv)
        held = params["BLOCK_N"] * (dp + dvp)
        streamed = params["BLOCK_M"] * (dp + dvp)
        operands = 2 * params["BLOCK_M"] * params["BLOCK_N"]
        return int((held + (max(params["num_stages"], 1) + 1) * streamed + operands) * e)

    def acc_regs(self, problem: AttentionProblem, params: Params, target: Target) -> float:
        """dK and dV accumulators plus the score and dP tiles, fp32."""
        tile = params["BLOCK_N"] * (head_pad(problem.D) + head_pad(problem.Dv)) + 2 * params["BLOCK_M"] * params["BLOCK_N"]
        return tile / (params["num_warps"] * target.warp_size)

    def seed_params(self, problem: AttentionProblem, target: Target) -> list[dict[str, Any]]:
        if target.interpreted:
            seeds = [(32, 32, 4, 1)]
        elif target.backend == "hip":
            seeds = [(64, 64, 8, 1), (64, 32, 8, 1), (32, 32, 4, 1)]
        else:
            seeds = [(64, 64, 4, 2), (64, 128, 8, 2), (32, 64, 4, 2), (64, 32, 4, 2)]
        return tiles(problem, target, seeds)

    def context(self, problem: AttentionProblem, params: Params, target: Target) -> dict[str, Any]:
        ctx = super().context(problem, params, target)
        e = TritonExpr(interpreted=target.interpreted, load=lambda n: "")
        narrow = target.interpreted and problem.dtype != "fp32"
        stores = {f"store_{n}": e.convert(n, "fp32", problem.dtype) if narrow else n for n in ("dq", "dk", "dv")}
        extra = e.helpers()
        if extra and "_bf16_rne" not in ctx["helpers"] and "_fp16_rne" not in ctx["helpers"]:
            ctx["helpers"] += extra
        # the norm pass: a row whose lse saturated gets SDPA's math-form P (reference.SATURATED_LSE)
        ctx.update(stores, lse_grad=problem.lse_grad, score_grad=problem.score_grad,
                   saturable=problem.renorm, saturated=repr(SATURATED_LSE), dq_order=problem.order("dq"),
                   dk_order=problem.order("dk"), dv_order=problem.order("dv"))
        return ctx

    def pointer_types(self, problem: AttentionProblem) -> dict[str, str]:
        dt = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16"}[problem.dtype]
        return {"Q": dt, "K": dt, "V": dt, "DOUT": dt, "LSE2": "*fp32", "DELTA": "*fp32", "DK": dt, "DV": dt,
                **({"DS": "*fp32"} if problem.score_grad else {}),
                **({"RSCALE": "*fp32"} if problem.renorm else {})}

    def unit_strides(self) -> dict[str, int]:
        return {"sqd": 1, "skd": 1, "svd": 1, "sdod": 1, "sdkd": 1, "sdvd": 1}

    def row_strides(self) -> list[str]:
        return ["sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sdob", "sdoh", "sdom",
                "sdkb", "sdkh", "sdkn", "sdvb", "sdvh", "sdvn"]
