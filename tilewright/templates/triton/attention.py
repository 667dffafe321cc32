"""Triton attention templates: forward (prefill), decode (split KV) and backward, each with a
tensor-descriptor variant (``DESC``), for :class:`~tilewright.kinds.attention.AttentionProblem`.

``triton.attention`` (this module) is the FlashAttention-2 forward (Dao, 2023): one program per
BLOCK_M query rows of one (batch, head), keys in BLOCK_N tiles, the softmax computed online in
base 2 (scores times log2 e, ``exp2``), so the scores never reach memory. Tiles come from the
block mask when there is one (partial blocks evaluate the mask_mod, full blocks do not, unlisted
blocks are skipped: FlexAttention's semantics), else from the causal range (tiles past the
diagonal skipped, tiles below it unmasked). Every edge is masked: no length needs to be a
multiple of a block. ``DESC`` loads Q, K and V through per-(batch, head) 2-D tensor descriptors
(TMA on sm_90a/sm_100a, the Tensor Data Mover on gfx1250), when the launcher finds the tensors'
layouts allow it (a unit inner stride, 16-byte aligned rows); otherwise the pointer body runs.

Under the interpreter bf16/fp16 tiles are upcast to fp32 before ``tl.dot`` (triton issue 11584)
and stores round to nearest even, as the GEMM templates do.
"""

from __future__ import annotations

import math
from typing import Any

from tilewright.kinds.attention.problem import AttentionProblem
from tilewright.kinds.attention.views import block_mask_names
from tilewright.ir.index import ceil_pow2
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target, triton_can_target
from tilewright.templates.base import (
    SUPPORTED, InstructionCheck, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec,
    powers_of_two,
)
from tilewright.templates.triton.attention_mods import IndexNames, index_checks, render_all
from tilewright.templates.triton.emit import POINTER, TritonExpr
from tilewright.templates.triton.gemm import MAX_ACC_REGS_PER_THREAD, TORCH_DTYPE
from tilewright.templates.triton.loops import ASSERT_OPTIONS

MAX_HEAD_DIM = 256
FORWARD_BLOCK_MASK = {"kv_num_blocks": "KV_NUM", "kv_indices": "KV_IDX",
                      "full_kv_num_blocks": "FULL_NUM", "full_kv_indices": "FULL_IDX",
                      "q_num_blocks": "Q_NUM", "q_indices": "Q_IDX",
                      "full_q_num_blocks": "FULLQ_NUM", "full_q_indices": "FULLQ_IDX"}


