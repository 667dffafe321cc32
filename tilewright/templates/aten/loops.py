"""The ATen candidates of loop kernels (``aten.pointwise``, ``aten.reduction``): the kernel as
PyTorch operators (:mod:`tilewright.templates.aten.emit`). Rank 0 of every loop policy, the
fallback of a fused group, and, with ``reference=True``, the float64 reference."""

from __future__ import annotations

from typing import Any

from tilewright.ir import dtypes
from tilewright.ir.index import code
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.aten.emit import TorchExpr
from tilewright.templates.base import (
    SUPPORTED, TEMPLATES_ROOT, Params, RenderedKernel, Support, TemplateSpec, jinja_env,
)


def _bodies(k: Any, reference: bool) -> tuple[list[str], list[str]]:
    """(statements run per call, statements run once per shape) for one mode."""
    names = {s: s.name for s in k.size_symbols()}
    static: list[str] = []
    if k.parts:  # a combo kernel: its parts one after another, each in its own space
        body = []
        for i, part in enumerate(k.parts):
            lines = TorchExpr(part, prefix=f"p{i}_", reference=reference, static=static).render()
            if lines:
                body.append(f"if ({code(part.xnumel * part.rnumel, names)}) != 0:")
                body += ["    " + line for line in lines]
    else:
        body = TorchExpr(k, reference=reference, static=static).render()
    return body, static


def _bound(lines: list[str]) -> list[str]:
    """The names ``lines`` bind at their top level (``x = ...``), in order."""
    out: list[str] = []
    for line in lines:
        head = line.split(" = ", 1)[0]
        if " = " in line and head.isidentifier() and head not in out:
            out.append(head)
    return out


def render_torch(problem: LoopProblem) -> str:
    """The torch module for a loop problem (``launch(*inputs, *sizes, outs=None, device=None,
    reference=False)``)."""
    k = problem.kernel
    names = {s: s.name for s in k.size_symbols()}
    modes = {}
    for mode, reference in (("native", False), ("reference", True)):
        body, static = _bodies(k, reference)
        modes[mode] = {"body": body, "static": static, "static_names": _bound(static)}
    return jinja_env(TEMPLATES_ROOT / "aten").get_template("loops.py.jinja").render(
        problem_text=problem.describe(), inputs=[b.name for b in k.inputs],
        sizes=[s.name for s in k.size_symbols()],
        outputs=[{"name": b.name, "dtype": str(dtypes.TORCH[b.dtype]), "float": dtypes.is_float(b.dtype), "init": b.init,
                  "shape": [code(s, names) for s in b.shape], "stride": [code(s, names) for s in b.stride]}
                 for b in k.outputs],
        numel=code(k.xnumel, names), modes=modes)


class _AtenLoops(TemplateSpec):
    backend = "aten"
    jinja = "loops.py.jinja"

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, LoopProblem) or problem.kind != self.op:
            return Support(False, f"{self.id} runs {self.op} loop kernels")
        return SUPPORTED

    def render_kernel(self, problem: LoopProblem, params: Params, target: Target) -> RenderedKernel:
        return RenderedKernel(template_id=self.id, params={}, target=target.name,
                              source=render_torch(problem), name=f"aten_{problem.kind}",
                              meta={"kind": problem.kind})


class AtenPointwise(_AtenLoops):
    id = "aten.pointwise"
    op = "pointwise"


class AtenReduction(_AtenLoops):
    id = "aten.reduction"
    op = "reduction"
