"""The ATen candidate for attention: the fallback every attention policy includes.

SDPA-shaped problems on the CPU (no modification beyond an additive mask, no block mask, the
lse of CPU's flash kernel: base e, 0 for an empty row) call the op they were lowered from,
``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward, so a model not forcing
generated kernels runs exactly what it ran before. Everything else is attention written out in
torch, in fp32, a few heads at a time (:mod:`tilewright.kinds.attention.reference`): correct, and as
slow as eager FlexAttention on a CPU.
"""

from __future__ import annotations

from tilewright.kinds.attention import mods
from tilewright.kinds.attention.problem import AttentionProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import SUPPORTED, Params, RenderedKernel, Support, TemplateSpec


def sdpa_form(problem: AttentionProblem) -> bool:
    """Whether SDPA's CPU flash kernel computes ``problem`` (with the same lse convention)."""
    if problem.mask_mod or problem.block_mask is not None or problem.lse_grad or problem.score_grad or problem.renorm:
        return False
    if problem.lse_base != "e" or problem.empty_lse != 0.0:
        return False
    if not problem.score_mod:
        return not problem.captures
    if len(problem.captures) != 1:
        return False
    c = problem.captures[0]
    # a dim following a dynamic size indexes by its variable even at a bucket of 1
    shape = tuple(max(s, 2) if d else s for s, d in zip(c.shape, c.dims or (None,) * len(c.shape)))
    return problem.score_mod == mods.dumps(mods.additive_mask(0, shape, c.dtype)) and c.dtype == problem.dtype


class AtenAttention(TemplateSpec):
    id = "aten.attention"
    backend = "aten"
    op = "attention"
    jinja = "attention.py.jinja"

    def problem_support(self, problem: AttentionProblem, target: Target) -> Support:
        if not isinstance(problem, AttentionProblem):
            return Support(False, f"{self.id} runs attention problems")
        return SUPPORTED

    def render_kernel(self, problem: AttentionProblem, params: Params, target: Target) -> RenderedKernel:
        source = self.render_jinja(problem_text=problem.describe(), problem_json=problem.to_json(),
                                   sdpa=sdpa_form(problem), backward=problem.direction == "backward")
        return RenderedKernel(template_id=self.id, params={}, target=target.name, source=source,
                              name="aten_attention")