def head_pad(d: int) -> int:
    """A head dim rounded up to a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, ceil_pow2(d))


def fit_block(tile: int, block: int | None) -> int:
    """``tile`` halved until it divides ``block`` (a block mask's block size), at least 16."""
    if block is None:
        return tile
    while tile > 16 and block % tile:
        tile //= 2
    return tile


def mma_checks(problem: AttentionProblem, params: Params, target: Target) -> list[InstructionCheck]:
    """The matrix instructions the Q Kᵀ and P V dots lower to (measured, triton 3.9): wgmma on
    sm_90a and tcgen05 on sm_100a for BLOCK_M >= 64 with >= 4 warps (mma.sync otherwise),
    v_mfma on CDNA, v_wmma on gfx1250; fp32 without TF32 stays on FMA units."""
    if target.backend == "cuda":
        if problem.dtype == "fp32":
            return [InstructionCheck("ptx", ("fma.rn.f32",), ("wgmma", "tcgen05.mma"), "fp32 on FMA units")]
        ptx = {"bf16": "bf16", "fp16": "f16"}[problem.dtype]
        big = params["BLOCK_M"] >= 64 and params["num_warps"] >= 4
        if big and target.has("wgmma"):
            return [InstructionCheck("ptx", (rf"wgmma\.mma_async\S*\.{ptx}",), (), "warpgroup MMA (Hopper)")]
        if big and target.has("tcgen05"):
            return [InstructionCheck("ptx", (r"tcgen05\.mma\S*kind::f16",), (r"wgmma",), "5th-gen tensor cores")]
        return [InstructionCheck("ptx", (rf"mma\.sync\S*\.{ptx}",), (r"wgmma",), "warp-level MMA")]
    if target.backend == "hip" and problem.dtype != "fp32":
        if target.has("wmma"):
            return [InstructionCheck("amdgcn", (r"v_wmma",), (), "WMMA (gfx12)")]
        if target.has("mfma"):
            return [InstructionCheck("amdgcn", (r"v_mfma",), (), "MFMA (CDNA)")]
    return []


def descriptor_checks(params: Params, target: Target) -> list[InstructionCheck]:
    if not params.get("DESC"):
        return []
    if target.backend == "cuda":
        return [InstructionCheck("ptx", (r"cp\.async\.bulk\.tensor",), (), "TMA tile loads")]
    if target.arch == "gfx1250":
        return [InstructionCheck("amdgcn", (r"tensor_load_to_lds",), (), "TDM tile loads")]
    return []


def tiles(problem: AttentionProblem, target: Target, seeds: list[tuple[int, int, int, int]]) -> list[dict[str, Any]]:
    """Seed (BLOCK_M, BLOCK_N, warps, stages) tiles made to fit the problem: no larger than the
    lengths (a power of two >= 16), dividing a block mask's blocks; each with DESC where the
    target moves tiles with an engine."""
    bm_spec = problem.block_mask
    cap_m, cap_n = max(16, ceil_pow2(problem.Sq)), max(16, ceil_pow2(problem.Skv))
    descs = (False, True) if (target.has("tma") or target.has("tdm")) else (False,)
    out = []
    for d in descs:
        for bm, bn, w, s in seeds:
            bm = fit_block(min(bm, cap_m), bm_spec.q_block if bm_spec else None)
            bn = fit_block(min(bn, cap_n), bm_spec.kv_block if bm_spec else None)
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, "DESC": d})
    return out


