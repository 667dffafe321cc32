"""An attention template written outside tilewright (docs/kernel-authors.md, "Adding an
attention template"): FlashAttention's forward with the problem's ``score_mod`` (FlexAttention's
``score_mod``: softcapping, ALiBi, relative position biases), in the ``tutorial`` language.

The problem is an :class:`~tilewright.kinds.attention.AttentionProblem`; its ``score_mod`` is
expression IR over the score and the indices ``b, h, m, n``, which
:func:`~tilewright.templates.triton.attention_mods.render_all` writes as Triton statements over
``s`` (the scaled scores of a key tile), as ``render_epilogue`` does a GEMM's epilogue. This
kernel takes no mask_mod, causal mask, block mask or captured tensor: ``problem_support``
refuses those, and tilewright's own ``triton.attention`` or ATen runs them.
"""

from __future__ import annotations

from typing import Any

import tilewright
from tilewright.kinds.attention import AttentionProblem
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target
from tilewright.templates import SUPPORTED, Knob, ParamSpace, RenderedKernel, Support, TemplateSpec
from tilewright.templates.triton.attention_mods import render_all
from tilewright.templates.triton.emit import POINTER


TORCH_DTYPE = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16"}


def pad(d: int) -> int:
    """A head dim rounded up to a power of two, at least 16 (``tl.dot``'s smallest)."""
    return max(16, 1 << (d - 1).bit_length())


class TutorialAttention(TemplateSpec):
    """out = softmax(score_mod(scale * Q Kᵀ)) V and its log-sum-exp, one (batch, head) and
    BLOCK_M query rows per program; GQA; any strides; fp32/fp16/bf16; head dims up to 128."""

    id = "tutorial.attention"
    backend = "tutorial"
    op = "attention"
    jinja = "tutorial_attention.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (16, 32, 64, 128), 32, "query rows per program"),
        Knob("BLOCK_N", (16, 32, 64, 128), 32, "keys per step of the key loop"),
        Knob("num_warps", (1, 2, 4, 8), 4, "warps per program"),
        Knob("num_stages", (1, 2, 3), 2, "software pipeline depth of the key loop"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, AttentionProblem):
            return Support(False, "tutorial.attention runs attention problems")
        if problem.direction != "forward":
            return Support(False, "the forward only")
        if problem.has_mask or problem.block_mask is not None or problem.captures:
            return Support(False, "a score_mod of the score and b, h, m, n only (no mask_mod, causal mask, "
                                  "block mask or captured tensor)")
        if max(problem.D, problem.Dv) > 128:
            return Support(False, f"head dim {max(problem.D, problem.Dv)} > 128")
        return SUPPORTED

    def seed_params(self, problem: AttentionProblem, target: Target) -> list[dict[str, Any]]:
        # the attention kind's policy asks each template for its tiles and ranks them
        if target.interpreted:
            return [{"BLOCK_M": 32, "BLOCK_N": 32}]
        return [{"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8}, {"BLOCK_M": 64, "BLOCK_N": 64}]

    def render_kernel(self, problem: AttentionProblem, params: dict[str, Any], target: Target) -> RenderedKernel:
        score_mod, _, _, helpers = render_all(problem, target.interpreted)  # (score_mod, mask_mod, d/ds, helpers)
        upcast = target.interpreted and problem.dtype != "fp32"  # triton issue 11584, as in tutorial_gemm
        source = self.render_jinja(
            problem_text=problem.describe(), score_mod=score_mod, helpers=helpers, H=problem.H,
            group=problem.group, D=problem.D, Dv=problem.Dv, D_pad=pad(problem.D), Dv_pad=pad(problem.Dv),
            scale=repr(float(problem.scale)), lse_base=problem.lse_base, empty_lse=repr(float(problem.empty_lse)),
            out_order=problem.order("out"), lse_order=problem.order("lse"), torch_dtype=TORCH_DTYPE[problem.dtype],
            upcast=upcast, ieee=problem.dtype == "fp32" or upcast, **params)
        pointers = {"Q": POINTER[problem.dtype], "K": POINTER[problem.dtype], "V": POINTER[problem.dtype],
                    "OUT": POINTER[problem.dtype], "LSE": "*fp32"}
        aot = AotSpec("tutorial_attention_kernel", "triton", pointers,
                      {"BLOCK_M": params["BLOCK_M"], "BLOCK_N": params["BLOCK_N"]}, tuple(pointers),
                      {"num_warps": params["num_warps"], "num_stages": params["num_stages"]})
        return RenderedKernel(self.id, params, target.name, source, "tutorial_attention",
                              interpret=target.interpreted, aot=None if target.interpreted else aot)


TEMPLATE = TutorialAttention()


def register() -> TutorialAttention:
    """Register the language, then the template (again is a no-op)."""
    from tutorial_language import register as register_language

    register_language()
    return tilewright.register_template(TEMPLATE)
