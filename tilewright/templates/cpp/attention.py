"""``cpp.attention``: attention forward (SDPA, FlexAttention, decode) as one C++ kernel for the
host CPU, :class:`~tilewright.kinds.attention.AttentionProblem`.

FlashAttention-2's forward (Dao, 2023): a task is ``BLOCK_M`` query positions of ``PACK``
heads (``PACK`` = the GQA group for decode shapes, so a K/V tile is converted once for the
group's heads; 1 otherwise), keys in ``BLOCK_N`` tiles, the softmax online in natural units
(``exp(s - max)``: an additive ``finfo.min`` mask stays finite, so a row it masks everywhere
averages V, as eager's softmax does), fp32 accumulation, whatever the input dtype. Tiles come
from the block mask (partial blocks evaluate the mask_mod, full ones do not, unlisted ones are
skipped: FlexAttention's semantics) or from the causal range (tiles past the diagonal skipped,
tiles below it unmasked). The score_mod and mask_mod are the problem's IR rendered by this
folder's emitter (:class:`~tilewright.templates.cpp.emit.CppExpr`) into the loop over a tile's
keys, which g++ vectorises; gathered indices are checked (``IndexError``, as torch).

The two products are register-tiled loops over GCC vector types (16 fp32 lanes): Q Kᵀ as a
broadcast of q times a row of the transposed K tile (``RB`` rows x ``BLOCK_N`` keys held in
registers), or for few rows (decode) one dot product per (row, key) along the head dim; P V as
a broadcast p times a V row (``RBV`` rows x the head dim). OpenMP threads take tasks. Any
strides; lengths need not be multiples of a block; head dims are padded to 16 in the tiles.

Refused, with the reason: the backward (ATen's, or Triton's when forced), head dims above 256,
and problems whose block mask's query blocks the task's rows would straddle.
"""

from __future__ import annotations

import math
from typing import Any

from tilewright.kinds.attention import mods
from tilewright.kinds.attention.problem import AttentionProblem
from tilewright.kinds.attention.views import block_mask_names
from tilewright.ir import dtypes
from tilewright.ir.expr import Node, indirect_symbol, load_indirect, load_mask
from tilewright.problem import DTYPES
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec, powers_of_two,
)
from tilewright.templates.cpp.emit import CTYPE, STORAGE, CppExpr, ccode, literal
from tilewright.templates.cpp.source import libm_declarations

MAX_HEAD_DIM = 256
MAX_ROWS = 128  # PACK x BLOCK_M rows a task holds (its Q, S and accumulator tiles live on the stack)
TRANSPOSED_ROWS = 16  # rows per task from which the scores are Sᵀ (rows along the vector lanes);
# fewer: one dot product per (row, key) along the head dim (decode)
INDEX_NAMES = {mods.B_VAR: "tw_b", mods.H_VAR: "tw_h", mods.M_VAR: "tw_m", mods.N_VAR: "tw_n"}


