"""``triton.attention_decode``: attention for few queries and many keys (a decode step).

FlashDecoding's split (Dao et al., 2023, "Flash-Decoding for long-context inference"): the
keys are split over ``SPLIT`` programs per KV head, each computing a partial softmax (its max,
its sum and its unnormalised output, fp32) that a second kernel merges, so a single query row
still fills the GPU. A program takes all ``GROUP x Sq`` query rows that share a KV head (GQA
packs the heads into the MMA's M side, as Inductor's flex decode does), so each K/V tile is
read once for the whole group. ``DESC`` reads K and V through tensor descriptors (TMA, TDM).

A block mask is supported when every query row is in its first query block (``Sq <=
q_block``) and, with GQA, the block mask is shared by the heads (``heads == 1``): each split
then takes its share of the listed key blocks.
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.attention.problem import AttentionProblem
from tilewright.ir.index import ceil_pow2
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target
from tilewright.templates.base import Knob, ParamSpace, Params, Support, powers_of_two
from tilewright.templates.triton.attention import AttentionTemplate, fit_block, head_pad
from tilewright.templates.triton.attention_mods import IndexNames

MAX_DECODE_ROWS = 128  # GROUP x Sq rows a decode program may take (more: the prefill kernel)
DECODE_NAMES = IndexNames(h="h_row[:, None]", m="m_row[:, None]")


def split_for(problem: AttentionProblem, block_m: int, block_n: int, target: Target) -> int:
    """The key split that gives about two programs per SM (at most one split per key tile, 64
    at most): 2 under the interpreter."""
    tiles = max(1, -(-problem.Skv // block_n))
    if target.interpreted:
        return min(2, tiles)
    programs = -(-problem.group * problem.Sq // block_m) * problem.B * problem.H_kv
    want = max(1, -(-2 * target.num_sms // max(programs, 1)))
    return max(1, min(64, tiles, 1 << (want - 1).bit_length()))


class TritonAttentionDecode(AttentionTemplate):
    id = "triton.attention_decode"
    jinja = "attention_decode.py.jinja"
    kernel_name = "tw_attention_decode"
    names = DECODE_NAMES
    space = ParamSpace((
        Knob("BLOCK_M", powers_of_two(16, 128), 16, "query rows (GROUP x Sq, padded) per program"),
        Knob("BLOCK_N", powers_of_two(16, 256), 64, "keys per inner-loop tile"),
        Knob("SPLIT", powers_of_two(1, 64), 1, "programs the keys of one KV head are split over"),
        Knob("num_warps", (1, 2, 4, 8), 4, "warps per program"),
        Knob("num_stages", (1, 2, 3, 4, 5), 2, "software-pipeline depth of the key loop"),
        Knob("DESC", (False, True), False, "K/V tiles through tensor descriptors (TMA, TDM)"),
    ))

    def problem_support(self, problem: AttentionProblem, target: Target) -> Support:
        base = super().problem_support(problem, target)
        if not base:
            return base
        rows = problem.group * problem.Sq
        if "Sq" in problem.dynamic or rows > MAX_DECODE_ROWS:
            return Support(False, f"{rows} query rows per KV head (decode takes at most {MAX_DECODE_ROWS}, "
                                  f"a static Sq); triton.attention runs it")
        bm = problem.block_mask
        if bm is not None and problem.Sq > bm.q_block:
            return Support(False, f"Sq={problem.Sq} spans several query blocks of the block mask")
        if bm is not None and bm.heads > 1 and problem.group > 1:
            return Support(False, "a per-head block mask with GQA (the group's heads would need different lists)")
        return base

    def smem_bytes(self, problem: AttentionProblem, params: Params) -> int:
        e = ELEMENT_BYTES[problem.dtype]
        kv = params["BLOCK_N"] * (head_pad(problem.D) + head_pad(problem.Dv))
        return int((params["BLOCK_M"] * head_pad(problem.D) + max(params["num_stages"], 1) * kv) * e)

    def seed_params(self, problem: AttentionProblem, target: Target) -> list[dict[str, Any]]:
        rows = max(16, ceil_pow2(problem.group * problem.Sq))
        if target.interpreted:
            seeds = [(32, 4, 1)]
        elif target.backend == "hip":
            seeds = [(64, 4, 2), (128, 4, 1), (32, 4, 2)]
        else:
            seeds = [(64, 4, 3), (128, 4, 2), (32, 4, 3)]
        descs = (False, True) if (target.has("tma") or target.has("tdm")) else (False,)
        out = []
        for d in descs:
            for bn, w, s in seeds:
                bn = fit_block(min(bn, max(16, ceil_pow2(problem.Skv))),
                               problem.block_mask.kv_block if problem.block_mask else None)
                out.append({"BLOCK_M": min(rows, 128), "BLOCK_N": bn, "SPLIT": split_for(problem, rows, bn, target),
                            "num_warps": w, "num_stages": s, "DESC": d})
        return out

    def block_mask_refusal(self, params: Params, problem: AttentionProblem) -> str | None:
        bm = problem.block_mask  # the rows are all in query block 0 (supports)
        if bm is not None and bm.kv_block % params["BLOCK_N"]:
            return f"BLOCK_N={params['BLOCK_N']} must divide the block mask's {bm.kv_block}-key blocks"
        return None

    def pointer_types(self, problem: AttentionProblem) -> dict[str, str]:
        dt = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16"}[problem.dtype]
        return {"Q": dt, "K": dt, "V": dt, "M_PART": "*fp32", "L_PART": "*fp32", "ACC_PART": "*fp32"}

    def unit_strides(self) -> dict[str, int]:
        return {"sqd": 1, "skd": 1, "svd": 1}

    def row_strides(self) -> list[str]:
        return ["sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn"]

    def aot_spec(self, problem: AttentionProblem, params: Params) -> AotSpec:
        spec = super().aot_spec(problem, params)
        return AotSpec(spec.kernel, spec.language, spec.pointer_types,
                       {**spec.constexprs, "SPLIT": params["SPLIT"]}, spec.divisible_by_16, spec.options)