class AttentionTemplate(TemplateSpec):
    """What the attention templates share: support checks, resources, rendering context."""

    backend = "triton"
    op = "attention"
    direction = "forward"
    kernel_name = "tw_attention_fwd"
    names = IndexNames()  # how the kernel names b, h, m, n in a key tile
    space = ParamSpace((
        Knob("BLOCK_M", powers_of_two(16, 256), 64, "query rows per program"),
        Knob("BLOCK_N", powers_of_two(16, 256), 64, "keys per inner-loop tile"),
        Knob("num_warps", (1, 2, 4, 8, 16), 4, "warps per program"),
        Knob("num_stages", (1, 2, 3, 4, 5), 2, "software-pipeline depth of the key loop"),
        Knob("DESC", (False, True), False, "Q/K/V tiles through tensor descriptors (TMA, TDM)"),
    ))

    def problem_support(self, problem: AttentionProblem, target: Target) -> Support:
        if not isinstance(problem, AttentionProblem):
            return Support(False, f"{self.id} runs attention problems")
        if problem.direction != self.direction:
            return Support(False, f"{self.id} is the {self.direction} kernel")
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Triton does not generate for {target.backend}")
        if (why := triton_can_target(target)) is not None:
            return Support(False, why)
        if max(problem.D, problem.Dv) > MAX_HEAD_DIM:
            return Support(False, f"head dim {max(problem.D, problem.Dv)} > {MAX_HEAD_DIM}")
        if len(problem.captures) and any(len(c.shape) > 6 for c in problem.captures):
            return Support(False, "a captured tensor of rank > 6")
        # a gather through an index not proven in range is checked in the kernel (attention_mods)
        return SUPPORTED

    # -- resources ------------------------------------------------------------------------------
    def smem_bytes(self, problem: AttentionProblem, params: Params) -> int:
        """Shared memory: the Q tile and num_stages copies of the K and V tiles."""
        e = ELEMENT_BYTES[problem.dtype]
        dp, dvp = head_pad(problem.D), head_pad(problem.Dv)
        kv = params["BLOCK_N"] * (dp + dvp)
        return int((params["BLOCK_M"] * dp + max(params["num_stages"], 1) * kv) * e)

    def acc_regs(self, problem: AttentionProblem, params: Params, target: Target) -> float:
        """fp32 registers per thread for the score tile and the output accumulator."""
        tile = params["BLOCK_M"] * (params["BLOCK_N"] + head_pad(problem.Dv))
        return tile / (params["num_warps"] * target.warp_size)

    def check(self, params: Params, problem: AttentionProblem, target: Target) -> str | None:
        """Why ``params`` cannot run ``problem`` on ``target``: outside the space, blocks that
        do not tile the block mask's blocks, descriptors where the target has no engine for
        them, more shared memory/LDS than a block gets or more registers than a thread holds
        (the interpreter has neither limit)."""
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        if (why := self.block_mask_refusal(params, problem)) is not None:
            return why
        if params["DESC"] and not (target.interpreted or target.has("tma") or target.has("tdm")):
            return f"{target.name} has no tensor-descriptor engine (TMA/TDM)"
        if params["DESC"] and head_pad(problem.D) * ELEMENT_BYTES[problem.dtype] < 16:
            return "a descriptor row must be at least 16 bytes"
        if target.interpreted:
            return None
        smem = self.smem_bytes(problem, params)
        if target.smem_per_block and smem > target.smem_per_block:
            return f"needs {smem} B shared memory, {target.name} has {target.smem_per_block}"
        regs = self.acc_regs(problem, params, target)
        if regs > MAX_ACC_REGS_PER_THREAD:
            return f"score and accumulator tiles need {regs:.0f} registers per thread (> {MAX_ACC_REGS_PER_THREAD})"
        return None

    def block_mask_refusal(self, params: Params, problem: AttentionProblem) -> str | None:
        """A program's query rows must lie in one query block, and its key tiles tile a key
        block."""
        bm = problem.block_mask
        if bm is not None and (bm.q_block % params["BLOCK_M"] or bm.kv_block % params["BLOCK_N"]):
            return (f"BLOCK_M={params['BLOCK_M']}, BLOCK_N={params['BLOCK_N']} must divide the block "
                    f"mask's {bm.q_block}x{bm.kv_block} blocks")
        return None

    def seed_params(self, problem: AttentionProblem, target: Target) -> list[dict[str, Any]]:
        """A few tiles for prefill (the policy ranks them); each with DESC where the target moves
        tiles with an engine. Tiles never exceed the lengths (rounded to a power of two >= 16)."""
        if target.interpreted:
            seeds = [(32, 32, 4, 1), (16, 32, 4, 1)]
        elif target.backend == "hip":
            seeds = [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 4, 1), (64, 32, 4, 1)]
        else:
            seeds = [(128, 64, 8, 3), (128, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 2)]
        return tiles(problem, target, seeds)

    # -- rendering ------------------------------------------------------------------------------
    def context(self, problem: AttentionProblem, params: Params, target: Target) -> dict[str, Any]:
        interp = target.interpreted
        score_mod, mask_mod, deriv, helpers = render_all(problem, interp, self.names)
        upcast = interp and problem.dtype != "fp32"
        e = TritonExpr(interpreted=interp, load=lambda n: "")
        out_value = e.convert("o", "fp32", problem.dtype) if interp and problem.dtype != "fp32" else "o"
        helpers = helpers + e.helpers()
        bm = problem.block_mask
        return dict(
            kernel_name=self.kernel_name, problem_text=problem.describe(),
            params_text=self.space.encode(params), target=target.name,
            H=problem.H, H_kv=problem.H_kv, group=problem.group, D=problem.D, Dv=problem.Dv,
            D_pad=head_pad(problem.D), Dv_pad=head_pad(problem.Dv), scale=repr(float(problem.scale)),
            empty_lse=_float_literal(problem.empty_lse), lse_base=problem.lse_base,
            n_captures=len(problem.captures), capture_ranks=[len(c.shape) for c in problem.captures],
            bm_names=[FORWARD_BLOCK_MASK[n] for n in block_mask_names(problem)],
            n_block_mask=len(block_mask_names(problem)), block_mask=bm,
            torch_dtype=TORCH_DTYPE[problem.dtype], out_order=problem.order("out"),
            lse_order=problem.order("lse"), causal=problem.causal, has_mask=problem.has_mask,
            score_mod=score_mod, mask_mod=mask_mod, deriv=deriv, helpers=helpers, upcast=upcast,
            out_value=out_value, desc=bool(params["DESC"]),
            index_checks=index_checks(problem), interpreted=interp,
            dot_kwargs=', input_precision="ieee"' if problem.dtype == "fp32" or upcast else "",
            **{k: v for k, v in params.items()},
        )

    def aot_spec(self, problem: AttentionProblem, params: Params) -> AotSpec:
        """Pointer types, the tile and DESC as constexprs, unit head-dim strides specialised
        (the JIT does the same for a stride of 1), 16-byte divisibility of pointers and of the
        row strides when the head dims are multiples of 16."""
        pointers = self.pointer_types(problem)
        for i, c in enumerate(problem.captures):
            pointers[f"C{i}"] = POINTER[c.dtype]
        for n in block_mask_names(problem):
            pointers[FORWARD_BLOCK_MASK[n]] = "*i32"
        if index_checks(problem):
            pointers["TW_ERR"] = "*i32"
        constexprs = {"BLOCK_M": params["BLOCK_M"], "BLOCK_N": params["BLOCK_N"], "USE_DESC": bool(params["DESC"])}
        constexprs.update(self.unit_strides())
        divisible = list(pointers)
        if problem.D % 16 == 0 and problem.Dv % 16 == 0:
            divisible += self.row_strides()
        divisible += [n for n, v in (("Sq", problem.Sq), ("Skv", problem.Skv))
                      if n not in problem.dynamic and v % 16 == 0]
        options = {"num_warps": params["num_warps"], "num_stages": params["num_stages"]}
        if index_checks(problem):  # the gathers' device asserts (Triton drops them without debug)
            options.update(ASSERT_OPTIONS)
        return AotSpec(self.kernel_name, "triton", pointers, constexprs, tuple(divisible), options)

    def pointer_types(self, problem: AttentionProblem) -> dict[str, str]:
        dt = POINTER[problem.dtype]
        return {"Q": dt, "K": dt, "V": dt, "OUT": dt, "LSE": "*fp32"}

    def unit_strides(self) -> dict[str, int]:
        return {"sqd": 1, "skd": 1, "svd": 1, "sod": 1}

    def row_strides(self) -> list[str]:
        return ["sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "som"]

    def expected_instructions(self, problem: AttentionProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        return mma_checks(problem, params, target) + descriptor_checks(params, target)

    def efficiency(self, target: Target) -> float:
        return 1.0

    def render_kernel(self, problem: AttentionProblem, params: Params, target: Target) -> RenderedKernel:
        source = self.render_jinja(**self.context(problem, params, target))
        return RenderedKernel(template_id=self.id, params=dict(params), target=target.name, source=source,
                              name=self.id.replace(".", "_"), interpret=target.interpreted,
                              aot=None if target.interpreted else self.aot_spec(problem, params))


def _float_literal(x: float) -> str:
    if math.isnan(x):
        return "float('nan')"
    if math.isinf(x):
        return "float('-inf')" if x < 0 else "float('inf')"
    return repr(float(x))


class TritonAttention(AttentionTemplate):
    id = "triton.attention"
    jinja = "attention_fwd.py.jinja"