def _pad16(d: int) -> int:
    return max(16, -(-d // 16) * 16)


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def render_mod(problem: AttentionProblem, text: str, prefix: str) -> tuple[list[str], str, set[str]]:
    """A modification's IR as C++ statements inside the kernel's loop over a tile's keys
    (``tw_score``, ``tw_b``, ``tw_h``, ``tw_m``, ``tw_n`` and ``tw_err`` in scope, capture
    ``k`` as pointer ``a.c{k}`` with strides ``a.c{k}_s{d}`` and sizes ``a.c{k}_n{d}``):
    (lines, the value's name ("" without a modification), helpers used). A score_mod's value
    is fp32, a mask_mod's bool."""
    value = mods.loads(text)
    if value is None:
        return [], "", set()
    e: CppExpr

    def load(n: Node) -> str:
        name, idx, _ = n.arg
        k = int(name[1:])
        cap = problem.captures[k]
        local: dict[Any, str] = dict(INDEX_NAMES)
        own = load_mask(n)
        for j, v in enumerate(load_indirect(n)):
            local[indirect_symbol(j)] = f"int64_t({e.names[v]})"
        terms = []
        for d, i in enumerate(idx):
            if i == 0:
                continue
            code = ccode(i, local)
            if i.free_symbols - set(INDEX_NAMES):  # gathered: checked against its dim
                e.helpers_used.add("tw_index")
                if own is not None:
                    code = f"({e.names[own]} ? int64_t({code}) : int64_t(0))"
                code = f"tw_index({code}, a.c{k}_n{d}, tw_err)"
            terms.append(f"({code}) * a.c{k}_s{d}")
        element = f"a.c{k}[{' + '.join(terms) if terms else '0'}]"
        v = e.load_value(element, cap.dtype)
        ct = dtypes.compute_type(n.dtype)
        if cap.dtype != n.dtype and dtypes.compute_type(cap.dtype) != ct:
            v = f"{CTYPE[ct]}({v})"
        if own is not None:
            return f"({e.names[own]} ? {CTYPE[ct]}({v}) : {literal(0, ct)})"
        return v

    def index(n: Node) -> str:
        return f"{CTYPE[dtypes.compute_type(n.dtype)]}({ccode(n.arg, INDEX_NAMES)})"

    sizes = {"b": problem.B, "h": problem.H, "m": problem.Sq, "n": problem.Skv}
    dynamic = {v for v, d in (("b", "B"), ("m", "Sq"), ("n", "Skv")) if d in problem.dynamic}
    unproven = set(mods.unchecked_indices(value, sizes, dynamic))

    def checked(n: Node, v: str, bound: str, mask: str | None) -> str:
        """A gathered index not proven in range (``bias[doc[m]]``): checked against the extent
        the user indexed, eager's IndexError through ``tw_err`` and 0 in its place."""
        if n not in unproven:
            return v
        at = f"int64_t({v})" if mask is None else f"({mask} ? int64_t({v}) : int64_t(0))"
        name = e.fresh()
        e.helpers_used.add("tw_index")
        e.line(f"const int64_t {name} = tw_index({at}, int64_t({bound}), tw_err);")
        return name

    e = CppExpr(load=load, index=index, acc=lambda n: "tw_score", prefix=prefix, checked=checked)
    name = e.emit(value)
    if value.dtype != "bool" and dtypes.compute_type(value.dtype) != "fp32":
        name = e.convert(name, value.dtype, "fp32")
    return list(e.lines), name, set(e.helpers_used)


class CppAttention(TemplateSpec):
    """Attention forward as one C++ kernel (see the module docstring)."""

    id = "cpp.attention"
    backend = "cpp"
    op = "attention"
    jinja = "attention.py.jinja"
    compiled_on_cpu = True  # the attention policy offers it on the cpu target under auto
    space = ParamSpace((
        Knob("BLOCK_M", powers_of_two(1, 128), 64, "query positions per task"),
        Knob("BLOCK_N", (16, 32, 64, 128), 64, "keys per tile"),
        Knob("PACK", (False, True), False, "a task takes the GQA group's heads (decode: K/V tiles shared)"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, AttentionProblem):
            return Support(False, f"{self.id} runs attention problems")
        if target.backend != "cpu":
            return Support(False, f"{self.id} is for the cpu target, not {target.name}")
        if problem.direction != "forward":
            return Support(False, f"{self.id} is the forward kernel (the backward runs on ATen)")
        if max(problem.D, problem.Dv) > MAX_HEAD_DIM:
            return Support(False, f"head dim {max(problem.D, problem.Dv)} > {MAX_HEAD_DIM}")
        for c in problem.captures:
            if c.dtype not in STORAGE:
                return Support(False, f"a {c.dtype} captured tensor has no C++ type here")
        return SUPPORTED

    def check(self, params: Params, problem: AttentionProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        pack = problem.group if params["PACK"] else 1
        if pack * params["BLOCK_M"] > MAX_ROWS:
            return f"{pack} heads x BLOCK_M={params['BLOCK_M']} rows > {MAX_ROWS} per task"
        bm = problem.block_mask
        if bm is not None and bm.q_block % params["BLOCK_M"]:
            return f"BLOCK_M={params['BLOCK_M']} must divide the block mask's query blocks ({bm.q_block})"
        if bm is not None and pack > 1 and bm.heads > 1:
            return "a per-head block mask: the packed heads would need different key lists"
        return None

    def seed_params(self, problem: AttentionProblem, target: Target) -> list[dict[str, Any]]:
        """Decode shapes (the group's rows fit one task): every query of the group's heads in
        one task; prefill: 64 or 32 query rows per task, 64 keys per tile."""
        out = []
        if problem.group * problem.Sq <= 64 and "Sq" not in problem.dynamic:
            bm = _pow2(max(problem.Sq, 1))
            out += [{"BLOCK_M": bm, "BLOCK_N": 64, "PACK": True}, {"BLOCK_M": bm, "BLOCK_N": 128, "PACK": True}]
        cap = _pow2(max(problem.Sq, 1))
        for m in (64, 32):
            out.append({"BLOCK_M": min(m, cap), "BLOCK_N": 64, "PACK": False})
        if problem.block_mask is not None:
            # rows of a task lie in one query block of the mask
            for p in out:
                while problem.block_mask.q_block % p["BLOCK_M"]:
                    p["BLOCK_M"] //= 2
        return out

    def efficiency(self, target: Target) -> float:
        return 1.0

    # -- rendering --------------------------------------------------------------------------------
    def context(self, problem: AttentionProblem, params: Params, target: Target) -> dict[str, Any]:
        pack = problem.group if params["PACK"] else 1
        block_m = params["BLOCK_M"]
        if "Sq" not in problem.dynamic and problem.block_mask is None:
            # a task holds no more query rows than there are (Sq = 24 with BLOCK_M = 32: 48 rows
            # of a GQA pair, not 64 of which 16 are padding that the products and exp compute);
            # a call with another Sq still runs, in more tasks
            block_m = min(block_m, max(problem.Sq, 1))
        rows = pack * block_m
        transposed = rows >= TRANSPOSED_ROWS
        dvv = _pad16(problem.Dv) // 16
        rb_pv = max(1, min(8, 16 // dvv))
        unit = max(16, rb_pv) if transposed else rb_pv
        rows_pad = -(-rows // unit) * unit
        rb_qk = max(1, min(8, 16 // (rows_pad // 16))) if transposed else 1
        sm_lines, sm_value, h1 = render_mod(problem, problem.score_mod, "sm")
        mk_lines, mk_value, h2 = render_mod(problem, problem.mask_mod, "mk")
        helper_text = CppExpr(load=lambda n: "")
        helper_text.helpers_used = h1 | h2 | ({"tw_bf16"} if problem.dtype == "bf16" else set())
        storage = STORAGE[problem.dtype]
        to_float = {"bf16": "tw_bf16_to_f(x)", "fp16": "float(x)", "fp32": "x"}[problem.dtype]
        from_float = {"bf16": "tw_f_to_bf16(x)", "fp16": "_Float16(x)", "fp32": "x"}[problem.dtype]
        captures = [dict(k=k, rank=len(c.shape), storage=STORAGE[c.dtype]) for k, c in enumerate(problem.captures)]
        bm_names = block_mask_names(problem)
        n_args = 5 + len(captures) + len(bm_names) + 19 + sum(2 * c["rank"] for c in captures) \
            + sum(4 if n.endswith("indices") else 3 for n in bm_names) + 3
        empty = problem.empty_lse
        empty_lse = ("NEG_INF" if empty < 0 else "__builtin_inff()") if math.isinf(empty) else \
            ("__builtin_nanf(\"\")" if math.isnan(empty) else f"{float(empty)!r}f")
        return dict(
            kernel_name="tw_cpp_attention", problem_text=problem.describe(), params_text=self.space.encode(params),
            target=target.name, name="cpp_attention", D=problem.D, Dv=problem.Dv, D_pad=_pad16(problem.D),
            Dv_pad=_pad16(problem.Dv), H=problem.H, H_kv=problem.H_kv, group=problem.group, PACK=pack,
            BLOCK_M=block_m, BLOCK_N=params["BLOCK_N"], rows_pad=rows_pad, rb_qk=rb_qk, rb_pv=rb_pv,
            transposed=transposed, direct=problem.dtype == "fp32", scale=repr(float(problem.scale)), empty_lse=empty_lse,
            lse_base=problem.lse_base, causal=problem.causal, has_mask=problem.has_mask,
            score_mod=dict(lines=sm_lines, value=sm_value), mask_mod=dict(lines=mk_lines, value=mk_value),
            block_mask=problem.block_mask, bm_names=bm_names, captures=captures, n_captures=len(captures),
            n_block_mask=len(bm_names), storage=storage, to_float=to_float, from_float=from_float,
            helpers=helper_text.helpers(), libm=libm_declarations(), n_args=n_args,
            torch_dtype=str(DTYPES[problem.dtype]), out_order=problem.order("out"), lse_order=problem.order("lse"),
            op=problem.describe().replace('"', "'"),
        )

    def render_kernel(self, problem: AttentionProblem, params: Params, target: Target) -> RenderedKernel:
        source = self.render_jinja(**self.context(problem, params, target))
        return RenderedKernel(template_id=self.id, params=dict(params), target=target.name, source=source,
                              name="cpp_attention", meta={"kind": "attention", "language": "cpp"})


__all__ = ["CppAttention", "render_mod"]
